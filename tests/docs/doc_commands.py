#!/usr/bin/env python3
"""Runs every command line that the documentation and `pebble --help` show, as
written, and checks that each exits as the text says.

    doc_commands.py --repo REPO --build BUILD [--timeout S] [--list] [--keep]
                    (--markdown FILE ... | --help-examples)

Markdown: every line of a fenced block tagged sh, bash, shell or console (in a
console block, only the lines after a `$ ` prompt). Backslash continuations
are joined; blank and comment-only lines are skipped. A block whose fence is
preceded, on the line just before it, by

    <!-- doc-test: skip (reason) -->

is not run; the summary lists it with its reason.

Help: the example lines of `pebble --help` and of `pebble COMMAND --help` for
every command that `pebble --help` lists: the lines that start with `pebble `,
`python3 ` or `/usr/bin/python3 ` under an `Examples...:` heading, after
`e.g. `, or just below such a line. Each help text runs in a scratch directory
of its own.

Markers, in a line's trailing comment (a `#` after whitespace outside quotes;
in help text after two spaces or more):
    exit N                        the line must exit with status N (else 0); with
                                  N > 0, each percentage the comment quotes
                                  ("rotor reaches 61% at least") must be in
                                  the line's output, so the quote stays true
    GPU (first word), needs a GPU, GPU only
                                  skipped unless `nvidia-smi -L` lists a GPU

The lines of one file run in order, each in its own `bash -c`, in a fresh
scratch directory that holds links to the repository's examples/, scripts/,
python/, bench/, docs/ and tests/ and to the build directory as build/; PATH
starts with BUILD/bin (then /usr/bin, so `python3` is the system interpreter
with PyTorch), PYTHONPATH is BUILD/python and HOME is a folder of the scratch
directory. So files that a line writes are there for the next lines, and
nothing a line writes outside the linked folders survives the run.

A line that reads a file (--graph, --schedule, --profile, --inputs, --onnx,
`pebble import F`) that does not exist when its turn comes fails unrun
("placeholder: F is made by no earlier line"), unless it is marked to fail.
A line that would build, install or run the test suite (scripts/setup,
scripts/build, ctest, cmake, ...) fails unrun: its block needs the skip
comment.

Exit status: 0 every line met its expectation, 1 some did not, 2 usage.
"""

import argparse
import collections
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO_LINKS = ("examples", "scripts", "python", "bench", "docs", "tests")
COMMAND_LANGS = {"sh", "bash", "shell", "console"}
FENCE_RE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
SKIP_RE = re.compile(r"^\s*<!--\s*doc-test:\s*skip\b\s*(.*?)\s*-->\s*$")
EXIT_RE = re.compile(r"\bexit\s+(\d+)\b")
QUOTED_RE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?%")
GPU_RE = re.compile(r"^GPU\b|\bneeds a GPU\b|\bGPU only\b", re.IGNORECASE)
# Options whose value is a file or folder the command reads.
READ_OPTIONS = ("--graph", "--schedule", "--profile", "--inputs", "--onnx")
# Commands that build, install, reconfigure build/ or run this suite (ctest
# inside ctest never ends): never run from here, whatever the block says.
REFUSED_RE = re.compile(
    r"(?:^|[\s;&|(])((?:\./)?scripts/(?:setup|build|test|main-job|gpu-check|gpu-bundle|fuzz)"
    r"|ctest|cmake|ninja|apt-get|apt)(?=$|[\s;&|)])")
OUTPUT_TAIL_LINES = 40
ERROR_LINE_RE = re.compile(r"^(pebble|FAIL)\b|error|Traceback|No such file", re.IGNORECASE)
# How an example line of the help text starts.
HELP_COMMAND = r"(?:pebble|python3|/usr/bin/python3)\s"


class Line:
    """One command line of a document or a help text, and what it must do."""

    def __init__(self, where, command, comment=""):
        self.where = where            # "README.md:47" or "pebble plan --help:12"
        self.command = command        # as run (its trailing comment removed)
        self.comment = comment        # the trailing comment, without '#'
        exit_marker = EXIT_RE.search(comment)
        self.expect = int(exit_marker.group(1)) if exit_marker else 0
        # (a refusal's figures, quoted in the comment: checked against its output)
        self.quoted = QUOTED_RE.findall(comment) if self.expect else []
        self.gpu = bool(GPU_RE.search(comment))
        self.skip = None              # why it is not run, or None

    def expectation(self):
        parts = [f"exit {self.expect}"]
        if self.gpu:
            parts.append("GPU")
        if self.skip:
            parts.append(f"skipped: {self.skip}")
        return ", ".join(parts)


def split_comment(text, min_gap=1):
    """(command, comment) of one shell line: the comment starts at a `#` that
    follows at least min_gap blanks and lies outside quotes (bash's rule is
    min_gap 1). The comment is returned without its `#`."""
    quote = None
    i = 0
    while i < len(text):
        c = text[i]
        if quote == "'":
            if c == "'":
                quote = None
        elif quote == '"':
            if c == "\\":
                i += 1
            elif c == '"':
                quote = None
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == "#" and i >= min_gap and text[i - min_gap:i].isspace():
            return text[:i].rstrip(), text[i + 1:].strip()
        i += 1
    return text.rstrip(), ""


def continues(text):
    """Whether a line ends with an unescaped backslash (joined with the next)."""
    trailing = len(text) - len(text.rstrip("\\"))
    return trailing % 2 == 1


def block_lines(body, label, console=False):
    """The command Lines of one fenced block; body: (line number, text) pairs."""
    out = []
    pending, start = None, None
    for number, text in body:
        text = text.rstrip()
        if pending is None:
            if console:
                if not text.lstrip().startswith("$ "):
                    continue  # the command's output
                text = text.lstrip()[2:]
            start = number
        else:
            text = pending + text
        if continues(text):
            pending = text[:-1]
            continue
        pending = None
        stripped = text.strip()
        if not stripped or stripped.startswith("#"):
            continue
        command, comment = split_comment(stripped)
        out.append(Line(f"{label}:{start}", command, comment))
    if pending is not None and pending.strip():
        command, comment = split_comment(pending.strip())
        out.append(Line(f"{label}:{start}", command, comment))
    return out


def markdown_lines(text, label):
    """(Lines, skipped blocks) of a Markdown text; a skipped block is
    (where, reason), and its Lines carry the reason in .skip."""
    rows = text.splitlines()
    lines, skipped = [], []
    i = 0
    while i < len(rows):
        fence = FENCE_RE.match(rows[i])
        if not fence:
            i += 1
            continue
        mark, lang = fence.group(1), fence.group(2).lower()
        end = i + 1
        while end < len(rows) and not rows[end].strip().startswith(mark):
            end += 1
        if lang in COMMAND_LANGS:
            body = [(n + 1, rows[n]) for n in range(i + 1, end)]
            block = block_lines(body, label, console=(lang == "console"))
            skip = SKIP_RE.match(rows[i - 1]) if i > 0 else None
            if skip:
                reason = skip.group(1).strip()
                if reason.startswith("(") and reason.endswith(")"):
                    reason = reason[1:-1].strip()
                reason = reason or "no reason given"
                skipped.append((f"{label}:{i + 1}", reason))
                for line in block:
                    line.skip = reason
            lines += block
        i = end + 1
    return lines, skipped


def help_examples(text, label):
    """The example Lines of one help text: the lines that start with a command
    (`pebble `, `python3 ` or `/usr/bin/python3 `) under an `Examples...:`
    heading (until a blank or unindented line), after `e.g. `, or right below
    such a line."""
    out = []
    in_examples = False
    chained = False  # the line above was an example
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if re.match(r"examples?\b.*:$", stripped, re.IGNORECASE) and not raw[:1].isspace():
            in_examples, chained = True, False
            continue
        if not stripped:
            in_examples = chained = False
            continue
        if in_examples and not raw[:1].isspace():
            in_examples = False
        after_eg = re.search(r"\be\.g\.\s+(" + HELP_COMMAND + r".*)$", stripped)
        if after_eg:
            candidate = after_eg.group(1)
        elif re.match(HELP_COMMAND, stripped) and (in_examples or chained):
            candidate = stripped
        else:
            chained = False
            continue
        chained = True
        command, comment = split_comment(candidate, min_gap=2)
        out.append(Line(f"{label}:{number}", command, comment))
    return out


def help_commands(text):
    """The commands that a `pebble --help` text lists (its SUBCOMMANDS section)."""
    names = []
    in_section = False
    for raw in text.splitlines():
        if re.fullmatch(r"subcommands:", raw.strip(), re.IGNORECASE):
            in_section = True
            continue
        if not in_section:
            continue
        if not raw.strip() or not raw[:1].isspace():
            if names:
                break
            continue
        name = re.match(r"^ {1,4}([A-Za-z][\w-]*)(\s|$)", raw)
        if name:
            names.append(name.group(1))
    return names


def read_paths(command):
    """The files and folders a command line names for reading."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return []
    paths = []
    for i, word in enumerate(words):
        if word in READ_OPTIONS and i + 1 < len(words):
            paths.append(words[i + 1])
        for option in READ_OPTIONS:
            if word.startswith(option + "="):
                paths.append(word.split("=", 1)[1])
        if word == "import" and i > 0 and os.path.basename(words[i - 1]) == "pebble":
            rest = words[i + 1:]
            named = [w for w in rest if w.endswith(".onnx")]
            if named:
                paths.append(named[0])
            elif rest and not rest[0].startswith("-"):
                paths.append(rest[0])
    # Values the shell would expand, and stdin, are not checked.
    return [p for p in paths if p != "-" and not re.search(r"[$*?\[~`]", p)]


def have_gpu():
    if not shutil.which("nvidia-smi"):
        return False
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "GPU" in r.stdout


def line_environment(build, scratch):
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.join(build, "bin"), "/usr/bin", env.get("PATH", "")])
    env["PYTHONPATH"] = os.path.join(build, "python")
    env["HOME"] = os.path.join(scratch, ".home")
    os.makedirs(env["HOME"])
    return env


def make_scratch(repo, build):
    scratch = tempfile.mkdtemp(prefix="pebble-doc-commands-")
    for name in REPO_LINKS:
        target = os.path.join(repo, name)
        if os.path.exists(target):
            os.symlink(target, os.path.join(scratch, name))
    os.symlink(build, os.path.join(scratch, "build"))
    return scratch


def run_shell(command, cwd, env, timeout):
    """(exit status or None on timeout, stdout and stderr interleaved) of one
    line under bash, in a process group of its own that is killed whole
    afterwards (what the line left running in the background goes too)."""
    p = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        code = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        code = None
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return code, out.decode("utf-8", "replace")


def tail(text, count=OUTPUT_TAIL_LINES):
    rows = text.rstrip("\n").splitlines()
    return rows[-count:]


def run_lines(lines, repo, build, timeout, gpu, keep=False, slow_s=30.0):
    """Runs lines in order in one scratch directory; returns (lines passed,
    (Line, problem) of each failure, each skip's reason, (Line, seconds, exit
    status) of each line slower than slow_s)."""
    scratch = make_scratch(repo, build)
    env = line_environment(build, scratch)
    passed, failures, skips, slow = 0, [], [], []
    try:
        for line in lines:
            if line.skip:
                skips.append(line.skip)
                print(f"SKIP        {line.where}  {line.command}  (skip comment: {line.skip})",
                      flush=True)
                continue
            if line.gpu and not gpu:
                skips.append("needs a GPU")
                print(f"SKIP        {line.where}  {line.command}  (needs a GPU)", flush=True)
                continue
            refused = REFUSED_RE.search(line.command)
            problem = None
            if refused:
                problem = (f"refused: runs {refused.group(1)}, which builds, installs or runs "
                           f"the test suite; mark its block <!-- doc-test: skip (reason) -->")
            elif line.expect == 0:
                missing = [p for p in read_paths(line.command)
                           if not os.path.exists(os.path.join(scratch, p))]
                if missing:
                    problem = f"placeholder: {missing[0]} is made by no earlier line"
            if problem:
                print(f"FAIL    -   {line.where}  {line.command}\n  {problem}", flush=True)
                failures.append((line, problem))
                continue
            start = time.monotonic()
            code, output = run_shell(line.command, scratch, env, timeout)
            seconds = time.monotonic() - start
            if seconds > slow_s:
                slow.append((line, seconds, code))
            unsaid = [q for q in line.quoted if q not in output]
            if code == line.expect and not unsaid:
                passed += 1
                print(f"ok   {seconds:5.1f}s {line.where}  {line.command}", flush=True)
                continue
            got = f"timed out after {timeout:g} s" if code is None else f"exit {code}"
            problem = (f"expected exit {line.expect}, got {got}" if code != line.expect else
                       f"its comment quotes {', '.join(unsaid)}, which its output does not say")
            print(f"FAIL {seconds:5.1f}s {line.where}  {line.command}\n  {problem}; "
                  f"last {OUTPUT_TAIL_LINES} lines of its output:", flush=True)
            rows = tail(output)
            for row in rows:
                print(f"    | {row}")
            # The summary names the line's error: its last line that reads as
            # one, else its last line.
            said = [row.strip() for row in rows if row.strip()]
            errors = [row for row in said if ERROR_LINE_RE.search(row)]
            last = (errors or said or [""])[-1]
            failures.append((line, f"{problem}: {last[:200]}" if last else problem))
    finally:
        if keep:
            print(f"scratch directory kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return passed, failures, skips, slow


def pebble_help(build, args):
    pebble = os.path.join(build, "bin", "pebble")
    r = subprocess.run([pebble] + args + ["--help"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise SystemExit(f"doc_commands: '{' '.join(['pebble'] + args)} --help' exited "
                         f"{r.returncode}: {r.stderr.strip()[:200]}")
    return r.stdout


def collect_help(build):
    """One group per help text: each runs in a scratch directory of its own,
    so a command's examples stand alone, as its reader sees them. The
    examples that `pebble --help` repeats from a command's help in its list
    of commands run once, with that command's."""
    top = pebble_help(build, [])
    commands = help_commands(top)
    if not commands:
        raise SystemExit("doc_commands: found no SUBCOMMANDS section in 'pebble --help'")
    groups, repeated = [], set()
    for command in commands:
        label = f"pebble {command} --help"
        lines = help_examples(pebble_help(build, [command]), label)
        repeated |= {line.command for line in lines}
        groups.append((label, lines, []))
    header = next(n for n, row in enumerate(top.splitlines(), 1)
                  if re.fullmatch(r"subcommands:", row.strip(), re.IGNORECASE))
    top_lines = [line for line in help_examples(top, "pebble --help")
                 if not (int(line.where.rsplit(":", 1)[1]) > header
                         and line.command in repeated)]
    return [("pebble --help", top_lines, [])] + groups


def collect_markdown(repo, files):
    out = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise SystemExit(f"doc_commands: cannot read {path}: {e.strerror}")
        absolute = os.path.abspath(path)
        label = os.path.relpath(absolute, repo) if absolute.startswith(repo + os.sep) else path
        lines, skipped = markdown_lines(text, label)
        out.append((label, lines, skipped))
    return out


def summary(total, passed, failures, skips):
    reasons = collections.Counter(skips)
    text = f"{total} lines: {passed} passed, {len(failures)} failed, {len(skips)} skipped"
    if reasons:
        text += " (" + "; ".join(f"{n} x {r}" for r, n in reasons.items()) + ")"
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", required=True, help="the source tree")
    ap.add_argument("--build", required=True, help="the build directory (holds bin/pebble)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per line (300)")
    ap.add_argument("--slow", type=float, default=30, help="list lines slower than this (30 s)")
    ap.add_argument("--list", action="store_true", help="print the lines and expectations only")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--markdown", nargs="+", metavar="FILE")
    source.add_argument("--help-examples", action="store_true")
    a = ap.parse_args()
    repo, build = os.path.abspath(a.repo), os.path.abspath(a.build)
    if a.timeout <= 0:
        ap.error("--timeout must be positive")
    if not a.list and not os.access(os.path.join(build, "bin", "pebble"), os.X_OK):
        ap.error(f"no executable {os.path.join(build, 'bin', 'pebble')}")

    groups = collect_help(build) if a.help_examples else collect_markdown(repo, a.markdown)
    if a.list:
        for label, lines, skipped in groups:
            for where, reason in skipped:
                print(f"# {where}: block skipped ({reason})")
            for line in lines:
                print(f"{line.where}\t[{line.expectation()}]\t{line.command}")
        return 0

    gpu = have_gpu()
    started = time.monotonic()
    total = passed = 0
    failures, skips, slow = [], [], []
    for label, lines, skipped in groups:
        if not lines:
            continue
        print(f"== {label}: {len(lines)} lines" + ("" if gpu else " (no GPU here)"), flush=True)
        for where, reason in skipped:
            print(f"block at {where} skipped: {reason}")
        p, f, s, sl = run_lines(lines, repo, build, a.timeout, gpu, a.keep, a.slow)
        total += len(lines)
        passed += p
        failures += f
        skips += s
        slow += sl
    print(f"\ntotal time {time.monotonic() - started:.1f} s")
    if slow:
        print(f"lines slower than {a.slow:g} s:")
        for line, seconds, code in slow:
            print(f"  {seconds:6.1f}s  {line.where}  {line.command}")
    if failures:
        print("failed:")
        for line, problem in failures:
            print(f"  {line.where}  {line.command}\n      {problem}")
    print(summary(total, passed, failures, skips))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
