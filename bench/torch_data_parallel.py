#!/usr/bin/env python3
"""Data-parallel training per rank: DistributedDataParallel against
pebble.torch's plans on the same ranks, measured.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_data_parallel.py
        [--ranks 2] [--layers 4] [--policy rotor] [--budget min] [--time-limit 10]

Starts --ranks processes on this machine (gloo; one thread each). Every rank
builds the GPT-2-style decoder of bench/torch_updates.py with Adam and takes
its slice (batch 2 per rank) of the same batches, three ways from the same
weights, two steps each after a warm-up step:

- DDP: torch.nn.parallel.DistributedDataParallel, loss.backward(),
  optimizer.step() (foreach=False);
- pebble: train_step(..., optimizer=opt, process_group=...), everything on
  the device, the gradients' all-reduces in buckets the plan places
  (buckets="auto"); then with one all-reduce per gradient (buckets="none"),
  and at DDP's measured peak with planned buckets and with DDP's 25 MiB
  rule (each bucket sent through a flat copy that the plan holds);
- pebble, ZeRO-Offload: the same with every update on the host and the
  gradients dropped (optimizer_updates="host", optimizer_gradients="drop");
- pebble, sharded: shard="full" (ZeRO-3), under FSDP's own rule (policy
  fsdp), under --policy at FSDP's predicted peak (the same memory: which
  is faster?) and under --policy at --budget: each rank holds 1/ranks of
  the parameters, gradients and Adam's state, and the plan gathers the
  parameters where they are read; then FSDP's rule with a unit per block
  (policy fsdp-blocks: each decoder block's parameters gathered together,
  as FSDP wraps them) and --policy at its predicted peak;
- pebble, sharded + ZeRO-Offload: the same with Adam's state shards on the
  host and every update there (optimizer_state="host",
  optimizer_updates="host"), under fsdp-blocks, --policy at its peak and
  --policy at --budget; then the parameters' shards on the host too
  (optimizer_parameters="host": ZeRO-Infinity's parameter offload).

Rank 0 prints a Markdown table: each row's whole-step peak on rank 0 (what
the step began with plus the most the allocator held above it, as the CPU
profiler measured it), the plan's prediction, the largest difference of its
parameters from DDP's after the three steps, and the wall time of an
unmeasured step beside the plan's prediction of it (its makespan: the
operators' calibrated times, the copies and the collectives on the link
the first pebble row's calibration measured, which every later row's plan
takes, so that the rows' predictions compare). On the CPU the host is the same memory
(allow_cpu_offload): the peaks are what a GPU would hold, the times the
CPU's. DDP sums flat buckets where pebble sums each gradient or buckets of
its own, so the sums may round differently, and Adam's normalised step turns a rounding difference
in a near-zero gradient into up to lr per step: the parameters agree to a
few times lr, not to the bit (tests/torch/distributed_check.py checks the
gradients to 1e-5). Exit 1 where they differ by more than 3 x lr x steps.
"""

import argparse
import copy
import datetime
import importlib.util
import json
import os
import socket
import sys
import time


def load_updates_bench():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("torch_updates",
                                                  os.path.join(here, "torch_updates.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def spawn_ranks(rank_main, args):
    """Runs rank_main(rank, args, port, out) on args.ranks processes of this
    machine (a free local port for the group); the JSON that rank 0 wrote
    to `out`."""
    import tempfile
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows")
        mp.spawn(rank_main, args=(args, port, out), nprocs=args.ranks)
        with open(out) as f:
            return json.load(f)


def rank_main(rank, args, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist
    import pebble.torch as pt
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks,
                            timeout=datetime.timedelta(seconds=300))
    torch.manual_seed(0)
    base, make_batch = load_updates_bench().gpt(torch, args.layers)
    g = torch.Generator().manual_seed(1)
    batches = [make_batch(g, "cpu", size=2 * args.ranks) for _ in range(3)]
    mine = [(x[2 * rank:2 * rank + 2], y[2 * rank * 128:(2 * rank + 2) * 128])
            for x, y in batches]
    loss_fn = torch.nn.functional.cross_entropy
    rows = []
    # DDP
    model = copy.deepcopy(base)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3, foreach=False)

    def eager(x, y):
        loss_fn(ddp(x), y).backward()
        opt.step()
    eager(*mine[0])
    opt.zero_grad(set_to_none=True)
    held = sum(t.numel() * t.element_size() for t in
               list(model.parameters()) + list(model.buffers()) + list(mine[1]))
    held += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0)
    _, peak, _ = pt.measure(lambda: eager(*mine[1]), "cpu")
    opt.zero_grad(set_to_none=True)
    started = time.perf_counter()
    eager(*mine[2])
    rows.append(("DDP", None, held + peak, 0.0, time.perf_counter() - started, None, None))
    reference = {name: p.detach().clone() for name, p in model.named_parameters()}
    plain = dict(policy=args.policy, budget=args.budget, time_limit=args.time_limit)
    link = None
    ddp_peak = rows[0][2]
    # Adam's state shards on the host and its updates there (docs/torch.md)
    offload = dict(optimizer_state="host", optimizer_updates="host", allow_cpu_offload=True)
    for name, placement in (("pebble", plain),
                            ("pebble, one all-reduce a gradient", dict(plain, buckets="none")),
                            ("pebble, planned buckets at DDP's peak",
                             dict(plain, budget=ddp_peak)),
                            ("pebble, DDP's 25 MiB buckets at DDP's peak",
                             dict(plain, budget=ddp_peak, buckets="25MiB")),
                            ("pebble, ZeRO-Offload", dict(plain, optimizer_updates="host",
                                                          optimizer_gradients="drop",
                                                          allow_cpu_offload=True)),
                            ("pebble, sharded: FSDP's rule", dict(plain, policy="fsdp",
                                                                  budget="min", shard="full")),
                            (f"pebble, sharded: {args.policy} at FSDP's peak",
                             dict(policy=args.policy, time_limit=args.time_limit,
                                  shard="full")),
                            (f"pebble, sharded: {args.policy}", dict(plain, shard="full")),
                            ("pebble, sharded: FSDP's rule, a unit per block",
                             dict(plain, policy="fsdp-blocks", budget="min", shard="full")),
                            (f"pebble, sharded: {args.policy} at its peak",
                             dict(policy=args.policy, time_limit=args.time_limit,
                                  shard="full")),
                            ("pebble, sharded + ZeRO-Offload: FSDP's rule, a unit per block",
                             dict(plain, policy="fsdp-blocks", budget="min", shard="full",
                                  **offload)),
                            (f"pebble, sharded + ZeRO-Offload: {args.policy} at its peak",
                             dict(policy=args.policy, time_limit=args.time_limit,
                                  shard="full", **offload)),
                            (f"pebble, sharded + ZeRO-Offload: {args.policy}",
                             dict(plain, shard="full", **offload)),
                            (f"pebble, sharded + ZeRO-Offload, shards on the host: "
                             f"{args.policy}",
                             dict(plain, shard="full", optimizer_parameters="host",
                                  **offload))):
        if "budget" not in placement:  # the FSDP rows' predicted peak: the same memory
            placement = dict(placement, budget=rows[-1][1])
        if link is not None:  # the first row's measured link: one link for every plan
            placement = dict(placement, network=link[0], network_latency=link[1])
        model = copy.deepcopy(base)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
        step = pt.train_step(model, loss_fn, mine[0][:1], mine[0][1], optimizer=opt,
                             measure="always", process_group=dist.group.WORLD, **placement)
        c = step.report.get("collectives")
        if link is None and c is not None and c["network_measured"]:
            link = (c["network_bytes_per_s"], c["network_latency_s"])
        for x, y in mine[:2]:
            opt.zero_grad(set_to_none=True)
            step(x, y)
        r = dict(step.report)
        step.measure_mode = "never"
        opt.zero_grad(set_to_none=True)
        started = time.perf_counter()
        step(*mine[2])
        seconds = time.perf_counter() - started
        after = step.full_state_dict()  # the parameters whole, sharded or not
        diff = max(float((after[n] - q).abs().max()) for n, q in reference.items())
        rows.append((name, r["predicted_peak_bytes"], r["measured_total_peak_bytes"], diff,
                     seconds, r["predicted_time_s"], r.get("sharding") or r.get("collectives")))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--policy", default="rotor")
    parser.add_argument("--budget", default="min")
    parser.add_argument("--time-limit", type=float, default=10.0,
                        help="each plan's time limit, seconds (train_step's time_limit)")
    args = parser.parse_args()
    rows = spawn_ranks(rank_main, args)
    print(f"gpt, {args.layers} layers, Adam, {args.ranks} ranks (gloo), batch 2 per rank; "
          f"pebble's policy {args.policy} at {args.budget}; rank 0's figures")
    print()
    print("| row | peak predicted | peak measured | largest parameter difference from DDP "
          "| step time predicted | step time measured |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    failed = False
    for name, predicted, measured, diff, seconds, predicted_s, _ in rows:
        failed = failed or diff > 3 * 1e-3 * 3  # 3 x lr x steps
        print(f"| {name} | {'' if predicted is None else f'{predicted / 2**20:.2f} MiB'} | "
              f"{measured / 2**20:.2f} MiB | {diff:.1e} | "
              f"{'' if predicted_s is None else f'{predicted_s * 1e3:.0f} ms'} | "
              f"{seconds * 1e3:.0f} ms |")
    for name, *_, c in rows:
        if c is not None and "all_reduce" in c:
            print(f"\n{name}: {c['all_reduce']} all-reduces in {c['buckets']} collectives "
                  f"(largest {c['largest_bucket_bytes'] / 2**20:.2f} MiB) of "
                  f"{c['bytes'] / 2**20:.2f} MiB, "
                  f"network busy {c['predicted_network_busy_s'] * 1e3:.1f} ms predicted on a "
                  f"link of {c['network_bytes_per_s'] / 1e9:.2f} GB/s and "
                  f"{c['network_latency_s'] * 1e6:.0f} us a message "
                  f"({'measured' if c['network_measured'] else 'given'})")
        elif c is not None:
            print(f"\n{name}: {c['gathers']} all-gathers ({c['regathers']} again for the "
                  f"backward), {c['reduce_scatters']} reduce-scatters, sent in "
                  f"{c['messages']} messages ({c['planned_messages']} planned), network busy "
                  f"{c['predicted_network_busy_s'] * 1e3:.1f} ms predicted")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
