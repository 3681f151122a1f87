#!/usr/bin/env python3
"""torchvision models on several ranks under pebble.torch's plans: measured
peak against predicted, and the parameters against DistributedDataParallel's.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_shard_sweep.py
        [--ranks 3] [--models resnet18,mobilenet_v2,...] [--policies dtr,hybrid,rotor,fsdp]
        [--shard full,none] [--optimizer adam|sgd] [--budget min] [--steps 2] [--image 64]
        [--json]

Starts --ranks processes on this machine (gloo; one thread each) for each
(model, policy, shard) row. Every rank builds the model from one seed (ten
classes) and takes its slice (--per-rank images) of the same batches, then:

- DDP: torch.nn.parallel.DistributedDataParallel, loss.backward(),
  optimizer.step() (foreach=False), --steps steps;
- pebble: train_step(..., optimizer=opt, process_group=..., shard=...,
  policy=..., budget=--budget, measure="always") from the same weights, the
  same steps (fsdp, FSDP's own rule, only sharded).

Each row gives DDP's step peak (the largest over the ranks and the steps
after the first, which makes Adam's state; measured as pt.measure and
pebble's measured_peak_bytes measure: what the allocator held above the
step's start, by the CPU profiler), the largest difference, over the ranks
and steps, of pebble's measured step peak from the plan's prediction (0 is
exact), and the largest difference of any parameter (full_state_dict()
where sharded) from DDP's, relative to the parameter's largest magnitude or
1e-3, with that parameter's name. mobilenet_v2's and shufflenet_v2's differ
by rounding that gloo's sums of 3 ranks and Adam amplify, near-zero batch
norm biases most (bench/results/torch-shard-sweep-2026-12-01.md).
Exit 1 where a measured peak differs from its prediction.
"""

import argparse
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_data_parallel import spawn_ranks  # noqa: E402

MODELS = ("resnet18", "mobilenet_v2", "shufflenet_v2_x0_5", "squeezenet1_1")


def build(torch, name):
    import torchvision
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(num_classes=10)
    for module in model.modules():  # dropout would draw differently in DDP and pebble
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def optimizer(torch, kind, params):
    if kind == "adam":
        return torch.optim.Adam(params, lr=1e-3, eps=1e-3, foreach=False)
    return torch.optim.SGD(params, lr=2e-3, momentum=0.9, foreach=False)


def rank_main(rank, args, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist
    import pebble.torch as pt
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks,
                            timeout=datetime.timedelta(seconds=600))
    per = args.per_rank
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(per * args.ranks, 3, args.image, args.image, generator=g),
                torch.randint(0, 10, (per * args.ranks,), generator=g))
               for _ in range(args.steps)]
    mine = [(x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per])
            for x, y in batches]
    loss_fn = torch.nn.functional.cross_entropy

    ddp_model = build(torch, args.model)
    ddp = torch.nn.parallel.DistributedDataParallel(ddp_model)
    ddp_opt = optimizer(torch, args.optimizer, ddp_model.parameters())
    def ddp_step(x, y):
        ddp_opt.zero_grad(set_to_none=True)
        loss_fn(ddp(x), y).backward()
        ddp_opt.step()
    # The eager baseline, measured as pebble's steps are (pt.measure), after the
    # first step (which makes Adam's state: pebble's plan makes it before).
    ddp_step(*mine[0])
    ddp_peak = max(pt.measure(lambda: ddp_step(x, y))[1] for x, y in mine[1:])

    model = build(torch, args.model)
    opt = optimizer(torch, args.optimizer, model.parameters())
    started = time.perf_counter()
    step = pt.train_step(model, loss_fn, (mine[0][0],), mine[0][1], optimizer=opt,
                         policy=args.policy, budget=args.budget, measure="always",
                         process_group=dist.group.WORLD, shard=args.shard)
    peak_off = 0
    for x, y in mine:
        opt.zero_grad(set_to_none=True)
        step(x, y)
        r = step.report
        off = r["measured_peak_bytes"] - r["predicted_step_peak_bytes"]
        peak_off = off if abs(off) > abs(peak_off) else peak_off
    seconds = time.perf_counter() - started
    ours = step.full_state_dict() if args.shard == "full" else dict(model.named_parameters())
    worst, worst_name = 0.0, None
    for name, p in ddp_model.named_parameters():
        scale = max(float(p.detach().abs().max()), 1e-3)
        off = float((ours[name].detach() - p.detach()).abs().max()) / scale
        if off > worst:
            worst, worst_name = off, name
    rows = [None] * args.ranks
    dist.all_gather_object(rows, dict(peak_off=peak_off, worst=worst, name=worst_name,
                                      ddp_peak=ddp_peak))
    if rank == 0:
        r = step.report
        with open(out, "w") as f:
            json.dump(dict(
                model=args.model, policy=args.policy, shard=args.shard, ranks=args.ranks,
                ddp_step_peak_bytes=max(row["ddp_peak"] for row in rows),
                predicted_step_peak_bytes=r["predicted_step_peak_bytes"],
                peak_off_bytes=max((row["peak_off"] for row in rows), key=abs),
                parameters_from_ddp=max(row["worst"] for row in rows),
                parameter=max(rows, key=lambda row: row["worst"])["name"],
                recomputations=r["recomputations"], seconds=round(seconds, 1)), f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--policies", default="dtr,hybrid,rotor,fsdp")
    ap.add_argument("--shard", default="full,none")
    ap.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    ap.add_argument("--budget", default="min", help="train_step's budget (default min)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--per-rank", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    args = ap.parse_args()
    if args.ranks < 2:
        ap.error("--ranks: 2 or more")
    if args.steps < 2:
        ap.error("--steps: 2 or more (DDP's first step makes the optimizer's state)")
    results = []
    for model in args.models.split(","):
        for policy in args.policies.split(","):
            for shard in args.shard.split(","):
                if policy.startswith("fsdp") and shard != "full":
                    continue  # FSDP's rule shards
                row_args = argparse.Namespace(**dict(vars(args), model=model, policy=policy,
                                                     shard=shard))
                try:
                    results.append(spawn_ranks(rank_main, row_args))
                except Exception as e:  # noqa: BLE001 (a failed row is a row)
                    results.append(dict(model=model, policy=policy, shard=shard,
                                        ranks=args.ranks, error=str(e).splitlines()[-1][:120]))
                if not args.json:
                    if len(results) == 1:
                        print(_header())
                    print(_row(results[-1]), flush=True)
    if args.json:
        print(json.dumps(results, indent=1))
    return 1 if any(r.get("peak_off_bytes") for r in results) else 0


def _header():
    return ("| model | policy | shard | ranks | DDP step peak | predicted step peak "
            "| measured - predicted | parameters vs DDP | recomputations | s |\n"
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


def _row(r):
    if "error" in r:
        return f"| {r['model']} | {r['policy']} | {r['shard']} | {r['ranks']} | {r['error']} |"
    return (f"| {r['model']} | {r['policy']} | {r['shard']} | {r['ranks']} | "
            f"{r['ddp_step_peak_bytes']:,} | {r['predicted_step_peak_bytes']:,} | "
            f"{r['peak_off_bytes']:+,} B | "
            f"{r['parameters_from_ddp']:.1e} ({r['parameter']}) | {r['recomputations']} | "
            f"{r['seconds']} |")


if __name__ == "__main__":
    sys.exit(main())
