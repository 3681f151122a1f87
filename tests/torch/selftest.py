#!/usr/bin/env python3
"""Tests the cross-check harness (crosscheck.py) itself.

    selftest.py --pebble PATH

Runs crosscheck.py against fake_pebble.py, which passes every command but
`run` on to the real pebble at PATH and does `run` with PyTorch in fp64, once
clean and once with each planted fault. The clean run must pass; each fault
(a gradient or the loss off by 1e-3 relative, one bit flipped under one
policy, a missing output, an extra output, an input not read, a pebble
without `run`, no recomputation where one is expected) must fail with exit 1
and a message naming the tensor and the policy; a bad model spec or policy is
a usage error (2); `--backend cuda` without a device skips (77), or fails
under PEBBLE_REQUIRE_CUDA. A failure also counts the values at kinks (a
note); --avoid-kinks passes over a seed with one. The tolerance rules and the kink count are also checked on synthetic
tensors.
Exit 0 when the harness behaves, 1 otherwise, 77 without numpy/torch.
"""

import argparse
import contextlib
import io
import os
import shlex
import stat
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = "conv3d:n=8"
# Each fake run costs a PyTorch start-up: one policy where one is enough.
POLICIES = "baseline"

# (name, fake_pebble options, crosscheck extra args, expected exit, texts
# the output must contain[, environment variables set for the case]).
CASES = [
    ("clean", [], ["--policies", "baseline,sqrtn"], 0, ["PASS"]),
    ("wrong gradient", ["--corrupt", "grad:conv2.weight"], [], 1,
     ["MISMATCH: policy baseline, grad:conv2.weight: rel err",
      "note: PyTorch's fp32 forward has"]),
    ("wrong loss", ["--corrupt", "loss"], [], 1,
     ["MISMATCH: policy baseline, loss: rel err"]),
    ("one bit", ["--flip", "sqrtn:grad:conv1.bias"],
     ["--policies", "baseline,sqrtn"], 1,
     ["policy sqrtn: not bitwise identical to baseline: grad:conv1.bias"]),
    ("missing output", ["--drop", "grad:conv3.bias"], [], 1,
     ["policy baseline: dumped outputs differ", "missing ['grad:conv3.bias']"]),
    ("extra output", ["--extra", "grad:nothing"], [], 1,
     ["unexpected ['grad:nothing']"]),
    ("input ignored", ["--ignore-input"], [], 1,
     ["policy baseline: pebble loaded 7 of the 8 input tensors"]),
    ("no run command", ["--no-run"], [], 1, ["no usable `run` command"]),
    ("no recompute", [], ["--expect-recompute"], 1,
     ["no policy recomputed anything"]),
    ("cuda", [], ["--backend", "cuda"], 0, ["PASS"]),
    # mnist-cnn's seed 0 has a ReLU input and a max-pool window at a kink.
    ("avoid kinks", [], ["--model", "mnist-cnn:batch=8", "--avoid-kinks"], 0,
     ["note: seed 0 has 1 ReLU inputs and 1 max-pool windows at kinks",
      "model mnist-cnn:batch=8, seed 1:", "PASS"]),
    ("no device", ["--no-device"], ["--backend", "cuda"], 77,
     ["SKIP: --backend cuda: pebble: no CUDA device"]),
    ("no device, required", ["--no-device"], ["--backend", "cuda"], 1,
     ["PEBBLE_REQUIRE_CUDA is set but: pebble: no CUDA device"],
     {"PEBBLE_REQUIRE_CUDA": "1"}),
    ("bad model", [], ["--model", "conv3d:m=3"], 2, []),
    ("bad policy", [], ["--policies", "baseline,no-such-policy"], 2, []),
]


def write_wrapper(directory, real, faults):
    """A shell script that runs fake_pebble.py with `faults` in front of the
    arguments it is given."""
    path = os.path.join(directory, "pebble-fake-%d" % len(os.listdir(directory)))
    words = [sys.executable, os.path.join(HERE, "fake_pebble.py"),
             "--real", real] + faults + ["--"]
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexec %s \"$@\"\n"
                % " ".join(shlex.quote(w) for w in words))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def check_compare(np, crosscheck):
    """The tolerance rules of crosscheck.compare on synthetic tensors: the
    names of the cases it misjudges."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(1000).astype(np.float32)
    noise = (1e-9 * rng.standard_normal(64)).astype(np.float32)
    # name: (pebble's tensor, torch's tensor, zero in exact arithmetic,
    # should pass)
    cases = {
        "grad:equal": (ref.copy(), ref, False, True),
        "grad:rel 5e-5": (ref + np.float32(5e-5) * np.abs(ref).max(), ref,
                          False, True),
        "grad:rel 2e-4": (ref + np.float32(2e-4) * np.abs(ref).max(), ref,
                          False, False),
        "grad:nan": (np.where(np.arange(1000) == 7, np.nan, ref).astype(
            np.float32), ref, False, False),
        "grad:shape": (ref[:999].copy(), ref, False, False),
        "grad:zero, noise": (3 * noise[::-1].copy(), noise, True, True),
        "grad:zero, too big": (1e3 * noise, noise, True, False),
        "grad:zero, not marked": (3 * noise[::-1].copy(), noise, False,
                                  False),
    }
    wrong = []
    for name, (a, b, zero, should_pass) in cases.items():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            failures = crosscheck.compare(
                np, {name: a}, {name: b}, None, [name],
                {name} if zero else set(), "test")
        if (not failures) != should_pass:
            wrong.append("%s (%s)" % (name, out.getvalue().strip()))
    return wrong


def check_kinks(torch, crosscheck):
    """count_kinks on a hand-made forward: what it misjudges, or ""."""
    F = torch.nn.functional

    class Net(torch.nn.Module):
        def forward(self, x, t):
            pooled = F.max_pool2d(F.relu(x), 2)
            overlapping = F.max_pool2d(x, 3, stride=2, padding=1)
            return pooled.sum() + overlapping.sum() + 0 * t.sum()

    # ReLU inputs within 1e-6 * 3 of zero: 1e-9, -1e-9, 0, -1e-7 and
    # -2e-7. Windows of relu(x) 2 x 2: {1, 1e-9, 0, 1} ties, {3, 0, 2, 0}
    # does not, {0, 0, 0, 0} are rectified zeros, not a tie. Windows 3 x 3,
    # stride 2, padding 1 of x: {1, 1e-9, -1e-9, 1} ties, {1e-9, 3, -1, 1,
    # 2, 0} does not, {-1, -5, -4, 0, -1e-7, -2e-7} ties (0 and -1e-7).
    x = torch.tensor([[[[1.0, 1e-9, 3.0, -1.0, -5.0, -4.0],
                        [-1e-9, 1.0, 2.0, 0.0, -1e-7, -2e-7]]]])
    got = crosscheck.count_kinks(torch, Net(), x, torch.zeros(1))
    return "" if got == (5, 3) else "count_kinks: %s, want (5, 3)" % (got,)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pebble", required=True, help="the real pebble")
    args = parser.parse_args(argv)
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print("SKIP: numpy and torch are needed (%s)" % e)
        return 77
    sys.path.insert(0, HERE)
    import crosscheck

    real = os.path.abspath(args.pebble)
    problems = check_compare(numpy, crosscheck)
    print("tolerance rules: %s" % ("ok" if not problems else
                                   "WRONG: " + "; ".join(problems)))
    kinks = check_kinks(torch, crosscheck)
    print("kink count: %s" % (kinks or "ok"))
    if kinks:
        problems.append(kinks)
    with tempfile.TemporaryDirectory(prefix="pebble-selftest-") as tmp:
        for name, faults, extra, want_code, want_texts, *env in CASES:
            pebble = write_wrapper(tmp, real, faults)
            cc_args = ["--pebble", pebble, "--model", MODEL,
                       "--policies", POLICIES, "--optional-policies", "",
                       "--workdir", os.path.join(tmp, "work")] + extra
            out = io.StringIO()
            saved = dict(os.environ)
            os.environ.pop("PEBBLE_REQUIRE_CUDA", None)
            os.environ.update(env[0] if env else {})
            try:
                with contextlib.redirect_stdout(out), \
                        contextlib.redirect_stderr(out):
                    code = crosscheck.main(cc_args)
            finally:
                os.environ.clear()
                os.environ.update(saved)
            text = out.getvalue()
            missing = [t for t in want_texts if t not in text]
            verdict = "ok" if code == want_code and not missing else "WRONG"
            print("%-20s exit %d (want %d) %s" % (name, code, want_code,
                                                  verdict), flush=True)
            if verdict != "ok":
                problems.append(name)
                print("  missing texts: %s\n  output:\n%s" % (
                    missing, "    " + text.replace("\n", "\n    ")))
    if problems:
        print("FAIL: the harness misjudged: %s" % ", ".join(problems))
        return 1
    print("PASS: the harness passes a correct run and catches every fault")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
