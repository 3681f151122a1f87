#!/usr/bin/env python3
"""Wall-clock time of `pebble compare` planning its (policy, budget) pairs one
after the other (--jobs 1) and at once (--jobs 0: one per hardware thread),
and whether the plans are the same. Prints a Markdown table.

    bench/compare_jobs.py --pebble build/bin/pebble [--models M1 M2 ...]

The policies are the deterministic ones (no search stopped by a wall-clock
limit), so that the plans must be equal whatever the sharing of the cores.
"""

import argparse
import json
import os
import subprocess
import time

DETERMINISTIC = ("baseline,best-order,dfs,greedy,sqrtn,chen-greedy,articulation,rotor,dtr,"
                 "vdnn,swap,hybrid")


def compare(pebble, model, jobs, budgets):
    start = time.perf_counter()
    out = subprocess.run([pebble, "compare", "--model", model, "--policies", DETERMINISTIC,
                          "--budgets", budgets, "--jobs", str(jobs), "--format", "json"],
                         check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - start
    rows = json.loads(out)["results"]
    for r in rows:
        r.pop("plan_time_s", None)
    return seconds, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pebble", default="build/bin/pebble")
    ap.add_argument("--models", nargs="+",
                    default=["resnet18:batch=8,image=128", "resnet50:batch=4,image=128",
                             "unet3d:batch=1,variant=small", "transformer:layers=8",
                             "random:n=2000"])
    ap.add_argument("--budgets", default="100%,80%,60%,40%,min")
    args = ap.parse_args()
    print(f"{os.cpu_count()} hardware threads; policies {DETERMINISTIC}; "
          f"budgets {args.budgets}\n")
    print("| model | --jobs 1 (s) | --jobs 0 (s) | speed-up | same plans |")
    print("| --- | ---: | ---: | ---: | --- |")
    for model in args.models:
        serial, serial_rows = compare(args.pebble, model, 1, args.budgets)
        parallel, parallel_rows = compare(args.pebble, model, 0, args.budgets)
        print(f"| `{model}` | {serial:.2f} | {parallel:.2f} | {serial / parallel:.2f}x | "
              f"{'yes' if serial_rows == parallel_rows else 'NO'} |")


if __name__ == "__main__":
    main()
