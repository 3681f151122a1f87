#!/usr/bin/env python3
"""torchvision models under pebble.torch's plans: the allocator's memory after
every step of each plan against the simulator's (step.memory_timeline).

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_timeline_sweep.py
        [--models mobilenet_v2,shufflenet_v2_x0_5,...] [--policies dtr,rotor,...]
        [--budgets min,80%] [--batch 2] [--image 64] [--json]

Each model (ten classes, training mode, seed 0) is captured once under
`baseline` at 100% and planned again (step.replan) under each policy at each
budget; each plan runs one step through step.memory_timeline. A row gives the
plan's steps, how many of them end with the allocator holding other than the
simulator's level (0 is exact: the CPU's figures are to the byte), the
largest such difference in bytes, and the predicted and measured step peaks.
A plan a policy refuses (a budget below its least peak, checkmate-lp's cap on
the graph's size) is a row that says so. Exit 1 where a level differs.
"""

import argparse
import datetime
import json
import platform
import re
import sys
import time
import warnings

MODELS = ("resnet18", "mobilenet_v2", "shufflenet_v2_x0_5", "squeezenet1_1", "efficientnet_b0",
          "regnet_x_400mf", "mnasnet0_5")
POLICIES = ("dtr", "rotor", "sqrtn", "checkmate-lp", "hybrid")


def rows_of(torch, pt, name, policies, budgets, batch, image):
    """One row per (policy, budget) of model `name`, `baseline` first."""
    import torchvision
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=10).train()
    x = torch.randn(batch, 3, image, image)
    y = torch.randint(0, 10, (batch,))
    loss_fn = torch.nn.functional.cross_entropy
    base = pt.train_step(model, loss_fn, (x,), y, policy="baseline", budget="100%")
    runs = [("baseline", "100%")] + [(p, b) for p in policies for b in budgets]
    for policy, budget in runs:
        row = {"model": name, "policy": policy, "budget": budget}
        try:
            step = base if policy == "baseline" else base.replan(policy=policy, budget=budget)
        except pt.PlanError as e:
            row["refused"] = re.split(r" \(|;", str(e))[0]  # (its first clause)
            yield row
            continue
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        _, timeline = step.memory_timeline(x, y)
        off = [t["measured_bytes"] - t["predicted_bytes"] for t in timeline
               if t["measured_bytes"] != t["predicted_bytes"]]
        r = step.report
        row.update(steps=len(timeline), steps_off=len(off),
                   largest_difference_bytes=max(off, key=abs) if off else 0,
                   predicted_step_peak_bytes=r["predicted_step_peak_bytes"],
                   measured_peak_bytes=r["measured_peak_bytes"],
                   seconds=round(time.perf_counter() - start, 2))
        yield row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--budgets", default="min,80%")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    args = ap.parse_args()
    try:
        import torch
        import pebble.torch as pt
    except ImportError as e:
        print(f"torch_timeline_sweep: {e}", file=sys.stderr)
        return 77
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    rows = []
    if not args.json:
        print("| model | policy | budget | steps | steps off | largest difference | "
              "predicted step peak | measured step peak |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name in [m for m in args.models.split(",") if m]:
        for row in rows_of(torch, pt, name, [p for p in args.policies.split(",") if p],
                           [b for b in args.budgets.split(",") if b], args.batch, args.image):
            rows.append(row)
            if args.json:
                continue
            if "refused" in row:
                print(f"| {name} | {row['policy']} | {row['budget']} | refused: "
                      f"{row['refused']} | | | | |", flush=True)
            else:
                print(f"| {name} | {row['policy']} | {row['budget']} | {row['steps']} | "
                      f"{row['steps_off']} | {row['largest_difference_bytes']} B | "
                      f"{row['predicted_step_peak_bytes']:,} B | "
                      f"{row['measured_peak_bytes']:,} B |", flush=True)
    if args.json:
        print(json.dumps({"date": datetime.date.today().isoformat(),
                          "machine": platform.machine(), "torch": torch.__version__,
                          "rows": rows}, indent=1))
    return 1 if any(row.get("steps_off") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
