#!/usr/bin/env python3
"""pebble.torch against eager PyTorch and PyTorch's own rematerialization, at equal peak.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_plugin.py
        [--models resnet18,gpt,conv3d] [--device cpu|cuda] [--repeat 3]
        [--policies rotor,checkmate-lp,dtr,hybrid] [--time-limit 30] [--output FILE.md]

For each model, a training step (forward, loss, backward; .grad set to None
before each, PyTorch's default) of:

- eager PyTorch;
- torch.utils.checkpoint around each block (ResNet's residual blocks, the
  GPT's transformer blocks, the seed network's convolutions);
- checkpoint_sequential over the model as a sequence, 2 and 4 segments;
- functorch's min-cut rematerialization partitioner (aot_module with
  min_cut_rematerialization_partition);
- on PyTorch 2.x, torch.compile with
  torch._functorch.config.activation_memory_budget at 0.5 and 0.1;
- pebble.torch: each policy at the step peak each of those measured (equal
  peak) and at `min`.

Memory is what the allocator held during the step above what it held before
(pebble.torch.measure: torch.cuda.max_memory_allocated on a GPU, the
profiler's memory events on the CPU): the same rule for every run. Time is
the median of --repeat steps after a warm-up, measured without the profiler.
The verdict for each competitor: the fastest pebble plan whose measured
peak is at or below the competitor's, and whether it is faster.
"""

import argparse
import copy
import datetime
import inspect
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import pebble.torch as pt

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "torch"))
import step_models  # noqa: E402

MIB = 2.0 ** 20
REENTRANT_ONLY = "use_reentrant" not in inspect.signature(checkpoint).parameters
# PyTorch 1.13's checkpoint_sequential takes no use_reentrant (its checkpoint does).
SEQUENTIAL_REENTRANT_ONLY = "use_reentrant" not in str(inspect.signature(checkpoint_sequential))


# --- the models and their block structure ------------------------------------------------

def build(name, device):
    """(model, loss_fn, inputs, target, blocks, stages): blocks are the modules
    to checkpoint one by one; stages the model as an nn.Sequential."""
    torch.manual_seed(0)
    if name == "resnet18":
        import torchvision
        model = torchvision.models.resnet18(num_classes=10).to(device).train()
        x = torch.randn(16, 3, 64, 64, device=device)
        y = torch.randint(0, 10, (16,), device=device)
        blocks = [b for layer in (model.layer1, model.layer2, model.layer3, model.layer4)
                  for b in layer]
        stages = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool, *blocks,
                               model.avgpool, nn.Flatten(), model.fc)
        return model, F.cross_entropy, x, y, blocks, stages
    if name == "gpt":
        model = step_models.Gpt(vocab=512, dim=128, heads=4, layers=6, seq=128,
                                dropout=0.1).to(device).train()
        x = torch.randint(0, 512, (8, 128), device=device)
        y = torch.randint(0, 512, (8, 128), device=device)
        stages = nn.Sequential(_GptEmbed(model), *model.blocks, model.ln, model.head)
        return model, step_models.lm_loss, x, y, list(model.blocks), stages
    if name == "conv3d":
        model = step_models.Seed3d().to(device).train()
        x = torch.randn(2, 1, 48, 48, 48, device=device)
        y = torch.randn(2, 1, 48, 48, 48, device=device)
        stages = nn.Sequential(model.conv1, nn.ReLU(), model.conv2, nn.ReLU(), model.conv3,
                               nn.ReLU())
        return model, F.mse_loss, x, y, [model.conv1, model.conv2, model.conv3], stages
    raise SystemExit(f"unknown model '{name}' (resnet18, gpt, conv3d)")


class _GptEmbed(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, idx):
        g = self.gpt
        return g.drop(g.tok(idx) + g.pos(torch.arange(idx.shape[1], device=idx.device)))


class _Checkpointed(nn.Module):
    """`module`'s forward under torch.utils.checkpoint (the RNG state kept)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args):
        if REENTRANT_ONLY:
            return checkpoint(self.module, *args, preserve_rng_state=True)
        return checkpoint(self.module, *args, use_reentrant=False, preserve_rng_state=True)


def checkpointed_blocks(model, blocks):
    """A copy of `model` whose blocks run under checkpoint."""
    names = {id(m): n for n, m in model.named_modules()}
    copy_ = copy.deepcopy(model)
    for block in blocks:
        parent_path, _, attr = names[id(block)].rpartition(".")
        parent = copy_.get_submodule(parent_path) if parent_path else copy_
        setattr(parent, attr, _Checkpointed(getattr(parent, attr)))
    for m in copy_.modules():
        if hasattr(m, "inplace"):
            m.inplace = False  # a checkpointed block's input must stay intact
    return copy_


# --- measuring ---------------------------------------------------------------------------

def run(model, fn, x, y, repeat, device):
    """(median seconds, step peak bytes) of fn(x, y) steps, .grad None before each."""
    def one():
        for p in model.parameters():
            p.grad = None
        torch.manual_seed(7)
        fn(x, y)

    one()  # warm-up (and capture, for compiled runs)
    times = []
    for _ in range(repeat):
        for p in model.parameters():
            p.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.manual_seed(7)
        fn(x, y)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    for p in model.parameters():
        p.grad = None
    _, peak, _ = pt.measure(lambda: fn(x, y), device)
    return statistics.median(times), peak


def competitors(name, model, loss_fn, x, y, blocks, stages):
    """(label, model, step function) of every PyTorch way of running the step."""
    out = [("eager", model, lambda a, b: loss_fn(model(a), b).backward())]
    ck = checkpointed_blocks(model, blocks)
    out.append(("checkpoint per block", ck, lambda a, b: loss_fn(ck(a), b).backward()))
    seq_model = copy.deepcopy(model)
    seq_stages = copy.deepcopy(stages)
    for m in seq_stages.modules():
        if hasattr(m, "inplace"):
            m.inplace = False
    reentrant = SEQUENTIAL_REENTRANT_ONLY
    kwargs = {} if reentrant else {"use_reentrant": False}
    for segments in (2, 4):
        def seq_step(a, b, segments=segments):
            if reentrant and a.dtype.is_floating_point:
                a = a.detach().requires_grad_(True)
            if reentrant and not a.dtype.is_floating_point:
                # Reentrant checkpointing needs an input that requires a
                # gradient: run the embedding outside the segments.
                h = seq_stages[0](a).detach().requires_grad_(True)
                out = checkpoint_sequential(seq_stages[1:], segments, h)
                return loss_fn(out, b).backward()
            loss_fn(checkpoint_sequential(seq_stages, segments, a, **kwargs), b).backward()
        out.append((f"checkpoint_sequential({segments})", seq_stages, seq_step))
    try:
        from functorch.compile import aot_module, min_cut_rematerialization_partition, nop
        compiled = aot_module(copy.deepcopy(model), fw_compiler=nop, bw_compiler=nop,
                              partition_fn=min_cut_rematerialization_partition)
        out.append(("functorch min-cut (aot_module)", compiled,
                    lambda a, b: loss_fn(compiled(a), b).backward()))
    except Exception as e:  # noqa: BLE001 (not in this PyTorch)
        print(f"{name}: no functorch min-cut partitioner: {e}", file=sys.stderr)
    config = getattr(getattr(torch, "_functorch", None), "config", None)
    if hasattr(torch, "compile") and hasattr(config, "activation_memory_budget"):
        for budget in (0.5, 0.1):
            config.activation_memory_budget = budget
            c = torch.compile(copy.deepcopy(model))
            out.append((f"torch.compile, activation_memory_budget {budget}", c,
                        lambda a, b, c=c: loss_fn(c(a), b).backward()))
    return out


def bench_model(name, args, device):
    model, loss_fn, x, y, blocks, stages = build(name, device)
    rows = []  # (run, budget label, peak, seconds, note)
    for label, net, fn in competitors(name, model, loss_fn, x, y, blocks, stages):
        try:
            seconds, peak = run(net, fn, x, y, args.repeat, device)
            rows.append((label, "", peak, seconds, ""))
        except Exception as e:  # noqa: BLE001 (a competitor that cannot run this model)
            rows.append((label, "", None, None, f"failed: {str(e).splitlines()[0]}"))
        print(rows[-1], file=sys.stderr, flush=True)
    planned = copy.deepcopy(model)
    base = pt.train_step(planned, loss_fn, x, y, policy="baseline", budget="100%",
                         time_limit=args.time_limit, measure="never")
    persistent = base.report["persistent_bytes"]
    seconds, peak = run(planned, base, x, y, args.repeat, device)
    rows.append(("pebble baseline (unplanned)", "100%", peak, seconds,
                 f"captured in {base.report['setup_time_s']:.1f} s"))
    targets = [(label, p) for label, _, p, _, _ in rows[:-1] if p is not None]
    for policy in args.policies:
        for label, budget in [(f"= {t}", persistent + p) for t, p in targets] + [("min", "min")]:
            try:
                step = base.replan(policy=policy, budget=budget)
            except ValueError as e:  # PlanError, or a policy refusing the graph
                rows.append((f"pebble {policy}", label, None, None,
                             f"not planned: {str(e)[:90]}"))
                continue
            seconds, peak = run(planned, step, x, y, args.repeat, device)
            r = step.report
            rows.append((f"pebble {policy}", label, peak, seconds,
                         f"predicted {r['predicted_step_peak_bytes'] / MIB:.1f} MiB, "
                         f"{r['recomputations']} recomputed"))
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def verdicts(rows):
    eager = next(r for r in rows if r[0] == "eager")
    lines = []
    for run_, _, peak, seconds, _ in rows:
        if run_.startswith("pebble") or peak is None or run_ == "eager":
            continue
        label = f"= {run_}"
        ours = [(t, r, p) for r, b, p, t, _ in rows
                if r.startswith("pebble") and p is not None and p <= peak]
        if not ours:
            lines.append(f"{run_} ({peak / MIB:.1f} MiB, {seconds:.3f} s): no pebble plan at "
                         "or below its peak")
            continue
        t, r, p = min(ours)
        lines.append(f"{run_} ({peak / MIB:.1f} MiB, {seconds:.3f} s): {r} {t:.3f} s at "
                     f"{p / MIB:.1f} MiB, {'faster' if t < seconds else 'SLOWER'} "
                     f"({t / seconds:.2f}x)")
    del eager
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet18,gpt,conv3d")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--policies", default="rotor,checkmate-lp,dtr,hybrid")
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--output", help="also write the tables as Markdown to this file")
    args = ap.parse_args()
    args.policies = args.policies.split(",")
    device = torch.device(args.device)
    lines = ["# pebble.torch against eager PyTorch and PyTorch's rematerialization", "",
             f"{datetime.date.today()}, {platform.node()} ({platform.processor() or 'cpu'}, "
             f"{torch.get_num_threads()} threads), device {device}"
             + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
             + f", PyTorch {torch.__version__}; median of {args.repeat} steps. Peak: the "
             "allocator's step peak above what it held before the step.", "",
             "Command: `" + " ".join(["bench/torch_plugin.py"] + sys.argv[1:]) + "`", ""]
    printed = 0
    for name in args.models.split(","):
        rows = bench_model(name, args, device)
        eager_time = next(r[3] for r in rows if r[0] == "eager")
        lines += [f"## {name}", "", "| run | budget | step peak MiB | step s | x eager | note |",
                  "| --- | --- | ---: | ---: | ---: | --- |"]
        for run_, budget, peak, seconds, note in rows:
            if peak is None:
                lines.append(f"| {run_} | {budget} | | | | {note} |")
            else:
                lines.append(f"| {run_} | {budget} | {peak / MIB:.1f} | {seconds:.3f} | "
                             f"{seconds / eager_time:.2f} | {note} |")
        lines += [""] + [f"- {v}" for v in verdicts(rows)] + [""]
        print("\n".join(lines[printed:]), flush=True)
        printed = len(lines)
    if args.output:
        with open(args.output, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
