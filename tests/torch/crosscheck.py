#!/usr/bin/env python3
"""Cross-checks one training step of `pebble run` against PyTorch.

    crosscheck.py --pebble PATH --model SPEC [--policies a,b,...]
                  [--budget B] [--seed N] [--workdir DIR]

Builds the PyTorch twin of a pebble model (tests/torch/models.py) with a
seeded initialisation, writes every persistent tensor (parameters, batch-norm
buffers, `input`, `target`) as DIR/inputs/<id>.npy, runs `pebble run` once
per policy with those inputs on the CPU backend, and compares what pebble
dumps with PyTorch's loss and gradients (autograd, training mode):

- every graph output (`loss` and each `grad:<parameter>`) is dumped, and
  nothing else;
- each matches PyTorch's fp32 result with relative error
  max|a - b| / max(max|b|, tiny) below 1e-4 (docs/crosscheck.md explains the
  tolerance and the one exception: gradients that are zero in exact
  arithmetic);
- every policy's dumped tensors are byte-for-byte identical to the
  baseline policy's (recomputation and reordering must not change a bit).

Exit status: 0 when everything matches, 1 on a mismatch or a failed pebble
command (the message names the tensor and the policy), 2 on a usage error,
77 when numpy or torch cannot be imported, or when `--backend cuda` finds no
CUDA device and PEBBLE_REQUIRE_CUDA is not set (ctest's SKIP_RETURN_CODE).
"""

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_SKIP = 0, 1, 2, 77

# The relative error allowed between pebble and PyTorch, both fp32. The two
# sum in different orders (oneDNN's blocked convolutions versus PyTorch's
# own), so they differ by rounding, typically about sqrt(K) * 2^-24 relative
# for a reduction over K terms (Higham 2002, ch. 4): far below 1e-4 for the
# sizes tested, where every batch norm sees at least 8 values per channel
# (fewer make its backward ill-conditioned: docs/crosscheck.md).
REL_TOL = 1e-4
# The denominator's floor: keeps an all-zero reference from dividing by 0.
TINY = 1e-30
# A gradient that is zero in exact arithmetic (the bias of a convolution
# that feeds a batch norm: the normalisation removes any constant shift,
# models.zero_gradient_names) is rounding noise in fp32, in PyTorch and in
# pebble alike; pebble's must be noise of the same order: at most
# ZERO_NOISE_FACTOR times the largest magnitude of PyTorch's.
ZERO_NOISE_FACTOR = 100.0

# A ReLU input this close to zero, or two values of a max-pool window this
# close to each other, relative to the largest magnitude of their tensor, is
# "at a kink": two correct fp32 backends may round it to different sides,
# and then relu_backward / maxpool_backward pass different gradients
# (docs/cuda.md, "Values at kinks"). Backends differ by about 1e-7 relative.
KINK_REL = 1e-6
# --avoid-kinks tries this many seeds from --seed before it gives up.
KINK_FREE_SEEDS = 16

DEFAULT_POLICIES = "baseline,best-order,sqrtn,dtr"
# Run where this pebble registers them, else skipped with a printed note.
DEFAULT_OPTIONAL = "hybrid"


class Failure(Exception):
    """A mismatch or a failed pebble command: exit 1."""


class UsageError(Exception):
    """A bad command line: exit 2."""


def log(*args):
    print(*args, flush=True)


def run_pebble(pebble, args, what, infeasible_ok=False):
    """Runs pebble with `args`; returns stdout. Failure on a non-zero exit,
    but for `plan --json` of a plan that does not fit (exit 1, its document
    with "feasible": false) where `infeasible_ok`."""
    cmd = [pebble] + args
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)
    if proc.returncode == 1 and infeasible_ok and '"feasible": false' in proc.stdout:
        return proc.stdout
    if proc.returncode != 0:
        how = ("killed by signal %d" % -proc.returncode if proc.returncode < 0
               else "exit %d" % proc.returncode)
        raise Failure("%s failed (%s): %s\n  command: %s" % (
            what, how, proc.stderr.strip() or proc.stdout.strip(),
            " ".join(cmd)))
    return proc.stdout


def pebble_json(pebble, args, what, infeasible_ok=False):
    out = run_pebble(pebble, args + ["--json"], what, infeasible_ok)
    try:
        return json.loads(out)
    except ValueError as e:
        raise Failure("%s printed no JSON document (%s): %.300s" % (
            what, e, out)) from None


def check_has_run(pebble):
    """Failure unless this pebble binary has a working `run` command: an
    unfinished runtime must not look green."""
    proc = subprocess.run([pebble, "run", "--help"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0 or "--inputs" not in text or "--dump" not in text:
        raise Failure(
            "this pebble binary has no usable `run` command (`%s run --help` "
            "exited %d without --inputs/--dump): the cross-check cannot run"
            % (pebble, proc.returncode))


class NoDevice(Exception):
    """The backend has no device here: exit 77 (skip)."""


def check_backend_has_device(pebble, backend):
    """NoDevice when `--backend cuda` finds no CUDA device (a machine without a
    GPU skips the GPU cross-checks), unless PEBBLE_REQUIRE_CUDA is set (as
    scripts/gpu-check sets it): then a Failure, since a GPU machine whose
    runtime cannot see its device must not look green."""
    if backend == "cpu":
        return
    proc = subprocess.run([pebble, "run", "--model", "conv3d:n=4", "--backend", backend],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)
    if proc.returncode == 0 or "no CUDA device" not in proc.stderr:
        return  # a device, or another error that the real runs report
    why = proc.stderr.strip().splitlines()[-1]
    if os.environ.get("PEBBLE_REQUIRE_CUDA"):
        raise Failure("PEBBLE_REQUIRE_CUDA is set but: " + why)
    raise NoDevice(why)


def npy_dtype_name(np, dtype):
    return {np.dtype(np.float32): "fp32", np.dtype(np.int64): "i64",
            np.dtype(np.uint8): "u8"}.get(
        np.dtype(dtype), str(dtype))


def write_inputs(np, torch, case, x, t, inputs_dir):
    """Writes every persistent tensor as <id>.npy; returns {id: (shape,
    dtype name)}."""
    tensors = dict(case.module.state_dict())
    tensors["input"] = x
    tensors["target"] = t
    written = {}
    for name, value in tensors.items():
        array = value.detach().cpu().numpy()
        if array.dtype not in (np.float32, np.int64):
            raise AssertionError("%s: unexpected dtype %s" % (name, array.dtype))
        # C order; unlike np.ascontiguousarray, keeps 0-d arrays 0-d
        # (num_batches_tracked is an i64 scalar).
        array = np.array(array, order="C", copy=True)
        np.save(os.path.join(inputs_dir, name + ".npy"), array)
        written[name] = (tuple(array.shape), npy_dtype_name(np, array.dtype))
    return written


def check_graph_matches(graph_desc, written, expected_outputs):
    """The torch twin and pebble's graph must agree on every persistent
    tensor (id, shape, dtype) and on the outputs."""
    persistent = {}
    outputs = []
    for node in graph_desc["nodes"]:
        if node.get("persistent"):
            persistent[node["id"]] = (tuple(node["shape"]), node["dtype"])
        if node.get("output"):
            outputs.append(node["id"])
    problems = []
    for name in sorted(set(persistent) | set(written)):
        if name not in persistent:
            problems.append("torch tensor '%s' is not a persistent node of "
                            "pebble's graph" % name)
        elif name not in written:
            problems.append("pebble's persistent node '%s' has no torch "
                            "tensor" % name)
        elif persistent[name] != written[name]:
            problems.append("'%s': pebble %s, torch %s" % (
                name, persistent[name], written[name]))
    if sorted(outputs) != sorted(expected_outputs):
        problems.append("graph outputs differ: pebble has %s extra, %s missing"
                        % (sorted(set(outputs) - set(expected_outputs)),
                           sorted(set(expected_outputs) - set(outputs))))
    if problems:
        raise Failure("the torch model does not mirror pebble's graph:\n  "
                      + "\n  ".join(problems))


def torch_reference(torch, module, x, t, dtype):
    """Loss and the gradients of the trainable parameters of one training
    step, as numpy arrays in `dtype` precision ({'loss': ...,
    'grad:<p>': ...})."""
    module = module.to(dtype)
    module.train()
    module.zero_grad(set_to_none=True)
    xx = x.to(dtype) if x.is_floating_point() else x  # token ids stay
    tt = t.to(dtype) if t.is_floating_point() else t
    loss = module(xx, tt)
    loss.backward()
    ref = {"loss": loss.detach().numpy().copy()}
    for name, p in module.named_parameters():
        if not p.requires_grad:  # frozen: no gradient
            continue
        if p.grad is None:
            raise AssertionError("no gradient for %s" % name)
        ref["grad:" + name] = p.grad.detach().numpy().copy()
    return ref


def _per_dim(value, dims, default):
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        value = default
    if isinstance(value, int):
        return [value] * dims
    return list(value)


def near_ties(torch, x, kernel, stride, padding, tol):
    """Max-pool windows of x (N, C, *spatial; dilation 1) whose two largest
    values are within `tol` of each other, except exact zeros: after a ReLU
    those are zeros on every backend (the ReLU count covers its inputs near
    zero)."""
    dims = x.dim() - 2
    k = _per_dim(kernel, dims, 1)
    st = _per_dim(stride, dims, k)
    pd = _per_dim(padding, dims, 0)
    pads = []
    for d in reversed(range(dims)):
        pads += [pd[d], pd[d]]
    y = torch.nn.functional.pad(x, pads, value=float("-inf"))
    for d in range(dims):
        y = y.unfold(2 + d, k[d], st[d])
    windows = y.reshape(*y.shape[:2 + dims], -1)
    if windows.shape[-1] < 2:
        return 0
    top = windows.topk(2, dim=-1).values
    tie = (top[..., 0] - top[..., 1]) <= tol
    rectified = (top[..., 0] == 0) & (top[..., 1] == 0)
    return int((tie & ~rectified).sum())


def count_kinks(torch, module, x, t):
    """(ReLU inputs, max-pool windows) of the module's fp32 forward that lie
    at a kink (KINK_REL). Runs a forward in training mode: pass a copy when
    the batch-norm running statistics matter."""
    counts = [0, 0]

    class Probe(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if args and torch.is_tensor(args[0]) and args[0].is_floating_point():
                z = args[0].detach()
                tol = KINK_REL * float(z.abs().max()) if z.numel() else 0.0
                if name in ("relu", "relu_"):
                    counts[0] += int((z.abs() <= tol).sum())
                elif name in ("max_pool1d", "max_pool2d", "max_pool3d"):
                    counts[1] += near_ties(
                        torch, z, args[1] if len(args) > 1 else kwargs.get("kernel_size"),
                        kwargs.get("stride", args[2] if len(args) > 2 else None),
                        kwargs.get("padding", args[3] if len(args) > 3 else 0), tol)
            return func(*args, **kwargs)

    module = module.to(torch.float32)
    module.train()
    with torch.no_grad(), Probe():
        module(x.to(torch.float32), t.to(torch.float32) if t.is_floating_point() else t)
    return tuple(counts)


def kink_note(torch, module, x, t):
    """The note printed after a gradient mismatch: how many values of
    PyTorch's fp32 forward lie at a kink (count_kinks)."""
    relu, pool = count_kinks(torch, module, x, t)
    return ("note: PyTorch's fp32 forward has %d ReLU inputs within %.0e of zero "
            "and %d max-pool windows with two values that close (relative to "
            "their tensor's largest magnitude). Where a backend rounds such a "
            "value to the other side, relu_backward or maxpool_backward passes "
            "another gradient, and a gradient mismatch follows without a fault "
            "(docs/cuda.md, \"Values at kinks\"). %s" % (
                relu, KINK_REL, pool,
                "Run again with another --seed to tell a kink from a fault."
                if relu or pool else "None here: the mismatch is not a kink."))


def pick_budget(pebble, spec, policy, kind, budget, extra):
    """The budget to run `policy` at: 100% for one-shot policies (their plan
    does not depend on it); `budget` for the others, or `min` (with a
    printed note) where that is infeasible. Returns (budget, plan JSON)."""
    if kind == "one-shot":
        budget = "100%"
    plan_args = ["plan", "--model", spec, "--policy", policy] + extra
    plan = pebble_json(pebble, plan_args + ["--budget", budget],
                       "pebble plan --policy %s --budget %s" % (policy, budget),
                       infeasible_ok=True)
    if not plan.get("feasible", False):
        log("note: %s cannot meet --budget %s (%s); running it at --budget min"
            % (policy, budget, plan.get("message", "infeasible")))
        budget = "min"
        plan = pebble_json(pebble, plan_args + ["--budget", budget],
                           "pebble plan --policy %s --budget min" % policy)
        if not plan.get("feasible", False):
            raise Failure("policy %s: the plan at --budget min is infeasible: "
                          "%s" % (policy, plan.get("message")))
    return budget, plan


def load_dump(np, dump_dir, expected, policy):
    """Reads OUT/<id>.npy for every expected id; Failure on a missing or an
    unexpected file."""
    files = sorted(f for f in os.listdir(dump_dir))
    names = [f[:-len(".npy")] for f in files if f.endswith(".npy")]
    others = [f for f in files if not f.endswith(".npy")]
    missing = sorted(set(expected) - set(names))
    unexpected = sorted((set(names) - set(expected)) | set(others))
    if missing or unexpected:
        raise Failure("policy %s: dumped outputs differ from the graph's: "
                      "missing %s, unexpected %s" % (policy, missing,
                                                     unexpected))
    return {n: np.load(os.path.join(dump_dir, n + ".npy"), allow_pickle=False)
            for n in names}


def compare(np, got, ref32, ref64, order, zero_grads, policy):
    """Prints the per-tensor table; returns the failure lines. ref64 (may be
    None) adds PyTorch's own fp32 error against fp64, for scale."""
    failures = []
    log("%-48s %-16s %11s %11s %10s  %-9s %s" % (
        "tensor", "shape", "max|torch|", "max abs err", "rel err",
        "torch32/64" if ref64 else "", "status"))
    for name in order:
        a, b = got[name], ref32[name]
        shape = "x".join(str(d) for d in b.shape) or "()"
        if a.shape != b.shape or a.dtype != b.dtype:
            failures.append("policy %s, %s: pebble %s %s, torch %s %s" % (
                policy, name, a.dtype, a.shape, b.dtype, b.shape))
            log("%-48s %-16s shape/dtype mismatch" % (name, shape))
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        ref_max = float(np.max(np.abs(b64))) if b.size else 0.0
        abs_err = float(np.max(np.abs(a64 - b64))) if b.size else 0.0
        rel = abs_err / max(ref_max, TINY)
        torch_rel = ""
        if ref64 is not None and b.size:
            exact = ref64[name]
            torch_rel = "%.1e" % (float(np.max(np.abs(b64 - exact)))
                                  / max(float(np.max(np.abs(exact))), TINY))
        if not np.all(np.isfinite(a)):
            status = "FAIL (not finite)"
        elif name in zero_grads:
            # Zero in exact arithmetic: both fp32 results are rounding noise.
            got_max = float(np.max(np.abs(a64))) if a.size else 0.0
            if got_max <= ZERO_NOISE_FACTOR * max(ref_max, TINY):
                status = "ok (zero in exact arithmetic: noise)"
            else:
                status = ("FAIL (zero in exact arithmetic; pebble's %.1e is "
                          "over %g x PyTorch's noise)" % (got_max,
                                                          ZERO_NOISE_FACTOR))
        else:
            status = "ok" if rel < REL_TOL else "FAIL"
        if status.startswith("FAIL"):
            failures.append("policy %s, %s: rel err %.3e (max abs err %.3e, "
                            "max|torch| %.3e) %s" % (policy, name, rel,
                                                     abs_err, ref_max, status))
        log("%-48s %-16s %11.4e %11.4e %10.3e  %-9s %s" % (
            name, shape, ref_max, abs_err, rel, torch_rel, status))
    return failures


def bitwise_diff(base, got):
    """Names of tensors whose dtype, shape or payload bytes differ."""
    diff = []
    for name in sorted(base):
        a, b = got.get(name), base[name]
        if (a is None or a.dtype != b.dtype or a.shape != b.shape
                or a.tobytes() != b.tobytes()):
            diff.append(name)
    return diff


def add_threads_option(parser):
    """--threads: PyTorch's intra-op threads, OMP_NUM_THREADS where it is set
    (ctest sets 1), else 2. (import_check.py and optimizer_check.py take it
    too.)"""
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS") or 2),
                        help="PyTorch intra-op threads (default $OMP_NUM_THREADS, else 2)")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Cross-check `pebble run` against PyTorch: loss and "
                    "every gradient, for each policy.")
    parser.add_argument("--pebble", required=True, help="the pebble binary")
    parser.add_argument("--model", required=True,
                        help="model spec, e.g. conv3d:n=16")
    parser.add_argument("--policies", default=DEFAULT_POLICIES,
                        help="comma-separated policies (default: %(default)s);"
                             " baseline is always run, first")
    parser.add_argument("--optional-policies", default=DEFAULT_OPTIONAL,
                        help="policies run only where registered, else "
                             "skipped with a note (default: %(default)s)")
    parser.add_argument("--budget", default="60%",
                        help="budget for multi-shot and offload policies "
                             "(default 60%%; `min` where infeasible); "
                             "one-shot policies run at 100%%")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the initialisation and the batch")
    parser.add_argument("--workdir", default=None,
                        help="where inputs and dumps go (default: a "
                             "temporary directory, removed afterwards)")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="passed to pebble plan and run (seconds of "
                             "search for the exact planners)")
    parser.add_argument("--composed", action="store_true",
                        help="plan every policy composed with best-order (pebble's "
                             "default) instead of over the graph's own order "
                             "(--own-order)")
    parser.add_argument("--expect-recompute", action="store_true",
                        help="fail unless some policy's plan recomputes")
    parser.add_argument("--expect-offload", action="store_true",
                        help="fail unless some policy's plan offloads "
                             "(where an offload policy is registered)")
    parser.add_argument("--fp64", action="store_true",
                        help="also run PyTorch in fp64 and print its own "
                             "fp32 error (column torch32/64), for scale")
    parser.add_argument("--backend", default="cpu",
                        help="pebble's backend (default cpu; cuda on a GPU, "
                             "or with pebble-emu, the host emulation)")
    parser.add_argument("--avoid-kinks", action="store_true",
                        help="start at --seed and take the first seed whose "
                             "PyTorch forward has no value at a kink (a ReLU "
                             "input or a max-pool tie within 1e-6 relative), "
                             "trying up to %d" % KINK_FREE_SEEDS)
    add_threads_option(parser)
    try:
        return parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on errors, 0 on --help
        raise UsageError() if e.code else e


def seeded_case(torch, models, spec, seed):
    """The torch side of `spec` at `seed`: (case, x, t). Seeded init, with the
    batch-norm affine parameters moved off their 1/0 defaults so that their
    gradients carry information; the batch from seed + 1."""
    torch.manual_seed(seed)
    try:
        case = models.build(spec)
    except models.SpecError as e:
        raise UsageError("--model %s: %s" % (spec, e)) from None
    models.perturb_batchnorm(case.module)
    x, t = case.make_batch(torch.Generator().manual_seed(seed + 1))
    return case, x, t


def crosscheck(args, np, torch, models):
    pebble = os.path.abspath(args.pebble)
    if not (os.path.isfile(pebble) and os.access(pebble, os.X_OK)):
        raise UsageError("--pebble %s: not an executable file" % args.pebble)
    torch.set_num_threads(max(1, args.threads))
    case, x, t = seeded_case(torch, models, args.model, args.seed)
    if args.avoid_kinks:
        first = args.seed
        while True:
            kinks = count_kinks(torch, copy.deepcopy(case.module), x, t)
            if kinks == (0, 0):
                break
            log("note: seed %d has %d ReLU inputs and %d max-pool windows at "
                "kinks (--avoid-kinks); trying seed %d" % (
                    args.seed, kinks[0], kinks[1], args.seed + 1))
            if args.seed + 1 >= first + KINK_FREE_SEEDS:
                raise Failure("--avoid-kinks: every seed from %d to %d has "
                              "values at kinks" % (first, args.seed))
            args.seed += 1
            case, x, t = seeded_case(torch, models, args.model, args.seed)

    registered = {p["name"]: p["kind"] for p in
                  pebble_json(pebble, ["policies"], "pebble policies")}
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in registered]
    if unknown:
        raise UsageError("unknown policies %s (registered: %s)" % (
            unknown, ", ".join(sorted(registered))))
    for p in (p.strip() for p in args.optional_policies.split(",")):
        if not p or p in policies:
            continue
        if p in registered:
            policies.append(p)
        else:
            log("note: policy %s is not registered in this pebble; not run"
                % p)
    policies = ["baseline"] + [p for p in policies if p != "baseline"]
    check_has_run(pebble)
    check_backend_has_device(pebble, args.backend)

    workdir = args.workdir
    own_workdir = workdir is None
    if own_workdir:
        workdir = tempfile.mkdtemp(prefix="pebble-crosscheck-")
    try:
        return run_policies(args, np, torch, pebble, case, x, t, policies,
                            registered, workdir)
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def fresh_dir(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)
    return path


def run_policies(args, np, torch, pebble, case, x, t, policies, registered,
                 workdir):
    inputs_dir = fresh_dir(os.path.join(workdir, "inputs"))
    written = write_inputs(np, torch, case, x, t, inputs_dir)
    order = ["loss"] + ["grad:" + n for n, _ in case.module.named_parameters()]
    check_graph_matches(
        pebble_json(pebble, ["describe", "--model", args.model],
                    "pebble describe"), written, order)
    # The reference runs after the inputs are written: training-mode batch
    # norm updates the running statistics in place.
    ref64 = None
    if args.fp64:
        ref64 = torch_reference(torch, copy.deepcopy(case.module), x, t,
                                torch.float64)
    ref32 = torch_reference(torch, case.module, x, t, torch.float32)
    log("model %s, seed %d: %d persistent tensors, %d outputs; torch loss %.8g"
        % (args.model, args.seed, len(written), len(order),
           float(ref32["loss"])))

    zero_grads = {"grad:" + name for name in case.zero_grads}
    extra = [] if args.time_limit is None else [
        "--time-limit", str(args.time_limit)]
    # The policies as published, over the graph's own order: composed with
    # best-order (the default) they often meet these budgets with
    # best-order's one-shot plan, and the recomputing and offloading
    # schedules this check exists to run would go untested.
    own_order = [] if args.composed else ["--own-order"]
    recomputed, transferred = [], []
    failures = []
    baseline = None
    for policy in policies:
        policy_extra = extra + (own_order if registered[policy] != "one-shot" else [])
        budget, plan = pick_budget(pebble, args.model, policy,
                                   registered[policy], args.budget, policy_extra)
        report = plan.get("report", {})
        dump_dir = os.path.join(workdir, "out-" + policy)
        if os.path.isdir(dump_dir):
            shutil.rmtree(dump_dir)
        log("\n== policy %s (%s), --budget %s: planned peak %s bytes, %s "
            "recomputations, %s bytes transferred" % (
                policy, registered[policy], budget, report.get("peak_bytes"),
                report.get("recomputations"), report.get("transfer_bytes")))
        result = pebble_json(pebble, [
            "run", "--model", args.model, "--policy", policy,
            "--budget", budget, "--backend", args.backend, "--inputs", inputs_dir,
            "--dump", dump_dir, "--seed", str(args.seed)] + policy_extra,
            "pebble run --policy %s --budget %s" % (policy, budget))
        predicted = result.get("predicted") or {}
        measured = result.get("measured") or {}
        log("pebble run: loss %s; %s recomputations, %s bytes transferred; "
            "peak predicted %s, measured %s bytes; time %s s; %s inputs "
            "loaded, %s generated" % (
                result.get("loss"), predicted.get("recomputations"),
                predicted.get("transfer_bytes"), predicted.get("peak_bytes"),
                measured.get("peak_bytes"), measured.get("time_s"),
                result.get("loaded_inputs"), result.get("generated_inputs")))
        if (predicted.get("recomputations") or 0) > 0:
            recomputed.append(policy)
        if (predicted.get("transfer_bytes") or 0) > 0:
            transferred.append(policy)
        if (result.get("loaded_inputs") != len(written)
                or result.get("generated_inputs") != 0):
            raise Failure("policy %s: pebble loaded %s of the %d input "
                          "tensors and generated %s (all must be read from "
                          "%s)" % (policy, result.get("loaded_inputs"),
                                   len(written),
                                   result.get("generated_inputs"),
                                   inputs_dir))
        got = load_dump(np, dump_dir, order, policy)
        if "loss" in result and result["loss"] is not None:
            json_loss, npy_loss = float(result["loss"]), float(got["loss"])
            if abs(json_loss - npy_loss) > 1e-6 * max(abs(npy_loss), 1e-30):
                failures.append("policy %s: the JSON loss %r differs from "
                                "loss.npy %r" % (policy, json_loss, npy_loss))
        if baseline is None:
            baseline = got
            failures += compare(np, got, ref32, ref64, order, zero_grads,
                            policy)
            continue
        diff = bitwise_diff(baseline, got)
        if not diff:
            log("identical to baseline, byte for byte (%d tensors)"
                % len(got))
            continue
        failures.append("policy %s: not bitwise identical to baseline: %s"
                        % (policy, ", ".join(diff)))
        failures += compare(np, got, ref32, ref64, order, zero_grads,
                            policy)

    log("\npolicies that recomputed: %s; that moved bytes to the host and "
        "back: %s" % (", ".join(recomputed) or "none",
                      ", ".join(transferred) or "none"))
    if args.expect_recompute and not recomputed:
        failures.append("no policy recomputed anything (--expect-recompute): "
                        "the run does not test recomputation")
    offload_run = [p for p in policies if registered[p] == "offload"]
    if args.expect_offload and not offload_run:
        log("note: --expect-offload, but no offload policy is registered")
    elif args.expect_offload and not transferred:
        failures.append("no policy offloaded anything (--expect-offload): "
                        "the run does not test offloading")
    log("")
    if failures:
        for line in failures:
            log("MISMATCH: " + line)
        log(kink_note(torch, copy.deepcopy(case.module), x, t))
        return EXIT_FAIL
    log("PASS: %s, policies %s: loss and %d gradients within %.0e of "
        "PyTorch, every policy bitwise identical to baseline"
        % (args.model, ",".join(policies), len(order) - 1, REL_TOL))
    return EXIT_OK


def main(argv):
    try:
        args = parse_args(argv)
    except UsageError:
        return EXIT_USAGE
    try:
        import numpy as np
        import torch
    except ImportError as e:
        log("SKIP: numpy and torch are needed (%s)" % e)
        return EXIT_SKIP
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import models
    try:
        return crosscheck(args, np, torch, models)
    except UsageError as e:
        print("crosscheck: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    except NoDevice as e:
        log("SKIP: --backend %s: %s" % (args.backend, e))
        return EXIT_SKIP
    except Failure as e:
        log("FAIL: %s" % e)
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
