#!/usr/bin/env python3
"""Wall-clock time of short `pebble` commands, where start-up is most of it:
the mean of --repeat runs each, in milliseconds, for every binary given.
Prints a Markdown table.

    bench/cli_startup.py --pebble build/bin/pebble [OTHER_BINARY ...] [--repeat 20]

The command line loads its CUDA backend only for --backend cuda
(docs/cuda.md, "The command line's CUDA backend"); give a binary that links
it (pebble_backends, as before the plugin) beside one that does not to see
what that start-up costs each command.
"""

import argparse
import statistics
import subprocess
import time

COMMANDS = [
    ["policies"],
    ["simulate", "--help"],
    ["plan", "--model", "mnist-cnn", "--policy", "dtr", "--budget", "min"],
    ["plan", "--model", "conv3d:n=16", "--policy", "rotor", "--budget", "70%", "--json"],
    ["run", "--model", "mnist-cnn:batch=2", "--policy", "dtr", "--budget", "min"],
]


def mean_ms(binary, command, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([binary] + command, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.mean(times), statistics.stdev(times) if repeat > 1 else 0.0


def binaries_and_repeat(doc, repeat):
    """The command line of a script that times `pebble` binaries: --pebble
    (the binaries) and --repeat (runs per command; `repeat` by default)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--pebble", nargs="+", default=["build/bin/pebble"],
                    help="the binaries to time (default build/bin/pebble)")
    ap.add_argument("--repeat", type=int, default=repeat,
                    help=f"runs per command (default {repeat})")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    return args


def main():
    args = binaries_and_repeat(__doc__, 20)
    print("| command | " + " | ".join(f"`{b}` ms" for b in args.pebble) + " |")
    print("| --- |" + " ---: |" * len(args.pebble))
    for command in COMMANDS:
        cells = []
        for binary in args.pebble:
            mean, stdev = mean_ms(binary, command, args.repeat)
            cells.append(f"{mean:.0f} ± {stdev:.0f}")
        print(f"| `pebble {' '.join(command)}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
