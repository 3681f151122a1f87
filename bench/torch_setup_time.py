#!/usr/bin/env python3
"""pebble.torch's first call: capture, calibration and planning against the bound.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_setup_time.py
        [--cases densenet121,mobilenet_v2,resnet18,gpt,unet3d] [--policy dtr]
        [--budget 100%] [--device cpu|cuda] [--threads 1] [--output FILE.md]

The requirement: capture plus planning of a step takes at most
max(10 s, 20 eager steps) under the default time limit. Each case runs in a
fresh Python process, so that its figures include what a user's first
train_step pays once (imports, first traces): pt.train_step(...) is built
first, cold, and its wall time taken; then the eager step (forward, loss,
backward; .grad set to None before each) is timed, the median of five after
a warm-up. Columns: the report's capture_time_s (trace and graph),
calibration_time_s, plan_time_s and setup_time_s (their sum, "total"), the
constructor's wall time, the eager step, the bound and the verdict on the
total. Exit 0 when every case is within its bound, 1 otherwise.

Cases: densenet121 (batch 2, 32 px), mobilenet_v2 (batch 2, 32 px) and
resnet18 (batch 8, 64 px) from torchvision under cross-entropy; the
GPT-style decoder of examples/torch/lm.py at its default sizes (4 layers,
d=128, sequence 128, batch 16, vocabulary 256); the 3-D U-Net of
tests/torch/models.py (small variant, batch 2, 8^3, 5 classes; its forward
returns the loss); lstm: nn.LSTM(8, 12, num_layers=2, bidirectional=True),
batch 2 over 96 positions, a linear head on the last (unrolled over the
sequence: its capture time grows with the length).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "torch")
CASES = ["densenet121", "mobilenet_v2", "resnet18", "gpt", "unet3d", "lstm"]
EAGER_STEPS = 5
BOUND_FLOOR_S = 10.0
BOUND_STEPS = 20


def build(name, device):
    """(model, loss_fn, inputs tuple, target, description)."""
    import torch
    sys.path.insert(0, TESTS)
    import step_models
    if name in ("densenet121", "mobilenet_v2"):
        case = getattr(step_models, name)(device)
        return case.model, case.loss_fn, case.inputs, case.target, f"{name}, batch 2, 32 px"
    if name == "resnet18":
        case = step_models.resnet18_batch8(device)
        return case.model, case.loss_fn, case.inputs, case.target, "resnet18, batch 8, 64 px"
    if name == "gpt":
        torch.manual_seed(0)
        vocab, seq, batch = 256, 128, 16
        model = step_models.Gpt(vocab, 128, 4, 4, seq).to(device).train()
        x = torch.randint(0, vocab, (batch, seq), device=device)
        y = torch.randint(0, vocab, (batch, seq), device=device)
        return (model, step_models.lm_loss, (x,), y,
                "GPT-style decoder (examples/torch/lm.py), 4 layers, d=128, seq 128, batch 16")
    if name == "unet3d":
        import models
        torch.manual_seed(0)
        case = models.build("unet3d:variant=small,batch=2,depth=8,height=8,width=8,"
                            "classes=5")
        x, t = case.make_batch(torch.Generator().manual_seed(0))
        model = case.module.to(device).train()
        x, t = x.to(device), t.to(device)
        # The module's forward takes the target and returns the loss.
        return (model, _loss_is_output, (x, t), t,
                "3-D U-Net (tests/torch/models.py), small, batch 2, 8^3, 5 classes")
    if name == "lstm":
        torch.manual_seed(0)
        model = _last_position_head(torch.nn.LSTM(8, 12, num_layers=2, bidirectional=True,
                                            batch_first=True), 24, 5).to(device)
        x = torch.randn(2, 96, 8, device=device)
        y = torch.randint(0, 5, (2,), device=device)
        return (model, torch.nn.functional.cross_entropy, (x,), y,
                "2-layer bidirectional LSTM, batch 2, 96 positions")
    raise SystemExit(f"torch_setup_time: unknown case '{name}' (cases: {', '.join(CASES)})")


def _last_position_head(rnn, features, classes):
    """`rnn` and a linear head on its output at the last position."""
    import torch

    class LastPosition(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = rnn
            self.head = torch.nn.Linear(features, classes)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])
    return LastPosition()


def _loss_is_output(output, target):
    return output


def one_case(args):
    """Runs in the child process: prints one JSON line."""
    import torch
    torch.set_num_threads(args.threads)
    import pebble.torch as pt
    device = torch.device(args.device)
    model, loss_fn, inputs, target, what = build(args.one, device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    start = time.perf_counter()
    step = pt.train_step(model, loss_fn, inputs, target, policy=args.policy,
                         budget=args.budget)
    sync()
    wall = time.perf_counter() - start
    r = step.report

    def eager():
        for p in model.parameters():
            p.grad = None
        loss = loss_fn(model(*inputs), target)
        loss.backward()
        sync()

    eager()
    times = []
    for _ in range(EAGER_STEPS):
        t0 = time.perf_counter()
        eager()
        times.append(time.perf_counter() - t0)
    print(json.dumps({
        "case": args.one, "what": what, "nodes": r["nodes"], "policy": r["policy"],
        "traced_with": r["traced_with"], "capture_s": r["capture_time_s"],
        "calibration_s": r["calibration_time_s"], "plan_s": r["plan_time_s"],
        "total_s": r["setup_time_s"], "wall_s": wall,
        "eager_s": statistics.median(times)}))
    return 0


def run_case(name, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--one", name, "--policy", args.policy,
           "--budget", args.budget, "--device", args.device, "--threads", str(args.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"case": name, "error": tail}
    return json.loads(lines[-1])


def table(rows):
    out = ["| case | nodes | capture s | calibration s | plan s | total s | first call wall s "
           "| eager step s | bound s | within bound |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['case']} | failed: {r['error']} | | | | | | | | no |")
            continue
        bound = max(BOUND_FLOOR_S, BOUND_STEPS * r["eager_s"])
        verdict = "yes" if r["total_s"] <= bound else "no"
        out.append(f"| {r['what']} | {r['nodes']:,} | {r['capture_s']:.2f} | "
                   f"{r['calibration_s']:.2f} | {r['plan_s']:.2f} | {r['total_s']:.2f} | "
                   f"{r['wall_s']:.2f} | {r['eager_s']:.3f} | {bound:.1f} | {verdict} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--policy", default="dtr")
    ap.add_argument("--budget", default="100%")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--output", help="also write the table (markdown) to this file")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child process's case
    args = ap.parse_args()
    if args.one:
        return one_case(args)
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"torch_setup_time: unknown case '{unknown[0]}' (cases: {', '.join(CASES)})",
              file=sys.stderr)
        return 2
    rows = []
    for name in names:
        row = run_case(name, args)
        rows.append(row)
        print(f"{name}: {row}", file=sys.stderr, flush=True)
    header = (f"{datetime.date.today()}, {platform.node()}, {args.device}, "
              f"{args.threads} thread(s); policy {args.policy} at {args.budget}, default "
              "time limit")
    text = header + "\n\n" + table(rows) + "\n"
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    ok = all("error" not in r and
             r["total_s"] <= max(BOUND_FLOOR_S, BOUND_STEPS * r["eager_s"]) for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
