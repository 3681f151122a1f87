#!/usr/bin/env python3
"""Geometric-mean compute-cost ratio of each multi-shot policy to the optimum.

For small graphs the `exact` policy gives the cheapest schedule at any budget.
Budgets are placed between the lowest feasible peak (exact at --budget min) and
the baseline peak, at fractions 0, 1/4, 1/2 and 3/4 of the gap. For each policy
and budget where the policy fits, the ratio compute_cost / exact's compute_cost
is recorded; the table gives the geometric mean, the worst ratio and how many of
the budgets the policy met.

Usage: bench/multi_shot_ratio.py [path/to/pebble] > table.md
"""
import json
import math
import subprocess
import sys

PEBBLE = sys.argv[1] if len(sys.argv) > 1 else "build/bin/pebble"
POLICIES = ["sqrtn", "chen-greedy", "articulation", "revolve", "rotor", "dtr",
            "checkmate", "checkmate-lp", "exact"]
GRAPHS = ["linear:n=4", "linear:n=6", "linear:n=8", "tanh-chain:length=4,size=100",
          "tanh-chain:length=6,size=100", "conv3d:n=16", "random:n=8,seed=1,sizes=random",
          "random:n=10,seed=2,sizes=random", "random:n=12,seed=3,sizes=random"]
FRACTIONS = [0.0, 0.25, 0.5, 0.75]


def pebble(*args):
    out = subprocess.run([PEBBLE, *args, "--json", "--time-limit", "20"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ratios = {p: [] for p in POLICIES}
    met = {p: 0 for p in POLICIES}
    total = 0
    for g in GRAPHS:
        low = pebble("plan", "--model", g, "--policy", "exact", "--budget", "min")
        low_peak = low["report"]["peak_bytes"]
        base = low["baseline_peak_bytes"]
        budgets = sorted({int(low_peak + f * (base - low_peak)) for f in FRACTIONS})
        doc = pebble("compare", "--model", g, "--budgets", ",".join(map(str, budgets)),
                     "--policies", ",".join(POLICIES))
        best = {}
        for row in doc["results"]:
            if row["policy"] == "exact" and row.get("feasible"):
                best[row["budget"]] = row["report"]["compute_cost"]
        for row in doc["results"]:
            if row["budget"] not in best:
                continue
            if row["policy"] == "exact":
                total += 1
            if "error" in row or not row.get("feasible"):
                continue
            met[row["policy"]] += 1
            ratios[row["policy"]].append(row["report"]["compute_cost"] / best[row["budget"]])
    print(f"{len(GRAPHS)} graphs, {total} budgets with a known optimum\n")
    print("| policy | budgets met | geometric-mean cost / optimum | worst |")
    print("| --- | ---: | ---: | ---: |")
    for p in POLICIES:
        r = ratios[p]
        if not r:
            print(f"| `{p}` | 0 / {total} | - | - |")
            continue
        gm = math.exp(sum(math.log(x) for x in r) / len(r))
        print(f"| `{p}` | {met[p]} / {total} | {gm:.3f} | {max(r):.3f} |")


if __name__ == "__main__":
    main()
