#!/usr/bin/env python3
"""pebble.torch's data parallelism (train_step(..., process_group=pg)) on
several processes of this machine, with torch.distributed's gloo backend.

    distributed_check.py [--ranks N] [--timeout S]

Each rank takes its slice of one batch. Checks, on every rank:

- gradients: after one planned step (rotor at its least peak), each
  parameter's .grad equals the gradient of single-process eager training on
  the whole batch (to 1e-5 of its largest magnitude), and the allocator's
  measured peak equals the plan's prediction; a second step without
  clearing .grad adds the next batch's averaged gradient, as DDP does; the
  ranks start from rank 0's weights, whatever each was initialised with;
  the plan all-reduces each gradient once, after its compute, on the link
  calibration measured; the same for parameters concatenated, whose
  gradients are views of one storage;
- training: five steps of SGD with momentum and of Adam with the optimizer
  in the plan (its updates on the device, and on the host; the gradients
  dropped; the parameters on the host between steps) give the
  parameters of torch.nn.parallel.DistributedDataParallel on the same slices
  (to 1e-5 relative), the measured peak the plan's; so do five Adam steps
  with DDP's 25 MiB bucket rule (buckets of several gradients, each sent
  through a flat copy that the plan holds); clipped (max_grad_norm) Adam
  and SGD steps give DDP's parameters, .grad and norm with clip_grad_norm_
  after its backward (the norm of the averaged gradients); and models whose
  gradients share a storage (parameters concatenated, w = base + delta),
  with updates on the host or placed by the plan, clipped too, train as
  eager on the whole batch;
- sharded training (shard="full", ZeRO-3), clipped too (max_grad_norm: the
  whole gradients' norm from the shards, as clip_grad_norm_ on the whole
  batch, step.grad_norm its norm): five steps of Adam and of SGD
  with momentum under FSDP's rule and under dtr at its least peak give the
  parameters of eager single-process training on the whole batch
  (step.full_state_dict() on every rank, to 1e-5 relative), with the
  allocator's measured peak equal to the plan's on every rank and step; the
  module's parameters stay empty between steps and the optimizer's state
  is this rank's shards; a model with an embedding and layer norms too,
  under hybrid and under FSDP's rule with a unit per block (fsdp-blocks);
  and with the optimizer's state shards on the host, its updates there too,
  or both where the plan chooses (ZeRO-Offload on shards): the same, the
  bytes copied as planned;
- a sharded capture of new shapes holds no rank's whole parameters, and a
  module given on the meta device is built in shards (by the allocator);
  where the capture's calibration under FSDP's rule runs out of memory, it
  runs under dtr's least-peak plan, and the step trains as eager;
- a sharded step's checkpoint (full_state_dict(), full_optimizer_state_dict())
  is eager's module and Adam state, and trains on to eager's parameters
  eagerly, sharded on 2 ranks (a subgroup where there are more) and on the
  same ranks; a rank's own state is refused where the shards differ;
- a process group of one rank runs the single process's step, no
  all-reduce planned;
- a rank whose step fails mid-step while its process lives on (before any
  collective, with collectives in flight, after the last; data parallel and
  sharded): every rank fails at once, naming it, and the group is back in
  step (an all-reduce after it sums right, a new train_step trains);
- an optimizer whose learning rate differs on one rank is refused by
  train_step and by a call, on every rank, and the step trains on once the
  rates agree;
- a wait for a collective with under a millisecond left returns at once
  (not at the group's timeout, as a timeout rounded to 0 ms would);
- a rank interrupted mid-step (KeyboardInterrupt): every rank stops at once,
  the group stays out of step, and the step and train_step refuse it;
- a rank that dies mid-step, data parallel and (in a group of its own)
  sharded: the others' step fails within the process group's timeout with
  pebble.torch's error saying a rank may have stopped, and none hangs.

With more than 2 ranks, the checks whose logic the number of ranks does not
change (the refusals, the bucket caps of shared storages, the updates'
placements beyond one each, the placements the plan chooses, the fallbacks
of messages, the failed host updates, all but one of the clipped sharded
cases, the clipped failures, the LSTM's weights read from a list, the
gradients that share a storage) run at 2 ranks only: the suite's time.

Exit 0 on success, 1 on a mismatch, 77 without torch or torch.distributed.
"""

import argparse
import contextlib
import copy
import datetime
import gc
import json
import os
import socket
import sys
import tempfile
import time
from unittest import mock

BATCH_PER_RANK = 8


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model(torch):
    nn = torch.nn
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 5))


def batches(torch, ranks, count):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(BATCH_PER_RANK * ranks, 16, generator=g),
             torch.randint(0, 5, (BATCH_PER_RANK * ranks,), generator=g)) for _ in range(count)]


def token_batches(torch, ranks, count):
    """make_token_model's batches: 6 tokens of 50 each, 5 classes."""
    g = torch.Generator().manual_seed(11)
    return [(torch.randint(0, 50, (BATCH_PER_RANK * ranks, 6), generator=g),
             torch.randint(0, 5, (BATCH_PER_RANK * ranks,), generator=g)) for _ in range(count)]


def step_beside_eager(step, whole, whole_opt, loss_fn, data, rank, what, clip=None):
    """Runs the sharded `step` on this rank's slice of each batch of `data`
    and eager training of `whole` on the whole batch (`clip`: (max_norm,
    norm_type) for clip_grad_norm_ before each update); the failures where a
    step's measured peak (the allocator's, as the profiler saw it) is not
    the plan's, or its grad_norm not eager's norm."""
    import torch
    failures = []
    for k, (x, y) in enumerate(data):
        step(mine(x, rank), mine(y, rank))
        whole_opt.zero_grad(set_to_none=True)
        loss_fn(whole(x), y).backward()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(whole.parameters(), *clip)
            if k == 0 and not norm > clip[0]:
                failures.append(f"{what}: the first step's norm {float(norm)} does not clip")
            if step.grad_norm is None or not close(step.grad_norm, norm):
                failures.append(f"{what}: step {k + 1}: grad_norm {step.grad_norm}, eager's "
                                f"{float(norm)}")
        whole_opt.step()
        r = step.report
        if r["measured_peak_bytes"] != r["predicted_step_peak_bytes"]:
            failures.append(f"{what}: step {k + 1}: measured peak {r['measured_peak_bytes']}, "
                            f"predicted {r['predicted_step_peak_bytes']}")
    return failures


def differs_from_eager(step, whole, steps, what):
    """The failures where `step`'s full parameters (gathered on every rank
    together) are not eager training's after `steps` steps."""
    full = step.full_state_dict()
    return [f"{what}: after {steps} steps, {name} differs from eager training's on the whole "
            "batch" for name, value in whole.state_dict().items() if not close(full[name], value)]


def mine(t, rank):
    return t[rank * BATCH_PER_RANK:(rank + 1) * BATCH_PER_RANK]


def close(a, b, tol=1e-5):
    scale = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) <= tol * max(scale, 1e-30)


def optimizer(torch, kind, params):
    if kind == "sgd-mixed":  # momentum on the weights only: the rest keep no buffer
        params = list(params)
        return torch.optim.SGD([{"params": [p for p in params if p.dim() >= 2],
                                 "momentum": 0.9},
                                {"params": [p for p in params if p.dim() < 2],
                                 "weight_decay": 1e-3}], lr=0.05)
    if kind == "sgd":  # two groups: the weights decayed, the rest at another lr
        params = list(params)
        return torch.optim.SGD([{"params": [p for p in params if p.dim() >= 2],
                                 "weight_decay": 1e-3},
                                {"params": [p for p in params if p.dim() < 2], "lr": 0.05}],
                               lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=1e-2, foreach=False)


def make_transposed_model(torch):
    """A linear layer read through a transposed view: its weight's gradient
    comes out transposed (not contiguous); a new .grad is a contiguous copy
    of it, as eager's, and a kept .grad has it added in as it is."""
    nn = torch.nn

    class TransposedInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.out = nn.Linear(4, 5)

        def forward(self, x):
            return self.out(x.view(-1, 4, 4).transpose(1, 2)).mean(1)

    return TransposedInput()


def check_gradients(torch, pt, dist, rank, ranks, make=make_model):
    failures = []
    torch.manual_seed(0)
    whole = make(torch)
    torch.manual_seed(rank)  # each rank its own initialisation: rank 0's must win
    model = make(torch)
    batch = batches(torch, ranks, 2)
    loss_fn = torch.nn.functional.cross_entropy
    x, y = batch[0]
    step = pt.train_step(model, loss_fn, (mine(x, rank),), mine(y, rank), policy="rotor",
                         budget="min", measure="always", process_group=dist.group.WORLD)
    for k, (x, y) in enumerate(batch):  # the second step adds to .grad
        step(mine(x, rank), mine(y, rank))
        loss_fn(whole(x), y).backward()
        for (name, p), q in zip(model.named_parameters(), whole.parameters()):
            if p.grad is None or not close(p.grad, q.grad):
                failures.append(f"step {k + 1}: gradient of {name} differs from the whole "
                                "batch's")
        r = step.report
        if r["measured_peak_bytes"] != r["predicted_step_peak_bytes"] or r["ranks"] != ranks:
            failures.append(f"step {k + 1}: measured peak {r['measured_peak_bytes']}, "
                            f"predicted {r['predicted_step_peak_bytes']}, ranks {r['ranks']}")
    failures += check_planned_reductions(step, model)
    return failures


def check_planned_reductions(step, model):
    """The plan places one all-reduce per gradient, after its compute, and
    times them on the link calibration measured."""
    failures = []
    schedule = [tuple(s[:2]) for s in step.schedule]  # a bucket's steps are triples
    reduced = [node for action, node in schedule if action == "all_reduce"]
    expected = sorted(f"grad:{name}" for name, _ in model.named_parameters())
    if sorted(reduced) != expected:
        failures.append(f"the plan all-reduces {sorted(reduced)}, not every gradient once")
    for node in reduced:
        computed = max(i for i, (a, n) in enumerate(schedule) if a == "compute" and n == node)
        if schedule.index(("all_reduce", node)) < computed:
            failures.append(f"{node} is all-reduced before its last compute")
    c = step.report.get("collectives")
    if (c is None or c["all_reduce"] != len(expected) or not c["network_measured"] or
            not c["network_bytes_per_s"] > 0 or not c["network_latency_s"] >= 0 or
            not c["predicted_network_busy_s"] > 0):
        failures.append(f"report['collectives'] is {c}")
    return failures


def check_shared_storage(torch, pt, dist, rank, ranks, buckets="auto", budget="min"):
    """Parameters concatenated: their gradients are views of one storage,
    each all-reduced once (not the storage twice), alone or both in one
    bucket (its copy holds each once; settling it frees it once)."""
    torch.manual_seed(0)
    model = make_concatenated_model(torch)
    whole = copy.deepcopy(model)
    (x, y), = batches(torch, ranks, 1)
    loss_fn = torch.nn.functional.cross_entropy
    step = pt.train_step(model, loss_fn, (mine(x, rank),), mine(y, rank), policy="rotor",
                         budget=budget, measure="always", process_group=dist.group.WORLD,
                         buckets=buckets)
    step(mine(x, rank), mine(y, rank))
    loss_fn(whole(x), y).backward()
    what = f"concatenated parameters, buckets {buckets}"
    failures = [f"{what}: gradient of {name} differs from the whole batch's"
                for (name, p), q in zip(model.named_parameters(), whole.parameters())
                if p.grad is None or not close(p.grad, q.grad)]
    r = step.report
    if r["measured_peak_bytes"] != r["predicted_step_peak_bytes"] or \
            r["counted_peak_bytes"] != r["predicted_peak_bytes"]:
        failures.append(f"{what}: measured peak {r['measured_peak_bytes']}, predicted "
                        f"{r['predicted_step_peak_bytes']}; pebble's count "
                        f"{r['counted_peak_bytes']} of the predicted {r['predicted_peak_bytes']}")
    return failures + check_planned_reductions(step, model)


def make_concatenated_model(torch):
    """Parameters read through one tensor (torch.cat): their gradients are
    two slices of one storage."""
    class Cat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.randn(3, 16) * 0.3)
            self.b = torch.nn.Parameter(torch.randn(5, 16) * 0.3)
            self.head = torch.nn.Linear(16, 5)

        def forward(self, x):
            w = torch.cat([self.a, self.b])
            return self.head(torch.tanh(x @ w.t()) @ w)
    return Cat()


def make_summed_model(torch):
    """A weight made of two parameters (w = base + delta): autograd gives
    both one gradient, the second made from the first."""
    class Summed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.base = torch.nn.Parameter(torch.randn(32, 16) * 0.2)
            self.delta = torch.nn.Parameter(torch.randn(32, 16) * 0.01)
            self.head = torch.nn.Linear(32, 5)

        def forward(self, x):
            return self.head(torch.tanh(x @ (self.base + self.delta).t()))
    return Summed()


def check_shared_gradients_trained(torch, pt, dist, rank, ranks, make, policy, kind, updates,
                                   clip=None):
    """Five steps of a model whose gradients share a storage or are made
    one from another (make_concatenated_model, make_summed_model), the
    optimizer's updates where `updates` says and early where the plan
    runs them so, clipped to `clip`: eager training's parameters on the
    whole batch, and the measured peak the plan's (until 2026-12-06 such
    steps were refused: an update ran, or copied the shared storage to the
    host, before its sibling gradient's sum; and a sibling's norm counted
    as a backward read; Note [Updates after the sums])."""
    torch.manual_seed(0)
    model = make(torch)
    whole = copy.deepcopy(model)

    def make_opt(params):
        if kind == "adam":
            return torch.optim.Adam(params, lr=1e-2, eps=1e-3, foreach=False)
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    opt, whole_opt = make_opt(model.parameters()), make_opt(whole.parameters())
    data = batches(torch, ranks, 5)
    loss_fn = torch.nn.functional.cross_entropy
    x0, y0 = data[0]
    what = (f"{type(model).__name__} ({kind}, {policy}, updates {updates}"
            + (f", clipped to {clip})" if clip is not None else ")"))
    try:
        step = pt.train_step(model, loss_fn, (mine(x0, rank),), mine(y0, rank), optimizer=opt,
                             policy=policy, budget="min", measure="always",
                             process_group=dist.group.WORLD, optimizer_updates=updates,
                             allow_cpu_offload=True, max_grad_norm=clip)
    except pt.PlanError as e:
        return [f"{what}: refused: {e}"]
    failures = []
    for k, (x, y) in enumerate(data):
        opt.zero_grad(set_to_none=True)  # (a .grad kept is added to: refused on the host)
        step(mine(x, rank), mine(y, rank))
        whole_opt.zero_grad(set_to_none=True)
        loss_fn(whole(x), y).backward()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(whole.parameters(), clip)
            if step.grad_norm is None or not close(step.grad_norm, norm):
                failures.append(f"{what}: step {k + 1}: grad_norm {step.grad_norm}, eager's "
                                f"{float(norm)}")
        whole_opt.step()
        r = step.report
        if r["measured_peak_bytes"] != r["predicted_step_peak_bytes"]:
            failures.append(f"{what}: step {k + 1}: measured peak {r['measured_peak_bytes']}, "
                            f"predicted {r['predicted_step_peak_bytes']}")
    return failures + [f"{what}: after 5 steps, {name} differs from eager training's on the "
                       "whole batch" for (name, p), q in zip(model.named_parameters(),
                                                             whole.parameters())
                       if not close(p.detach(), q.detach())]


def check_training(torch, pt, dist, rank, ranks, kind, updates, buckets="auto",
                   budget="min", gradients=None, parameters="device", clip=None,
                   policy="rotor", dtype=None):
    """Five steps with the optimizer in the plan against DDP's; `clip`: the
    gradients clipped to that norm in the plan (max_grad_norm; or
    (max_grad_norm, grad_norm_type)), and DDP's averaged ones by
    clip_grad_norm_ after its backward; `dtype`: the model's and inputs'
    (float32 by default)."""
    failures = []
    clip, norm_type = clip if isinstance(clip, tuple) else (clip, 2.0)
    what = (f"{kind}, updates on the {updates}, gradients {gradients}, parameters on the "
            f"{parameters}, buckets {buckets}" + (f", clipped to {clip} under {policy}"
                                                  if clip is not None else "")
            + (f", {dtype}" if dtype is not None else ""))
    torch.manual_seed(0)
    model = make_model(torch).to(dtype or torch.float32)
    ddp_model = copy.deepcopy(model)
    opt = optimizer(torch, kind, model.parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)
    ddp_opt = optimizer(torch, kind, ddp.parameters())
    data = [(x.to(dtype or x.dtype), y) for x, y in batches(torch, ranks, 5)]
    loss_fn = torch.nn.functional.cross_entropy
    x0, y0 = data[0]
    step = pt.train_step(model, loss_fn, (mine(x0, rank),), mine(y0, rank), optimizer=opt,
                         policy=policy, budget=budget, measure="always",
                         optimizer_updates=updates, optimizer_gradients=gradients,
                         optimizer_parameters=parameters,
                         allow_cpu_offload=updates != "device" or parameters != "device",
                         process_group=dist.group.WORLD, buckets=buckets, max_grad_norm=clip,
                         grad_norm_type=norm_type)
    for k, (x, y) in enumerate(data):
        opt.zero_grad(set_to_none=True)
        step(mine(x, rank), mine(y, rank))
        ddp_opt.zero_grad(set_to_none=True)
        loss_fn(ddp(mine(x, rank)), mine(y, rank)).backward()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), clip, norm_type)
            if k == 0 and not norm > clip:
                failures.append(f"{what}: the first step's norm {float(norm)} does not clip")
            if step.grad_norm is None or not close(step.grad_norm, norm):
                failures.append(f"{what}: step {k + 1}: grad_norm {step.grad_norm}, "
                                f"DistributedDataParallel's {float(norm)}")
        ddp_opt.step()
        r = step.report
        if r["measured_peak_bytes"] != r["predicted_step_peak_bytes"]:
            failures.append(f"{what}: step {k + 1}: measured peak {r['measured_peak_bytes']}, "
                            f"predicted {r['predicted_step_peak_bytes']}")
    for (name, p), q in zip(model.named_parameters(), ddp_model.parameters()):
        if not close(p.detach(), q.detach()):
            failures.append(f"{what}: after five steps, {name} differs from "
                            "DistributedDataParallel's")
        if clip is not None and gradients != "drop" and (p.grad is None or
                                                         not close(p.grad, q.grad)):
            failures.append(f"{what}: after five steps, {name}.grad is not "
                            "DistributedDataParallel's clipped gradient")
    c = step.report["collectives"]
    # A clipped step's all-reduces average the unclipped gradients, which the
    # clipping reads.
    if (c["clip_averages"] >= len(list(model.parameters()))) != (clip is not None) or \
            (clip is not None and c["clip_averages"] != c["all_reduce"]):
        failures.append(f"{what}: the plan's collectives are {c}")
    if buckets not in ("auto", "none") and (c["bucket_rule"] != "cap" or
                              not 0 < c["buckets"] < c["all_reduce"]):
        failures.append(f"buckets {buckets}: the plan's collectives are {c}, not buckets of "
                        "several gradients")
    return failures


def make_token_model(torch):
    """An embedding, layer norms and a residual block: gradients that are
    views (a Linear weight's is a transposed matmul), an embedding's
    scattered gradient, parameters whose sizes the ranks do not divide, and
    a one-element parameter (every rank but the first holds only padding)."""
    nn = torch.nn

    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 18)
            self.norm = nn.LayerNorm(18)
            self.mlp = nn.Sequential(nn.Linear(18, 37), nn.GELU(), nn.Linear(37, 18))
            self.head = nn.Linear(18, 5)
            self.scale = nn.Parameter(torch.full((1,), 1.5))

        def forward(self, tokens):
            h = self.norm(self.embed(tokens))
            h = h + self.mlp(h)
            return self.head(h.mean(dim=1)) * self.scale
    return Tokens()


def make_recurrent_model(torch):
    """An embedding, a two-layer LSTM (whose weights PyTorch reads from a
    list made at construction, not its attributes) and a head on its last
    step: make_token_model's batches."""
    nn = torch.nn

    class Recurrent(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 12)
            self.lstm = nn.LSTM(12, 10, num_layers=2, batch_first=True)
            self.head = nn.Linear(10, 5)

        def forward(self, tokens):
            return self.head(self.lstm(self.embed(tokens))[0][:, -1])
    return Recurrent()


def check_sharded(torch, pt, dist, rank, ranks, kind, policy, tokens=False, buckets="auto",
                  state=None, updates="device", parameters="device", clip=None, dtype=None):
    """shard="full": the parameters of eager training on the whole batch, on
    every rank, and the measured peak the plan's; with the optimizer's state,
    updates and parameter shards where `state`, `updates` and `parameters`
    say (ZeRO-Offload on shards, ZeRO-Infinity's parameters on the host);
    `clip`: (max_grad_norm, grad_norm_type), eager clipping by
    clip_grad_norm_ on the whole batch's gradients; `dtype`: the model's and
    inputs' (float32 by default; not with tokens)."""
    failures = []
    torch.manual_seed(0)
    model = (make_recurrent_model if tokens == "recurrent" else make_token_model)(torch) \
        if tokens else make_model(torch).to(dtype or torch.float32)
    whole = copy.deepcopy(model)
    def make(params):
        if kind == "adam":
            # eps well above the rounding of a summed gradient: a gradient whose
            # terms cancel to about eps is otherwise rounded (summed in another
            # order) into another normalised step.
            return torch.optim.Adam(params, lr=1e-2, eps=1e-3, foreach=False)
        return optimizer(torch, kind, params)
    opt, whole_opt = make(model.parameters()), make(whole.parameters())
    data = token_batches(torch, ranks, 5) if tokens else \
        [(x.to(dtype or x.dtype), y) for x, y in batches(torch, ranks, 5)]
    loss_fn = torch.nn.functional.cross_entropy
    x0, y0 = data[0]
    # The token model's plan takes a given link (no measurement).
    link = dict(network="ib-ndr") if tokens else {}
    offload = {} if state is None and updates == "device" and parameters == "device" else dict(
        optimizer_state=state, optimizer_updates=updates, optimizer_parameters=parameters,
        allow_cpu_offload=True)
    # (hybrid's search with the state and updates placed by the plan runs to
    # pebble's 10 s limit here, for the same plan as in 2 s)
    search = dict(time_limit=2) if policy == "hybrid" else {}
    step = pt.train_step(model, loss_fn, (mine(x0, rank),), mine(y0, rank), optimizer=opt,
                         policy=policy, budget="min", measure="always",
                         process_group=dist.group.WORLD, shard="full", buckets=buckets,
                         **link, **offload, **search,
                         **({} if clip is None else dict(max_grad_norm=clip[0],
                                                         grad_norm_type=clip[1])))
    model_kind = "" if not tokens else "tokens, " if tokens is True else "lstm, "
    what = (f"sharded, {model_kind}{kind}, {policy}, buckets {buckets}"
            + (f", state {state}, updates {updates}, parameters {parameters}" if offload else "")
            + (f", clipped to {clip[0]} ({clip[1]}-norm)" if clip else "")
            + (f", {dtype}" if dtype is not None else ""))
    failures += step_beside_eager(step, whole, whole_opt, loss_fn, data, rank, what, clip)
    if offload:
        failures += check_offloaded_shards(step, opt, model, state, updates, parameters, what)
    s = step.report["sharding"]
    # (a policy may reduce-scatter a gradient again, from the local one kept)
    if s["ranks"] != ranks or s["reduce_scatters"] < len(list(model.parameters())) or \
            s["gathers"] < len(list(model.parameters())) or \
            (policy.startswith("fsdp") and not s["regathers"] > 0) or \
            s["network_measured"] == tokens or \
            (tokens and s["network_bytes_per_s"] != 400e9 / 8):
        failures.append(f"{what}: report['sharding'] is {s}")
    # As many messages as the plan times; a unit of several parameters sends
    # its gathers, and its reduce-scatters, as one message each, and pebble's
    # plans join messages where that is faster (planned buckets of
    # collectives); fsdp's rule, and buckets="none", join none.
    alone = policy == "fsdp" or (buckets == "none" and not policy.startswith("fsdp-"))
    sent = s["gathers"] + s["reduce_scatters"] + s["norm_all_reduces"]
    if s["messages"] != s["planned_messages"] or \
            (clip is not None) != (s["norm_all_reduces"] > 0) or \
            (not alone and not s["messages"] < sent) or (alone and s["messages"] != sent):
        failures.append(f"{what}: {s['messages']} messages for {s['gathers']} gathers, "
                        f"{s['reduce_scatters']} reduce-scatters and {s['norm_all_reduces']} "
                        f"all-reduces of the norm, {s['planned_messages']} planned")
    if policy == "fsdp-blocks":
        failures += check_message_fallbacks(step, what)
    if any(p.numel() != 0 or p.grad is not None for p in model.parameters()):
        failures.append(f"{what}: the module's parameters hold memory between steps")
    for p in model.parameters():
        for key, t in opt.state[p].items():  # (1.13's SGD: momentum_buffer None without momentum)
            if key != "step" and t is not None and \
                    t.numel() != -(-whole.state_dict()[_name(model, p)].numel() // ranks):
                failures.append(f"{what}: the optimizer's {key} is {tuple(t.shape)}, not a shard")
    return failures + differs_from_eager(step, whole, len(data), what)


def check_one_plan(torch, pt, dist, rank, ranks):
    """Rank 0 alone plans, and its plan is every rank's (Note [One plan on
    every rank]): the other ranks call no planner, even for hybrid, whose
    time-limited search planned differently on ranks of different speeds
    (torchvision's mobilenet_v2 on 3 ranks); and a rank that captured
    another step (another activation, the same shapes) is refused on every
    rank, saying so."""
    from pebble import _core
    failures = []
    plans = []
    real_plan = _core.plan
    # (the capture's calibration runs FSDP's rule on every rank: deterministic)
    _core.plan = lambda *a, **k: (plans.append(1) if k.get("policy") != "fsdp" else None) or \
        real_plan(*a, **k)
    try:
        torch.manual_seed(0)
        model = make_model(torch)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = batches(torch, ranks, 1)[0]
        step = pt.train_step(model, torch.nn.functional.cross_entropy, (mine(x, rank),),
                             mine(y, rank), optimizer=opt, policy="hybrid", budget="min",
                             process_group=dist.group.WORLD, shard="full")
        step(mine(x, rank), mine(y, rank))
    finally:
        _core.plan = real_plan
    if (rank == 0) != bool(plans):
        failures.append(f"one plan: rank {rank} called the planner {len(plans)} times")
    torch.manual_seed(0)
    model = make_model(torch)
    if rank == 1:
        model[1] = torch.nn.Sigmoid()  # (Tanh on the others)
    try:
        step = pt.train_step(model, torch.nn.functional.cross_entropy, (mine(x, rank),),
                             mine(y, rank), policy="dtr", budget="min",
                             process_group=dist.group.WORLD)
        step(mine(x, rank), mine(y, rank))
        failures.append("one plan: a rank with another model was not refused")
    except pt.PlanExecutionError as e:
        if "captured another training step" not in str(e):
            failures.append(f"one plan: another model on rank 1 refused with '{e}'")
    # Before any other collective, the ranks compare their arguments: another
    # layer's shape, another option, or an argument refused on rank 1 alone
    # are refused on every rank at once, saying which (these hung until the
    # process group's timeout, or aborted in gloo on messages of other sizes).
    for change, needle in (
            # (the first tensor that differs named: a long list is compared entry by entry)
            (dict(model=lambda m: m.__setitem__(0, torch.nn.Linear(16, 40))),
             "another module's parameters and buffers (names, shapes, dtypes, requires_grad) "
             "than rank 0 (from entry 0 on: rank 0's ('0.weight', '(32, 16) float32 requires "
             "grad'); rank 1's ('0.weight', '(40, 16) float32 requires grad'))"),
            (dict(shard="full"), "another shard= than rank 0 (rank 0's: 'none'; rank 1's: "
                                 "'full')"),
            (dict(budget="90%"), "another budget= than rank 0 (rank 0's: 'min'; rank 1's: "
                                 "'90%')"),
            (dict(measure="sometimes"), "rank 1 failed, so this rank stops too: ValueError: "
                                        "measure must be"),
            (dict(shard="ful"), "rank 1 failed, so this rank stops too: ValueError: shard "
                                "must be"),
            # (said as the call's check says it, not as raw tuples)
            (dict(rows=1), "another batch shapes and layouts (inputs and target) than rank 0 "
                           f"(rank 0's: ['input 0 ({mine(x, 0).shape[0]}, 16) float32', 'target "
                           f"({mine(x, 0).shape[0]},) int64']; rank 1's: ['input 0 (1, 16) "
                           "float32', 'target (1,) int64'])"),
            # (the same shapes in another layout: refused here, where the
            # first call was, its strides unsaid, until 2026-12-06)
            (dict(strided=True), f"rank 1's: ['input 0 ({mine(x, 0).shape[0]}, 16) float32 "
                                 "with strides (32, 2) (not contiguous)'")):
        torch.manual_seed(0)
        model = make_model(torch)
        if rank == 1 and "model" in change:
            change["model"](model)
        kwargs = dict(policy="dtr", budget="min", optimizer=torch.optim.SGD(
            model.parameters(), lr=0.1), process_group=dist.group.WORLD)
        if rank == 1:
            kwargs.update({k: v for k, v in change.items()
                           if k not in ("model", "rows", "strided")})
        rows = change["rows"] if rank == 1 and "rows" in change else None
        inputs = mine(x, rank)[:rows]
        if rank == 1 and "strided" in change:
            inputs = torch.cat([inputs, inputs], 1)[:, ::2]
        started = time.perf_counter()
        try:
            pt.train_step(model, torch.nn.functional.cross_entropy, (inputs,),
                          mine(y, rank)[:rows], **kwargs)
            failures.append(f"one plan: rank 1's {sorted(change)} was not refused")
        except (pt.PlanError, ValueError) as e:
            if needle not in str(e) and not (rank == 1 and " must be " in str(e)):
                failures.append(f"one plan: rank 1's {sorted(change)} refused with '{e}'")
        if time.perf_counter() - started > 20:
            failures.append(f"one plan: rank 1's {sorted(change)} took "
                            f"{time.perf_counter() - started:.0f} s to refuse")
    return failures


def check_capture_of_shards(torch, pt, dist, rank, ranks):
    """A sharded step's capture of new shapes (trace, calibration and the
    step) holds no rank's whole parameters at once, as the allocator
    measures it: the trace takes stand-ins for them and the calibration
    runs under FSDP's rule (Note [Calibrating a sharded step])."""
    from pebble.torch._memory import AllocatorPeak
    nn = torch.nn
    torch.manual_seed(0)
    width = 256  # parameters of 2 MiB in all, far above the batch's activations
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh())
                            for _ in range(8)], nn.Linear(width, 5))
    whole = copy.deepcopy(model)
    whole_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    opt, whole_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, whole))
    loss_fn = torch.nn.functional.cross_entropy
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(ranks * n, width, generator=g),
             torch.randint(0, 5, (ranks * n,), generator=g)) for n in (2, 3)]
    step = pt.train_step(model, loss_fn, (data[0][0].chunk(ranks)[rank],),
                         data[0][1].chunk(ranks)[rank], optimizer=opt, policy="fsdp",
                         process_group=dist.group.WORLD, shard="full")
    what = "sharded capture of new shapes"
    failures = []
    for k, (x, y) in enumerate(data):
        if k == 0:
            step(x.chunk(ranks)[rank], y.chunk(ranks)[rank])
            r = step.report
            if r["measured_peak_bytes"] != r["predicted_step_peak_bytes"]:
                failures.append(f"{what}: measured peak {r['measured_peak_bytes']}, "
                                f"predicted {r['predicted_step_peak_bytes']}")
        else:
            with AllocatorPeak("cpu") as meter:  # a new capture: trace, calibration, step
                step(x.chunk(ranks)[rank], y.chunk(ranks)[rank])
        whole_opt.zero_grad(set_to_none=True)
        loss_fn(whole(x), y).backward()
        whole_opt.step()
    if step.report["shapes_planned"] != 2 or meter.source != "profiler":
        failures.append(f"{what}: {step.report['shapes_planned']} shapes planned, measured by "
                        f"{meter.source}")
    if not meter.peak_bytes < whole_bytes / 2:
        failures.append(f"{what}: the call held {meter.peak_bytes} bytes at its peak; the "
                        f"whole parameters are {whole_bytes}")
    if not step.report["calibration"].startswith("measured under FSDP's rule"):
        failures.append(f"{what}: calibration {step.report['calibration']!r}")
    return failures + differs_from_eager(step, whole, 2, what)


def check_sharded_calibration_under_plan(torch, pt, dist, rank, ranks):
    """Where a sharded capture's calibration under FSDP's rule does not fit
    the device (made to run out of memory here), it runs under dtr's
    least-peak plan of the sharded step: the report says so, each call's
    temporaries are those FSDP's rule measures, and three Adam steps give
    eager's parameters with measured peak == predicted."""
    from pebble.torch import _sharding
    what = "sharded, calibrated under dtr's plan"
    torch.manual_seed(0)
    model = make_token_model(torch)  # (calls with temporaries: the layer norm's, say)
    whole = copy.deepcopy(model)
    opt, whole_opt = (optimizer(torch, "adam", m.parameters()) for m in (model, whole))
    loss_fn = torch.nn.functional.cross_entropy
    data = token_batches(torch, ranks, 3)
    kwargs = dict(optimizer=opt, policy="dtr", budget="min", measure="always",
                  process_group=dist.group.WORLD, shard="full", network="ib-ndr")
    args = (loss_fn, (mine(data[0][0], rank),), mine(data[0][1], rank))
    twin = copy.deepcopy(model)
    normal = pt.train_step(twin, *args, **dict(kwargs, optimizer=optimizer(
        torch, "adam", twin.parameters())))
    runs = []

    class FirstRunOutOfMemory(_sharding.Program):
        def run(self, *a, **k):
            runs.append(len(self.steps))
            if len(runs) == 1:
                raise MemoryError("out of memory (FSDP's rule, in this test)")
            return super().run(*a, **k)

    with mock.patch.object(_sharding, "Program", FirstRunOutOfMemory):
        step = pt.train_step(model, *args, **kwargs)
    failures = []
    source = step.report["calibration"]
    if not source.startswith("measured under dtr's least-peak plan") or len(runs) < 2:
        failures.append(f"{what}: the report says {source!r} after {len(runs)} runs")

    def temporaries(s):
        return {n.id: n.temporary_bytes for n in s._variant.capture.nodes.nodes}
    if temporaries(step) != temporaries(normal) or not any(temporaries(step).values()):
        failures.append(f"{what}: temporaries {temporaries(step)}, under FSDP's rule "
                        f"{temporaries(normal)}")
    failures += step_beside_eager(step, whole, whole_opt, loss_fn, data, rank, what)
    return failures + differs_from_eager(step, whole, len(data), what)


def make_tied_model(torch, device=None, vocab=64, width=256, layers=8):
    """Token embedding, a body of Linear + Tanh blocks, a layer norm and a head
    tied to the embedding (its weight, no bias)."""
    nn = torch.nn

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, width, device=device)
            self.body = nn.Sequential(*[nn.Sequential(nn.Linear(width, width, device=device),
                                                      nn.Tanh()) for _ in range(layers)])
            self.ln = nn.LayerNorm(width, device=device)
            self.head = nn.Linear(width, vocab, bias=False, device=device)
            self.head.weight = self.tok.weight

        def forward(self, ids):
            return self.head(self.ln(self.body(self.tok(ids)))).flatten(0, 1)

    return Tied()


def check_built_in_shards(torch, pt, dist, rank, ranks):
    """A module given on the meta device is built a module at a time: no rank
    ever holds its whole parameters (by the allocator: the construction's
    peak is within half of them of what the rank keeps after it), the
    parameters are param_init's (rank 0's), and three SGD steps give eager
    training's parameters with measured peak == predicted. By default each
    module's reset_parameters() runs; a module without one is refused."""
    from pebble.torch._memory import CpuMemoryEvents
    nn = torch.nn
    what = "built in shards"
    failures = []
    torch.manual_seed(0)
    whole = make_tied_model(torch)
    meta = make_tied_model(torch, device="meta")
    twins = dict(zip(meta.modules(), whole.modules()))

    def init(module):  # each module's own tensors: its twin's values
        twin = twins[module]
        for key, t in list(module._parameters.items()) + list(module._buffers.items()):
            if t is not None:
                t.copy_(getattr(twin, key))

    # (SGD with momentum: Adam's normalised steps turn the rounding of the
    # deep layers' small gradients, summed in another order, into larger
    # differences than the check's tolerance)
    opt, whole_opt = (optimizer(torch, "sgd", m.parameters()) for m in (meta, whole))
    whole_bytes = sum(p.numel() * p.element_size() for p in whole.parameters())
    g = torch.Generator().manual_seed(5)
    data = [(torch.randint(0, 64, (ranks * 2, 8), generator=g),
             torch.randint(0, 64, (ranks * 2, 8), generator=g)) for _ in range(3)]
    loss_fn = torch.nn.functional.cross_entropy
    mine_of = lambda t: t.chunk(ranks)[rank]
    gc.collect()
    with CpuMemoryEvents() as events:  # (a given link: no measurement's buffers)
        step = pt.train_step(meta, loss_fn, (mine_of(data[0][0]),),
                             mine_of(data[0][1]).reshape(-1), optimizer=opt, policy="fsdp",
                             process_group=dist.group.WORLD, shard="full", param_init=init,
                             network="ib-ndr")
    level = peak = 0
    for nbytes in events.deltas:
        level += nbytes
        peak = max(peak, level)
    if not peak - level < whole_bytes / 2:
        failures.append(f"{what}: the construction held {peak} bytes at its peak and {level} "
                        f"after it; the whole parameters are {whole_bytes}")
    params = list(meta.parameters())
    if any(p.is_meta or p.numel() != 0 for p in params) or meta.head.weight is not meta.tok.weight \
            or {id(p) for group in opt.param_groups for p in group["params"]} != \
            {id(p) for p in params}:
        failures.append(f"{what}: the module's parameters are not the optimizer's, empty, on "
                        "the device, the head's tied to the embedding's")
    failures += differs_from_eager(step, whole, 0, what + " (before any step)")
    for k, (x, y) in enumerate(data):
        step(mine_of(x), mine_of(y).reshape(-1))
        r = step.report
        if r["measured_peak_bytes"] != r["predicted_step_peak_bytes"]:
            failures.append(f"{what}: step {k + 1}: measured peak {r['measured_peak_bytes']}, "
                            f"predicted {r['predicted_step_peak_bytes']}")
        whole_opt.zero_grad(set_to_none=True)
        loss_fn(whole(x), y.reshape(-1)).backward()
        whole_opt.step()
    failures += differs_from_eager(step, whole, len(data), what)
    # By default each module's reset_parameters(), rank 0's values on every
    # rank: those of the module made on rank 0's generator.
    def make_mlp(device=None):
        return nn.Sequential(nn.Linear(16, 32, device=device), nn.LayerNorm(32, device=device),
                             nn.Linear(32, 5, device=device))

    # A frozen layer given on the device takes rank 0's values too.
    torch.manual_seed(7)
    expected = {"1." + k: v for k, v in nn.Linear(5, 5).state_dict().items()}
    expected.update({"0." + k: v for k, v in make_mlp().state_dict().items()})
    x, y = torch.randn(2, 16), torch.randint(0, 5, (2,))
    torch.manual_seed(7 if rank == 0 else 100 + rank)  # other draws on the other ranks
    frozen = nn.Linear(5, 5).requires_grad_(False)  # (the meta layers draw nothing)
    model = nn.Sequential(make_mlp("meta"), frozen)
    step = pt.train_step(model, loss_fn, (x,), y, policy="fsdp",
                         optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                         process_group=dist.group.WORLD, shard="full", network="ib-ndr")
    full = step.full_state_dict()
    if any(not torch.equal(full[k], v) for k, v in expected.items()):
        failures.append(f"{what}: reset_parameters() did not give rank 0's initialisation "
                        "on every rank")
    # Refused on every rank, the module left as given (on the meta device,
    # the optimizer's parameters its own): a module without
    # reset_parameters(); one whose reset_parameters() leaves a buffer
    # unset; a param_init that fails on one rank only; a meta module not
    # sharded.
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = nn.Parameter(torch.empty(5, device="meta"))

        def forward(self, x):
            return x * self.s

    class Scaled(nn.Linear):
        def __init__(self):
            super().__init__(16, 5, device="meta")
            self.register_buffer("scale", torch.ones(5, device="meta"), persistent=False)

        def forward(self, x):
            return super().forward(x) * self.scale

    def fails_on_rank_1(module):
        if rank == 1:
            raise RuntimeError("no memory on rank 1 (on purpose)")
        module.reset_parameters()

    for model, kwargs, needle in (
            (nn.Sequential(nn.Linear(16, 5, device="meta"), Scale()), dict(shard="full"),
             "module '1' (Scale) has tensors on the meta device and no reset_parameters()"),
            (nn.Sequential(nn.Linear(16, 16, device="meta"), Scaled()), dict(shard="full"),
             "the initialisation of module '1' (Scaled) left 'scale' unset"),
            (nn.Sequential(nn.Linear(16, 16, device="meta"), nn.Linear(16, 5, device="meta")),
             dict(shard="full", param_init=fails_on_rank_1), "no memory on rank 1"),
            (nn.Linear(16, 5, device="meta"), dict(shard="none"), "only a sharded step")):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        try:
            pt.train_step(model, loss_fn, (torch.randn(2, 16),), torch.randint(0, 5, (2,)),
                          optimizer=opt, process_group=dist.group.WORLD, network="ib-ndr",
                          **kwargs)
            failures.append(f"{what}: {needle!r} was not refused")
        except ValueError as e:
            if needle not in str(e):
                failures.append(f"{what}: refused with '{e}', not '{needle}'")
        params = list(model.parameters())
        if not all(p.is_meta for p in list(model.parameters()) + list(model.buffers())) or \
                [id(p) for p in opt.param_groups[0]["params"]] != [id(p) for p in params]:
            failures.append(f"{what}: refused ({needle!r}), the module is not as given")
    # Built, then refused at its plan (a budget below any plan's peak): the
    # module and the optimizer are as given, and a step with a budget that
    # fits then trains it from param_init's values.
    inits = []

    def init(module):
        inits.append(module)
        if isinstance(module, Scaled):
            nn.Linear.reset_parameters(module)
            module.scale.fill_(2.0)
        else:
            module.reset_parameters()

    model = nn.Sequential(nn.Linear(16, 16, device="meta"), Scaled())
    given = [id(p) for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(2, 16), torch.randint(0, 5, (2,))
    try:
        pt.train_step(model, loss_fn, (x,), y, optimizer=opt, policy="dtr", budget="1KiB",
                      process_group=dist.group.WORLD, shard="full", network="ib-ndr",
                      param_init=init)
        failures.append(f"{what}: a plan over its budget was not refused")
    except pt.PlanError as e:
        if "cannot fit the training step of Sequential in 1KiB (" not in str(e) or \
                " B below the parameters and inputs)" not in str(e):
            failures.append(f"{what}: refused with '{e}', not 'cannot fit ... below'")
    if len(inits) != 2:
        failures.append(f"{what}: the refused plan came before the build ({len(inits)} inits)")
    if [id(p) for p in model.parameters()] != given or \
            not all(t.is_meta for t in list(model.parameters()) + list(model.buffers())) or \
            [id(p) for p in opt.param_groups[0]["params"]] != given or opt.state:
        failures.append(f"{what}: refused at its plan, the module is not as given")
    step = pt.train_step(model, loss_fn, (x,), y, optimizer=opt, policy="dtr", budget="min",
                         process_group=dist.group.WORLD, shard="full", network="ib-ndr",
                         param_init=init)
    step(x, y)
    full = step.full_state_dict()
    if not torch.equal(model[1].scale, torch.full((5,), 2.0)) or \
            not all(bool(torch.isfinite(v).all()) for v in full.values()):
        failures.append(f"{what}: built again after a refused plan, its tensors are not set")
    return failures


def check_shards_moving(torch, pt, dist, rank, ranks):
    """optimizer_parameters="auto": the plan at the least peak keeps the
    parameters' shards on the host between steps, one at the unplanned peak
    on the device. Steps under each in turn (replan() shares the shards and
    the optimizer) move the shards, and the optimizer's state, where each
    plan keeps them (Shards.place), and give eager's parameters; each
    step's measured peak is its plan's. (On the CPU a shard's move is a
    copy in the same memory: what this sees there is the bookkeeping and
    the numbers; beside a GPU, the move itself.)"""
    what = "sharded, parameters auto, plans alternated"
    failures = []
    torch.manual_seed(0)
    model = make_model(torch)
    whole = copy.deepcopy(model)
    opt, whole_opt = (optimizer(torch, "adam", m.parameters()) for m in (model, whole))
    loss_fn = torch.nn.functional.cross_entropy
    data = batches(torch, ranks, 4)
    x0, y0 = data[0]
    tight = pt.train_step(model, loss_fn, (mine(x0, rank),), mine(y0, rank), optimizer=opt,
                          policy="dtr", budget="min", measure="always",
                          process_group=dist.group.WORLD, shard="full",
                          optimizer_state="auto", optimizer_updates="auto",
                          optimizer_parameters="auto", allow_cpu_offload=True)
    loose = tight.replan(policy="baseline", budget="100%")
    on_host = []
    for k, (x, y) in enumerate(data):
        step = (tight, loose)[k % 2]
        failures += step_beside_eager(step, whole, whole_opt, loss_fn, [(x, y)], rank,
                                      f"{what} (step {k + 1})")
        on_host.append(step.report["sharding"]["shards_on_host"])
        if on_host[-1] != len(step.shards.on_host):
            failures.append(f"{what}: step {k + 1} reports {on_host[-1]} shards on the host, "
                            f"{len(step.shards.on_host)} are there")
    if on_host[0] == 0 or on_host[1] != 0:
        failures.append(f"{what}: shards on the host at each step {on_host}: the least peak's "
                        "plan keeps none there, or the unplanned one does (nothing moves)")
    return failures + differs_from_eager(loose, whole, len(data), what)


def sharded_beside_eager(torch, pt, dist, rank, ranks, make_optimizer, count, policy):
    """(model, whole, opt, whole_opt, loss_fn, data, step): make_model's
    module sharded over the ranks by a step of `policy` at min with
    make_optimizer's optimizer, its twin trained whole in one process with
    its own, and `count` batches of the whole."""
    torch.manual_seed(0)
    model = make_model(torch)
    whole = copy.deepcopy(model)
    opt, whole_opt = make_optimizer(model.parameters()), make_optimizer(whole.parameters())
    loss_fn = torch.nn.functional.cross_entropy
    data = batches(torch, ranks, count)
    step = pt.train_step(model, loss_fn, (mine(data[0][0], rank),), mine(data[0][1], rank),
                         optimizer=opt, policy=policy, budget="min",
                         process_group=dist.group.WORLD, shard="full")
    return model, whole, opt, whole_opt, loss_fn, data, step


def check_sharded_checkpoint(torch, pt, dist, rank, ranks):
    """A sharded step's checkpoint, full_state_dict() and
    full_optimizer_state_dict() (on every rank), is eager training's module
    and Adam state (whole, on the CPU) and loads into torch.optim's optimizer
    of the whole module, which trains on to eager's parameters; loaded on
    every rank of a sharded step over another number of ranks (2: a subgroup
    where there are more), rank 0's is cut into the new shards and trains on
    to eager's parameters after five steps; so does a step on the same ranks
    given it, or a rank's own optimizer.state_dict() (its shards), after it
    was made. A rank's own state, loaded where the shards differ, is refused,
    naming the way."""
    what = "sharded checkpoint"
    failures = []
    def make(params):
        return torch.optim.Adam(params, lr=1e-2, eps=1e-3, foreach=False)
    model, whole, opt, whole_opt, loss_fn, data, step = sharded_beside_eager(
        torch, pt, dist, rank, ranks, make, 5, "fsdp")
    failures += step_beside_eager(step, whole, whole_opt, loss_fn, data[:2], rank, what)
    saved_model, saved_opt = step.full_state_dict(), step.full_optimizer_state_dict()
    own = opt.state_dict()  # this rank's shards
    for i, p in enumerate(whole.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            got = saved_opt["state"][i][key]
            want = whole_opt.state[p][key]
            if got.device.type != "cpu" or got.shape != want.shape or not close(got, want):
                failures.append(f"{what}: the saved {key} of parameter {i} is not eager's "
                                f"(on {got.device})")
    # torch.optim's optimizer of the whole module takes it and trains on.
    eager = make_model(torch)
    eager.load_state_dict(saved_model)
    eager_opt = make(eager.parameters())
    eager_opt.load_state_dict(saved_opt)
    for x, y in data[2:]:
        for m, o in ((eager, eager_opt), (whole, whole_opt)):
            o.zero_grad(set_to_none=True)
            loss_fn(m(x), y).backward()
            o.step()
    failures += [f"{what}: eager training resumed from it: {name} differs"
                 for name, value in whole.state_dict().items()
                 if not close(eager.state_dict()[name], value)]
    # Resumed on 2 ranks, each taking half of each batch.
    group = dist.group.WORLD if ranks == 2 else dist.new_group([0, 1])
    if rank < 2:
        def half(t):
            return t[rank * len(t) // 2:(rank + 1) * len(t) // 2]
        resumed = make_model(torch)
        resumed.load_state_dict(saved_model)
        resumed_opt = make(resumed.parameters())
        resumed_opt.load_state_dict(saved_opt)
        if rank == 1:  # (rank 0's whole state is taken, as its weights are)
            next(iter(resumed_opt.state.values()))["exp_avg"].add_(1.0)
        again = pt.train_step(resumed, loss_fn, (half(data[2][0]),), half(data[2][1]),
                              optimizer=resumed_opt, policy="dtr", budget="min",
                              process_group=group, shard="full")
        for x, y in data[2:]:
            again(half(x), half(y))
        failures += differs_from_eager(again, whole, len(data), f"{what}, resumed on 2 ranks")
        if ranks > 2:
            failures += _refused_state(torch, pt, own, make, lambda m, o: pt.train_step(
                m, loss_fn, (half(data[2][0]),), half(data[2][1]), optimizer=o,
                policy="dtr", budget="min", process_group=group, shard="full"),
                f"{what}: a rank's own state on 2 ranks, saved on {ranks}")
    # Loaded after the step is made, on the same ranks: a rank's own shards
    # are taken, a whole state cut at the next call (or saved at once); a
    # state of other shards, loaded first, is refused at the call, which
    # leaves the step as it was.
    for state, kind in ((own, "its own shards"), (saved_opt, "whole")):
        later = make_model(torch)
        later.load_state_dict(saved_model)
        later_opt = make(later.parameters())
        step = pt.train_step(later, loss_fn, (mine(data[2][0], rank),), mine(data[2][1], rank),
                             optimizer=later_opt, policy="fsdp", budget="min",
                             process_group=dist.group.WORLD, shard="full")
        kind = f"{what}, {kind} loaded after the step was made"
        if state is saved_opt:
            later_opt.load_state_dict(other_shards(torch, own, ranks + 1))
            failures += _refused_state(torch, pt, None, None, lambda m, o: step(
                mine(data[2][0], rank), mine(data[2][1], rank)), f"{kind}: other shards first")
        later_opt.load_state_dict(state)
        if state is saved_opt:
            again = step.full_optimizer_state_dict()["state"]
            if any(again[i]["exp_avg"].shape != p.shape for i, p in enumerate(whole.parameters())):
                failures.append(f"{kind}: full_optimizer_state_dict() before a call is not whole")
        for x, y in data[2:]:
            step(mine(x, rank), mine(y, rank))
        failures += differs_from_eager(step, whole, len(data), kind)
    # (an unsharded step refuses it at its first call)
    failures += _refused_state(torch, pt, own, make, lambda m, o: pt.train_step(
        m, loss_fn, (data[2][0],), data[2][1], optimizer=o, policy="dtr")(
        data[2][0], data[2][1]), f"{what}: a rank's own state in an unsharded step")
    return failures


def other_shards(torch, saved, ranks):
    """An optimizer's state_dict `saved` with each tensor of Adam's moments as
    this rank's shard over `ranks` would be (its first elements)."""
    out = copy.deepcopy(saved)
    for entry in out["state"].values():
        for key in ("exp_avg", "exp_avg_sq"):
            t = entry[key].reshape(-1)
            entry[key] = t[:-(-t.numel() // ranks)].clone()
    return out


def _refused_state(torch, pt, state, make, stepped, what):
    """The failures where stepped(module, optimizer) with `state` loaded into
    the optimizer is not refused by a message naming
    full_optimizer_state_dict() (state None: stepped(None, None) as it is)."""
    model = opt = None
    if state is not None:
        model = make_model(torch)
        opt = make(model.parameters())
        opt.load_state_dict(state)
    try:
        stepped(model, opt)
    except (pt.OptimizerError, pt.PlanExecutionError) as e:
        return [] if "full_optimizer_state_dict()" in str(e) else [f"{what}: refused with {e}"]
    return [f"{what}: not refused"]


def check_offloaded_shards(step, opt, model, state, updates, parameters, what):
    """The plan's placement of the sharded state, updates and parameter
    shards, as asked, and the bytes moved as planned."""
    failures = []
    r = step.report
    on_host = r["sharding"]["shards_on_host"]
    expected = {"host": len(list(model.parameters())), "device": 0}.get(parameters, on_host)
    if on_host != expected:
        failures.append(f"{what}: {on_host} parameter shards on the host between steps")
    placed, ran = r["optimizer_state"], r["optimizer_updates"]
    # (Adam's step count stays where torch.optim keeps it: a tensor of its own)
    # (and 1.13's SGD keeps momentum_buffer=None without momentum: no tensor)
    tensors = sum(1 for p in model.parameters() for key, t in opt.state[p].items()
                  if key != "step" and t is not None)
    if state == "host" and placed["host_tensors"] < tensors:
        failures.append(f"{what}: the state's home is the host, but {placed}")
    if state == "auto" and not placed["host_tensors"] > 0:  # (at the least peak)
        failures.append(f"{what}: the plan keeps all the state on the device: {placed}")
    if state == "device" and placed["resident_tensors"] < tensors:
        failures.append(f"{what}: the state's home is the device, but {placed}")
    if state == "device" and updates == "host" and \
            not step._variant.placement.offloaded_device_state:
        failures.append(f"{what}: the plan moves no state whose home is the device")
    if updates == "host" and (ran["device_parameters"] != 0 or
                              ran["host_parameters"] != len(list(model.parameters()))):
        failures.append(f"{what}: updates on the host, but {ran}")
    if updates == "host" and not r["predicted_transfer_bytes"] > 0:
        failures.append(f"{what}: updates on the host move nothing: {r}")
    if r["transfer_bytes"] != r["predicted_transfer_bytes"]:
        failures.append(f"{what}: moved {r['transfer_bytes']} bytes, the plan "
                        f"{r['predicted_transfer_bytes']}")
    if r["measured_host_peak_bytes"] != r["host_peak_bytes"]:
        failures.append(f"{what}: {r['measured_host_peak_bytes']} bytes of host copies, the "
                        f"plan's host peak {r['host_peak_bytes']}")
    return failures


def check_message_fallbacks(step, what):
    """pebble.torch sends a bucket of collectives whole only where that keeps
    the plan's memory: the runner's choice (ShardedRunner._messages) on the
    step's own schedule, then on it changed so that a bucket of gathers is
    freed apart (a compute between two of its frees) and a bucket of
    reduce-scatters holds every gradient (past the staging buffer), and with
    a member of another dtype."""
    failures = []
    variant = step._variant
    runner = variant.program.foreign
    schedule = [tuple(s) for s in variant.shards.translate(variant.plan.schedule)]
    if runner._messages(schedule) != runner.messages:
        failures.append(f"{what}: the runner's messages are not its schedule's")
    sent = [m for m in runner.messages["gather"] if len(m) > 1]
    if not sent or not any(len(m) > 1 for m in runner.messages["scatter"]):
        return failures + [f"{what}: no bucket of gathers and of reduce-scatters sent whole"]
    # The first bucket of gathers freed apart: a compute moved between its frees.
    members = sent[0]
    frees = [i for i, s in enumerate(schedule) if s[0] == "free" and
             s[1] in {"gather:" + m for m in members}]
    first_compute = next(i for i, s in enumerate(schedule) if s[0] == "compute" and
                         i > frees[0] and not s[1].startswith(("gather:", "scatter:")))
    apart = list(schedule)
    apart.insert(frees[0] + 1, apart.pop(first_compute))
    if runner._messages(apart)["gather"][0] != (members[0],):
        failures.append(f"{what}: a bucket of gathers freed apart is sent whole")
    # Every reduce-scatter in one bucket: more than the staging buffer holds.
    scatters = [s for s in schedule if s[0] == "compute" and s[1].startswith("scatter:")]
    rest = [s for s in schedule if s not in scatters]
    one = rest[:len(rest) // 2] + [(a, n, 99) for a, n, *_ in scatters] + rest[len(rest) // 2:]
    if any(len(m) > 1 for m in runner._messages(one)["scatter"]):
        failures.append(f"{what}: a bucket of reduce-scatters past the staging buffer is sent "
                        "whole")
    # A bucket of two dtypes (one member's shard made float64 for the
    # question): one buffer holds one dtype, so member by member.
    shards = runner.shards.shards
    for kind in ("gather", "scatter"):
        member = next(m for m in runner.messages[kind] if len(m) > 1)[0]
        saved = shards[member]
        shards[member] = saved.double()
        try:
            if any(len(m) > 1 and member in m for m in runner._messages(schedule)[kind]):
                failures.append(f"{what}: a bucket of {kind}s of two dtypes is sent whole")
        finally:
            shards[member] = saved
    return failures


def gathers_freed_apart(graph, options):
    """A policy of "elsewhere" (pebble.register_policy): FSDP's rule with a
    unit per block, but the first compute after the first bucket of gathers
    moved between that bucket's frees, so that its gathered parameters are
    freed apart (pebble's planners never do that)."""
    import pebble
    planned = pebble.plan(graph, policy="fsdp-blocks", budget="min")
    steps = [{"action": a, "node": n, **({"bucket": b[0]} if b else {})}
             for a, n, *b in planned.schedule]
    first = next(i for i, s in enumerate(steps)
                 if "bucket" in s and s["node"].startswith("gather:"))
    members = {s["node"] for s in steps[first:] if s.get("bucket") == steps[first]["bucket"]}
    frees = [i for i, s in enumerate(steps) if i > first and s["action"] == "free" and
             s["node"] in members]
    moved = next(i for i, s in enumerate(steps) if i > frees[0] and s["action"] == "compute"
                 and not s["node"].startswith(("gather:", "grad:")))
    steps.insert(frees[0] + 1, steps.pop(moved))
    return {"format": "pebble-schedule", "version": 1, "steps": steps}


def check_writes_between_sharded_steps(torch, pt, dist, rank, ranks):
    """Note [Writes between sharded steps]: a weight clamped and a bias zeroed
    between steps inside step.whole_parameters() train on as eager's with
    the same writes (three SGD steps); the same writes on the module's empty
    stand-ins outside it are refused at the next call on every rank, naming
    the parameter (they were dropped without a word until 2026-12-07), and
    the step then runs on without them."""
    what = "writes between sharded steps"
    failures = []
    def make(params):
        return torch.optim.SGD(params, lr=0.5, momentum=0.9)
    model, whole, opt, whole_opt, loss_fn, data, step = sharded_beside_eager(
        torch, pt, dist, rank, ranks, make, 3, "dtr")

    def write(module):
        with torch.no_grad():
            module[0].weight.clamp_(-0.05, 0.05)
            torch.nn.init.zeros_(module[4].bias)
    for k, batch in enumerate(data):
        failures += step_beside_eager(step, whole, whole_opt, loss_fn, [batch], rank, what)
        with step.whole_parameters() as module:
            write(module)
        write(whole)
    failures += differs_from_eager(step, whole, len(data), what)
    write(model)  # on the stand-ins: refused at the next call, on every rank
    try:
        step(mine(data[0][0], rank), mine(data[0][1], rank))
        failures.append(f"{what}: a write on the stand-ins was not refused")
    except ValueError as e:
        if "parameter '0.weight' was written between steps" not in str(e) or \
                "step.whole_parameters()" not in str(e):
            failures.append(f"{what}: the refusal: {e}")
    before = step.full_state_dict()
    step(mine(data[0][0], rank), mine(data[0][1], rank))  # (runs on, without the write)
    if close(step.full_state_dict()["0.weight"], before["0.weight"]):
        failures.append(f"{what}: the step after the refusal did not train")
    return failures


def check_gathers_freed_apart(torch, pt, dist, rank, ranks):
    """A plan that frees a bucket's gathers apart runs member by member (its
    memory, not its time: more messages than it plans), with eager's
    parameters on the whole batch and measured peak == predicted."""
    import pebble
    failures = []
    torch.manual_seed(0)
    model = make_token_model(torch)
    whole = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-3, foreach=False)
    whole_opt = torch.optim.Adam(whole.parameters(), lr=1e-2, eps=1e-3, foreach=False)
    data = token_batches(torch, ranks, 3)
    loss_fn = torch.nn.functional.cross_entropy
    what = "gathers freed apart"
    pebble.register_policy("gathers-freed-apart", gathers_freed_apart)
    try:
        x0, y0 = data[0]
        step = pt.train_step(model, loss_fn, (mine(x0, rank),), mine(y0, rank), optimizer=opt,
                             policy="gathers-freed-apart", budget="min", measure="always",
                             process_group=dist.group.WORLD, shard="full", network="ib-ndr")
        failures += step_beside_eager(step, whole, whole_opt, loss_fn, data, rank, what)
    finally:
        pebble.unregister_policy("gathers-freed-apart")
    s = step.report["sharding"]
    if not s["planned_messages"] < s["messages"] < s["gathers"] + s["reduce_scatters"]:
        failures.append(f"{what}: {s['messages']} messages sent for {s['planned_messages']} "
                        "planned")
    return failures + differs_from_eager(step, whole, len(data), what)


def check_sharded_failure(torch, pt, dist, rank, ranks):
    """A sharded step that cannot be planned, or whose optimizer holds a state
    that is neither whole nor this rank's shards (saved on another number of
    ranks), leaves the module whole, and a new one trains it; one step's module cannot be sharded by another; full_state_dict()
    called on one rank alone fails on every rank, which stay in step."""
    failures = []
    torch.manual_seed(0)
    model = make_model(torch)
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    (x, y), = batches(torch, ranks, 1)
    loss_fn = torch.nn.functional.cross_entropy
    args = (model, loss_fn, (mine(x, rank),), mine(y, rank))
    kwargs = dict(optimizer=opt, policy="dtr", process_group=dist.group.WORLD, shard="full")
    try:
        pt.train_step(*args, budget="1%", **kwargs)
        failures.append("sharded: a budget of 1% was planned")
    except pt.PlanError:
        pass
    after = model.state_dict()
    if any(not torch.equal(v, after[k]) for k, v in before.items()):
        failures.append("sharded: a train_step that could not plan left the module changed")
    loss_fn(model(x), y).backward()  # an eager step: a momentum buffer of the whole
    opt.step()
    opt.zero_grad(set_to_none=True)
    for state in opt.state.values():  # as a shard over one rank more would be
        whole = state["momentum_buffer"]
        state["momentum_buffer"] = whole.reshape(-1)[:-(-whole.numel() // (ranks + 1))].clone()
    before = copy.deepcopy(model.state_dict())
    try:
        pt.train_step(*args, budget="min", **kwargs)
        failures.append("sharded: an optimizer state of other shards was taken")
    except (pt.OptimizerError, pt.PlanError) as e:
        if "momentum_buffer" not in str(e) or "full_optimizer_state_dict()" not in str(e):
            failures.append(f"sharded, a state of other shards: refused with '{e}'")
    after = model.state_dict()
    if any(not torch.equal(v, after[k]) for k, v in before.items()):
        failures.append("sharded: a train_step refusing the state left the module changed")
    opt.state.clear()
    step = pt.train_step(*args, budget="min", **kwargs)
    step(mine(x, rank), mine(y, rank))
    alone = None
    try:  # rank 0 gathers while the others step: every rank fails, the ranks stay in step
        alone = step.full_state_dict() if rank == 0 else step(mine(x, rank), mine(y, rank))
    except pt.PlanExecutionError as e:
        label = step.collectives.label
        if f"calls {label} where rank 0 calls {label}'s full_state_dict()" not in str(e):
            failures.append(f"sharded: full_state_dict() on one rank alone: '{e}'")
    if alone is not None:
        failures.append("sharded: full_state_dict() on one rank alone did not fail")
    if set(step.full_state_dict()) != set(before):
        failures.append("sharded: full_state_dict() after a refused call differs")
    # full_state_dict() failing on the last rank alone, after its gathers
    # (out of memory for the copies): every rank fails, the step goes on.
    def out_of_memory(*args, **kwargs):
        raise MemoryError("an injected failure of the copies")
    try:
        with mock.patch.object(model, "state_dict", out_of_memory) if rank == ranks - 1 else \
                contextlib.nullcontext():
            step.full_state_dict()
        failures.append(f"sharded: full_state_dict() failing on rank {ranks - 1} passed")
    except (MemoryError, pt.PlanExecutionError) as e:
        if "injected" not in str(e):
            failures.append(f"sharded: full_state_dict() failing on the last rank: '{e}'")
    # The next step and gather go on, with waits long enough to read the
    # board (a failed round's posts must not be read again).
    from pebble.torch import _executor
    compute = _executor._RunState.compute

    def slow_on_rank_0(state, i, node):
        if rank == 0 and i < 3:
            time.sleep(0.3)
        return compute(state, i, node)
    try:
        with mock.patch.object(_executor._RunState, "compute", slow_on_rank_0):
            step(mine(x, rank), mine(y, rank))
            if set(step.full_state_dict()) != set(before):
                failures.append("sharded: full_state_dict() after a failed one differs")
    except (RuntimeError, pt.PlanExecutionError) as e:
        failures.append(f"sharded: a step after a failed full_state_dict() failed: '{e}'")
    try:
        pt.train_step(*args, budget="min", **kwargs)
        failures.append("sharded: a module sharded already was sharded again")
    except ValueError as e:
        if "another train_step shards" not in str(e):
            failures.append(f"sharded again: refused with '{e}'")
    return failures


def check_failed_host_update(torch, pt, dist, rank, ranks, parameters="device"):
    """A sharded step whose update on the host fails (on every rank alike)
    fails on every rank, and the shards that the plan had freed for their
    updates are back on the device, fetched from their host copies; with
    `parameters` "host", every shard is still its host copy."""
    from pebble.torch import _optimizer
    failures = []
    torch.manual_seed(0)
    model = make_model(torch)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
    (x, y), = batches(torch, ranks, 1)
    step = pt.train_step(model, torch.nn.functional.cross_entropy, (mine(x, rank),),
                         mine(y, rank), optimizer=opt, policy="dtr", budget="min",
                         process_group=dist.group.WORLD, shard="full",
                         optimizer_updates="host", optimizer_parameters=parameters,
                         allow_cpu_offload=True)
    what = f"sharded, updates on the host, parameters on the {parameters}"
    real, calls, away = _optimizer._update, [], []

    def failing(*args):
        calls.append(args[0])
        if calls.count("adam_update") == 2:  # the second parameter's, its shard freed for it
            away.extend(n for n, t in step.shards.shards.items() if t is None)
            raise RuntimeError("an injected failure of an update on the host")
        return real(*args)
    _optimizer._update = failing
    try:
        step(mine(x, rank), mine(y, rank))
        failures.append(f"{what}: a failing update did not fail the step")
    except RuntimeError as e:
        if "injected" not in str(e):
            failures.append(f"{what}: the step failed with '{e}'")
    finally:
        _optimizer._update = real
    if parameters == "device" and not away:
        failures.append(f"{what}: no shard was off the device when the "
                        "update failed (the check checks nothing)")
    if parameters == "host" and step.shards.on_host != set(step.shards.shards):
        failures.append(f"{what}: after the failed step only {sorted(step.shards.on_host)} "
                        "of the shards live on the host")
    for name, shard in step.shards.shards.items():
        if shard is None or shard.numel() != step.shards.shard_numel(name):
            failures.append(f"{what}: after the failed step the shard of "
                            f"'{name}' is {None if shard is None else tuple(shard.shape)}")
    try:
        step(mine(x, rank), mine(y, rank))
        failures.append(f"{what}: a step after the failed one ran")
    except pt.PlanExecutionError:
        pass
    return failures


def _name(model, param):
    return next(n for n, p in model.named_parameters() if p is param)


def check_live_failure(torch, pt, dist, rank, ranks, shard, where, replanned=False,
                       clip=None):
    """The last rank's run fails and its process lives on (docs/torch.md, "A
    rank that fails mid-step"), `where`: before the plan runs ("before"), at
    its first compute ("forward", before any collective), at the first
    compute after its first all-reduce or reduce-scatter ("backward",
    collectives in flight) or after its last step ("end", every collective
    started); or every rank fails, each at another compute of the backward
    ("every"). `replanned`: the step is a replan() of the first. Every rank
    fails at once, its own error or one naming the rank that failed; the
    group is back in step; the step refuses further calls, on every rank;
    and, data parallel, a new train_step trains on the same group. `clip`:
    the step clips (max_grad_norm), its first collectives the gradients'
    averages."""
    import pebble.torch
    from pebble.torch import _executor
    what = (f"a live rank failing {where}{' (sharded)' if shard == 'full' else ''}"
            f"{' (replanned)' if replanned else ''}{' (clipped)' if clip else ''}")
    failures = []
    torch.manual_seed(0)
    model = make_model(torch)
    (x, y), = batches(torch, ranks, 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    kwargs = dict(shard=shard, policy="fsdp" if shard == "full" else "rotor", budget="min",
                  optimizer=opt, process_group=dist.group.WORLD)
    step = pt.train_step(model, torch.nn.functional.cross_entropy, (mine(x, rank),),
                         mine(y, rank), max_grad_norm=clip, **kwargs)
    step(mine(x, rank), mine(y, rank))
    first = step
    if replanned:
        step = step.replan(policy="dtr", budget="min")
        step(mine(x, rank), mine(y, rank))
    opt.zero_grad(set_to_none=True)  # (the same signature: no capture below)
    steps = step._variant.program.steps
    started = [i for i, (kind, node) in enumerate(steps)
               if kind == _executor.REDUCE or (kind == _executor.FOREIGN and
                                               node[0] == "compute" and
                                               node[1].startswith("scatter:"))]
    computes = [i for i, (kind, _) in enumerate(steps) if kind == _executor.COMPUTE]
    later = [i for i in computes if i > started[0]]
    target = computes[0] if where == "forward" else later[rank if where == "every" else 0]
    failing = where == "every" or rank == ranks - 1
    compute, finish = _executor._RunState.compute, _executor._RunState.finish
    run_step = pebble.torch._Variant._run_step

    def injected():
        return RuntimeError("an injected failure of a kernel")

    def compute_or_fail(state, i, node):
        if failing and where in ("forward", "backward", "every") and i == target:
            raise injected()
        return compute(state, i, node)

    def finish_and_fail(state):
        finish(state)
        if failing and where == "end":
            raise injected()

    def run_step_or_fail(variant, persistent):
        if failing and where == "before":
            raise injected()
        return run_step(variant, persistent)
    start = time.monotonic()
    try:
        with mock.patch.object(_executor._RunState, "compute", compute_or_fail), \
                mock.patch.object(_executor._RunState, "finish", finish_and_fail), \
                mock.patch.object(pebble.torch._Variant, "_run_step", run_step_or_fail):
            step(mine(x, rank), mine(y, rank))
        failures.append(f"{what}: the step did not fail on rank {rank}")
    except (RuntimeError, pt.PlanExecutionError) as e:
        expected = ("an injected failure" if failing else
                    f"rank {ranks - 1} failed mid-step, so this rank stops too (the ranks' "
                    "collectives are back in step)")
        if expected not in str(e) or "injected" not in str(e):
            failures.append(f"{what}: rank {rank} failed with '{e}'")
    elapsed = time.monotonic() - start
    if elapsed > 20:  # the group's timeout is minutes
        failures.append(f"{what}: rank {rank} took {elapsed:.1f} s to fail")
    t = torch.full((3,), float(rank + 1))
    try:  # a group out of step would pair this with a collective of the failed step
        dist.all_reduce(t, async_op=True).wait(datetime.timedelta(seconds=20))
        if not torch.equal(t, torch.full((3,), ranks * (ranks + 1) / 2)):
            failures.append(f"{what}: an all-reduce after it sums to {t.tolist()}")
    except RuntimeError as e:
        failures.append(f"{what}: an all-reduce after it failed: {e}")
    opt.zero_grad(set_to_none=True)
    for refusing in (step, first) if replanned else (step,):  # (one module, one fate)
        try:
            refusing(mine(x, rank), mine(y, rank))
            failures.append(f"{what}: the failed step took another call")
        except pt.PlanExecutionError as e:
            if "an earlier step failed" not in str(e) or \
                    not (failing or f"rank {ranks - 1} failed" in str(e)):
                failures.append(f"{what}: the next call was refused with '{e}'")
    if shard == "none":
        failures += recovered_on_same_group(torch, pt, dist, rank, ranks, model, opt, (x, y),
                                            kwargs, what)
    return failures


def recovered_on_same_group(torch, pt, dist, rank, ranks, model, opt, batch, kwargs, what):
    """After a failed data-parallel step: a new train_step with the same
    optimizer, its state made to differ on the last rank, takes rank 0's
    weights and state, and trains the same parameters on every rank; made
    while some rank holds gradients and others not, it is refused naming
    them."""
    failures = []
    x, y = batch
    args = (model, torch.nn.functional.cross_entropy, (mine(x, rank),), mine(y, rank))
    if rank == 0:
        model[0].weight.grad = torch.zeros_like(model[0].weight)
    try:
        pt.train_step(*args, **kwargs)
        failures.append(f"{what}: gradients held on rank 0 alone were not refused")
    except pt.PlanError as e:
        if "gradients held" not in str(e):
            failures.append(f"{what}: gradients held on rank 0 alone: '{e}'")
    opt.zero_grad(set_to_none=True)
    if rank == ranks - 1:
        with torch.no_grad():
            for state in opt.state.values():
                state["exp_avg"].add_(1.0)
    again = pt.train_step(*args, **kwargs)
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    for _ in range(2):
        again(mine(x, rank), mine(y, rank))
        opt.zero_grad(set_to_none=True)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()] +
                     [s["exp_avg"].flatten() for s in opt.state.values()])
    every = [torch.empty_like(flat) for _ in range(ranks)]
    dist.all_gather(every, flat)
    if torch.equal(flat[:before.numel()], before) or \
            any(not torch.equal(o, every[0]) for o in every):
        failures.append(f"{what}: a new train_step with the same optimizer did not train the "
                        "same parameters and state on every rank")
    return failures


def check_interrupt(torch, pt, dist, rank, ranks):
    """The last rank is interrupted (KeyboardInterrupt) mid-step, in a group
    of its own, and lives on: every rank stops within seconds, saying that
    the group's collectives stay out of step; the step then refuses its
    calls and train_step the group, on each rank alone, at once."""
    failures = []
    from pebble.torch import _executor
    group = dist.new_group(list(range(ranks)))
    torch.manual_seed(0)
    model = make_model(torch)
    (x, y), = batches(torch, ranks, 1)
    args = (model, torch.nn.functional.cross_entropy, (mine(x, rank),), mine(y, rank))
    step = pt.train_step(*args, policy="rotor", budget="min", process_group=group)
    other = pt.train_step(*args, policy="dtr", budget="min", process_group=group)
    step(mine(x, rank), mine(y, rank))
    for p in model.parameters():
        p.grad = None
    steps = step._variant.program.steps
    first = next(i for i, (kind, _) in enumerate(steps) if kind == _executor.REDUCE)
    target = next(i for i, (kind, _) in enumerate(steps) if kind == _executor.COMPUTE and
                  i > first)
    compute = _executor._RunState.compute

    def compute_or_interrupt(state, i, node):
        if rank == ranks - 1 and i == target:
            raise KeyboardInterrupt()
        return compute(state, i, node)
    start = time.monotonic()
    try:
        with mock.patch.object(_executor._RunState, "compute", compute_or_interrupt):
            step(mine(x, rank), mine(y, rank))
        failures.append(f"interrupted: rank {rank} stepped")
    except KeyboardInterrupt:
        if rank != ranks - 1:
            failures.append(f"interrupted: rank {rank} got the interrupt")
    except pt.PlanExecutionError as e:
        if "out of step" not in str(e):
            failures.append(f"interrupted: rank {rank} failed with '{e}'")
    if time.monotonic() - start > 20:
        failures.append(f"interrupted: rank {rank} took {time.monotonic() - start:.1f} s")
    start = time.monotonic()
    for call, needle in ((lambda: step(mine(x, rank), mine(y, rank)), "make a new process"),
                         (lambda: other(mine(x, rank), mine(y, rank)), "out of step since"),
                         (lambda: pt.train_step(*args, policy="rotor", process_group=group),
                          "out of step since a step failed")):
        try:
            call()
            failures.append(f"interrupted: rank {rank} took a call on the group after it")
        except (pt.PlanExecutionError, ValueError) as e:
            if needle not in str(e):
                failures.append(f"interrupted: rank {rank} refused with '{e}'")
    if time.monotonic() - start > 5:
        failures.append(f"interrupted: the refusals took {time.monotonic() - start:.1f} s")
    return failures



def check_short_wait(torch, pt, dist, rank, ranks):
    """A wait for a collective with under a millisecond left (a failed run's
    drain near its deadline) returns at once, where c10d would take the
    rounded-down 0 ms for no timeout and wait for the group's: rank 0 waits
    for an all-reduce that the others start only once that wait is over."""
    from pebble.torch._distributed import wait_limit
    failures = []
    store = dist.distributed_c10d._get_default_store()
    t = torch.full((3,), float(rank + 1))
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        start = time.monotonic()
        try:
            work.wait(wait_limit(0.0004))
            failures.append("a short wait: the all-reduce completed without the others")
        except RuntimeError:
            pass  # timed out, as it should
        elapsed = time.monotonic() - start
        if elapsed > 5:
            failures.append(f"a wait of 0.4 ms took {elapsed:.1f} s")
        store.set("distributed_check/short_wait", "over")
    else:
        store.get("distributed_check/short_wait")
        work = dist.all_reduce(t, async_op=True)
    try:  # (the work lives on after a wait times out: the group stays in step)
        work.wait(datetime.timedelta(seconds=20))
        if not torch.equal(t, torch.full((3,), ranks * (ranks + 1) / 2)):
            failures.append(f"a short wait: the all-reduce after it sums to {t.tolist()}")
    except RuntimeError as e:
        failures.append(f"a short wait: the all-reduce after it failed: {e}")
    return failures


def check_parameter_held_in_a_list(torch, pt, dist):
    """A module that also holds a parameter in a list of its own reads it
    there as the real shard, which a sharded step's fake trace refuses: the
    refusal names the parameter and the list (until 2026-12-05 it gave
    PyTorch's message, cut off in the tensor's values, and advice to try the
    step unsharded, which trains)."""
    nn, F = torch.nn, torch.nn.functional

    class ListAlias(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 8), nn.Linear(8, 5)
            self.ws = [self.b.weight]

        def forward(self, x):
            return F.linear(torch.tanh(self.a(x)), self.ws[0], self.b.bias)

    model = ListAlias()
    try:
        pt.train_step(model, F.cross_entropy, (torch.randn(4, 16),), torch.randint(0, 5, (4,)),
                      optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      process_group=dist.group.WORLD, shard="full")
        return ["a parameter held in a list: the sharded step was not refused"]
    except pt.CaptureError as e:
        needle = "holds 'b.weight' in its list 'ws'"
        return [] if needle in str(e) and "Parameter containing" not in str(e) else \
            [f"a parameter held in a list: refused with '{e}', not '{needle}'"]


def check_loss_reading_parameters(torch, pt, dist):
    """A loss that reads the module's parameters (a penalty over
    model.parameters()) gets the real shards in a sharded step's fake
    trace: the refusal says that the loss read them, names the user's line,
    and what to write instead (until 2026-12-06 it called the parameter a
    tensor made outside the step)."""
    nn, F = torch.nn, torch.nn.functional
    model = nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 5))

    def penalized(out, y):
        return F.cross_entropy(out, y) + 1e-2 * sum((p ** 2).sum() for p in model.parameters())

    try:
        pt.train_step(model, penalized, (torch.randn(4, 16),), torch.randint(0, 5, (4,)),
                      optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      process_group=dist.group.WORLD, shard="full")
        return ["a loss reading the parameters: the sharded step was not refused"]
    except pt.CaptureError as e:
        needles = ("the loss read a tensor other than the output", "weight_decay",
                   "distributed_check.py:")
        return [] if all(n in str(e) for n in needles) else \
            [f"a loss reading the parameters: refused with '{e}', without {needles}"]


def check_refusal_of_one_rank(torch, pt, dist, rank, ranks):
    """A step that refuses its calls on one rank alone (as after a failure
    there, the ranks' collectives in step) makes every rank refuse the call
    together, naming that rank, rather than leave the others in the call's
    check; the ranks stay in step."""
    torch.manual_seed(0)
    model = make_model(torch)
    (x, y), = batches(torch, ranks, 1)
    step = pt.train_step(model, torch.nn.functional.cross_entropy, (mine(x, rank),),
                         mine(y, rank), policy="rotor", budget="min",
                         process_group=dist.group.WORLD)
    if rank == 0:
        step._failure.record(RuntimeError("a failure on rank 0 alone"), in_step=True)
    try:
        step(mine(x, rank), mine(y, rank))
        return [f"a refusal on rank 0 alone: rank {rank} stepped"]
    except pt.PlanExecutionError as e:
        expected = "an earlier step failed" if rank == 0 else "rank 0 failed, so this rank"
        if expected not in str(e) or "on rank 0 alone" not in str(e):
            return [f"a refusal on rank 0 alone: rank {rank} refused with '{e}'"]
    t = torch.ones(2)
    dist.all_reduce(t, async_op=True).wait(datetime.timedelta(seconds=20))
    return [] if torch.equal(t, torch.full((2,), float(ranks))) else \
        [f"a refusal on rank 0 alone: an all-reduce after it sums to {t.tolist()}"]


def check_local_refusal_of_one_rank(torch, pt, dist, rank, ranks):
    """A call that one rank refuses by its own arguments (under no_grad),
    and a replan() on one rank while the others step: every rank raises,
    at once (until 2026-12-03 the others' call paired with that rank's next
    one, trained on it, and the ranks hung a call apart); then the ranks
    step together as before."""
    torch.manual_seed(0)
    model = make_model(torch)
    (x, y), = batches(torch, ranks, 1)
    data = (mine(x, rank), mine(y, rank))
    step = pt.train_step(model, torch.nn.functional.cross_entropy, (data[0],), data[1],
                         policy="rotor", budget="min", process_group=dist.group.WORLD)
    failures = []
    for what, call, needle in (
            ("a call under no_grad on rank 1",
             lambda: step(*data) if rank != 1 else _without_grad(torch, step, data),
             "gradients disabled"),
            ("replan() on rank 1", lambda: step(*data) if rank != 1 else step.replan("dtr"),
             "replan()")):
        start = time.monotonic()
        try:
            call()
            failures.append(f"{what}: rank {rank} went on")
        except (RuntimeError, pt.PlanExecutionError) as e:
            if needle not in str(e):
                failures.append(f"{what}: rank {rank} refused with '{e}'")
        if time.monotonic() - start > 10:
            failures.append(f"{what}: rank {rank} waited {time.monotonic() - start:.0f} s")
    model.zero_grad(set_to_none=True)
    step(*data)  # (the ranks in step: this call's all-reduces pair)
    return failures


def _without_grad(torch, step, data):
    with torch.no_grad():
        return step(*data)

def check_differing_settings(torch, pt, dist, rank, ranks):
    """An optimizer whose learning rate differs on one rank is refused, on
    every rank, naming the optimizer's settings: by train_step, and by a
    call once the step is made (a scheduler or a checkpoint loaded on one
    rank), and so is a module in eval mode on one rank, naming the module's
    setting and each rank's value; with the rates alike again, the step
    trains on, as DistributedDataParallel does."""
    torch.manual_seed(0)
    model = make_model(torch)
    ddp_twin = copy.deepcopy(model)
    data = batches(torch, ranks, 2)
    loss_fn = torch.nn.functional.cross_entropy
    failures = []

    def refused(call, needle, what):
        try:
            call()
            failures.append(f"a learning rate that differs on rank 1, {what}: not refused")
        except (pt.PlanError, pt.PlanExecutionError) as e:
            if needle not in str(e):
                failures.append(f"a learning rate that differs on rank 1, {what}: refused "
                                f"with '{e}'")
    opt = optimizer(torch, "sgd", model.parameters())
    args = (model, loss_fn, (mine(data[0][0], rank),), mine(data[0][1], rank))
    lrs = [group["lr"] for group in opt.param_groups]

    def differ_on_rank_1(differ):  # each group's lr, 5x on rank 1 where `differ`
        for group, lr in zip(opt.param_groups, lrs):
            group["lr"] = 5 * lr if differ and rank == 1 else lr
    differ_on_rank_1(True)
    refused(lambda: pt.train_step(*args, optimizer=opt, policy="rotor",
                                  process_group=dist.group.WORLD),
            "optimizer's settings", "by train_step")
    differ_on_rank_1(False)
    step = pt.train_step(*args, optimizer=opt, policy="rotor", process_group=dist.group.WORLD)
    differ_on_rank_1(True)
    refused(lambda: step(mine(data[0][0], rank), mine(data[0][1], rank)),
            "optimizer settings", "by a call")
    differ_on_rank_1(False)
    # A module's setting that differs on one rank is named, with each
    # rank's value (it said only "module settings" until 2026-12-07).
    if rank == 1:
        model[1].eval()
    try:
        step(mine(data[0][0], rank), mine(data[0][1], rank))
        failures.append("a module in eval mode on rank 1 alone: not refused")
    except pt.PlanExecutionError as e:
        if "1.training: rank 0 True, rank 1 False" not in str(e):
            failures.append(f"a module in eval mode on rank 1 alone: refused with '{e}'")
    model[1].train()
    # A configuration object that holds each rank's own values (its local
    # rank) is the rank's: not compared across ranks (every step was refused).
    # Where it changes on one rank only, every rank captures again with it
    # (their captures' collectives are every rank's), and they train alike.
    configured = make_model(torch)
    configured.args = argparse.Namespace(hidden=16, local_rank=rank)
    configured_opt = optimizer(torch, "sgd", configured.parameters())
    x, y = mine(data[0][0], rank), mine(data[0][1], rank)
    try:
        configured_step = pt.train_step(configured, loss_fn, (x,), y, optimizer=configured_opt,
                                        policy="rotor", process_group=dist.group.WORLD)
        for call in range(4):
            if call == 1 and rank == 1:
                configured.args.note = "rank 1's own"
            if call == 3 and rank == 1:  # (back: rank 1 finds its first capture)
                del configured.args.note
            configured_opt.zero_grad(set_to_none=True)
            configured_step(x, y)
            numbers = [None] * ranks
            dist.all_gather_object(numbers, configured_step._variant.capture.number)
            if len(set(numbers)) > 1:
                failures.append(f"a configuration changed on rank 1 only: call {call} ran "
                                f"the ranks' captures {numbers}, not one")
        for name, p in configured.named_parameters():
            rank_0s = p.detach().clone()
            dist.broadcast(rank_0s, 0)
            if not torch.equal(rank_0s, p.detach()):
                failures.append(f"a configuration changed on rank 1 only: {name} differs "
                                "from rank 0's")
    except pt.PlanExecutionError as e:
        failures.append(f"a configuration with each rank's local rank: refused with '{e}'")
    # Two steps of the same shapes called in another order on rank 1: each
    # call refused on every rank, naming each rank's step (their
    # collectives would pair the one's gradients with the other's).
    first, second = (pt.train_step(make_model(torch), loss_fn, (x,), y, policy="rotor",
                                   process_group=dist.group.WORLD) for _ in range(2))
    numbers = [int(s.collectives.label.split("#")[1]) for s in (first, second)]
    for call in range(2):
        mixed = (first, second)[call if rank != 1 else 1 - call]
        try:
            mixed(x, y)
            failures.append(f"two steps called in another order on rank 1: call {call} ran")
        except pt.PlanExecutionError as e:
            rank_1s, rank_0s = numbers[1 - call], numbers[call]
            if f"rank 1 calls train_step #{rank_1s} where rank 0 calls train_step " \
                    f"#{rank_0s}" not in str(e):
                failures.append(f"two steps called in another order on rank 1: '{e}'")
    try:  # (a refused call leaves both in step)
        first(x, y)
        second(x, y)
    except pt.PlanExecutionError as e:
        failures.append(f"two steps called in the same order after a refused order: '{e}'")
    # A smaller slice of the batch on rank 1: refused on every rank, showing
    # each rank's shapes.
    x, y = mine(data[0][0], rank), mine(data[0][1], rank)
    try:
        step(x[:1] if rank == 1 else x, y[:1] if rank == 1 else y)
        failures.append("a smaller batch on rank 1: not refused")
    except pt.PlanExecutionError as e:
        rows = len(mine(data[0][0], 0))
        if f"(shapes, dtypes or layouts: rank 0 input ({rows}," not in str(e) or \
                "rank 1 input (1," not in str(e):
            failures.append(f"a smaller batch on rank 1: refused with '{e}'")
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_twin)
    ddp_opt = optimizer(torch, "sgd", ddp.parameters())
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        step(mine(x, rank), mine(y, rank))
        ddp_opt.zero_grad(set_to_none=True)
        loss_fn(ddp(mine(x, rank)), mine(y, rank)).backward()
        ddp_opt.step()
    return failures + [f"a learning rate that differed on rank 1: afterwards, {name} differs "
                       "from DistributedDataParallel's"
                       for (name, a), b in zip(model.named_parameters(), ddp_twin.parameters())
                       if not close(a.detach(), b.detach())]


def check_dead_rank(torch, pt, dist, rank, ranks, shard="none"):
    """The last rank dies instead of stepping; the others must fail cleanly
    (sharded: in a gather or a reduce-scatter in flight)."""
    torch.manual_seed(0)
    model = make_model(torch)
    (x, y), = batches(torch, ranks, 1)
    sharded = {}
    if shard == "full":
        sharded = dict(shard="full", optimizer=torch.optim.Adam(model.parameters(), lr=1e-2))
    step = pt.train_step(model, torch.nn.functional.cross_entropy, (mine(x, rank),),
                         mine(y, rank), policy="fsdp" if sharded else "rotor", budget="min",
                         process_group=dist.group.WORLD, **sharded)
    dist.barrier()
    if rank == ranks - 1:
        os._exit(3)  # mid-training, without a word to the others
    try:
        step(mine(x, rank), mine(y, rank))
    except pt.PlanExecutionError as e:
        if "a rank stopped" not in str(e):
            return [f"the step failed, but without saying a rank may have stopped: {e}"]
        return []
    return ["the step went on although a rank had died"]


def refusals(torch, pt):
    """Arguments that cannot work are refused, naming why (one process, no
    process group initialised)."""
    failures = []
    model = make_model(torch)
    x, y = torch.randn(4, 16), torch.randint(0, 5, (4,))
    for kwargs, error, needle in (
            (dict(shard="half"), ValueError, "'none' or 'full', not 'half'"),
            (dict(shard="full"), ValueError, "give the process group too (process_group is "
             "None here: torch.distributed.group.WORLD is None until"),
            (dict(shard="full", process_group=torch.distributed.group.WORLD), ValueError,
             "torch.distributed.group.WORLD is None until"),
            (dict(network="ib-ndr"), ValueError, "give the process group too"),
            (dict(optimizer_gradients="sometimes"), ValueError,
             "'keep' or 'drop', not 'sometimes'"),
            (dict(process_group=object()), ValueError, "is not initialised"),
            (dict(buckets="25MiB"), ValueError, "give a process_group"),
            (dict(buckets=1.5), TypeError, "buckets must be 'auto', 'none' or a size"),
            (dict(optimizer_parameters="host", allow_cpu_offload=True), ValueError,
             "give the optimizer too"),
            (dict(optimizer_parameters="disk"), ValueError,
             "'device', 'host' or 'auto', not 'disk'")):
        try:
            pt.train_step(model, torch.nn.functional.cross_entropy, (x,), y, **kwargs)
        except error as e:
            if needle not in str(e):
                failures.append(f"{kwargs}: refused with '{e}', not '{needle}'")
            continue
        failures.append(f"{kwargs} was not refused")
    return failures


def check_one_rank(torch, pt, dist):
    """A process group of one rank (this process): the step is the single
    process's, with no all-reduce in its plan, whatever the bucket rule."""
    failures = []
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        torch.manual_seed(0)
        model = make_model(torch)
        whole = copy.deepcopy(model)
        (x, y), = batches(torch, 1, 1)
        loss_fn = torch.nn.functional.cross_entropy
        step = pt.train_step(model, loss_fn, (x,), y, policy="rotor", budget="min",
                             measure="always", process_group=dist.group.WORLD, buckets="25MiB")
        step(x, y)
        loss_fn(whole(x), y).backward()
        for (name, p), q in zip(model.named_parameters(), whole.parameters()):
            if p.grad is None or not close(p.grad, q.grad):
                failures.append(f"one rank: gradient of {name} differs from eager's")
        r = step.report
        if r["ranks"] != 1 or any(s[0] == "all_reduce" for s in step.schedule) or \
                r["measured_peak_bytes"] != r["predicted_step_peak_bytes"]:
            failures.append(f"one rank: ranks {r['ranks']}, measured peak "
                            f"{r['measured_peak_bytes']} of {r['predicted_step_peak_bytes']}, "
                            "or all-reduces in the plan")
        # A module wrapped in DistributedDataParallel, whole or inside the
        # model: its all-reduces run in hooks that the step does not run, so
        # each rank kept its own gradients; refused, naming the way.
        ddp = torch.nn.parallel.DistributedDataParallel(make_model(torch))
        holder = torch.nn.Sequential(ddp)
        for wrapped, needle in ((ddp, "the model is a DistributedDataParallel wrapper"),
                                (holder, "module '0' is a DistributedDataParallel wrapper")):
            try:
                pt.train_step(wrapped, loss_fn, (x,), y, process_group=dist.group.WORLD)
                failures.append(f"{needle.split(' is')[0]}: not refused")
            except TypeError as e:
                if needle not in str(e) or "ddp.module" not in str(e):
                    failures.append(f"{needle.split(' is')[0]}: refused with '{e}'")
    finally:
        dist.destroy_process_group()
    return failures


def worker(rank, ranks, port, outdir, timeout, dead_shard):
    """Every check on this rank (dead_shard "none"), or only the dead rank's,
    sharded (dead_shard "full": a group of its own, since a dead rank ends
    one)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch
    import torch.distributed as dist
    import pebble.torch as pt
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ranks,
                            timeout=datetime.timedelta(seconds=timeout))
    # (an interrupt leaves its group out of step: a group of its own, beside
    # the sharded dead rank's)
    failures = (check_interrupt(torch, pt, dist, rank, ranks) if dead_shard == "full" else
                checks(torch, pt, dist, rank, ranks))
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(failures, f)  # before the last check, which one rank does not survive
    dead = check_dead_rank(torch, pt, dist, rank, ranks, dead_shard)
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(failures + dead, f)
    # A survivor leaves without the interpreter's teardown: with 3 ranks or
    # more, an all-reduce queued behind the failed one waits for a live peer
    # until the group's timeout, and PyTorch 1.13's gloo thread that then
    # lets go of its tensor while the interpreter finalizes aborts the
    # process (docs/torch.md, "A rank that dies"). What this check asserts,
    # the step's clear error without a hang, is in `dead`.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def checks(torch, pt, dist, rank, ranks):
    """Every check but the dead rank's, on this rank: its failures."""
    every = ranks <= 2  # (more ranks: what the number of ranks changes; module docstring)
    failures = check_short_wait(torch, pt, dist, rank, ranks)
    failures += check_gradients(torch, pt, dist, rank, ranks)
    # A transposed gradient, all-reduced through its storage, in place; at the
    # second step added into the .grad of the first.
    failures += check_gradients(torch, pt, dist, rank, ranks, make_transposed_model)
    failures += check_shared_storage(torch, pt, dist, rank, ranks)
    for cap in ("25MiB", "100B") if every else ():  # both views in one bucket's copy, then
        failures += check_shared_storage(torch, pt, dist, rank, ranks, cap, "1MiB")  # apart
    # The group initialised: not a group, what sharding cannot run, each
    # refused on every rank (its own error, after the ranks agree on it).
    if every:
        model = make_model(torch)
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        world = dist.group.WORLD
        for kwargs, error, needle in (
                (dict(process_group="world"), TypeError, "must be a torch.distributed"),
                (dict(process_group=world, shard="full"), ValueError, "give the optimizer too"),
                (dict(process_group=world, shard="full", optimizer=sgd,
                      optimizer_gradients="keep"), ValueError, "is not possible"),
                (dict(process_group=world, shard="full", optimizer=sgd, buckets="25MiB"),
                 ValueError, "a sharded step takes 'auto'")):
            try:
                pt.train_step(model, torch.nn.functional.cross_entropy,
                              (torch.randn(4, 16),), torch.randint(0, 5, (4,)), **kwargs)
                failures.append(f"{kwargs} was not refused")
            except error as e:
                if needle not in str(e):
                    failures.append(f"{kwargs}: refused with '{e}', not '{needle}'")
        # A group of rank 0 alone (made on every rank): rank 1 holds
        # torch's placeholder, refused as such (a TypeError about 'object').
        alone = dist.new_group([0])
        if rank == 1:
            try:
                pt.train_step(model, torch.nn.functional.cross_entropy, (torch.randn(4, 16),),
                              torch.randint(0, 5, (4,)), process_group=alone)
                failures.append("a group this rank is not in was not refused")
            except ValueError as e:
                if "not a member of that group" not in str(e):
                    failures.append(f"a group this rank is not in: refused with '{e}'")
        failures += check_parameter_held_in_a_list(torch, pt, dist)
        failures += check_loss_reading_parameters(torch, pt, dist)
    for make, policy, kind, updates, clip in (
            (make_concatenated_model, "dtr", "adam", "auto", None),
            (make_concatenated_model, "rotor", "sgd", "host", 0.1),
            (make_summed_model, "dtr", "adam", "host", None),
            (make_summed_model, "rotor", "sgd", "auto", 0.1)) if every else ():
        failures += check_shared_gradients_trained(torch, pt, dist, rank, ranks, make, policy,
                                                   kind, updates, clip)
    for kind, updates in ((("sgd", "device"), ("sgd", "host"), ("adam", "device"),
                           ("adam", "host")) if every else (("sgd", "device"), ("adam", "host"))):
        failures += check_training(torch, pt, dist, rank, ranks, kind, updates)
    # The gradients dropped (each freed once its update read it: the
    # all-reduce lets go of it first), and the parameters on the host.
    if every:
        failures += check_training(torch, pt, dist, rank, ranks, "adam", "device",
                                   buckets="none", gradients="drop")
    failures += check_training(torch, pt, dist, rank, ranks, "adam", "device",
                               parameters="host")
    # Clipped by the norm of the averaged gradients, as clip_grad_norm_ after
    # DDP's backward: on the device, and with the updates on the host and the
    # gradients dropped (by the largest magnitude).
    failures += check_training(torch, pt, dist, rank, ranks, "adam", "device", clip=0.2)
    if every:
        failures += check_training(torch, pt, dist, rank, ranks, "sgd", "host",
                                   clip=(0.01, "inf"), gradients="drop", policy="dtr")
    # SGD with momentum on the weights only: the rest keep no buffer.
    if every:
        failures += check_training(torch, pt, dist, rank, ranks, "sgd-mixed", "host")
    # DDP's rule: buckets of several gradients, each through a flat copy;
    # clipped too (the buckets summed before the clipping reads them).
    failures += check_training(torch, pt, dist, rank, ranks, "adam", "device", buckets="25MiB",
                               budget="1MiB")
    failures += check_training(torch, pt, dist, rank, ranks, "adam", "device", buckets="25MiB",
                               budget="1MiB", clip=0.2, policy="dtr")
    if every:
        failures += check_training(torch, pt, dist, rank, ranks, "sgd", "host", buckets="1KiB",
                                   budget="1MiB", clip=(0.05, 1.0), policy="checkmate-lp")
    # float64: each gradient divided by a held divisor of its own dtype (one
    # of float32 was cast at each division: 8 bytes above the plan).
    if every:
        failures += check_training(torch, pt, dist, rank, ranks, "adam", "device",
                                   buckets="25MiB", budget="1MiB", dtype=torch.float64)
    for kind, policy in (("adam", "fsdp"), ("adam", "dtr"), ("adam", "fsdp-module")):
        failures += check_sharded(torch, pt, dist, rank, ranks, kind, policy)
    # Each gather and reduce-scatter its own message.
    failures += check_sharded(torch, pt, dist, rank, ranks, "sgd", "rotor", buckets="none")
    failures += check_sharded(torch, pt, dist, rank, ranks, "adam", "hybrid", tokens=True)
    # An LSTM, whose weights the module reads from a list of its own (its
    # trace on stand-ins for the shards failed until 2026-12-04).
    if every:
        failures += check_sharded(torch, pt, dist, rank, ranks, "adam", "dtr",
                                  tokens="recurrent")
    # FSDP's rule with a unit per block (mlp.0, mlp.2; the rest the root unit)
    failures += check_sharded(torch, pt, dist, rank, ranks, "adam", "fsdp-blocks", tokens=True)
    # ZeRO-Offload on shards: the state's shards on the host, and the updates
    # there too, or where the plan puts them.
    failures += check_sharded(torch, pt, dist, rank, ranks, "adam", "dtr", state="host")
    failures += check_sharded(torch, pt, dist, rank, ranks, "adam", "fsdp-blocks", tokens=True,
                              state="host", updates="host")
    if every:
        failures += check_sharded(torch, pt, dist, rank, ranks, "sgd", "hybrid", state="auto",
                                  updates="auto")
    # The state's shards at home on the device, each update on the host
    # moving its state out and back (planned since 2026-12-04).
    failures += check_sharded(torch, pt, dist, rank, ranks, "adam", "dtr", state="device",
                              updates="host")
    # Clipped by the norm of the whole gradients from each rank's shards (one
    # all-reduce of a scalar), as clip_grad_norm_ on the whole batch: with the
    # updates on the host reading the clipped shards' host copies (the
    # largest magnitude); at 2 ranks also under FSDP's rule and placed by
    # hybrid, and SGD with momentum on the weights only.
    failures += check_sharded(torch, pt, dist, rank, ranks, "sgd", "dtr", state="host",
                              updates="host", clip=(0.01, "inf"))
    if every:
        failures += check_sharded(torch, pt, dist, rank, ranks, "sgd-mixed", "dtr",
                                  state="host")
        failures += check_sharded(torch, pt, dist, rank, ranks, "adam", "fsdp",
                                  clip=(0.2, 2.0))
        # (a float64 shard's norm: vector_norm refused to narrow it to float32)
        failures += check_sharded(torch, pt, dist, rank, ranks, "adam", "fsdp",
                                  clip=(0.2, 2.0), dtype=torch.float64)
        failures += check_sharded(torch, pt, dist, rank, ranks, "adam", "hybrid", tokens=True,
                                  state="auto", updates="auto", clip=(0.3, 2.0))
    # ZeRO-Infinity's parameters on the host: each rank's shards live there
    # between steps, fetched for their gathers (and their updates).
    failures += check_sharded(torch, pt, dist, rank, ranks, "adam", "fsdp-blocks", tokens=True,
                              state="host", parameters="host")
    failures += check_sharded(torch, pt, dist, rank, ranks, "adam", "dtr", state="host",
                              updates="host", parameters="host")
    if every:
        failures += check_one_plan(torch, pt, dist, rank, ranks)
    failures += check_capture_of_shards(torch, pt, dist, rank, ranks)
    if every:
        failures += check_sharded_calibration_under_plan(torch, pt, dist, rank, ranks)
    failures += check_built_in_shards(torch, pt, dist, rank, ranks)
    failures += check_shards_moving(torch, pt, dist, rank, ranks)
    failures += check_sharded_checkpoint(torch, pt, dist, rank, ranks)
    failures += check_writes_between_sharded_steps(torch, pt, dist, rank, ranks)
    if every:
        failures += check_gathers_freed_apart(torch, pt, dist, rank, ranks)
    failures += check_sharded_failure(torch, pt, dist, rank, ranks)
    for shard, where in ((("none", "before"), ("none", "forward"), ("none", "backward"),
                          ("none", "end"), ("none", "every"), ("full", "backward"),
                          ("full", "end")) if every else
                         (("none", "backward"), ("full", "backward"))):
        failures += check_live_failure(torch, pt, dist, rank, ranks, shard, where)
    failures += check_live_failure(torch, pt, dist, rank, ranks, "full", "backward",
                                   replanned=True)
    if every:  # (clipped: at 2 ranks)
        failures += check_live_failure(torch, pt, dist, rank, ranks, "none", "backward",
                                       clip=0.2)
        failures += check_live_failure(torch, pt, dist, rank, ranks, "full", "end", clip=0.2)
    if every:
        failures += check_refusal_of_one_rank(torch, pt, dist, rank, ranks)
        failures += check_local_refusal_of_one_rank(torch, pt, dist, rank, ranks)
        failures += check_differing_settings(torch, pt, dist, rank, ranks)
    for parameters in ("device", "host") if every else ():
        failures += check_failed_host_update(torch, pt, dist, rank, ranks, parameters)
    return failures


def launch(context, args, dead_shard):
    """Runs worker() on --ranks processes of one group: the failures they
    report, and any that hangs or exits otherwise than the dead rank's 3."""
    failures = []
    with tempfile.TemporaryDirectory() as outdir:
        port = free_port()
        procs = [context.Process(target=worker,
                                 args=(r, args.ranks, port, outdir, args.timeout, dead_shard))
                 for r in range(args.ranks)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 4 * args.timeout  # all ranks together
        for rank, p in enumerate(procs):
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
                failures.append(f"rank {rank} still ran after {4 * args.timeout:.0f} s: it "
                                "hangs")
            expected = 3 if rank == args.ranks - 1 else 0
            if p.exitcode not in (expected, None):
                failures.append(f"rank {rank} exited with {p.exitcode}, not {expected}")
            path = os.path.join(outdir, f"rank{rank}.json")
            if not os.path.exists(path):
                failures.append(f"rank {rank} reported nothing")
                continue
            with open(path) as f:
                failures += [f"rank {rank}{' (sharded)' if dead_shard == 'full' else ''}: {f_}"
                             for f_ in json.load(f)]
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="the process group's timeout, seconds")
    args = parser.parse_args()
    try:
        import torch  # noqa: F401
        import torch.distributed as dist
        import torch.multiprocessing as mp
        import pebble.torch  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e}")
        return 77
    if not dist.is_available():
        print("SKIP: this PyTorch has no torch.distributed")
        return 77
    import torch
    import pebble.torch as pt
    failures = refusals(torch, pt) + check_one_rank(torch, pt, dist)
    context = mp.get_context("spawn")
    for dead_shard in ("none", "full"):
        failures += launch(context, args, dead_shard)
    for f in failures:
        print("MISMATCH:", f)
    if failures:
        return 1
    print(f"PASS: {args.ranks} ranks: gradients of the whole batch, five SGD and Adam steps "
          "as DistributedDataParallel's (updates on the device and the host), sharded "
          "training as eager's on the whole batch, resumed from its checkpoint on other "
          "ranks, measured peak == predicted, a rank "
          "failing mid-step fails the others at once and leaves the group in step, a dead "
          "rank fails the others cleanly (data parallel and sharded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
