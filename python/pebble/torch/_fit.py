"""largest_batch: the largest batch whose training step a policy fits in a
byte budget, and the largest that eager PyTorch's step fits, from the same
captures (docs/torch.md, "The largest batch").

Each batch size tried is a train_step of its own: captured, calibrated and
planned as a first call is (seconds each); the search doubles the batch,
then bisects, assuming the peak grows with the batch, as `pebble fit` does;
eager's batch is searched from the same probes, interpolating the unplanned
step's peak (_largest_eager).
The figures are predictions (the plan's peak, and the unplanned step's,
which is eager's to the byte); verify=True runs one step at the answer and
reports the allocator's measured peak beside them.
"""

import copy
import gc

import torch


def largest_batch(model, loss_fn, make_batch, budget, policy="dtr", start=1, max_batch=1 << 20,
                  verify=True, **options):
    """The largest batch size `policy` trains `model` in within `budget`.

    make_batch(n) -> (inputs, target): a batch of n samples, inputs a tensor
    or a tuple of tensors, as train_step takes them. budget: bytes (a float
    from 1024 up rounds down), or a size with its unit ("8GiB"): the whole
    step's device memory, parameters, buffers, batch and gradients included
    (a percentage changes with the batch, so it is refused). options:
    train_step's other arguments (optimizer=..., host_budget=...,
    time_limit=...).

    Returns a dict: "batch" (None where even `start` does not fit), its
    "predicted_peak_bytes" (the whole step), "predicted_step_peak_bytes"
    (above the persistent tensors) and "compute_overhead"; "eager_batch",
    the largest batch the unplanned step (eager PyTorch's, to the byte)
    fits, at most "batch" (None where `start` does not), with its
    "eager_peak_bytes" (pebble's baseline) and
    "eager_measured_step_peak_bytes" (the allocator's, of the unplanned
    step run at capture, above what was held before it); "budget_bytes";
    "bounded_by_max" (True where `max_batch` fits: a larger batch may too); "tried": a row per batch
    size tried (batch, whether the policy and eager fit, the peaks, or why
    it did not plan); and with `verify`, "measured_step_peak_bytes": what
    the allocator held at most during one step at "batch" above what it
    held before it (a step's report["measured_peak_bytes"]), and
    "measured_step_predicted_peak_bytes", that step's own prediction: the
    step is captured and planned again, and a policy that weighs the
    operators' times, which capture measures anew, may plan it otherwise
    than the search did (dtr at the budget's edge: 1 MB apart in 133 MB).
    The module's parameters, buffers and .grad and the optimizer's state
    are as they were."""
    from . import PlanError, TrainStep  # noqa: PLC0415 (this module is pebble.torch's)

    budget_bytes = _check_arguments(budget, start, max_batch, options)
    probes = {}

    def probe(n):
        if n not in probes:
            probes[n] = _probe(TrainStep, PlanError, model, loss_fn, make_batch, n, budget,
                               policy, options)
        return probes[n]

    batch = _largest(lambda n: probe(n)["fits"], start, max_batch)
    eager = _largest_eager(probe, probes, start, batch, budget_bytes)
    result = {"policy": policy, "budget_bytes": budget_bytes,
              "batch": batch, "eager_batch": eager,
              "bounded_by_max": batch == max_batch,
              "tried": [dict(batch=n, **{k: v for k, v in p.items() if k != "budget_bytes"})
                        for n, p in sorted(probes.items())]}
    if batch is not None:
        for key in ("predicted_peak_bytes", "predicted_step_peak_bytes", "compute_overhead"):
            result[key] = probes[batch][key]
    if eager is not None:
        for key in ("eager_peak_bytes", "eager_measured_step_peak_bytes"):
            result[key] = probes[eager][key]
    if verify and batch is not None:
        measured, predicted = _measured(TrainStep, model, loss_fn, make_batch, batch, budget,
                                        policy, options)
        result["measured_step_peak_bytes"] = measured
        result["measured_step_predicted_peak_bytes"] = predicted
    return result


def _check_arguments(budget, start, max_batch, options):
    """The budget in bytes, or a ValueError for arguments no search can
    take."""
    from . import _check_as_pebble_plan_does, _whole_bytes  # noqa: PLC0415 (pebble.torch's)

    if isinstance(budget, str) and (budget.strip().endswith("%") or
                                    budget.strip().lower() == "min"):
        raise ValueError(f"budget {budget!r}: largest_batch needs a budget in bytes or with a "
                         "unit (\"8GiB\"): a percentage or 'min' changes with the batch")
    budget_bytes = _check_as_pebble_plan_does(budget=_whole_bytes(budget)).budget_bytes
    for name, value in (("start", start), ("max_batch", max_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")
    if max_batch < start:
        raise ValueError(f"max_batch {max_batch} is below start {start}: nothing to try")
    for name in ("process_group", "shard", "measure"):
        if name in options:
            raise ValueError(f"largest_batch takes no {name}= (one process; it measures the "
                             "answer itself with verify=True)")
    return budget_bytes


def _largest(fits, start, high_bound):
    """The largest n in [start, high_bound] with fits(n), by doubling from
    start and then bisecting (fits assumed monotone), or None where
    fits(start) is false."""
    if not fits(start):
        return None
    low, high = start, None  # fits(low); not fits(high)
    while high is None:
        n = min(2 * low, high_bound)
        if n == low:
            return low
        if fits(n):
            low = n
        else:
            high = n
    while high - low > 1:
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low


def _largest_eager(probe, probes, start, batch, budget_bytes):
    """The largest n in [start, batch] whose unplanned step fits, or None:
    bracketed by the batch sizes the policy's search probed, then searched
    by interpolating the unplanned step's peak between the bracket's ends
    (nearly linear in the batch: two or three probes), bisecting where an
    end has no peak (the policy did not plan it) or a guess did not halve
    the bracket."""
    def fits(n):
        return probe(n).get("eager_fits", False)

    if batch is None or not fits(start):
        return None
    low = max(n for n, p in probes.items() if n <= batch and p.get("eager_fits"))
    above = [n for n, p in probes.items() if low < n <= batch and not p.get("eager_fits")]
    if not above:
        return low if low == batch else _largest(fits, low, batch)
    high = min(above)  # fits(low); not fits(high)
    halved = True
    while high - low > 1:
        peaks = probes[low].get("eager_peak_bytes"), probes[high].get("eager_peak_bytes")
        if halved and None not in peaks and peaks[1] > peaks[0]:
            guess = low + (budget_bytes - peaks[0]) * (high - low) // (peaks[1] - peaks[0])
            guess = min(max(guess, low + 1), high - 1)
        else:
            guess = (low + high) // 2
        width = high - low
        if fits(guess):
            low = guess
        else:
            high = guess
        halved = 2 * (high - low) <= width
    return low


def _probe(train_step_class, plan_error, model, loss_fn, make_batch, n, budget, policy,
           options):
    """What a train_step at batch n says: whether the policy fits, its peak
    and overhead, and whether the unplanned step fits (its peak)."""
    inputs, target = _batch(make_batch, n)
    try:
        step = train_step_class(model, loss_fn, inputs, target, policy=policy, budget=budget,
                                measure="never", **options)
    except plan_error as e:
        # (the policy's least peak is over the budget: the unplanned step's,
        # no lower, is too)
        return {"fits": False, "eager_fits": False, "why": str(e).split(": ")[-1][:200]}
    except (MemoryError, RuntimeError) as e:
        if "out of memory" not in str(e).lower():
            raise
        return {"fits": False, "eager_fits": False, "why": "out of memory at capture"}
    report = step.report
    eager_peak = report["baseline_peak_bytes"]
    found = {"fits": True, "budget_bytes": report["budget_bytes"],
             "predicted_peak_bytes": report["predicted_peak_bytes"],
             "predicted_step_peak_bytes": report["predicted_step_peak_bytes"],
             "compute_overhead": report["compute_overhead"],
             "eager_fits": eager_peak <= report["budget_bytes"], "eager_peak_bytes": eager_peak,
             "eager_measured_step_peak_bytes": report["unplanned_measured_peak_bytes"]}
    del step
    _free_memory()
    return found


def _measured(train_step_class, model, loss_fn, make_batch, n, budget, policy, options):
    """The allocator's measured peak of one step at batch n, and that step's
    predicted one (each above what was held before the step). The module's
    parameters, buffers and .grad, and the optimizer's state, are put back
    after it (the step updates them)."""
    inputs, target = _batch(make_batch, n)
    state = copy.deepcopy(model.state_dict())
    grads = [(p, None if p.grad is None else p.grad.detach().clone())
             for p in model.parameters()]
    optimizer = options.get("optimizer")
    optimizer_state = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
    try:
        step = train_step_class(model, loss_fn, inputs, target, policy=policy, budget=budget,
                                measure="always", **options)
        step(*inputs, target)
        measured = step.report["measured_peak_bytes"]
        predicted = step.report["predicted_step_peak_bytes"]
        del step
    finally:
        with torch.no_grad():
            model.load_state_dict(state)
            for p, grad in grads:
                p.grad = grad
        if optimizer is not None:
            optimizer.load_state_dict(optimizer_state)
        _free_memory()
    return measured, predicted


def _batch(make_batch, n):
    """make_batch(n) as (inputs tuple, target), or a ValueError naming it."""
    made = make_batch(n)
    if not isinstance(made, (tuple, list)) or len(made) != 2:
        raise ValueError(f"make_batch({n}) must return (inputs, target), not "
                         f"{type(made).__name__}")
    inputs, target = made
    return (tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)), target


def _free_memory():
    """Frees what a dropped probe held (its capture and plan, reference
    cycles among them) and the device memory the allocator cached."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
