#!/usr/bin/env python3
"""pebble.torch against eager PyTorch and torch.utils.checkpoint, at equal peak.

    PYTHONPATH=build/python python3 bench/torch_plugin.py [--models resnet18,...]
        [--device cpu|cuda] [--repeat 3] [--segments 2,4,8]
        [--policies rotor,checkmate-lp,hybrid] [--time-limit 30] [--output FILE.md]

For each model it measures a training step (forward, loss, backward; the
median of --repeat after one warm-up) of:

- eager PyTorch;
- checkpoint_sequential over the model as a sequence of its top-level
  stages, for each --segments count;
- pebble.torch with the unplanned order (`baseline`: the plug-in's own cost),
  then each policy at the budget of each checkpointed run's measured peak
  (equal peak) and at `min`.

Peak memory is pebble.torch.measure's: on a GPU torch.cuda.max_memory_allocated
over the step; on the CPU the parameters, buffers and batch plus every
storage PyTorch's operators created (the same rule for all three; a plan's
host copies are not counted as device memory, their bytes are reported).
The table prints peak and time side by side, and for each model the verdicts
of the goals: a pebble plan at least as fast as checkpointing at the same
peak, and one with a lower peak than eager at no more than 1.3x its time.
"""

import argparse
import copy
import datetime
import inspect
import platform
import statistics
import sys

import torch
import torchvision
from torch.utils.checkpoint import checkpoint_sequential

import pebble.torch as pt

MIB = 2.0 ** 20
# name -> (batch, image side, classes); conv3d: cubes of that side, MSE
SIZES = {
    "resnet18": (32, 128, 10),
    "mobilenet_v2": (16, 128, 10),
    "densenet121": (8, 96, 10),
    "conv3d": (2, 48, None),
}


class Conv3dNet(torch.nn.Sequential):
    """The seed network: three Conv3d(3, padding=1) + ReLU, 1 -> 4 -> 8 -> 1."""

    def __init__(self):
        super().__init__(torch.nn.Conv3d(1, 4, 3, padding=1), torch.nn.ReLU(),
                         torch.nn.Conv3d(4, 8, 3, padding=1), torch.nn.ReLU(),
                         torch.nn.Conv3d(8, 1, 3, padding=1), torch.nn.ReLU())


def build(name, device, gen):
    """(model, loss, batch)."""
    batch, side, classes = SIZES[name]
    if name == "conv3d":
        shape = (batch, 1, side, side, side)
        data = (torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))
        return Conv3dNet().to(device), torch.nn.MSELoss(), tuple(t.to(device) for t in data)
    model = getattr(torchvision.models, name)(num_classes=classes)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    x = torch.randn(batch, 3, side, side, generator=gen)
    y = torch.randint(0, classes, (batch,), generator=gen)
    return model.to(device), torch.nn.CrossEntropyLoss(), (x.to(device), y.to(device))


def stages_of(name, model):
    """The model as nn.Sequential of its top-level stages (sharing its modules)."""
    nn = torch.nn
    if name == "conv3d":
        return model
    if name.startswith("resnet"):
        stages = [model.conv1, model.bn1, model.relu, model.maxpool]
        for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
            stages.extend(layer)
        stages += [model.avgpool, nn.Flatten(), model.fc]
    elif name == "mobilenet_v2":
        stages = list(model.features) + [nn.AdaptiveAvgPool2d(1), nn.Flatten(), model.classifier]
    elif name.startswith("densenet"):
        stages = list(model.features) + [nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                         model.classifier]
    else:
        raise ValueError(f"no sequential form of '{name}' here")
    return nn.Sequential(*stages)


def timed(model, fn, data, repeat, uncounted=()):
    """(median seconds, peak bytes) of `repeat` steps after a warm-up."""
    x, y = data
    held = list(model.parameters()) + list(model.buffers()) + [x, y]
    times, peaks = [], []
    for k in range(repeat + 1):
        for p in model.parameters():
            p.grad = None
        _, peak, seconds = pt.measure(lambda: fn(x, y), held, uncounted)
        if k:
            times.append(seconds)
            peaks.append(peak)
    return statistics.median(times), max(peaks)


def bench_model(name, args, device):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model, loss_fn, data = build(name, device, gen)
    rows = []

    def eager(x, y):
        loss_fn(model(x), y).backward()

    seconds, peak = timed(model, eager, data, args.repeat)
    rows.append(("eager", "", peak, seconds, ""))
    eager_time, eager_peak = seconds, peak
    equal_peaks = []
    # PyTorch 1.13's checkpoint_sequential is reentrant only: a segment
    # backpropagates into its parameters only where its input requires a
    # gradient, so the batch does (its gradient, one input's size, is counted).
    reentrant_only = "use_reentrant" not in inspect.signature(checkpoint_sequential).parameters
    kwargs = {} if reentrant_only else {"use_reentrant": False}
    # A copy whose activations are not in place: a checkpointed segment's
    # input is a leaf that requires a gradient.
    checkpointed_model = copy.deepcopy(model)
    for m in checkpointed_model.modules():
        if hasattr(m, "inplace"):
            m.inplace = False
    stages = stages_of(name, checkpointed_model)
    for segments in [s for s in args.segments if s <= len(stages)]:
        def checkpointed(x, y, segments=segments):
            if reentrant_only:
                x = x.detach().requires_grad_(True)
            out = checkpoint_sequential(stages, segments, x, **kwargs)
            loss_fn(out, y).backward()

        seconds, peak = timed(checkpointed_model, checkpointed, data, args.repeat)
        rows.append((f"checkpoint_sequential({segments})", "", peak, seconds, ""))
        equal_peaks.append((segments, peak, seconds))
    budgets = [(f"= checkpoint({s})", str(p)) for s, p, _ in equal_peaks] + [("min", "min")]
    # The unplanned order first (pebble.torch's own cost against eager), then
    # every policy at every budget.
    configs = [("baseline", ("100%", "100%"))]
    configs += [(policy, budget) for policy in args.policies for budget in budgets]
    for policy, (label, budget) in configs:
        planned = copy.deepcopy(model)
        try:
            step = pt.train_step(planned, loss_fn, data[0], data[1], policy=policy,
                                 budget=budget, time_limit=args.time_limit)
        except pt.PlanError as e:
            rows.append((policy, label, None, None, "does not fit: " + str(e).split(": ", 1)[-1]))
            continue
        except ValueError as e:  # a planner refusing the graph (its size, its shape)
            rows.append((policy, label, None, None, "not planned: " + str(e)))
            continue
        seconds, peak = timed(planned, step, data, args.repeat,
                              list(step.program.host.values()))
        r = step.report
        note = (f"{r['recomputations']} recomputed, "
                f"{r['transfer_bytes'] / MIB:.0f} MiB moved" if r["transfer_bytes"]
                else f"{r['recomputations']} recomputed")
        rows.append((policy, label, peak, seconds, note))
    return rows, eager_peak, eager_time, equal_peaks


def verdicts(rows, eager_peak, eager_time, equal_peaks):
    """The two goals, each as a line."""
    lines = []
    for segments, ck_peak, ck_time in equal_peaks:
        label = f"= checkpoint({segments})"
        best = [(t, policy) for policy, budget, peak, t, _ in rows
                if budget == label and peak is not None and peak <= ck_peak * 1.0001]
        if not best:
            lines.append(f"checkpoint({segments}): no pebble plan fits its peak")
            continue
        t, policy = min(best)
        lines.append(f"checkpoint({segments}) {ck_time:.3f} s at {ck_peak / MIB:.1f} MiB: "
                     f"{policy} {t:.3f} s ({'as fast or faster' if t <= ck_time else 'slower'})")
    below = [(peak, t, policy, budget) for policy, budget, peak, t, _ in rows
             if budget and peak is not None and peak < eager_peak and t <= 1.3 * eager_time]
    if below:
        peak, t, policy, budget = min(below)
        lines.append(f"lowest peak under eager within 1.3x its time: {policy} ({budget}) "
                     f"{peak / MIB:.1f} MiB vs {eager_peak / MIB:.1f} MiB, "
                     f"{t / eager_time:.2f}x the time")
    else:
        lines.append("no plan below eager's peak within 1.3x its time")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resnet18,mobilenet_v2,densenet121,conv3d")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--segments", default="2,4,8")
    parser.add_argument("--policies", default="rotor,checkmate-lp,hybrid")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--output", help="also write the tables as Markdown to this file")
    args = parser.parse_args()
    args.segments = [int(s) for s in args.segments.split(",")]
    args.policies = args.policies.split(",")
    device = torch.device(args.device)
    lines = ["# pebble.torch against eager PyTorch and checkpoint_sequential",
             "",
             f"{datetime.date.today()}, {platform.node()} ({platform.processor() or 'cpu'}, "
             f"{torch.get_num_threads()} threads), device {device}"
             + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
             + f", PyTorch {torch.__version__}; median of {args.repeat} steps.",
             "", "Command: `" + " ".join(["python3", "bench/torch_plugin.py"] + sys.argv[1:])
             + "`", ""]
    printed = 0
    for name in args.models.split(","):
        rows, eager_peak, eager_time, equal_peaks = bench_model(name, args, device)
        batch, side, _ = SIZES[name]
        lines += [f"## {name} (batch {batch}, {side} px)", "",
                  "| run | budget | peak MiB | step s | x eager time | note |",
                  "| --- | --- | ---: | ---: | ---: | --- |"]
        for run, budget, peak, seconds, note in rows:
            if peak is None:
                lines.append(f"| {run} | {budget} | | | | {note} |")
            else:
                lines.append(f"| {run} | {budget} | {peak / MIB:.1f} | {seconds:.3f} | "
                             f"{seconds / eager_time:.2f} | {note} |")
        lines += [""] + [f"- {v}" for v in verdicts(rows, eager_peak, eager_time, equal_peaks)]
        lines.append("")
        print("\n".join(lines[printed:]), flush=True)
        printed = len(lines)
    if args.output:
        with open(args.output, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
