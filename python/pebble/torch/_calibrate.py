"""Calibration: the captured step run unplanned on the real device.

Runs of the graph's own order, each tensor freed at its last use (the
schedule eager PyTorch follows):
1. timing: each node's seconds (its cost in the plan), the faster of two
   runs (Note [Timed twice]);
2. temporaries: what each call allocates beyond its outputs, measured once
   per distinct call (operator, argument shapes and values) by the
   allocator (_memory.AllocatorPeak): the node's workspace in the plan;
3. the step: its peak as the allocator measures it, the reference of
   percentage budgets ("70%" of the unplanned step).
On the CPU, 2 and 3 are one run (Note [One profiled run on the CPU]).
Where the unplanned step does not fit the device (a batch beyond what eager
trains), 1 and 2 run instead under a plan that fits: dtr's plan at its least
peak, made from estimated costs (Note [Calibrating under a plan]), and
percentages refer to pebble's prediction of the unplanned step. Where that
fails too, costs fall back to an estimate from the operands' sizes and
FLOPs and temporaries to none. The report says which.
"""

import gc
import json
import math
import time

import torch

from ._capture import _first_line, _rng_kept
from ._compat import storage_bytes
from ._executor import Program
from ._memory import AllocatorPeak, CpuMemoryEvents, collector_paused, round_up


class Calibration:
    def __init__(self):
        self.costs = {}           # node index -> seconds
        self.unplanned_peak_bytes = None  # allocator's step peak of the unplanned run
        self.source = "measured"  # or "estimated: <why>"
        self.seconds = 0.0        # time the calibration took


def unplanned_schedule(graph):
    """The graph's own order, every tensor freed right after its last reader:
    what eager PyTorch runs (pebble's `baseline` rule, SPEC "free at last
    use"), aliases included: a base freed while its views live keeps its
    storage through them."""
    outputs = {n.index for n in graph.outputs()}
    needed = graph.ancestors(outputs)
    order = [n for n in graph.nodes if n.index in needed and n.kind != "persistent"]
    last = {}
    for k, node in enumerate(order):
        for u in node.inputs:
            last[u.index] = k
    schedule = []
    for k, node in enumerate(order):
        schedule.append(("compute", node.id))
        for i in dict.fromkeys(u.index for u in node.inputs):
            u = graph.nodes[i]
            if last.get(i) == k and u.kind != "persistent" and i not in outputs:
                schedule.append(("free", u.id))
        if node.index not in last and node.index not in outputs:
            schedule.append(("free", node.id))
    return schedule


def calibrate(graph, device, persistent):
    """Costs and temporaries of `graph`'s nodes on `device` (set on the nodes:
    Node.temporary_bytes), and the unplanned step's measured peak."""
    start = time.perf_counter()
    if device.type == "cuda":
        # What garbage holds on a GPU counts against the memory the runs
        # need; on the CPU it is left to the collector (Note [The collector
        # paused] in _memory.py).
        gc.collect()
    result = Calibration()
    program = Program(graph, unplanned_schedule(graph), device)
    try:
        result.costs, result.unplanned_peak_bytes = _time_and_measure(
            graph, program, persistent, device, step_peak=True)
    except (RuntimeError, MemoryError) as e:
        if not _out_of_memory(e):
            raise
        why = f"the unplanned step does not fit the device ({_first_line(e)})"
        result = _calibrate_under_plan(graph, device, persistent, why)
    result.seconds = time.perf_counter() - start
    return result


def _time_and_measure(graph, program, persistent, device, step_peak):
    """Runs `program`: each node's seconds (its first computation) and each
    distinct call's temporaries (set on the nodes); with step_peak, also the
    run's peak as the allocator measures it (else it may be None)."""
    # The runs draw random numbers: the generator is put back afterwards.
    with torch.no_grad(), _rng_kept(device):
        seconds = _timed_twice(graph, program, persistent)
        peak = _measure_on_cpu(graph, program, persistent) if device.type == "cpu" else None
        if peak is None:
            _measure_temporaries(graph, program, persistent, device)
            if step_peak:
                fresh = _fresh(persistent, graph)  # (outside the peak: see _fresh)
                with AllocatorPeak(device, collect=False) as meter:
                    run = program.run(fresh)
                    del run
                del fresh
                peak = meter.peak_bytes
    _share_within_calls(graph)
    return seconds, peak


# Note [Timed twice]. A kernel's first call in a process pays for what it
# sets up once (oneDNN makes a primitive for each convolution shape, caches
# and pages are cold): one timing run made a process's first capture's
# costs up to a quarter dearer than its second's, unevenly, and the plans
# of the same step at the same budget differed from run to run (a rotor
# plan's overhead 3% in one process, 55% in another). Each node's cost is
# the faster of two runs' times: the second finds what the first set up.


def _timed_twice(graph, program, persistent):
    """Each node's seconds, the least of two timing runs (Note [Timed twice])."""
    seconds = None
    for _ in range(2):
        timed = program.run(_fresh(persistent, graph), timing=True)
        these = dict(timed.node_seconds)
        del timed
        seconds = these if seconds is None else {
            i: min(t, these.get(i, t)) for i, t in seconds.items()}
    return seconds


def _share_within_calls(graph):
    """A call of several outputs run whole holds the same temporaries
    whichever output it runs for, but a run measures only the output that
    ran it (its siblings are kept from it, not called): each output of such
    a call (Node.group) takes the largest measured among them. Another plan
    may run the call for another output first (a batch norm for its
    statistics: 1.5 KB above mobilenet_v2's prediction, sharded under dtr,
    the running statistics' update temporaries unmeasured). A batch norm
    run again holds what its first run holds (Note [Running statistics
    once] in _executor.py)."""
    largest = {}
    for node in graph.nodes:
        if node.group is not None:
            largest[node.group] = max(largest.get(node.group, 0), node.temporary_bytes)
    for node in graph.nodes:
        if node.group is not None:
            node.temporary_bytes = largest[node.group]


# Note [Calibrating under a plan]: a step that does not fit unplanned is
# the case pebble is for, and there the kernels' temporaries matter most: a
# plan without them predicts less than the allocator then holds (on an H200,
# a GPT's 11.44 GiB plan held 11.52 GiB, and plans at a 3% margin ran out of
# memory). So the step runs once under the least-peak plan of a recomputing
# policy, planned from estimated costs without temporaries, and each
# distinct call is timed and measured there as in the unplanned run
# (recomputed calls at their first run).
_FALLBACK_POLICY = "dtr"


def _calibrate_under_plan(graph, device, persistent, why):
    """Calibration from a run of a plan that fits, where the unplanned step
    does not; estimated where that plan's run does not fit either."""
    from .. import _core  # the planner

    _release(graph, device)
    guess = estimated(graph, why)
    document = graph.document(guess.costs, "calibration", order_tokens=False)
    plan = _core.plan(_core.from_json(json.dumps(document)), policy=_FALLBACK_POLICY,
                      budget="min")
    return calibrated_by_run(
        graph, Program(graph, plan.schedule, device), persistent, device, guess,
        source=(f"measured under {_FALLBACK_POLICY}'s least-peak plan ({why}); percentages of "
                "pebble's prediction of the unplanned step"),
        why_not=lambda error: f"{why}; nor does {_FALLBACK_POLICY}'s least-peak plan ({error})")


def calibrated_by_run(graph, program, persistent, device, guess, source, why_not):
    """The Calibration of one run of `program` (a plan, not the unplanned
    step): each node's seconds and each distinct call's temporaries
    measured, the costs of nodes it does not run `guess`'s, and `source`
    saying how. Where that run does not fit the device, costs estimated;
    why_not(the error's first line) says why."""
    return calibrated_by_runs(graph, [(lambda: program, source, why_not)], persistent, device,
                              guess, lambda whys: "; ".join(whys))


def calibrated_by_runs(graph, attempts, persistent, device, guess, estimate_why):
    """calibrated_by_run's Calibration of the first of `attempts` whose run
    fits the device: (make() -> its Program, source, why_not) each, in
    turn. Where none fits, costs estimated; estimate_why(each why_not(the
    error's first line)) says why."""
    whys = []
    for make, source, why_not in attempts:
        try:
            seconds, _ = _time_and_measure(graph, make(), persistent, device, step_peak=False)
        except (RuntimeError, MemoryError) as e:
            if not _out_of_memory(e):
                raise
            _release(graph, device)
            whys.append(why_not(_first_line(e)))
            continue
        result = Calibration()
        result.costs = {n.index: seconds.get(n.index, guess.costs[n.index]) for n in graph.nodes}
        result.source = source
        return result
    return estimated(graph, estimate_why(whys))


def _release(graph, device):
    """Forgets temporaries measured by a run that failed, and hands the
    allocator's cached blocks back."""
    for node in graph.nodes:
        node.temporary_bytes = 0
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def estimated(graph, why):
    """A Calibration without running anything: costs from the operands'
    sizes, no temporaries, no measured peak; `why` goes into its source."""
    result = Calibration()
    result.costs = {n.index: estimated_seconds(n) for n in graph.nodes}
    result.source = f"estimated: {why}"
    return result


def _fresh(persistent, graph):
    """The persistent tensors for a calibration run: what a step writes in
    place (batch norm's running statistics, a .grad gradients are added
    into) are copies. Made before a run's peak is measured: the copies stand
    for persistent tensors, which the step does not allocate (made inside,
    the unplanned step's measured peak, a percentage budget's reference,
    counted a second copy of every .grad: three to eleven times eager's
    accumulating backward, until 2026-12-04)."""
    written = set()
    for node in graph.nodes:
        if node.updates_stats:
            for u in node.inputs:
                # (statistics through a view of a buffer, F.batch_norm(x, rm[:6], ...),
                # wrote the buffer itself at calibration until 2026-12-05)
                u = graph.storage_root(u)
                if u.kind == "persistent":
                    written.add(u.index)
    # An accumulate node adds into its parameter's .grad in place.
    written.update(grad.index for _, grad, _ in graph.accumulators)
    return {i: (t.clone() if i in written else t) for i, t in persistent.items()}


def _measure_temporaries(graph, program, persistent, device):
    """Node.temporary_bytes of every computed node: the allocator's peak
    during its call less its outputs, once per distinct call."""
    seen = {}

    def on_call(node, run_call):
        if node.alias_of is not None:
            # A view allocates nothing (pebble gives an alias no workspace);
            # counting tensors under a user's profiler may see it make one.
            return run_call()
        key = _signature(node, graph.values)
        if key in seen:
            node.temporary_bytes = seen[key]
            return run_call()
        with AllocatorPeak(device, collect=False) as meter:
            value = run_call()
        _storage_held(node, value, graph)
        made = node.nbytes + node.other_outputs_bytes if node.kind == "op" else 0
        node.temporary_bytes = max(0, meter.peak_bytes - made)
        seen[key] = node.temporary_bytes
        return value

    program.call_hook = on_call
    try:
        run = program.run(_fresh(persistent, graph))
        del run
    finally:
        program.call_hook = None


def _storage_held(node, value, graph):
    """Where the kernel's output holds a larger storage than its elements (the
    CPU's binary_cross_entropy computes each element's loss into its output,
    then resizes it to the mean's 0-dim tensor: 4 bytes that keep the whole
    4 KiB storage), node.nbytes becomes that storage's, rounded as the
    capture rounds: the plan holds what the kernel holds. The capture's
    fake tensors cannot know it. (Calls of one output only, several outputs
    may share a storage; but of a call of several, the outputs whose shape
    is the kernel's take what they hold.)"""
    if isinstance(value, (tuple, list)) and node.fx is not None:
        # The bookkeeping outputs that the kernel shapes (_graph's
        # _KERNEL_SHAPED), of whichever output ran the call: what they hold,
        # whatever the capture said.
        for sibling in graph.kernel_shaped.get(node.fx, ()):
            out = value[sibling.out_index]
            if isinstance(out, torch.Tensor) and (graph.device is None or
                                                  out.device.type == graph.device.type):
                sibling.nbytes = round_up(storage_bytes(out), graph.round_to)
                # (its shape, dtype and strides as the kernel makes them: a
                # host copy of it is made from these)
                sibling.value = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype,
                                                    device="meta")
        return
    if node.kind != "op" or node.alias_of is not None or node.out_index is not None or \
            not isinstance(value, torch.Tensor):
        return
    out = value
    if graph.device is not None and out.device.type != graph.device.type:
        return
    held = round_up(storage_bytes(out), graph.round_to)
    if held > node.nbytes:
        node.nbytes = held


# Note [One profiled run on the CPU]: a profiler started and stopped around
# each distinct call costs more than the step itself (densenet121: 1.5 s
# against 0.4 s), so on the CPU one profiler watches a whole run: its
# allocator events give the step's peak, and each distinct call lies between
# two marker allocations (a block of a size of its own, freed at once),
# which split the events into the calls' windows. Only where the profiler is
# already running (the user's) or the markers are not found are the two
# measurements made apart, as on a GPU.
_MARKER_BYTES = 1_000_003  # the first marker's size; each next one 1 byte more


def _measure_on_cpu(graph, program, persistent):
    """Node.temporary_bytes of every computed node and the unplanned step's
    peak (as AllocatorPeak measures a run), from one profiled run; None
    where it cannot (Note [One profiled run on the CPU])."""
    if torch.autograd._profiler_enabled():
        return None
    seen = {}      # call signature -> its window
    windows = []   # (node, signature) of each window, in order
    called = []    # (node, signature) of every call run

    def mark(k):
        marker = torch.empty(_MARKER_BYTES + k, dtype=torch.uint8)
        del marker

    def on_call(node, run_call):
        key = _signature(node, graph.values)
        called.append((node, key))
        if key in seen:
            value = run_call()
            _storage_held(node, value, graph)
            return value
        seen[key] = len(windows)
        windows.append((node, key))
        mark(2 * seen[key])
        value = run_call()
        mark(2 * seen[key] + 1)
        _storage_held(node, value, graph)
        return value

    program.call_hook = on_call
    fresh = _fresh(persistent, graph)  # (outside the peak: see _fresh)
    try:
        # (garbage made before must not be freed inside: Note [The
        # collector paused] in _memory.py)
        with collector_paused(), CpuMemoryEvents() as events:
            run = program.run(fresh)
            del run
    finally:
        program.call_hook = None
    found = _window_peaks(events.deltas, 2 * len(windows))
    if found is None:
        return None
    peak, window_peaks = found
    by_key = {}
    for (node, key), window_peak in zip(windows, window_peaks):
        made = node.nbytes + node.other_outputs_bytes if node.kind == "op" else 0
        by_key[key] = max(0, window_peak - made)
    for node, key in called:
        node.temporary_bytes = by_key[key]
    return peak


def _window_peaks(deltas, markers):
    """(the largest running sum of the CPU allocator's events `deltas`,
    leaving out the markers; for each window between markers 2k and 2k+1,
    the largest sum within it above its level at the start), or None where a
    marker is missing."""
    level = peak = 0
    k = 0              # the next marker expected
    start = None       # the open window's level at its start
    window_peaks = []
    i = 0
    while i < len(deltas):
        nbytes = deltas[i]
        if k < markers and nbytes == _MARKER_BYTES + k and i + 1 < len(deltas) and \
                deltas[i + 1] == -nbytes:
            if k % 2 == 0:
                start, window_peak = level, 0
            else:
                window_peaks.append(window_peak)
            k += 1
            i += 2
            continue
        level += nbytes
        peak = max(peak, level)
        if k % 2 == 1:
            window_peak = max(window_peak, level - start)
        i += 1
    return (peak, window_peaks) if k == markers else None


def _signature(node, values):
    """What decides a call's temporaries: the operator, its arguments' shapes,
    strides and dtypes, its other arguments, the output kept and its mask."""
    def describe(a):
        if isinstance(a, torch.fx.Node):
            v = values.get(a)
            if isinstance(v, torch.Tensor):
                return (tuple(v.shape), tuple(v.stride()), str(v.dtype))
            return ("node", a.name)
        if isinstance(a, (list, tuple)):
            return tuple(describe(b) for b in a)
        return repr(a)
    call = node.fx
    return (str(call.target), describe(call.args), describe(tuple(sorted(call.kwargs.items()))),
            node.out_index, tuple(node.mask) if node.mask else None,
            tuple(str(f.target) for f in node.fold))


def _out_of_memory(e):
    text = str(e).lower()
    return isinstance(e, MemoryError) or "out of memory" in text or "can't allocate" in text \
        or "not enough memory" in text


# Throughputs of the estimate: a device that multiplies at 10 TFLOP/s and
# moves 100 GB/s (pebble's default cost model), per second.
_FLOPS_PER_S = 10e12
_BYTES_PER_S = 100e9


def estimated_seconds(node):
    """A node's cost without a timing: FLOPs of products and convolutions at
    10 TFLOP/s, else the bytes it writes at 100 GB/s (views: none)."""
    if node.kind != "op":
        return 0.0
    name = str(node.fx.target)
    out = node.value
    flops = 0.0
    if any(k in name for k in ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear")):
        ins = [u.value for u in node.inputs if u.value is not None and u.value.dim() >= 2]
        if ins:
            k = ins[0].shape[-1]
            flops = 2.0 * out.numel() * k
    elif "convolution" in name:
        # The weight: the smallest operand of rank 3 or more.
        operands = [u.value for u in node.inputs if u.value is not None and u.value.dim() > 2]
        if operands:
            weight = min(operands, key=lambda v: v.numel())
            flops = 2.0 * max(out.numel(), max(v.numel() for v in operands)) * \
                math.prod(weight.shape[1:])
    return max(flops / _FLOPS_PER_S, node.nbytes / _BYTES_PER_S)
