"""Data parallelism under a plan: train_step(..., process_group=pg).

Each rank runs the same plan (SPMD) on its own slice of the batch. Note
[One plan on every rank]: the plan must be the same on every rank, since
the ranks' collectives pair up by their order. Each rank captures and
calibrates its own step, but takes rank 0's measurements (costs, kernel
temporaries, the unplanned step's peak, the host's update rate), so that
every rank has the same graph; the ranks compare their graphs (a digest of
pebble's graph document) and refuse to run where one differs. Rank 0 alone
plans, and its plan is every rank's: a policy whose search stops at its
time limit (hybrid, checkmate's) would otherwise find different plans on
ranks that ran at different speeds.

Each rank also checks, at every call, that the others make the same call
(the same shapes, gradients held and training mode), and the ranks agree on
failures before any collective that follows them: an error on one rank
(a trace, a plan that does not fit) is raised on every rank, not left for
the others to wait on. A run that fails on one rank mid-step fails on every
rank, and the ranks bring their collectives back in step (Note [A rank that
fails mid-step]); the TrainStep is unusable after it.

Note [Gradients averaged as they complete]: DistributedDataParallel's rule.
Once the plan has completed a parameter's gradient and no later step of the
backward reads it, the gradient is divided by the number of ranks and an
asynchronous all-reduce sums it over the ranks, in place; any later step
that reads, moves or frees that gradient's storage first waits for it. So
each rank's gradient is the mean of the ranks' gradients: with equal slices
and a mean loss, the gradient of the whole batch. The all-reduce runs while
the plan goes on with the backward. The plan may group the all-reduces of
consecutive gradients into a bucket (docs/semantics.md, "Buckets"), sent
as one message, as DDP sends its buckets: Note [A bucket through a flat
copy]. The plan places the all-reduces and buckets (its all_reduce steps,
scheduler/collectives.h) and times them on the link
measure_link measured. gloo's worker thread lets go of a reduced
tensor a moment after wait() returns; where that is the last reference (a
gradient the plan frees), the free happens in that thread, which PyTorch's
CPU profiler does not watch: the CPU measurement of such a step can exceed
the plan although the memory is freed (docs/torch.md).
"""

import datetime
import hashlib
import json
import math
import time
import weakref

import torch

from ._collective_ops import divisor, hold_divisors
from ._compat import free_storage
from ._executor import PlanExecutionError


# Note [A bucket through a flat copy]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# One collective of torch.distributed sends one tensor (gloo's coalesced
# all-reduce flattens its tensors too, in its worker thread). So a bucket of
# several gradients is copied into one flat tensor per dtype, divided, and
# all-reduced asynchronously; settling it (before a later step reads, moves
# or frees one of its gradients, or at the step's end) waits, copies the
# sums back and frees the copy. The plan holds that copy from the bucket's
# step to its settling (pebble.plan's bucket_copies="device";
# docs/semantics.md, "Buckets through a device copy"): each gradient takes
# its planned bytes in it, rounded up to the allocator's block as the plan
# rounds them (bucket_alignment), so one allocation per copy, and the
# allocator's peak is the plan's. A gradient that is a view that is not
# contiguous is reduced through its whole storage, of the same elements.
# The copy is freed through its storage, on this thread: gloo's worker
# thread lets go of the tensor a moment after wait() returns, and a free
# there would escape PyTorch's CPU profiler (and the measured peak).


class _Bucket:
    """A bucket in flight: per dtype (flat copy, its work, [(gradient, its
    part of the copy)]), the storage roots it holds sums for and its
    copies' planned bytes."""

    def __init__(self, roots, nbytes):
        self.roots = list(dict.fromkeys(roots))  # two views of one storage: once
        self.nbytes = nbytes
        self.parts = []
        self.settled = False

    def all_works(self):
        return [work for _, work, _ in self.parts]


def _works_of(item):
    """The collectives of one item in flight: a bucket's, or the work itself."""
    return item.all_works() if isinstance(item, _Bucket) else [item]


class GradientAverage:
    """The all-reduce of each gradient of a run over the ranks, started and
    waited for through `collectives` (a StepCollectives; Note [Gradients
    averaged as they complete])."""

    def __init__(self, collectives, dtypes):
        """dtypes: those of the gradients, whose divisors are held from here."""
        self.collectives = collectives
        self.ranks = collectives.ranks
        # Note [Scalars without allocations] (_optimizer.py): a held 0-dim
        # tensor of the gradient's dtype, not a Python number, divides (one
        # of another dtype is cast at each division: 8 bytes above the plan
        # for a float64 gradient).
        hold_divisors(self.ranks, dtypes)
        # storage root index -> [work or _Bucket in flight on that storage]
        self.pending = {}

    def start(self, members):
        """Averages the gradients `members`, [(storage root index, tensor,
        planned bytes, rounded as the plan rounds a place in a copy)], over
        the ranks, asynchronously: each divided first, as DDP divides (no
        overflow of a half-precision sum), then summed.
        One member is reduced in place; several are a bucket (Note [A bucket
        through a flat copy]). A tensor is a gradient, or the whole storage
        it is a view of. Returns the bytes of the copy (0 for one member)."""
        if any(not t.is_contiguous() for _, t, _ in members):
            raise PlanExecutionError("internal: a gradient to all-reduce is not contiguous")
        if len(members) == 1:
            root_index, tensor, _ = members[0]
            self.pending.setdefault(root_index, []).append(self._all_reduce(tensor))
            return 0
        bucket = _Bucket([root_index for root_index, _, _ in members],
                         sum(nbytes for _, _, nbytes in members))
        by_dtype = {}
        for _, tensor, nbytes in members:
            by_dtype.setdefault(tensor.dtype, []).append((tensor, nbytes // tensor.element_size()))
        for dtype, gradients in by_dtype.items():
            flat = torch.empty(sum(slot for _, slot in gradients), dtype=dtype,
                               device=gradients[0][0].device)
            copied, offset = [], 0
            for tensor, slot in gradients:
                if tensor.numel() > slot:
                    raise PlanExecutionError("internal: a gradient is larger than its place in "
                                             "its bucket's copy")
                part = flat[offset:offset + tensor.numel()]
                part.copy_(tensor.view(-1))
                copied.append((tensor, part))
                offset += slot
            bucket.parts.append((flat, self._all_reduce(flat), copied))
        for root_index in bucket.roots:
            self.pending.setdefault(root_index, []).append(bucket)
        return bucket.nbytes

    def _all_reduce(self, tensor):
        tensor.div_(divisor(self.ranks, tensor.dtype))
        return self.collectives.all_reduce(tensor, "the all-reduce of a gradient")

    def settle(self, root_index):
        """Waits for the all-reduce of the storage `root_index`, if one is in
        flight; a bucket's sums are copied back and its copy freed. Returns
        the bytes freed so (start's figure)."""
        freed = 0
        for item in self.pending.pop(root_index, ()):
            for work in _works_of(item):
                self.collectives.wait(work, "the all-reduce of a gradient")
            if isinstance(item, _Bucket):
                freed += self._unpack(item)
        return freed

    def _unpack(self, bucket):
        if bucket.settled:
            return 0
        bucket.settled = True
        freed = bucket.nbytes
        for flat, _, copied in bucket.parts:
            for tensor, part in copied:
                tensor.view(-1).copy_(part)
            free_storage(flat)
        bucket.parts = []
        for root_index in bucket.roots:
            left = [item for item in self.pending.get(root_index, ()) if item is not bucket]
            if left:
                self.pending[root_index] = left
            else:
                self.pending.pop(root_index, None)
        return freed

    def settle_all(self):
        return sum(self.settle(root_index) for root_index in list(self.pending))

    def abandon(self, grace_s=5.0):
        """After a failed run: waits up to `grace_s` seconds in all for the
        all-reduces still in flight, ignoring their failures (Note [Draining
        the collectives of a failed run])."""
        items = {id(item): item for items in self.pending.values() for item in items}
        works = [work for item in items.values() for work in _works_of(item)]
        self.pending.clear()
        drain(works, grace_s)


def drain(works, grace_s=5.0):
    """After a failed run: waits up to `grace_s` seconds in all for the
    collectives `works` still in flight, ignoring their failures (Note
    [Draining the collectives of a failed run])."""
    deadline = time.monotonic() + grace_s
    for work in works:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            work.wait(wait_limit(left))
        except RuntimeError:
            pass  # failed or still running: the run has failed already


def wait_limit(seconds):
    """`seconds` (> 0) as a Work.wait() timeout: whole milliseconds, at least
    one. c10d takes a timeout of 0 ms for none (kNoTimeout), so a wait for
    less than a millisecond, rounded down, would wait until the process
    group's own timeout (seen: a failed run's drain, 120 s, under load)."""
    return datetime.timedelta(milliseconds=max(1, math.ceil(seconds * 1000)))


# Note [Draining the collectives of a failed run]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A run that fails (a rank stopped: its first all-reduce to wait fails) may
# leave later all-reduces queued in PyTorch's gloo worker threads. Once such
# a collective is done, the worker lets go of its tensors; where that is the
# last reference and the interpreter is already exiting, freeing the tensor
# needs the GIL, the worker thread is stopped on the spot, and the process
# aborts ("terminate called without an active exception", seen with
# PyTorch 1.13's gloo). So the failed run waits for them: after a stopped
# rank, gloo fails each at once. It waits a few seconds at most, since after
# a timeout each one may take the group's whole timeout; a process that then
# exits at once may still abort.


def measure_link(group, device, small=1 << 10, large=1 << 21, repeats=5, attempts=3):
    """The ranks' link as pebble's simulator times an all-reduce (the ring's
    2 (r - 1) latency + 2 (r - 1) / r bytes / bandwidth; AllReduceSeconds in
    scheduler/simulator.h): this rank's least time of `repeats`
    all-reduces of `small` and of `large` float32 elements on `device`,
    each started together (a barrier first), solved for (bandwidth bytes/s,
    latency s). The latency is 0 where the small one takes no longer per
    byte than the large one allows. Where the large all-reduce is not
    clearly slower than the small one on rank 0 (another process took the
    cores meanwhile), the ranks measure again, up to `attempts` times in
    all. None for one rank, or a link too fast to time here (pebble.plan's
    default link then)."""
    import torch.distributed as dist
    ranks = dist.get_world_size(group)
    if ranks < 2:
        return None

    def seconds(numel):
        t = torch.ones(numel, dtype=torch.float32, device=device)
        times = []
        for run in range(repeats + 1):  # run 0 warms up (connections, buffers)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            _collective("measuring the ranks' link", dist.barrier, group=group)
            start = time.perf_counter()
            _collective("measuring the ranks' link", dist.all_reduce, t, group=group)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if run > 0:
                times.append(time.perf_counter() - start)
        return min(times)  # noise (other processes on these cores) only adds

    for _ in range(attempts):
        t_small, t_large = seconds(small), seconds(large)
        # Rank 0's verdict on every rank: they measure again together, or stop.
        if same_on_every_rank(t_large > 1.5 * t_small, group):
            break
    if not t_large > 1.5 * t_small:  # the large one lost in the noise: no fit
        return None
    per_byte = 2 * (ranks - 1) / ranks  # of the tensor's bytes, sent by each rank
    slope = (t_large - t_small) / (4 * (large - small))  # seconds per byte of tensor
    bandwidth = per_byte / slope
    latency = max(0.0, (t_small - per_byte * 4 * small / bandwidth) / (2 * (ranks - 1)))
    return bandwidth, latency


class CollectiveFailed(PlanExecutionError):
    """A collective of torch.distributed failed: a rank stopped, or the
    process group timed out."""


def _failed(e, what="the all-reduce of a gradient"):
    lines = str(e).strip().splitlines()
    first = lines[0] if lines else repr(e)
    if "Invalid scalar type" in first:  # (refused where it is called: on every rank alike)
        return CollectiveFailed(f"{what} failed: the process group's backend cannot carry a "
                                "dtype of the step's tensors (PyTorch 1.13's gloo has no "
                                "bfloat16 collectives: train in float32 or float16 there, or "
                                f"on NCCL): {first}")
    return CollectiveFailed(f"{what} failed (a rank stopped, or the process group timed "
                            f"out): {first}")


def _collective(what, call, *args, **kwargs):
    """call(*args, **kwargs), a torch.distributed collective; its failure as a
    PlanExecutionError naming `what`."""
    try:
        return call(*args, **kwargs)
    except RuntimeError as e:
        raise _failed(e, what) from e


# Note [A rank that fails mid-step]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The collectives of a run pair up by their order on every rank. Where one
# rank's run fails mid-step (a kernel, an update, memory) and its process
# lives on, the collectives it did not start never complete on the others:
# they would wait for the process group's timeout (30 minutes by default),
# and the group would stay out of step for good. So the ranks of a
# TrainStep share a board on the process group's store:
# - a rank whose run fails posts its error and the collectives it started
#   in the run (sizes and dtypes), then adds one to the board's count of
#   failures;
# - a rank waits for a collective in slices (WAIT_SLICE_S) and reads that
#   count between them: where it is not 0, this rank stops too and posts the
#   collectives it started;
# - once every rank has posted, each starts on zeros the collectives it had
#   not started, up to the longest list: every collective in flight on any
#   rank then completes, and the group is in step again;
# - every run ends with one more all-reduce, of a 0-dim tensor held for it:
#   0 where the run succeeded, 1 where a rank fills it in after a failure.
#   A rank that fails after its last collective, which the others would not
#   wait for, so fails their run too.
# Every rank then raises: a rank that failed its own error, the others a
# PlanExecutionError naming the first rank that failed and why. The process
# group stays usable; the TrainStep does not (its module may be updated on
# some ranks only), and refuses later calls on every rank together (the
# call's check carries the refusal). A failed collective (a rank that died,
# a group that timed out) and an interrupt post a "broken" failure, which
# no rank fills in: the group stays out of step, and each rank's TrainStep
# then refuses alone, with no collective that would pair wrongly; so do
# the group's other steps and train_step (_OUT_OF_STEP). Each run's keys
# are its own (its number: runs go in step on every rank), so a later run
# never reads a failed one's posts; and the board is read by add() and
# get(), never by a wait with a timeout: in PyTorch 1.13 a TCPStore wait
# that times out leaves that client unusable (its next get() failed with
# "Socket Timeout" here: the short timeout stays, and the reply comes
# late). Only a
# step on the CPU keeps the board: on a GPU (NCCL), a work's wait() orders
# the GPU's stream, not the host, so a rank would not read the board while
# a collective hangs; there a failed rank's peers still meet the group's
# timeout (NCCL's watchdog).

WAIT_SLICE_S = 0.1

# Each process group whose collectives a failed step left out of step ->
# why: train_step refuses them (a collective there would pair wrongly).
_OUT_OF_STEP = weakref.WeakKeyDictionary()


def out_of_step(group):
    """Why `group`'s collectives are out of step after a failed step of
    pebble.torch on this rank, or None."""
    return _OUT_OF_STEP.get(group)


class _PeerFailed(PlanExecutionError):
    """Another rank's run failed (the board counts a failure): this rank's
    run stops, and StepCollectives.fail() names that rank."""


class StepCollectives:
    """The collectives of one TrainStep's runs on `group` (all-reduces, each
    async), and the board of failures beside them (Note [A rank that fails
    mid-step]). `name`: the same on every rank, another for each TrainStep;
    `label`: its name in errors, as rank 0 counts its steps ("train_step
    #2", the second made on rank 0). Outside a run (between begin() and
    end() or fail()), and on a GPU, collectives are started and waited for
    as they are."""

    def __init__(self, group, device, name, label):
        import torch.distributed as dist
        self.dist, self.group, self.device = dist, group, device
        self.rank, self.ranks = dist.get_rank(group), dist.get_world_size(group)
        self.store = dist.distributed_c10d._get_default_store()
        self.name, self.label = name, label
        self.derived = 0
        # Each run's keys are its own (runs go in step on every rank): a
        # failed run's posts are never read by a later one.
        self.runs = 0
        self.key = None
        self.polled = False  # this run read its failure flag (which creates it)
        self.board = device.type == "cpu"
        # Held, so that a run allocates nothing for it (the measured peak).
        self.closing = torch.zeros((), dtype=torch.int32) if self.board else None
        self.issued = None  # in a run: [(numel, dtype, closing?, op name)] started
        # In a run: the works not yet seen complete (by id), which a failed
        # run drains; a completed one is let go of, and the tensor it holds
        # with it (a gradient the plan frees is then released at its free).
        self.works = {}
        # Whether the ranks' collectives are known to be in step after the
        # last run (a failed run: only after a whole round of the board).
        self.in_step = True

    def derive(self):
        """The collectives of a TrainStep made from this one's (replan()):
        a board of its own, named alike on every rank."""
        self.derived += 1
        return StepCollectives(self.group, self.device, f"{self.name}.{self.derived}",
                               f"{self.label}'s replan() #{self.derived}")

    def together(self, work):
        """work()'s value, where it runs on every rank; a failure on any rank
        fails it on every rank (begin, end, fail)."""
        self.begin()
        try:
            value = work()
            self.end()
            return value
        except BaseException as e:
            error = self.fail(e)  # (where the program's run has not)
            if error is e:
                raise
            raise error from None

    def begin(self):
        self.in_step = False
        self.runs += 1
        self.key = f"pebble.torch/{self.name}/{self.runs}/"
        self.polled = False
        if self.board:
            self.issued, self.works = [], {}

    def all_reduce(self, tensor, what, closing=False, op="SUM"):
        """Starts the sum of `tensor` over the ranks (or `op`, the name of a
        dist.ReduceOp: "MAX"), in place: its work."""
        work = _collective(what, self.dist.all_reduce, tensor, group=self.group, async_op=True,
                           op=getattr(self.dist.ReduceOp, op))
        if self.issued is not None:  # (the op: a rank's fill pairs with it as it is)
            self.issued.append((tensor.numel(), tensor.dtype, closing, op))
            self.works[id(work)] = work
        return work

    def wait(self, work, what):
        """Waits for `work`; in a run, _PeerFailed where another rank failed
        meanwhile."""
        if self.issued is None:
            _collective(what, work.wait)
            return
        slice_ = wait_limit(WAIT_SLICE_S)
        while True:
            try:
                work.wait(slice_)
            except RuntimeError:
                pass  # the slice ended ("Operation timed out!"), or the work failed
            if work.is_completed():
                _collective(what, work.wait)  # (its failure, if it failed)
                self.works.pop(id(work), None)
                return
            self._check_board()

    def drain(self, works, grace_s=5.0):
        """After a failed run: its own collectives `works`, drained (drain())."""
        drain(works, grace_s)

    def _check_board(self):
        # (add, not a wait with a timeout: Note [A rank that fails mid-step])
        self.polled = True
        try:
            failures = self.store.add(self.key + "failures", 0)
        except RuntimeError as e:
            raise _failed(e, "reading the ranks' board of failures") from e
        if failures:
            raise _PeerFailed("another rank failed")

    def end(self):
        """The run's closing all-reduce: _PeerFailed where a rank failed."""
        if self.issued is not None:
            self.closing.zero_()
            work = self.all_reduce(self.closing, "the step's closing all-reduce", closing=True)
            self.wait(work, "the step's closing all-reduce")
            if int(self.closing) != 0:
                raise _PeerFailed("another rank failed")
            if self.polled:  # (a run that failed nowhere: its flag, made by reading it)
                self.store.delete_key(self.key + "failures")
        self.issued, self.works, self.in_step = None, {}, True

    def fail(self, error):
        """After this rank's run failed with `error`: the board's round (Note
        [A rank that fails mid-step]). Returns the error to raise: `error`,
        or where other ranks failed, a PlanExecutionError naming them.
        in_step says whether the ranks' collectives are back in step."""
        issued, self.issued = self.issued, None
        if issued is None:
            return error  # not in a run (a round had already), or no board
        replacement = error
        try:
            replacement = self._round(error, issued)
        finally:
            self.works = {}
            if not self.in_step:
                _OUT_OF_STEP[self.group] = f"{type(replacement).__name__}: {replacement}"
        return replacement

    def _round(self, error, issued):
        own = not isinstance(error, _PeerFailed)
        # No round where the group is broken, or on an interrupt (no waiting
        # for the others): the group then stays out of step.
        broken = isinstance(error, CollectiveFailed) or not isinstance(error, Exception)
        try:
            self.store.set(self._post_key(self.rank), json.dumps(
                {"why": f"{type(error).__name__}: {error}" if own else None,
                 "issued": [(numel, str(dtype).split(".")[-1], closing, op)
                            for numel, dtype, closing, op in issued]}))
            self.store.add(self.key + f"posted/{self.rank}", 1)
            self.store.add(self.key + "posted", 1)
            if broken:
                self.store.add(self.key + "broken", 1)
            if own:
                self.store.add(self.key + "failures", 1)
            if broken:
                return error
            longest = self._longest_post()
            if longest is not None:
                self._fill(issued, longest)
                self.in_step = True
            if own:
                return error
            failed = self._failures()
        except RuntimeError as e:
            if own:
                return error
            return _failed(e, "bringing the ranks' collectives back in step after another "
                           "rank failed")
        if not failed:
            return PlanExecutionError("internal: the ranks' board counts a failure that no "
                                      "rank posted")
        after = ("the ranks' collectives are back in step" if self.in_step else
                 "a rank stopped waiting or a collective failed: the group's collectives stay "
                 "out of step")
        named = [self._rank_name(rank) for rank, _ in failed]
        whys = "; ".join(f"{name}: {why}" for name, (_, why) in zip(named, failed))
        return PlanExecutionError(f"{', '.join(named)} failed mid-step, so this rank stops "
                                  f"too ({after}). {whys}")

    def _rank_name(self, rank):
        """`rank` of the group, with its global rank where that differs."""
        global_rank = _global_rank(self.group, rank)
        return f"rank {rank}" + (f" (global rank {global_rank})" if global_rank != rank else "")

    def _post_key(self, rank):
        return self.key + f"issued/{rank}"

    def _longest_post(self):
        """The longest list of collectives that a rank posted, once every rank
        has; None once a rank posted a broken failure (no round then). Reads
        the board every WAIT_SLICE_S / 10 s, up to the store's timeout; a
        collective of this run that fails meanwhile (a rank stopped) ends
        the wait (CollectiveFailed)."""
        deadline = time.monotonic() + self.store.timeout.total_seconds()
        while not self.store.add(self.key + "broken", 0):
            if self.store.add(self.key + "posted", 0) == self.ranks:
                return max((json.loads(self.store.get(self._post_key(rank)))["issued"]
                            for rank in range(self.ranks)), key=len)
            if time.monotonic() > deadline:
                raise CollectiveFailed("waiting for the other ranks after a failed step timed "
                                       "out")
            for work in list(self.works.values()):
                if work.is_completed():
                    _collective("a collective of the failed step", work.wait)
            time.sleep(WAIT_SLICE_S / 10)
        return None

    def _failures(self):
        """[(rank, why)] of the ranks that posted a failure of their own."""
        failed = []
        for rank in range(self.ranks):
            if not self.store.add(self.key + f"posted/{rank}", 0):
                continue  # (a rank that broke the round may leave others unposted)
            why = json.loads(self.store.get(self._post_key(rank)))["why"]
            if why is not None:
                failed.append((rank, why))
        return failed

    def _fill(self, issued, longest):
        """Starts on zeros, one at a time, the collectives of `longest` past
        this rank's `issued`, and waits for each (a closing one holds 1)."""
        for numel, dtype, closing, op in longest[len(issued):]:
            t = torch.full((numel,), int(closing), dtype=getattr(torch, dtype),
                           device=self.device)
            self.dist.all_reduce(t, group=self.group, op=getattr(self.dist.ReduceOp, op))


def same_on_every_rank(value, group, what="rank 0's calibration"):
    """rank 0's `value` (any picklable object) on every rank of `group`."""
    import torch.distributed as dist
    box = [value]
    _collective(f"sharing {what}", dist.broadcast_object_list, box,
                src=_global_rank(group, 0), group=group)
    return box[0]


def is_rank_0(group):
    import torch.distributed as dist
    return dist.get_rank(group) == 0


class SharedPlan:
    """Rank 0's plan on another rank: the fields of pebble's Plan (what
    pebble.plan returns), as rank 0 has them."""
    FIELDS = ("feasible", "policy", "message", "budget_bytes", "baseline_peak_bytes",
              "plan_time_s", "report", "schedule", "details", "document")

    def __init__(self, fields):
        self.__dict__.update(fields)

    def __repr__(self):  # as pebble.Plan's
        fit = "fits" if self.feasible else "does not fit"
        return f"<pebble.Plan {self.policy}: {fit}, peak {self.report['peak_bytes']} bytes>"


def plan_of_rank_0(planned, group):
    """(plan, budget info) on every rank of `group`: rank 0's, which
    `planned` is there (Note [One plan on every rank]); rank 0 keeps its own
    objects."""
    plan, info = planned if planned is not None else (None, None)
    fields = None if plan is None else {f: getattr(plan, f) for f in SharedPlan.FIELDS}
    fields, info = same_on_every_rank((fields, info), group, "rank 0's plan")
    return (plan, info) if plan is not None else (SharedPlan(fields), info)


def _global_rank(group, rank):
    """The global rank of `group`'s rank `rank` (PyTorch 2.x and 1.13)."""
    import torch.distributed as dist
    if group is None or group is dist.group.WORLD:
        return rank
    if hasattr(dist, "get_global_rank"):
        return dist.get_global_rank(group, rank)
    return dist.distributed_c10d._get_global_rank(group, rank)


def agree(error, group):
    """Every rank of `group` learns whether any failed (`error`: this rank's
    exception, or None): each rank that failed raises its own error, the
    others a PlanError naming the first rank that failed and why. Call it
    where each rank may fail alone, before the next collective."""
    import torch.distributed as dist
    what = "comparing the ranks' captures and plans"
    if not _maximum([int(error is not None)], group, what)[0]:
        return  # (the texts go round only where a rank failed)
    mine = None if error is None else f"{type(error).__name__}: {error}"
    reports = [None] * dist.get_world_size(group)
    _collective(what, dist.all_gather_object, reports, mine, group=group)
    _raise_first_failure(error, reports)


def _raise_first_failure(error, whys, kind=None):
    """Once the ranks have shared whether each failed (`whys`: per rank, its
    error's text or None): this rank's own `error`, else an error of `kind`
    (default PlanError) naming the first rank that failed and why."""
    from . import PlanError
    if error is not None:
        raise error
    failed = [(rank, why) for rank, why in enumerate(whys) if why is not None]
    if failed:
        rank, why = failed[0]
        raise (kind or PlanError)(f"rank {rank} failed, so this rank stops too: {why}")


def check_same_setup(setup, error, group):
    """Before the first collective of a step's construction: every rank of
    `group` learns whether any failed its own checks (`error`: this rank's
    exception, or None; raised as agree does), and then whether every rank's
    setup() ({what: value}, small values) is rank 0's: where one is not, a
    PlanError on every rank names the first that differs, rank 0's value and
    the ranks that give another."""
    import torch.distributed as dist
    from . import PlanError
    mine = None
    if error is None:
        try:
            mine = {what: _comparable(value) for what, value in setup().items()}
        except Exception as e:  # noqa: BLE001 (raised on every rank below)
            error = e
    reports = [None] * dist.get_world_size(group)
    _collective("comparing the ranks' train_step arguments", dist.all_gather_object, reports,
                mine if error is None else f"{type(error).__name__}: {error}", group=group)
    _raise_first_failure(error, [r if isinstance(r, str) else None for r in reports])
    for what, value in reports[0].items():
        differ = [rank for rank, report in enumerate(reports) if report.get(what) != value]
        if differ:
            raise PlanError(f"rank{'s' if len(differ) > 1 else ''} "
                            f"{', '.join(map(str, differ))} give{'' if len(differ) > 1 else 's'} "
                            f"another {what} than rank 0"
                            f"{_difference_shown(value, reports[differ[0]].get(what), differ[0])}"
                            ": every rank builds the same step, so give each the same module "
                            "and train_step arguments, and a slice of the batch of the same "
                            "shapes")


def _comparable(value):
    """check_same_setup's form of a setup value, the same text on every rank:
    its repr, or a digest where that is long; a long list, each entry so (a
    module's tensors: the first that differs can be named)."""
    def brief(v):
        text = repr(_canonical(v))
        return text if len(text) <= 200 else \
            "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    if isinstance(value, list) and len(repr(value)) > 200:
        return ("entries", [brief(v) for v in value])
    return brief(value)


def _difference_shown(mine, theirs, rank):
    """" (rank 0's: ...; rank R's: ...)" for two _comparable values that
    differ, at their first differing entry for lists; "" where both are
    digests."""
    if isinstance(mine, tuple) and isinstance(theirs, tuple):
        first, second = mine[1], theirs[1]
        k = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b),
                 min(len(first), len(second)))
        a = first[k] if k < len(first) else "(none)"
        b = second[k] if k < len(second) else "(none)"
        if a.startswith("sha256:") and b.startswith("sha256:"):
            return f" (from entry {k} on)"
        return f" (from entry {k} on: rank 0's {a}; rank {rank}'s {b})"
    if str(mine).startswith("sha256:") or str(theirs).startswith("sha256:"):
        return ""
    return f" (rank 0's: {mine}; rank {rank}'s: {theirs})"


def agreed(make, group):
    """make()'s value, where it succeeds on every rank of `group`; where it
    fails on any, an error on every rank (agree), before the collectives
    that follow."""
    value = error = None
    try:
        value = make()
    except Exception as e:  # noqa: BLE001 (raised again by agree, on every rank)
        error = e
    agree(error, group)
    return value


def check_same_call(parts, group, error=None, shown=None, step="the step", described=None):
    """PlanExecutionError unless every rank of `group` calls the same `step`
    (its label: two steps of the same shapes called in another order on
    some rank would pair their collectives wrongly) with a call of the same
    signature, `parts` ({what: value}: the shapes, dtypes and layouts, the
    gradients held, the module's settings, the optimizer's settings): a rank
    that planned alone for other shapes would pair its collectives with the
    others' wrongly. The error names the parts that differ, and where
    `shown` ({what: short text}) describes one, each rank's text of it;
    where `described` ({what: a callable of {entry: text}}, a module's
    settings, called only where some rank differs) does, the first entries
    that differ from rank 0's. `error`: this rank's refusal of the call, or
    None (raised as agree does, on every rank)."""
    import torch.distributed as dist
    differing = _ranks_differing(parts, group, "calls", error, call=step)
    if not differing:
        return
    shown, described = shown or {}, described or {}
    mine = {what: (hashlib.sha256(repr(_canonical(value)).encode()).hexdigest(),
                   shown.get(what), described[what]() if what in described else None)
            for what, value in parts.items()}
    reports = [None] * dist.get_world_size(group)
    _collective("comparing the ranks' calls", dist.all_gather_object, reports, mine, group=group)
    differ = [what for what in parts if any(r[what][0] != reports[0][what][0] for r in reports)]
    texts = [f"{what}: " + "; ".join(f"rank {rank} {r[what][1]}"
                                     for rank, r in enumerate(reports)
                                     if rank == 0 or r[what][0] != reports[0][what][0])
             for what in differ if reports[0][what][1] is not None]
    texts += [f"{what}: {_entries_differing(reports, what)}"
              for what in differ if reports[0][what][2] is not None]
    raise PlanExecutionError(
        f"ranks {differing} call the step with other {' and '.join(differ)} than rank 0"
        + (f" ({'; '.join(texts)})" if texts else "") + ": every rank must make the same "
        "calls (equal slices of the batch, the same module and optimizer settings)")


def _entries_differing(reports, what):
    """The first three entries of `what` (check_same_call's `described`) in
    which a rank differs from rank 0, each with both ranks' texts."""
    first = reports[0][what][2]
    lines = []
    for rank, r in enumerate(reports[1:], start=1):
        mine = r[what][2] or {}
        for entry in sorted(set(first) | set(mine)):
            if first.get(entry) != mine.get(entry):
                lines.append(f"{entry}: rank 0 {first.get(entry, '(none)')}, rank {rank} "
                             f"{mine.get(entry, '(none)')}")
    return "; ".join(lines[:3]) + (f"; and {len(lines) - 3} more" if len(lines) > 3 else "")


def check_same_collective(what, group, error=None):
    """PlanExecutionError unless every rank of `group` calls `what` (a
    collective of pebble.torch, such as full_state_dict()) together;
    `error` as check_same_call takes it."""
    differing = _ranks_differing(what, group, "calls", error, call=what)
    if differing:
        raise PlanExecutionError(f"{what} is a collective: every rank must call it together "
                                 f"(ranks {differing} made another call than rank 0)")


def _ranks_differing(value, group, what, error=None, call=None):
    """The ranks of `group` whose `value` (compared by a digest of its text,
    sets sorted) differs from rank 0's. Where a rank gives an `error` (this
    rank's exception, or None), that is raised instead, as agree raises it;
    where a rank makes another `call` of pebble.torch than rank 0 (the step,
    full_state_dict()), a PlanExecutionError naming both calls."""
    import torch.distributed as dist
    mine = ("failed", f"{type(error).__name__}: {error}") if error is not None else \
        (call, hashlib.sha256(repr(_canonical(value)).encode()).hexdigest())
    if _every_rank_gives(mine, group, what):
        return []
    digests = [None] * dist.get_world_size(group)
    _collective(f"comparing the ranks' {what}", dist.all_gather_object, digests, mine,
                group=group)
    _raise_first_failure(error, [d[1] if d[0] == "failed" else None for d in digests],
                         PlanExecutionError)
    calls = [(rank, d[0]) for rank, d in enumerate(digests) if d[0] != digests[0][0]]
    if calls:
        numbered = any("#" in d[0] for d in digests)
        raise PlanExecutionError(
            "; ".join(f"rank {rank} calls {other}" for rank, other in calls) +
            f" where rank 0 calls {digests[0][0]}: every rank makes the same calls of "
            "pebble.torch, together" +
            (" (train_step #n: the n-th made on rank 0, each made on every rank together)"
             if numbered else ""))
    return [rank for rank, d in enumerate(digests) if d != digests[0]]


def _every_rank_gives(mine, group, what):
    """Whether every rank of `group` gives `mine` (the pair _ranks_differing
    shares; never where a rank failed), by one all-reduce of three integers:
    a call's check then costs a third of an all_gather_object (0.2 ms
    against 0.7 ms on 2 ranks here), which follows only where a rank failed
    or differs."""
    digest = int(hashlib.sha256(repr(mine).encode()).hexdigest()[:15], 16)  # < 2^60
    failed, most, least = _maximum([int(mine[0] == "failed"), digest, -digest], group,
                                   f"comparing the ranks' {what}")
    return failed == 0 and most == -least


def any_rank(flag, group, what):
    """Whether `flag` is true on any rank of `group` (one all-reduce)."""
    return bool(_maximum([int(bool(flag))], group, what)[0])


def any_rank_or_differing(flag, number, group, what):
    """Whether `flag` is true on any rank of `group`, or the ranks give
    other integers `number` (one all-reduce)."""
    flagged, most, least = _maximum([int(bool(flag)), number, -number], group, what)
    return bool(flagged) or most != -least


def _maximum(integers, group, what):
    """The largest of each of `integers` (int64) over the ranks of `group`:
    one all-reduce, on the group's device."""
    import torch.distributed as dist
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend(group) == "nccl" else torch.device("cpu"))
    t = torch.tensor(integers, dtype=torch.int64, device=device)
    _collective(what, dist.all_reduce, t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def _canonical(value):
    """`value` with every set sorted: the same text in every process (a set's
    order of strings changes with each interpreter's hash seed)."""
    if isinstance(value, (set, frozenset)):
        return sorted(_canonical(v) for v in value)
    if isinstance(value, (tuple, list)):
        return type(value)(_canonical(v) for v in value)
    if isinstance(value, dict):  # (in its own order: insertion's)
        return {k: _canonical(v) for k, v in value.items()}
    return value


def broadcast_module(model, group):
    """Rank 0's parameters and buffers on every rank, in place, as
    DistributedDataParallel makes them at construction (but those on the meta
    device, which a sharded step builds: Note [A module built in shards])."""
    import torch.distributed as dist
    src = _global_rank(group, 0)
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.is_meta:
                continue
            _collective("sharing rank 0's weights", dist.broadcast, t.data, src=src,
                        group=group)


def optimizer_state_layout(optimizer):
    """Per parameter of `optimizer` (its groups' order), the entries of its
    state: (key, (shape, dtype)) of a tensor, (key, type name) of another
    value."""
    return [sorted((key, (tuple(v.shape), str(v.dtype)) if torch.is_tensor(v) else
                    type(v).__name__) for key, v in optimizer.state.get(p, {}).items())
            for group in optimizer.param_groups for p in group["params"]]


def broadcast_optimizer_state(optimizer, group):
    """Rank 0's state of `optimizer` on every rank of `group`, in place (its
    layout the same on every rank: optimizer_state_layout, compared by
    check_same_setup). Tensors go as they are (through the GPU on NCCL);
    other values (numbers) together, as objects."""
    import torch.distributed as dist
    src = _global_rank(group, 0)
    nccl = dist.get_backend(group) == "nccl"
    others = []
    with torch.no_grad():
        for param_group in optimizer.param_groups:
            for p in param_group["params"]:
                for key, value in sorted(optimizer.state.get(p, {}).items()):
                    if not torch.is_tensor(value):
                        others.append((optimizer.state[p], key, value))
                        continue
                    sent = value.cuda() if nccl and value.device.type != "cuda" else value
                    _collective("sharing rank 0's optimizer state", dist.broadcast, sent,
                                src=src, group=group)
                    if sent is not value:
                        value.copy_(sent)
    if others:
        values = same_on_every_rank([v for _, _, v in others], group,
                                    "rank 0's optimizer state")
        for (state, key, _), v in zip(others, values):
            state[key] = v


def check_same_graph(graph, group):
    """PlanExecutionError unless every rank of `group` captured this graph
    (pebble's, costs included: Note [One plan on every rank]), on which rank
    0's plan then runs."""
    differing = _ranks_differing(graph.to_json(), group, "graphs")
    if differing:
        raise PlanExecutionError(
            f"ranks {differing} captured another training step than rank 0 (pebble's graphs "
            "differ): every rank must run the same module and loss on the same shapes, for "
            "rank 0's plan to run on each")
