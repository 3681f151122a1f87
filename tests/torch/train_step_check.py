#!/usr/bin/env python3
"""Checks pebble.torch.train_step against eager PyTorch on one model.

    train_step_check.py --model NAME [--batch B] [--image S] [--classes 10]
                        [--policies dtr,swap,hybrid] [--budgets 100%,70%,min]
                        [--configs POLICY@BUDGET,...]
                        [--sgd-steps 5] [--tolerance 1e-5] [--device cpu|cuda]

NAME is a torchvision model (resnet18, mobilenet_v2, densenet121, ...; any
that torchvision.models builds with num_classes), `conv3d` (the seed network:
three Conv3d + ReLU, 1 -> 4 -> 8 -> 1 channels, MSE loss, cubes of side
--image) or one of the small networks of SMALL_MODELS.

The eager reference trains a copy of the model for --sgd-steps SGD steps
(lr 0.01, momentum 0.9) on seeded random batches. For every policy at every
budget (or each pair of --configs), another copy trains the same steps with a train_step under that plan
and the same optimizer, and the check asserts:

- after the first step: the loss and every parameter's .grad equal eager's
  within --tolerance, relative to the tensor's largest magnitude
  (max |planned - eager| <= tol * max |eager|);
- every step's measured peak equals the plan's predicted peak, which is at
  most the budget; an offloading plan's measured transfers equal predicted;
- independently, the storages PyTorch's dispatcher saw live during the step
  (pebble.torch.measure: TensorMemory, the kernels' temporaries included; on
  a GPU torch.cuda.max_memory_allocated) peak at most OUTSIDE_PLAN above the
  predicted peak (on the CPU: not above it): every tensor the plan frees is
  really gone, and every temporary is in the plan;
- after the last step: every parameter, running statistic and
  num_batches_tracked equals eager's (within --tolerance; the counter exactly).

Where a tensor misses the tolerance, the same steps in float64 judge it (as
import_check.py's --fp64-judge): a tensor that eager fp32 PyTorch itself
gets more than ILL_CONDITIONED off its fp64 value (a batch norm's bias
followed by another batch norm has a gradient that is 0 up to rounding)
passes where the plan's value is at most FP64_FACTOR times further off fp64.

Exit status: 0 all match, 1 a mismatch, 2 a usage error, 77 (skip) when torch
or torchvision cannot be imported, or --device cuda without a GPU.
"""

import argparse
import copy
import os
import sys
import time

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_SKIP = 0, 1, 2, 77
ILL_CONDITIONED = 1e-5
FP64_FACTOR = 10.0
# How far above the plan the memory PyTorch sees may peak. On the CPU: not at
# all (the tensors between a kernel's ATen calls are planned as its
# workspace; what one ATen call allocates inside is not seen). On a GPU,
# max_memory_allocated also holds the caching allocator's rounding and
# cuDNN's workspace.
OUTSIDE_PLAN = {"cpu": 0.0, "cuda": 0.25}


def log(*parts):
    print(*parts, flush=True)


class Failure(Exception):
    pass


def relative_error(planned, eager):
    planned, eager = planned.double(), eager.double()
    scale = eager.abs().max().item() if eager.numel() else 0.0
    diff = (planned - eager).abs().max().item() if eager.numel() else 0.0
    return diff / scale if scale > 0 else diff


def conv3d_net(torch):
    """The seed network (tests/torch/models.py) without its loss: the prediction."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import models

    class Conv3dNet(models.Conv3dNet):
        def forward(self, x):
            x = torch.relu(self.conv1(x))
            x = torch.relu(self.conv2(x))
            return torch.relu(self.conv3(x))

    return Conv3dNet()


def build(torch, args):
    """(model, loss_fn, make_batch(generator) -> (x, y))."""
    if args.model == "conv3d":
        model = conv3d_net(torch)
        shape = (args.batch, 1, args.image, args.image, args.image)

        def batch(gen):
            return (torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))
        return model, torch.nn.MSELoss(), batch
    import torchvision
    factory = getattr(torchvision.models, args.model, None)
    if factory is None:
        raise ValueError(f"unknown model '{args.model}'")
    model = factory(num_classes=args.classes)
    # pebble's dropout draws its own masks: compare at p = 0 (stochastic depth
    # too, which the exporter cannot write in training mode).
    stochastic_depth = getattr(getattr(torchvision, "ops", None), "StochasticDepth", ())
    for m in model.modules():
        if isinstance(m, (torch.nn.modules.dropout._DropoutNd, stochastic_depth)):
            m.p = 0.0

    def batch(gen):
        x = torch.randn(args.batch, 3, args.image, args.image, generator=gen)
        return x, torch.randint(0, args.classes, (args.batch,), generator=gen)
    return model, torch.nn.CrossEntropyLoss(), batch


def train(torch, model, step_fn, batches, steps):
    """SGD steps; returns the first step's loss and gradients, and the last
    step's parameters and buffers."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    first = None
    for k in range(steps):
        optimizer.zero_grad(set_to_none=True)
        x, y = batches[k]
        loss = step_fn(x, y)
        if k == 0:
            first = (loss.detach().clone(),
                     {n: p.grad.detach().clone() for n, p in model.named_parameters()})
        optimizer.step()
    state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    return first, state


class Judge:
    """Compares a planned tensor with eager fp32's, and where they differ by
    more than the tolerance, with fp64 (computed once, on first need)."""

    def __init__(self, torch, reference, fp64_reference, tolerance):
        self.torch = torch
        self.reference = reference
        self.fp64_reference = fp64_reference  # () -> the same steps in float64
        self.fp64 = None
        self.tolerance = tolerance
        self.ill_conditioned = 0

    def error(self, planned, what, name):
        """The relative error to eager, or None where fp64 excuses it."""
        ref = self._pick(self.reference, what, name)
        e = relative_error(planned, ref)
        if e <= self.tolerance:
            return 0.0 if e == 0 else e
        if self.fp64 is None:
            self.fp64 = self.fp64_reference()
        exact = self._pick(self.fp64, what, name)
        eager_off = relative_error(ref, exact)
        if eager_off > ILL_CONDITIONED and relative_error(planned, exact) <= FP64_FACTOR * eager_off:
            self.ill_conditioned += 1
            return None
        return e

    @staticmethod
    def _pick(reference, what, name):
        (loss, grads), state = reference
        return {"loss": loss, "grad": grads.get(name), "state": state.get(name)}[what]


def check_config(torch, pt, judge, model, loss_fn, batches, policy, budget, args):
    (eager_loss, eager_grads), eager_state = judge.reference
    planned = copy.deepcopy(model)
    x0, y0 = batches[0]
    step = pt.train_step(planned, loss_fn, (x0,), y0, policy=policy, budget=budget)
    peaks = []

    def run(x, y):
        held = list(planned.parameters()) + list(planned.buffers()) + [x, y]
        # The plan's host copies are not device memory.
        loss, seen, _ = pt.measure(lambda: step(x, y), held, list(step.program.host.values()))
        r = step.report
        peaks.append((r["measured_peak_bytes"], r["predicted_peak_bytes"], r["budget_bytes"],
                      r["transfer_bytes"], r["predicted_transfer_bytes"], seen))
        return loss

    start = time.perf_counter()
    (loss, grads), state = train(torch, planned, run, batches, args.sgd_steps)
    elapsed = time.perf_counter() - start
    problems = []
    excused = judge.ill_conditioned
    loss_error = judge.error(loss, "loss", "loss")
    if loss_error is not None and loss_error > args.tolerance:
        problems.append(f"loss {loss.item()} vs eager {eager_loss.item()} ({loss_error:.2e})")
    def worst_of(tensors, what, label):
        """The largest error among `tensors` (name -> tensor); each one over
        the tolerance is a problem."""
        worst = (0.0, "")
        for name, t in tensors.items():
            if t.dtype == torch.int64:  # num_batches_tracked: exactly
                if not torch.equal(t, eager_state[name]):
                    problems.append(f"{label(name)}: {t.tolist()} vs "
                                    f"{eager_state[name].tolist()}")
                continue
            e = judge.error(t, what, name)
            if e is None:
                continue
            worst = max(worst, (e, name))
            if e > args.tolerance:
                problems.append(f"{label(name)}: {e:.2e}")
        return worst

    grad_worst = worst_of(grads, "grad", lambda name: f"grad of {name}")
    state_worst = worst_of(state, "state",
                           lambda name: f"{name} after {args.sgd_steps} steps")
    excused = judge.ill_conditioned - excused
    limit = OUTSIDE_PLAN[args.device]
    seen_worst = max(p[5] / p[1] - 1 for p in peaks)
    for k, (measured, predicted, budget_bytes, moved, predicted_moved, seen) in enumerate(peaks):
        if seen > predicted * (1 + limit):
            problems.append(f"step {k}: PyTorch saw {seen} bytes live, {seen - predicted} "
                            f"above the plan")
        if measured != predicted:
            problems.append(f"step {k}: measured peak {measured} != predicted {predicted}")
        if predicted > budget_bytes:
            problems.append(f"step {k}: predicted peak {predicted} > budget {budget_bytes}")
        if moved != predicted_moved:
            problems.append(f"step {k}: {moved} bytes moved, {predicted_moved} predicted")
    r = step.report
    log(f"{policy:>8} {budget:>5}: peak {r['measured_peak_bytes']} of "
        f"{r['budget_bytes']} (baseline {r['baseline_peak_bytes']}; PyTorch saw "
        f"{seen_worst:+.2%}), "
        f"{r['recomputations']} recomputations, {r['transfer_bytes']} bytes moved, "
        f"worst grad {grad_worst[0]:.1e} ({grad_worst[1]}), worst state after "
        f"{args.sgd_steps} steps {state_worst[0]:.1e}"
        + (f" ({excused} ill-conditioned in fp32, judged by fp64)" if excused else "")
        + f", {elapsed:.1f} s"
        + ("" if not problems else "  MISMATCH"))
    for p in problems[:20]:
        log("    " + p)
    return not problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--image", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--policies", default="dtr,swap,hybrid")
    parser.add_argument("--budgets", default="100%,70%,min")
    parser.add_argument("--configs", default=None,
                        help="policy@budget pairs to check instead of --policies x --budgets")
    parser.add_argument("--sgd-steps", type=int, default=5)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.sgd_steps < 1:
        parser.error("--sgd-steps must be at least 1")
    try:
        import torch
        import pebble.torch as pt
    except ImportError as e:
        log(f"skipped: {e}")
        return EXIT_SKIP
    if args.device == "cuda" and not torch.cuda.is_available():
        log("skipped: --device cuda, and torch sees no CUDA device")
        return EXIT_SKIP
    try:
        torch.manual_seed(args.seed)
        model, loss_fn, make_batch = build(torch, args)
    except ImportError as e:
        log(f"skipped: {e}")
        return EXIT_SKIP
    except ValueError as e:
        log(f"usage: {e}")
        return EXIT_USAGE
    device = torch.device(args.device)
    model = model.to(device).train()
    gen = torch.Generator().manual_seed(args.seed + 1)
    batches = [tuple(t.to(device) for t in make_batch(gen)) for _ in range(args.sgd_steps)]

    def eager_step(m):
        def run(x, y):
            loss = loss_fn(m(x), y)
            loss.backward()
            return loss
        return run

    eager = copy.deepcopy(model)
    start = time.perf_counter()
    reference = train(torch, eager, eager_step(eager), batches, args.sgd_steps)

    def fp64_reference():
        exact = copy.deepcopy(model).double()
        wide = [tuple(t.double() if t.is_floating_point() else t for t in b) for b in batches]
        log("    (computing the float64 reference)")
        return train(torch, exact, eager_step(exact), wide, args.sgd_steps)
    judge = Judge(torch, reference, fp64_reference, args.tolerance)
    log(f"{args.model} batch {args.batch} image {args.image} on {device}: eager "
        f"{args.sgd_steps} steps in {time.perf_counter() - start:.1f} s")
    if args.configs:
        configs = [tuple(c.split("@", 1)) for c in args.configs.split(",")]
        if any(len(c) != 2 for c in configs):
            log("usage: --configs takes policy@budget pairs, e.g. rotor@70%,swap@min")
            return EXIT_USAGE
    else:
        configs = [(p, b) for p in args.policies.split(",") for b in args.budgets.split(",")]
    ok = True
    for policy, budget in configs:
        try:
            ok &= check_config(torch, pt, judge, model, loss_fn, batches, policy, budget, args)
        except (ValueError, RuntimeError) as e:
            log(f"{policy:>8} {budget:>5}: FAILED: {e}")
            ok = False
    log("all match" if ok else "MISMATCH")
    return EXIT_OK if ok else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
