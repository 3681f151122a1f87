#!/usr/bin/env python3
"""Gradient buckets of data parallelism: one all-reduce per gradient,
DistributedDataParallel's 25 MiB rule, and the buckets pebble plans
(`--buckets none | 25MiB | auto`; docs/semantics.md, "Buckets").

    PYTHONPATH=build/python /usr/bin/python3 bench/buckets.py
        [--models M1 M2 ...] [--ranks 4] [--networks ethernet-10g ib-ndr]
        [--measure] [--measure-models M ...] [--measure-network 1.2e9]
        [--measure-latency 150e-6] [--repeats 3]

Part 1, the model: for each model, link and rule, the plan's collectives
(buckets), the network's busy time and the makespan of one rank, under the
graph's own order at 100% (what DDP runs) and under rotor at its least
peak. Every figure is the simulator's (analytic FLOPs at 10 TFLOP/s, the
link's nominal rate): a prediction.

Part 2, --measure: two ranks of the C++ runtime on this machine (gloo over
loopback, one process a rank), each rule planned for the link given
(--measure-network, --measure-latency: measure yours with
`scripts/pebble-ranks 2 -- calibrate --ranks 2 ...`). Printed: the
collectives the plan runs, the network's busy time the plan predicts on
that link, the measured time of its all-reduces (`collective_time_s`, rank
0, the least of --repeats runs: each from its issue to its sums' copy back,
beside the compute) and of the whole step (the fastest run).
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile

import pebble

DEFAULT_MODELS = [
    "resnet18:batch=8,image=64,optimizer=sgd",
    "transformer:layers=6,dim=256,seq=128,heads=8,batch=4,vocab=8000,optimizer=adam",
    "resnet50:batch=4,image=64,optimizer=sgd",
]
RULES = ["none", "25MiB", "auto"]
REPO = pathlib.Path(__file__).resolve().parent.parent


def ms(s):
    return f"{1e3 * s:.2f}"


def model_rows(model, ranks, network):
    graph = pebble.model(model)
    rows = []
    for policy, budget in (("baseline", "100%"), ("rotor", "min")):
        for rule in RULES:
            p = pebble.plan(graph, policy=policy, budget=budget, ranks=ranks, network=network,
                            buckets=rule, time_limit=60)
            c = p.details["collectives"]
            rows.append([model, network, f"{policy} {budget}", rule, str(c["all_reduce"]),
                         str(c["buckets"]), f"{c['largest_bucket_bytes'] / 2**20:.1f}",
                         ms(c["network_busy"]), ms(p.report["makespan"]),
                         f"{p.report['peak_bytes'] / 2**20:.1f}"])
    return rows


def run_ranks(pebble_bin, model, rule, args):
    """Rank 0's `pebble run --json` document, two ranks, one process each."""
    with tempfile.TemporaryDirectory(prefix="pebble-buckets-") as tmp:
        rendezvous = os.path.join(tmp, "meet")
        os.mkdir(rendezvous)
        common = [pebble_bin, "run", "--model", model, "--policy", "baseline",
                  "--ranks", "2", "--rendezvous", rendezvous, "--buckets", rule,
                  "--network", str(args.measure_network),
                  "--network-latency", str(args.measure_latency), "--warmup", "1", "--json"]
        procs = [subprocess.Popen(common + ["--rank", str(r)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for r in range(2)]
        outs = [p.communicate(timeout=600) for p in procs]
        for p, (out, err) in zip(procs, outs):
            if p.returncode != 0:
                sys.exit(f"bench/buckets.py: pebble run failed ({model}, --buckets {rule}): "
                         f"{err.strip()}")
        return json.loads(outs[0][0])


def measured_rows(model, args):
    pebble_bin = str(REPO / "build" / "bin" / "pebble")
    rows = []
    for rule in RULES:
        runs = [run_ranks(pebble_bin, model, rule, args) for _ in range(args.repeats)]
        best = min(runs, key=lambda d: d["measured"]["time_s"])
        c = best["collectives"]
        rows.append([model, rule, str(c.get("all_reduce", "")), str(c.get("buckets", "")),
                     ms(c["predicted_network_busy_s"]),
                     ms(min(d["measured"]["collective_time_s"] for d in runs)),
                     ms(best["measured"]["time_s"])])
    return rows


def table(header, rows):
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--networks", nargs="+", default=["ethernet-10g", "ib-ndr"])
    ap.add_argument("--measure", action="store_true",
                    help="also run two ranks of the C++ runtime here (gloo, loopback)")
    ap.add_argument("--measure-models", nargs="+",
                    default=["mnist-cnn:batch=8,optimizer=sgd",
                             "resnet18:batch=2,image=32,optimizer=sgd"])
    ap.add_argument("--measure-network", type=float, default=1.2e9,
                    help="bytes/s of the link the measured plans assume")
    ap.add_argument("--measure-latency", type=float, default=150e-6,
                    help="seconds a message on the link the measured plans assume")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    print(f"# Gradient buckets: {platform.node()}, {datetime.date.today()}")
    print(f"\nModel ({args.ranks} ranks; times in ms, sizes in MiB):\n")
    rows = []
    for model in args.models:
        for network in args.networks:
            rows += model_rows(model, args.ranks, network)
    table(["model", "link", "plan", "buckets", "all-reduces", "collectives", "largest",
           "network busy", "makespan", "peak"], rows)
    if args.measure:
        print(f"\nMeasured, 2 ranks of the C++ runtime (CPU, gloo over loopback; plans for "
              f"{args.measure_network:g} B/s and {args.measure_latency:g} s a message; "
              "times in ms, rank 0, best of "
              f"{args.repeats}):\n")
        rows = []
        for model in args.measure_models:
            rows += measured_rows(model, args)
        table(["model", "buckets", "all-reduces", "collectives", "network busy predicted",
               "all-reduce time measured", "step time measured"], rows)


if __name__ == "__main__":
    main()
