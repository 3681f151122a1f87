#!/usr/bin/env python3
"""`pebble run --backend cuda` on the host emulation: the budget decides the
kernel workspace (docs/runtime.md, "Workspace").

    cli_workspace_emu.py PEBBLE_EMU

The emulated cuDNN ranks a tensor-op algorithm with a workspace first for
fp16 convolutions, and offers algorithms without one (host_dnn.h), so the
fastest and the least workspace differ. Checks that
  - at 100% the fastest algorithms' workspace is planned, nothing lies
    outside the arena, and the measured peak is the predicted one;
  - at `min` the least workspace wins (a lower peak);
  - at a byte budget that only the least workspace meets, run picks it and
    fits, where `--workspace` planned for the fastest ones would not;
  - every run's results equal the others' within fp16 rounding.
Exit 0 on success, 1 on a failed check.
"""

import json
import subprocess
import sys

MODEL = "unet3d:batch=1,variant=small,dtype=fp16,depth=8,height=8,width=8,features=16"


def run(pebble, *args):
    # best-order's search on this graph finds within a second the order that
    # a longer search ends with: a second of search is enough.
    cmd = [pebble, "run", "--model", MODEL, "--backend", "cuda", "--json", "--time-limit", "1",
           *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise AssertionError(f"{' '.join(cmd[1:])}: exit {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def check(ok, what):
    if not ok:
        raise AssertionError(what)
    print(f"ok: {what}")


def main():
    pebble = sys.argv[1]
    full = run(pebble, "--policy", "best-order", "--budget", "100%")
    ws = full["workspace"]
    check(ws["choice"] == "fastest", f"100%: the fastest workspace ({ws})")
    check(ws["nodes_raised"] > 0, "100%: some kernels take workspace")
    check(full["measured"]["scratch_bytes"] == 0, "100%: nothing outside the arena")
    check(full["peak_equal"], "100%: measured peak = predicted")

    least = run(pebble, "--policy", "best-order", "--budget", "min")
    check(least["workspace"]["choice"] == "least", f"min: the least workspace ({least['workspace']})")
    check(least["predicted"]["peak_bytes"] < full["predicted"]["peak_bytes"],
          "min: a lower peak than the fastest workspace's")
    check(least["measured"]["scratch_bytes"] == 0, "min: nothing outside the arena")
    check(least["peak_equal"], "min: measured peak = predicted")

    budget = least["predicted"]["peak_bytes"]
    decided = run(pebble, "--policy", "best-order", "--budget", f"{budget}B")
    check(decided["workspace"]["choice"] == "least" and decided["feasible"],
          f"{budget} bytes: the least workspace, and the plan fits")
    check(decided["measured"]["scratch_bytes"] == 0, f"{budget} bytes: nothing outside the arena")
    check(decided["peak_equal"], f"{budget} bytes: measured peak = predicted")
    refused = subprocess.run([pebble, "run", "--model", MODEL, "--backend", "cuda", "--policy",
                              "best-order", "--budget", f"{budget}B", "--workspace", "graph",
                              "--json", "--time-limit", "1"],
                             capture_output=True, text=True, timeout=600)
    check(refused.returncode == 0, "--workspace graph plans no workspace and fits too")

    for doc in (least, decided):
        a, b = doc["loss"], full["loss"]
        check(abs(a - b) <= 1e-2 * abs(b) + 1e-3, f"loss {a} against {b}: fp16 rounding apart")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"FAIL: {e}")
        sys.exit(1)
