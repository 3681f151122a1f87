"""Memory as PyTorch's allocator sees it, on the CPU as on a GPU.

`AllocatorPeak` measures the most memory the allocator held during a block
of code, above what it held when the block began: on a GPU
torch.cuda.max_memory_allocated after reset_peak_memory_stats; on the CPU the
profiler's memory events (every allocation and free the CPU allocator makes,
kernel temporaries included), summed in order. This is the judge of memory:
a figure pebble computes for itself (the plan's prediction, or its count of
the tensors it holds) is reported beside it, never instead of it.

`TensorMemory` counts the storages PyTorch's operators return (a dispatch
mode), each once, until its last tensor is gone: the tensors alone, without
kernel temporaries. It is the fallback where the profiler gives no memory
events.
"""

import contextlib
import gc
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ._compat import storage_bytes, storage_key


# The bytes of the two allocations that mark a point in the CPU profiler's
# memory events (AllocatorPeak.mark): uint8 tensors of two prime sizes,
# allocated and freed at once, in that order (+1237, +1249, -1249, -1237:
# a pattern no kernel's temporaries make by chance).
MARK_BYTES = (1237, 1249)


class AllocatorPeak:
    """with AllocatorPeak(device) as m: ...; then m.peak_bytes (bytes above the
    level at entry; never negative) and m.source ("cuda allocator",
    "profiler", or "tensors" where the profiler recorded no memory events).
    With marks=True, m.mark() inside the block records the allocator's level
    there: m.levels, bytes above the level at entry, one per mark."""

    def __init__(self, device, collect=True, marks=False):
        """collect: run the garbage collector first, for code that may make
        cyclic garbage (eager code: measure()). False: the collector is
        paused inside the block instead, for pebble's own runs, which make
        none (Note [The collector paused])."""
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device {str(self.device)!r}: pebble.torch measures the memory of "
                             "the CPU and CUDA devices")
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {str(self.device)!r}: this PyTorch sees no CUDA device")
        if marks and self.device.type == "cpu" and torch.autograd._profiler_enabled():
            raise ValueError("the allocator's level at each step is read from the CPU "
                             "profiler's memory events, and another profiler is running "
                             "(one runs at a time): call it outside the profiler's block")
        self.collect = collect
        self.marks = marks
        self.levels = [] if marks else None
        self.peak_bytes = None
        self.source = None
        self._profiler = None
        self._tensors = None

    def mark(self):
        """Records the allocator's level now (marks=True). On the CPU two
        allocations of MARK_BYTES, made and freed here, mark the point in
        the profiler's events; _read takes the level there and leaves the
        mark out of the peak."""
        if self.device.type == "cuda":  # (the allocator counts as work is queued)
            self.levels.append(torch.cuda.memory_allocated(self.device) - self._start)
        else:
            first = torch.empty(MARK_BYTES[0], dtype=torch.uint8)
            second = torch.empty(MARK_BYTES[1], dtype=torch.uint8)
            del second, first

    def __enter__(self):
        # Garbage made before the block must not be freed inside it: on the
        # CPU a free of a block allocated in an earlier profiled block would
        # lower the running sum below the level at entry.
        if self.collect:
            gc.collect()
        else:
            self._paused = collector_paused()
            self._paused.__enter__()
        try:
            self._start_counting()
        except BaseException:
            if not self.collect:
                self._paused.__exit__(None, None, None)
            raise
        return self

    def _start_counting(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif torch.autograd._profiler_enabled():
            # One profiler at a time: inside another's block, count tensors.
            self._tensors = TensorMemory()
            self._tensors.__enter__()
        else:
            self._profiler = CpuMemoryEvents()
            self._profiler.__enter__()

    def __exit__(self, *exc):
        try:
            self._read(exc)
        finally:
            if not self.collect:
                self._paused.__exit__(*exc)
        return False

    def _read(self, exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = max(0, torch.cuda.max_memory_allocated(self.device) - self._start)
            self.source = "cuda allocator"
            return
        if self._tensors is not None:
            self._tensors.__exit__(*exc)
            self.peak_bytes = self._tensors.peak_bytes
            self.source = "tensors (inside another profiler)"
            return
        self._profiler.__exit__(*exc)
        if exc[0] is None:
            self.peak_bytes = self._peak_of(self._profiler.deltas)
            self.source = "profiler"

    def _peak_of(self, deltas):
        """The largest running sum of `deltas`; with marks, each mark's four
        events (mark()) left out, and the level there appended to
        self.levels."""
        a, b = MARK_BYTES
        pattern = [a, b, -b, -a]
        level = peak = 0
        i = 0
        while i < len(deltas):
            if self.marks and deltas[i] == a and deltas[i:i + 4] == pattern:
                self.levels.append(level)
                i += 4
                continue
            level += deltas[i]
            peak = max(peak, level)
            i += 1
        return peak


# Note [The collector paused]: a measured block must not free garbage made
# before it (above), and a full collection first (gc.collect) costs 0.1 s in
# a process that has just imported torch and grows with what the process
# holds: 0.4 s a call in a test process, more than the small steps it
# measured, at every capture and, on a GPU, where every step is measured, at
# every step. pebble's own runs (a calibration's, a step's program) make no
# cyclic garbage: the collector is paused inside them instead, and what was
# garbage before is collected after, at the collector's leisure. Eager code
# (measure()) may make cyclic garbage that eager PyTorch would collect as it
# runs: there the collector runs first and stays on.


@contextlib.contextmanager
def collector_paused():
    """The cyclic garbage collector held off inside the block (as it was
    after it): Note [The collector paused]."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def allocated_where_profiled(tensors):
    """Copies of `tensors` allocated while the CPU profiler records. PyTorch's
    CPU allocator reports the free of a block only where the profiler saw
    its allocation ("Memory block of unknown size was allocated before the
    profiling started"): a step that frees a tensor made before any
    profiling (a parameter the plan frees while its update runs on the
    host) would measure its later fetch as new memory without the free.
    Inside another profiler (one runs at a time), where AllocatorPeak counts
    tensors instead, plain copies."""
    if torch.autograd._profiler_enabled():
        return [t.clone() for t in tensors]
    with CpuMemoryEvents():
        return [t.clone() for t in tensors]


class CpuMemoryEvents:
    """with CpuMemoryEvents() as m: ...; then m.deltas: the bytes of each
    allocation (positive) and free (negative) the CPU allocator made in the
    block, in order, as PyTorch's profiler records them.

    The profiler is stopped without building its table of function events,
    which takes most of its cost (densenet121's step: 0.25 s profiled so,
    0.6 s through torch.profiler.profile); where this PyTorch lacks the
    calls for that, through torch.profiler.profile."""

    def __init__(self):
        self.deltas = None
        self._light = None
        self._profile = None

    def __enter__(self):
        from torch.autograd import profiler as autograd_profiler
        self._light = hasattr(autograd_profiler.profile, "_start_trace") and \
            hasattr(torch.autograd, "_disable_profiler")
        if self._light:
            self._profile = autograd_profiler.profile(profile_memory=True, use_kineto=True)
            self._profile._prepare_trace()
            self._profile._start_trace()
        else:
            from torch.profiler import ProfilerActivity, profile
            self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._profile.__enter__()
        return self

    def __exit__(self, *exc):
        if self._light:
            results = torch.autograd._disable_profiler()
        else:
            self._profile.__exit__(*exc)
            results = self._profile.profiler.kineto_results
        events = []
        for e in results.events():
            if e.name() == "[memory]" and str(e.device_type()).endswith("CPU"):
                events.append((e.start_us(), len(events), e.nbytes()))
        events.sort()
        self.deltas = [nbytes for _, _, nbytes in events]
        return False


class TensorMemory(TorchDispatchMode):
    """with TensorMemory() as m: ...; m.peak_bytes: the largest sum of the
    bytes of live storages that operators created inside the block."""

    def __init__(self, existing=()):
        """`existing`: tensors made before (parameters, the batch); views of
        them and in-place results on them add no bytes."""
        super().__init__()
        self._storages = {}  # storage key -> [tensors referring to it, bytes]
        self._existing = {storage_key(t) for t in existing if isinstance(t, torch.Tensor)}
        self.live_bytes = 0
        self.peak_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._hold(t)
        return out

    def _hold(self, t):
        key = storage_key(t)
        if key in self._existing:
            return
        entry = self._storages.get(key)
        if entry is None:
            entry = self._storages[key] = [0, storage_bytes(t)]
            self.live_bytes += entry[1]
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        entry[0] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key):
        entry = self._storages.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live_bytes -= entry[1]
            del self._storages[key]


def is_dense(t):
    """Whether `t`'s elements fill one run of memory without gaps or
    overlaps, in some order of its dimensions (contiguous, or a transpose
    of a contiguous tensor: a .grad that autograd left transposed)."""
    expected = 1
    for stride, size in sorted((t.stride(d), t.size(d)) for d in range(t.dim())
                               if t.size(d) != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def round_up(nbytes, granularity):
    """`nbytes` rounded up to a multiple of `granularity` (the allocator's
    block: 512 bytes on a GPU, 1 on the CPU)."""
    return -(-nbytes // granularity) * granularity


def tensor_bytes(tensors):
    """The bytes of distinct storages among `tensors` (parameters, a batch)."""
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            seen[storage_key(t)] = storage_bytes(t)
    return sum(seen.values())


def measure(fn, device=None):
    """Runs fn(); returns (its result, step peak bytes, seconds).

    The step peak is what the allocator held at most during the call above
    what it held when the call began (AllocatorPeak): the figure a pebble
    plan's `measured_peak_bytes` reports, so eager code, checkpointing and a
    plan compare on equal terms. `device`: where fn allocates (default: the
    CPU)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    with AllocatorPeak(device) as meter:
        start = time.perf_counter()
        result = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    return result, meter.peak_bytes, seconds
