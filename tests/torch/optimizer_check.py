#!/usr/bin/env python3
"""Checks several training steps of `pebble run --optimizer` against torch.optim.

    optimizer_check.py --pebble PATH --model SPEC --optimizer SPEC
                       [--steps N] [--policies a,b,...] [--budget B]
                       [--seed N] [--workdir DIR] [--backend cpu]

Builds the PyTorch twin of a pebble model (tests/torch/models.py, seeded as
crosscheck.py seeds it), writes its parameters, buffers and batch as
DIR/inputs/<id>.npy, and runs `pebble run --optimizer SPEC` N times per
policy: each step reads the parameters and optimizer state that the previous
step dumped (the first generates the state: zeros, as torch.optim starts).
PyTorch takes the same N steps on the same batch with the matching
torch.optim optimizer. Then:

- each step's loss matches PyTorch's, and after N steps every parameter and
  every optimizer state (momentum_buffer:<p>, exp_avg:<p>, exp_avg_sq:<p>,
  optimizer.step) matches PyTorch's, relative error
  max|a - b| / max(max|b|, tiny) below the tolerance (crosscheck.REL_TOL;
  for Adam's parameters, see ADAM_DIRECTION_SLACK);
- each step, replayed by torch.optim from pebble's own state and gradients,
  gives pebble's parameters and state to REPLAY_TOL (the baseline policy;
  not with gradients=drop, where the gradients are not dumped);
- every policy's tensors after N steps are byte-for-byte the baseline
  policy's (recomputation and reordering must not change a bit);
- every run's measured peak equals its predicted peak.

Exit status: 0 when everything matches, 1 on a mismatch or a failed pebble
command, 2 on a usage error, 77 when numpy or torch cannot be imported.
"""

import argparse
import copy
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import crosscheck as cc  # noqa: E402  (the helpers: runs, dumps, comparison)

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_SKIP = 0, 1, 2, 77
# Each step replayed by torch.optim on pebble's own gradients and state must
# give pebble's tensors to a few float32 roundings (ATen may fuse a multiply
# and an add that pebble rounds twice).
REPLAY_TOL = 1e-6
# Adam moves each parameter element by about lr per step whatever the size
# of its gradient (m / sqrt(v) is about +-1), so an element whose gradient
# float32 rounding leaves near zero, in pebble or in PyTorch, may step the
# other way: over N steps its parameter differs by up to 2 lr N, however
# right both are. The N-step comparison of Adam's parameters allows this
# fraction of lr N in absolute error; the per-step replay (REPLAY_TOL) is
# what proves the arithmetic.
ADAM_DIRECTION_SLACK = 0.2


def parse_optimizer(text):
    """pebble's optimizer spec ("adam:lr=1e-3,beta1=0.9") as (name, {key:
    float}) with pebble's defaults (graph/optimizer.h) filled in."""
    name, _, params = text.partition(":")
    name = name.strip()
    defaults = {
        "sgd": {"lr": 0.01, "momentum": 0.0, "weight_decay": 0.0},
        "adam": {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                 "weight_decay": 0.0},
        "adamw": {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                  "weight_decay": 0.01},
    }
    for values in defaults.values():
        values["max_grad_norm"] = 0.0  # 0: no clipping
    if name not in defaults:
        raise cc.UsageError("--optimizer %s: expected sgd, adam or adamw" % text)
    values = dict(defaults[name])
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, _, value = item.partition("=")
        # where pebble keeps and runs what: no matter to torch.optim
        if key in ("state", "gradients", "parameters", "updates"):
            continue
        if key not in values:
            raise cc.UsageError("--optimizer %s: %s takes %s, state, gradients, parameters "
                                "and updates"
                                % (text, name, ", ".join(values)))
        values[key] = float(value)
    return name, values


def torch_optimizer(torch, name, v, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=v["lr"], momentum=v["momentum"],
                               weight_decay=v["weight_decay"])
    cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    return cls(params, lr=v["lr"], betas=(v["beta1"], v["beta2"]), eps=v["eps"],
               weight_decay=v["weight_decay"])


def torch_steps(np, torch, module, x, t, name, values, steps):
    """PyTorch's N steps: (losses, {pebble id: final numpy array}) for every
    parameter and optimizer state."""
    module = module.to(torch.float32)
    module.train()
    opt = torch_optimizer(torch, name, values, list(module.parameters()))
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = module(x, t)
        loss.backward()
        if values["max_grad_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(module.parameters(), values["max_grad_norm"])
        opt.step()
        losses.append(float(loss))
    final = {}
    for pname, p in module.named_parameters():
        final[pname] = p.detach().numpy().copy()
        state = opt.state[p]
        for key in ("momentum_buffer", "exp_avg", "exp_avg_sq"):
            if state.get(key) is not None:
                final["%s:%s" % (key, pname)] = state[key].detach().numpy().copy()
        if "step" in state:
            step = state["step"]
            step = step.detach().numpy().copy() if torch.is_tensor(step) else step
            final["optimizer.step"] = np.array(step, dtype=np.float32)
    return losses, final


def replay_step(np, torch, name, values, before, dumped, params):
    """torch.optim's step from pebble's own state before the step (`before`:
    parameters and optimizer state) and pebble's own gradients of that step
    (`dumped`): {pebble id: numpy array} of what the step should give."""
    if values["max_grad_norm"] > 0:
        check_clipped(np, values["max_grad_norm"], dumped, params)
    tensors = {n: torch.nn.Parameter(torch.from_numpy(before[n].copy())) for n in params}
    for n, p in tensors.items():
        p.grad = torch.from_numpy(dumped["grad:" + n].copy())
    opt = torch_optimizer(torch, name, values, list(tensors.values()))
    for n, p in tensors.items():
        state = {}
        if name == "sgd" and values["momentum"] > 0:
            # pebble starts the buffer at zeros: momentum 0 + g is torch's
            # first buffer, a copy of g.
            state["momentum_buffer"] = torch.from_numpy(before["momentum_buffer:" + n].copy())
        elif name != "sgd":
            state["step"] = torch.tensor(float(before["optimizer.step"]))
            state["exp_avg"] = torch.from_numpy(before["exp_avg:" + n].copy())
            state["exp_avg_sq"] = torch.from_numpy(before["exp_avg_sq:" + n].copy())
        opt.state[p] = state
    opt.step()
    after = {}
    for n, p in tensors.items():
        after[n] = p.detach().numpy().copy()
        for key in ("momentum_buffer", "exp_avg", "exp_avg_sq"):
            if opt.state[p].get(key) is not None:
                after["%s:%s" % (key, n)] = opt.state[p][key].numpy().copy()
        if "step" in opt.state[p]:
            after["optimizer.step"] = np.array(float(opt.state[p]["step"]), dtype=np.float32)
    return after


def check_clipped(np, max_norm, dumped, params):
    """With max_grad_norm, pebble dumps the clipped gradients (grad:<p>, as
    .grad holds them after clip_grad_norm_) and the norm before clipping
    (grad_norm): the clipped gradients' norm must be that norm times
    clip_grad_norm_'s factor, min(1, max_norm / (norm + 1e-6)). (Whether the
    norm itself is right, the N-step trajectory against torch.optim with
    clip_grad_norm_ tells.)"""
    if "grad_norm" not in dumped:
        raise cc.Failure("max_grad_norm is set but --dump has no grad_norm")
    norm = float(dumped["grad_norm"])
    factor = min(1.0, max_norm / (norm + 1e-6))
    clipped = float(np.sqrt(sum(float(np.sum(dumped["grad:" + n].astype(np.float64) ** 2))
                                for n in params)))
    if abs(clipped - norm * factor) > 1e-5 * max(norm * factor, cc.TINY):
        raise cc.Failure("the clipped gradients' norm is %.9g; grad_norm %.9g times the "
                         "factor %.9g is %.9g" % (clipped, norm, factor, norm * factor))
    cc.log("clipped: grad_norm %.6g, factor %.6g" % (norm, factor))


def state_ids(describe):
    """The optimizer-state nodes of pebble's graph (role optimizer_state)."""
    return sorted(n["id"] for n in describe["nodes"] if n.get("role") == "optimizer_state")


def run_policy(args, np, pebble, policy, kind, inputs_dir, workdir, expected, extra,
               replay=None):
    """N steps of `pebble run` under `policy`: (losses, final tensors,
    failures). With `replay` (before, dumped -> expected tensors), each
    step's tensors are also checked against it (REPLAY_TOL)."""
    budget, _ = cc.pick_budget(pebble, args.model, policy, kind, args.budget, extra)
    step_inputs = cc.fresh_dir(os.path.join(workdir, "in-" + policy))
    for f in os.listdir(inputs_dir):
        shutil.copy(os.path.join(inputs_dir, f), step_inputs)
    losses, failures, dumped = [], [], {}
    before = None
    for step in range(args.steps):
        out = os.path.join(workdir, "out-%s-%d" % (policy, step))
        if os.path.isdir(out):
            shutil.rmtree(out)
        r = cc.pebble_json(pebble, [
            "run", "--model", args.model, "--policy", policy, "--budget", budget, "--backend", args.backend,
            "--inputs", step_inputs, "--dump", out] + extra,
            "pebble run --policy %s, step %d" % (policy, step + 1))
        predicted = (r.get("predicted") or {}).get("peak_bytes")
        measured = (r.get("measured") or {}).get("peak_bytes")
        if predicted != measured:
            failures.append("policy %s, step %d: measured peak %s bytes, predicted %s"
                            % (policy, step + 1, measured, predicted))
        dumped = {f[:-4]: np.load(os.path.join(out, f), allow_pickle=False)
                  for f in os.listdir(out) if f.endswith(".npy")}
        missing = sorted(set(expected) - set(dumped))
        if missing:
            raise cc.Failure("policy %s, step %d: --dump has no %s" % (
                policy, step + 1, ", ".join(missing)))
        losses.append(float(dumped["loss"]))
        if "grad_norm" in dumped and r.get("grad_norm") != float(dumped["grad_norm"]):
            failures.append("policy %s, step %d: run --json's grad_norm %r, the dump's %r"
                            % (policy, step + 1, r.get("grad_norm"),
                               float(dumped["grad_norm"])))
        if replay is not None and not all("grad:" + n in dumped for n in expected
                                          if ":" not in n and n != "optimizer.step"):
            if step == 0:
                cc.log("note: the gradients are not outputs (gradients=drop): no step replay")
        elif replay is not None:
            if before is None:  # pebble generated the state: zeros
                before = {n: np.load(os.path.join(step_inputs, n + ".npy"))
                          for n in expected if os.path.exists(
                              os.path.join(step_inputs, n + ".npy"))}
                for n in expected:
                    if n not in before:
                        before[n] = np.zeros_like(dumped[n])
            failures += compare(np, dumped, replay(before, dumped), expected, REPLAY_TOL,
                                "%s, step %d replayed by torch.optim" % (policy, step + 1),
                                quiet=True)
            before = {n: dumped[n] for n in expected}
        # The next step starts from this one's parameters and state.
        for name in expected:
            np.save(os.path.join(step_inputs, name + ".npy"), dumped[name])
        cc.log("policy %s, step %d: loss %.8g, peak predicted %s, measured %s bytes, "
               "%s recomputations" % (policy, step + 1, losses[-1], predicted, measured,
                                       (r.get("predicted") or {}).get("recomputations")))
    return losses, {name: dumped[name] for name in expected}, failures


def check(args, np, torch, models):
    pebble = os.path.abspath(args.pebble)
    if not (os.path.isfile(pebble) and os.access(pebble, os.X_OK)):
        raise cc.UsageError("--pebble %s: not an executable file" % args.pebble)
    name, values = parse_optimizer(args.optimizer)
    torch.set_num_threads(max(1, args.threads))
    case, x, t = cc.seeded_case(torch, models, args.model, args.seed)
    registered = {p["name"]: p["kind"] for p in
                  cc.pebble_json(pebble, ["policies"], "pebble policies")}
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in registered]
    if unknown:
        raise cc.UsageError("unknown policies %s" % unknown)
    policies = ["baseline"] + [p for p in policies if p != "baseline"]
    workdir = args.workdir or tempfile.mkdtemp(prefix="pebble-optimizer-check-")
    try:
        inputs_dir = cc.fresh_dir(os.path.join(workdir, "inputs"))
        written = cc.write_inputs(np, torch, case, x, t, inputs_dir)
        describe = cc.pebble_json(pebble, ["describe", "--model", args.model,
                                           "--optimizer", args.optimizer],
                                  "pebble describe --optimizer")
        states = state_ids(describe)
        params = [n for n, _ in case.module.named_parameters()]
        expected = params + states
        ref_losses, ref = torch_steps(np, torch, copy.deepcopy(case.module), x, t, name,
                                      values, args.steps)
        absent = sorted(set(expected) - set(ref))
        if absent:
            raise cc.Failure("pebble's persistent tensors %s have no PyTorch "
                             "counterpart after %d steps" % (absent, args.steps))
        cc.log("model %s, optimizer %s, %d steps: %d parameters, %d state tensors; "
               "torch losses %s" % (args.model, args.optimizer, args.steps, len(params),
                                    len(states), ", ".join("%.6g" % l for l in ref_losses)))
        extra = ["--seed", str(args.seed), "--optimizer", args.optimizer]
        failures, baseline = [], None
        for policy in policies:
            kind = registered[policy]
            policy_extra = extra + (["--own-order"] if kind != "one-shot" else [])
            replay = None
            if baseline is None:
                replay = lambda before, dumped: replay_step(np, torch, name, values, before,
                                                             dumped, params)
            losses, got, fails = run_policy(args, np, pebble, policy, kind, inputs_dir,
                                            workdir, expected, policy_extra, replay)
            failures += fails
            # Relative to the first loss: a loss that training drives toward
            # zero keeps the absolute error of its first steps.
            scale = max(abs(ref_losses[0]), cc.TINY)
            for k, (a, b) in enumerate(zip(losses, ref_losses)):
                if abs(a - b) > args.tolerance * max(abs(b), scale):
                    failures.append("policy %s, step %d: loss %.9g, torch %.9g" % (
                        policy, k + 1, a, b))
            if baseline is None:
                baseline = got
                cc.log("after %d steps, against torch.optim:" % args.steps)
                slack = {}
                if name != "sgd":
                    slack = {n: ADAM_DIRECTION_SLACK * values["lr"] * args.steps
                             for n in params}
                failures += compare(np, got, ref, expected, args.tolerance, policy,
                                    slack=slack)
                continue
            diff = cc.bitwise_diff(baseline, got)
            if diff:
                failures.append("policy %s: not bitwise identical to baseline: %s"
                                % (policy, ", ".join(diff)))
            else:
                cc.log("policy %s: identical to baseline, byte for byte (%d tensors)"
                       % (policy, len(got)))
        if failures:
            for line in failures:
                cc.log("MISMATCH: " + line)
            return EXIT_FAIL
        cc.log("PASS: %s, %s, %d steps, policies %s: losses, parameters and optimizer "
               "state within %.0e of torch.optim, every policy bitwise identical to "
               "baseline, measured peak == predicted" % (
                   args.model, args.optimizer, args.steps, ",".join(policies),
                   args.tolerance))
        return EXIT_OK
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def compare(np, got, ref, names, tolerance, policy, quiet=False, slack=None):
    """Failure lines for each tensor of `names` whose relative error is
    `tolerance` or more, unless its absolute error is within slack[name];
    prints a table unless `quiet`."""
    slack = slack or {}
    failures = []
    log = (lambda *a: None) if quiet else cc.log
    log("%-40s %-14s %11s %11s %10s %s" % ("tensor", "shape", "max|torch|",
                                             "max abs err", "rel err", "status"))
    for name in names:
        a, b = got[name], ref[name]
        shape = "x".join(str(d) for d in b.shape) or "()"
        if a.shape != b.shape or a.dtype != b.dtype:
            failures.append("policy %s, %s: pebble %s %s, torch %s %s" % (
                policy, name, a.dtype, a.shape, b.dtype, b.shape))
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        ref_max = float(np.max(np.abs(b64))) if b.size else 0.0
        err = float(np.max(np.abs(a64 - b64))) if b.size else 0.0
        rel = err / max(ref_max, cc.TINY)
        ok = bool(np.all(np.isfinite(a))) and (rel < tolerance or err <= slack.get(name, -1))
        if not ok:
            failures.append("policy %s, %s: rel err %.3e (max abs err %.3e, max|torch| %.3e)"
                            % (policy, name, rel, err, ref_max))
        log("%-40s %-14s %11.4e %11.4e %10.3e %s" % (name, shape, ref_max, err, rel,
                                                       "ok" if ok else "FAIL"))
    return failures


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Check N training steps of `pebble run --optimizer` against "
                    "torch.optim: losses, parameters and optimizer state.")
    parser.add_argument("--pebble", required=True, help="the pebble binary")
    parser.add_argument("--model", required=True, help="model spec, e.g. mnist-cnn:batch=8")
    parser.add_argument("--optimizer", required=True,
                        help="pebble's optimizer spec, e.g. sgd:lr=0.1,momentum=0.9")
    parser.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    parser.add_argument("--policies", default="baseline,sqrtn,dtr",
                        help="comma-separated policies (default: %(default)s); "
                             "baseline is always run, first")
    parser.add_argument("--budget", default="70%",
                        help="budget for multi-shot and offload policies (default 70%%; "
                             "`min` where infeasible)")
    parser.add_argument("--tolerance", type=float, default=cc.REL_TOL,
                        help="relative error allowed against PyTorch (default %(default)g)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and batch")
    parser.add_argument("--workdir", default=None,
                        help="where inputs and dumps go (default: a temporary directory)")
    parser.add_argument("--backend", default="cpu", help="pebble's backend (default cpu)")
    cc.add_threads_option(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        raise cc.UsageError() if e.code else e
    if args.steps < 1:
        raise cc.UsageError("--steps must be at least 1")
    return args


def main(argv):
    try:
        args = parse_args(argv)
    except cc.UsageError as e:
        if str(e):
            cc.log("usage error: %s" % e)
        return EXIT_USAGE
    try:
        import numpy as np
        import torch
    except ImportError as e:
        cc.log("SKIP: numpy and torch are needed (%s)" % e)
        return EXIT_SKIP
    import models
    try:
        return check(args, np, torch, models)
    except cc.UsageError as e:
        cc.log("usage error: %s" % e)
        return EXIT_USAGE
    except cc.Failure as e:
        cc.log("FAIL: %s" % e)
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
