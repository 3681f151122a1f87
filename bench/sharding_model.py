#!/usr/bin/env python3
"""Sharded training in the model: per-rank memory and time of data
parallelism, of PyTorch FSDP's FULL_SHARD rule and of pebble's plans of the
sharded step, on the same models, ranks and link.

    PYTHONPATH=build/python /usr/bin/python3 bench/sharding_model.py
        [--models M1 M2 ...] [--ranks 2 4 8] [--network ib-ndr] [--time-limit 20]

Every figure is pebble's simulator's (a prediction), one rank's, in the zoo's cost model (analytic FLOPs at 10
TFLOP/s) and the link's nominal rate. Rows per (model, ranks):

- dp baseline: data parallelism, the graph's own order (what DDP runs,
  without its gradient buckets), each gradient all-reduced once complete;
- dp <policy>: data parallelism under pebble's plan at its least peak;
- fsdp, fsdp-module, fsdp-blocks: FULL_SHARD (scheduler/remat_fsdp.cc),
  each unit gathered before its forward and again before its backward, a
  unit being a parameter, a module, or a block of a module list (the rest
  in the root unit, kept for the backward);
- sharded <policy> min: pebble's plan of the sharded step at its least peak;
- sharded best @<rule>: pebble's plan within that FSDP rule's peak, the
  fastest such plan (makespan), where one fits.

The @ rows answer "at FSDP's memory, is pebble's plan at least as
fast?", and the min rows "how much lower can the memory go?". A model's
optimizer placement (optimizer_state=host, updates=host, parameters=host,
gradients=drop in its spec) applies to every row: sharding with ZeRO-Offload
(docs/training.md); the host memory and the bytes copied each way between
device and host are per rank too.
"""

import argparse
import datetime
import platform
import sys

import pebble

DEFAULT_MODELS = [
    "transformer:layers=8,dim=512,seq=256,heads=8,batch=4,vocab=8000,optimizer=adam",
    "resnet18:batch=16,image=112,optimizer=adam",
]
POLICIES = ["rotor", "dtr", "checkmate-lp", "hybrid"]
FSDP_RULES = ["fsdp", "fsdp-module", "fsdp-blocks"]


def mib(n):
    return f"{n / 2**20:.1f}"


def ms(s):
    return f"{1e3 * s:.2f}"


def plan(graph, policy, budget, ranks, args):
    try:
        return pebble.plan(graph, policy=policy, budget=budget, ranks=ranks,
                           network=args.network, time_limit=args.time_limit)
    except ValueError as e:
        print(f"  {policy} at {budget}: {e}", file=sys.stderr)
        return None


def rows_for(model, ranks, args):
    whole = pebble.model(model)
    sharded = pebble.shard(whole, ranks, network=args.network)
    rows = []

    def row(name, p):
        if p is None or not p.feasible:
            rows.append((name, "-", "-", "-", "-", "-", "-",
                         "does not fit" if p is not None else "error"))
            return
        r = p.report
        rows.append((name, mib(r["peak_bytes"]), mib(r.get("host_peak_bytes", 0)),
                     mib(r.get("transfer_bytes", 0)), ms(r["makespan"]),
                     ms(r.get("network_busy", 0.0)), str(r.get("collectives", 0)),
                     str(r["recomputations"])))

    row("dp baseline", plan(whole, "baseline", "100%", ranks, args))
    for policy in ("rotor", "dtr"):
        row(f"dp {policy} min", plan(whole, policy, "min", ranks, args))
    rules = {rule: plan(sharded, rule, "min", ranks, args) for rule in FSDP_RULES}
    for rule, p in rules.items():
        units = f", {p.details['fsdp_units']} units" if p is not None else ""
        row(f"{rule} (FULL_SHARD{units})", p)
    for policy in POLICIES:
        row(f"sharded {policy} min", plan(sharded, policy, "min", ranks, args))
    for rule, fsdp in rules.items():
        if fsdp is None or not fsdp.feasible:
            continue
        budget = str(fsdp.report["peak_bytes"])
        best = None
        for policy in POLICIES + ["baseline", "best-order"]:
            p = plan(sharded, policy, budget, ranks, args)
            if p is not None and p.feasible and (
                    best is None or p.report["makespan"] < best.report["makespan"]):
                best = p
        row(f"sharded best @{rule} ({best.policy if best else 'none'})", best)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--ranks", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--network", default="ib-ndr")
    parser.add_argument("--time-limit", type=float, default=20.0)
    args = parser.parse_args()
    print(f"# Sharding in the model ({datetime.date.today()})\n")
    print(f"Machine: {platform.node()} ({platform.machine()}), planning only; link "
          f"{args.network}; command: bench/sharding_model.py {' '.join(sys.argv[1:])}\n")
    for model in args.models:
        for ranks in args.ranks:
            print(f"## {model}, {ranks} ranks\n")
            print("| plan | peak per rank (MiB) | host peak (MiB) | copied (MiB) | "
                  "makespan (ms) | network busy (ms) | collectives | recomputations |")
            print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            for r in rows_for(model, ranks, args):
                print("| " + " | ".join(r) + " |")
            print()
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
