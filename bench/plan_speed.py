#!/usr/bin/env python3
"""Wall-clock time of `pebble` commands whose time is planning and
simulation (the planners call the simulator on each candidate): the mean of
--repeat runs each, in milliseconds, for every binary given, with each
command's output compared across the binaries (a change meant to keep
behaviour should print "same" in every row). Prints a Markdown table.

    bench/plan_speed.py --pebble OLD_BINARY NEW_BINARY [--repeat 3]

Every command has a time limit well above its time here, so that its plan
does not depend on the machine's speed (a search cut by its limit would).
"""

import json
import statistics
import subprocess
import time

from cli_startup import binaries_and_repeat

COMMANDS = [
    ["plan", "--model", "resnet50:batch=16,image=96", "--policy", "rotor", "--budget", "70%"],
    ["plan", "--model", "resnet50:batch=16,image=96", "--policy", "hybrid", "--budget", "60%"],
    # hybrid's recompute candidates composed (Note [hybrid's recompute
    # candidates composed]): each plans twice and its late outputs simulated.
    ["plan", "--model", "resnet18:batch=8", "--policy", "hybrid", "--budget", "min"],
    ["plan", "--model", "resnet18:batch=8", "--policy", "hybrid", "--budget", "60%"],
    ["plan", "--model", "transformer:layers=2,seq=64,dim=128", "--optimizer",
     "adam:state=auto,updates=auto", "--policy", "hybrid", "--budget", "min"],
    ["plan", "--model", "mnist-cnn:batch=8", "--optimizer", "adamw:max_grad_norm=1", "--ranks",
     "2", "--shard", "full", "--policy", "hybrid", "--budget", "min"],
    # the placement searches of an optimizer's updates and state (Note
    # [Placements planned once], scheduler/updates_last.cc)
    ["plan", "--model", "mnist-cnn:batch=8", "--optimizer", "adam:state=auto,updates=auto",
     "--ranks", "2", "--shard", "full", "--policy", "hybrid", "--budget", "min"],
    ["plan", "--model", "resnet18:batch=4,image=32", "--optimizer",
     "adam:state=auto,updates=auto", "--policy", "rotor", "--budget", "min"],
    ["plan", "--model", "transformer:layers=1,seq=32,dim=64,vocab=100", "--policy",
     "checkmate-lp", "--budget", "80%"],
]
TIME_LIMIT = ["--time-limit", "600"]


def run(binary, command):
    """Seconds of one run, and its JSON output without the timings."""
    start = time.perf_counter()
    done = subprocess.run([binary] + command + TIME_LIMIT + ["--json"], capture_output=True,
                          text=True, check=False)
    seconds = time.perf_counter() - start
    try:
        doc = json.loads(done.stdout)
    except json.JSONDecodeError:
        return seconds, (done.returncode, done.stderr)

    def untimed(x):
        if isinstance(x, dict):
            return {k: untimed(v) for k, v in x.items()
                    if not (k.endswith("_s") or k.endswith("seconds"))}
        return [untimed(v) for v in x] if isinstance(x, list) else x
    return seconds, (done.returncode, untimed(doc))


def main():
    args = binaries_and_repeat(__doc__, 3)
    print("| command | " + " | ".join(f"`{b}` ms" for b in args.pebble) + " | output |")
    print("| --- |" + " ---: |" * len(args.pebble) + " --- |")
    for command in COMMANDS:
        cells, outputs = [], []
        for binary in args.pebble:
            times = []
            for _ in range(args.repeat):
                seconds, output = run(binary, command)
                times.append(seconds * 1000.0)
            outputs.append(output)
            spread = statistics.stdev(times) if len(times) > 1 else 0.0
            cells.append(f"{statistics.mean(times):.0f} ± {spread:.0f}")
        same = "same" if all(o == outputs[0] for o in outputs) else "DIFFERS"
        print(f"| `pebble {' '.join(command)}` | " + " | ".join(cells) + f" | {same} |",
              flush=True)


if __name__ == "__main__":
    main()
