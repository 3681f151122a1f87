#!/usr/bin/env python3
"""Tests the optimizer check (optimizer_check.py) itself.

    optimizer_selftest.py --pebble PATH

Runs optimizer_check.py on mnist-cnn with SGD through a wrapper around the
real pebble that plants one fault per case: the clean run must pass; a
learning rate off by 10% (the step replay and the trajectory fail), one bit
flipped in one policy's momentum buffer (not bitwise identical to the
baseline), a state tensor missing from the dump, a predicted peak off by one
byte, and (with max_grad_norm) the gradients left unclipped must each fail
with exit 1 and a message naming the fault.
Exit 0 when the harness behaves, 1 otherwise, 77 without numpy/torch.
"""

import argparse
import contextlib
import io
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
MODEL = "mnist-cnn:batch=8"
OPTIMIZER = "sgd:lr=0.1,momentum=0.9"

# The wrapper: runs the real pebble (argv[1]) with the rest of argv, then
# plants the fault named by PEBBLE_FAULT in what `run` wrote.
WRAPPER = r'''#!/usr/bin/env python3
import json, os, subprocess, sys
import numpy as np
real, args = sys.argv[1], sys.argv[2:]
fault = os.environ.get("PEBBLE_FAULT", "")
if fault == "lr" and "--optimizer" in args and args[0] == "run":
    i = args.index("--optimizer") + 1
    args[i] = args[i].replace("lr=0.1", "lr=0.11")
if fault == "noclip" and "--optimizer" in args and args[0] == "run":
    i = args.index("--optimizer") + 1
    args[i] = args[i].replace("max_grad_norm=0.5", "max_grad_norm=50")  # a factor of 1
proc = subprocess.run([real] + args, stdout=subprocess.PIPE, universal_newlines=True)
out = proc.stdout
if args and args[0] == "run" and "--dump" in args:
    dump = args[args.index("--dump") + 1]
    policy = args[args.index("--policy") + 1]
    if fault == "flip" and policy == "dtr":
        path = os.path.join(dump, "momentum_buffer:fc1.weight.npy")
        a = np.load(path)
        a.view(np.uint32).flat[int(np.argmax(np.abs(a)))] ^= 1  # not a zero
        np.save(path, a)
    if fault == "drop":
        os.remove(os.path.join(dump, "momentum_buffer:conv1.bias.npy"))
    if fault == "peak" and "--json" in args:
        doc = json.loads(out)
        doc["predicted"]["peak_bytes"] += 1
        out = json.dumps(doc)
sys.stdout.write(out)
sys.exit(proc.returncode)
'''

# (name, fault, expected exit, texts the output must contain[, optimizer]).
CASES = [
    ("clean", "", 0, ["PASS"]),
    ("wrong lr", "lr", 1, ["step 1 replayed by torch.optim, fc1.weight: rel err",
                           "MISMATCH: policy baseline, fc1.weight: rel err"]),
    ("one bit", "flip", 1, ["policy dtr: not bitwise identical to baseline: "
                            "momentum_buffer:fc1.weight"]),
    ("state not dumped", "drop", 1, ["--dump has no momentum_buffer:conv1.bias"]),
    ("peak", "peak", 1, ["measured peak", "predicted"]),
    ("not clipped", "noclip", 1, ["the clipped gradients' norm is"],
     OPTIMIZER + ",max_grad_norm=0.5"),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pebble", required=True)
    args = parser.parse_args()
    try:
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print("SKIP: numpy and torch are needed (%s)" % e)
        return 77
    failures = []
    with tempfile.TemporaryDirectory(prefix="pebble-optimizer-selftest-") as tmp:
        wrapper = os.path.join(tmp, "pebble-wrapper.py")
        with open(wrapper, "w") as f:
            f.write(WRAPPER)
        shim = os.path.join(tmp, "pebble")
        with open(shim, "w") as f:
            f.write('#!/bin/sh\nexec "%s" "%s" "%s" "$@"\n' % (
                sys.executable, wrapper, os.path.abspath(args.pebble)))
        os.chmod(shim, 0o755)
        import optimizer_check  # (in this process: torch imported once, not per case)
        for name, fault, want_exit, texts, *optimizer in CASES:
            out = io.StringIO()
            os.environ["PEBBLE_FAULT"] = fault  # (the wrapper's, a process of its own)
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    code = optimizer_check.main(
                        ["--pebble", shim, "--model", MODEL,
                         "--optimizer", (optimizer or [OPTIMIZER])[0],
                         "--steps", "2", "--policies", "baseline,dtr"])
            finally:
                os.environ.pop("PEBBLE_FAULT", None)
            text = out.getvalue()
            missing = [t for t in texts if t not in text]
            ok = code == want_exit and not missing
            print("%-18s exit %d (want %d)%s" % (name, code, want_exit,
                                                 "" if ok else "  FAILED"), flush=True)
            if not ok:
                failures.append(name)
                print("  missing texts: %s\n  output tail:\n%s" % (
                    missing, "\n".join(text.splitlines()[-15:])))
    if failures:
        print("FAIL: the harness misbehaved in: %s" % ", ".join(failures))
        return 1
    print("PASS: every planted fault fails the optimizer check, the clean run passes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
