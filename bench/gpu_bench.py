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
convolutions in FMA math, and falls back to TF32 only where cuDNN refuses a
convolution even split: the row's note then counts conv_tf32_calls), so times
compare the same arithmetic.

Then, for the question the seed report asks ("what is the largest N this
card trains, and at what cost?"), `pebble fit --model conv3d --vary n
--budget B --verify --backend cuda` finds each policy's largest N within the
budget and runs it, and a binary search over N finds PyTorch's largest N
under the same memory fraction (eager and checkpoint): a second table
(--no-fit leaves it out). --no-pytorch leaves out every PyTorch case (and
PyTorch's largest N): pebble's rows alone, with no Python that has torch.

Writes bench/results/gpu-<device>-<date>.md (with -2, -3, ... added rather
than replacing an earlier table of the same day) and exits non-zero when a
pebble run fails for any reason other than an infeasible budget, or when a
PyTorch case fails for any reason other than OOM.

--device cpu runs the same cases on the CPU (`pebble run --backend cpu`,
PyTorch on the CPU, the '+fraction' cases left out: a memory fraction is a
CUDA allocator setting). It checks this script, its parsing and its table
without a GPU (tests/torch/gpu_bench_smoke.py); its times and peaks compare
nothing.
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


def run_pebble(pebble, n, policy, budget, backend, timeout, workspace="query"):
    # One warm-up step first, as on the PyTorch side: the first step also
    # pays for cuDNN's heuristics, lazy module loading and scratch growth.
    cmd = [pebble, "run", "--model", f"conv3d:n={n}", "--policy", policy, "--budget",
           budget, "--backend", backend, "--warmup", "1", "--workspace", workspace, "--json"]
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
    # What the backend had to do beyond the plan (docs/cuda.md): splits of
    # refused convolutions, and TF32 where even the splits were refused.
    events = ", ".join(f"{k} {v}" for k, v in sorted(m.get("backend_counters", {}).items()))
    if events:
        row["note"] = events
    return row, None


def run_fit(pebble, policies, budget, device, timeout, workspace="query"):
    """`pebble fit ... --verify --json` over N: (doc, failures). A failed
    command, or a verify run that failed, is a failure."""
    cmd = [pebble, "fit", "--model", "conv3d", "--vary", "n", "--budget", budget,
           "--policies", ",".join(policies), "--verify", "--backend", device,
           "--workspace", workspace, "--json"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, [f"pebble fit: over {timeout:g} s"]
    except OSError as e:
        return None, [f"pebble fit: {e}"]
    try:
        doc = json.loads(out.stdout) if out.returncode == 0 else None
    except json.JSONDecodeError:
        doc = None
    if doc is None:
        err = (out.stderr.strip().splitlines() or ["(no JSON document)"])[-1]
        return None, [f"pebble fit failed: {err}"]
    failures = [f"pebble fit: {r['policy']} at n={r.get('value')}: {r['verify_error']}"
                for r in doc.get("results", []) if r.get("verify_error")]
    return doc, failures


def fit_markdown(doc, device, torch_fits=()):
    """The largest-N table of a `pebble fit --verify --json` document, with
    PyTorch's largest N per mode (TORCH_FIT results) below pebble's rows."""
    lines = ["", f"## Largest N within {doc['budget']} (`pebble fit --model conv3d --vary n "
             f"--verify --backend {device}`)", "",
             "Each policy's largest N whose planned peak fits the budget, run once: measured "
             "peak beside the planned one, compute overhead over one pass, bytes moved to the "
             "host, and the step's time (one step, without a warm-up). The naive row is the "
             f"seed report's rule of thumb ({doc['naive']['rule']}).", "",
             "| policy | largest N | planned peak GiB | measured peak GiB | equal | overhead "
             "| transferred GiB | time s | note |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    naive = doc["naive"].get("value")
    lines.append(f"| naive | {'-' if naive is None else naive} | | | | | | | |")
    for r in doc["results"]:
        m = r.get("measured") or {}
        value = r.get("value")
        equal = {True: "yes", False: "NO"}.get(m.get("peak_equal"), "-")
        overhead = r.get("overhead")
        t = m.get("time_s")
        note = (r.get("verify_error") or r.get("note") or "").replace("|", "/")
        lines.append(f"| {r['policy']} | {'-' if value is None else value} | "
                     f"{gib(r.get('predicted_peak_bytes'))} | {gib(m.get('peak_bytes'))} | "
                     f"{equal} | {'-' if overhead is None else f'{overhead:.1%}'} | "
                     f"{gib(r.get('transfer_bytes'))} | {'-' if t is None else f'{t:.3f}'} | "
                     f"{note} |")
    for r in torch_fits:
        t, value = r.get("time_s"), r.get("largest_n")
        note = r.get("note", "")
        if value is not None and value >= r["upper_bound"]:
            note = (f"the search's upper bound; " + note).strip("; ")
        lines.append(f"| PyTorch {r['mode']} | {'-' if value is None else value} | | "
                     f"{gib(r.get('peak'))} | | | | {'-' if t is None else f'{t:.3f}'} | "
                     f"{note.replace('|', '/')} |")
    if torch_fits:
        lines += ["", "PyTorch rows: the largest N whose step raised no out-of-memory error "
                  "(a binary search, one process per mode, the allocator emptied after each "
                  "try), its torch.cuda.max_memory_allocated and the time of one more step."]
    return lines


# What both PyTorch snippets below share: argv[1:4] = mode, budget bytes,
# device; TF32 off; the memory fraction of '+fraction' modes; the seeded
# network and one training step of it.
TORCH_PRELUDE = r"""
import gc, json, sys, time, torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint
mode, budget, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.benchmark = False
dev = torch.device("cuda:0" if device == "cuda" else device)  # the fraction needs an index
on_gpu = dev.type == "cuda"
def sync():
    if on_gpu:
        torch.cuda.synchronize()
if mode.endswith("+fraction"):
    total = torch.cuda.get_device_properties(dev).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), dev)
torch.manual_seed(0)
blocks = nn.ModuleList([nn.Sequential(nn.Conv3d(i, o, 3, padding=1), nn.ReLU())
                        for i, o in ((1, 4), (4, 8), (8, 1))]).to(dev)
def volume(n):
    return torch.rand(1, 1, n, n, n, device=dev) * 2 - 1
def step(x, target):
    h = x
    for b in blocks:
        h = checkpoint(b, h, use_reentrant=False) if mode.startswith("checkpoint") else b(h)
    loss = nn.functional.mse_loss(h, target)
    loss.backward()
    for p in blocks.parameters():
        p.grad = None
    return loss
"""

# One case: argv[4] = N; the median of 3 steps after a warm-up, and the
# peak memory; an out-of-memory error recorded as OOM.
TORCH_CASE = TORCH_PRELUDE + r"""
n = int(sys.argv[4])
x, target = volume(n), volume(n)
res = {"status": "ok"}
try:
    step(x, target); sync()
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(3):
        sync(); t0 = time.perf_counter()
        step(x, target); sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    res["time_s"] = times[1]
    if on_gpu:
        res.update(peak=torch.cuda.max_memory_allocated(dev),
                   reserved=torch.cuda.max_memory_reserved(dev))
except torch.cuda.OutOfMemoryError as e:
    res = {"status": "OOM", "note": str(e).splitlines()[0][:160]}
print(json.dumps(res))
"""


# PyTorch's largest N for one mode, in one process (argv[4] = the upper
# bound): a binary search over N, each try one step, an out-of-memory error
# meaning "does not fit" (the caching allocator is emptied after every try,
# so an earlier failure does not fragment the next). '+fraction' modes cap
# the allocator at the budget; on the CPU nothing is capped and the search
# ends at the upper bound.
TORCH_FIT = TORCH_PRELUDE + r"""
hi = int(sys.argv[4])
def fits(n):
    try:
        step(volume(n), volume(n))
        sync()
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        gc.collect()
        if on_gpu:
            torch.cuda.empty_cache()
tries = []
lo, up = 0, hi + 1  # fits(lo) holds (or lo is 0), fits(up) does not (or up is hi + 1)
while up - lo > 1:
    mid = (lo + up) // 2
    ok = fits(mid)
    tries.append([mid, ok])
    lo, up = (mid, up) if ok else (lo, mid)
res = {"mode": mode, "largest_n": lo or None, "upper_bound": hi, "tries": tries}
if lo:
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    ok = fits(lo)
    res["time_s"] = time.perf_counter() - t0
    if on_gpu:
        res["peak"] = torch.cuda.max_memory_allocated(dev)
    if not ok:
        res["note"] = f"N={lo} fitted in the search and not on the timed step"
print(json.dumps(res))
"""


def run_torch_fit(python, mode, budget_bytes, device, upper, timeout):
    """PyTorch's largest N in `mode` (TORCH_FIT): (result, failure)."""
    what = f"PyTorch largest N ({mode})"
    try:
        out = subprocess.run([python, "-c", TORCH_FIT, mode, str(budget_bytes), device,
                              str(upper)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"{what}: over {timeout:g} s"
    except OSError as e:
        return None, f"{what}: {e}"
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        err = (out.stderr.strip().splitlines() or ["(no message)"])[-1]
        return None, f"{what} failed: {err[:160]}"
    return json.loads(lines[-1]), None


def run_torch(python, n, mode, budget_bytes, device, timeout):
    out = subprocess.run([python, "-c", TORCH_CASE, mode, str(budget_bytes), device, str(n)],
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


def device_name(python, device):
    if device == "cpu":
        return "cpu"
    out = subprocess.run([python, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                         capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True)
    except OSError:
        return "unknown-gpu"
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 else "unknown-gpu"


def torch_modes(device):
    """PyTorch cases per N; a memory fraction exists only for CUDA's allocator."""
    modes = ["eager", "checkpoint"]
    return modes + [m + "+fraction" for m in modes] if device == "cuda" else modes


def to_markdown(rows, device_label, device, budget, torch_version, remarks=(), fit_doc=None,
                torch_fits=()):
    if device == "cuda":
        memory = ("peak = measured peak of the executor's tensors, arena = the one cudaMalloc, "
                  "driver = cudaMemGetInfo's used bytes after the run (CUDA context and "
                  "libraries included). PyTorch "
                  f"{torch_version}: median of 3 steps after a warm-up; peak = "
                  "torch.cuda.max_memory_allocated; '+fraction' = "
                  f"set_per_process_memory_fraction({budget} / total).")
    else:
        memory = ("peak = measured peak of the executor's tensors, arena = its one "
                  f"allocation. PyTorch {torch_version} on the CPU: median of 3 steps after "
                  "a warm-up, no memory figures. A check of the benchmark script, not a "
                  "measurement to compare.")
    lines = [f"# conv3d on {device_label}: pebble policies vs PyTorch at a {budget} budget",
             "",
             f"Date: {datetime.date.today().isoformat()}. Model: `conv3d:n=N` (batch 1, fp32, "
             "TF32 off on both sides, except where a pebble row's note counts "
             f"conv_tf32_calls). pebble: `pebble run --backend {device} --budget "
             f"{budget} --warmup 1`, one training step after a warm-up step; its note "
             "lists the backend's events in that step (convolution splits, TF32 calls; "
             "refused algorithms are learned once, in the warm-up); " + memory, "",
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
    if fit_doc is not None:
        lines += fit_markdown(fit_doc, device, torch_fits)
    if remarks:
        lines += [""] + [f"- {r}" for r in remarks]
    return "\n".join(lines) + "\n"


def unused_path(directory, stem):
    """directory/stem.md, or stem-2.md, stem-3.md, ... : never an existing file."""
    path = os.path.join(directory, stem + ".md")
    k = 2
    while os.path.exists(path):
        path = os.path.join(directory, f"{stem}-{k}.md")
        k += 1
    return path


def guarded(case, what, timeout):
    """Runs case() -> (row, failure); a timeout or a missing program becomes a failed row."""
    try:
        return case()
    except subprocess.TimeoutExpired:
        row = dict(what, status="timeout", note=f"over {timeout:g} s")
    except OSError as e:
        row = dict(what, status="error", note=str(e))
    return row, f"{what['system']} {what['mode']} n={what['n']}: {row['note']}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pebble", default="build-gpu/bin/pebble")
    ap.add_argument("--python", default=sys.executable, help="Python with torch (CUDA)")
    ap.add_argument("--sizes", default="128,256,384,512")
    ap.add_argument("--budget", default="8GiB")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: the same cases on the CPU, to check this script without a GPU")
    ap.add_argument("--output-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per case")
    ap.add_argument("--workspace", choices=["query", "graph"], default="query",
                    help="pebble run/fit --workspace: query (the default) plans each kernel's "
                         "scratch in the arena; graph leaves it outside, as scratch")
    ap.add_argument("--no-fit", action="store_true",
                    help="leave out the largest-N table (pebble fit --verify, and "
                         "PyTorch's largest N)")
    ap.add_argument("--no-pytorch", action="store_true",
                    help="leave out the PyTorch cases and PyTorch's largest N: pebble's "
                         "rows alone")
    ap.add_argument("--torch-fit-max", type=int, default=None,
                    help="upper bound of the search for PyTorch's largest N (default "
                         "2048; 32 with --device cpu, where nothing caps the search)")
    args = ap.parse_args()

    if args.torch_fit_max is None:
        args.torch_fit_max = 2048 if args.device == "cuda" else 32
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s]
        budget_bytes = parse_size(args.budget)
    except ValueError as e:
        print(f"gpu_bench: {e} (--sizes takes N,N,...; --budget a size such as 8GiB)",
              file=sys.stderr)
        return 2
    if not sizes or min(sizes) < 1:
        print(f"gpu_bench: --sizes '{args.sizes}' names no positive N", file=sys.stderr)
        return 2
    try:
        policies = registered_policies(args.pebble)
    except (OSError, RuntimeError, json.JSONDecodeError) as e:
        print(f"gpu_bench: cannot list the policies of {args.pebble}: {e}", file=sys.stderr)
        return 2
    if not policies:
        print(f"gpu_bench: {args.pebble} registers none of {', '.join(POLICIES)}",
              file=sys.stderr)
        return 2
    rows, failures, remarks = [], [], []
    torch_ok = not args.no_pytorch
    if args.no_pytorch:
        torch_version = "(not run)"
        remarks.append("PyTorch's cases left out (--no-pytorch)")
    else:
        tv = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                            capture_output=True, text=True)
        if tv.returncode != 0:
            print("gpu_bench: PyTorch is not importable with " + args.python, file=sys.stderr)
            return 1
        torch_version = tv.stdout.strip()
    device_label = device_name(args.python, args.device)

    if args.device == "cuda" and torch_ok:
        cu = subprocess.run([args.python, "-c",
                             "import torch; print(torch.cuda.is_available())"],
                            capture_output=True, text=True)
        if cu.stdout.strip() != "True":
            # pebble's rows still run; the table says what is missing.
            torch_ok = False
            remarks.append(f"PyTorch {torch_version} at {args.python} cannot use CUDA, so "
                           "the table has no PyTorch rows; pass --python with a CUDA "
                           "build of PyTorch")
            failures.append(remarks[-1])
    cases = []
    for n in sizes:
        for policy in policies:
            cases.append(({"system": "pebble", "mode": policy, "n": n},
                          lambda n=n, p=policy: run_pebble(args.pebble, n, p, args.budget,
                                                           args.device, args.timeout,
                                                           args.workspace)))
        for mode in torch_modes(args.device) if torch_ok else []:
            cases.append(({"system": "pytorch", "mode": mode, "n": n},
                          lambda n=n, m=mode: run_torch(args.python, n, m, budget_bytes,
                                                        args.device, args.timeout)))
    for what, case in cases:
        row, failure = guarded(case, what, args.timeout)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if failure:
            failures.append(failure)

    fit_doc, torch_fits = None, []
    if not args.no_fit:
        fit_doc, fit_failures = run_fit(args.pebble, policies, args.budget, args.device,
                                        args.timeout, args.workspace)
        failures += fit_failures
        remarks += fit_failures
        if fit_doc is not None:
            print(json.dumps({"system": "pebble-fit", "results": fit_doc["results"],
                              "naive": fit_doc["naive"]}), flush=True)
        # Under the budget's cap on the GPU; on the CPU uncapped (a check of
        # the search only).
        fit_modes = [m for m in torch_modes(args.device) if "+fraction" in m] or \
            torch_modes(args.device)
        for mode in fit_modes if torch_ok else []:
            result, failure = run_torch_fit(args.python, mode, budget_bytes, args.device,
                                            args.torch_fit_max, args.timeout)
            if failure:
                failures.append(failure)
                remarks.append(failure)
                continue
            torch_fits.append(result)
            print(json.dumps(dict(result, system="pytorch-fit")), flush=True)

    os.makedirs(args.output_dir, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device_label).strip("-").lower()
    path = unused_path(args.output_dir, f"gpu-{slug}-{datetime.date.today().isoformat()}")
    with open(path, "w") as f:
        f.write(to_markdown(rows, device_label, args.device, args.budget, torch_version,
                            remarks, fit_doc, torch_fits))
    print(f"gpu_bench: wrote {path}")
    for failure in failures:
        print("gpu_bench: FAILED: " + failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
