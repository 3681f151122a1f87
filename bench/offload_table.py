#!/usr/bin/env python3
"""Makespan of the offload policies against the recompute-only ones.

For each model, link preset and budget, runs `pebble plan --json` with the
offload policies (vdnn, swap, hybrid) and the recompute-only heuristics
(sqrtn, chen-greedy, articulation, rotor, dtr), and prints Markdown tables:
per offload policy, whether it fits, its simulated makespan as a ratio to
the fastest recompute-only plan that fits ("best recompute"), its exposed
transfer time, and how many tensors it keeps / swaps / recomputes (with the
operators it swaps most). Every figure comes from the simulator through the
CLI's JSON. Recompute-only plans do not depend on the link, so they are
planned once per budget.

Usage: bench/offload_table.py path/to/pebble [model ...] > tables.md
"""
import json
import subprocess
import sys
import time

PEBBLE = sys.argv[1] if len(sys.argv) > 1 else "build/bin/pebble"
MODELS = sys.argv[2:] or ["conv3d:n=128", "resnet18:batch=32", "unet3d"]
LINKS = ["pcie4", "pcie5", "nvlink-c2c"]
# Budgets between the baseline peak and the lowest peak any policy reaches
# (conv3d: 86.7%, resnet18:batch=32: 57.7%, unet3d: 29.3% of the baseline).
BUDGETS = {"conv3d": ["95%", "90%", "87%"], "resnet18": ["80%", "70%", "60%"]}
DEFAULT_BUDGETS = ["80%", "60%", "40%"]
OFFLOAD = ["vdnn", "swap", "hybrid"]
RECOMPUTE = ["sqrtn", "chen-greedy", "articulation", "rotor", "dtr"]


def plan(model, policy, budget, link):
    start = time.time()
    proc = subprocess.run(
        [PEBBLE, "plan", "--model", model, "--policy", policy, "--budget", budget,
         "--bandwidth", link, "--json"],
        capture_output=True, text=True)
    # A plan that does not fit exits 1 and still prints its document.
    if proc.returncode not in (0, 1) or not proc.stdout:
        raise RuntimeError(f"pebble plan {model} {policy} {budget}: {proc.stderr.strip()}")
    out = proc.stdout
    doc = json.loads(out)
    doc["wall_s"] = time.time() - start
    return doc


def tensors(doc):
    t = doc.get("details", {}).get("tensors")
    if not t:
        r = doc["report"]
        return "-", ""
    c = t["counts"]
    text = (f"{c['kept']}/{c['swapped'] + c['swapped_and_recomputed']}/"
            f"{c['recomputed'] + c['swapped_and_recomputed']}")
    ops = []
    for op, classes in t["by_op"].items():
        n = classes.get("swapped", 0) + classes.get("swapped_and_recomputed", 0)
        if n:
            ops.append((n, op))
    ops.sort(key=lambda x: (-x[0], x[1]))
    return text, ", ".join(f"{op} {n}" for n, op in ops[:3])


def main():
    print("Columns per policy: fits; makespan / best recompute-only makespan; exposed "
          "transfer time (ms); tensors kept/swapped/recomputed; operators swapped most.\n")
    for model in MODELS:
        budgets = BUDGETS.get(model.split(":")[0], DEFAULT_BUDGETS)
        recompute = {}
        for budget in budgets:
            best = None
            for p in RECOMPUTE:
                doc = plan(model, p, budget, "pcie4")
                if doc["feasible"]:
                    m = doc["report"]["makespan"]
                    if best is None or m < best[0]:
                        best = (m, p)
            recompute[budget] = best
        base = plan(model, "baseline", "100%", "pcie4")
        print(f"### `{model}`\n")
        print(f"Baseline peak {base['report']['peak_bytes'] / 2**30:.2f} GiB, "
              f"compute time {base['report']['makespan'] * 1e3:.1f} ms "
              "(--throughput 10e12 FLOP/s).\n")
        print("| link | budget | best recompute | " + " | ".join(OFFLOAD) + " |")
        print("|" + " --- |" * (3 + len(OFFLOAD)))
        for link in LINKS:
            for budget in budgets:
                best = recompute[budget]
                ref = best[0] if best else None
                cells = []
                for p in OFFLOAD:
                    doc = plan(model, p, budget, link)
                    r = doc["report"]
                    if not doc["feasible"]:
                        cells.append(f"no ({r['peak_bytes'] / 2**30:.2f} GiB)")
                        continue
                    ratio = f"{r['makespan'] / ref:.3f}" if ref else f"{r['makespan'] * 1e3:.1f} ms"
                    counts, ops = tensors(doc)
                    cell = (f"{ratio}, exp {r['exposed_transfer_time'] * 1e3:.1f}, {counts}")
                    if ops:
                        cell += f" ({ops})"
                    if p == "hybrid":
                        cell += f"; {doc['details'].get('candidate', '?')}"
                        cell += f"; {doc['wall_s']:.1f} s"
                    cells.append(cell)
                ref_text = (f"{best[1]} {best[0] * 1e3:.1f} ms" if best else "none fits")
                print(f"| {link} | {budget} | {ref_text} | " + " | ".join(cells) + " |")
        print()


if __name__ == "__main__":
    main()
