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
  in the plan (its updates on the device, and on the host) give the
  parameters of torch.nn.parallel.DistributedDataParallel on the same slices
  (to 1e-5 relative);
- a rank that dies mid-step: the others' step fails within the process
  group's timeout with pebble.torch's error saying a rank may have stopped,
  and none hangs.

Exit 0 on success, 1 on a mismatch, 77 without torch or torch.distributed.
"""

import argparse
import copy
import datetime
import json
import os
import socket
import sys
import tempfile
import time

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


def mine(t, rank):
    return t[rank * BATCH_PER_RANK:(rank + 1) * BATCH_PER_RANK]


def close(a, b, tol=1e-5):
    scale = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) <= tol * max(scale, 1e-30)


def optimizer(torch, kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
    return torch.optim.Adam(params, lr=1e-2, foreach=False)


def check_gradients(torch, pt, dist, rank, ranks):
    failures = []
    torch.manual_seed(0)
    whole = make_model(torch)
    torch.manual_seed(rank)  # each rank its own initialisation: rank 0's must win
    model = make_model(torch)
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
    schedule = step.schedule
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


def check_shared_storage(torch, pt, dist, rank, ranks):
    """Parameters concatenated: their gradients are views of one storage,
    each all-reduced once (not the storage twice)."""
    class Cat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.randn(3, 16))
            self.b = torch.nn.Parameter(torch.randn(5, 16))
            self.head = torch.nn.Linear(16, 5)

        def forward(self, x):
            w = torch.cat([self.a, self.b])
            return self.head(torch.tanh(x @ w.t()) @ w)

    torch.manual_seed(0)
    model, whole = Cat(), Cat()
    whole.load_state_dict(model.state_dict())
    (x, y), = batches(torch, ranks, 1)
    loss_fn = torch.nn.functional.cross_entropy
    step = pt.train_step(model, loss_fn, (mine(x, rank),), mine(y, rank), policy="rotor",
                         budget="min", process_group=dist.group.WORLD)
    step(mine(x, rank), mine(y, rank))
    loss_fn(whole(x), y).backward()
    failures = [f"concatenated parameters: gradient of {name} differs from the whole batch's"
                for (name, p), q in zip(model.named_parameters(), whole.parameters())
                if p.grad is None or not close(p.grad, q.grad)]
    return failures + check_planned_reductions(step, model)


def check_training(torch, pt, dist, rank, ranks, kind, updates):
    failures = []
    torch.manual_seed(0)
    model = make_model(torch)
    ddp_model = copy.deepcopy(model)
    opt = optimizer(torch, kind, model.parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)
    ddp_opt = optimizer(torch, kind, ddp.parameters())
    data = batches(torch, ranks, 5)
    loss_fn = torch.nn.functional.cross_entropy
    x0, y0 = data[0]
    step = pt.train_step(model, loss_fn, (mine(x0, rank),), mine(y0, rank), optimizer=opt,
                         policy="rotor", budget="min", measure="always",
                         optimizer_updates=updates, allow_cpu_offload=updates != "device",
                         process_group=dist.group.WORLD)
    for k, (x, y) in enumerate(data):
        opt.zero_grad(set_to_none=True)
        step(mine(x, rank), mine(y, rank))
        ddp_opt.zero_grad(set_to_none=True)
        loss_fn(ddp(mine(x, rank)), mine(y, rank)).backward()
        ddp_opt.step()
        r = step.report
        if r["measured_peak_bytes"] != r["predicted_step_peak_bytes"]:
            failures.append(f"step {k + 1}: measured peak {r['measured_peak_bytes']}, "
                            f"predicted {r['predicted_step_peak_bytes']}")
    for (name, p), q in zip(model.named_parameters(), ddp_model.parameters()):
        if not close(p.detach(), q.detach()):
            failures.append(f"{kind}, updates on the {updates}: after five steps, {name} "
                            "differs from DistributedDataParallel's")
    return failures


def check_dead_rank(torch, pt, dist, rank, ranks):
    """The last rank dies instead of stepping; the others must fail cleanly."""
    torch.manual_seed(0)
    model = make_model(torch)
    (x, y), = batches(torch, ranks, 1)
    step = pt.train_step(model, torch.nn.functional.cross_entropy, (mine(x, rank),),
                         mine(y, rank), policy="rotor", budget="min",
                         process_group=dist.group.WORLD)
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
            (dict(shard="full"), ValueError, "give the process group too"),
            (dict(process_group=object()), ValueError, "is not initialised")):
        try:
            pt.train_step(model, torch.nn.functional.cross_entropy, (x,), y, **kwargs)
        except error as e:
            if needle not in str(e):
                failures.append(f"{kwargs}: refused with '{e}', not '{needle}'")
            continue
        failures.append(f"{kwargs} was not refused")
    return failures


def worker(rank, ranks, port, outdir, timeout):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    import torch
    import torch.distributed as dist
    import pebble.torch as pt
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ranks,
                            timeout=datetime.timedelta(seconds=timeout))
    failures = check_gradients(torch, pt, dist, rank, ranks)
    failures += check_shared_storage(torch, pt, dist, rank, ranks)
    if rank == 0:  # with the group initialised: not a group, sharding
        for kwargs, error, needle in (
                (dict(process_group="world"), TypeError, "must be a torch.distributed"),
                (dict(process_group=dist.group.WORLD, shard="full"), ValueError,
                 "does not run in pebble.torch yet")):
            try:
                pt.train_step(make_model(torch), torch.nn.functional.cross_entropy,
                              (torch.randn(4, 16),), torch.randint(0, 5, (4,)), **kwargs)
                failures.append(f"{kwargs} was not refused")
            except error as e:
                if needle not in str(e):
                    failures.append(f"{kwargs}: refused with '{e}', not '{needle}'")
    for kind in ("sgd", "adam"):
        for updates in ("device", "host"):
            failures += check_training(torch, pt, dist, rank, ranks, kind, updates)
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(failures, f)  # before the last check, which one rank does not survive
    dead = check_dead_rank(torch, pt, dist, rank, ranks)
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(failures + dead, f)


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
    failures = refusals(torch, pt)
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as outdir:
        port = free_port()
        procs = [context.Process(target=worker, args=(r, args.ranks, port, outdir, args.timeout))
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
                failures += [f"rank {rank}: {f_}" for f_ in json.load(f)]
    for f in failures:
        print("MISMATCH:", f)
    if failures:
        return 1
    print(f"PASS: {args.ranks} ranks: gradients of the whole batch, five SGD and Adam steps "
          "as DistributedDataParallel's (updates on the device and the host), measured peak "
          "== predicted, a dead rank fails the others cleanly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
