#!/usr/bin/env python3
"""Runs the command lines that the documentation shows, and holds each to its
stated bounds of memory and time (docs/reliability.md, "Resource bounds").

    doc_commands.py --pebble BUILD/bin/pebble --source SOURCE_DIR --workdir DIR
                    [--doc README.md ...] [--only REGEX] [--list]

Every line of the command blocks of the given documents (default: README.md;
read by tests/docs/doc_commands.py, whose skip marks hold here too) that
starts with `build/bin/pebble` or `/usr/bin/python3 examples/` is run, in
order, in a scratch directory where `build/bin/pebble` is the binary under
test and `examples/` the source tree's, so that each runs as written and
files written by one line are there for the next. A line whose comment says
`# exit 1` (or `# fails:`) must fail (exit 1 or 2, one `pebble:` line);
every other line must exit 0.

Each command runs under a cap on its address space (RLIMIT_AS) and a time
limit; its peak resident memory (the kernel's ru_maxrss) must stay within the
bound docs/reliability.md states for it:

    own bound = 512 MiB + 64 KiB x nodes of its graph
                (+ 2 GiB where a policy of the line solves an LP: checkmate, checkmate-lp)
                (+ the plan's arena and host copies for `run` and `fit --verify`)
    a Python example's bound = 1 GiB (the interpreter, PyTorch, a small model)

Exit status: 0 all lines passed, 1 some failed (each is listed), 2 usage.
"""

import argparse
import importlib.util
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time

MIB = 1 << 20
BASE_BYTES = 512 * MIB          # the process, its libraries (CUDA's among them) and small graphs
PER_NODE_BYTES = 64 << 10       # graph, plans and their tables, per node
LP_BYTES = 2048 * MIB           # CBC's LP or MILP of at most 600 stages
PYTHON_BYTES = 1024 * MIB       # a Python example: the interpreter, PyTorch and a small model
ADDRESS_SPACE_SLACK = 8192 * MIB  # virtual reservations (libraries mapped, thread stacks)
TIME_LIMIT_S = 600

PREFIXES = ("build/bin/pebble", "/usr/bin/python3 examples/")


def _extractor():
    """tests/docs/doc_commands.py, the one reader of documented command lines
    (loaded by path: it shares this file's name)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "docs", "doc_commands.py")
    spec = importlib.util.spec_from_file_location("doc_command_lines", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sh_lines(path):
    """(line number, command words, comment) of each line of the document's
    command blocks that starts with one of PREFIXES, but for blocks marked
    to be skipped."""
    with open(path, encoding="utf-8") as f:
        lines, _ = _extractor().markdown_lines(f.read(), os.path.basename(path))
    out = []
    for line in lines:
        if line.skip or not line.command.startswith(PREFIXES):
            continue
        try:
            words = shlex.split(line.command)
        except ValueError as e:
            raise SystemExit(f"{line.where}: cannot split the line: {e}")
        out.append((int(line.where.rsplit(":", 1)[1]), words, line.comment))
    return out


def option(words, name):
    for i, w in enumerate(words):
        if w == name and i + 1 < len(words):
            return words[i + 1]
        if w.startswith(name + "="):
            return w.split("=", 1)[1]
    return None


def graph_nodes(pebble, words, cwd):
    """Nodes of the graph a pebble command line names (0 when it names none)."""
    model, graph = option(words, "--model"), option(words, "--graph")
    if len(words) > 2 and words[1] == "import":
        return 0  # bounded by the file instead
    if model is None and graph is None:
        return 0
    if words[1] == "fit":
        return 0  # the search builds the model at every value: bounded below
    args = [pebble, "describe", "--json"]
    args += ["--model", model] if model is not None else ["--graph", graph]
    if "--train" in words:
        args.append("--train")
        loss = option(words, "--loss")
        if loss:
            args += ["--loss", loss]
    r = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return 0
    return len(json.loads(r.stdout)["nodes"])


def run_bytes(stdout, words):
    """The arena and host bytes that a `run` or `fit --verify` line allocated."""
    if len(words) < 2 or words[1] not in ("run", "fit"):
        return 0
    if words[1] == "fit" and "--verify" not in words:
        return 0
    try:
        doc = json.loads(stdout)
    except ValueError:  # the caller reruns fit with --json
        return _run_text_bytes(stdout) if words[1] == "run" else None
    if words[1] == "run":
        m = doc.get("measured", {})
        return m.get("arena_bytes", 0) + m.get("host_peak_bytes", 0)
    largest = 0
    for row in doc.get("results", []):
        m = row.get("measured") or {}
        largest = max(largest, m.get("arena_bytes", 0) + m.get("host_peak_bytes", 0))
    return largest


def _run_text_bytes(stdout):
    """The arena and host bytes measured in `pebble run`'s table (the last
    column of its "arena" and "host peak" rows), or None without them."""
    found = {}
    for line in stdout.splitlines():
        m = re.match(r"(arena|host peak)\s.*\s(\d+)\s*$", line)
        if m:
            found[m.group(1)] = int(m.group(2))
    if set(found) != {"arena", "host peak"}:
        return None
    return found["arena"] + found["host peak"]


def limited(cap_bytes):
    def set_limits():
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))
    return set_limits


def run_measured(args, cwd, cap_bytes, timeout_s):
    """(exit code or None on timeout, stdout, stderr, seconds, peak RSS bytes) of
    one command, run in a session of its own (killed whole at the timeout)
    under an address-space cap. The peak is the child's own (wait4)."""
    start = time.monotonic()
    p = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=limited(cap_bytes), start_new_session=True)
    chunks = {"out": [], "err": []}

    def drain(stream, key):
        for block in iter(lambda: stream.read(65536), b""):
            chunks[key].append(block)

    readers = [threading.Thread(target=drain, args=(p.stdout, "out")),
               threading.Thread(target=drain, args=(p.stderr, "err"))]
    for t in readers:
        t.start()
    timed_out = False
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - start > timeout_s:
            timed_out = True
            os.killpg(p.pid, signal.SIGKILL)
            pid, status, usage = os.wait4(p.pid, 0)
            break
        time.sleep(0.02)
    p.returncode = os.waitstatus_to_exitcode(status)
    for t in readers:
        t.join()
    # What the command left behind in its session (a background child).
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    out = b"".join(chunks["out"]).decode("utf-8", "replace")
    err = b"".join(chunks["err"]).decode("utf-8", "replace")
    code = None if timed_out else p.returncode
    return code, out, err, time.monotonic() - start, usage.ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pebble", required=True)
    ap.add_argument("--source", required=True, help="the source tree (for examples/)")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--doc", action="append", help="a document (default README.md)")
    ap.add_argument("--only", help="run only lines matching this regular expression")
    ap.add_argument("--list", action="store_true", help="list the lines and exit")
    a = ap.parse_args()
    docs = a.doc or ["README.md"]
    lines = []
    for d in docs:
        for number, words, comment in sh_lines(os.path.join(a.source, d)):
            if a.only and not re.search(a.only, " ".join(words)):
                continue
            lines.append((f"{d}:{number}", words, comment))
    if a.list:
        for where, words, _ in lines:
            print(where, shlex.join(words))
        return 0
    if not lines:
        print("doc_commands: no command lines found", file=sys.stderr)
        return 2

    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(os.path.join(a.workdir, "build", "bin"))
    os.symlink(os.path.abspath(a.pebble), os.path.join(a.workdir, "build", "bin", "pebble"))
    os.symlink(os.path.join(os.path.abspath(a.source), "examples"),
               os.path.join(a.workdir, "examples"))

    failures = []
    print(f"{'where':<16} {'exit':>4} {'time':>8} {'peak RSS':>10} {'bound':>10}  command")
    for where, words, comment in lines:
        # "# exit 1: ..." (tests/docs/doc_commands.py's marker) or "# fails: ...".
        expect_failure = comment.startswith("fails:") or re.match(r"exit [12]\b", comment)
        is_pebble = words[0] == "build/bin/pebble"
        nodes = graph_nodes(a.pebble, words, a.workdir) if is_pebble else 0
        own = BASE_BYTES + PER_NODE_BYTES * nodes if is_pebble else PYTHON_BYTES
        policies = " ".join(words)
        if is_pebble and re.search(r"checkmate|compare|--policies all", policies) and \
                not option(words, "--policies"):
            own += LP_BYTES  # compare's default set may hold checkmate's LP
        elif re.search(r"checkmate", policies):
            own += LP_BYTES
        # A run's arena is known once it ran: cap generously, check after.
        needs_arena = is_pebble and words[1] in ("run", "fit")
        cap = own + ADDRESS_SPACE_SLACK + (64 << 30 if needs_arena else 0)
        code, out, err, seconds, peak = run_measured(words, a.workdir, cap, TIME_LIMIT_S)
        problems = []
        if code is None:
            problems.append(f"did not finish within {TIME_LIMIT_S} s")
        elif expect_failure:
            if code not in (1, 2):
                problems.append(f"exit {code}, expected a failure (1 or 2)")
        elif code != 0:
            last = err.strip().splitlines()[-1] if err.strip() else ""
            problems.append(f"exit {code}: {last}")
        bound = own
        if needs_arena and code == 0:
            extra = run_bytes(out, words)
            if extra is None and peak > bound:
                # Text output over the bound without the arena: run it again
                # with --json for the arena's figure.
                again = words + ["--json"] + (["--force"] if words[1] == "run" else [])
                _, json_out, _, _, _ = run_measured(again, a.workdir, cap, TIME_LIMIT_S)
                extra = run_bytes(json_out, words)
            bound += extra or 0
        if peak > bound:
            problems.append(f"peak RSS {peak / MIB:.0f} MiB over its bound {bound / MIB:.0f} MiB")
        shown = f"{peak / MIB:.0f} MiB"
        print(f"{where:<16} {'-' if code is None else code:>4} {seconds:>7.1f}s {shown:>10} "
              f"{bound / MIB:>6.0f} MiB  {shlex.join(words)[:90]}", flush=True)
        for problem in problems:
            print(f"  FAILED: {problem}", flush=True)
            failures.append(f"{where}: {shlex.join(words)}: {problem}")
    if failures:
        print(f"\n{len(failures)} of {len(lines)} lines failed:")
        for f in failures:
            print("  " + f)
        return 1
    print(f"\nall {len(lines)} lines passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
