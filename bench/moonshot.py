#!/usr/bin/env python3
"""The moonshot table: the largest batch that trains in a fixed memory cap.

    PYTHONPATH=<pebble module> python3 bench/moonshot.py [--cap 16GiB]
        [--models gpt,resnet50,unet3d] [--modes eager,checkpoint,...]
        [--deadline 480] [--jobs 7] [--output-dir bench/results]

For each model and mode, a search over the batch size (doubling from the
eager batch, then bisecting) finds the largest batch whose training step
(forward, loss, backward, SGD update) runs under
torch.cuda.set_per_process_memory_fraction(cap / total) without an
out-of-memory error; the step is then timed at that batch (median of five
steps after one warm-up). Modes:

  eager          the model as written;
  checkpoint     torch.utils.checkpoint (use_reentrant=False) around each
                 block (GPT blocks, ResNet bottlenecks, U-Net conv blocks);
  compile-0.5    torch.compile of model and loss with
  compile-0.1      torch._functorch.config.activation_memory_budget = 0.5 / 0.1
                 (PyTorch 2.4 and later; the batch dimension marked dynamic so
                 one compilation serves every probe);
  pebble-<p>     pebble.torch.train_step under policy p (rotor, checkmate-lp,
                 dtr, hybrid) with the budget in bytes: the cap less a margin
                 (--pebble-margin, default 3%) for the allocator's rounding.
                 Calibration runs under the cap, as a user's would: where the
                 unplanned step does not fit, pebble calibrates under its own
                 least-peak plan, or else estimates (the row's note says which).

Models (fp32 with TF32 matrix products, except the U-Net):
  gpt       a GPT-2-style decoder: 12 layers, d=768, 12 heads, sequence 1024,
            vocabulary 50257, tied head (examples/torch/lm.py's model);
  resnet50  torchvision's, 224x224 images, 1000 classes;
  unet3d    a two-level 3-D U-Net (16 and 32 channels, batch norms, a
            ConvTranspose3d up and a skip concatenation) on 320x150x26
            volumes in half precision.

Jobs run as separate processes (a memory fraction holds for a process),
several at once on one GPU: each is capped, and their sum stays below the
card's memory. Every timed run holds a lock that no other job's GPU work
holds at the same time, so the step times are each measured alone; the
searches themselves overlap. A job still searching at --deadline is stopped,
and its row says the search was cut and gives the largest batch it reached.

--device cpu with --small runs tiny models without a cap enforced by an
allocator (a batch "fits" when the profiler's measured peak is within the cap):
it checks this script, not the claims.

Writes bench/results/gpu-moonshot-<gpu>-<date>.md and a .json beside it.
"""
import argparse
import contextlib
import datetime
import fcntl
import gc
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEBBLE_POLICIES = ["rotor", "checkmate-lp", "dtr", "hybrid"]
MODES = ["eager", "checkpoint", "compile-0.5", "compile-0.1"] + \
    [f"pebble-{p}" for p in PEBBLE_POLICIES]
MODELS = ["gpt", "resnet50", "unet3d"]


def parse_size(text):
    m = re.fullmatch(r"\s*([0-9.]+)\s*(B|KiB|MiB|GiB)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: give e.g. 16GiB or 512MiB")
    return int(float(m.group(1)) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[m.group(2)])


# ---------------------------------------------------------------- models

def _load_lm():
    spec = importlib.util.spec_from_file_location("lm", os.path.join(ROOT, "examples/torch/lm.py"))
    lm = importlib.util.module_from_spec(spec)
    sys.modules["lm"] = lm  # torch.compile looks the model's module up by name
    spec.loader.exec_module(lm)
    return lm


def build_model(name, small, device):
    """(model, make_batch(b) -> (x, y), loss_fn, blocks to checkpoint)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.manual_seed(0)
    if name == "gpt":
        lm = _load_lm()
        vocab, dim, heads, layers, seq = (256, 64, 4, 2, 64) if small else (50257, 768, 12, 12, 1024)
        model = lm.Gpt(vocab, dim, heads, layers, seq).to(device).train()

        def batch(b):
            g = torch.Generator().manual_seed(b)
            x = torch.randint(0, vocab, (b, seq), generator=g)
            return x.to(device), torch.roll(x, -1, 1).to(device)
        return model, batch, lm.lm_loss, list(model.blocks)
    if name == "resnet50":
        import torchvision
        model = (torchvision.models.resnet18(num_classes=10) if small else
                 torchvision.models.resnet50(num_classes=1000)).to(device).train()
        image, classes = (32, 10) if small else (224, 1000)

        def batch(b):
            g = torch.Generator().manual_seed(b)
            return (torch.randn(b, 3, image, image, generator=g).to(device),
                    torch.randint(0, classes, (b,), generator=g).to(device))
        blocks = [blk for layer in (model.layer1, model.layer2, model.layer3, model.layer4)
                  for blk in layer]
        return model, batch, F.cross_entropy, blocks
    if name == "unet3d":
        c = 4 if small else 16
        shape = (16, 16, 8) if small else (320, 150, 26)
        dtype = torch.float32 if small else torch.float16

        def conv_block(i, o):
            return nn.Sequential(nn.Conv3d(i, o, 3, padding=1), nn.BatchNorm3d(o), nn.ReLU(),
                                 nn.Conv3d(o, o, 3, padding=1), nn.BatchNorm3d(o), nn.ReLU())

        class UNet3d(nn.Module):
            def __init__(self):
                super().__init__()
                self.down = conv_block(1, c)
                self.bottom = conv_block(c, 2 * c)
                self.up = nn.ConvTranspose3d(2 * c, c, 2, stride=2)
                self.merge = conv_block(2 * c, c)
                self.out = nn.Conv3d(c, 1, 1)

            def forward(self, x):
                d = self.down(x)
                b = self.bottom(F.max_pool3d(d, 2))
                return self.out(self.merge(torch.cat([d, self.up(b)], dim=1)))
        model = UNet3d().to(device=device, dtype=dtype).train()

        def batch(b):
            g = torch.Generator().manual_seed(b)
            x = torch.randn(b, 1, *shape, generator=g).to(device=device, dtype=dtype)
            return x, (x > 0).to(dtype)
        return model, batch, F.mse_loss, [model.down, model.bottom, model.merge]
    raise ValueError(f"unknown model {name!r}: one of {', '.join(MODELS)}")


# ---------------------------------------------------------------- one GPU, shared

class GpuLock:
    """A readers-writer lock over files: searches hold it shared, a timed run
    holds it alone. The turnstile keeps a waiting timer from being starved by
    a stream of new readers."""

    def __init__(self, directory):
        self.main = open(os.path.join(directory, "gpu.lock"), "a+")
        self.turnstile = open(os.path.join(directory, "turnstile.lock"), "a+")

    @contextlib.contextmanager
    def shared(self):
        fcntl.flock(self.turnstile, fcntl.LOCK_EX)
        fcntl.flock(self.turnstile, fcntl.LOCK_UN)
        fcntl.flock(self.main, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(self.main, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def alone(self):
        fcntl.flock(self.turnstile, fcntl.LOCK_EX)
        fcntl.flock(self.main, fcntl.LOCK_EX)
        fcntl.flock(self.turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self.main, fcntl.LOCK_UN)


# ---------------------------------------------------------------- one job: a model under a mode

class Job:
    def __init__(self, args):
        import torch
        self.torch = torch
        self.args = args
        self.device = torch.device(args.device, 0) if args.device == "cuda" else \
            torch.device(args.device)
        self.cap = args.cap
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            total = torch.cuda.get_device_properties(self.device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.cap / total), self.device)
        self.model, self.batch, self.loss_fn, self.blocks = build_model(
            args.model, args.small, self.device)
        # A batch norm over one sample's 1x1 map has nothing to normalize.
        self.min_batch = 2 if args.model == "resnet50" else 1
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-6)
        self.notes = []
        self.pebble_margin = {}  # batch -> the margin its plan was made with, where not the default
        self.step_fn = self._make_step(args.mode)
        self.lock = GpuLock(args.lock_dir)

    # each mode's step(x, y) -> loss; the update and zeroing are run()'s
    def _make_step(self, mode):
        torch = self.torch
        if mode == "eager":
            return lambda x, y: self._backward(self.loss_fn(self.model(x), y))
        if mode == "checkpoint":
            from torch.utils.checkpoint import checkpoint
            for block in self.blocks:
                forward = block.forward
                block.forward = (lambda f: lambda *a: checkpoint(f, *a, use_reentrant=False))(forward)
            return lambda x, y: self._backward(self.loss_fn(self.model(x), y))
        if mode.startswith("compile-"):
            if not hasattr(torch, "compile"):
                raise Unavailable(f"torch.compile needs PyTorch 2 (this is {torch.__version__})")
            import torch._functorch.config as fconfig
            if not hasattr(fconfig, "activation_memory_budget"):
                raise Unavailable("this PyTorch has no activation_memory_budget (2.4 and later)")
            fconfig.activation_memory_budget = float(mode.split("-", 1)[1])
            compiled = torch.compile(lambda x, y: self.loss_fn(self.model(x), y))

            def step(x, y):
                torch._dynamo.mark_dynamic(x, 0)
                torch._dynamo.mark_dynamic(y, 0)
                return self._backward(compiled(x, y))
            return step
        if mode.startswith("pebble-"):
            import pebble.torch as pt
            self.pt = pt
            self.pebble_steps = {}
            self.policy = mode.split("-", 1)[1]
            return self._pebble_step
        raise ValueError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")

    def _backward(self, loss):
        loss.backward()
        return loss.detach()

    def _pebble_step(self, x, y):
        """pebble's step for this batch: planned at the cap less the margin,
        again at twice the margin where the first plan's run ran out of memory."""
        b = x.shape[0]
        margin = self.pebble_margin.get(b, self.args.pebble_margin)
        key = (b, margin)
        if key not in self.pebble_steps:
            self.pebble_steps.clear()  # one batch's graphs at a time: CPU memory
            budget = int(self.cap * (1 - margin))
            self.pebble_steps[key] = self.pt.train_step(
                self.model, self.loss_fn, x, y, policy=self.policy, budget=budget,
                time_limit=self.args.pebble_time_limit, measure="never")
            report = self.pebble_steps[key].report
            self.last_report = dict(report, margin=margin)
        return self.pebble_steps[key](x, y)

    def run(self, b, steps):
        """Runs `steps` training steps at batch b; returns (seconds per step,
        allocator peak bytes), or raises OutOfMemory."""
        torch = self.torch
        x, y = self.batch(b)
        times = []
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        peak = 0
        try:
            for _ in range(steps):
                self.opt.zero_grad(set_to_none=True)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                    start = time.perf_counter()
                    self.step_fn(x, y)
                    self.opt.step()
                    torch.cuda.synchronize(self.device)
                    times.append(time.perf_counter() - start)
                else:
                    def one():
                        self.step_fn(x, y)
                        self.opt.step()
                    _, p, seconds = measure_cpu(one)
                    peak = max(peak, p + self.persistent_bytes())
                    times.append(seconds)
                    if peak > self.cap:
                        raise OutOfMemory(f"measured {peak} > cap")
            if self.device.type == "cuda":
                peak = torch.cuda.max_memory_allocated(self.device)
        except Exception as e:
            if is_oom(e):
                raise OutOfMemory(str(e).splitlines()[0][:200]) from None
            raise
        finally:
            self.opt.zero_grad(set_to_none=True)
            del x, y
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return times, peak

    def persistent_bytes(self):
        return sum(p.numel() * p.element_size() for p in self.model.parameters()) * 2

    def fits(self, b):
        """Whether two steps at batch b run within the cap (pebble: a plan
        that does not fit the budget counts as no)."""
        for attempt in range(2):
            try:
                with self.lock.shared():
                    self.run(b, 2)
                return True
            except OutOfMemory as e:
                if self.args.mode.startswith("pebble-") and attempt == 0:
                    self.pebble_margin[b] = 2 * self.args.pebble_margin + 0.04
                    self.notes.append(f"b={b}: out of memory at margin "
                                      f"{self.args.pebble_margin:.0%}, planned again")
                    continue
                self.log(f"b={b}: out of memory ({e})")
                return False
            except Exception as e:
                if self.args.mode.startswith("pebble-") and type(e).__name__ == "PlanError":
                    self.log(f"b={b}: no plan within the budget")
                    return False
                raise
        return False

    def log(self, text):
        print(f"[{self.args.model} {self.args.mode}] {text}", file=sys.stderr, flush=True)


class OutOfMemory(Exception):
    pass


class Unavailable(Exception):
    pass


def is_oom(e):
    return "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"


def measure_cpu(fn):
    import pebble.torch as pt
    return pt.measure(fn)


def search(job, start, limit, write):
    """Largest b in [1, limit] with job.fits(b), doubling from `start` and
    then bisecting; write(best, first_failure) after every probe."""
    best, fail = 0, None
    b = max(job.min_batch, start)
    while b <= limit:
        ok = job.fits(b)
        job.log(f"b={b}: {'fits' if ok else 'does not fit'}")
        if ok:
            best = b
            write(best, fail)
            b *= 2
        else:
            fail = b
            write(best, fail)
            break
    if best == 0 and fail is not None and fail > job.min_batch:  # even the start failed
        lo, hi = job.min_batch - 1, fail
    else:
        lo, hi = max(best, job.min_batch - 1), fail
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        if job.fits(mid):
            lo = best = mid
        else:
            hi = fail = mid
        job.log(f"b={mid}: {'fits' if best == mid else 'does not fit'}")
        write(best, fail)
    return best, fail


def timed_steps(job, best):
    """Times job's steps at `best`, alone on the GPU; where a batch that
    passed the search's two steps runs out of memory in the longer timed run
    (it lies at the edge of the cap), a batch 3% smaller is timed instead and
    the row's note says so. Returns (step seconds, peak bytes, the batch)."""
    for attempt in range(4):
        try:
            with job.lock.alone():
                job.run(best, 1)  # warm-up (and, for pebble, the plan at this batch)
                times, peak = job.run(best, job.args.timed_steps)
            return times, peak, best
        except OutOfMemory:
            if attempt == 3 or best <= job.min_batch:
                raise
            smaller = max(job.min_batch, min(best - 1, int(best * 0.97)))
            job.notes.append(f"b={best} ran out of memory in the timed run; timed b={smaller}")
            best = smaller


def job_main(args):
    result = {"model": args.model, "mode": args.mode, "status": "searching"}

    def write(**fields):
        result.update(fields)
        with open(args.result + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(args.result + ".tmp", args.result)

    write()
    start_time = time.perf_counter()
    try:
        job = Job(args)
    except Unavailable as e:
        write(status="unavailable", note=str(e))
        return 0
    try:
        best, fail = search(job, args.start, args.max_batch,
                            lambda best, fail: write(batch=best, first_failure=fail,
                                                     notes=job.notes))
        if best == 0:
            write(status="done", batch=0, notes=job.notes)
            return 0
        write(status="timing", search_seconds=time.perf_counter() - start_time)
        times, peak, best = timed_steps(job, best)
        fields = dict(status="done", batch=best, first_failure=fail,
                      step_seconds=statistics.median(times), peak_bytes=peak, notes=job.notes)
        if args.mode.startswith("pebble-"):
            r = job.last_report
            fields.update(predicted_peak_bytes=r.get("predicted_peak_bytes"),
                          budget_bytes=r.get("budget_bytes"),
                          calibration=r.get("calibration"), margin=r.get("margin"),
                          plan_seconds=r.get("plan_seconds"))
        write(**fields)
    except Exception as e:  # noqa: BLE001 - the row records any failure
        write(status="failed", error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
              if str(e) else type(e).__name__, notes=job.notes)
        raise
    return 0


# ---------------------------------------------------------------- the driver

def launch(args, model, mode, start, workdir):
    result = os.path.join(workdir, f"{model}.{mode}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--job", "--model", model, "--mode", mode,
           "--result", result, "--lock-dir", workdir, "--start", str(start),
           "--cap", f"{args.cap}B", "--device", args.device,
           "--max-batch", str(args.max_batch), "--timed-steps", str(args.timed_steps),
           "--pebble-margin", str(args.pebble_margin),
           "--pebble-time-limit", str(args.pebble_time_limit)] + (["--small"] if args.small else [])
    log = open(os.path.join(workdir, f"{model}.{mode}.log"), "w")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    env.setdefault("OMP_NUM_THREADS", "2")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), result


def read(result):
    try:
        with open(result) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_all(args, workdir):
    deadline = time.monotonic() + args.deadline
    rows = {}
    eager_modes = [m for m in ("eager", "checkpoint") if m in args.modes]
    later = [m for m in args.modes if m not in eager_modes]
    # Phase 1: eager and checkpoint (cheap probes); phase 2 starts from eager's batch.
    queue = [(model, mode) for model in args.models for mode in eager_modes]
    phase2 = [(model, mode) for model in args.models for mode in later]
    running = {}
    while queue or phase2 or running:
        for key, (proc, result) in list(running.items()):
            if proc.poll() is not None:
                rows[key] = read(result) or {"status": "failed", "error": "no result"}
                if proc.returncode != 0 and rows[key].get("status") != "failed":
                    rows[key].update(status="failed", error=f"exit {proc.returncode}")
                del running[key]
        if time.monotonic() > deadline:
            for key, (proc, result) in running.items():
                proc.kill()
                proc.wait()
                row = read(result) or {}
                row["status"] = "cut"
                rows[key] = row
            running.clear()
            for key in queue + phase2:
                rows[key] = {"status": "not run (deadline)"}
            break
        if not queue and phase2 and all(k[1] not in eager_modes for k in running) and \
                all((m, "eager") in rows or "eager" not in args.modes for m, _ in phase2):
            queue, phase2 = phase2, []
        while queue and len(running) < args.jobs:
            model, mode = queue.pop(0)
            start = (rows.get((model, "eager")) or {}).get("batch") or 1
            running[(model, mode)] = launch(args, model, mode, start, workdir)
        time.sleep(1)
    return rows


def gpu_name(args):
    import torch
    if args.device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return "cpu"


def write_report(args, rows, started):
    import torch
    name = gpu_name(args)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    date = datetime.date.today().isoformat()
    os.makedirs(args.output_dir, exist_ok=True)
    base = os.path.join(args.output_dir, f"gpu-moonshot-{slug}-{date}")
    path, k = base + ".md", 2
    while os.path.exists(path):
        path, k = f"{base}-{k}.md", k + 1
    lines = [f"# Moonshot: the largest batch in {args.cap / 2**30:g} GiB, per model and mode", "",
             f"Machine: {name}; PyTorch {torch.__version__}; CUDA "
             f"{torch.version.cuda}; {os.cpu_count()} CPUs. Date {date}.", "",
             "Command: `" + " ".join(["python3", "bench/moonshot.py"] + args.argv) + "`", "",
             f"Each row: the largest batch whose training step (forward, loss, backward, SGD "
             f"update) ran within the cap "
             f"({'set_per_process_memory_fraction' if args.device == 'cuda' else 'profiler peak'}), "
             "its step time (median of "
             f"{args.timed_steps} after a warm-up, measured alone on the GPU), the allocator's "
             "peak, and the time per sample relative to eager's at eager's largest batch. "
             "'first no' is the smallest batch seen to fail. Searches overlapped on the GPU; "
             f"wall time {time.monotonic() - started:.0f} s.", ""]
    for model in args.models:
        eager = rows.get((model, "eager")) or {}
        eager_per_sample = (eager["step_seconds"] / eager["batch"]
                            if eager.get("step_seconds") and eager.get("batch") else None)
        lines += [f"## {model}", "",
                  "| mode | largest batch | x eager batch | first no | step (s) | "
                  "time/sample vs eager | peak (GiB) | note |",
                  "|---|---:|---:|---:|---:|---:|---:|---|"]
        for mode in args.modes:
            r = rows.get((model, mode)) or {"status": "not run"}
            b = r.get("batch")
            xb = f"{b / eager['batch']:.2f}" if b and eager.get("batch") else ""
            rel = (f"{r['step_seconds'] / b / eager_per_sample:.3f}"
                   if eager_per_sample and r.get("step_seconds") and b else "")
            note = r.get("status", "")
            if note == "cut":
                note = f"search cut at the deadline: >= {b}" if b else "cut before any batch fit"
            elif note == "done":
                note = ""
            extra = r.get("error") or r.get("note") or ""
            if r.get("predicted_peak_bytes"):
                extra += (f" predicted {r['predicted_peak_bytes'] / 2**30:.2f} GiB, "
                          f"budget {r['budget_bytes'] / 2**30:.2f} GiB")
                calibration = str(r.get("calibration") or "")
                if calibration.startswith("estimated"):
                    extra += ", costs estimated (unplanned step beyond the cap)"
                elif calibration.startswith("measured under"):
                    extra += ", calibrated under dtr's least-peak plan (unplanned step beyond the cap)"
            extra += "".join(f"; {n}" for n in (r.get("notes") or [])[-2:])
            note = "; ".join(x for x in (note, extra.strip("; ")) if x)
            peak = f"{r['peak_bytes'] / 2**30:.2f}" if r.get("peak_bytes") else ""
            step = f"{r['step_seconds']:.3f}" if r.get("step_seconds") else ""
            lines.append(f"| {mode} | {b if b is not None else ''} | {xb} | "
                         f"{r.get('first_failure') or ''} | {step} | {rel} | {peak} | {note} |")
        lines.append("")
    lines += goal_lines(args, rows)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(path[:-3] + ".json", "w") as f:
        json.dump([dict(r, model=m, mode=mode) for (m, mode), r in rows.items()], f, indent=1)
    return path


def goal_lines(args, rows):
    """The issue's goal, checked: on the GPT, 8x eager's batch at <= 1.15x eager's
    time per sample; on every model, more than torch.compile's budgeted partitioner."""
    out = ["## The goal", ""]
    for model in args.models:
        eager = rows.get((model, "eager")) or {}
        pebble = [(m, rows[(model, m)]) for m in args.modes
                  if m.startswith("pebble-") and (rows.get((model, m)) or {}).get("batch")]
        compiled = [rows[(model, m)].get("batch") or 0 for m in args.modes
                    if m.startswith("compile-") and rows.get((model, m))]
        if not pebble or not eager.get("batch"):
            out.append(f"- {model}: not measured.")
            continue
        best_mode, best = max(pebble, key=lambda kv: kv[1]["batch"])
        text = f"- {model}: pebble's largest batch {best['batch']} ({best_mode}), " \
               f"{best['batch'] / eager['batch']:.1f}x eager's {eager['batch']}"
        if compiled:
            text += f"; torch.compile's best {max(compiled)}: " + \
                ("more" if best["batch"] > max(compiled) else "NOT more")
        if model == "gpt" and eager.get("step_seconds"):
            per = eager["step_seconds"] / eager["batch"]
            ok = [(m, r) for m, r in pebble if r["batch"] >= 8 * eager["batch"] and
                  r.get("step_seconds") and r["step_seconds"] / r["batch"] <= 1.15 * per]
            text += "; 8x at <= 1.15x time per sample: " + (
                f"met ({', '.join(m for m, _ in ok)})" if ok else "NOT met")
        out.append(text + ".")
    return out + [""]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--cap", type=parse_size, default=parse_size("16GiB"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--small", action="store_true", help="tiny models (a check of the script)")
    ap.add_argument("--deadline", type=float, default=480, help="seconds for all searches")
    ap.add_argument("--jobs", type=int, default=7, help="jobs at once (each holds up to --cap)")
    ap.add_argument("--max-batch", type=int, default=4096)
    ap.add_argument("--timed-steps", type=int, default=5)
    ap.add_argument("--pebble-margin", type=float, default=0.03)
    ap.add_argument("--pebble-time-limit", type=float, default=10.0)
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless every row has a batch and a step time (for tests)")
    ap.add_argument("--output-dir", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--workdir", help="where jobs write their logs (default: a new temp folder)")
    # one job (internal)
    ap.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--lock-dir", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.argv = argv
    if args.job:
        return job_main(args)
    args.models = [m for m in args.models.split(",") if m]
    args.modes = [m for m in args.modes.split(",") if m]
    for m in args.models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}: one of {', '.join(MODELS)}")
    for m in args.modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}: one of {', '.join(MODES)}")
    import tempfile
    workdir = args.workdir or tempfile.mkdtemp(prefix="moonshot-")
    os.makedirs(workdir, exist_ok=True)
    started = time.monotonic()
    rows = run_all(args, workdir)
    path = write_report(args, rows, started)
    print(open(path).read())
    print(f"moonshot: wrote {path}; job logs in {workdir}", file=sys.stderr)
    failed = [k for k, r in rows.items() if r.get("status") == "failed"]
    if args.check:
        failed += [k for k, r in rows.items() if not (r.get("batch") and r.get("step_seconds"))]
    for model, mode in failed:
        print(f"moonshot: {model} {mode}: {rows[(model, mode)].get('status')}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
