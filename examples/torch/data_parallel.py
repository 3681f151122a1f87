#!/usr/bin/env python3
"""Data-parallel or sharded training under a pebble plan, one process per rank.

    torchrun --nproc_per_node 4 examples/torch/data_parallel.py \\
        [--layers 4] [--dim 128] [--batch 8] [--policy rotor] [--budget min] \\
        [--updates device|host|auto] [--shard none|full] [--steps 5] \
        [--save CHECKPOINT] [--resume CHECKPOINT]

(scripts/torchrun-example runs it with the build tree's pebble.) torchrun
starts the ranks and sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT;
each rank joins the process group (NCCL on GPUs, gloo on the CPU), builds
the same model from the same seed, and trains it with
pebble.torch.train_step(..., process_group=...) on its own slice of each
batch: the plan is the same on every rank, and each gradient is averaged
over the ranks as soon as the plan completes it. With --shard full each
rank keeps 1/ranks of the parameters, gradients and Adam's state (ZeRO-3),
and the plan gathers the parameters where they are read. Rank 0 prints
each step's loss and the measured and predicted step peaks; every rank
checks at the end that its parameters (gathered, where sharded) equal rank
0's. --save writes a checkpoint at the end (the module's and Adam's state
whole: step.full_state_dict() and step.full_optimizer_state_dict(), which
load on any number of ranks, sharded or not, and in one process);
--resume starts from one.
"""

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist

import pebble.torch as pt


def model_of(args):
    nn = torch.nn
    blocks = []
    for _ in range(args.layers):
        blocks += [nn.Linear(args.dim, args.dim), nn.GELU()]
    return nn.Sequential(*blocks, nn.Linear(args.dim, 10))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8, help="samples per rank and step")
    parser.add_argument("--policy", default="rotor")
    parser.add_argument("--budget", default="min")
    parser.add_argument("--updates", default="device", choices=("device", "host", "auto"))
    parser.add_argument("--shard", default="none", choices=("none", "full"),
                        help="full: parameters, gradients and optimizer state sharded")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--save", metavar="CHECKPOINT",
                        help="write the module's and the optimizer's state there at the end "
                             "(a new file)")
    parser.add_argument("--resume", metavar="CHECKPOINT",
                        help="start from a checkpoint that --save wrote (any number of ranks)")
    args = parser.parse_args()
    if "RANK" not in os.environ:
        sys.exit("run me with torchrun (torchrun --nproc_per_node N " + sys.argv[0] + ")")
    if args.save is not None and os.path.exists(args.save):
        sys.exit(f"--save {args.save}: the file exists; give a new path (nothing is overwritten)")
    if args.resume is not None and not os.path.isfile(args.resume):
        sys.exit(f"--resume {args.resume}: no such file")
    # One GPU per rank where there are enough, else the CPU (gloo).
    gpu = torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    dist.init_process_group("nccl" if gpu else "gloo", timeout=datetime.timedelta(seconds=60))
    rank, ranks = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu else \
        torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    torch.manual_seed(0)  # the same model on every rank
    model = model_of(args).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    if args.resume is not None:  # on every rank, before the step is made
        saved = torch.load(args.resume, map_location="cpu")
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        if rank == 0:
            print(f"resumed from {args.resume}: {saved['steps']} steps on {saved['ranks']} ranks")
    g = torch.Generator().manual_seed(1)  # the same batches; each rank takes its slice
    data = [(torch.randn(args.batch * ranks, args.dim, generator=g),
             torch.randint(0, 10, (args.batch * ranks,), generator=g))
            for _ in range(args.steps)]
    mine = slice(rank * args.batch, (rank + 1) * args.batch)
    x0, y0 = (t[mine].to(device) for t in data[0])
    step = pt.train_step(model, torch.nn.functional.cross_entropy, (x0,), y0,
                         optimizer=optimizer, policy=args.policy, budget=args.budget,
                         optimizer_updates=args.updates,
                         allow_cpu_offload=not gpu and args.updates != "device",
                         process_group=dist.group.WORLD, shard=args.shard)
    s = step.report.get("sharding")
    if rank == 0 and s is not None:
        print(f"sharded over {s['ranks']} ranks: {s['shard_bytes']} B of shards a rank; the "
              f"plan gathers {s['gathers']} times ({s['regathers']} again for the backward) and "
              f"reduce-scatters {s['reduce_scatters']} gradients")
    c = step.report.get("collectives")
    if rank == 0 and c is not None and c["all_reduce"]:  # one rank averages nothing
        print(f"the plan's {c['all_reduce']} all-reduces ({c['bytes']} B) keep the network busy "
              f"{1e3 * c['predicted_network_busy_s']:.3f} ms a step, predicted on a link of "
              f"{c['network_bytes_per_s'] / 1e9:.2f} GB/s and {1e6 * c['network_latency_s']:.1f} "
              f"us a message ({'measured' if c['network_measured'] else 'assumed'})")
    for k, (x, y) in enumerate(data):
        optimizer.zero_grad(set_to_none=True)
        loss = step(x[mine].to(device), y[mine].to(device))
        r = step.report
        if rank == 0:
            print(f"step {k + 1}: loss {float(loss):.4f} (rank 0's slice), step peak measured "
                  f"{r['measured_peak_bytes']} B, predicted {r['predicted_step_peak_bytes']} B "
                  f"({r['measured_by']}), {r['ranks']} ranks")
    whole = step.full_state_dict()  # gathered where sharded, on every rank
    if args.save is not None:
        optimizer_state = step.full_optimizer_state_dict()  # (every rank takes part)
        steps = args.steps + (saved["steps"] if args.resume is not None else 0)
        if rank == 0:
            torch.save({"model": whole, "optimizer": optimizer_state, "steps": steps,
                        "ranks": ranks}, args.save)
            print(f"saved {args.save}: {steps} steps on {ranks} ranks")
    flat = torch.cat([whole[name].flatten() for name, _ in model.named_parameters()])
    first = flat.clone()
    dist.broadcast(first, src=0)
    same = torch.equal(flat, first)
    print(f"rank {rank}: parameters {'equal' if same else 'DIFFER from'} rank 0's")
    dist.destroy_process_group()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
