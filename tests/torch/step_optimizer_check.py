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
- step.full_optimizer_state_dict() (opt.state_dict() on the CPU) loads into a
  fresh optimizer, which then takes one more eager step to the same
  parameters as pebble's next step;
- a learning-rate scheduler's lr is followed, as eager follows it, each
  parameter group's on its own;
- parameter groups with settings of their own (a weight decay on the weights
  only, another lr, SGD's momentum on some groups only) train as eager, each
  update's temporary planned where its own group's coupled weight decay makes
  one, a momentum buffer only where eager keeps one;
- with max_grad_norm, the gradients are clipped in the plan as eager's
  clip_grad_norm_ clips them between backward() and step() (by the 2-norm,
  the largest magnitude and the 1-norm), step.grad_norm
  is the norm clip_grad_norm_ returns (and a .grad
  kept from before the step, which clipping would not see, is refused);
- with optimizer_state="host", the state is in (pinned) host memory after
  each step and the plan streamed it (on the CPU device, with
  allow_cpu_offload, the copies are measured as a GPU's would be);
- with optimizer_updates="host", every update ran on the host (ZeRO-Offload's
  rule), the state lives there (or, with optimizer_state="device", each
  update moves it out and back), and the parameters are back on the device,
  still the module's Parameters; with "auto" between the least peaks of the
  two rules, the plan ran some updates on the host and some on the device;
- with optimizer_parameters="host" (or "auto"), each parameter whose home
  the plan puts on the host is its host copy between steps, and the same
  holds (STREAMED; streamed_parameters()).

And that an optimizer pebble cannot plan (Nesterov momentum, a parameter
left out, another optimizer class, a .grad on a parameter
the step does not update, a group's
weight decay turned on or a parameter taken out after planning) is refused with OptimizerError naming why, while a
frozen parameter in the optimizer is skipped, as torch.optim skips it.
Exit 0 on success, 1 on a mismatch, 77 without torch or (cuda) without a GPU.
"""

import argparse
import copy
import math
import re
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

    class LSTM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(30, 12)
            self.rnn = nn.LSTM(12, 16, num_layers=2, batch_first=True)
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            out, _ = self.rnn(self.emb(x))
            return self.fc(out[:, -1])

    class Unused(nn.Module):
        """An MLP with a layer the loss never reaches: as torch.optim, the
        step gives it no state and no update (weight decay included)."""
        def __init__(self):
            super().__init__()
            self.body = mlp()
            self.spare = nn.Linear(4, 4)

        def forward(self, x):
            return self.body(x)

    def batch_mlp(g, device):
        return (torch.randn(16, 32, generator=g).to(device),
                torch.randint(0, 10, (16,), generator=g).to(device))

    def drop():  # (hybrid's plan at min runs its dropouts again: with the batch below,
        # that saves more than the generator's state it takes, 5,056 bytes on the CPU)
        layers = [nn.Linear(16, 256), nn.ReLU(), nn.Dropout(0.3)]
        for _ in range(2):
            layers += [nn.Linear(256, 256), nn.ReLU(), nn.Dropout(0.3)]
        return nn.Sequential(*layers, nn.Linear(256, 8))

    def batch_drop(g, device):
        return (torch.randn(64, 16, generator=g).to(device),
                torch.randint(0, 8, (64,), generator=g).to(device))

    def batch_tiny(g, device):
        return (torch.randn(8, 16, generator=g).to(device),
                torch.randint(0, 8, (8,), generator=g).to(device))

    def batch_tiny_bf16(g, device):  # (small enough that the updates make the peak)
        return (torch.randn(8, 16, generator=g).to(device, torch.bfloat16),
                torch.randint(0, 8, (8,), generator=g).to(device))

    def batch_norm_bf16(g, device):
        return (torch.randn(4, 6, generator=g).to(device, torch.bfloat16),
                torch.randint(0, 3, (4,), generator=g).to(device))

    def batch_mlp64(g, device):
        x, y = batch_mlp(g, device)
        return x.double(), y

    def batch_tokens(g, device):
        return (torch.randint(0, 30, (4, 7), generator=g).to(device),
                torch.randint(0, 10, (4,), generator=g).to(device))

    def batch_conv(g, device):
        return (torch.randn(8, 3, 16, 16, generator=g).to(device),
                torch.randint(0, 10, (8,), generator=g).to(device))

    return {"mlp": (mlp, batch_mlp), "convnet": (ConvNet, batch_conv),
            "lstm": (LSTM, batch_tokens), "unused": (Unused, batch_mlp),
            "drop": (drop, batch_drop),
            "mlp64": (lambda: mlp().double(), batch_mlp64),
            "tiny-bf16": (lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(),
                                                nn.Linear(32, 8)).to(torch.bfloat16),
                          batch_tiny_bf16),
            # (a clipped gradient beside a host update makes its peak)
            "norm-bf16": (lambda: nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.GELU(),
                                                nn.Linear(16, 3)).to(torch.bfloat16),
                          batch_norm_bf16)}


def optimizers(torch):
    def groups(ps, weights, others):
        """Two parameter groups, as nanoGPT makes them: the weights (2-D and
        up) with the settings `weights`, biases and norms with `others`."""
        ps = list(ps)
        return [dict(weights, params=[p for p in ps if p.dim() >= 2]),
                dict(others, params=[p for p in ps if p.dim() < 2])]

    return {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
        "sgd-plain": lambda ps: torch.optim.SGD(ps, lr=0.05),
        "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=1e-3, foreach=False),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False),
        # eps 0, which torch.optim takes (refused until 2026-12-04).
        "adam-no-eps": lambda ps: torch.optim.Adam(ps, lr=1e-2, eps=0.0, foreach=False),
        # The multi-tensor code: the same updates to rounding (PyTorch 1.13's
        # also adds the weight decay into .grad, which the plan does not).
        "adam-foreach": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=1e-3,
                                                    foreach=True),
        "adamw-foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True),
        "sgd-foreach": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3,
                                                  foreach=True),
        # Groups that differ: AdamW's weight decay on the weights only; Adam's
        # coupled weight decay (a temporary per update) on the weights only,
        # and another lr for the rest; SGD's lr and weight decay.
        "adamw-groups": lambda ps: torch.optim.AdamW(
            groups(ps, {"weight_decay": 0.1}, {"weight_decay": 0.0}), lr=1e-2, foreach=False),
        "adam-groups": lambda ps: torch.optim.Adam(
            groups(ps, {"weight_decay": 1e-3}, {"lr": 3e-3}), lr=1e-2, foreach=False),
        "sgd-groups": lambda ps: torch.optim.SGD(
            groups(ps, {"weight_decay": 1e-3}, {"lr": 0.02}), lr=0.1, momentum=0.9),
        # Momentum on the weights only, and on the rest only (its first group
        # without): each parameter keeps a momentum buffer where eager does.
        "sgd-momentum-weights": lambda ps: torch.optim.SGD(
            groups(ps, {"momentum": 0.9, "weight_decay": 1e-3}, {"momentum": 0.0}), lr=0.05),
        "sgd-momentum-rest": lambda ps: torch.optim.SGD(
            groups(ps, {"weight_decay": 1e-3}, {"momentum": 0.8}), lr=0.05),
    }


CASES = [  # (model, optimizer, policy, budget, where the state lives, where the updates run)
    ("mlp", "sgd", "baseline", "100%", "device", "device"),
    ("mlp", "adam", "rotor", "min", "device", "device"),
    ("mlp", "adamw", "dtr", "min", "device", "device"),
    ("mlp", "sgd-plain", "sqrtn", "min", "device", "device"),
    ("convnet", "adam", "rotor", "min", "device", "device"),
    ("convnet", "sgd", "dtr", "90%", "device", "device"),
    ("mlp", "adam", "rotor", "min", "host", "device"),
    ("convnet", "adamw", "baseline", "100%", "host", "device"),
    ("convnet", "sgd", "dtr", "min", "host", "device"),
    # "between": halfway between the least peaks with the state on the host
    # and resident, where the plan keeps some state resident, streams the rest.
    ("mlp", "adam", "rotor", "between", "auto", "device"),
    ("convnet", "sgd", "baseline", "between", "auto", "device"),
    # Updates on the host (the state there too: optimizer_state None).
    ("mlp", "adam", "rotor", "min", None, "host"),
    ("mlp", "sgd-plain", "baseline", "100%", None, "host"),
    ("convnet", "sgd", "dtr", "min", None, "host"),
    ("convnet", "adamw", "checkmate-lp", "min", "host", "host"),
    # "split": halfway between the least peaks with every update on the host
    # and with everything on the device, where the plan splits them (over a
    # slow link, SLOW_LINK, which makes the host's updates cost more); the
    # convnet's plan there keeps them on the device, streaming some state.
    # The split case plans uncalibrated (calibrate=False: estimated costs and
    # the default host rate), so which updates go to the host does not depend
    # on how loaded the machine was while it timed them.
    ("mlp", "adam", "rotor", "split", "auto", "auto"),
    ("convnet", "sgd", "dtr", "between", "auto", "auto"),
    # The gradients dropped: each freed once its updates have read it, .grad None.
    ("mlp", "adam", "rotor", "min", None, "host", "drop"),
    ("convnet", "sgd", "dtr", "min", "device", "device", "drop"),
    ("convnet", "adamw", "rotor", "min", "host", "device", "drop"),
    ("mlp", "sgd-plain", "checkmate-lp", "min", None, "auto", "drop"),
    # The state's home the device, its updates on the host (as the command
    # line's state=device,updates=host): each update offloads its state,
    # runs on the host copy and fetches it back (Placement's
    # offloaded_device_state; such a plan raised a KeyError once, made
    # then only by hybrid's plans at some budgets of state=auto).
    ("mlp", "adam", "rotor", "min", "device", "host"),
    ("mlp", "adam-no-eps", "dtr", "min", None, "host"),
    ("mlp", "adam-foreach", "rotor", "min", "device", "device"),
    ("convnet", "adamw-foreach", "dtr", "min", None, "host"),
    ("convnet", "sgd-foreach", "rotor", "min", "host", "device"),
    ("lstm", "adam", "dtr", "100%", "device", "host", "drop"),
    ("convnet", "sgd-momentum-weights", "checkmate-lp", "min", "device", "host", "keep",
     0.05),
    # A layer the loss never reaches gets no state and no update, as eager.
    ("unused", "adamw", "rotor", "min", "host", "device"),
    ("unused", "sgd", "baseline", "100%", "device", "device"),
    # bfloat16: on the CPU device an update casts its held scalar (2 bytes).
    ("tiny-bf16", "adam", "rotor", "min", "device", "device"),
    ("tiny-bf16", "sgd", "baseline", "100%", "device", "device"),
    # On the host it reads a held bfloat16 scalar instead (the same bits on
    # the CPU), whose cast once stood 2 bytes above the prediction where a
    # clipped gradient made the peak.
    ("norm-bf16", "adam", "dtr", "min", None, "host", "keep", 0.3),
    ("tiny-bf16", "adamw", "rotor", "min", "host", "host"),
    # Parameter groups with settings of their own, each update with its
    # group's (and its group's temporaries: TEMPORARIES_BY_GROUP).
    ("mlp", "adamw-groups", "rotor", "min", "device", "device"),
    ("convnet", "adam-groups", "dtr", "min", None, "host"),
    ("mlp", "adam-groups", "rotor", "min", "auto", "device"),
    ("convnet", "sgd-groups", "checkmate-lp", "min", "host", "device"),
    # Gradients clipped to a total norm in the plan (max_grad_norm), as eager's
    # clip_grad_norm_ between backward() and step(): with the updates on the
    # device, on the host with the gradients dropped, and with groups.
    ("mlp", "adamw", "rotor", "min", "device", "device", "keep", 0.05),
    ("convnet", "sgd", "dtr", "min", None, "host", "drop", 0.05),
    ("mlp", "adam-groups", "checkmate-lp", "min", "auto", "device", "keep", 0.05),
    # SGD's groups with and without momentum: the buffers eager keeps only,
    # on the device, on the host (state and updates), and placed by the plan.
    ("mlp", "sgd-momentum-weights", "rotor", "min", "device", "device"),
    ("convnet", "sgd-momentum-rest", "dtr", "min", "host", "device"),
    ("convnet", "sgd-momentum-weights", "checkmate-lp", "min", None, "host", "drop"),
    ("mlp", "sgd-momentum-rest", "hybrid", "between", "auto", "device"),
    # float64 parameters (Note [Updates of float64 parameters]): their
    # scalars held as doubles, so the bits are eager's; the state on the
    # host, the updates there, clipped.
    ("mlp64", "adam", "rotor", "min", "device", "device"),
    ("mlp64", "sgd-momentum-weights", "dtr", "min", None, "host", "drop"),
    ("mlp64", "adamw", "checkmate-lp", "min", "auto", "device", "keep", 0.05),
    # Other norms (clip_grad_norm_'s norm_type): the largest magnitude, and
    # the 1-norm.
    ("mlp", "adam", "dtr", "min", "device", "device", "keep", (0.002, "inf")),
    ("convnet", "sgd", "rotor", "min", "device", "device", "keep", (0.5, 1.0)),
]

TOL = 1e-5
# Seconds for checkmate-lp's plans at min: each LP of these graphs takes about
# a second, and the search below the least peak ran to train_step's 10 s on
# one case. What is checked here is the step as eager's, whatever the plan.
CHECKMATE_LP_TIME_LIMIT = 2
SLOW_LINK = 1e8  # bytes/s, for updates="auto"


def close(torch, a, b):
    if a.shape != b.shape:
        return False
    scale = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) <= TOL * max(scale, 1e-30) if a.numel() else True


def twins(torch, device, model_name, opt_name, count, seed):
    """(an eager model of `model_name`, its planned copy, an optimizer of
    `opt_name` for each, `count` batches drawn from generator `seed`)."""
    make_model, make_batch = models(torch)[model_name]
    make_opt = optimizers(torch)[opt_name]
    torch.manual_seed(0)
    eager_model = make_model().to(device)
    planned_model = copy.deepcopy(eager_model)
    g = torch.Generator().manual_seed(seed)
    return (eager_model, planned_model, make_opt(eager_model.parameters()),
            make_opt(planned_model.parameters()), [make_batch(g, device) for _ in range(count)])


def run_case(torch, pt, device, steps, model_name, opt_name, policy, budget, state, updates,
             gradients="keep", clip=None):
    """`clip`: max_grad_norm, or (max_grad_norm, grad_norm_type)."""
    clip, norm_type = clip if isinstance(clip, tuple) else (clip, 2.0)
    eager_model, planned_model, eager_opt, planned_opt, batches = twins(
        torch, device, model_name, opt_name, steps + 1, seed=1)
    make_opt = optimizers(torch)[opt_name]
    loss_fn = torch.nn.functional.cross_entropy
    x0, y0 = batches[0]
    # On the CPU device the host is the same memory: allow_cpu_offload runs
    # the streaming path anyway, its copies measured as a GPU's would be.
    split = budget == "split"
    if budget in ("between", "split"):
        budget = between(torch, pt, planned_model, make_opt, loss_fn, x0, y0, policy, updates,
                         calibrate=not split)
    step = pt.train_step(planned_model, loss_fn, (x0,), y0, optimizer=planned_opt,
                         policy=policy, budget=budget, measure="always",
                         bandwidth=SLOW_LINK if updates == "auto" else None,
                         optimizer_state=state, optimizer_updates=updates,
                         optimizer_gradients=gradients, max_grad_norm=clip,
                         grad_norm_type=norm_type, calibrate=not split,
                         allow_cpu_offload=state not in (None, "device") or updates != "device",
                         time_limit=CHECKMATE_LP_TIME_LIMIT if policy == "checkmate-lp" else 10)
    failures = temporaries_by_group(step, planned_opt, planned_model)
    reported = step.report["optimizer_updates"]
    if (reported["max_grad_norm"], reported["grad_norm_type"]) != (
            clip, None if clip is None else norm_type):
        failures.append(f"the report's clipping is {reported['max_grad_norm']}, "
                        f"{reported['grad_norm_type']}, not {clip}, {norm_type}")

    def clipped(model, k):  # eager's clipping (its norm); the first step's must clip
        if clip is None:
            return None
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip, norm_type=norm_type)
        if k == 0 and not float(norm) > clip:
            failures.append(f"the gradients' norm {float(norm)} is within {clip}: "
                            "nothing was clipped")
        return norm
    streamed = step.plan.report["transfer_bytes"]
    if (state == "host" or updates == "host") and streamed == 0:
        failures.append("the state's home is the host, but the plan moves nothing")
    placed = step.report["optimizer_state"]
    ran = step.report["optimizer_updates"]
    if state == "auto" and updates == "device" and not (placed["resident_tensors"] and
                                                         placed["streamed_tensors"]):
        failures.append(f"state=auto between the fixed rules placed {placed}")
    if state == "device" and updates == "host" and \
            not step._variant_for((x0,), y0).placement.offloaded_device_state:
        failures.append("the plan moves no state whose home is the device to the host")
    if split and not (ran["host_parameters"] and ran["device_parameters"]):
        failures.append(f"updates=auto between the fixed rules ran {ran}")
    if updates == "host" and ran["device_parameters"]:
        failures.append(f"updates=host ran {ran}")
    rate = step.report["host_update_bytes_per_s"]
    if (updates == "device") != (rate is None) or (rate is not None and not rate > 0):
        failures.append(f"updates={updates}: the host's rate is {rate}")
    import pebble  # (imported by main, which skips where it cannot be)
    if split and rate != pebble.DEFAULT_HOST_BYTES_PER_S:  # uncalibrated: the default rate
        failures.append(f"calibrate=False: the host's rate is {rate}, not pebble's default")
    host_updates = {n for a, n in step.plan.schedule if a == "host_compute"}
    if updates != "auto" and (updates == "device") == bool(host_updates):
        failures.append(f"updates={updates}: {len(host_updates)} updates on the host")
    for k in range(steps):
        x, y = batches[k]
        eager_opt.zero_grad(set_to_none=True)
        eager_loss = loss_fn(eager_model(x), y)
        eager_loss.backward()
        eager_norm = clipped(eager_model, k)
        eager_opt.step()
        planned_opt.zero_grad(set_to_none=True)
        if k == steps - 1:  # once, the memory after each of the plan's steps
            loss, timeline = step.memory_timeline(x, y)
            failures += timeline_differences(timeline, device)
        else:
            loss = step(x, y)
        if (step.grad_norm is None) != (eager_norm is None) or (
                eager_norm is not None and not close(torch, step.grad_norm.cpu(),
                                                     eager_norm.cpu())):
            failures.append(f"step {k + 1}: step.grad_norm {step.grad_norm}, eager's "
                            f"clip_grad_norm_ {eager_norm}")
        if not close(torch, loss.detach().cpu(), eager_loss.detach().cpu()):
            failures.append(f"step {k + 1}: loss {float(loss)}, eager {float(eager_loss)}")
        r = step.report
        if r["counted_peak_bytes"] != r["predicted_peak_bytes"]:
            failures.append(f"step {k + 1}: pebble's count {r['counted_peak_bytes']}, "
                            f"predicted {r['predicted_peak_bytes']}")
        if r["transfer_bytes"] != r["predicted_transfer_bytes"]:
            failures.append(f"step {k + 1}: {r['transfer_bytes']} bytes moved, predicted "
                            f"{r['predicted_transfer_bytes']}")
        # (the host homes and every host copy, the state's included: until
        # 2026-12-04 the run left the optimizer state's out)
        if r["measured_host_peak_bytes"] != r["host_peak_bytes"]:
            failures.append(f"step {k + 1}: the host held {r['measured_host_peak_bytes']} "
                            f"bytes at most, predicted {r['host_peak_bytes']}")
        kept = [p.grad is not None for p in planned_model.parameters()]
        if kept != [gradients == "keep" and e.grad is not None
                    for e in eager_model.parameters()]:
            failures.append(f"step {k + 1}: gradients={gradients}, .grad set: {kept}")
        if r["measured_peak_bytes"] != r["predicted_step_peak_bytes"]:
            failures.append(f"step {k + 1}: measured peak {r['measured_peak_bytes']} "
                            f"({r['measured_by']}), predicted {r['predicted_step_peak_bytes']}")
    for (name, a), b in zip(planned_model.named_parameters(), eager_model.parameters()):
        if not close(torch, a.detach().cpu(), b.detach().cpu()):
            failures.append(f"parameter {name} differs from eager's")
    failures += placement(torch, step, planned_model, planned_opt, state, updates, device)
    eager_state = eager_opt.state_dict()["state"]
    planned_state = planned_opt.state_dict()["state"]
    if set(planned_state) != set(eager_state):
        failures.append(f"optimizer state of parameters {sorted(planned_state)}, eager's of "
                        f"{sorted(eager_state)}")
    for i, entry in eager_state.items():
        if set(entry) != set(planned_state.get(i, {})):  # (torch.optim's format: 1.13's
            # SGD keeps momentum_buffer=None where a group has no momentum)
            failures.append(f"optimizer state {i} has entries {sorted(planned_state.get(i, {}))}"
                            f", eager's {sorted(entry)}")
        for key, value in entry.items():
            if value is None or not torch.is_tensor(value):
                continue
            other = planned_state.get(i, {}).get(key)
            if other is None or not close(torch, other.cpu(), value.cpu()):
                failures.append(f"optimizer state {i}/{key} differs from eager's")
        for key, value in planned_state.get(i, {}).items():  # (a buffer eager has not)
            if torch.is_tensor(value) and not torch.is_tensor(entry.get(key)):
                failures.append(f"optimizer state {i}/{key} is a tensor, eager's "
                                f"{entry.get(key)!r}")
    # The state dict, as step.full_optimizer_state_dict() copies it to the
    # CPU, loads into a fresh optimizer, which continues as pebble does.
    resumed_model = copy.deepcopy(planned_model)
    resumed_opt = make_opt(resumed_model.parameters())
    saved = step.full_optimizer_state_dict()
    if any(torch.is_tensor(v) and v.device.type != "cpu"
           for entry in saved["state"].values() for v in entry.values()):
        failures.append("full_optimizer_state_dict() holds a tensor outside the CPU")
    resumed_opt.load_state_dict(saved)
    x, y = batches[steps]
    resumed_opt.zero_grad(set_to_none=True)
    loss_fn(resumed_model(x), y).backward()
    clipped(resumed_model, steps)
    resumed_opt.step()
    # A state dict loaded into the planned optimizer (torch puts its tensors
    # on the parameters' device) is used, and moved where the plan keeps it.
    planned_opt.load_state_dict(copy.deepcopy(planned_opt.state_dict()))
    planned_opt.zero_grad(set_to_none=True)
    step(x, y)
    failures += [f"after loading the state dict, {f}"
                 for f in placement(torch, step, planned_model, planned_opt, state, updates,
                                    device)]
    for (name, a), b in zip(planned_model.named_parameters(), resumed_model.parameters()):
        if not close(torch, a.detach().cpu(), b.detach().cpu()):
            failures.append(f"after loading the state dict, parameter {name} differs")
    r = step.report
    print(f"{model_name:8} {opt_name:9} {policy:12} {budget:6} state on {str(state):6} "
          f"updates on {updates:6} gradients {gradients}"
          f"{'' if clip is None else f', clipped to {clip}'}"
          f"{'' if norm_type == 2.0 else f' ({norm_type}-norm)'}: "
          f"{streamed} bytes moved, predicted step peak "
          f"{r['predicted_step_peak_bytes']}, measured {r['measured_peak_bytes']} "
          f"({r['measured_by']}), {r['recomputations']} recomputations"
          f"{'' if not failures else ' FAIL'}")
    return [f"{model_name}/{opt_name}/{policy}/{state}/{updates}/{gradients}: {f}"
            for f in failures]


def timeline_differences(timeline, device):
    """The steps of a plan after which the allocator's level is not the
    simulator's (step.memory_timeline): on the CPU to the byte; a GPU's
    allocator may keep a library's workspace from the first call on, so
    there (not checked on a GPU yet) within 64 KiB."""
    slack = 0 if str(device) == "cpu" else 64 << 10
    off = [t for t in timeline if abs(t["measured_bytes"] - t["predicted_bytes"]) > slack]
    return [f"after {len(off)} of the plan's {len(timeline)} steps the allocator's level is "
            "not the plan's: " + "; ".join(
                f"step {t['step']} ({t['action']} {t['node']}): measured {t['measured_bytes']} B, "
                f"predicted {t['predicted_bytes']} B" for t in off[:3])] if off else []


def temporaries_by_group(step, opt, model):
    """Each update's planned temporary (its node's workspace) is there where
    its own parameter's group decides: coupled weight decay (SGD's, Adam's)
    takes one in the moment updates, and in SGD's last update where the
    group has no momentum; Adam's last update always takes one."""
    failures = []
    names = {p: name for name, p in model.named_parameters()}
    decay = {names[p]: g["weight_decay"] != 0 and type(opt).__name__ != "AdamW"
             for g in opt.param_groups for p in g["params"]}
    plain = {names[p]: g.get("momentum", 0) == 0 for g in opt.param_groups for p in g["params"]}
    size = {name: p.numel() * p.element_size() for name, p in model.named_parameters()}
    workspace = step.updates.workspace_bytes
    for name, coupled in decay.items():
        for node_id, wanted in ((f"exp_avg:{name}#1", coupled),
                                (f"momentum_buffer:{name}#1", coupled),
                                (f"update:{name}", type(opt).__name__ != "SGD" or
                                 (coupled and plain[name]))):
            # (a parameter-sized temporary; a bfloat16 update on the CPU also
            # holds its scalar's cast, a few bytes)
            if node_id in step.updates.ops and \
                    (workspace.get(node_id, 0) >= size[name]) != wanted:
                failures.append(f"update {node_id}: workspace {workspace.get(node_id, 0)}, "
                                f"a temporary {'expected' if wanted else 'not expected'}")
    return failures


def placement(torch, step, model, opt, state, updates, device):
    """Each state tensor at its home between steps: the host where the plan's
    first step on it is a prefetch or an update on the host (pinned beside a
    GPU), else the device (one that an update on the host moves out and
    back included); each parameter on the device, a leaf Parameter of the
    module."""
    failures = []
    names = {p: name for name, p in model.named_parameters()}
    first = {}  # storage -> the plan's first step on it
    for action, node_id in step.plan.schedule:
        first.setdefault(node_id.split("#")[0], action)
    for name, p in model.named_parameters():
        if p.device != device or not isinstance(p, torch.nn.Parameter) or not p.is_leaf:
            failures.append(f"parameter {name} is {type(p).__name__} on {p.device}")
    for p, entry in opt.state.items():
        for key, value in entry.items():
            if key == "step" or not torch.is_tensor(value):
                continue
            on_host = first.get(f"{key}:{names[p]}") in ("prefetch", "host_compute")
            if state != "device" and (state == "host" or updates == "host") and not on_host:
                failures.append(f"optimizer state {key} of {names[p]} is not on the host")
            if state == "device" and on_host:
                failures.append(f"optimizer state {key} of {names[p]} lives on the host")
            if on_host and device.type == "cuda" and not value.is_pinned():
                failures.append(f"optimizer state {key} is on {value.device}, not in "
                                "pinned host memory")
            if not on_host and value.device != device:
                failures.append(f"optimizer state {key} is on {value.device}, not {device}")
    return failures


def between(torch, pt, model, make_opt, loss_fn, x, y, policy, updates, calibrate=True):
    """A budget (bytes) halfway between the least peaks of the step with the
    optimizer's state on the host and resident (updates="device"), or with
    every update on the host and with everything on the device (else). With
    updates="auto" the lower end is at least the least peak of auto itself
    (its search of placements may not reach the all-host rule's)."""
    peaks = []
    rules = ((dict(optimizer_state="host"), dict(optimizer_state="device"))
             if updates == "device" else
             (dict(optimizer_updates="host"), dict(optimizer_state="device"),
              dict(optimizer_state="auto", optimizer_updates="auto", bandwidth=SLOW_LINK)))
    for rule in rules:
        probe = copy.deepcopy(model)
        step = pt.train_step(probe, loss_fn, (x,), y, optimizer=make_opt(probe.parameters()),
                             policy=policy, budget="min", allow_cpu_offload=True,
                             measure="never", calibrate=calibrate, **rule)
        peaks.append(step.report["predicted_peak_bytes"])
    return str((max([peaks[0]] + peaks[2:]) + peaks[1]) // 2)


def scheduled(torch, pt, device, steps):
    """A learning-rate scheduler changes lr between steps: the planned step
    follows it as eager does; with two parameter groups, each group's; a
    warm-up from lr 0 (the scheduler made before the step, so its lr is 0
    then, as transformers' linear warm-up sets it)."""
    failures = []
    for schedule in ("step", "groups", "warm-up"):
        failures += scheduled_run(torch, pt, device, steps, schedule)
    return failures


def scheduled_run(torch, pt, device, steps, schedule_kind):
    make_model, make_batch = models(torch)["mlp"]
    torch.manual_seed(0)
    eager_model = make_model().to(device)
    planned_model = copy.deepcopy(eager_model)
    runs = []
    for model in (eager_model, planned_model):
        if schedule_kind == "groups":  # each group's lr on a schedule of its own
            opt = optimizers(torch)["adam-groups"](model.parameters())
            schedule = torch.optim.lr_scheduler.LambdaLR(opt, [lambda k: 0.5 ** k,
                                                               lambda k: 1.0 + k])
        elif schedule_kind == "warm-up":
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, k / 2))
        else:
            opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
            schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        runs.append((model, opt, schedule))
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
    what = {"groups": "LambdaLR on two parameter groups", "warm-up": "warm-up from lr 0",
            "step": "StepLR"}[schedule_kind]
    for (name, a), b in zip(planned_model.named_parameters(), eager_model.parameters()):
        if not close(torch, a.detach().cpu(), b.detach().cpu()):
            failures.append(f"with a {what} scheduler, parameter {name} differs from eager's")
    return failures


def trains_as_eager(torch, pt, model, x, y, make_opt, steps=3, before_step=None):
    """Whether a planned step with the optimizer make_opt(parameters) gives
    eager's parameters after `steps` steps on copies of `model`;
    before_step(k, optimizer) changes both optimizers before step k."""
    planned, eager = copy.deepcopy(model), copy.deepcopy(model)
    opt, eager_opt = make_opt(planned.parameters()), make_opt(eager.parameters())
    step = pt.train_step(planned, torch.nn.functional.cross_entropy, (x,), y, optimizer=opt)
    for k in range(steps):
        for optimizer in (opt, eager_opt):
            if before_step is not None:
                before_step(k, optimizer)
            optimizer.zero_grad(set_to_none=True)
        step(x, y)
        torch.nn.functional.cross_entropy(eager(x), y).backward()
        eager_opt.step()
    return all(torch.allclose(p, q, rtol=1e-5, atol=1e-6)
               for p, q in zip(planned.parameters(), eager.parameters()))


def with_state(torch, model, x, y, opt, key, value):
    """`opt` after one eager step of a copy of `model`, its state's `key` of
    the first parameter set to `value` (a dtype: that entry cast to it)."""
    twin = copy.deepcopy(model)
    of_twin = dict(zip(twin.parameters(), model.parameters()))
    eager = type(opt)(twin.parameters(), **opt.defaults)
    torch.nn.functional.cross_entropy(twin(x), y).backward()
    eager.step()
    for p, state in eager.state.items():
        opt.state[of_twin[p]] = {k: v.clone() for k, v in state.items()}
    first = opt.state[next(model.parameters())]
    first[key] = first[key].to(value) if isinstance(value, torch.dtype) else value
    return opt


def refusals(torch, pt, device):
    failures = []
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).to(device)
    x = torch.randn(3, 4, device=device)
    y = torch.randint(0, 2, (3,), device=device)
    cases = [
        (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True),
         "nesterov=True: pebble plans plain SGD (momentum, weight decay), Adam and AdamW; to "
         "train with it, leave out optimizer= and call optimizer.step() after each step"),
        (torch.optim.SGD(model[0].parameters(), lr=0.1), "'1.weight' is trainable but not in"),
        (torch.optim.RMSprop(model.parameters(), lr=0.1),
         "plans torch.optim.SGD, Adam and AdamW; to train with it, leave out optimizer="),
        (torch.optim.Adam(model.parameters(), amsgrad=True), "amsgrad=True"),
        (torch.optim.Adam([{"params": model[0].parameters()},
                           {"params": model[1].parameters(), "amsgrad": True}]),
         "amsgrad=True (parameter group 1)"),
        (torch.optim.AdamW([{"params": model[0].parameters()},
                            {"params": model[1].parameters(), "lr": -1.0}]),
         "lr=-1.0 (parameter group 1); pebble plans lr of 0 or more"),
        # Settings and state eager fails on too, in an operator's words
        # (until 2026-12-05 pebble's were those words).
        (torch.optim.SGD([{"params": model[0].parameters()},
                          {"params": model[1].parameters(), "lr": None}], lr=0.1),
         "lr=None (parameter group 1) is not a number"),
        (with_state(torch, model, x, y, torch.optim.Adam(model.parameters()), "step", 3),
         "state of '0.weight' holds step=3 (int): torch.optim's adam keeps a tensor"),
        (with_state(torch, model, x, y, torch.optim.Adam(model.parameters()), "exp_avg",
                    torch.float64),
         "state 'exp_avg' of '0.weight' is a float64 tensor, its parameter float32"),
    ]
    for opt, needle in cases:
        try:  # (refused at train_step, or for the state at the call)
            pt.train_step(model, torch.nn.functional.cross_entropy, (x,), y, optimizer=opt)(x, y)
        except pt.OptimizerError as e:
            if needle not in str(e):
                failures.append(f"refusal without '{needle}': {e}")
            continue
        failures.append(f"{type(opt).__name__} ({needle}) was not refused")
    # An Adam state whose count of steps is an integer tensor (eager 1.13
    # adds to it as it is; 2.x loads it as float32): trained as eager, on
    # the last parameter only (until 2026-12-06 the call failed in the
    # update, half the parameters updated).
    def int_step_on_last(params):
        params = list(params)
        opt = torch.optim.Adam(params, lr=1e-2)
        for k, p in enumerate(params):
            opt.state[p] = {"step": torch.tensor(5) if k == len(params) - 1 else
                            torch.tensor(5.0), "exp_avg": torch.full_like(p, 0.1),
                            "exp_avg_sq": torch.full_like(p, 0.01)}
        return opt
    if not trains_as_eager(torch, pt, model, x, y, int_step_on_last):
        failures.append("Adam with an int64 step in its state: the parameters differ from "
                        "eager's")
    # A momentum of 1 (torch.optim.SGD takes any that is not negative) is
    # planned, as eager runs it (it was refused by pebble's range, [0, 1)).
    if not trains_as_eager(torch, pt, model, x, y,
                           lambda params: torch.optim.SGD(params, lr=0.1, momentum=1.0)):
        failures.append("SGD with momentum=1: the parameters differ from eager's")
    # A layer replaced after the step was made: eager's optimizer.step()
    # leaves its new parameters alone, and the plan's updates are the
    # optimizer's (until 2026-12-03 the new ones were updated from the old
    # ones' state).
    replaced = copy.deepcopy(model)
    step = pt.train_step(replaced, torch.nn.functional.cross_entropy, (x,), y,
                         optimizer=torch.optim.Adam(replaced.parameters()))
    replaced[1] = torch.nn.Linear(4, 2).to(device)
    try:
        step(x, y)
        failures.append("a replaced layer's parameters were updated by the planned step")
    except ValueError as e:
        if "is not the tensor that the optimizer holds" not in str(e):
            failures.append(f"a replaced layer: {e}")
    opt = torch.optim.Adam(model.parameters())
    on_cpu = device.type == "cpu"
    for kwargs, needle in (
            (dict(optimizer_state="disk", optimizer=opt), "'device', 'host' or 'auto', not 'disk'"),
            # (a bad value named before another option's conflict with it)
            (dict(optimizer_updates="drop", optimizer_parameters="host",
                  optimizer_gradients="keep", optimizer=opt),
             "optimizer_updates must be 'device', 'host' or 'auto', not 'drop'"),
            (dict(optimizer_state="host"), "give the optimizer too"),
            (dict(optimizer_state="host", optimizer=opt),
             "saves no memory on the CPU device" if on_cpu else None),
            (dict(optimizer_updates="gpu", optimizer=opt),
             "'device', 'host' or 'auto', not 'gpu'"),
            (dict(optimizer_updates="host"), "give the optimizer too"),
            (dict(optimizer_updates="auto", optimizer_state="device", optimizer=opt,
                  allow_cpu_offload=True), "optimizer_state='host' or 'auto'"),
            (dict(optimizer_updates="host", optimizer=opt),
             "saves no memory on the CPU device" if on_cpu else None),
            (dict(optimizer_gradients="lose", optimizer=opt), "'keep' or 'drop', not 'lose'"),
            (dict(optimizer_gradients="drop"), "give the optimizer too"),
            (dict(optimizer_parameters="host", allow_cpu_offload=True),
             "give the optimizer too"),
            (dict(optimizer_parameters="auto", optimizer=opt, optimizer_gradients="keep",
                  allow_cpu_offload=True), "leave optimizer_gradients out"),
            (dict(optimizer_parameters="host", optimizer=opt),
             "saves no memory on the CPU device" if on_cpu else None),
            (dict(max_grad_norm=1.0), "give the optimizer too"),
            (dict(max_grad_norm=0.0, optimizer=opt), "a positive finite number, not 0.0"),
            (dict(max_grad_norm=float("nan"), optimizer=opt), "a positive finite number, not nan"),
            (dict(max_grad_norm="1", optimizer=opt), "a positive finite number, not '1'"),
            (dict(grad_norm_type="inf", optimizer=opt), "give max_grad_norm too"),
            (dict(max_grad_norm=1.0, grad_norm_type=0, optimizer=opt),
             "grad_norm_type must be a positive number (a p-norm's p) or 'inf', not 0"),
            (dict(max_grad_norm=1.0, grad_norm_type="two", optimizer=opt),
             "or 'inf', not 'two'"),
            # (in the command line's words until 2026-12-04: "give momentum=...")
            (dict(optimizer_state="auto", allow_cpu_offload=True,
                  optimizer=torch.optim.SGD(model.parameters(), lr=0.1)),
             "optimizer_state='auto', but SGD without momentum keeps no state: leave "
             "optimizer_state out")):
        placed = {k: v for k, v in kwargs.items() if k.startswith("optimizer_")}
        try:
            pt.train_step(model, torch.nn.functional.cross_entropy, (x,), y, **kwargs)
        except ValueError as e:
            if needle is None or needle not in str(e):
                failures.append(f"{placed}: refused with '{e}'")
            continue
        if needle is not None:
            failures.append(f"{placed} was not refused")
    # A .grad kept from before the step (PyTorch 1.13's zero_grad() keeps
    # zeros): the step adds to it, as backward() does, and the update reads
    # the sum; updates on the host refuse it, naming the remedy, and so does
    # clipping (clip_grad_norm_ clips the sum, the step its own gradient).
    # With the parameters on the host (their gradients dropped), the remedy
    # is the zeroing alone (it offered gradients kept, which they refuse).
    for updates, clip, parameters in (("device", None, "device"), ("host", None, "device"),
                                      ("device", 1.0, "device"), ("device", None, "host")):
        torch.manual_seed(0)
        eager = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                    torch.nn.Linear(8, 2)).to(device)
        planned = copy.deepcopy(eager)
        eager_opt = torch.optim.Adam(eager.parameters(), lr=0.1, foreach=False)
        planned_opt = torch.optim.Adam(planned.parameters(), lr=0.1, foreach=False)
        step = pt.train_step(planned, torch.nn.functional.cross_entropy, (x,), y,
                             optimizer=planned_opt, optimizer_updates=updates,
                             optimizer_parameters=parameters, allow_cpu_offload=True,
                             max_grad_norm=clip)
        if parameters == "host":  # (its steps leave .grad None: zeros from the start)
            for p in list(eager.parameters()) + list(planned.parameters()):
                p.grad = torch.zeros_like(p)
        try:
            for _ in range(3):
                for p in list(eager.parameters()) + list(planned.parameters()):
                    if p.grad is not None:
                        p.grad.zero_()
                torch.nn.functional.cross_entropy(eager(x), y).backward()
                eager_opt.step()
                step(x, y)
        except pt.OptimizerError as e:
            refused = updates == "host" or clip is not None or parameters == "host"
            if not refused or "zero_grad(set_to_none=True)" not in str(e) or \
                    (parameters == "host" and "optimizer_gradients='keep'" in str(e)):
                failures.append(f"with .grad kept, updates on the {updates}, clip {clip}, "
                                f"parameters on the {parameters}: {e}")
            continue
        if updates == "host" or clip is not None or parameters == "host":
            failures.append(f"with .grad kept, updates on the {updates}, clip {clip}, "
                            f"parameters on the {parameters}: not refused")
        elif not all(close(torch, a.detach(), b.detach())
                     for a, b in zip(planned.parameters(), eager.parameters())):
            failures.append("with .grad kept (zeroed, not None), the parameters differ from "
                            "eager's")
    failures += group_changes(torch, pt, device, model, x, y)
    # A frozen parameter in the optimizer is skipped, as torch.optim skips it.
    frozen = copy.deepcopy(model)
    frozen[0].weight.requires_grad_(False)
    before = [p.detach().clone() for p in frozen.parameters()]
    opt = torch.optim.SGD(frozen.parameters(), lr=0.1)
    pt.train_step(frozen, torch.nn.functional.cross_entropy, (x,), y, optimizer=opt)(x, y)
    moved = [not torch.equal(a, p.detach()) for a, p in zip(before, frozen.parameters())]
    if moved != [False, True, True, True]:
        failures.append(f"with a frozen first weight, the parameters moved: {moved}")
    # A .grad on a parameter the loss does not reach: eager's step() would
    # apply it, the plan has no update for it, so the call is refused (and
    # the step trains once it is cleared).
    unused_model, _ = models(torch)["unused"]
    unused = unused_model().to(device)
    xu = torch.randn(3, 32, device=device)
    yu = torch.randint(0, 10, (3,), device=device)
    step = pt.train_step(unused, torch.nn.functional.cross_entropy, (xu,), yu,
                         optimizer=torch.optim.SGD(unused.parameters(), lr=0.1))
    step(xu, yu)
    unused.spare.weight.grad = torch.ones_like(unused.spare.weight)
    try:
        step(xu, yu)
        failures.append("a .grad on a parameter the loss does not reach was not refused")
    except pt.OptimizerError as e:
        if "'spare.weight' has a .grad, but the step does not update it (the loss does " \
                "not reach it)" not in str(e):
            failures.append(f"a .grad on an unreached parameter: refused with '{e}'")
    unused.spare.weight.grad = None
    step(xu, yu)
    # The same for a parameter frozen after the step was made, its .grad
    # kept: torch.optim applies a .grad whatever requires_grad says.
    unused.body[0].weight.requires_grad_(False)
    try:
        step(xu, yu)
        failures.append("a .grad on a frozen parameter was not refused")
    except pt.OptimizerError as e:
        if "'body.0.weight' has a .grad, but the step does not update it (it is frozen)" \
                not in str(e):
            failures.append(f"a .grad on a frozen parameter: refused with '{e}'")
    unused.body[0].weight.grad = None
    step(xu, yu)
    try:
        pt.train_step(model, torch.nn.functional.cross_entropy, (x,), y).\
            full_optimizer_state_dict()
        failures.append("full_optimizer_state_dict() of a step without an optimizer was not "
                        "refused")
    except ValueError as e:
        if "no optimizer in its plan" not in str(e):
            failures.append(f"full_optimizer_state_dict() without an optimizer: refused with {e}")
    return failures


def group_changes(torch, pt, device, model, x, y):
    """After the step is made: a group's weight decay turned on (Adam's
    coupled one takes a temporary the plan does not hold) and a parameter
    taken out of the optimizer are refused by the next call, naming the
    parameter; lr changes are followed (scheduled)."""
    failures = []
    # AdamW's decay, decoupled, needs no temporary: turned on, it is followed.
    def decay_on(k, optimizer):
        if k == 1:
            optimizer.param_groups[0]["weight_decay"] = 0.5
    if not trains_as_eager(torch, pt, model, x, y,
                           lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.0),
                           before_step=decay_on):
        failures.append("AdamW's weight decay turned on after planning: parameters differ "
                        "from eager's")
    for change, needle in (
            (lambda opt: opt.param_groups[1].update(weight_decay=0.1),
             "weight_decay of '1.weight' changed from 0 to 0.1"),
            (lambda opt: opt.param_groups[1].update(params=opt.param_groups[1]["params"][1:]),
             "parameter '1.weight' is no longer in the optimizer's param_groups")):
        planned = copy.deepcopy(model)
        opt = torch.optim.Adam([{"params": planned[0].parameters(), "weight_decay": 0.1},
                                {"params": planned[1].parameters()}], foreach=False)
        step = pt.train_step(planned, torch.nn.functional.cross_entropy, (x,), y,
                             optimizer=opt)
        step(x, y)
        change(opt)
        opt.zero_grad(set_to_none=True)
        try:
            step(x, y)
            failures.append(f"a change of the optimizer's groups was not refused ({needle})")
        except pt.OptimizerError as e:
            if needle not in str(e):
                failures.append(f"a change of the optimizer's groups: refused with '{e}', "
                                f"not '{needle}'")
    return failures


def frozen_for_a_step(torch, pt, device):
    """A layer frozen for one step and trainable again: the step runs the
    plan of its first capture again, whose updates stream that layer's state
    from the host (Note [Plans of other captures] in _optimizer.py; it
    failed at every call until 2026-12-06). Parameters and optimizer state
    as eager's after each step."""
    failures = []
    nn = torch.nn
    x = torch.randn(8, 6, device=device)
    y = torch.randint(0, 3, (8,), device=device)
    for kind, state in (("sgd", "host"), ("adam", "host"), ("adam", "auto")):
        torch.manual_seed(0)
        planned = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
        eager = copy.deepcopy(planned)
        make = ((lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)) if kind == "sgd" else
                (lambda ps: torch.optim.Adam(ps, lr=1e-2)))
        opt, eager_opt = make(planned.parameters()), make(eager.parameters())
        step = pt.train_step(planned, torch.nn.functional.cross_entropy, (x,), y,
                             optimizer=opt, policy="dtr", budget="min", optimizer_state=state,
                             allow_cpu_offload=True)
        for k in range(3):
            for model, optimizer in ((planned, opt), (eager, eager_opt)):
                model[0].requires_grad_(k != 1)
                optimizer.zero_grad(set_to_none=True)
            try:
                step(x, y)
            except (pt.PlanError, pt.PlanExecutionError, RuntimeError) as e:
                failures.append(f"{kind}, state on the {state}, frozen at step 1: step {k} "
                                f"failed: {type(e).__name__}: {e}")
                break
            torch.nn.functional.cross_entropy(eager(x), y).backward()
            eager_opt.step()
            same = all(close(torch, p, q) for p, q in zip(planned.parameters(),
                                                            eager.parameters()))
            same = same and all(close(torch, a, b) for p, q in zip(planned.parameters(),
                                                                   eager.parameters())
                                for a, b in zip(opt.state[p].values(),
                                                eager_opt.state[q].values())
                                if torch.is_tensor(a))
            if not same:
                failures.append(f"{kind}, state on the {state}, frozen at step 1: parameters "
                                f"or state differ from eager's after step {k}")
    return failures


def optimizers_as_configs_make_them(torch, pt, device):
    """A NumPy scalar as a learning rate (a config's, np.linspace's) trains
    as the same Python float does (it raised a TypeError from the plan's
    JSON); a parameter listed twice (a tied weight through both of its
    modules) is refused, naming it: eager would update it twice a step."""
    import numpy as np  # noqa: PLC0415 (only here)
    failures = []
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).to(device)
    x = torch.randn(8, 16, device=device)
    y = torch.randint(0, 4, (8,), device=device)

    def trained(lr):
        net = copy.deepcopy(model)
        opt = torch.optim.AdamW(net.parameters(), lr=lr)
        step = pt.train_step(net, torch.nn.functional.cross_entropy, (x,), y, optimizer=opt)
        for _ in range(2):
            step(x, y)
        return [p.detach().clone() for p in net.parameters()]

    try:
        given, wanted = trained(np.float32(1e-3)), trained(float(np.float32(1e-3)))
        if not all(torch.equal(a, b) for a, b in zip(given, wanted)):
            failures.append("a NumPy lr trains apart from the same Python float")
    except Exception as e:  # noqa: BLE001 (eager takes it)
        failures.append(f"NumPy lr: {type(e).__name__}: {e}")
    tied = torch.nn.Linear(8, 8, bias=False).to(device)
    twice = torch.optim.SGD(list(tied.parameters()) + list(tied.parameters()), lr=0.1)
    try:
        pt.train_step(tied, torch.nn.functional.mse_loss, (x[:, :8],), x[:, :8],
                      optimizer=twice)
        failures.append("a parameter listed twice in the optimizer was not refused")
    except pt.OptimizerError as e:
        if "'weight' twice" not in str(e):
            failures.append(f"a parameter listed twice: the refusal does not name it: {e}")
    return failures


def advice_with_parameters_on_the_host(torch, pt, device):
    """A byte budget just below the least peak of a step whose parameters
    and state the plan may put on the host is refused with advice that
    works: that least peak in bytes (its least step above the parameters
    is negative, and was advised as budget='-159%', which is refused)."""
    failures = []
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4)).to(device)
    x = torch.randn(8, 64, device=device)
    y = torch.randint(0, 4, (8,), device=device)
    kw = dict(optimizer_state="auto", optimizer_updates="auto", optimizer_parameters="auto",
              allow_cpu_offload=True, policy="dtr", measure="never", calibrate=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    least = pt.train_step(model, torch.nn.functional.cross_entropy, (x,), y, optimizer=opt,
                          budget="min", **kw).report["predicted_peak_bytes"]
    try:
        pt.train_step(model, torch.nn.functional.cross_entropy, (x,), y, optimizer=opt,
                      budget=least - 64, **kw)
        return [f"a budget 64 bytes below the least peak {least} was not refused"]
    except pt.PlanError as e:
        found = re.search(r"try budget=('?[0-9.]+%?'?) or budget='min'", str(e))
        if found is None:
            return [f"the refusal below the least peak advises no budget: {e}"]
        advice = found.group(1)
    advice = advice.strip("'") if advice.startswith("'") else int(advice)
    try:
        pt.train_step(model, torch.nn.functional.cross_entropy, (x,), y, optimizer=opt,
                      budget=advice, **kw)
    except Exception as e:  # noqa: BLE001 (the advice must work)
        failures.append(f"the advised budget={advice!r} fails: {type(e).__name__}: {e}")
    return failures


def host_refusals(torch, pt, device):
    """Updates on the host refuse what they cannot run, naming why: a
    parameter that views a larger storage, a dtype without CPU kernels."""
    failures = []
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).to(device)
    x = torch.randn(3, 4, device=device)
    y = torch.randint(0, 2, (3,), device=device)
    flat = copy.deepcopy(model)
    buffer = torch.zeros(sum(p.numel() for p in flat.parameters()), device=device)
    offset = 0
    for p in flat.parameters():
        buffer[offset:offset + p.numel()].copy_(p.detach().flatten())
        p.data = buffer[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    half = copy.deepcopy(model).half()
    try:
        torch.ones(2, dtype=torch.half).addcdiv_(torch.ones(2, dtype=torch.half),
                                                 torch.ones(2, dtype=torch.half))
        half_on_cpu = True
    except RuntimeError:
        half_on_cpu = False
    for net, needle in ((flat, "a view of a larger storage"),
                        (half, None if half_on_cpu else "cannot run Adam's update of "
                         "torch.float16 tensors on the CPU")):
        try:
            pt.train_step(net, torch.nn.functional.cross_entropy, (x.to(net[0].weight.dtype),),
                          y, optimizer=torch.optim.Adam(net.parameters()),
                          optimizer_updates="host", allow_cpu_offload=True, calibrate=False)
        except pt.OptimizerError as e:
            if needle is None or needle not in str(e):
                failures.append(f"updates on the host refused with '{e}', not '{needle}'")
            continue
        except (pt.CaptureError, pt.PlanError) as e:  # a half model the CPU cannot trace
            if needle is not None:
                failures.append(f"updates on the host: {type(e).__name__} ({e}), not "
                                f"OptimizerError '{needle}'")
            continue
        if needle is not None:
            failures.append(f"updates on the host were not refused ('{needle}')")
    return failures


def gradients_as_eager_keeps_them(torch, pt, device):
    """Gradients that autograd's .grad takes apart from the backward's
    tensor (Note [A gradient as .grad] in _capture.py) train as eager:
    one tensor the gradient of two parameters (the weight read as
    base + delta: delta was never updated), an expanded one (a parameter read
    only through its sum: its .grad of stride 0 failed the next step's
    accumulation), a transposed one (a linear layer read through a
    transposed input); each .grad laid out as eager's, apart from every
    other; clipped where a 0-dim float32 parameter meets float64 ones (its
    clipped gradient came out float64, which .grad refused). Parameters
    that share memory are refused with updates or parameters on the host,
    where they trained wrong; views of one buffer that do not overlap are
    not. SGD's dampening without momentum (which SGD does not read) is not
    refused."""
    nn, F = torch.nn, torch.nn.functional
    failures = []

    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.out = nn.Linear(4, 5)
            self.r = nn.Parameter(torch.randn(2, 3))
            self.base = nn.Parameter(torch.randn(5, 4))
            self.delta = nn.Parameter(torch.zeros(5, 4))

        def forward(self, x):
            grid = x.view(-1, 4, 4)
            return self.out(grid.transpose(1, 2)).mean(1) + self.r.sum() + \
                F.linear(grid[:, 1], self.base + self.delta)

    class Temperature(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(16, 5).double()
            self.temperature = nn.Parameter(torch.tensor(0.7))

        def forward(self, x):
            return self.body(x.double()).float() / self.temperature

    torch.manual_seed(0)
    x = torch.randn(6, 16, device=device)
    y = torch.randint(0, 5, (6,), device=device)
    for make, what, kwargs in ((Odd, "shared, expanded and transposed gradients", {}),
                               (Odd, "the same, accumulated", {"accumulate": True}),
                               (Temperature, "a 0-dim float32 parameter beside float64 ones, "
                                "clipped", {"max_grad_norm": 0.1})):
        for opt_kind in ("sgd", "adam"):
            model = make().to(device)
            planned, eager = copy.deepcopy(model), copy.deepcopy(model)

            def make_opt(params):
                return (torch.optim.SGD(params, lr=0.1, momentum=0.9) if opt_kind == "sgd"
                        else torch.optim.Adam(params, lr=0.01))
            opt, eager_opt = make_opt(planned.parameters()), make_opt(eager.parameters())
            accumulate = kwargs.get("accumulate", False)
            clip = kwargs.get("max_grad_norm")
            step = pt.train_step(planned, F.cross_entropy, (x,), y, optimizer=opt,
                                 **({"max_grad_norm": clip} if clip else {}))
            label = f"{what} ({opt_kind})"
            try:
                for k in range(3):
                    if accumulate:  # (1.13's zero_grad(): zeros kept, added into)
                        for p in planned.parameters():
                            p.grad = torch.zeros_like(p) if p.grad is None else p.grad.zero_()
                    else:
                        opt.zero_grad(set_to_none=True)
                    eager_opt.zero_grad(set_to_none=not accumulate)
                    step(x, y)
                    F.cross_entropy(eager(x), y).backward()
                    if clip:
                        nn.utils.clip_grad_norm_(eager.parameters(), clip)
                    eager_opt.step()
            except RuntimeError as e:
                failures.append(f"{label}: {type(e).__name__}: {e}")
                continue
            for (name, p), q in zip(planned.named_parameters(), eager.parameters()):
                if not torch.allclose(p, q, rtol=1e-5, atol=1e-6):
                    failures.append(f"{label}: parameter '{name}' differs from eager's by "
                                    f"{(p - q).abs().max().item():.3g}")
                if p.grad is None or p.grad.stride() != q.grad.stride() or \
                        p.grad.dtype != q.grad.dtype:
                    failures.append(f"{label}: '{name}'.grad is "
                                    f"{None if p.grad is None else (p.grad.stride(), p.grad.dtype)}"
                                    f", eager's {(q.grad.stride(), q.grad.dtype)}")
            pointers = [p.grad.data_ptr() for p in planned.parameters() if p.grad is not None]
            if len(set(pointers)) != len(pointers):
                failures.append(f"{label}: two parameters share one .grad")

    base = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)).to(device)
    xs = torch.randn(3, 4, device=device)
    ys = torch.randint(0, 2, (3,), device=device)
    same = copy.deepcopy(base)
    same.extra = nn.Parameter(same[0].weight.data)  # (read below through the module's own)
    flat = copy.deepcopy(base)
    buffer = torch.cat([p.detach().flatten() for p in flat.parameters()])
    offset = 0
    for p in flat.parameters():
        p.data = buffer[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    for net, option, needle in ((same, "optimizer_updates", "share memory"),
                                (same, "optimizer_parameters", "share memory"),
                                (flat, "optimizer_parameters", None)):
        try:
            pt.train_step(net, F.cross_entropy, (xs,), ys,
                          optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                          allow_cpu_offload=True, calibrate=False, **{option: "host"})
            if needle is not None:
                failures.append(f"parameters sharing memory with {option}='host' were not "
                                "refused")
        except pt.OptimizerError as e:
            if needle is None or needle not in str(e):
                failures.append(f"{option}='host' refused with '{e}', not '{needle}'")
    if not trains_as_eager(torch, pt, base, xs, ys,
                           lambda ps: torch.optim.SGD(ps, lr=0.1, dampening=0.5)):
        failures.append("SGD with dampening and no momentum does not train as eager")
    return failures


# Parameters that live on the host between steps (optimizer_parameters):
# (model, optimizer, policy, budget, state, updates, parameters).
STREAMED = [
    ("mlp", "adam", "rotor", "min", "host", "device", "host"),
    ("convnet", "sgd", "dtr", "min", "host", "host", "host"),
    ("convnet", "adamw", "rotor", "min", None, "host", "host"),
    ("mlp", "adam", "rotor", "min", "auto", "auto", "auto"),
    # (the state's default beside parameters on the host: on the device, where
    # the step runs, not where the parameter lives)
    ("mlp", "sgd", "dtr", "min", None, "device", "host"),
    # A dropout run again (its mask drawn again from the generator's state,
    # which taking allocates for a moment: 5,056 bytes on the CPU device).
    ("drop", "adam", "hybrid", "min", None, "host", "host"),
]


def streamed_parameters(torch, pt, device, steps):
    """optimizer_parameters="host" (or "auto"): each parameter whose home the
    plan puts on the host is, between steps, the plan's host copy (pinned
    beside a GPU), fetched for its uses and its update on the device; the
    steps give eager's losses and parameters, the measured peak and the
    bytes moved are the plan's, no .grad is kept; a batch of other shapes
    (a capture with the parameters on the host) trains on as eager. Then a
    step whose plan keeps them on the host alternates with one (replan) that
    keeps them on the device: each puts them where its plan does."""
    failures = []
    for model_name, opt_name, policy, budget, state, updates, parameters in STREAMED:
        what = f"parameters {parameters}: {model_name}/{opt_name}/{policy}/{state}/{updates}"
        make_model, make_batch = models(torch)[model_name]
        make_opt = optimizers(torch)[opt_name]
        torch.manual_seed(0)
        eager = make_model().to(device)
        planned = copy.deepcopy(eager)
        eager_opt, planned_opt = make_opt(eager.parameters()), make_opt(planned.parameters())
        loss_fn = torch.nn.functional.cross_entropy
        g = torch.Generator().manual_seed(1)
        batches = [make_batch(g, device) for _ in range(steps)]
        x, y = batches[-1]
        batches.append((x[:-3], y[:-3]))  # other shapes: a capture of their own
        step = pt.train_step(planned, loss_fn, batches[0][:1], batches[0][1],
                             optimizer=planned_opt, policy=policy, budget=budget,
                             measure="always", optimizer_state=state,
                             optimizer_updates=updates, optimizer_parameters=parameters,
                             allow_cpu_offload=True)
        reruns = 0
        for k, (x, y) in enumerate(batches):
            torch.manual_seed(100 + k)  # (a dropout's masks: eager's)
            eager_opt.zero_grad(set_to_none=True)
            eager_loss = loss_fn(eager(x), y)
            eager_loss.backward()
            eager_opt.step()
            torch.manual_seed(100 + k)
            loss = step(x, y)
            reruns += step.report["random_reruns"]
            if not close(torch, loss.detach().cpu(), eager_loss.detach().cpu()):
                failures.append(f"{what}: step {k + 1}: loss {float(loss)}, eager "
                                f"{float(eager_loss)}")
            failures += [f"{what}: step {k + 1}: {f}" for f in
                         streamed_placement(torch, step, planned, device, parameters)]
        if model_name == "drop" and not reruns:
            failures.append(f"{what}: no plan ran the dropout again")
        for (name, a), b in zip(planned.named_parameters(), eager.parameters()):
            if not close(torch, a.detach().cpu(), b.detach().cpu()):
                failures.append(f"{what}: parameter {name} differs from eager's")
    return failures + parameters_moving(torch, pt, device)


def streamed_placement(torch, step, model, device, parameters):
    """The failures of one step with parameters on the host: the measured
    peak, the bytes moved and the parameters' places against the plan."""
    failures = []
    r = step.report
    if r["measured_peak_bytes"] != r["predicted_step_peak_bytes"] or \
            r["counted_peak_bytes"] != r["predicted_peak_bytes"] or \
            r["transfer_bytes"] != r["predicted_transfer_bytes"] or \
            r["measured_host_peak_bytes"] != r["host_peak_bytes"]:
        failures.append(f"measured peak {r['measured_peak_bytes']}, predicted "
                        f"{r['predicted_step_peak_bytes']}; counted {r['counted_peak_bytes']}, "
                        f"predicted {r['predicted_peak_bytes']}; moved {r['transfer_bytes']}, "
                        f"predicted {r['predicted_transfer_bytes']}; host peak "
                        f"{r['measured_host_peak_bytes']}, predicted {r['host_peak_bytes']}")
    program = step._variant.program
    homes = {program.graph.nodes[i].slot.names[0]: program.host[i] for i in program.host_homes}
    placed = r["optimizer_parameters"]
    count = len(list(model.parameters()))
    if placed["host_parameters"] != len(homes) or \
            placed["device_parameters"] != count - len(homes) or \
            (parameters == "host" and len(homes) != count):
        failures.append(f"optimizer_parameters={parameters}: the report says {placed}, the plan "
                        f"keeps {len(homes)} of {count} on the host")
    for name, p in model.named_parameters():
        home = homes.get(name)
        on_host = home is not None and p.data_ptr() == home.data_ptr() and (
            device.type == "cpu" or (p.device.type == "cpu" and p.is_pinned()))
        if (home is not None) != on_host or (home is None and p.device != device) or \
                p.grad is not None or not isinstance(p, torch.nn.Parameter):
            failures.append(f"parameter {name} is not where the plan keeps it (its host copy: "
                            f"{home is not None}; on {p.device}; .grad kept: {p.grad is not None})")
    return failures


def adam_mlps(torch, device):
    """The MLP twice from one initialisation, each with its Adam: (eager, its
    optimizer, planned, its optimizer, the MLP's batch maker)."""
    make_model, make_batch = models(torch)["mlp"]
    torch.manual_seed(0)
    eager = make_model().to(device)
    planned = copy.deepcopy(eager)
    return (eager, torch.optim.Adam(eager.parameters(), lr=1e-2, foreach=False), planned,
            torch.optim.Adam(planned.parameters(), lr=1e-2, foreach=False), make_batch)


def parameters_moving(torch, pt, device):
    """A step that keeps the parameters on the host at its least peak, and
    one made from it by replan() that keeps them on the device, in turn:
    each finds them where the other left them and puts them where its plan
    keeps them, with eager's parameters after four steps."""
    eager, eager_opt, planned, planned_opt, make_batch = adam_mlps(torch, device)
    loss_fn = torch.nn.functional.cross_entropy
    g = torch.Generator().manual_seed(2)
    batches = [make_batch(g, device) for _ in range(4)]
    tight = pt.train_step(planned, loss_fn, batches[0][:1], batches[0][1], optimizer=planned_opt,
                          policy="rotor", budget="min", measure="always",
                          optimizer_state="auto", optimizer_parameters="auto",
                          allow_cpu_offload=True)
    loose = tight.replan(policy="baseline", budget="100%")
    failures, on_host = [], []
    for k, (x, y) in enumerate(batches):
        step = (tight, loose)[k % 2]
        eager_opt.zero_grad(set_to_none=True)
        loss_fn(eager(x), y).backward()
        eager_opt.step()
        step(x, y)
        on_host.append(step.report["optimizer_parameters"]["host_parameters"])
        failures += [f"parameters moving, step {k + 1}: {f}" for f in
                     streamed_placement(torch, step, planned, device, "auto")]
    if on_host[0] == 0 or on_host[1] != 0:
        failures.append(f"parameters moving: parameters on the host at each step {on_host}: the "
                        "least peak's plan keeps none there, or the unplanned one does")
    for (name, a), b in zip(planned.named_parameters(), eager.parameters()):
        if not close(torch, a.detach().cpu(), b.detach().cpu()):
            failures.append(f"parameters moving: parameter {name} differs from eager's")
    return failures


def failure_midstep(torch, pt, device, parameters="device"):
    """A step that fails in the first parameter update on the host (after the
    plan freed that parameter's device memory; its moments already updated)
    leaves every parameter whole where it lives between steps (the device,
    or its host copy with `parameters`="host"), at its value before the
    step, and the next step runs; with the parameters on the host, a failure
    while some are fetched leaves each its host copy too."""
    eager, _, planned, planned_opt, make_batch = adam_mlps(torch, device)
    x, y = make_batch(torch.Generator().manual_seed(3), device)
    loss_fn = torch.nn.functional.cross_entropy
    step = pt.train_step(planned, loss_fn, (x,), y, optimizer=planned_opt,
                         optimizer_updates="host", policy="rotor", budget="min",
                         optimizer_parameters=parameters, allow_cpu_offload=True)
    optimizer_module = sys.modules["pebble.torch._optimizer"]
    update = optimizer_module._update

    def broken(op, *args, **kwargs):
        if op == "adam_update":
            raise RuntimeError("injected failure")
        return update(op, *args, **kwargs)
    optimizer_module._update = broken
    failures = []
    try:
        step(x, y)
        failures.append("the injected failure did not reach the caller")
    except RuntimeError as e:
        if "injected failure" not in str(e):
            failures.append(f"the injected failure came back as {e}")
    finally:
        optimizer_module._update = update
    program = step._variant.program
    homes = {program.graph.nodes[i].slot.names[0]: program.host[i] for i in program.host_homes}
    for (name, p), q in zip(planned.named_parameters(), eager.parameters()):
        home = homes.get(name)
        where = p.device == q.device if home is None else p.data_ptr() == home.data_ptr()
        if not where or not torch.equal(p.detach().cpu(), q.detach().cpu()):
            failures.append(f"parameters {parameters}: after a failed step, parameter {name} is "
                            "not as before the step, where it lives between steps")
    if (parameters == "host") != bool(homes):
        failures.append(f"parameters {parameters}: {len(homes)} parameters live on the host")
    if parameters == "host":  # a failure with parameters fetched: each its host copy again
        executor = sys.modules["pebble.torch._executor"]
        compute = executor._RunState.compute

        def failing(state, i, node):
            if any(state.live[k] is not None for k in state.program.host_homes):
                raise RuntimeError("injected failure with a parameter fetched")
            return compute(state, i, node)
        executor._RunState.compute = failing
        try:
            step(x, y)
            failures.append("the failure injected with a parameter fetched did not reach the "
                            "caller")
        except RuntimeError:
            pass
        finally:
            executor._RunState.compute = compute
        for name, p in planned.named_parameters():
            if p.data_ptr() != homes[name].data_ptr():
                failures.append(f"after a failure with parameters fetched, parameter {name} is "
                                "not its host copy")
    planned_opt.zero_grad(set_to_none=True)
    loss = step(x, y)
    if not torch.isfinite(loss) or any(not torch.isfinite(p).all() for p in planned.parameters()):
        failures.append(f"parameters {parameters}: the step after a failed one gave non-finite "
                        "values")
    return failures


def rounded_capture(torch, pt, device):
    """On a GPU the capture rounds each tensor's bytes to the allocator's 512:
    the optimizer's step of such a graph (emulated here by rounding a CPU
    capture) is a valid graph, its tensors and temporaries rounded alike,
    and it plans."""
    import json
    import pebble
    from pebble.torch._optimizer import Updates
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(),
                                torch.nn.Linear(10, 3)).to(device)
    x, y = torch.randn(4, 6, device=device), torch.randint(0, 3, (4,), device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    step = pt.train_step(model, torch.nn.functional.cross_entropy, (x,), y, optimizer=opt,
                         calibrate=False)
    doc = json.loads(step._variant.capture.graph.to_json())
    for node in doc["nodes"]:
        if node.get("alias_of") is None:
            node["bytes"] = -(-node["bytes"] // 512) * 512
    failures = []
    try:
        extended = Updates(opt, model).extend(pebble.from_json(json.dumps(doc)), 512)
    except ValueError as e:
        return [f"a capture rounded to 512 bytes: the optimizer's step fails: {e}"]
    for node in json.loads(extended.to_json())["nodes"]:
        if node.get("alias_of") is None and node["id"] != "optimizer.step" and \
                node["bytes"] % 512:
            failures.append(f"rounded to 512: '{node['id']}' holds {node['bytes']} bytes")
        if node.get("role") == "update" and node.get("workspace", 0) % 512:
            failures.append(f"rounded to 512: '{node['id']}' has a workspace of "
                            f"{node['workspace']} bytes")
    if not pebble.plan(extended, policy="baseline", budget="100%").feasible:
        failures.append("rounded to 512: the optimizer's step does not plan")
    return failures


def host_rate_measured_once(torch, pt, device):
    """The host's update rate is the machine's: a second step with updates
    on the host and the same kind of rule reuses the first's measurement; a
    rule of another kind (SGD after Adam, weight decay) is timed anew, and a
    rate is positive."""
    from pebble.torch import _optimizer
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(),
                                torch.nn.Linear(10, 3)).to(device)
    x, y = torch.randn(4, 6, device=device), torch.randint(0, 3, (4,), device=device)
    timed = []
    original = _optimizer.Updates._timed_host_rate

    def counting(self, ops, repeat):
        timed.append((self.kind, ops))
        return original(self, ops, repeat)

    def step_with(opt):
        return pt.train_step(model, torch.nn.functional.cross_entropy, (x,), y, optimizer=opt,
                             optimizer_updates="host", allow_cpu_offload=True,
                             measure="never").report["host_update_bytes_per_s"]

    saved = dict(_optimizer._HOST_RATES)
    _optimizer._HOST_RATES.clear()
    _optimizer.Updates._timed_host_rate = counting
    try:
        rates = [step_with(torch.optim.Adam(model.parameters(), lr=1e-3)),
                 step_with(torch.optim.Adam(model.parameters(), lr=1e-2)),
                 step_with(torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)),
                 step_with(torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=0.1))]
    finally:
        _optimizer.Updates._timed_host_rate = original
        _optimizer._HOST_RATES.clear()
        _optimizer._HOST_RATES.update(saved)
    failures = []
    if len(timed) != 3 or [k for k, _ in timed] != ["adam", "sgd", "adam"]:
        failures.append(f"host rate: timed {timed} for Adam, Adam again, SGD and Adam with "
                        "weight decay (expected Adam, SGD, Adam)")
    if rates[0] != rates[1] or not all(r is not None and r > 0 for r in rates):
        failures.append(f"host rate: {rates} (the second Adam step's should be the first's)")
    return failures


def after_eager_steps(torch, pt, device, steps):
    """SGD with momentum on the weights only, two eager steps first (which
    leave momentum_buffer=None in the state of the parameters without),
    then `steps` planned steps with the state and updates on the host: the
    parameters and momentum buffers of eager's all the way, and the planned
    state checkpoints (full_optimizer_state_dict) as eager's keys."""
    failures = []
    eager_model, planned_model, eager_opt, planned_opt, batches = twins(
        torch, device, "convnet", "sgd-momentum-weights", steps + 2, seed=3)
    loss_fn = torch.nn.functional.cross_entropy
    for model, opt in ((eager_model, eager_opt), (planned_model, planned_opt)):
        for x, y in batches[:2]:
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
    if not any(e.get("momentum_buffer", 0) is None for e in planned_opt.state.values()):
        failures.append("after eager steps: no parameter holds momentum_buffer=None")
    x0, y0 = batches[2]
    planned_opt.zero_grad(set_to_none=True)
    step = pt.train_step(planned_model, loss_fn, (x0,), y0, optimizer=planned_opt,
                         policy="dtr", budget="min", optimizer_state="host",
                         optimizer_updates="host", allow_cpu_offload=True, measure="always")
    for x, y in batches[2:]:
        eager_opt.zero_grad(set_to_none=True)
        loss_fn(eager_model(x), y).backward()
        eager_opt.step()
        planned_opt.zero_grad(set_to_none=True)
        step(x, y)
        r = step.report
        if r["measured_peak_bytes"] != r["predicted_step_peak_bytes"]:
            failures.append(f"after eager steps: measured peak {r['measured_peak_bytes']}, "
                            f"predicted {r['predicted_step_peak_bytes']}")
    for (name, a), b in zip(planned_model.named_parameters(), eager_model.parameters()):
        if not close(torch, a.detach().cpu(), b.detach().cpu()):
            failures.append(f"after eager steps: parameter {name} differs from eager's")
        buffers = [o.state[t].get("momentum_buffer")
                   for o, t in ((planned_opt, a), (eager_opt, b))]
        if (buffers[0] is None) != (buffers[1] is None) or (
                buffers[1] is not None and not close(torch, buffers[0].cpu(), buffers[1].cpu())):
            failures.append(f"after eager steps: the momentum buffer of {name} differs from "
                            "eager's")
    saved = step.full_optimizer_state_dict()["state"]
    if {i: set(e) for i, e in saved.items()} != \
            {i: set(e) for i, e in eager_opt.state_dict()["state"].items()}:
        failures.append("after eager steps: full_optimizer_state_dict()'s entries are not eager's")
    print(f"after eager steps: SGD with momentum on the weights only, {steps} planned steps "
          f"with the state and updates on the host{' FAIL' if failures else ''}", flush=True)
    return failures


def checkmate_least_peak_with_updates(torch, pt, device):
    """checkmate's plan at budget='min' peaks below its plan at 100% (the
    one-shot plan): a five-layer MLP with Adam's updates in the plan got
    the one-shot plan at 'min' (47,860 bytes: CBC's search for the lowest
    peak found nothing better in its time) where 60% gave 33,612 (until
    2026-12-06). The LP's rounding, a start of that search now, is below it
    whatever the time; how far below CBC then goes depends on the time (and
    so is not checked against 60%)."""
    nn = torch.nn
    layers = [nn.Linear(7, 13), nn.Tanh()]
    for _ in range(4):
        layers += [nn.Linear(13, 13), nn.Tanh()]
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(2, 48, 7, generator=g).to(device), torch.randn(2, 48, 1, generator=g)
    y = y.to(device)

    def peak_at(budget):
        torch.manual_seed(0)
        model = nn.Sequential(*layers, nn.Linear(13, 1)).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
        step = pt.train_step(model, nn.functional.mse_loss, (x,), y, optimizer=opt,
                             policy="checkmate", budget=budget, calibrate=False,
                             measure="never", time_limit=3)
        return step.report["predicted_peak_bytes"]
    least, whole = peak_at("min"), peak_at("100%")
    return [] if least < whole else [
        f"checkmate with Adam's updates: its plan at 'min' peaks at {least} bytes, no lower "
        f"than its plan at 100% ({whole} bytes)"]


def budgets_above_the_least_peak(torch, pt, device):
    """Every percentage budget at or above the least peak that budget='min'
    reaches fits, reported at the user's budget, and a refusal's advice fits. A decoder with dropout
    under sqrtn: its plan at 84% over the graph with the random calls'
    order tokens (the plan without them drew them out of eager's order)
    peaked above the budget, and the least-peak plan over that graph too,
    so 84% was refused although the 'min' plan (without tokens, drawn in
    order) fits it (until 2026-12-05)."""
    nn, F = torch.nn, torch.nn.functional

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(40, 16)
            layer = nn.TransformerDecoderLayer(16, 2, dim_feedforward=32, dropout=0.1,
                                               batch_first=True)
            self.dec = nn.TransformerDecoder(layer, 2)
            self.head = nn.Linear(16, 40)
            self.register_buffer("mask", torch.triu(torch.full((6, 6), float("-inf")), 1))

        def forward(self, x, memory):
            return self.head(self.dec(self.emb(x), memory, tgt_mask=self.mask))

    def loss_fn(out, y):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 40, (2, 6), generator=g).to(device)
    memory = torch.randn(2, 5, 16, generator=g).to(device)
    y = torch.randint(0, 40, (2, 6), generator=g).to(device)
    failures = []
    for policy, state in (("sqrtn", None), ("dtr", None), ("sqrtn", "host"), ("rotor", "host")):
        def step_at(budget):
            torch.manual_seed(0)
            model = Decoder().to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05, foreach=False)
            # (uncalibrated: the plans do not depend on the machine's load)
            return pt.train_step(model, loss_fn, (x, memory), y, optimizer=opt, policy=policy,
                                 budget=budget, calibrate=False, measure="never",
                                 optimizer_state=state, allow_cpu_offload=state is not None)
        least_step = step_at("min")
        least = least_step.report
        first = math.ceil(100.0 * least["predicted_step_peak_bytes"] /
                          least["budget_reference_bytes"])
        # A budget below the least peak is refused with advice that, taken,
        # fits (a random call run again included: its first advice, the
        # least peak alone, was refused in turn until 2026-12-05).
        try:
            step_at("30%")
            failures.append(f"{policy} at 30%, below its least peak ({first}%), was planned")
        except pt.PlanError as e:
            advised = re.findall(r"try budget='([0-9]+%)'", str(e))
            if not advised:
                failures.append(f"{policy} at 30%: no budget advised: {e}")
            else:
                try:
                    step_at(advised[0])
                except pt.PlanError as again:
                    failures.append(f"{policy}: the advised {advised[0]} was refused: {again}")
        # (the sweep over one capture, planned again: train_step's plans)
        for percent in range(first, 101, 2):
            try:
                report = least_step.replan(policy, budget=f"{percent}%").report
            except pt.PlanError as e:
                failures.append(f"{policy} at {percent}% (its least peak "
                                f"{least['predicted_step_peak_bytes']} bytes above the "
                                f"persistent tensors is {first}% or less): {e}")
                continue
            if report["predicted_peak_bytes"] > report["budget_bytes"] or \
                    report["budget_bytes"] < least["predicted_peak_bytes"]:
                failures.append(f"{policy} at {percent}%: predicted "
                                f"{report['predicted_peak_bytes']} against a reported budget "
                                f"of {report['budget_bytes']} (the least peak "
                                f"{least['predicted_peak_bytes']})")
    print(f"budgets above the least peak: {'FAIL' if failures else 'fit'}", flush=True)
    return failures


def percentages_under_placements(torch, pt, device):
    """A percentage budget is the same bytes under every placement of the
    optimizer that may keep it all on the device, and 100% admits eager's
    own step: under optimizer_updates='auto' with a host budget too small
    for the state, 100% was refused (its reference was the plan's baseline
    with the updates on the host, 118% of it needed; until 2026-12-06)."""
    nn = torch.nn
    x = torch.randn(16, 64, device=device)
    y = torch.randint(0, 4, (16,), device=device)
    budgets, failures = {}, []
    for options in ({}, {"optimizer_state": "auto"},
                    {"optimizer_state": "auto", "optimizer_updates": "auto"},
                    {"optimizer_state": "auto", "optimizer_updates": "auto", "host_budget": 1000}):
        torch.manual_seed(0)
        model = nn.Sequential(*[layer for _ in range(4) for layer in
                                (nn.Linear(64, 64), nn.Tanh())], nn.Linear(64, 4)).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        label = ", ".join(f"{k}={v!r}" for k, v in options.items()) or "on the device"
        try:
            step = pt.train_step(model, nn.CrossEntropyLoss(), (x,), y, optimizer=opt,
                                 policy="rotor", budget="100%", allow_cpu_offload=bool(options),
                                 **options)
            step(x, y)
            budgets[label] = step.report["budget_bytes"]
        except pt.PlanError as e:
            failures.append(f"budget 100% with {label}: {e}")
    if len(set(budgets.values())) > 1:
        failures.append(f"budget 100% is other bytes under other placements: {budgets}")
    # A budget in bytes below the parameters is advised in bytes, the least
    # peak in all, which fits (the advice was a percentage of the step above
    # the parameters, beside the bytes given, until 2026-12-06).
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    try:
        pt.train_step(model, nn.CrossEntropyLoss(), (x,), y, optimizer=opt, policy="rotor",
                      budget="1KiB")
        failures.append("a budget of 1KiB was planned")
    except pt.PlanError as e:
        advised = re.search(r"in all at least, .*: try budget=([0-9]+) or budget='min'", str(e))
        if advised is None:
            failures.append(f"a budget of 1KiB: no budget in bytes advised: {e}")
        else:
            try:
                pt.train_step(model, nn.CrossEntropyLoss(), (x,), y, optimizer=opt,
                              policy="rotor", budget=int(advised.group(1)))(x, y)
            except pt.PlanError as again:
                failures.append(f"the advised budget={advised.group(1)} was refused: {again}")
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
            failures.append(f"{'/'.join(map(str, case))}: {type(e).__name__}: {e}")
    failures += scheduled(torch, pt, device, args.steps)
    failures += streamed_parameters(torch, pt, device, args.steps)
    failures += refusals(torch, pt, device)
    failures += host_refusals(torch, pt, device)
    failures += gradients_as_eager_keeps_them(torch, pt, device)
    failures += advice_with_parameters_on_the_host(torch, pt, device)
    failures += optimizers_as_configs_make_them(torch, pt, device)
    failures += frozen_for_a_step(torch, pt, device)
    failures += failure_midstep(torch, pt, device)
    failures += failure_midstep(torch, pt, device, parameters="host")
    failures += rounded_capture(torch, pt, device)
    failures += budgets_above_the_least_peak(torch, pt, device)
    failures += percentages_under_placements(torch, pt, device)
    failures += checkmate_least_peak_with_updates(torch, pt, device)
    failures += after_eager_steps(torch, pt, device, args.steps)
    failures += host_rate_measured_once(torch, pt, device)
    for f in failures:
        print("MISMATCH:", f)
    if failures:
        return 1
    print(f"PASS: {len(CASES)} cases, {args.steps} steps each: losses, parameters and "
          "optimizer state as eager's, measured peak == predicted, state_dict loadable; "
          f"{len(STREAMED)} with the parameters on the host; "
          "unsupported optimizers refused; a failed host update leaves the module whole")
    return 0


if __name__ == "__main__":
    sys.exit(main())
