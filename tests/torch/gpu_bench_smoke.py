#!/usr/bin/env python3
"""Checks bench/gpu_bench.py without a GPU.

    gpu_bench_smoke.py --pebble PATH

The GPU benchmark's first run is on a machine with a GPU, where a bug in the
script costs the whole run. Its --device cpu mode runs the same cases on the
CPU backend and PyTorch's CPU device; this test runs it on conv3d:n=16 at a
budget that baseline and best-order exceed (486 KiB peak) and the
recomputing policies meet, and checks:

  * exit 0; the exceeded plans are 'infeasible', the others 'ok' with a
    measured peak equal to the predicted one and an arena at least that
    large; PyTorch eager and checkpoint 'ok' with a time; no '+fraction'
    case on the CPU; a Markdown row for every case;
  * a second run writes a new table beside the first, which stays as it was
    (with --no-pytorch: pebble's rows alone, and the table says so);
  * the largest-N table (pebble fit --verify): baseline's largest N is 15,
    sqrtn's 16, every run's measured peak equal to the planned one; PyTorch's
    search (uncapped on the CPU) ends at its upper bound, 20;
  * a pebble whose `run` fails (not for the budget) makes the script exit 1,
    naming the policy, and still write the table; a failing `fit` is named
    too;
  * bad --sizes is a usage error (2);
  * where PyTorch cannot use CUDA, --device cuda exits 1 and says so on
    stderr and in the table.

Exit 0 when all hold, 1 otherwise, 77 when PyTorch cannot be imported.
"""

import argparse
import json
import os
import stat
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench", "gpu_bench.py")
# Below baseline's 497196-byte peak, above sqrtn's 431660: the graph's own
# figures (--workspace graph); the CPU kernels' scratch (relayouts of the
# one-channel volume) would double every plan here.
BUDGET = "470000B"
INFEASIBLE = {"baseline", "best-order"}


def bench(pebble, out_dir, *extra):
    cmd = [sys.executable, BENCH, "--pebble", pebble, "--python", sys.executable,
           "--device", "cpu", "--sizes", "16", "--budget", BUDGET, "--output-dir", out_dir,
           "--timeout", "300", "--torch-fit-max", "20", "--workspace", "graph", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    # per-N cases, then PyTorch's largest N per mode
    return out, [r for r in rows if r["system"] not in ("pebble-fit", "pytorch-fit")], \
        [r for r in rows if r["system"] == "pytorch-fit"]


def tables(out_dir):
    return sorted(f for f in os.listdir(out_dir) if f.endswith(".md"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pebble", required=True)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not importable with " + sys.executable)
        return 77

    errors = []

    def check(cond, what):
        if not cond:
            errors.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        out_dir = os.path.join(tmp, "results")
        out, rows, torch_fits = bench(args.pebble, out_dir)
        check(out.returncode == 0, f"clean run exited {out.returncode}: {out.stderr.strip()}")
        pebble_rows = [r for r in rows if r["system"] == "pebble"]
        torch_rows = [r for r in rows if r["system"] == "pytorch"]
        check(len(pebble_rows) >= 4, f"only {len(pebble_rows)} pebble rows")
        for r in pebble_rows:
            if r["mode"] in INFEASIBLE:
                check(r["status"] == "infeasible", f"{r['mode']}: status {r['status']}")
            else:
                check(r["status"] == "ok", f"{r['mode']}: status {r['status']}: {r.get('note')}")
                check(r.get("peak_equal") is True and r.get("peak") == r.get("predicted_peak"),
                      f"{r['mode']}: measured peak {r.get('peak')} != predicted "
                      f"{r.get('predicted_peak')}")
                check((r.get("arena") or 0) >= (r.get("peak") or 1),
                      f"{r['mode']}: arena {r.get('arena')} below peak {r.get('peak')}")
        check(sorted(r["mode"] for r in torch_rows) == ["checkpoint", "eager"],
              f"PyTorch modes {[r['mode'] for r in torch_rows]}")
        for r in torch_rows:
            check(r["status"] == "ok" and r.get("time_s", 0) > 0,
                  f"PyTorch {r['mode']}: {r['status']} {r.get('note', '')}")
        first = tables(out_dir)
        check(len(first) == 1, f"tables after one run: {first}")
        if len(first) == 1:
            with open(os.path.join(out_dir, first[0])) as f:
                text = f.read()
            body = [l for l in text.splitlines() if l.startswith("| 16 |")]
            check(len(body) == len(rows), f"{len(body)} table rows for {len(rows)} cases")
            # The largest-N table: baseline's peak passes the budget at 16
            # (so 15), the recomputing policies' does not; every run's
            # measured peak is the planned one.
            check("## Largest N within 470000B" in text, "no largest-N table")
            fit = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]]
                   for l in text.split("## Largest N", 1)[-1].splitlines()
                   if l.startswith("| ") and not l.startswith("| policy")}
            check(fit.get("baseline", [""])[0] == "15", f"baseline's largest N: {fit.get('baseline')}")
            check(fit.get("sqrtn", [""])[0] == "16", f"sqrtn's largest N: {fit.get('sqrtn')}")
            for policy in (r["mode"] for r in pebble_rows):
                check(policy in fit and fit[policy][3] == "yes",
                      f"largest-N row of {policy}: {fit.get(policy)}")
            # PyTorch's search: uncapped on the CPU, so every try fits and
            # it ends at the upper bound (20) after a binary search's tries.
            check(sorted(r["mode"] for r in torch_fits) == ["checkpoint", "eager"],
                  f"PyTorch largest-N modes {[r['mode'] for r in torch_fits]}")
            for r in torch_fits:
                check(r.get("largest_n") == 20 and r.get("time_s", 0) > 0
                      and [n for n, _ in r.get("tries", [])] == [10, 15, 18, 19, 20],
                      f"PyTorch largest N ({r['mode']}): {r}")
                row = fit.get(f"PyTorch {r['mode']}", [])
                check(row[:1] == ["20"] and "upper bound" in row[-1],
                      f"largest-N table row of PyTorch {r['mode']}: {row}")

            # (the table, not the fit; pebble's rows alone)
            out2, rows2, fits2 = bench(args.pebble, out_dir, "--no-fit", "--no-pytorch")
            check(out2.returncode == 0, f"second run exited {out2.returncode}")
            check(rows2 and all(r["system"] == "pebble" for r in rows2) and not fits2,
                  f"--no-pytorch: rows {[(r['system'], r['mode']) for r in rows2]}")
            second = tables(out_dir)
            check(len(second) == 2, f"tables after two runs: {second}")
            with open(os.path.join(out_dir, first[0])) as f:
                check(f.read() == text, "the second run changed the first table")
            new = [t for t in second if t not in first]
            with open(os.path.join(out_dir, new[0] if new else first[0])) as f:
                check("--no-pytorch" in f.read(), "--no-pytorch: the table does not say so")

        # A pebble whose `run` fails for another reason than the budget.
        broken = os.path.join(tmp, "broken-pebble")
        with open(broken, "w") as f:
            f.write("#!/bin/sh\n"
                    "if [ \"$1\" = run ]; then echo 'pebble: CUDA error: planted' >&2; "
                    "exit 3; fi\n"
                    "if [ \"$1\" = fit ]; then echo 'pebble: planted fit error' >&2; "
                    "exit 1; fi\n"
                    f"exec '{os.path.abspath(args.pebble)}' \"$@\"\n")
        os.chmod(broken, os.stat(broken).st_mode | stat.S_IXUSR)
        broken_dir = os.path.join(tmp, "broken")
        out3, rows3, _ = bench(broken, broken_dir, "--no-pytorch")
        check(out3.returncode == 1, f"failing pebble: exit {out3.returncode}, expected 1")
        check("FAILED: pebble run sqrtn n=16 failed: pebble: CUDA error: planted"
              in out3.stderr, f"failing pebble: stderr lacks the policy: {out3.stderr!r}")
        check("FAILED: pebble fit failed: pebble: planted fit error" in out3.stderr,
              f"failing pebble fit: not reported: {out3.stderr!r}")
        check(os.path.isdir(broken_dir) and len(tables(broken_dir)) == 1,
              "failing pebble: no table written")
        check(any(r["status"] == "error" for r in rows3), "failing pebble: no error row")

        out4, _, _ = bench(args.pebble, out_dir, "--sizes", "16,x")
        check(out4.returncode == 2, f"--sizes 16,x: exit {out4.returncode}, expected 2")

        if not torch.cuda.is_available():
            # The GPU mode with a PyTorch that cannot use CUDA: pebble's rows
            # still run (and fail here without a device); the table says why
            # it has no PyTorch rows.
            cuda_dir = os.path.join(tmp, "cuda")
            out5, rows5, _ = bench(args.pebble, cuda_dir, "--device", "cuda")
            check(out5.returncode == 1, f"--device cuda: exit {out5.returncode}, expected 1")
            check(rows5 and all(r["system"] == "pebble" for r in rows5),
                  f"--device cuda: rows {[(r['system'], r['mode']) for r in rows5]}")
            names = tables(cuda_dir) if os.path.isdir(cuda_dir) else []
            text = ""
            if len(names) == 1:
                with open(os.path.join(cuda_dir, names[0])) as f:
                    text = f.read()
            check("cannot use CUDA" in out5.stderr and "cannot use CUDA" in text,
                  "--device cuda: the missing CUDA PyTorch is not named in stderr and table")

    for e in errors:
        print("FAIL: " + e)
    print("PASS" if not errors else f"{len(errors)} check(s) failed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
