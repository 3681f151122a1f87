#!/usr/bin/env python3
"""Messages of sharded steps: the collectives (gathers and reduce-scatters,
a bucket counting once), the simulated makespan and the peak of each plan,
for every binary given, with the optimizer's state, updates and gradients
placed as a user of ZeRO-style sharding places them. A change to the
planned buckets (scheduler/collective_buckets.cc) prints here what it buys
and where it costs. Every figure is the simulator's: a prediction.

    bench/sharded_messages.py --pebble OLD_BINARY NEW_BINARY [--ranks 4]
        [--models M ...] [--jobs 2]

Prints a Markdown table (one row a model, placement, policy and budget;
rows where every binary agrees are counted, not shown, unless --all) and a
summary: rows faster, slower and the same, per binary after the first.
"""

import argparse
import concurrent.futures
import itertools
import json
import subprocess

MODELS = ["transformer:layers=2", "mnist-cnn:batch=8", "resnet18:batch=2,image=32"]
PLACEMENTS = ["optimizer=adam", "optimizer=adam,updates=host", "optimizer=adam,optimizer_state=host",
              "optimizer=sgd:momentum=0.9,updates=auto", "optimizer=adam,gradients=drop",
              "optimizer=adam,max_grad_norm=1,updates=host", "optimizer=adam,parameters=host"]
POLICIES = ["dtr", "rotor", "hybrid", "baseline"]
BUDGETS = ["min", "90%"]


def plan(binary, model, placement, policy, budget, ranks):
    """(feasible, peak bytes, makespan s, collectives) or ("error", message)."""
    done = subprocess.run(
        [binary, "plan", "--model", f"{model},{placement}", "--ranks", str(ranks), "--shard",
         "full", "--policy", policy, "--budget", budget, "--time-limit", "60", "--json"],
        capture_output=True, text=True, check=False)
    try:
        doc = json.loads(done.stdout)
    except json.JSONDecodeError:
        return ("error", done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "")
    r = doc["report"]
    return (doc["feasible"], r["peak_bytes"], r["makespan"], r["collectives"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pebble", nargs="+", required=True, help="pebble binaries to compare")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--all", action="store_true", help="show the rows where all agree too")
    args = ap.parse_args()
    cases = list(itertools.product(args.models, PLACEMENTS, POLICIES, BUDGETS))

    def row(case):
        return case, [plan(b, *case, args.ranks) for b in args.pebble]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(row, cases))
    print("| model | placement | policy | budget | " +
          " | ".join(f"`{b}` messages, ms, peak" for b in args.pebble) + " |")
    print("| --- | --- | --- | --- |" + " --- |" * len(args.pebble))
    tally = [{"faster": 0, "slower": 0, "same": 0, "other": 0} for _ in args.pebble[1:]]
    for (model, placement, policy, budget), results in rows:
        first = results[0]
        for k, r in enumerate(results[1:]):
            if r == first:
                tally[k]["same"] += 1
            elif "error" in (r[0], first[0]) or r[0] != first[0]:
                tally[k]["other"] += 1
            else:
                tally[k]["faster" if r[2] < first[2] else "slower"] += 1
        if all(r == first for r in results) and not args.all:
            continue
        cells = [r[1] if r[0] == "error" else
                 f"{r[3]}, {1e3 * r[2]:.3f}, {r[1]:,}{'' if r[0] else ' (does not fit)'}"
                 for r in results]
        print(f"| {model} | {placement.removeprefix('optimizer=')} | {policy} | {budget} | " +
              " | ".join(cells) + " |")
    print()
    for binary, t in zip(args.pebble[1:], tally):
        print(f"`{binary}` against `{args.pebble[0]}` over {len(rows)} plans: {t['faster']} "
              f"faster, {t['slower']} slower, {t['same']} the same, {t['other']} otherwise "
              "(an error or another verdict)")


if __name__ == "__main__":
    main()
