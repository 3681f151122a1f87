#!/usr/bin/env python3
"""The extraction of tests/docs/doc_commands.py: fenced blocks, continuations,
comments, markers, the skip comment, help examples and the placeholder and
refusal checks. Runs without a build."""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doc_commands as dc  # noqa: E402


def commands(lines):
    return [line.command for line in lines]


class MarkdownTest(unittest.TestCase):
    def test_only_shell_blocks_are_read(self):
        text = "\n".join([
            "# Title",
            "```sh",
            "pebble models",
            "```",
            "```python",
            "import pebble",
            "```",
            "```",
            "pebble not-a-command-block",
            "```",
            "```bash",
            "pebble policies",
            "```",
        ])
        lines, skipped = dc.markdown_lines(text, "doc.md")
        self.assertEqual(commands(lines), ["pebble models", "pebble policies"])
        self.assertEqual([l.where for l in lines], ["doc.md:3", "doc.md:12"])
        self.assertEqual(skipped, [])

    def test_continuations_join_and_keep_the_first_line_number(self):
        text = "```sh\npebble compare --model a \\\n    --budgets 100%,min \\\n    --json\n```\n"
        lines, _ = dc.markdown_lines(text, "d.md")
        self.assertEqual(len(lines), 1)
        self.assertEqual(lines[0].where, "d.md:2")
        self.assertEqual(lines[0].command.split(), ["pebble", "compare", "--model", "a",
                                                    "--budgets", "100%,min", "--json"])

    def test_an_escaped_backslash_does_not_continue(self):
        self.assertFalse(dc.continues("echo a\\\\"))
        self.assertTrue(dc.continues("echo a \\"))

    def test_blank_and_comment_lines_are_skipped(self):
        text = "```sh\n\n# a comment\n   # indented comment\npebble models   # list\n```"
        lines, _ = dc.markdown_lines(text, "d.md")
        self.assertEqual(commands(lines), ["pebble models"])
        self.assertEqual(lines[0].comment, "list")
        self.assertEqual(lines[0].where, "d.md:5")

    def test_console_blocks_run_prompt_lines_only(self):
        text = "```console\n$ pebble models\nconv3d  a model\n$ pebble policies\n```"
        lines, _ = dc.markdown_lines(text, "d.md")
        self.assertEqual(commands(lines), ["pebble models", "pebble policies"])

    def test_skip_comment_on_the_line_before_the_fence(self):
        text = "\n".join([
            "<!-- doc-test: skip (installs packages) -->",
            "```sh",
            "scripts/setup",
            "```",
            "<!-- doc-test: skip (not here: one blank line apart) -->",
            "",
            "```sh",
            "pebble models",
            "```",
        ])
        lines, skipped = dc.markdown_lines(text, "d.md")
        self.assertEqual(skipped, [("d.md:2", "installs packages")])
        self.assertEqual(lines[0].skip, "installs packages")
        self.assertIsNone(lines[1].skip)

    def test_skip_comment_without_reason(self):
        lines, skipped = dc.markdown_lines("<!-- doc-test: skip -->\n```sh\nx\n```", "d.md")
        self.assertEqual(skipped, [("d.md:2", "no reason given")])


class CommentAndMarkerTest(unittest.TestCase):
    def test_hash_inside_quotes_or_words_is_not_a_comment(self):
        self.assertEqual(dc.split_comment("echo '# no' \"# no\" a#b  # yes"),
                         ("echo '# no' \"# no\" a#b", "yes"))
        self.assertEqual(dc.split_comment("echo \"a \\\" # b\""), ("echo \"a \\\" # b\"", ""))

    def test_help_comments_need_two_blanks(self):
        self.assertEqual(dc.split_comment("pebble x # y", min_gap=2), ("pebble x # y", ""))
        self.assertEqual(dc.split_comment("pebble x  # y", min_gap=2), ("pebble x", "y"))

    def test_exit_marker(self):
        line = dc.Line("d:1", "pebble plan --budget 60%", "exit 1: rotor reaches 72% at least")
        self.assertEqual(line.expect, 1)
        self.assertEqual(dc.Line("d:1", "x", "fits; exit 2 when malformed").expect, 2)
        self.assertEqual(dc.Line("d:1", "x", "exits cleanly").expect, 0)
        self.assertEqual(dc.Line("d:1", "x", "").expect, 0)
        self.assertEqual(line.quoted, ["72%"])  # (a refusal's figure, checked when run)
        self.assertEqual(dc.Line("d:1", "x", "keeps 60% of it").quoted, [])

    def test_gpu_marker(self):
        self.assertTrue(dc.Line("d:1", "x", "GPU").gpu)
        self.assertTrue(dc.Line("d:1", "x", "GPU: measured on the device").gpu)
        self.assertTrue(dc.Line("d:1", "x", "runs the kernels; needs a GPU").gpu)
        self.assertTrue(dc.Line("d:1", "x", "GPU only").gpu)
        self.assertFalse(dc.Line("d:1", "x", "on a GPU machine: CUDA build").gpu)
        self.assertFalse(dc.Line("d:1", "x", "GPUs are not needed").gpu)


HELP = """\
pebble: plans memory.

Examples (each runs as it is):
  pebble models                                   # built-in models
  pebble plan --model m --policy 'a # b' --budget 60%   # exit 1: too tight
  pebble simulate --graph g.json
Sizes: whole bytes.

SUBCOMMANDS:
  models                      built-in models
  plan                        plan one policy
                              at a budget
  run-it                      run

OPTIONS:
  -h,--help                   Print this help message and exit
  --model TEXT                model, e.g. conv3d:batch=1
  --other                     something
                                e.g. pebble run --model a --budget 100%
                                     pebble run --model b
  --last                      e.g. pebble fit --model c  # needs a GPU
  --size                      e.g. 8GiB, not e.g. pebble-like text
  import                      e.g. /usr/bin/python3 examples/onnx/export.py out m
                                   pebble import out/m.onnx --output m.json
"""


class HelpTest(unittest.TestCase):
    def test_examples(self):
        lines = dc.help_examples(HELP, "pebble --help")
        self.assertEqual(commands(lines), [
            "pebble models",
            "pebble plan --model m --policy 'a # b' --budget 60%",
            "pebble simulate --graph g.json",
            "pebble run --model a --budget 100%",
            "pebble run --model b",
            "pebble fit --model c",
            "/usr/bin/python3 examples/onnx/export.py out m",
            "pebble import out/m.onnx --output m.json",
        ])
        self.assertEqual(lines[0].where, "pebble --help:4")
        self.assertEqual([l.expect for l in lines], [0, 1, 0, 0, 0, 0, 0, 0])
        self.assertEqual([l.gpu for l in lines], [False] * 5 + [True, False, False])

    def test_subcommands(self):
        self.assertEqual(dc.help_commands(HELP), ["models", "plan", "run-it"])
        self.assertEqual(dc.help_commands("no section\n"), [])


class ChecksTest(unittest.TestCase):
    def test_read_paths(self):
        self.assertEqual(dc.read_paths("pebble simulate --graph g.json --schedule=s.json "
                                       "--schedule-out t.json --profile p.json"),
                         ["g.json", "s.json", "p.json"])
        self.assertEqual(dc.read_paths("build/bin/pebble import --loss none m.onnx --output f.json"),
                         ["m.onnx"])
        self.assertEqual(dc.read_paths("pebble run --inputs in/ --graph \"$G\""), ["in/"])
        self.assertEqual(dc.read_paths("python3 -c 'import os'"), [])

    def test_refused(self):
        for command in ["scripts/setup && scripts/build", "ctest --test-dir build",
                        "cmake --install build", "x; ./scripts/main-job", "(scripts/test)"]:
            self.assertTrue(dc.REFUSED_RE.search(command), command)
        for command in ["pebble plan --model cmake-ish", "examples/scripts/buildx",
                        "pebble compare --policies exec:python3 examples/policies/ctest.py"]:
            self.assertFalse(dc.REFUSED_RE.search(command), command)

    def test_placeholder_and_exit_code_when_run(self):
        lines, _ = dc.markdown_lines("\n".join([
            "```sh",
            "echo hi > made.json",
            "cat made.json   # reads what the line above wrote",
            "pebble plan --graph missing.json",
            "false   # exit 1",
            "true    # exit 1: but it succeeds",
            "bash -c 'exit 3'   # exit 3",
            "ctest --test-dir build",
            "bash -c 'echo reaches 61%; exit 1'   # exit 1: reaches 61% at least",
            "bash -c 'echo reaches 63%; exit 1'   # exit 1: reaches 61% at least",
            "```",
        ]), "d.md")
        with tempfile.TemporaryDirectory() as fake:
            build = os.path.join(fake, "build")
            os.makedirs(os.path.join(build, "bin"))
            passed, failures, skips, _ = dc.run_lines(lines, fake, build, 30, gpu=False)
        self.assertEqual(passed, 5)
        self.assertEqual(skips, [])
        problems = {line.where: problem for line, problem in failures}
        self.assertEqual(set(problems), {"d.md:4", "d.md:6", "d.md:8", "d.md:10"})
        self.assertEqual(problems["d.md:10"],
                         "its comment quotes 61%, which its output does not say: reaches 63%")
        self.assertEqual(problems["d.md:4"], "placeholder: missing.json is made by no earlier line")
        self.assertEqual(problems["d.md:6"], "expected exit 1, got exit 0")
        self.assertTrue(problems["d.md:8"].startswith("refused: runs ctest"))

    def test_timeout_and_gpu_skip(self):
        lines = [dc.Line("d:1", "sleep 5"), dc.Line("d:2", "true", "needs a GPU")]
        with tempfile.TemporaryDirectory() as fake:
            build = os.path.join(fake, "build")
            os.makedirs(build)
            passed, failures, skips, _ = dc.run_lines(lines, fake, build, 0.5, gpu=False)
        self.assertEqual(passed, 0)
        self.assertEqual([p for _, p in failures], ["expected exit 0, got timed out after 0.5 s"])
        self.assertEqual(skips, ["needs a GPU"])

    def test_scratch_directory_is_removed_and_links_resolve(self):
        with tempfile.TemporaryDirectory() as repo:
            os.makedirs(os.path.join(repo, "examples"))
            with open(os.path.join(repo, "examples", "e.json"), "w") as f:
                f.write("{}")
            build = os.path.join(repo, "b")
            os.makedirs(os.path.join(build, "bin"))
            lines = [dc.Line("d:1", "test -f examples/e.json && test -d build/bin"),
                     dc.Line("d:2", "pwd > \"$HOME/where\" && cp \"$HOME/where\" examples/where")]
            passed, failures, _, _ = dc.run_lines(lines, repo, build, 30, gpu=False)
            self.assertEqual((passed, failures), (2, []))
            with open(os.path.join(repo, "examples", "where")) as f:
                scratch = f.read().strip()
            self.assertFalse(os.path.exists(scratch))
            self.assertTrue(os.path.exists(os.path.join(repo, "examples", "e.json")))


if __name__ == "__main__":
    unittest.main()
