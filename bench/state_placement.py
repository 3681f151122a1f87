#!/usr/bin/env python3
"""Where the optimizer's state lives, planned per tensor or by a fixed rule.

    bench/state_placement.py --pebble build/bin/pebble [--model M] [--policy P]
                             [--budgets 40MiB,50MiB,...] [--bandwidth B] [--parameters]

For each budget, plans the model's training step with Adam (the model spec
must not set optimizer= or optimizer_state=) three ways: the state resident
(`optimizer_state=device`, what PyTorch does), all of it on the host and
streamed through the updates (`host`, ZeRO-Offload's placement of the state,
the updates still on the device) and placed per tensor by the plan (`auto`).
Prints a Markdown table: whether each fits, its peak, the bytes copied and
the modelled makespan, and auto's makespan over the fixed host rule's. With
--parameters the parameters the optimizer updates are placed the same way
(`parameters=` device, host or auto beside the state's). All figures are the
simulator's (pebble plan --json), not measurements.
"""

import argparse
import json
import subprocess

STATES = ("device", "host", "auto")


def plan(pebble, model, policy, budget, bandwidth):
    cmd = [pebble, "plan", "--model", model, "--policy", policy, "--budget", budget, "--json"]
    if bandwidth:
        cmd += ["--bandwidth", bandwidth]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if not done.stdout.strip():
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


def mib(nbytes):
    return f"{nbytes / 2**20:.1f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pebble", default="build/bin/pebble")
    parser.add_argument("--model", default="transformer:layers=6")
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--policy", default="rotor")
    parser.add_argument("--budgets", default="min,40MiB,50MiB,60MiB,70MiB,80MiB,100%")
    parser.add_argument("--bandwidth", default=None)
    parser.add_argument("--parameters", action="store_true",
                        help="place the parameters as the state is placed")
    args = parser.parse_args()
    print(f"{args.model} with {args.optimizer}, policy {args.policy}"
          f"{', bandwidth ' + args.bandwidth if args.bandwidth else ''}"
          f"{', parameters placed as the state' if args.parameters else ''}\n")
    print("| budget | state | fits | peak MiB | copied MiB | makespan ms | resident / streamed "
          "tensors | makespan over host's |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for budget in args.budgets.split(","):
        docs = {s: plan(args.pebble, f"{args.model},optimizer={args.optimizer},"
                        f"optimizer_state={s}" + (f",parameters={s}" if args.parameters else ""),
                        args.policy, budget, args.bandwidth)
                for s in STATES}
        host_makespan = docs["host"]["report"]["makespan"]
        for s in STATES:
            d = docs[s]
            r = d["report"]
            p = d["details"].get("state_placement")
            split = f"{p['resident_tensors']} / {p['streamed_tensors']}" if p else ""
            ratio = (f"{r['makespan'] / host_makespan:.2f}"
                     if budget != "min" and d["feasible"] and docs["host"]["feasible"]
                     else "")
            print(f"| {budget} | {s} | {'yes' if d['feasible'] else 'no'} | "
                  f"{mib(r['peak_bytes'])} | {mib(r['transfer_bytes'])} | "
                  f"{1e3 * r['makespan']:.2f} | {split} | {ratio} |")


if __name__ == "__main__":
    main()
