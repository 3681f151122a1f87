"""Runs a pebble schedule of a captured step with PyTorch's own operators.

`compute v` calls v's ATen operator (_graph.Node) on the resident tensors it
reads; `free v` drops v; `offload v` copies v into a host buffer (pinned, on
a side CUDA stream ordered by events, on a GPU) and `prefetch v` copies it
back. A view is computed by its view operator from its base, so it holds no
memory of its own, as the plan counts it.

Note [Steps of the optimizer]: a plan of the whole step (train_step(...,
optimizer=opt)) also has steps on nodes the capture does not have: the
optimizer's state and updates. The program hands each to the optimizer's
runner (`foreign`, _optimizer.Updates) where the plan puts it, between the
backward's steps where the plan runs an update early, with this run's
resident tensors and host copies (_RunState.device_value, host_value). A
free or prefetch of a parameter (an update on the host writes the host
copy, so the plan drops the device's and fetches it back) rebinds the
module's parameter (`rebind`), so that the freed storage is released.

Note [Parameters that live on the host]: with optimizer_parameters="host"
(or "auto", for the parameters the plan so places) a parameter's home is
the host: the plan's first step on it is a prefetch, and its last an
offload and a free. Its host copy (Program.host_homes; pinned beside a
GPU) is the module's parameter between steps, made once and kept, as the
plan's host memory is; a run starts without it on the device (a host
copy, not resident), each prefetch rebinds the module's parameter to the
fetched copy and each free to nothing, and the run ends with the module's
parameter its host copy again, written by its last offload (or in place by
an update on the host). The step puts each parameter where the plan of its
shapes keeps it before a run (_Variant._place_parameters).

Note [Randomness as eager has it]: a random call draws from the generator at
its first computation in the step, in the graph's order (the plan was
checked to keep that order, _order_of_first_draws), so it draws what eager
PyTorch would. Where the schedule runs the call again (a recomputation, a
sibling output computed apart), its generator state is kept, and every
later run runs from that state and puts the generator back afterwards, as
torch.utils.checkpoint does with preserve_rng_state. The states are kept as
Python bytes (_rng_state): a CPU generator's state is a 5056-byte tensor,
which the CPU device's allocator would count beyond the plan while kept;
its copy is freed before the call runs. Taking it allocates that tensor
for a moment all the same (PyTorch has no other way to read the state),
before each run of such a call: on the CPU device the program holds it as
the call's workspace, above the node's output (Program.workspace), and
the step's prediction is the simulator's with that workspace (TrainStep's
predicted_peak_bytes). A CUDA generator's state is a CPU tensor, which the
device does not hold.

Note [A call of several outputs run once]: the plan computes each output
of such a call (a batch norm's output and statistics) as a step of its own,
and pebble's simulator charges each step the call's workspace (the other
outputs while it runs, its temporaries). Where the plan computes siblings
one after the other (only frees between), the program runs the call once
and keeps the siblings for their steps, which run nothing and hold no
workspace, if every step of those siblings is so placed; a sibling also
computed apart runs its own call at each of its steps, since a node has one
workspace in the plan. The step's prediction is the simulator's on the
graph without the workspace of the kept siblings (TrainStep's
predicted_peak_bytes), which is what runs. The program has a step for each
of the plan's steps, so the kept siblings' ids in the plan (a sharded plan
names them apart: Shards.translate) are those of the plan's steps at the
same places. (Charged as the planner charges them, such steps put the
plan's peak 0.1 to 3 KB above what shufflenet_v2 sharded under dtr
measured.)

Note [Running statistics once]: a PyTorch 1.13 batch norm updates its
running statistics in place. Its first run in a step updates the module's
buffers, as eager does; a later run (a recomputation, or a sibling computed
at a step of its own) runs with a momentum of 0 (cuDNN's exponential average
factor), which writes each statistic back unchanged (0 * batch + 1 *
running) where the batch's statistics are finite (an infinite one makes it
NaN where eager's stays infinite: a step that has diverged). In training its outputs come from the batch alone, the same
bits, and it runs the first run's code with the first run's temporaries,
which calibration measured: no copy outside the plan, and no other
workspace. (Copies of the statistics, updated and dropped, measured above
the plan where a recomputed batch norm ran at the peak: mobilenet_v2
sharded under dtr, 0.3 to 2.7 KB; the statistics given as None instead ran
with fewer temporaries than predicted.)

Note [Statistics of a remade copy]: nn.InstanceNorm with
track_running_stats runs a batch norm over a repeated copy of its buffers,
which the kernel updates in place, and the step then averages that copy
into the buffers. Where the plan computes the copy again after the batch
norm's first run (a recomputation: the copy is cheap to remake), the remade
copy would hold the old statistics. So the program keeps the updated copy's
values at that first run, outside the device (Python memory on the CPU,
where PyTorch's allocator does not count it; host memory for a GPU), and
writes them into each later remake, right after it is computed: no
allocation on the device, and the later reads (the average, the batch norm
run again with momentum 0) see eager's statistics. Only copies that the
plan remakes are kept (statistics_remade). (Such plans were refused until
2026-12-07, and the planners, not told, often found none other at the least
budgets.)
"""

import collections
import time

import torch

from ._compat import free_storage, storage_key
from ._graph import ctc_backward_table, ctc_table_at_bound, op_name
from ._memory import is_dense, round_up


class PlanExecutionError(RuntimeError):
    """A step of the plan cannot run (a bug, or PyTorch refusing a kernel)."""


class PlanExecutionIndexError(PlanExecutionError, IndexError):
    """A kernel of the step raised IndexError (a target out of range), as
    eager's would: a loop that catches eager's error catches the step's."""


class PlanExecutionValueError(PlanExecutionError, ValueError):
    """A kernel of the step raised ValueError, as eager's would."""


class PlanExecutionTypeError(PlanExecutionError, TypeError):
    """A kernel of the step raised TypeError, as eager's would."""


def _kernel_error(message, cause):
    """The PlanExecutionError of a kernel's failure `cause`, of its kind too
    where that is IndexError, ValueError or TypeError (until 2026-12-05 a
    RuntimeError alone, which `except IndexError` around eager's call missed)."""
    for kind, error in ((IndexError, PlanExecutionIndexError),
                        (ValueError, PlanExecutionValueError),
                        (TypeError, PlanExecutionTypeError)):
        if isinstance(cause, kind):
            return error(message)
    return PlanExecutionError(message)


class CapturedValueMismatch(PlanExecutionError):
    """A kernel made a tensor of another shape or dtype than the capture
    holds: the shape depends on the values, or PyTorch's fake tensors are
    wrong about the kernel (the capture then traces on real tensors:
    Note [Fake tensors that disagree with a kernel] in __init__.py)."""


COMPUTE, FREE, OFFLOAD, PREFETCH, FOREIGN, REDUCE = range(6)
_ACTIONS = {"compute": COMPUTE, "free": FREE, "offload": OFFLOAD, "prefetch": PREFETCH,
            "all_reduce": REDUCE}


class StepResult:
    """What one run did."""

    def __init__(self):
        self.loss = None
        self.grad_norm = None  # the gradients' norm before clipping (max_grad_norm)
        self.grads = []        # (Slot, tensor)
        self.updates = []      # (Slot, tensor)
        self.counted_peak_bytes = 0  # the largest sum of resident storages (pebble's rule)
        self.resident_bytes = 0  # the sum of resident storages at the end
        self.transfer_bytes = 0
        self.host_peak_bytes = 0
        self.computes = 0
        self.recomputations = 0
        self.random_reruns = 0  # runs of a random call from its kept generator state
        self.time_s = 0.0
        self.node_seconds = None  # node index -> seconds of its first computation (timing runs)


def order_of_first_draws(graph, schedule):
    """The random calls in the order the schedule first runs them."""
    by_id = {n.id: n for n in graph.nodes}
    seen, order = set(), []
    for action, node_id, *_ in schedule:
        node = by_id.get(node_id)
        if action != "compute" or node is None:  # None: an optimizer's node
            continue
        call = node.group or node.fx
        if node.random and call not in seen:
            seen.add(call)
            order.append(call)
    return order


def draws_in_eager_order(graph, schedule):
    """Whether the schedule first runs the random calls in the graph's order
    (eager's), which Note [Randomness as eager has it] needs."""
    order = order_of_first_draws(graph, schedule)
    position = {n: i for i, n in enumerate(graph.gm.graph.nodes)}
    return all(position[a] < position[b] for a, b in zip(order, order[1:]))


def statistics_read_out_of_order(graph, schedule):
    """The first (batch norm call, reader, "before" or "after") where the
    schedule computes a call that reads the batch norm's running statistics
    before it in the trace at or after the batch norm's first run, or one
    that reads them after it before that run; None where every read is on
    its side (Note [Reads around running statistics] in _graph.py)."""
    reads = graph.statistics_reads()
    if not reads:
        return None
    first = {}  # node id -> index of its first compute
    computes = {}  # node id -> indices of its computes
    for i, (action, node_id, *_) in enumerate(schedule):
        if action == "compute":
            first.setdefault(node_id, i)
            computes.setdefault(node_id, []).append(i)
    for nodes, before, after in reads:
        runs = [first[n.id] for n in nodes if n.id in first]
        if not runs:
            continue
        ran = min(runs)
        for reader in before:
            # (another batch norm of those statistics reads them at its first
            # run alone: a later one reads none in training and writes them
            # back unchanged, Note [Running statistics once])
            runs_read = computes.get(reader.id, [])[:1 if reader.updates_stats else None]
            if any(i > ran for i in runs_read):
                return nodes[0].fx, reader, "before"
        for reader in after:
            if reader.id in first and first[reader.id] < ran:
                return nodes[0].fx, reader, "after"
    return None


def statistics_remade(graph, steps):
    """Per training batch norm call, the storage roots (node indices) of the
    temporaries it updates as running statistics that `steps` (a Program's
    (kind, node) steps) compute again after the call's first run: only where
    there are some. nn.InstanceNorm with track_running_stats updates a
    repeated copy of its buffers, and the step then averages that copy into
    them; remade after the batch norm, the copy would hold the old
    statistics (Note [Statistics of a remade copy])."""
    temporaries = {}  # fx call of a batch norm -> its statistics' operands' roots
    for node in graph.nodes:
        if node.updates_stats and node.fx not in temporaries:
            temporaries[node.fx] = {
                root.index for root in (graph.storage_root(graph._ref(a))
                                        for a in node.fx.args[3:5]
                                        if isinstance(a, torch.fx.Node))
                if root.kind == "op"}
    updated_by = {}  # root index -> the batch norm call that has updated it
    remade = {}
    for kind, node in steps:
        if kind != COMPUTE:
            continue
        if node.index in updated_by:
            remade.setdefault(updated_by[node.index], set()).add(node.index)
        if node.updates_stats:
            updated_by.update(dict.fromkeys(temporaries[node.fx], node.fx))
    return remade


class Program:
    """A schedule compiled against a StepGraph; `run` executes it."""

    def __init__(self, graph, schedule, device, streams=None, foreign=None, rebind=None,
                 sync=None, collectives=None):
        """`streams`: the module whose Stream, Event, stream, current_stream
        and synchronize order the copies (torch.cuda on a GPU; a test may give
        a stand-in to check the ordering on the CPU). `foreign`: the runner
        of the steps on nodes outside `graph` (Note [Steps of the
        optimizer]): owns(node_id) says which, step(action, node_id, run)
        runs one, begin() and finish() bracket a run. `rebind(node, tensor)`:
        called where the plan frees (tensor None) or prefetches a persistent
        node. `sync`: a _distributed.GradientAverage, which averages each
        gradient over the ranks (Note [Gradients averaged as they
        complete]). `collectives`: the _distributed.StepCollectives of the
        ranks' collectives that `sync` and `foreign` start: a failed run
        brings them back in step on every rank (fail()) before it drains
        them (Note [A rank that fails mid-step])."""
        self.graph = graph
        self.device = device
        self.by_id = by_id = {n.id: n for n in graph.nodes}
        self.foreign = foreign
        self.rebind = rebind
        self.sync = sync
        self.collectives = collectives
        # The nodes whose value is a parameter's gradient as the backward
        # makes it: the one a data-parallel plan averages over the ranks
        # (the simulator's GradientsToReduce), where a clipped step, its
        # unclipped gradient (Note [Clipping the averaged gradients]).
        self.gradients = {n.index for _, n in graph.backward_gradients()} | \
            {acc.index for _, _, acc in graph.accumulators}
        self.steps = []
        # A bucket's all_reduce steps (("all_reduce", node, bucket) triples,
        # consecutive): its first step's index -> its nodes; the later
        # steps' indices, which run nothing of their own.
        self.buckets, self.joined, self._bucket_numbers = {}, set(), {}
        for entry in schedule:
            action, node_id = entry[0], entry[1]
            kind = _ACTIONS.get(action)
            node = by_id.get(node_id)
            if len(entry) > 2 and kind == REDUCE and node is not None:
                self._bucket_member(entry[2], node)
            if node is None and foreign is not None and foreign.owns(node_id):
                self.steps.append((FOREIGN, (action, node_id)))
                continue
            if action == "host_compute" and node is not None:
                raise PlanExecutionError(f"schedule step ({action}, {node_id}): only the "
                                         "optimizer's updates run on the host")
            if kind is None or node is None:
                raise PlanExecutionError(f"schedule step ({action}, {node_id}) is not of this "
                                         "graph")
            self.steps.append((kind, node))
        self.keep_siblings, self.fused_steps, self.kept_only = kept_siblings(self.steps)
        # batch norm call -> roots of the statistics' copies remade after it
        # (Note [Statistics of a remade copy])
        self.remade_statistics = statistics_remade(graph, self.steps)
        # The random calls the schedule runs more than once (Note [Randomness
        # as eager has it]): only these keep their generator state.
        runs = {}
        for i, (kind, node) in enumerate(self.steps):
            if kind == COMPUTE and node.random and i not in self.fused_steps:
                runs[node.fx] = runs.get(node.fx, 0) + 1
        self.rerun_calls = {call for call, count in runs.items() if count > 1}
        # The device memory that taking a generator's state holds for a moment.
        self.rng_state_bytes = generator_state_bytes(device) if self.rerun_calls else 0
        self._check_reductions()
        # call_hook(node, run) -> run(): wraps each call (calibration measures it).
        self.call_hook = None
        self.streams = streams if streams is not None else (
            torch.cuda if device.type == "cuda" else None)
        self.cuda = self.streams is not None
        self.copy_stream = self.streams.Stream(device) if self.cuda else None
        # The persistent nodes that live on the host between steps (Note
        # [Parameters that live on the host]): the plan's first step on each
        # is a prefetch.
        first = {}
        for kind, node in self.steps:
            if kind != FOREIGN:
                first.setdefault(node.index, (kind, node))
        self.host_homes = {index for index, (kind, node) in first.items()
                           if kind == PREFETCH and node.kind == "persistent"}
        # Host copies, made once and kept between steps (the plan's host memory).
        self.host = {}
        for kind, node in self.steps:
            if kind in (OFFLOAD, PREFETCH) and node.kind != "order" and \
                    node.index not in self.host and \
                    (kind == OFFLOAD or node.index in self.host_homes):
                v = node.value
                self.host[node.index] = torch.empty_strided(
                    v.shape, v.stride(), dtype=v.dtype, device="cpu",
                    pin_memory=device.type == "cuda")

    def workspace(self, node):
        """The workspace a compute of `node` holds as the program runs it:
        none for a kept sibling (Note [A call of several outputs run once]),
        and for a random call run again at least the generator's state above
        the node's output (Note [Randomness as eager has it])."""
        if node.id in self.kept_only:
            return 0
        if node.random and node.fx in self.rerun_calls:
            return max(node.workspace_bytes, self.rng_state_bytes - node.nbytes)
        return node.workspace_bytes

    def _bucket_member(self, bucket, node):
        """Notes the all_reduce step about to be appended as one of bucket
        number `bucket`: it starts the bucket, or joins the one before it."""
        i = len(self.steps)
        first = i - 1
        while first in self.joined:
            first -= 1
        if i > 0 and self.steps[i - 1][0] == REDUCE and self._bucket_numbers.get(first) == bucket:
            self.buckets[first].append(node)
            self.joined.add(i)
        else:
            self.buckets[i] = [node]
            self._bucket_numbers[i] = bucket

    def _check_reductions(self):
        """PlanExecutionError for an all_reduce step without a process group
        (or a group without the plan's all-reduces), or on a tensor that
        cannot be averaged in place: a gradient neither contiguous nor the
        whole of a contiguous storage. The plan places the steps
        (scheduler/collectives.h); the simulator checked their order."""
        reduced = [node for kind, node in self.steps if kind == REDUCE]
        expected = set()
        if self.sync is not None:  # but a gradient that is a view of another: summed with it
            nodes = self.graph.nodes
            for g in self.gradients:
                a = nodes[g].alias_of
                while a is not None and a not in self.gradients:
                    a = nodes[a].alias_of
                if a is None:
                    expected.add(g)
        # Each once, but an unclipped gradient computed again is averaged
        # again (Note [Clipping the averaged gradients] in _capture.py).
        times = collections.Counter(node.index for node in reduced)
        if set(times) != expected or any(
                n > 1 and g not in self.graph.unclipped_indices for g, n in times.items()):
            raise PlanExecutionError(
                "internal: the plan's all-reduces do not match the gradients to average "
                f"({len(reduced)} all_reduce steps for {len(expected)} gradients)")
        storages = {}
        for node in reduced:
            root = self.graph.storage_root(node)
            whole = not node.value.is_contiguous()  # reduced through its whole storage
            if whole and not (is_dense(root.value) and root.value.numel() == node.value.numel()):
                raise PlanExecutionError(f"gradient '{node.id}' is not contiguous, nor the whole "
                                         "of a dense storage: pebble.torch cannot all-reduce it "
                                         "in place")
            storages.setdefault(root.index, []).append((node, whole))
        for shared in storages.values():
            if len(shared) > 1 and any(whole for _, whole in shared):
                names = ", ".join(f"'{node.id}'" for node, _ in shared)
                raise PlanExecutionError(f"gradients {names} share one storage, and one is "
                                         "reduced through the whole of it: pebble.torch would "
                                         "sum the others twice")

    def run(self, persistent, timing=False, release=False, after_step=None):
        """Executes the schedule. `persistent`: node index -> tensor for every
        persistent node; release: empty it once the run holds them, so that
        a persistent tensor the plan frees is released; after_step: called
        after each step with nothing of the step's held but what the plan
        holds (the memory timeline's mark). Returns a StepResult; every
        tensor the schedule freed is gone when it returns."""
        state = _RunState(self, persistent, timing)
        if release:
            persistent.clear()
        start = time.perf_counter()
        if self.foreign is not None:
            self.foreign.begin(state)
        try:
            for i, (kind, node) in enumerate(self.steps):
                if kind == COMPUTE:
                    state.compute(i, node)
                elif kind == FREE:
                    state.free(node)
                elif kind == OFFLOAD:
                    state.offload(node)
                elif kind == PREFETCH:
                    state.prefetch(node)
                elif kind == REDUCE:
                    if i not in self.joined:
                        state.reduce(self.buckets.get(i, (node,)))
                else:
                    self.foreign.step(*node, state)
                if after_step is not None:
                    after_step()
            state.finish()
            if self.foreign is not None:
                self.foreign.finish(state)
        except BaseException as e:
            # Every collective in flight completes (on NCCL, the GPU may
            # wait for one), before the drains below.
            error = e
            if self.collectives is not None:
                try:
                    error = self.collectives.fail(e)
                except BaseException as meeting:  # noqa: BLE001 (an interrupt meanwhile)
                    error = meeting
            if self.cuda:  # no copy may still write a tensor dropped below
                self.streams.synchronize(self.device)
            if self.sync is not None:
                self.sync.abandon()
            if self.foreign is not None:
                self.foreign.abort()
            state.restore_persistent()
            if error is e:
                raise
            raise error from None
        result = state.result
        result.time_s = time.perf_counter() - start
        g = self.graph
        result.loss = state.live[g.loss.index]
        if g.grad_norm is not None:  # (a sharded step's runner gives its own: foreign.finish)
            result.grad_norm = state.live[g.grad_norm.index]
        result.grads = [(slot, state.live[n.index]) for slot, n in g.grads]
        result.updates = [(slot, state.live[n.index]) for slot, n in g.updates]
        result.accumulated = [slot for slot, _, _ in g.accumulators]
        result.recomputations = result.computes - len(state.computed)
        result.resident_bytes = state.resident
        return result


def kept_siblings(steps):
    """For each compute step of a node of a several-output call, the sibling
    nodes that the schedule computes next (only frees between), of those
    that every compute step of is so placed: the call runs once and they are
    kept for those steps. Also the indices of those siblings' steps, which
    run nothing, and the siblings' ids (Note [A call of several outputs run
    once]). A sibling computed apart elsewhere runs its own call at each
    step, so that its workspace, the same at every step in the plan, is held
    at each. `steps`: (kind, node) pairs, as Program.steps."""
    allowed = {node.id for kind, node in steps
               if kind == COMPUTE and node.group is not None}
    while True:
        keep, fused = _fusions_of(steps, allowed)
        kept, run = _kept_and_run(steps, fused)
        if not kept & run:
            return keep, fused, kept
        allowed = kept - run  # (fewer each time: a node both kept and run is out)


def _kept_and_run(steps, fused):
    """The ids of the siblings with a step in `fused` (kept from a call),
    and of those with a compute step outside it (running their call)."""
    kept, run = set(), set()
    for i, (kind, node) in enumerate(steps):
        if kind == COMPUTE and node.group is not None:
            (kept if i in fused else run).add(node.id)
    return kept, run


def _fusions_of(steps, allowed):
    """kept_siblings' steps, where only the nodes of `allowed` may be kept."""
    keep, fused = {}, set()
    for i, (kind, node) in enumerate(steps):
        if kind != COMPUTE or node.group is None or i in fused:
            continue
        siblings = []
        for j in range(i + 1, len(steps)):
            kind2, other = steps[j]
            if kind2 == FREE:
                continue
            if kind2 == COMPUTE and other.group is node.group and other is not node and \
                    other.id in allowed:
                siblings.append(other)
                fused.add(j)
                continue
            break
        if siblings:
            keep[i] = siblings
    return keep, fused


class _RunState:
    """One run: the resident tensors, pebble's count of their storages, the
    generator states of random calls, and the CUDA events of copies."""

    def __init__(self, program, persistent, timing):
        self.program = program
        self.graph = program.graph
        self.device = program.device
        self.result = StepResult()
        self.live = [None] * len(self.graph.nodes)
        self.storages = {}  # storage key -> [holders, bytes]
        self.resident = 0
        # Collectives a foreign step started (a sharded plan's gathers and
        # reduce-scatters): storage root index -> callables that complete
        # them, run once before a step reads, moves or frees that storage.
        self.waits = {}
        # Storages a collective wrote: freed through the storage once the
        # plan lets go of them (free_storage), so that gloo's worker thread,
        # which lets go of a tensor a moment after its collective, never
        # frees one where PyTorch's CPU profiler would miss it.
        self.collective_storages = set()
        for i, t in persistent.items():
            if i in program.host_homes:  # (its host copy, not resident)
                continue
            self.live[i] = t
            self._count(t, self.graph.nodes[i].nbytes)
        self.result.counted_peak_bytes = self.resident
        self.computed = set()
        self.calls_run = set()   # fx calls run once already (statistics, draws)
        self.rng_states = {}     # fx call -> generator state before its first run
        # root index -> [(view size, stride, offset, values)] of a statistics'
        # copy after its batch norm's first run (Note [Statistics of a remade copy])
        self.updated_statistics = {}
        self.kept = {}           # node index -> a sibling's output kept for its step
        self.host_bytes = 0
        self.on_host = set()
        self.ready, self.offloaded = {}, {}
        self.copied_out = {}  # node index -> its last offload's event, until the host reads it
        self.dropped = {}  # persistent node index -> node, freed and not prefetched back yet
        for i in program.host_homes:  # (Note [Parameters that live on the host])
            self.on_host.add(i)
            self.count_host(self.graph.nodes[i].nbytes)
            self.dropped[i] = self.graph.nodes[i]
        self.timing = timing
        if timing:
            self.result.node_seconds = {}
        self.cuda = program.cuda
        self.streams = program.streams
        self.stream = self.streams.current_stream(self.device) if self.cuda else None

    # --- pebble's count of the resident storages -------------------------------

    def _count(self, t, nbytes):
        key = storage_key(t)
        entry = self.storages.get(key)
        if entry is None:
            self.storages[key] = [1, nbytes]
            self.resident += nbytes
        else:
            entry[0] += 1

    def _uncount(self, t):
        key = storage_key(t)
        entry = self.storages[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.resident -= entry[1]
            del self.storages[key]
            if key in self.collective_storages:
                self.collective_storages.discard(key)
                free_storage(t)

    def _settle(self, node):
        """Before a step reads, moves or frees `node`: the collective on its
        storage, if one is in flight, is complete (a gradient's all-reduce
        averaged, a gather or reduce-scatter done)."""
        root_index = self._root(node).index
        for complete in self.waits.pop(root_index, ()):
            complete()
        if self.program.sync is not None:
            self.hold(-self.program.sync.settle(root_index))

    def reduce(self, nodes):
        """Starts the all-reduce of the gradients `nodes` (an all_reduce step,
        or a bucket's steps): each tensor itself, or where it is a view that
        is not contiguous, its whole storage's tensor
        (Program._check_reductions checked which)."""
        members = []
        for node in nodes:
            root = self._root(node)
            t = self.live[node.index]
            if t is not None and not t.is_contiguous():
                t = _flat_if_dense(self.live[root.index])
            if t is None:
                raise PlanExecutionError(f"internal: gradient '{node.id}' is not resident when "
                                         "its all-reduce starts")
            members.append((root.index, t, round_up(node.nbytes, self.graph.round_to)))
        self.hold(self.program.sync.start(members))  # a bucket's copy
        if len(members) == 1:  # reduced in place: freed through its storage (wait_before's why)
            self.collective_storages.add(storage_key(members[0][1]))

    def hold(self, nbytes, workspace=0):
        """Counts `nbytes` of device memory that a foreign step holds (negative:
        releases), and a momentary `workspace` above it."""
        self.resident += nbytes
        self.result.counted_peak_bytes = max(self.result.counted_peak_bytes,
                                             self.resident + workspace)

    def put(self, node, t, nbytes=None):
        """`t` is the captured node `node`'s value from now on, made by a
        foreign step (a gathered parameter, _sharding.py); its storage holds
        `nbytes` (default: the node's) where no other node holds it yet."""
        if self.live[node.index] is not None:
            raise PlanExecutionError(f"the plan makes '{node.id}' again while it is resident")
        self.live[node.index] = t
        self._count(t, node.nbytes if nbytes is None else nbytes)
        self.result.counted_peak_bytes = max(self.result.counted_peak_bytes, self.resident)

    def take(self, node):
        """A foreign step drops the captured node `node`'s value."""
        t = self.live[node.index]
        if t is None:
            raise PlanExecutionError(f"the plan frees '{node.id}', which is not resident")
        self._settle(node)
        self._wait_copies(node)
        self._uncount(t)
        self.live[node.index] = None

    def _wait_copies(self, node):
        """Before `node`'s storage goes: the compute stream waits for a copy
        that reads it (an offload) or writes it (a fetch), on a GPU."""
        if self.cuda:
            for pending in (self.offloaded, self.ready):
                event = pending.pop(node.index, None)
                if event is not None:
                    self.stream.wait_event(event)

    def wait_before(self, node, complete):
        """A foreign step's collective writes the storage of `node`: complete()
        runs before a later step reads, moves or frees it (or at the end),
        and the storage is freed through itself once the plan lets go of it."""
        self.waits.setdefault(self._root(node).index, []).append(complete)
        t = self.live[node.index]
        if t is not None and t is not _TOKEN:
            self.collective_storages.add(storage_key(t))

    # --- tensors for the optimizer's steps (Note [Steps of the optimizer]) -------

    def device_value(self, node_id):
        """The resident tensor of the graph's node `node_id`, on a GPU once a
        prefetch into its storage is complete (for the compute stream)."""
        node = self.program.by_id[node_id]
        t = self.live[node.index]
        if t is None or t is _TOKEN:
            raise PlanExecutionError(f"the plan's update reads '{node_id}', which is not "
                                     "resident")
        self._settle(node)
        if self.cuda:
            for index in (node.index, self._root(node).index):
                event = self.ready.pop(index, None)
                if event is not None:
                    self.stream.wait_event(event)
        return t

    def _root(self, node):
        return self.graph.storage_root(node)

    def host_value(self, node_id):
        """The host copy of the graph's node `node_id` (a view of its storage's
        host buffer), once the copy into it is complete."""
        node = self.program.by_id[node_id]
        root = self._root(node)
        self._settle(node)  # (its offload settled it already)
        if root.index not in self.on_host:
            raise PlanExecutionError(f"the plan's update on the host reads '{node_id}', whose "
                                     "storage has no host copy")
        event = self.copied_out.pop(root.index, None)
        if event is not None:
            event.synchronize()
        buffer = self.program.host[root.index]
        if root is node:
            return buffer
        v, base = node.value, root.value
        return buffer.as_strided(v.shape, v.stride(), v.storage_offset() - base.storage_offset())

    def restore_persistent(self):
        """After a failed run: each persistent node the plan freed is rebound to
        a device copy of its host copy, so that the module keeps its
        parameters (the plan frees a parameter only after offloading it, so
        each has a host copy), and each that lives on the host to its host
        copy, fetched or not."""
        rebind = self.program.rebind
        for index, node in self.dropped.items():
            if rebind is not None and index in self.on_host and \
                    index not in self.program.host_homes:
                rebind(node, self.program.host[index].to(self.device))
        self._homes_again()

    def _homes_again(self):
        """Each persistent node that lives on the host is its host copy again,
        fetched or not (Note [Parameters that live on the host])."""
        if self.program.rebind is not None:
            for index in self.program.host_homes:
                self.program.rebind(self.graph.nodes[index], self.program.host[index])
        self.dropped.clear()

    # --- steps -----------------------------------------------------------------

    def compute(self, step, node):
        if self.live[node.index] is not None:
            raise PlanExecutionError(f"the schedule computes '{node.id}', which is resident")
        for u in node.inputs:
            self._settle(u)
        if self.cuda:
            for u in node.inputs:
                event = self.ready.pop(u.index, None)
                if event is not None:
                    self.stream.wait_event(event)
        if node.kind == "accumulate" and node.index in self.computed:
            raise PlanExecutionError(f"the schedule computes '{node.id}' again: it adds the "
                                     "step's gradient into .grad in place, once")
        if node.kind == "order":  # a token: nothing to run, nothing held
            self.live[node.index] = _TOKEN
            self.result.computes += 1
            self.computed.add(node.index)
            return
        out = self.kept.pop(node.index, None)
        start = time.perf_counter() if self.timing else 0.0
        if node.kind == "accumulate":
            gradient, grad = (self.live[u.index] for u in node.inputs)
            out = grad.add_(gradient)
        elif out is None:
            self._keep_rng_state(node)
            hook = self.program.call_hook
            outputs = hook(node, lambda: self._run_call(node)) if hook else self._run_call(node)
            out = outputs[node.out_index] if node.out_index is not None else outputs
            for sibling in self.program.keep_siblings.get(step, ()):
                self.kept[sibling.index] = outputs[sibling.out_index]
            del outputs
        out = self._checked(node, out)
        if node.index in self.updated_statistics:
            _restore_statistics(out, self.updated_statistics[node.index])
        if self.timing:
            if self.cuda:
                self.streams.synchronize(self.device)
            self.result.node_seconds.setdefault(node.index, time.perf_counter() - start)
        self.live[node.index] = out
        base = self.graph.nodes[node.alias_of] if node.alias_of is not None else None
        self._count(out, base.nbytes if base is not None else node.nbytes)
        workspace = self.program.workspace(node)
        self.result.counted_peak_bytes = max(self.result.counted_peak_bytes,
                                             self.resident + workspace)
        self.result.computes += 1
        self.computed.add(node.index)

    def _keep_rng_state(self, node):
        """Before the first run of a random call that the schedule runs again:
        the generator's state, for the later runs (Note [Randomness as eager
        has it]); taken outside the call, whose temporaries calibration
        measures, and kept outside PyTorch's allocator (_rng_state)."""
        call = node.fx
        if node.random and call not in self.calls_run and call in self.program.rerun_calls:
            self.rng_states[call] = _rng_state(self.device)

    def _run_call(self, node):
        """The value of node's call (all its outputs), its folded in-place calls
        applied; random calls and statistics updates as the notes say."""
        call = node.fx
        first_run = call not in self.calls_run
        self.calls_run.add(call)
        restore = None
        if node.random:
            if not first_run:
                restore = _rng_state(self.device)
                _set_rng_state(self.device, self.rng_states[call])
                self.result.random_reruns += 1
        args = ()
        try:
            if op_name(call.target) in _LIKE_TEMPLATE:
                value = self._like(call)
            else:
                args, kwargs = self._arguments(call, node, first_run)
                value = self._call_of(call, args, kwargs)
            for step in node.fold:
                args, step_kwargs = self._arguments(step, node, first_run, value=value)
                value = step.target(*args, **step_kwargs)
            if first_run and call in self.program.remade_statistics:
                self._keep_statistics(call, args)
        except (RuntimeError, IndexError, ValueError, TypeError) as e:
            if op_name(call.target) in _VIEWS_OF_SPANS and node.inputs:
                self._check_layout_read(node)  # (Note [Layouts a view reads])
            # (the tensors' dtypes and shapes: a kernel that PyTorch lacks
            # for a dtype, bfloat16 under CPU autocast, fails eager's run too)
            given = ", ".join(f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"
                              for t in args if torch.is_tensor(t))
            raise _kernel_error(
                f"node '{node.id}' ({call.target}"
                f"{' on ' + given if given else ''}): PyTorch's kernel failed: "
                f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}",
                e) from e
        finally:
            if restore is not None:
                _set_rng_state(self.device, restore)
        return value

    def _keep_statistics(self, call, args):
        """After a batch norm's first run: the values of the statistics'
        copies that the plan remakes later (Note [Statistics of a remade
        copy]), each as the view the batch norm wrote."""
        remade = self.program.remade_statistics[call]
        for a, t in zip(call.args[3:5], args[3:5]):
            if not isinstance(a, torch.fx.Node):
                continue
            root = self.graph.storage_root(self.graph._ref(a)).index
            if root in remade:
                self.updated_statistics.setdefault(root, []).append(
                    (t.shape, t.stride(), t.storage_offset(), _off_device(t)))

    @staticmethod
    def _call_of(call, args, kwargs):
        """call's value on these arguments: its kernel's, but for CTC's table,
        held at its bound (Note [CTC's table at its bound] in _graph.py)."""
        name = op_name(call.target)
        # (target_lengths' largest value read on the host: a GPU's CTC kernels
        # copy the lengths to the host themselves)
        if name == "_ctc_loss_backward" and len(args) > 6 and torch.is_tensor(args[4]):
            args = list(args)
            args[6] = ctc_backward_table(args[6], args[4])
        value = call.target(*args, **kwargs)
        if name == "_ctc_loss" and len(args) > 1:
            value = (value[0], ctc_table_at_bound(value[1], args[1]))
        return value

    def _arguments(self, call, node, first_run, value=None):
        """call's args and kwargs with every fx node replaced by its tensor: a
        resident tensor, or `value` (the tensor a folded in-place call
        writes)."""
        folded_target = call.args[0] if value is not None else None
        # A method, not a recursive closure: a closure that refers to itself
        # is a reference cycle, which would keep this run's tensors alive
        # until the garbage collector runs (in the middle of a later step).
        args = [self._resolve(a, node, value, folded_target) for a in call.args]
        kwargs = {k: self._resolve(v, node, value, folded_target)
                  for k, v in call.kwargs.items()}
        if node.mask is not None and value is None:
            _set_arg(call, args, kwargs, "output_mask", list(node.mask))
        if node.updates_stats and not first_run and value is None:
            # Note [Running statistics once]: the statistics written back unchanged.
            _set_arg(call, args, kwargs, call.target._schema.arguments[6].name, 0.0)
        return args, kwargs

    def _resolve(self, a, node, value, folded_target):
        """An argument with every fx node replaced by its resident tensor (or
        `value`, for the tensor a folded in-place call writes)."""
        if isinstance(a, torch.fx.Node):
            if value is not None and a is folded_target:
                return value
            t = self.live[self.graph._ref(a).index]
            if t is None:
                raise PlanExecutionError(f"node '{node.id}' reads '{self.graph._ref(a).id}', "
                                         "which is not resident")
            return t
        if isinstance(a, (list, tuple)):
            return type(a)(self._resolve(b, node, value, folded_target) for b in a)
        return a

    def _like(self, call):
        """A *_like or new_* call without its template: the same tensor made
        from the template's shape, strides and dtype (the template need not be
        resident), drawing from the generator as the call would."""
        name = op_name(call.target)
        template = self.graph.values[call.args[0]]
        rest = list(call.args[1:])
        options = dict(call.kwargs)
        dtype = options.pop("dtype", None) or template.dtype
        memory_format = options.pop("memory_format", None) or torch.preserve_format
        for key in ("layout", "device", "pin_memory", "requires_grad"):
            options.pop(key, None)
        made = dict(dtype=dtype, device=self.device)
        if name.startswith("new_"):
            size = rest.pop(0)
            if name == "new_empty_strided":
                return torch.empty_strided(size, rest.pop(0), **made)
            fill = {"new_empty": None, "new_zeros": 0, "new_ones": 1}.get(name, None)
            t = torch.empty(size, **made)
            if name == "new_full":
                fill = rest.pop(0)
            return t if fill is None else t.fill_(fill)
        # The strides PyTorch gives the call's memory format (dropout's
        # empty_like(x, memory_format=contiguous) of a transposed x is
        # contiguous, and its mask is drawn in that order), found on the meta
        # device.
        laid = torch.empty_like(torch.empty_strided(template.shape, template.stride(),
                                                    device="meta"),
                                memory_format=memory_format)
        t = torch.empty_strided(template.shape, laid.stride(), **made)
        if name == "empty_like":
            return t
        if name == "zeros_like":
            return t.zero_()
        if name == "ones_like":
            return t.fill_(1)
        if name == "full_like":
            return t.fill_(rest[0])
        if name == "rand_like":
            return t.uniform_(0, 1)
        if name == "randn_like":
            return t.normal_(0, 1)
        if name == "randint_like":
            low, high = (0, rest[0]) if len(rest) == 1 else (rest[0], rest[1])
            return t.random_(low, high)
        raise PlanExecutionError(f"internal: no template rule for {call.target}")

    def _checked(self, node, out):
        if node.kind == "accumulate":
            return out
        if not isinstance(out, torch.Tensor):
            raise PlanExecutionError(f"node '{node.id}' ({node.fx.target}) gave "
                                     f"{type(out).__name__}, not a tensor")
        v = node.value
        if node.empty_when_run and out.numel() == 0:
            return out
        if tuple(out.shape) != tuple(v.shape) and not node.kernel_shaped:
            raise CapturedValueMismatch(
                f"node '{node.id}' ({node.fx.target}){node.fx.meta.get('user_line', '')}: "
                f"PyTorch computed shape {tuple(out.shape)}, the capture {tuple(v.shape)}: the "
                "shape depends on the values (a boolean mask, nonzero, unique, the gradient "
                "of masked_scatter), and a plan "
                "holds the shapes of the batch it was captured with, so pebble.torch cannot "
                "plan this step")
        if out.dtype != v.dtype and not node.kernel_shaped:
            raise CapturedValueMismatch(
                f"node '{node.id}' ({node.fx.target}): PyTorch computed {out.dtype}, the "
                f"capture {v.dtype}: this kernel keeps another dtype than PyTorch's fake "
                "tensors say (torch.arange with float arguments in PyTorch 1.13, a bfloat16 "
                "normalization on the CPU), which pebble.torch cannot plan without "
                "calibration (calibrate=True captures such a step on real tensors, unsharded)")
        if node.alias_of is not None:
            base = self.live[node.alias_of]
            if base is None or storage_key(out) != storage_key(base):
                raise PlanExecutionError(f"node '{node.id}' ({node.fx.target}) was captured as "
                                         "a view but PyTorch made a copy")
        if op_name(node.fx.target) in _STRIDES_GIVEN and node.inputs:
            self._check_layout_read(node)
        return out

    def _check_layout_read(self, node):
        """Note [Layouts a view reads]: the view's input laid out as the
        capture saw it, else CapturedValueMismatch."""
        given = node.inputs[0]
        real, traced = self.live[given.index], given.value
        if not torch.is_tensor(real) or not torch.is_tensor(traced):
            return
        # (as_strided's offset is the storage's; _reshape_alias reads from
        # its input's own: a batch sliced out of a larger tensor reads alike)
        offset = op_name(node.fx.target) == "as_strided"
        if _layout_read(real, offset) != _layout_read(traced, offset):
            harm = ("cannot be made of it" if op_name(node.fx.target) in _VIEWS_OF_SPANS
                    else "would read other elements")
            raise CapturedValueMismatch(
                f"node '{node.id}' ({node.fx.target}){node.fx.meta.get('user_line', '')} "
                f"reads '{given.id}' laid out as PyTorch's fake tensors gave it (strides "
                f"{traced.stride()}, storage offset {traced.storage_offset()}), but it holds "
                f"strides {real.stride()}, offset {real.storage_offset()}: the view {harm}, "
                "so pebble.torch cannot plan this step without calibration (calibrate=True "
                "captures such a step on real tensors, unsharded)")

    def free(self, node):
        t = self.live[node.index]
        if t is None:
            raise PlanExecutionError(f"the schedule frees '{node.id}', which is not resident")
        self._settle(node)
        self._wait_copies(node)
        if t is not _TOKEN:
            self._uncount(t)
        self.live[node.index] = None
        if node.kind == "persistent" and self.program.rebind is not None and \
                self.program.rebind(node, None):
            self.dropped[node.index] = node

    def offload(self, node):
        t = self.live[node.index]
        if t is _TOKEN:
            return
        self._settle(node)
        buffer = self.program.host[node.index]
        event = self.copy(buffer, t)
        if event is not None:
            self.offloaded[node.index] = event
            self.copied_out[node.index] = event
        if node.index not in self.on_host:
            self.on_host.add(node.index)
            self.count_host(node.nbytes)
        self.result.transfer_bytes += node.nbytes

    def count_host(self, nbytes):
        """Counts a host copy of `nbytes` that this run made current (kept
        to the end: host buffers are kept between steps) in its host peak."""
        self.host_bytes += nbytes
        self.result.host_peak_bytes = max(self.result.host_peak_bytes, self.host_bytes)

    def prefetch(self, node):
        if node.kind == "order":
            self.live[node.index] = _TOKEN
            return
        buffer = self.program.host[node.index]
        t = torch.empty_strided(buffer.shape, buffer.stride(), dtype=buffer.dtype,
                                device=self.device)
        event = self.copy(t, buffer)
        if event is not None:
            self.ready[node.index] = event
        self.live[node.index] = t
        self._count(t, node.nbytes)
        self.result.counted_peak_bytes = max(self.result.counted_peak_bytes, self.resident)
        self.result.transfer_bytes += node.nbytes
        if node.kind == "persistent" and self.program.rebind is not None and \
                self.dropped.pop(node.index, None) is not None:
            self.program.rebind(node, t)

    def copy(self, dst, src):
        """dst <- src; on a GPU on the side stream after the compute stream's
        work so far. Returns the copy's event (None on the CPU)."""
        if not self.cuda:
            dst.copy_(src)
            return None
        copy_stream = self.program.copy_stream
        copy_stream.wait_stream(self.stream)
        with self.streams.stream(copy_stream):
            dst.copy_(src, non_blocking=True)
            event = self.streams.Event()
            event.record()
        return event

    def finish(self):
        for completes in list(self.waits.values()):
            for complete in completes:
                complete()
        self.waits.clear()
        if self.program.sync is not None:
            self.hold(-self.program.sync.settle_all())
        if self.kept:
            raise PlanExecutionError("internal: sibling outputs kept past their steps")
        homes = self.program.host_homes
        away = [node for index, node in self.dropped.items() if index not in homes]
        if away:
            raise PlanExecutionError(f"the plan leaves '{away[0].id}' off the device at the "
                                     "step's end")
        left = [self.graph.nodes[i] for i in homes if self.live[i] is not None]
        if left:
            raise PlanExecutionError(f"the plan leaves '{left[0].id}', whose home is the host, "
                                     "on the device at the step's end")
        if self.cuda:
            for event in list(self.ready.values()) + list(self.offloaded.values()):
                self.stream.wait_event(event)
            self.streams.synchronize(self.device)
        self._homes_again()  # (every node dropped is one, checked above)


def generator_state_bytes(device):
    """The device memory that taking `device`'s generator state holds for a
    moment: the CPU's state tensor; none of a GPU's (its state is a CPU
    tensor)."""
    return torch.get_rng_state().numel() if device.type == "cpu" else 0


def _flat_if_dense(t):
    """`t`, or where it is not contiguous but dense, its elements as one flat
    contiguous view of the same storage (an all-reduce sums elementwise, so
    their order does not matter). None stays None."""
    if t is None or t.is_contiguous():
        return t
    return t.as_strided((t.numel(),), (1,))


# The resident value of an order token (Note [Random calls in eager's order]).
_TOKEN = object()

# Note [Layouts a view reads]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A trace records reshape as a view with its strides written in
# (_reshape_alias(t, size, stride)) where t's strides allow one, and
# functionalization's as_strided alike: the strides of t as the trace saw
# it. Traced on fake tensors, those are the fake kernel's, and PyTorch
# 1.13's fake native_layer_norm keeps its input's layout where the CPU
# kernel makes a contiguous output (MaxViT's attention over one window,
# batch 1): the view then read the real output with the wrong strides, and
# the step's loss and gradients were off eager's, silently, until
# 2026-12-06. Each such view checks that its input is laid out as traced
# (the strides of dims of more than one element, and as_strided's storage
# offset, which is absolute: _reshape_alias reads from its input's); where
# not, the calibration's run raises CapturedValueMismatch, and the step is
# traced again on real tensors, as for other fake tensors that disagree
# with a kernel. A view of a size alone (view, _unsafe_view) reads the
# right elements whatever its input's strides, but fails where they do not
# span the new shape: there the same disagreement is checked, after the
# failure (nn.BatchNorm1d over a transposed (batch, time, channels) tensor:
# 1.13's fake native_batch_norm keeps its input's layout, the CPU kernel
# makes a contiguous output, and the next layer's view of it failed until
# 2026-12-07, naming no cause).
_STRIDES_GIVEN = {"_reshape_alias", "as_strided"}
_VIEWS_OF_SPANS = {"view", "_unsafe_view"}


def _layout_read(t, offset):
    """What decides which elements a view with given strides reads of `t`:
    the size and stride of each dim of more than one element, and where
    `offset`, the storage offset."""
    return (tuple((n, st) for n, st in zip(t.shape, t.stride()) if n != 1),
            t.storage_offset() if offset else 0)


_LIKE_TEMPLATE = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like",
                  "randn_like", "randint_like", "new_empty", "new_empty_strided", "new_zeros",
                  "new_ones", "new_full"}


def _set_arg(call, args, kwargs, name, value):
    schema = call.target._schema
    for i, a in enumerate(schema.arguments):
        if a.name == name:
            if name in kwargs or i >= len(args):
                kwargs[name] = value
            else:
                args[i] = value
            return
    raise PlanExecutionError(f"operator {call.target} has no argument '{name}'")


def _off_device(t):
    """A copy of `t`'s values that the device's allocator does not hold: a
    NumPy array for a CPU tensor (through an integer view of its bits, which
    NumPy reads for any float type), a CPU tensor for a GPU's."""
    if t.device.type != "cpu":
        return t.detach().to("cpu", copy=True)
    return t.detach().view(_SAME_SIZE_INT[t.element_size()]).numpy().copy()


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _restore_statistics(out, kept):
    """Writes the values _keep_statistics kept into the remade copy `out`,
    made as the first was (the same layout), without allocating on its
    device."""
    for shape, stride, offset, values in kept:
        view = out.detach().as_strided(shape, stride, offset)
        if isinstance(values, torch.Tensor):
            view.copy_(values)
        else:
            view.view(_SAME_SIZE_INT[view.element_size()]).copy_(torch.from_numpy(values))


def _rng_state(device):
    """The generator's state as Python bytes: held outside PyTorch's
    allocator (a CPU generator's state is a 5056-byte tensor, which the CPU
    device's allocator would count while a plan keeps it; its copy here is
    freed at once, before the call)."""
    state = torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()
    return state.numpy().tobytes()


def _set_rng_state(device, state):
    """Puts back a state of _rng_state, through a tensor over its bytes (no
    allocation)."""
    tensor = torch.frombuffer(bytearray(state), dtype=torch.uint8)
    if device.type == "cuda":
        torch.cuda.set_rng_state(tensor, device)
    else:
        torch.set_rng_state(tensor)
