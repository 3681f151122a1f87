#!/usr/bin/env python3
"""pebble.torch.train_step beyond the big models: errors that name the
culprit, and small networks of every operator family against eager PyTorch.

    train_step_cases.py [--device cpu|cuda] [-k SUBSTRING]

Each architecture trains two SGD steps eagerly and under plans (the unplanned
order at 100% and hybrid, dtr and swap at `min`), and must give eager's loss,
gradients, parameters and buffers within 1e-5 (relative to each tensor's
largest magnitude) with measured peak = predicted peak <= budget, and the
memory PyTorch saw live at most OUTSIDE_PLAN above it. Each error
case must raise the named exception with the named words.

Exit status: 0 all pass, 1 a failure, 77 (skip) without torch/torchvision or,
with --device cuda, without a GPU.
"""

import argparse
import contextlib
import copy
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The tolerance rule and the memory allowance of the big-model checks (only
# the standard library at import).
from train_step_check import OUTSIDE_PLAN, relative_error  # noqa: E402

TOLERANCE = 1e-5
CONFIGS = [("best-order", "100%"), ("hybrid", "min"), ("dtr", "min"), ("swap", "min")]


def networks(torch, device):
    """name -> (model, loss_fn, make_batch(gen) -> (x, y))."""
    nn, F = torch.nn, torch.nn.functional

    class Attention(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=-1)
            q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
            scores = torch.matmul(q, k.transpose(-1, -2)) / (d // self.heads) ** 0.5
            ctx = torch.matmul(scores.softmax(-1), v)
            return self.proj(ctx.transpose(1, 2).reshape(b, s, d))

    class Block(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.attn = Attention(dim, 4)
            self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    class Tagger(nn.Module):
        """Per-token classes: CE over (N, C, S) logits, targets (N, S)."""

        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(12, 32)
            self.blocks = nn.Sequential(Block(32), Block(32))
            self.head = nn.Linear(32, 7)

        def forward(self, x):
            return self.head(self.blocks(self.inp(x))).transpose(1, 2)

    class UNet(nn.Module):
        """Pooling, concatenation of a skip, bilinear upsampling, padding, leaky
        ReLU, sigmoid."""

        def __init__(self):
            super().__init__()
            self.down = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.LeakyReLU(0.1))
            self.mid = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1),
                                     nn.Sigmoid(), nn.AvgPool2d(3, 1, 1))
            self.skip = nn.AvgPool2d(2)
            self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
            self.out = nn.Conv2d(16, 2, 1)
            self.drop = nn.Dropout(0.0)

        def forward(self, x):
            d = self.down(x)
            merged = self.up(torch.cat([self.skip(d), self.mid(d)], dim=1))
            return self.out(self.drop(F.pad(merged, (1, 1, 1, 1))))

    class Gates(nn.Module):
        """Dilated, grouped and depthwise convolutions, squeeze-excitation."""

        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(4, 8, 3, padding=2, dilation=2)
            # No bias before a batch norm: its gradient is 0 up to rounding.
            self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=4, bias=False)
            self.c3 = nn.Conv2d(8, 8, 3, padding=1, groups=8)
            self.bn = nn.BatchNorm2d(8)
            self.se = nn.Linear(8, 8)
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            x = F.hardswish(self.c1(x))
            x = F.relu6(self.bn(self.c2(x)))
            x = torch.tanh(self.c3(x))
            gate = F.hardsigmoid(self.se(x.mean((2, 3))))
            x = x * gate[:, :, None, None]
            return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))

    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(6, 16), nn.Linear(10, 16)
            self.out = nn.Linear(16, 3)

        def forward(self, x, z):
            return self.out(torch.relu(self.a(x)) * torch.sigmoid(self.b(z)))

    class Views(nn.Module):
        """A flatten on the peak: a view (alias) of the ReLU's output in the
        imported graph, and its gradient a view of the incoming one, so the
        plan holds two feature maps where copies would hold three."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, padding=1)
            self.fc = nn.Linear(16 * 16 * 16, 5)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    def images(batch, channels, size, classes):
        def make(gen):
            x = torch.randn(batch, channels, size, size, generator=gen)
            return x, torch.randint(0, classes, (batch,), generator=gen)
        return make

    def per_pixel(gen):
        return (torch.randn(2, 3, 16, 16, generator=gen),
                torch.randn(2, 2, 18, 18, generator=gen))

    def tokens(gen):
        return (torch.randn(3, 9, 12, generator=gen), torch.randint(0, 7, (3, 9), generator=gen))

    def two(gen):
        return ((torch.randn(4, 6, generator=gen), torch.randn(4, 10, generator=gen)),
                torch.randint(0, 3, (4,), generator=gen))

    ce, mse = nn.CrossEntropyLoss(), nn.MSELoss()
    nets = {
        "tagger": (Tagger(), ce, tokens),
        "unet": (UNet(), mse, per_pixel),
        "gates": (Gates(), F.cross_entropy, images(4, 4, 12, 5)),
        "two-inputs": (TwoInputs(), "cross-entropy", two),
        "views": (Views(), ce, images(4, 3, 16, 5)),
    }
    try:
        import torchvision
        nets["squeezenet1_1"] = (torchvision.models.squeezenet1_1(num_classes=10), ce,
                                 images(2, 3, 64, 10))
        nets["shufflenet_v2_x0_5"] = (torchvision.models.shufflenet_v2_x0_5(num_classes=10),
                                      ce, images(2, 3, 64, 10))
        nets["mnasnet0_5"] = (torchvision.models.mnasnet0_5(num_classes=10), ce,
                              images(2, 3, 64, 10))
    except ImportError:
        pass
    for model, _, _ in nets.values():
        for m in model.modules():
            if isinstance(m, nn.modules.dropout._DropoutNd):
                m.p = 0.0
    return nets


def as_inputs(x):
    return x if isinstance(x, tuple) else (x,)


def sgd_steps(torch, model, step_fn, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses, grads = [], []
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        losses.append(step_fn(x, y).detach().clone())
        grads.append({n: None if p.grad is None else p.grad.clone()
                      for n, p in model.named_parameters()})
        optimizer.step()
    return losses, grads, {n: t.detach().clone() for n, t in model.state_dict().items()}


def compare(torch, eager, planned):
    problems = []
    for k, (a, b) in enumerate(zip(planned[0], eager[0])):
        if relative_error(a, b) > TOLERANCE:
            problems.append(f"loss of step {k}: {a.item()} vs {b.item()}")
    for k, (ga, gb) in enumerate(zip(planned[1], eager[1])):
        for name in gb:
            if (ga[name] is None) != (gb[name] is None):
                problems.append(f"step {k}: .grad of {name} is {ga[name] is None and 'None'}")
            elif gb[name] is not None and relative_error(ga[name], gb[name]) > TOLERANCE:
                problems.append(f"step {k}: grad of {name}: "
                                f"{relative_error(ga[name], gb[name]):.2e}")
    for name, ref in eager[2].items():
        t = planned[2][name]
        bad = (not torch.equal(t, ref)) if t.dtype == torch.int64 else \
            relative_error(t, ref) > TOLERANCE
        if bad:
            problems.append(f"{name} after the steps differs")
    return problems


def check_network(torch, pt, name, model, loss_fn, make_batch, device):
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(2):
        x, y = make_batch(gen)
        batches.append((tuple(t.to(device) for t in as_inputs(x)), y.to(device)))
    model = model.to(device).train()
    eager_model = copy.deepcopy(model)
    eager_loss = loss_fn if not isinstance(loss_fn, str) else torch.nn.CrossEntropyLoss()

    def eager_step(x, y):
        loss = eager_loss(eager_model(*x), y)
        loss.backward()
        return loss
    eager = sgd_steps(torch, eager_model, eager_step, batches)
    failures = 0
    for policy, budget in CONFIGS:
        planned_model = copy.deepcopy(model)
        x0, y0 = batches[0]
        step = pt.train_step(planned_model, loss_fn, x0, y0, policy=policy, budget=budget)
        peaks = []

        def run(x, y):
            held = list(planned_model.parameters()) + list(planned_model.buffers()) + [*x, y]
            loss, seen, _ = pt.measure(lambda: step(*x, y), held,
                                       list(step.program.host.values()))
            peaks.append((step.report["measured_peak_bytes"], step.report["predicted_peak_bytes"],
                          step.report["budget_bytes"], seen))
            return loss
        problems = compare(torch, eager, sgd_steps(torch, planned_model, run, batches))
        for measured, predicted, budget_bytes, seen in peaks:
            if measured != predicted or predicted > budget_bytes:
                problems.append(f"measured peak {measured}, predicted {predicted}, "
                                f"budget {budget_bytes}")
            if seen > predicted * (1 + OUTSIDE_PLAN[device.type]):
                problems.append(f"PyTorch saw {seen} bytes live, {seen - predicted} above "
                                "the plan")
        r = step.report
        print(f"{name:>20} {policy:>10} {budget:>5}: peak {r['measured_peak_bytes']} "
              f"(baseline {r['baseline_peak_bytes']}; PyTorch saw "
              f"{max(p[3] / p[1] - 1 for p in peaks):+.1%}), {r['recomputations']} recomputations, "
              f"{r['transfer_bytes']} bytes moved" + ("  FAILED" if problems else ""),
              flush=True)
        for p in problems[:10]:
            print("      " + p)
        failures += bool(problems)
    return failures


def error_cases(torch, pt):
    """(name, thunk, exception type, words the message must hold)."""
    nn = torch.nn

    class Svd(nn.Module):
        def forward(self, x):
            return torch.linalg.svd(x)[1].sum(-1, keepdim=True) * x

    class CumSum(nn.Module):
        def forward(self, x):
            return torch.cumsum(x, 1)

    class ViaNumpy(nn.Module):
        def forward(self, x):
            return torch.from_numpy(x.detach().numpy() * 2)

    class Net(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.block = inner

        def forward(self, x):
            return self.block(self.fc(x))

    x, y = torch.randn(4, 8), torch.randint(0, 8, (4,))
    ce = nn.CrossEntropyLoss()

    def step(model=None, loss=ce, **kw):
        return pt.train_step(model if model is not None else Net(nn.ReLU()), loss, x, y, **kw)

    def called_with(bad_x):
        s = step()
        return s(bad_x, y)

    def parameter_replaced():
        model = Net(nn.ReLU())
        s = pt.train_step(model, ce, x, y)
        model.fc.weight = nn.Parameter(torch.randn(9, 8))
        return s(x, y)

    def bn_cumulative():
        m = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8, momentum=None))
        return pt.train_step(m, ce, x, y)

    conv = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(16 * 16 * 16, 4))
    image, label = torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,))
    return [
        ("unexportable operator", lambda: step(Net(Svd())), pt.CaptureError,
         ["module 'block' (Svd)", "linalg_svd"]),
        ("operator pebble does not import", lambda: step(Net(CumSum())), pt.CaptureError,
         ["module 'block' (CumSum)", "CumSum"]),
        ("value the trace took as a constant", lambda: step(Net(ViaNumpy())), pt.CaptureError,
         ["module 'block' (ViaNumpy)", "NumPy"]),
        ("unsupported loss", lambda: step(loss=nn.L1Loss()), pt.CaptureError, ["L1Loss"]),
        ("label smoothing", lambda: step(loss=nn.CrossEntropyLoss(label_smoothing=0.1)),
         pt.CaptureError, ["label smoothing"]),
        ("eval mode", lambda: step(Net(nn.ReLU()).eval()), pt.CaptureError, ["eval mode"]),
        ("batch norm without momentum", bn_cumulative, pt.CaptureError,
         ["momentum=None", "'1'"]),
        ("a call of another shape", lambda: called_with(torch.randn(5, 8)), ValueError,
         ["(5, 8)", "(4, 8)"]),
        ("a parameter replaced by one of another shape", parameter_replaced, ValueError,
         ["'fc.weight'", "(9, 8)", "(8, 8)"]),
        ("a channels_last batch",
         lambda: pt.train_step(conv, ce, image.contiguous(memory_format=torch.channels_last),
                               label), ValueError, ["example_inputs[0]", "not contiguous"]),
        ("unknown policy", lambda: step(policy="no-such-policy"), ValueError,
         ["no-such-policy"]),
        ("budget below the least peak",
         lambda: pt.train_step(conv, ce, image, label, policy="dtr", budget="10KiB"),
         pt.PlanError, ["dtr", "exceeds the budget"]),
        ("not a module", lambda: pt.train_step(lambda t: t, ce, x, y), TypeError,
         ["torch.nn.Module"]),
    ]


def run_errors(torch, pt, only):
    failures = 0
    for name, thunk, kind, words in error_cases(torch, pt):
        if only and only not in name:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                thunk()
            outcome, ok = "no error", False
        except Exception as e:  # any type: the check is on it
            outcome = f"{type(e).__name__}: {e}"
            ok = isinstance(e, kind) and all(w in str(e) for w in words)
        print(f"{'ok' if ok else 'FAILED':>6} {name}: {outcome[:300]}", flush=True)
        failures += not ok
    return failures


def run_accumulation(torch, pt, device):
    """Two calls without zero_grad add into .grad, as two backward() calls do;
    a parameter replaced (same shape) after planning gets the next gradient;
    a frozen one (requires_grad=False) gets none."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(),
                                torch.nn.Linear(6, 2)).to(device)
    eager = copy.deepcopy(model)
    x, y = torch.randn(3, 5, device=device), torch.randn(3, 2, device=device)
    step = pt.train_step(model, torch.nn.MSELoss(), x, y, policy="dtr", budget="min")
    for _ in range(2):
        step(x, y)
        torch.nn.functional.mse_loss(eager(x), y).backward()
    worst = max(relative_error(a.grad, b.grad)
                for a, b in zip(model.parameters(), eager.parameters()))
    model[2].weight = torch.nn.Parameter(model[2].weight.detach().clone())
    step(x, y)
    replaced = model[2].weight.grad is not None
    model[0].weight.requires_grad_(False)
    model[0].weight.grad = None
    step(x, y)
    frozen = model[0].weight.grad is None
    ok = worst <= TOLERANCE and replaced and frozen
    print(f"{'ok' if ok else 'FAILED':>6} gradients accumulate across calls: worst {worst:.1e}; "
          f"a replaced parameter {'gets' if replaced else 'misses'} its gradient, a frozen one "
          f"{'gets none' if frozen else 'gets one'}")
    return not ok


def run_bfloat16(torch, pt, device):
    """A bfloat16 module with fp32 batch norms trains in those dtypes (as
    captured), recomputing statistics, with the planned peak, and near eager's
    loss and gradients (bfloat16 keeps 8 bits: within 2e-2 of each tensor's
    largest magnitude)."""
    torch.manual_seed(5)
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                          nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, bias=False),
                          nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Flatten(), nn.Linear(8 * 64, 4))
    model = model.to(device).bfloat16()
    for m in model.modules():  # batch norm in fp32 over bfloat16 activations
        if isinstance(m, nn.BatchNorm2d):
            m.float()
    eager = copy.deepcopy(model)
    x = torch.randn(2, 3, 8, 8, device=device).bfloat16()
    y = torch.randint(0, 4, (2,), device=device)
    step = pt.train_step(model, torch.nn.CrossEntropyLoss(), x, y, policy="rotor", budget="min")
    loss = step(x, y)
    reference = torch.nn.functional.cross_entropy(eager(x), y)
    reference.backward()
    worst = max(relative_error(a.grad, b.grad)
                for a, b in zip(model.parameters(), eager.parameters()))
    r = step.report
    ok = (all(p.grad.dtype == p.dtype for p in model.parameters()) and worst < 2e-2 and
          r["recomputations"] > 0 and
          relative_error(loss, reference.float()) < 2e-2 and
          r["measured_peak_bytes"] == r["predicted_peak_bytes"])
    print(f"{'ok' if ok else 'FAILED':>6} bfloat16: worst gradient {worst:.1e} off eager "
          f"bfloat16, loss {loss.item():.5f} (eager {reference.item():.5f}), "
          f"{r['recomputations']} recomputations, peak {r['measured_peak_bytes']} (predicted "
          f"{r['predicted_peak_bytes']})")
    return not ok


def run_stream_ordering(torch, pt):
    """The GPU path's copy ordering, on the CPU with stand-in streams: every
    copy waits for the compute stream's work so far and records an event on
    the side stream, and the compute stream waits on each event once (before
    reading a prefetched tensor or dropping an offloaded one), with the
    results of the plain run."""
    from pebble.torch._executor import Program

    log = []

    class Event:
        def __init__(self):
            self.stream, self.waits = None, 0

        def record(self):
            self.stream = current[-1]
            log.append("record")

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_stream(self, other):
            log.append(f"{self.name} waits for {other.name}")

        def wait_event(self, event):
            event.waits += 1
            log.append(f"{self.name} waits on an event")

    compute = Stream("compute")
    current = [compute]
    events = []

    class Streams:
        @staticmethod
        def Event():
            events.append(Event())
            return events[-1]

        @staticmethod
        def Stream(device):
            return Stream("copy")

        @staticmethod
        @contextlib.contextmanager
        def stream(s):
            current.append(s)
            yield
            current.pop()

        @staticmethod
        def current_stream(device):
            return compute

        @staticmethod
        def synchronize(device):
            log.append("synchronize")

    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 64, 4))
    x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 4, (2,))
    plain = copy.deepcopy(model)
    step = pt.train_step(model, torch.nn.CrossEntropyLoss(), x, y, policy="swap", budget="min")
    reference = pt.train_step(plain, torch.nn.CrossEntropyLoss(), x, y, policy="swap",
                              budget="min")
    step.program = Program(step.nodes, step.plan.schedule, step.graph.outputs, step.device,
                           step.program.workspace, streams=Streams)
    same = torch.equal(step(x, y), reference(x, y)) and all(
        torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), plain.parameters()))
    copies = len(events)
    ok = (same and copies > 0 and copies == step.report["steps"] - len(
        [a for a, _ in step.schedule if a in ("compute", "free")]) and
          all(e.stream is not None and e.stream.name == "copy" and e.waits == 1 for e in events)
          and log.count("copy waits for compute") == copies and log[-1] == "synchronize")
    print(f"{'ok' if ok else 'FAILED':>6} copy ordering on stand-in streams: {copies} copies, "
          f"results {'equal' if same else 'differ'}")
    return not ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("-k", default="", help="run the cases whose name holds this")
    args = parser.parse_args()
    try:
        import torch
        import pebble.torch as pt
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    if args.device == "cuda" and not torch.cuda.is_available():
        print("skipped: --device cuda, and torch sees no CUDA device")
        return 77
    device = torch.device(args.device)
    torch.manual_seed(0)
    failures = run_errors(torch, pt, args.k) if args.device == "cpu" else 0
    failures += run_accumulation(torch, pt, device)
    failures += run_bfloat16(torch, pt, device)
    if args.device == "cpu":
        failures += run_stream_ordering(torch, pt)
    for name, (model, loss_fn, make_batch) in networks(torch, device).items():
        if args.k and args.k not in name:
            continue
        try:
            failures += check_network(torch, pt, name, model, loss_fn, make_batch, device)
        except (ValueError, RuntimeError) as e:
            print(f"{name:>20}: FAILED: {e}")
            failures += 1
    print("all pass" if not failures else f"{failures} failure(s)")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
