#!/usr/bin/env python3
"""What a rank holds while a sharded step is made and captured, measured.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_shard_capture.py
        [--ranks 2] [--models gpt,mlp] [--layers 4]

Starts --ranks processes on this machine (gloo; one thread each). For each
model of bench/torch_updates.py (the GPT-2-style decoder, or the MLP of
1024-wide layers), with Adam and FSDP's rule (policy fsdp), each rank:
1. builds the model and makes train_step(..., shard="full") on its slice of
   a batch, the model given whole;
2. makes it again from the model on the meta device (built in shards: the
   module's reset_parameters(), the decoder's attention and causal masks
   by a param_init);
3. calls the step of 1. with a batch of another size: a new capture (the
   trace with stand-ins of the sharded parameters, the calibration under
   FSDP's rule) and its plan, then its step.
The allocator (the CPU profiler) measures each one's peak above what the
rank held before it: 1. and 2. from nothing (the model included where it
is given whole), 3. above its shards, the optimizer's state shards and the
staging buffers. The link is given (ib-ndr), not measured.

Rank 0 prints a Markdown table of these peaks beside the whole parameters'
bytes and a rank's shards, with the capture's time and the step's measured
and predicted peaks.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_data_parallel import load_updates_bench, spawn_ranks  # noqa: E402


def rank_main(rank, args, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist
    import pebble.torch as pt
    from pebble.torch._memory import AllocatorPeak
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    bench = load_updates_bench()
    rows = []
    for name in args.models.split(","):
        torch.manual_seed(0)
        _, batch = getattr(bench, name)(torch, 1)
        g = torch.Generator().manual_seed(1)
        per_rank = 1 if name == "gpt" else 8  # samples a rank, then twice as many
        first = batch(g, "cpu", size=per_rank * args.ranks)
        second = batch(g, "cpu", size=2 * per_rank * args.ranks)
        mine = [t.chunk(args.ranks)[rank] for t in first]

        def make_step(model, **options):
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
            return pt.train_step(model, torch.nn.functional.cross_entropy, (mine[0],), mine[1],
                                 optimizer=opt, policy="fsdp", measure="never",
                                 process_group=dist.group.WORLD, shard="full",
                                 network="ib-ndr", **options)

        with AllocatorPeak("cpu") as given_whole:  # 1. the model, then the step
            model = getattr(bench, name)(torch, args.layers)[0]
            whole = sum(p.numel() * p.element_size() for p in model.parameters())
            step = make_step(model)
        meta = getattr(bench, name)(torch, args.layers)[0].to("meta")
        with AllocatorPeak("cpu") as built:  # 2. built in shards
            make_step(meta, param_init=_param_init(torch))
        step(*mine)
        mine = [t.chunk(args.ranks)[rank] for t in second]
        started = time.perf_counter()
        with AllocatorPeak("cpu") as meter:  # the capture and plan alone (on every rank)
            step._variant_for((mine[0],), mine[1])
        seconds = time.perf_counter() - started
        with AllocatorPeak("cpu") as step_meter:
            step(*mine)
        rows.append(dict(model=name, whole=whole, shards=step.report["sharding"]["shard_bytes"],
                         given_whole=given_whole.peak_bytes, built=built.peak_bytes,
                         capture_peak=meter.peak_bytes, seconds=seconds,
                         step_peak=step_meter.peak_bytes,
                         predicted=step.report["predicted_step_peak_bytes"],
                         calibration=step.report["calibration"]))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.barrier()


def _param_init(torch):
    """param_init of the models built on the meta device: each module's
    reset_parameters(); nn.MultiheadAttention's own; a block's causal mask
    computed again (its __init__ made it, which the meta device forgot)."""
    def init(module):
        if isinstance(module, torch.nn.MultiheadAttention):
            module._reset_parameters()
        elif hasattr(module, "reset_parameters"):
            module.reset_parameters()
        elif "mask" in module._buffers:
            seq = module.mask.shape[0]
            module.mask.copy_(torch.triu(torch.full((seq, seq), float("-inf")), 1))
        else:
            raise ValueError(f"no initialisation of {type(module).__name__}")
    return init


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--models", default="gpt,mlp")
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    if args.ranks < 2:
        sys.exit("--ranks: sharding takes 2 ranks or more")
    rows = spawn_ranks(rank_main, args)
    mib = 1 << 20
    print(f"{args.ranks} ranks, {args.layers} layers; a rank's figures (rank 0)\n")
    print("| model | parameters | a rank's shards | made, given whole | made, built in shards "
          "| capture and plan of new shapes | their time | the step: measured peak | "
          "predicted |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['whole'] / mib:.2f} MiB | {r['shards'] / mib:.2f} MiB | "
              f"{r['given_whole'] / mib:.2f} MiB | {r['built'] / mib:.2f} MiB | "
              f"{r['capture_peak'] / mib:.2f} MiB | {r['seconds']:.1f} s | "
              f"{r['step_peak'] / mib:.2f} MiB | {r['predicted'] / mib:.2f} MiB |")
    print(f"\ncalibration: {rows[0]['calibration']}")


if __name__ == "__main__":
    main()
