#!/usr/bin/env python3
"""Where the optimizer's state lives, planned per tensor or by a fixed rule.

    bench/state_placement.py --pebble build/bin/pebble [--model M] [--policy P]
                             [--budgets 40MiB,50MiB,...] [--bandwidth B] [--parameters]
                             [--zero-offload --host-rate BYTES_PER_S]

For each budget, plans the model's training step with Adam (the model spec
must not set optimizer= or optimizer_state=) three ways: the state resident
(`optimizer_state=device`, what PyTorch does), all of it on the host and
streamed through the updates (`host`, ZeRO-Offload's placement of the state,
the updates still on the device) and placed per tensor by the plan (`auto`).
Prints a Markdown table: whether each fits, its peak, the bytes copied and
the modelled makespan, and auto's makespan over the fixed host rule's. With
--parameters the parameters the optimizer updates are placed the same way
(`parameters=` device, host or auto beside the state's). With --zero-offload
every row drops the gradients (`gradients=drop`: each leaves the device once
its updates have read it) and a fourth row, `zero-offload`, is ZeRO-Offload's
whole rule: the state on the host, each gradient sent there as soon as it is
complete, Adam run on the host (`updates=host`) at --host-rate bytes per
second (read plus written), the parameters back on the device; and a fifth,
`updates=auto`, the state on the host with the plan choosing per parameter
whether its updates run on the host or the device; and a sixth, `both auto`,
the state and the updates placed together. All figures
are the simulator's (pebble plan --json), not measurements.
"""

import argparse
import json
import os
import subprocess
import tempfile

STATES = ("device", "host", "auto")


def plan(pebble, model, policy, budget, bandwidth, profile=None):
    cmd = [pebble, "plan", "--model", model, "--policy", policy, "--budget", budget, "--json"]
    if bandwidth:
        cmd += ["--bandwidth", bandwidth]
    if profile:
        cmd += ["--profile", profile]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if not done.stdout.strip():
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


def host_rate_profile(directory, bytes_per_s):
    """A cost profile that sets the host's update rate alone (no op entries,
    no link bandwidth: the model's FLOP costs and --bandwidth stay)."""
    path = os.path.join(directory, "host-rate.json")
    with open(path, "w") as f:
        json.dump({"format": "pebble-cost-profile", "version": 1, "backend": "cpu",
                   "device": "host update rate only", "bandwidth_h2d_bytes_per_s": 0,
                   "bandwidth_d2h_bytes_per_s": 0, "host_update_bytes_per_s": bytes_per_s,
                   "entries": {}}, f)
    return path


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
    parser.add_argument("--zero-offload", action="store_true",
                        help="drop the gradients in every row and add ZeRO-Offload's whole rule "
                             "(updates on the host)")
    parser.add_argument("--host-rate", type=float, default=10e9,
                        help="with --zero-offload: the host's update rate, bytes read plus "
                             "written per second (default 10e9)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        table(args, host_rate_profile(scratch, args.host_rate) if args.zero_offload else None)


def table(args, profile):
    rows = {s: f"optimizer_state={s}" + (f",parameters={s}" if args.parameters else "")
            for s in STATES}
    if args.zero_offload:
        rows = {name: keys + ",gradients=drop" for name, keys in rows.items()}
        rows["zero-offload"] = "updates=host,gradients=drop"
        rows["updates=auto"] = "updates=auto,gradients=drop"
        rows["both auto"] = "optimizer_state=auto,updates=auto,gradients=drop"
    print(f"{args.model} with {args.optimizer}, policy {args.policy}"
          f"{', bandwidth ' + args.bandwidth if args.bandwidth else ''}"
          f"{', parameters placed as the state' if args.parameters else ''}"
          f"{f', gradients dropped, host updates at {args.host_rate:.3g} B/s' if profile else ''}"
          "\n")
    print("| budget | state | fits | peak MiB | copied MiB | makespan ms | resident / streamed "
          "tensors | makespan over host's |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for budget in args.budgets.split(","):
        docs = {s: plan(args.pebble, f"{args.model},optimizer={args.optimizer},{keys}",
                        args.policy, budget, args.bandwidth, profile)
                for s, keys in rows.items()}
        host_makespan = docs["host"]["report"]["makespan"]
        for s in rows:
            d = docs[s]
            r = d["report"]
            p = d["details"].get("state_placement")
            u = d["details"].get("update_placement")
            split = " ".join(filter(None, [
                f"{p['resident_tensors']} / {p['streamed_tensors']}" if p else "",
                f"({u['host_parameters']} of {u['host_parameters'] + u['device_parameters']} "
                "updates on the host)" if u else ""]))
            ratio = (f"{r['makespan'] / host_makespan:.2f}"
                     if budget != "min" and d["feasible"] and docs["host"]["feasible"]
                     else "")
            print(f"| {budget} | {s} | {'yes' if d['feasible'] else 'no'} | "
                  f"{mib(r['peak_bytes'])} | {mib(r['transfer_bytes'])} | "
                  f"{1e3 * r['makespan']:.2f} | {split} | {ratio} |")


if __name__ == "__main__":
    main()
