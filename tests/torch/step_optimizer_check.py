#!/usr/bin/env python3
"""pebble.torch with the optimizer's step in the plan, against eager PyTorch.

    step_optimizer_check.py [--device cpu|cuda] [--steps N]

For each case (a model, a torch.optim optimizer, a policy and a budget),
trains two copies of the model from the same initialisation on the same
batches: one eagerly (loss.backward(); optimizer.step(), with foreach=False,
the single-tensor implementation pebble follows), one with
pebble.torch.train_step(..., optimizer=opt). Checks after every step:

- the loss, and after N steps every parameter and every state tensor of the
  optimizer, equal eager's to 1e-5 relative (bitwise on the CPU, in practice);
- the allocator's (or the profiler's) peak of the step equals the plan's
  predicted peak, the optimizer's update and its temporaries included, and
  so does pebble's own count of the tensors held;
- opt.state_dict() loads into a fresh optimizer, which then takes one more
  eager step to the same parameters as pebble's next step;
- a learning-rate scheduler's lr is followed, as eager follows it;
- with optimizer_state="host", the state is in (pinned) host memory after
  each step and the plan streamed it (on the CPU device, with
  allow_cpu_offload, the copies are measured as a GPU's would be).

And that an optimizer pebble cannot plan (Nesterov momentum, a parameter
left out, another optimizer class) is refused with OptimizerError naming why,
while a frozen parameter in the optimizer is skipped, as torch.optim skips it.
Exit 0 on success, 1 on a mismatch, 77 without torch or (cuda) without a GPU.
"""

import argparse
import copy
import sys


def models(torch):
    nn = torch.nn

    def mlp():
        return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(),
                             nn.Linear(64, 10))

    class ConvNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(8)
            self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
            self.fc = nn.Linear(16 * 8 * 8, 10)

        def forward(self, x):
            x = torch.relu(self.bn1(self.conv1(x)))
            x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
            return self.fc(x.flatten(1))

    def batch_mlp(g, device):
        return (torch.randn(16, 32, generator=g).to(device),
                torch.randint(0, 10, (16,), generator=g).to(device))

    def batch_conv(g, device):
        return (torch.randn(8, 3, 16, 16, generator=g).to(device),
                torch.randint(0, 10, (8,), generator=g).to(device))

    return {"mlp": (mlp, batch_mlp), "convnet": (ConvNet, batch_conv)}


def optimizers(torch):
    return {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
        "sgd-plain": lambda ps: torch.optim.SGD(ps, lr=0.05),
        "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=1e-3, foreach=False),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False),
    }


CASES = [  # (model, optimizer, policy, budget, where the state lives)
    ("mlp", "sgd", "baseline", "100%", "device"),
    ("mlp", "adam", "rotor", "min", "device"),
    ("mlp", "adamw", "dtr", "min", "device"),
    ("mlp", "sgd-plain", "sqrtn", "min", "device"),
    ("convnet", "adam", "rotor", "min", "device"),
    ("convnet", "sgd", "dtr", "90%", "device"),
    ("mlp", "adam", "rotor", "min", "host"),
    ("convnet", "adamw", "baseline", "100%", "host"),
    ("convnet", "sgd", "dtr", "min", "host"),
    # "between": halfway between the least peaks with the state on the host
    # and resident, where the plan keeps some state resident, streams the rest.
    ("mlp", "adam", "rotor", "between", "auto"),
    ("convnet", "sgd", "baseline", "between", "auto"),
]

TOL = 1e-5


def close(torch, a, b):
    if a.shape != b.shape:
        return False
    scale = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) <= TOL * max(scale, 1e-30) if a.numel() else True


def run_case(torch, pt, device, steps, model_name, opt_name, policy, budget, state):
    make_model, make_batch = models(torch)[model_name]
    make_opt = optimizers(torch)[opt_name]
    torch.manual_seed(0)
    eager_model = make_model().to(device)
    planned_model = copy.deepcopy(eager_model)
    eager_opt = make_opt(eager_model.parameters())
    planned_opt = make_opt(planned_model.parameters())
    loss_fn = torch.nn.functional.cross_entropy
    g = torch.Generator().manual_seed(1)
    batches = [make_batch(g, device) for _ in range(steps + 1)]
    x0, y0 = batches[0]
    # On the CPU device the host is the same memory: allow_cpu_offload runs
    # the streaming path anyway, its copies measured as a GPU's would be.
    if budget == "between":
        budget = between(torch, pt, planned_model, make_opt, loss_fn, x0, y0, policy)
    step = pt.train_step(planned_model, loss_fn, (x0,), y0, optimizer=planned_opt,
                         policy=policy, budget=budget, measure="always",
                         optimizer_state=state, allow_cpu_offload=state != "device")
    failures = []
    streamed = step.plan.report["transfer_bytes"]
    if state == "host" and streamed == 0:
        failures.append("the state's home is the host, but the plan moves nothing")
    placed = step.report["optimizer_state"]
    if state == "auto" and not (placed["resident_tensors"] and placed["streamed_tensors"]):
        failures.append(f"state=auto between the fixed rules placed {placed}")
    for k in range(steps):
        x, y = batches[k]
        eager_opt.zero_grad(set_to_none=True)
        eager_loss = loss_fn(eager_model(x), y)
        eager_loss.backward()
        eager_opt.step()
        planned_opt.zero_grad(set_to_none=True)
        loss = step(x, y)
        if not close(torch, loss.detach().cpu(), eager_loss.detach().cpu()):
            failures.append(f"step {k + 1}: loss {float(loss)}, eager {float(eager_loss)}")
        r = step.report
        if r["counted_peak_bytes"] != r["predicted_peak_bytes"]:
            failures.append(f"step {k + 1}: pebble's count {r['counted_peak_bytes']}, "
                            f"predicted {r['predicted_peak_bytes']}")
        if r["transfer_bytes"] != r["predicted_transfer_bytes"]:
            failures.append(f"step {k + 1}: {r['transfer_bytes']} bytes moved, predicted "
                            f"{r['predicted_transfer_bytes']}")
        if r["measured_peak_bytes"] != r["predicted_step_peak_bytes"]:
            failures.append(f"step {k + 1}: measured peak {r['measured_peak_bytes']} "
                            f"({r['measured_by']}), predicted {r['predicted_step_peak_bytes']}")
    for (name, a), b in zip(planned_model.named_parameters(), eager_model.parameters()):
        if not close(torch, a.detach().cpu(), b.detach().cpu()):
            failures.append(f"parameter {name} differs from eager's")
    failures += placement(torch, step, planned_model, planned_opt, state, device)
    eager_state = eager_opt.state_dict()["state"]
    planned_state = planned_opt.state_dict()["state"]
    for i, entry in eager_state.items():
        for key, value in entry.items():
            if value is None or not torch.is_tensor(value):
                continue
            other = planned_state.get(i, {}).get(key)
            if other is None or not close(torch, other.cpu(), value.cpu()):
                failures.append(f"optimizer state {i}/{key} differs from eager's")
    # The state dict loads into a fresh optimizer, which continues as pebble does.
    resumed_model = copy.deepcopy(planned_model)
    resumed_opt = make_opt(resumed_model.parameters())
    resumed_opt.load_state_dict(planned_opt.state_dict())
    x, y = batches[steps]
    resumed_opt.zero_grad(set_to_none=True)
    loss_fn(resumed_model(x), y).backward()
    resumed_opt.step()
    # A state dict loaded into the planned optimizer (torch puts its tensors
    # on the parameters' device) is used, and moved where the plan keeps it.
    planned_opt.load_state_dict(copy.deepcopy(planned_opt.state_dict()))
    planned_opt.zero_grad(set_to_none=True)
    step(x, y)
    failures += [f"after loading the state dict, {f}"
                 for f in placement(torch, step, planned_model, planned_opt, state, device)]
    for (name, a), b in zip(planned_model.named_parameters(), resumed_model.parameters()):
        if not close(torch, a.detach().cpu(), b.detach().cpu()):
            failures.append(f"after loading the state dict, parameter {name} differs")
    r = step.report
    print(f"{model_name:8} {opt_name:9} {policy:8} {budget:5} state on {state:6}: "
          f"{streamed} bytes moved, predicted step peak "
          f"{r['predicted_step_peak_bytes']}, measured {r['measured_peak_bytes']} "
          f"({r['measured_by']}), {r['recomputations']} recomputations"
          f"{'' if not failures else ' FAIL'}")
    return [f"{model_name}/{opt_name}/{policy}/{state}: {f}" for f in failures]


def placement(torch, step, model, opt, state, device):
    """Each state tensor where the plan keeps it: on the host where the plan
    streams it (pinned beside a GPU), else on the device."""
    failures = []
    names = {p: name for name, p in model.named_parameters()}
    streamed = {node_id for action, node_id in step.plan.schedule if action == "prefetch"}
    for p, entry in opt.state.items():
        for key, value in entry.items():
            if key == "step" or not torch.is_tensor(value):
                continue
            on_host = f"{key}:{names[p]}" in streamed
            if state == "host" and not on_host:
                failures.append(f"optimizer state {key} of {names[p]} is not streamed")
            if state == "device" and on_host:
                failures.append(f"optimizer state {key} of {names[p]} is streamed")
            if on_host and device.type == "cuda" and not value.is_pinned():
                failures.append(f"optimizer state {key} is on {value.device}, not in "
                                "pinned host memory")
            if not on_host and value.device != device:
                failures.append(f"optimizer state {key} is on {value.device}, not {device}")
    return failures


def between(torch, pt, model, make_opt, loss_fn, x, y, policy):
    """A budget (bytes) halfway between the least peaks of the step with the
    optimizer's state on the host and resident."""
    peaks = []
    for state in ("host", "device"):
        probe = copy.deepcopy(model)
        step = pt.train_step(probe, loss_fn, (x,), y, optimizer=make_opt(probe.parameters()),
                             policy=policy, budget="min", optimizer_state=state,
                             allow_cpu_offload=True, measure="never")
        peaks.append(step.report["predicted_peak_bytes"])
    return str((peaks[0] + peaks[1]) // 2)


def scheduled(torch, pt, device, steps):
    """A learning-rate scheduler changes lr between steps: the planned step
    follows it as eager does."""
    make_model, make_batch = models(torch)["mlp"]
    torch.manual_seed(0)
    eager_model = make_model().to(device)
    planned_model = copy.deepcopy(eager_model)
    runs = []
    for model in (eager_model, planned_model):
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
        runs.append((model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)))
    g = torch.Generator().manual_seed(2)
    x, y = make_batch(g, device)
    loss_fn = torch.nn.functional.cross_entropy
    step = pt.train_step(planned_model, loss_fn, (x,), y, optimizer=runs[1][1])
    for _ in range(steps):
        for model, opt, sched in runs:
            opt.zero_grad(set_to_none=True)
            if model is eager_model:
                loss_fn(model(x), y).backward()
                opt.step()
            else:
                step(x, y)
            sched.step()
    failures = []
    for (name, a), b in zip(planned_model.named_parameters(), eager_model.parameters()):
        if not close(torch, a.detach().cpu(), b.detach().cpu()):
            failures.append(f"with a StepLR scheduler, parameter {name} differs from eager's")
    return failures


def refusals(torch, pt, device):
    failures = []
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).to(device)
    x = torch.randn(3, 4, device=device)
    y = torch.randint(0, 2, (3,), device=device)
    cases = [
        (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True), "nesterov"),
        (torch.optim.SGD(model[0].parameters(), lr=0.1), "'1.weight' is trainable but not in"),
        (torch.optim.RMSprop(model.parameters(), lr=0.1), "plans torch.optim.SGD, Adam and AdamW"),
        (torch.optim.Adam(model.parameters(), amsgrad=True), "amsgrad=True"),
        (torch.optim.SGD(model.parameters(), lr=0.0), "lr=0.0; pebble plans lr above 0"),
    ]
    for opt, needle in cases:
        try:
            pt.train_step(model, torch.nn.functional.cross_entropy, (x,), y, optimizer=opt)
        except pt.OptimizerError as e:
            if needle not in str(e):
                failures.append(f"refusal without '{needle}': {e}")
            continue
        failures.append(f"{type(opt).__name__} ({needle}) was not refused")
    opt = torch.optim.Adam(model.parameters())
    for kwargs, needle in (
            (dict(optimizer_state="disk", optimizer=opt), "'device', 'host' or 'auto', not 'disk'"),
            (dict(optimizer_state="host"), "give the optimizer too"),
            (dict(optimizer_state="host", optimizer=opt),
             "saves no memory on the CPU device" if device.type == "cpu" else None)):
        try:
            pt.train_step(model, torch.nn.functional.cross_entropy, (x,), y, **kwargs)
        except ValueError as e:
            if needle is None or needle not in str(e):
                failures.append(f"optimizer_state={kwargs['optimizer_state']!r}: refused "
                                f"with '{e}'")
            continue
        if needle is not None:
            failures.append(f"optimizer_state={kwargs['optimizer_state']!r} was not refused")
    # A frozen parameter in the optimizer is skipped, as torch.optim skips it.
    frozen = copy.deepcopy(model)
    frozen[0].weight.requires_grad_(False)
    before = [p.detach().clone() for p in frozen.parameters()]
    opt = torch.optim.SGD(frozen.parameters(), lr=0.1)
    pt.train_step(frozen, torch.nn.functional.cross_entropy, (x,), y, optimizer=opt)(x, y)
    moved = [not torch.equal(a, p.detach()) for a, p in zip(before, frozen.parameters())]
    if moved != [False, True, True, True]:
        failures.append(f"with a frozen first weight, the parameters moved: {moved}")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    try:
        import torch
        import pebble.torch as pt
    except ImportError as e:
        print(f"SKIP: {e}")
        return 77
    if args.device == "cuda" and not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77
    device = torch.device(args.device)
    failures = []
    for case in CASES:
        try:
            failures += run_case(torch, pt, device, args.steps, *case)
        except (pt.PlanError, pt.PlanExecutionError, pt.OptimizerError) as e:
            failures.append(f"{'/'.join(case)}: {type(e).__name__}: {e}")
    failures += scheduled(torch, pt, device, args.steps)
    failures += refusals(torch, pt, device)
    for f in failures:
        print("MISMATCH:", f)
    if failures:
        return 1
    print(f"PASS: {len(CASES)} cases, {args.steps} steps each: losses, parameters and "
          "optimizer state as eager's, measured peak == predicted, state_dict loadable; "
          "unsupported optimizers refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
