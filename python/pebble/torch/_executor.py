"""Runs a pebble schedule with PyTorch's operators.

Device memory holds exactly the tensors the schedule holds: `compute v` runs
v's kernel (_kernels.py) on its resident inputs, `free v` drops the tensor,
`offload v` copies it to a host buffer (pinned, on a side CUDA stream with an
event, on a GPU; a separate tensor on the CPU) and `prefetch v` copies it
back. Every computed tensor owns its storage, exactly its bytes, except an
alias (a view, SPEC section 1): `compute v` of an alias views its base's
storage with v's shape (a contiguous reshape; no kernel, no memory). So the
measured peak (the executors' rule: the largest sum of the resident
storages' bytes, each once, the output counted with its inputs) is the
memory the step held.
"""

import time

import torch

from ._kernels import KERNELS
from ._memory import storage_of


class PlanExecutionError(RuntimeError):
    """A kernel's output does not match its node (a bug), or a step is impossible."""


class BatchNormState:
    """The running statistics one batchnorm_stats node updates, as the module's
    forward does: once per step, on the node's first computation. Built with
    the buffers' state_dict() keys; `bind` finds them at each step."""

    def __init__(self, mean_key, var_key, counter_key, momentum, eps):
        self.keys = (mean_key, var_key, counter_key)
        self.momentum = momentum
        self.eps = eps
        self.running_mean = self.running_var = self.num_batches_tracked = None
        self.pending = False

    def bind(self, state):
        """The module's buffers (a state_dict(keep_vars=True)), for one step."""
        mean_key, var_key, counter_key = self.keys
        self.running_mean = state[mean_key].detach()
        self.running_var = state[var_key].detach()
        counter = state.get(counter_key) if counter_key else None
        self.num_batches_tracked = counter.detach() if counter is not None else None
        self.pending = True


def _nbytes(t):
    return t.numel() * t.element_size()


# The ops an alias may have: the bytes of its base in the same order, so a
# view of a contiguous tensor (runtime/executor.cc runs the same ones).
VIEW_OPS = frozenset({"reshape", "flatten", "squeeze", "unsqueeze", "identity", "view"})


class StepResult:
    """What one run measured."""

    def __init__(self):
        self.outputs = {}
        self.peak_bytes = 0
        self.transfer_bytes = 0
        self.host_peak_bytes = 0
        self.computes = 0
        self.recomputations = 0
        self.time_s = 0.0


class Program:
    """A schedule compiled against a graph's nodes; `run` executes it."""

    COMPUTE, FREE, OFFLOAD, PREFETCH = range(4)
    _ACTIONS = {"compute": COMPUTE, "free": FREE, "offload": OFFLOAD, "prefetch": PREFETCH}

    def __init__(self, nodes, schedule, outputs, device, workspace, streams=None):
        """`streams`: the module whose Stream, Event, stream, current_stream
        and synchronize order the copies (torch.cuda on a GPU; a test may
        give a stand-in to check the ordering on the CPU)."""
        self.nodes = nodes
        self.device = device
        self.workspace = workspace  # node index -> bytes (the graph's `workspace`)
        index = {n.id: n.index for n in nodes}
        self.outputs = [index[o] for o in outputs]
        # Views: node index -> the index of its base, and of its storage root.
        self.base = {n.index: index[n.alias_of] for n in nodes if n.alias_of is not None}
        self.root = list(range(len(nodes)))
        for n in nodes:
            i = n.index
            while i in self.base:
                i = self.base[i]
            self.root[n.index] = i
        for i in self.base:
            node = nodes[i]
            if node.op not in VIEW_OPS:
                raise PlanExecutionError(f"node '{node.id}' (op {node.op}) is an alias that "
                                         "pebble.torch cannot run as a view of its base's "
                                         "memory (only contiguous reshapes)")
        self.steps = []
        for action, node_id in schedule:
            kind = self._ACTIONS.get(action)
            if kind is None:
                raise PlanExecutionError(f"unknown schedule action '{action}'")
            node = nodes[index[node_id]]
            if kind == self.COMPUTE and node.index not in self.base and node.op not in KERNELS:
                raise PlanExecutionError(f"node '{node.id}': operator '{node.op}' has no "
                                         "PyTorch kernel in pebble.torch")
            inputs = tuple(index[i] for i in node.inputs) if kind == self.COMPUTE else ()
            self.steps.append((kind, node, inputs))
        self.streams = streams if streams is not None else (
            torch.cuda if device.type == "cuda" else None)
        self.cuda = self.streams is not None  # copies on a side stream, ordered by events
        self.copy_stream = self.streams.Stream(device) if self.cuda else None
        # node index -> its host copy (pinned on a GPU), made once and kept
        # between steps: the plan's host memory.
        self.host = {}
        for kind, node, _ in self.steps:
            if kind == self.OFFLOAD and node.index not in self.host:
                self.host[node.index] = torch.empty(node.shape, dtype=node.dtype, device="cpu",
                                                    pin_memory=device.type == "cuda")

    def run(self, persistent):
        """Executes the schedule; `persistent` maps node index -> tensor (the
        parameters, buffers, inputs and target, resident throughout)."""
        state = _RunState(self, persistent)
        handlers = {self.COMPUTE: state.compute, self.FREE: state.free,
                    self.OFFLOAD: state.offload, self.PREFETCH: state.prefetch}
        start = time.perf_counter()
        # Each handler returns before the next step: no tensor outlives its
        # `free` in a local variable.
        for kind, node, inputs in self.steps:
            handlers[kind](node, inputs)
        state.finish()
        result = state.result
        result.time_s = time.perf_counter() - start
        result.recomputations = result.computes - len(state.computed)
        result.outputs = {self.nodes[o].id: state.live[o] for o in self.outputs}
        return result

    @staticmethod
    def _checked(node, out, args):
        """The output as a tensor of its own storage, of the node's shape and dtype."""
        if not isinstance(out, torch.Tensor):
            raise PlanExecutionError(f"node '{node.id}' (op {node.op}): the kernel returned "
                                     f"{type(out).__name__}")
        if node.shape is not None and tuple(out.shape) != node.shape:
            raise PlanExecutionError(f"node '{node.id}' (op {node.op}): PyTorch computed shape "
                                     f"{tuple(out.shape)}, the graph says {node.shape}")
        if node.dtype is not None and out.dtype != node.dtype:
            raise PlanExecutionError(f"node '{node.id}' (op {node.op}): PyTorch computed "
                                     f"{out.dtype}, the graph says {node.dtype}")
        shares = any(isinstance(a, torch.Tensor) and a.numel() and out.numel() and
                     a.data_ptr() == out.data_ptr() for a in args)
        if (shares or not out.is_contiguous() or out.storage_offset() != 0 or
                storage_of(out).nbytes() != _nbytes(out)):
            out = out.clone(memory_format=torch.contiguous_format)
        return out


class _RunState:
    """One run: the resident tensors, the byte count and, on CUDA, the events
    a tensor's users wait for (a prefetch's end before a read, an offload's
    end before the device copy is dropped)."""

    def __init__(self, program, persistent):
        self.program = program
        self.result = StepResult()
        self.live = [None] * len(program.nodes)
        # Per storage root: the nodes holding it (itself and its views) and
        # its bytes; a storage counts while it has a holder.
        self.holders = [0] * len(program.nodes)
        self.storage_bytes = [0] * len(program.nodes)
        for i, t in persistent.items():
            self.live[i] = t
            self.holders[i] = 1
            self.storage_bytes[i] = _nbytes(t)
        self.resident = sum(_nbytes(t) for t in persistent.values())
        self.result.peak_bytes = self.resident
        self.host_bytes = 0
        self.on_host = set()
        self.computed = set()
        self.ready, self.offloaded = {}, {}
        self.cuda = program.cuda
        self.streams = program.streams
        self.stream = self.streams.current_stream(program.device) if self.cuda else None

    def _hold(self, i, t, workspace=0):
        self.live[i] = t
        self.holders[i] = 1
        self.storage_bytes[i] = _nbytes(t)
        self.resident += _nbytes(t)
        self.result.peak_bytes = max(self.result.peak_bytes, self.resident + workspace)

    def _view(self, node):
        """`compute` of an alias: its base's tensor viewed with its shape."""
        base = self.live[self.program.base[node.index]]
        try:
            out = base.view(node.shape)
        except RuntimeError as e:
            raise PlanExecutionError(f"node '{node.id}' (op {node.op}): cannot view its base "
                                     f"{tuple(base.shape)} as {node.shape}: "
                                     f"{str(e).strip().splitlines()[0]}") from e
        if node.dtype is not None and out.dtype != node.dtype:
            raise PlanExecutionError(f"node '{node.id}' (op {node.op}): a view of {out.dtype} "
                                     f"data, the graph says {node.dtype}")
        self.live[node.index] = out
        self.holders[self.program.root[node.index]] += 1
        self.result.computes += 1
        self.computed.add(node.index)

    def compute(self, node, inputs):
        if self.cuda:
            for u in inputs:
                event = self.ready.pop(u, None)
                if event is not None:
                    self.stream.wait_event(event)
        if node.index in self.program.base:
            self._view(node)
            return
        args = [self.live[u] for u in inputs]
        try:
            out = KERNELS[node.op](node, args)
        except (RuntimeError, IndexError, ValueError) as e:  # PyTorch's own refusal (a
            # dtype its kernel lacks, a class index out of range, ...)
            raise PlanExecutionError(f"node '{node.id}' (op {node.op}): PyTorch's kernel "
                                     f"failed: {str(e).strip().splitlines()[0]}") from e
        out = Program._checked(node, out, args)
        self._hold(node.index, out, self.program.workspace.get(node.index, 0))
        self.result.computes += 1
        self.computed.add(node.index)

    def free(self, node, _inputs):
        i = node.index
        if self.cuda:
            for pending in (self.offloaded, self.ready):
                event = pending.pop(i, None)
                if event is not None:
                    self.stream.wait_event(event)
        if self.live[i] is None:
            raise PlanExecutionError(f"the schedule frees '{node.id}', which is not resident")
        self.live[i] = None
        root = self.program.root[i]
        self.holders[root] -= 1
        if self.holders[root] == 0:  # its last holder: the storage goes
            self.resident -= self.storage_bytes[root]

    def offload(self, node, _inputs):
        t = self.live[node.index]
        event = self._copy(self.program.host[node.index], t)
        if event is not None:
            self.offloaded[node.index] = event
        if node.index not in self.on_host:  # the host set holds each node once
            self.on_host.add(node.index)
            self.host_bytes += _nbytes(t)
            self.result.host_peak_bytes = max(self.result.host_peak_bytes, self.host_bytes)
        self.result.transfer_bytes += _nbytes(t)

    def prefetch(self, node, _inputs):
        buffer = self.program.host[node.index]
        t = torch.empty(buffer.shape, dtype=buffer.dtype, device=self.program.device)
        event = self._copy(t, buffer)
        if event is not None:
            self.ready[node.index] = event
        self._hold(node.index, t)
        self.result.transfer_bytes += _nbytes(t)

    def _copy(self, dst, src):
        """dst <- src. On a GPU on the side stream, after the work enqueued on
        the compute stream so far (the producer of an offloaded tensor; the
        last readers of memory a prefetch reuses); returns the copy's event."""
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
        if self.cuda:
            for event in list(self.ready.values()) + list(self.offloaded.values()):
                self.stream.wait_event(event)
            self.streams.synchronize(self.program.device)
