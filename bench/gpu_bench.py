#!/usr/bin/env python3
"""GPU benchmark: pebble's policies beside PyTorch on the seed conv3d network.

For every volume edge N (default 128, 256, 384, 512) the training step of
conv3d:n=N (three Conv3d+ReLU layers, 1->4->8->1 channels, MSE loss; see
docs/models.md) runs

  * under each pebble policy (baseline, best-order, sqrtn, chen-greedy, and
    hybrid when this pebble registers it) at the memory budget (default
    8 GiB, the seed report's card class) through
    `pebble run --backend cuda --json`: feasibility, measured peak, arena,
    driver view (cudaMemGetInfo) and time;
  * in PyTorch: eager, torch.utils.checkpoint (each Conv3d+ReLU block a
    segment), and both again under
    torch.cuda.set_per_process_memory_fraction(budget / total): time and
    torch.cuda.max_memory_allocated, an out-of-memory error recorded as OOM.
    Each PyTorch case runs in its own process (a fraction, once set, holds
    for the process; an OOM leaves the caching allocator fragmented).

fp32 everywhere with TF32 off on both sides (pebble's CUDA backend runs fp32
convolutions in FMA math), so times compare the same arithmetic.

Writes bench/results/gpu-<device>-<date>.md and exits non-zero when a pebble
run fails for any reason other than an infeasible budget, or when a PyTorch
case fails for any reason other than OOM.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time

POLICIES = ["baseline", "best-order", "sqrtn", "chen-greedy", "hybrid"]


def parse_size(text):
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]i?B|B)?\s*", text)
    if not m:
        raise ValueError(f"bad size '{text}'")
    mult = {None: 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
            "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[m.group(2)]
    return int(float(m.group(1)) * mult)


def gib(b):
    return "-" if b is None else f"{b / 2**30:.2f}"


def registered_policies(pebble):
    out = subprocess.run([pebble, "policies", "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"pebble policies failed: {out.stderr.strip()}")
    doc = json.loads(out.stdout)
    items = doc.get("policies", doc) if isinstance(doc, dict) else doc
    names = {p["name"] if isinstance(p, dict) else p for p in items}
    return [p for p in POLICIES if p in names]


def run_pebble(pebble, n, policy, budget, timeout):
    cmd = [pebble, "run", "--model", f"conv3d:n={n}", "--policy", policy, "--budget",
           budget, "--backend", "cuda", "--json"]
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.time() - t0
    row = {"system": "pebble", "mode": policy, "n": n, "wall_s": wall}
    doc = None
    if out.stdout.strip():
        try:
            doc = json.loads(out.stdout)
        except json.JSONDecodeError:
            doc = None
    if doc is not None and doc.get("feasible") is False:
        row["status"] = "infeasible"
        row["note"] = doc.get("message", "")
        return row, None
    if out.returncode != 0 or doc is None:
        err = out.stderr.strip().splitlines()[-1:] or ["(no message)"]
        if "infeasib" in out.stderr or "does not fit" in out.stderr:
            row["status"] = "infeasible"
            row["note"] = err[0]
            return row, None
        row["status"] = "error"
        row["note"] = err[0]
        return row, f"pebble run {policy} n={n} failed: {err[0]}"
    m = doc.get("measured", {})
    p = doc.get("predicted", {})
    row.update(status="ok", peak=m.get("peak_bytes"), arena=m.get("arena_bytes"),
               driver=m.get("driver_bytes_in_use"), scratch=m.get("scratch_bytes"),
               time_s=m.get("time_s"), predicted_peak=p.get("peak_bytes"),
               peak_equal=doc.get("peak_equal"))
    return row, None


TORCH_CASE = r"""
import json, sys, time, torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint
n, mode, budget = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.benchmark = False
dev = torch.device("cuda")
total = torch.cuda.get_device_properties(dev).total_memory
if mode.endswith("+fraction"):
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), dev)
torch.manual_seed(0)
blocks = nn.ModuleList([nn.Sequential(nn.Conv3d(i, o, 3, padding=1), nn.ReLU())
                        for i, o in ((1, 4), (4, 8), (8, 1))]).to(dev)
x = torch.rand(1, 1, n, n, n, device=dev) * 2 - 1
target = torch.rand(1, 1, n, n, n, device=dev) * 2 - 1
def step():
    h = x
    for b in blocks:
        h = checkpoint(b, h, use_reentrant=False) if mode.startswith("checkpoint") else b(h)
    loss = nn.functional.mse_loss(h, target)
    loss.backward()
    for p in blocks.parameters():
        p.grad = None
    return loss
res = {"status": "ok"}
try:
    step(); torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(3):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        step(); torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times.sort()
    res.update(time_s=times[1], peak=torch.cuda.max_memory_allocated(dev),
               reserved=torch.cuda.max_memory_reserved(dev))
except torch.cuda.OutOfMemoryError as e:
    res = {"status": "OOM", "note": str(e).splitlines()[0][:160]}
print(json.dumps(res))
"""


def run_torch(python, n, mode, budget_bytes, timeout):
    out = subprocess.run([python, "-c", TORCH_CASE, str(n), mode, str(budget_bytes)],
                         capture_output=True, text=True, timeout=timeout)
    row = {"system": "pytorch", "mode": mode, "n": n}
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        err = (out.stderr.strip().splitlines() or ["(no message)"])[-1]
        if "OutOfMemoryError" in out.stderr or "out of memory" in out.stderr:
            row.update(status="OOM", note=err[:160])
            return row, None
        row.update(status="error", note=err[:160])
        return row, f"PyTorch {mode} n={n} failed: {err}"
    row.update(json.loads(lines[-1]))
    return row, None


def device_name(python):
    out = subprocess.run([python, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                         capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip()
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 else "unknown-gpu"


def to_markdown(rows, device, budget, torch_version):
    lines = [f"# conv3d on {device}: pebble policies vs PyTorch at a {budget} budget", "",
             f"Date: {datetime.date.today().isoformat()}. Model: `conv3d:n=N` (batch 1, fp32, "
             "TF32 off on both sides). pebble: `pebble run --backend cuda --budget "
             f"{budget}`, one training step; peak = measured peak of the executor's "
             "tensors, arena = the one cudaMalloc, driver = cudaMemGetInfo's used bytes "
             "after the run (CUDA context and libraries included). PyTorch "
             f"{torch_version}: median of 3 steps after a warm-up; peak = "
             "torch.cuda.max_memory_allocated; '+fraction' = "
             f"set_per_process_memory_fraction({budget} / total).", "",
             "| N | system | policy / mode | status | peak GiB | arena / reserved GiB | "
             "driver GiB | time s | note |",
             "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        second = r.get("arena") if r["system"] == "pebble" else r.get("reserved")
        t = r.get("time_s")
        note = r.get("note", "")
        if r["system"] == "pebble" and r.get("status") == "ok" and r.get("peak_equal") is False:
            note = (note + " measured peak != predicted").strip()
        lines.append(f"| {r['n']} | {r['system']} | {r['mode']} | {r.get('status')} | "
                     f"{gib(r.get('peak'))} | {gib(second)} | {gib(r.get('driver'))} | "
                     f"{'-' if t is None else f'{t:.3f}'} | {note.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pebble", default="build-gpu/bin/pebble")
    ap.add_argument("--python", default=sys.executable, help="Python with torch (CUDA)")
    ap.add_argument("--sizes", default="128,256,384,512")
    ap.add_argument("--budget", default="8GiB")
    ap.add_argument("--output-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per case")
    args = ap.parse_args()

    sizes = [int(s) for s in args.sizes.split(",") if s]
    budget_bytes = parse_size(args.budget)
    policies = registered_policies(args.pebble)
    device = device_name(args.python)
    tv = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                        capture_output=True, text=True)
    torch_version = tv.stdout.strip() if tv.returncode == 0 else "(not found)"
    if tv.returncode != 0:
        print("gpu_bench: PyTorch is not importable with " + args.python, file=sys.stderr)
        return 1

    rows, failures = [], []
    for n in sizes:
        for policy in policies:
            row, failure = run_pebble(args.pebble, n, policy, args.budget, args.timeout)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if failure:
                failures.append(failure)
        for mode in ["eager", "checkpoint", "eager+fraction", "checkpoint+fraction"]:
            row, failure = run_torch(args.python, n, mode, budget_bytes, args.timeout)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if failure:
                failures.append(failure)

    os.makedirs(args.output_dir, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower()
    path = os.path.join(args.output_dir,
                        f"gpu-{slug}-{datetime.date.today().isoformat()}.md")
    with open(path, "w") as f:
        f.write(to_markdown(rows, device, args.budget, torch_version))
    print(f"gpu_bench: wrote {path}")
    for failure in failures:
        print("gpu_bench: FAILED: " + failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
