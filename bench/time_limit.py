#!/usr/bin/env python3
"""Does every policy keep its --time-limit? Times `pebble plan` (the whole
process: loading, composition with best-order, the policy, the layout) for
each policy at a budget where searches run long, and prints a Markdown table
of wall time against the limit.

    bench/time_limit.py --pebble build/bin/pebble [--limit 10]
        [--models resnet50:batch=32 random:n=100000 ...] [--budgets 50%,min]
        [--policies all]

A row is over when the wall time exceeds the limit by more than 10% (the
issue's promise) and the plan took more than a second (a fast policy is not
bound by the limit at all).
"""

import argparse
import json
import subprocess
import sys
import time


def policies(pebble):
    out = subprocess.run([pebble, "policies", "--json"], capture_output=True, text=True,
                         check=True).stdout
    doc = json.loads(out)
    rows = doc if isinstance(doc, list) else doc.get("policies", [])
    return [p["name"] for p in rows]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pebble", default="build/bin/pebble")
    ap.add_argument("--limit", type=float, default=10)
    ap.add_argument("--models", nargs="+",
                    default=["resnet50:batch=32", "unet3d:batch=1,variant=small",
                             "transformer:layers=8", "random:n=20000"])
    ap.add_argument("--budgets", default="50%,min")
    ap.add_argument("--policies", default="all",
                    help="comma-separated, or all (every registered policy but exact, whose "
                         "exhaustive search is for small graphs)")
    args = ap.parse_args()
    names = policies(args.pebble) if args.policies == "all" else args.policies.split(",")
    if args.policies == "all":
        names = [n for n in names if n != "exact"]

    print(f"`pebble plan --time-limit {args.limit:g}`: wall seconds of the whole command.\n")
    print("| model | budget | policy | wall s | over the limit | plan | note |")
    print("| --- | --- | --- | ---: | --- | --- | --- |")
    over = 0
    for model in args.models:
        for budget in args.budgets.split(","):
            for policy in names:
                cmd = [args.pebble, "plan", "--model", model, "--policy", policy, "--budget",
                       budget, "--time-limit", str(args.limit), "--json", "--quiet"]
                start = time.perf_counter()
                try:
                    out = subprocess.run(cmd, capture_output=True, text=True,
                                         timeout=20 * args.limit + 120)
                    wall = time.perf_counter() - start
                except subprocess.TimeoutExpired:
                    wall, out = time.perf_counter() - start, None
                late = wall > 1.1 * args.limit and wall > 1.0
                over += late
                if out is None:
                    plan, note = "killed", "no answer"
                elif out.returncode != 0 and '"feasible": false' not in out.stdout:
                    plan = "error"
                    note = (out.stderr.strip().splitlines() or [""])[-1][:80]
                else:
                    doc = json.loads(out.stdout)
                    plan = "fits" if doc["feasible"] else "does not fit"
                    note = doc.get("message", "")[:80].replace("|", "/")
                print(f"| {model} | {budget} | {policy} | {wall:.2f} | "
                      f"{'OVER' if late else ''} | {plan} | {note} |", flush=True)
    print(f"\n{over} of the runs exceeded the limit by more than 10%.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
