#!/usr/bin/env python3
"""Plan quality on real models: each policy's compute overhead and makespan
against the best lower bound known, at several budgets. Prints Markdown.

    bench/quality_table.py --pebble build/bin/pebble
        [--models conv3d:n=64 resnet18:batch=8,image=128 ...]
        [--onnx mobilenet_v2 ...] [--budgets 90%,70%,50%,min]
        [--policies best-order,sqrtn,...] [--time-limit 30] [--workdir DIR]

For each model and budget, `pebble compare --format json` plans every policy
(composed with best-order, as users get them). The lower bound on compute cost
is the largest of:
  - the base cost (every node computed once: no plan recomputes less);
  - the LP/MILP bound of `checkmate` (`details.lower_bound`, over the graph's
    order and best-order's, recomputation only), where CBC ran;
  - the optimum of `exact` (every SPEC recomputation schedule), where the graph
    is small enough that it finishes.
Offload policies may beat a recomputation bound on compute (they move bytes
instead): their makespan, which counts exposed transfers, is the figure to
read for them. `--onnx NAME` exports torchvision's NAME (examples/onnx/
export.py, training mode) and imports it with `pebble import --loss
cross-entropy` first.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_POLICIES = ("best-order,sqrtn,chen-greedy,articulation,revolve,rotor,dtr,checkmate-lp,"
                    "vdnn,swap,hybrid")
EXACT_MAX_NODES = 40  # exact's search explodes beyond small graphs


def pebble_json(cmd, timeout):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    # A plan that does not fit exits 1 and still prints its document.
    if out.returncode == 1 and '"feasible": false' in out.stdout:
        return json.loads(out.stdout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[1:4])}...: "
                           f"{(out.stderr.strip().splitlines() or ['exit %d' % out.returncode])[-1]}")
    return json.loads(out.stdout)


def source_args(model):
    return ["--graph", model] if model.endswith(".json") else ["--model", model]


def import_onnx(pebble, name, workdir, batch, image):
    onnx_path = os.path.join(workdir, f"{name}.onnx")
    graph_path = os.path.join(workdir, f"{name}-b{batch}-i{image}.json")
    if not os.path.exists(graph_path):
        subprocess.run([sys.executable, os.path.join(HERE, "..", "examples", "onnx", "export.py"),
                        workdir, name, "--batch", str(batch), "--image", str(image),
                        "--classes", "10", "--no-dropout"],
                       check=True, capture_output=True, text=True)
        subprocess.run([pebble, "import", onnx_path, "--loss", "cross-entropy", "--output",
                        graph_path], check=True, capture_output=True, text=True)
    return graph_path


def lower_bound(pebble, model, budget, nodes, time_limit):
    """(cost bound, source) for recomputation plans at `budget`, or (None, why)."""
    best, source = None, None
    try:
        doc = pebble_json([pebble, "plan", *source_args(model), "--policy", "checkmate",
                           "--budget", budget, "--time-limit", str(time_limit), "--json",
                           "--quiet"], timeout=10 * time_limit + 60)
        d = doc.get("details", {})
        if d.get("status") not in (None, "infeasible") and d.get("lower_bound") is not None:
            best, source = d["lower_bound"], "milp" if d.get("optimal") is False else "milp*"
            if d.get("optimal"):
                best = doc["report"]["compute_cost"]
    except (RuntimeError, subprocess.TimeoutExpired):
        pass
    if nodes <= EXACT_MAX_NODES:
        try:
            doc = pebble_json([pebble, "plan", *source_args(model), "--policy", "exact",
                               "--budget", budget, "--time-limit", str(time_limit), "--json",
                               "--quiet"], timeout=10 * time_limit + 60)
            if doc["feasible"] and doc.get("details", {}).get("optimal"):
                cost = doc["report"]["compute_cost"]
                if best is None or cost >= best:
                    best, source = cost, "exact"
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
    return best, source


def node_count(pebble, model):
    doc = pebble_json([pebble, "describe", *source_args(model), "--json"], timeout=600)
    return len(doc["nodes"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pebble", default="build/bin/pebble")
    ap.add_argument("--models", nargs="*",
                    default=["tanh-chain:length=10,size=1000", "conv3d:n=64",
                             "resnet18:batch=8,image=128", "unet3d:batch=1,variant=small",
                             "transformer:layers=4"])
    ap.add_argument("--onnx", nargs="*", default=["mobilenet_v2"],
                    help="torchvision models exported and imported first")
    ap.add_argument("--onnx-batch", type=int, default=8)
    ap.add_argument("--onnx-image", type=int, default=128)
    ap.add_argument("--budgets", default="90%,70%,50%,min")
    ap.add_argument("--policies", default=DEFAULT_POLICIES)
    ap.add_argument("--time-limit", type=float, default=30)
    ap.add_argument("--workdir", help="exported and imported models go here (default: a temp dir)")
    ap.add_argument("--json-out", help="also write every row as JSON lines here")
    args = ap.parse_args()
    policies = args.policies.split(",")
    budgets = args.budgets.split(",")
    workdir = args.workdir or tempfile.mkdtemp(prefix="pebble-quality-")
    os.makedirs(workdir, exist_ok=True)

    models = list(args.models)
    for name in args.onnx:
        try:
            models.append(import_onnx(args.pebble, name, workdir, args.onnx_batch,
                                      args.onnx_image))
        except (subprocess.CalledProcessError, OSError) as e:
            print(f"{name}: export or import failed ({e}); left out", file=sys.stderr)

    rows = []
    for model in models:
        nodes = node_count(args.pebble, model)
        doc = pebble_json([args.pebble, "compare", *source_args(model), "--policies",
                           args.policies, "--budgets", args.budgets, "--time-limit",
                           str(args.time_limit), "--format", "json", "--quiet"],
                          timeout=len(policies) * len(budgets) * (10 * args.time_limit + 60))
        label = os.path.basename(model) if model.endswith(".json") else model
        for budget in budgets:
            results = [r for r in doc["results"] if r["budget"] == budget]
            if not results:
                continue
            base = next(r["report"]["base_cost"] for r in results if "report" in r)
            if budget == "min":
                # Each policy stops at its own least peak: judged by that peak
                # against the least any policy reached (bound: that peak).
                peaks = [r["report"]["peak_bytes"] for r in results
                         if r.get("feasible") and "report" in r]
                bound, source = (min(peaks), "least peak") if peaks else (None, "none")
            else:
                bound, source = lower_bound(args.pebble, model, budget, nodes, args.time_limit)
                if bound is None or bound < base:
                    bound, source = base, "base"
            row = {"model": label, "budget": budget, "bound": bound, "bound_source": source,
                   "base_cost": base, "policies": {}}
            for r in results:
                if "report" not in r:  # the policy refused the graph
                    row["policies"][r["policy"]] = None
                    continue
                rep = r["report"]
                over = rep["peak_bytes"] if budget == "min" else rep["compute_cost"]
                row["policies"][r["policy"]] = None if not r["feasible"] else {
                    "cost_over_bound": over / bound if bound else None,
                    "overhead": rep["overhead"],
                    "makespan_x": r.get("makespan_over_baseline"),
                    "peak_bytes": rep["peak_bytes"],
                    "plan_time_s": r.get("plan_time_s")}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")

    print("Each cell: compute cost over the lower bound (1.00 = provably optimal among "
          "recomputation plans) / makespan over the baseline's; at `min`, the policy's peak over "
          "the least peak any policy reached / makespan over the baseline's; '-' no feasible "
          "plan.\n")
    print("| model | budget | bound: overhead (source) | " + " | ".join(policies) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in policies) + " |")
    for row in rows:
        if row["budget"] == "min":
            lb = "-" if row["bound"] is None else f"{row['bound'] / 2**20:.2f} MiB (least peak)"
        else:
            lb = f"{100 * (row['bound'] / row['base_cost'] - 1):.1f}% ({row['bound_source']})"
        cells = []
        for p in policies:
            c = row["policies"].get(p)
            if c is None:
                cells.append("-")
            else:
                ratio = "n/a" if c["cost_over_bound"] is None else f"{c['cost_over_bound']:.2f}"
                mk = "n/a" if c["makespan_x"] is None else f"{c['makespan_x']:.2f}"
                cells.append(f"{ratio} / {mk}")
        print(f"| {row['model']} | {row['budget']} | {lb} | " + " | ".join(cells) + " |")
    # Per policy: how often it is feasible, and its worst ratio to the bound.
    byte_rows = sum(1 for row in rows if row["budget"] != "min")
    print("\nAt the byte budgets (90%, 70%, 50%): compute cost over the bound.\n")
    print("| policy | feasible | median cost/bound | worst cost/bound |")
    print("| --- | ---: | ---: | ---: |")
    for p in policies:
        ratios = [row["policies"][p]["cost_over_bound"] for row in rows
                  if row["budget"] != "min" and row["policies"].get(p)
                  and row["policies"][p]["cost_over_bound"]]
        feasible = sum(1 for row in rows if row["budget"] != "min" and row["policies"].get(p))
        if ratios:
            ratios.sort()
            med = ratios[len(ratios) // 2]
            print(f"| {p} | {feasible}/{byte_rows} | {med:.3f} | {ratios[-1]:.3f} |")
        else:
            print(f"| {p} | {feasible}/{byte_rows} | - | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
