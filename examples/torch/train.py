#!/usr/bin/env python3
"""Trains a torchvision model a few SGD steps eagerly and under a pebble plan.

    PYTHONPATH=build/python python3 examples/torch/train.py \\
        [--model resnet18] [--batch 32] [--image 128] [--classes 10] \\
        [--policy hybrid] [--budget 70%] [--steps 5] [--device cpu|cuda]

Both copies start from the same weights and see the same random batches;
the script prints each step's two losses, then each one's step peak as the
allocator measured it (pebble.torch.measure: the most the allocator held
during the step above what it held before: torch.cuda.max_memory_allocated
on a GPU, the profiler's memory events on the CPU) and its median step
time; the plan's predicted step peak follows.
"""

import argparse
import copy
import statistics
import sys

import torch
import torchvision

import pebble.torch as pt


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image", type=int, default=128)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--policy", default="hybrid")
    parser.add_argument("--budget", default="70%")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    model = getattr(torchvision.models, args.model)(num_classes=args.classes).to(device).train()
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(args.batch, 3, args.image, args.image, generator=gen).to(device),
                torch.randint(0, args.classes, (args.batch,), generator=gen).to(device))
               for _ in range(args.steps)]
    loss_fn = torch.nn.CrossEntropyLoss()

    eager = copy.deepcopy(model)
    planned = copy.deepcopy(model)
    x0, y0 = batches[0]
    try:
        # measure="never": the script measures every step itself, as it does eager's.
        step = pt.train_step(planned, loss_fn, (x0,), y0, policy=args.policy,
                             budget=args.budget, measure="never")
    except ValueError as e:  # CaptureError, PlanError: the message names the cause
        print(f"pebble: {e}", file=sys.stderr)
        return 1

    def eager_step(x, y):
        loss = loss_fn(eager(x), y)
        loss.backward()
        return loss

    runs = {"eager": (eager, eager_step), "pebble": (planned, step)}
    results = {name: {"loss": [], "peak": [], "time": []} for name in runs}
    for name, (net, fn) in runs.items():
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        for x, y in batches:
            optimizer.zero_grad(set_to_none=True)
            loss, peak, seconds = pt.measure(lambda: fn(x, y).item(), device)
            optimizer.step()
            results[name]["loss"].append(loss)
            results[name]["peak"].append(peak)
            results[name]["time"].append(seconds)

    print(f"{args.model}, batch {args.batch}, {args.image} px, on {device}: "
          f"policy {step.report['policy']} at {args.budget}")
    print(f"{'step':>4} {'eager loss':>12} {'pebble loss':>12}")
    for k in range(args.steps):
        print(f"{k:>4} {results['eager']['loss'][k]:>12.6f} {results['pebble']['loss'][k]:>12.6f}")
    r = step.report
    mib = 2.0 ** 20
    print(f"\n{'':>8} {'step peak MiB':>14} {'step s':>8}")
    for name in runs:
        peak = max(results[name]["peak"]) / mib
        seconds = statistics.median(results[name]["time"][1:] or results[name]["time"])
        print(f"{name:>8} {peak:>14.1f} {seconds:>8.3f}")
    print(f"\nplan: predicted step peak {r['predicted_step_peak_bytes'] / mib:.1f} MiB (the "
          f"unplanned step measured {r['unplanned_measured_peak_bytes'] / mib:.1f} MiB at "
          f"capture); {r['recomputations']} recomputations, "
          f"{r['predicted_transfer_bytes'] / mib:.1f} MiB moved to and from the host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
