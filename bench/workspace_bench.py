#!/usr/bin/env python3
"""Kernel workspace in the plan (docs/runtime.md, "Workspace"): one training
step per model under `pebble run --workspace query` (each kernel's scratch
asked of the backend and planned in the arena) and `--workspace graph` (the
graph's own figures: scratch outside the plan), side by side. Prints a
Markdown table.

    bench/workspace_bench.py --pebble build/bin/pebble [--backend cpu]
                             [--models M1 M2 ...] [--policy baseline]

Columns: the plan's predicted peak and the arena; `scratch`, the kernel
scratch outside the plan (measured.scratch_bytes); `max RSS`, the process's
maximum resident set (the child's rusage: a process that holds nothing
outside the plan grows with the arena); on CUDA `driver`, the device memory
in use after the step (cudaMemGetInfo); the step time after one warm-up step.
"""

import argparse
import json
import os
import subprocess
import sys


def run(pebble, model, backend, policy, workspace):
    cmd = [pebble, "run", "--model", model, "--backend", backend, "--policy", policy,
           "--budget", "100%", "--warmup", "1", "--workspace", workspace, "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    if proc.returncode != 0:
        return {"model": model, "workspace": workspace,
                "error": (err.strip().splitlines() or ["(no message)"])[-1]}
    doc = json.loads(out)
    m, p = doc["measured"], doc["predicted"]
    return {"model": model, "workspace": workspace, "predicted": p["peak_bytes"],
            "peak_equal": doc["peak_equal"], "arena": m["arena_bytes"],
            "scratch": m["scratch_bytes"], "driver": m.get("driver_bytes_in_use"),
            "time_s": m["time_s"]}


def max_rss_kib(pebble, model, backend, policy, workspace):
    """The maximum resident set of one `pebble run` without warm-up (KiB),
    from wait4: getrusage(RUSAGE_CHILDREN) would give the largest child so
    far, not this one."""
    cmd = [pebble, "run", "--model", model, "--backend", backend, "--policy", policy,
           "--budget", "100%", "--workspace", workspace, "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss if proc.returncode == 0 else None


def mib(b):
    return "-" if b is None else f"{b / 2**20:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pebble", default="build/bin/pebble")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--policy", default="baseline")
    ap.add_argument("--models", nargs="+",
                    default=["conv3d:n=8", "conv3d:n=32", "conv3d:n=64", "conv3d:n=96",
                             "conv3d:n=128", "resnet18:batch=8,image=128"])
    ap.add_argument("--json-out", help="also write the rows as JSON lines to this file")
    args = ap.parse_args()

    rows = []
    for model in args.models:
        for workspace in ("graph", "query"):
            row = run(args.pebble, model, args.backend, args.policy, workspace)
            if "error" not in row and args.backend == "cpu":
                row["max_rss"] = max_rss_kib(args.pebble, model, args.backend, args.policy,
                                             workspace)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")

    print(f"| model | workspace | predicted peak MiB | arena MiB | scratch outside MiB | "
          f"{'max RSS MiB' if args.backend == 'cpu' else 'driver MiB'} | step s | note |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['workspace']} | - | - | - | - | - | {r['error']} |")
            continue
        extra = (mib(r["max_rss"] * 1024) if r.get("max_rss") else "-") \
            if args.backend == "cpu" else mib(r.get("driver"))
        note = "" if r["peak_equal"] else "measured != predicted"
        print(f"| {r['model']} | {r['workspace']} | {mib(r['predicted'])} | {mib(r['arena'])} | "
              f"{mib(r['scratch'])} | {extra} | {r['time_s']:.3f} | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
