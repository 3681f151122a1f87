#!/usr/bin/env python3
"""Peak memory of every one-shot policy on the zoo and on pebbling graphs.

Runs `pebble compare --budgets min --json` per graph and prints a Markdown
table: the peak of each policy, and its ratio to exact-order's optimum where
exact-order finished (graphs past its size limit show '-').

Usage: bench/one_shot_table.py [path/to/pebble] > table.md
"""
import json
import subprocess
import sys

PEBBLE = sys.argv[1] if len(sys.argv) > 1 else "build/bin/pebble"
POLICIES = ["baseline", "dfs", "greedy", "tree", "exact-order", "best-order"]
GRAPHS = [
    "path:n=16", "pyramid:h=4", "pyramid:h=8", "tree:h=3", "tree:h=5",
    "random:n=30,seed=1,sizes=random", "random:n=60,seed=2,sizes=random",
    "linear:n=12", "tanh-chain:length=8,size=1000000", "conv3d:n=128",
    "mnist-cnn:batch=64", "transformer", "resnet18:batch=8", "unet3d:batch=1,variant=small",
]


def human(b):
    for unit in ["B", "KiB", "MiB", "GiB", "TiB"]:
        if b < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.3g} {unit}"
        b /= 1024


def main():
    print("| graph | " + " | ".join(POLICIES) + " |")
    print("|" + " --- |" * (len(POLICIES) + 1))
    for g in GRAPHS:
        out = subprocess.run(
            [PEBBLE, "compare", "--model", g, "--budgets", "min", "--policies",
             ",".join(POLICIES), "--time-limit", "20", "--json"],
            check=True, capture_output=True, text=True).stdout
        doc = json.loads(out)
        opt = doc.get("optimal_order_peak_bytes")
        cells = []
        for row in doc["results"]:
            if "error" in row:
                cells.append("n/a")
                continue
            peak = row["report"]["peak_bytes"]
            unit = g.split(":")[0] in ("path", "pyramid", "tree", "linear", "random")
            text = str(peak) if unit else human(peak)
            if opt:
                text += f" ({peak / opt:.2f})"
            cells.append(text)
        print(f"| `{g}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
