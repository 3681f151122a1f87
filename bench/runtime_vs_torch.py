#!/usr/bin/env python3
"""CPU training step, pebble against PyTorch, side by side on the same shapes.

For each model, one training step (forward, loss, backward; no optimizer
update) is timed and its peak memory measured:

- pebble: `pebble run --backend cpu --json --warmup 1` per policy; the step
  time is `measured.time_s` (the executor's events around the step's kernels
  and copies, after one warm-up step), the peak is `measured.peak_bytes` (the
  bytes of the tensors the executor held: parameters, data batch,
  activations, gradients, workspaces; equal to the plan's prediction) and
  the arena `measured.arena_bytes` (what was really allocated for them).
- PyTorch (the twins of tests/torch/models.py: same shapes, same state_dict
  names): the median wall time of `repeat` steps after one warm-up step,
  with the same number of threads (--threads, default every logical CPU:
  torch.set_num_threads and OMP_NUM_THREADS for pebble's oneDNN); the peak is the bytes of the parameters,
  buffers and data batch, plus the high-water mark of the allocations made
  during the step as torch.profiler records them (profile_memory=True: one
  "[memory]" record per CPU allocation and free of the step's tensors, read
  from the profiler's Kineto results in time order; the maximum of the
  running sum of their sizes). This counts tensors as PyTorch's
  allocator sees them (gradients included), not allocator caching or the
  interpreter, so it is comparable to pebble's peak.

Usage: bench/runtime_vs_torch.py [--pebble build/bin/pebble] [--repeat 3]
           [--models conv3d:n=64,resnet18:batch=16,image=64]
Prints a Markdown table (paste into bench/results/runtime-cpu-*.md).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# (policy, budget): the baseline, the best one-shot order, recomputation
# (rotor, at its lowest peak) and the joint recompute-or-swap planner.
POLICIES = [("baseline", "100%"), ("best-order", "100%"), ("rotor", "min"),
            ("hybrid", "min")]


def pebble_step(pebble, model, policy, budget, repeat, threads):
    """Median step time (s), measured peak and arena bytes, predicted peak."""
    times, doc = [], None
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    for _ in range(repeat):
        proc = subprocess.run(
            [pebble, "run", "--model", model, "--policy", policy, "--budget",
             budget, "--backend", "cpu", "--json", "--warmup", "1"],
            capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            return {"error": proc.stderr.strip()}
        doc = json.loads(proc.stdout)
        times.append(doc["measured"]["time_s"])
    m = doc["measured"]
    return {"time_s": statistics.median(times),
            "peak_bytes": m["peak_bytes"],
            "arena_bytes": m["arena_bytes"],
            "predicted_peak_bytes": doc["predicted"]["peak_bytes"],
            "overhead": doc["predicted"]["overhead"],
            "feasible": doc["feasible"],
            "loss": doc["loss"]}


def torch_step(model, repeat, threads):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))
    import models as twins  # tests/torch/models.py
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    case = twins.build(model)
    module = case.module.train()
    x, t = case.make_batch(torch.Generator().manual_seed(0))

    def step():
        for p in module.parameters():
            p.grad = None
        loss = module(x, t)
        loss.backward()
        return loss

    step()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    persistent = sum(p.numel() * p.element_size() for p in module.parameters())
    persistent += sum(b.numel() * b.element_size() for b in module.buffers())
    persistent += x.numel() * x.element_size() + t.numel() * t.element_size()
    for p in module.parameters():
        p.grad = None
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = step()
        del loss
    # One "[memory]" record per allocation (+bytes) and free (-bytes), in
    # the order they happened (the sort is stable on equal timestamps).
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_us())
    running, high = 0, 0
    for e in events:
        running += e.nbytes()
        high = max(high, running)
    return {"time_s": statistics.median(times), "peak_bytes": persistent + high,
            "threads": torch.get_num_threads(), "version": torch.__version__}


def mib(b):
    return "%.1f" % (b / 2**20)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pebble", default=os.path.join(ROOT, "build", "bin", "pebble"))
    parser.add_argument("--models", default="conv3d:n=64;resnet18:batch=16,image=64",
                        help="';'-separated model specs")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="threads for both (default: every logical CPU)")
    args = parser.parse_args()
    print("machine: %s, %d logical CPUs; python %s" %
          (platform.processor() or platform.machine(), os.cpu_count(),
           platform.python_version()))
    rows = []
    for model in filter(None, args.models.split(";")):
        ref = torch_step(model, args.repeat, args.threads)
        rows.append((model, "PyTorch %s (%d threads)" % (ref["version"], ref["threads"]),
                     ref["time_s"], ref["peak_bytes"], None, "", ""))
        for policy, budget in POLICIES:
            r = pebble_step(args.pebble, model, policy, budget, args.repeat, args.threads)
            if "error" in r:
                rows.append((model, "pebble %s %s" % (policy, budget), None, None, None, "",
                             r["error"]))
                continue
            note = "" if r["peak_bytes"] == r["predicted_peak_bytes"] else "MEASURED != PREDICTED"
            rows.append((model, "pebble %s %s" % (policy, budget), r["time_s"],
                         r["peak_bytes"], r["arena_bytes"], "%.1f%%" % (100 * r["overhead"]),
                         note))
        sys.stdout.flush()
    print()
    print("| model | run | step time (s) | vs PyTorch | peak (MiB) | PyTorch / peak | arena (MiB) "
          "| recompute overhead | note |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    ref_time = ref_peak = None
    for model, run, t, peak, arena, overhead, note in rows:
        if run.startswith("PyTorch"):
            ref_time, ref_peak = t, peak
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            model, run, "%.4f" % t if t is not None else "-",
            "%.2fx" % (t / ref_time) if t is not None and ref_time else "-",
            mib(peak) if peak is not None else "-",
            "%.2fx" % (ref_peak / peak) if peak else "-",
            mib(arena) if arena is not None else "", overhead.replace("-0.0%", "0.0%"), note))
    print()
    print("vs PyTorch: step time over PyTorch's (below 1: faster). PyTorch / peak: PyTorch's "
          "peak over this run's (above 1: pebble needs less).")


if __name__ == "__main__":
    main()
