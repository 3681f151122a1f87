"""The traced step as a pebble graph: one node per tensor the step makes.

_capture.py gives a functional graph of ATen calls (torch.fx). Here each
call becomes pebble nodes, with sizes from a pass over fake tensors (or
real ones, where a shape depends on the data):

- a persistent node for each parameter, buffer, input, the target and each
  constant of the trace;
- a node for each tensor a call makes. A call with several tensor outputs
  (batch norm's output and statistics, a convolution's three gradients)
  makes one node per output the step uses: a gradient call that takes an
  output mask is run with a mask of that one output; another call is run
  whole and keeps one output (Node.group: the executor keeps its siblings
  where the plan computes them next);
- a view (a transpose, a reshape that shares its input's memory, a slice,
  split's pieces) is an alias of its input's storage (pebble's `alias_of`):
  it holds no memory and keeps its base's alive. Which outputs are views is
  observed, not looked up: a view shares its input's storage;
- detach and alias calls are their input;
- an in-place call on a fresh tensor that nothing else reads (dropout's
  `bernoulli_` on `empty_like`) runs as part of the call that made the
  tensor (Node.fold);
- `*_like` factories read only their template's shape and dtype: they are
  computed from a meta tensor, and do not keep the template alive;
- a `copy_` into a buffer (functionalization's write-back of batch-norm
  counters) is a buffer update: its value is an output of the graph, copied
  into the buffer after the step;
- random calls are chained by order tokens (Note [Random calls in eager's
  order]);
- a call kept for its effect alone reads into the loss through a token
  (Note [Calls kept for their effects]).

Note [Random calls in eager's order]: eager PyTorch draws from the generator
in its program order, so a plan must first run the random calls in that
order (a recomputation replays the state the first run saw). A node
`order:<call>` of no bytes reads each random call's first output, and the
next random call reads the token: every policy then orders the draws as
eager does, and holding a token costs nothing. Tokens also join layers that
a chain policy (rotor, sqrtn) would cut apart, so the graph is planned
without them first, and with them only where that plan draws out of order
(document(order_tokens=...)).

Note [Reads around running statistics]: a training batch norm writes its
running statistics in place (PyTorch 1.13's schema does not say so), so a
call that reads their storage (the buffers, a view of them, or the repeated
copy that nn.InstanceNorm with track_running_stats updates and then
averages back) sees another value before the batch norm than after it. The
graph's edges do not say which: a plan that put such a read on the other
side of the batch norm silently gave other statistics or another loss
(InstanceNorm's stayed one step behind under dtr, rotor, greedy; a loss
reading running_mean before and after its batch norm was wrong under dfs,
exact, checkmate), until 2026-12-05. Tokens of no bytes order them as the
trace does: a read before the batch norm is read by it through a token,
and one after reads the batch norm's token. They are order tokens, planned
as Note [Random calls in eager's order] says; a plan that still reads them
on the wrong side (a read recomputed after the batch norm) is refused
(statistics_read_out_of_order, _executor.py).

Note [Calls kept for their effects]: eager PyTorch runs every call of the
forward, also those whose values the loss does not read (an auxiliary head
left out of the loss, a diagnostic output). Most are pure, and the step
leaves them out (_capture._remove_unused_calls); two kinds act beyond their
value: a random call advances the generator (the next draw, in this step or
the caller's, depends on it), and a training batch norm writes its running
statistics. Such a call is kept with what it reads, and a token of no bytes
(kind "order", `effect`) reads its first output and is read by the loss, so
that every plan runs it once before the loss, as eager does, and frees its
output at once; the token is in every document, with or without the order
tokens. (Before, such a head's statistics stayed as they were, and an unread
dropout before the loss's shifted the loss's masks: another loss.)
"""

import operator

import torch

from ._capture import TEMPLATE_CALLS, CaptureError, resized_buffer_message
from ._collective_ops import is_mean_over_ranks
from ._compat import op_name, storage_bytes, storage_key
from ._memory import round_up

# Calls that are their input.
_IDENTITY = {"detach", "alias", "lift_fresh"}
# Calls that update their running-statistics arguments in place though
# their schema (PyTorch 1.13) does not say so.
_STATS_IN_PLACE = {"native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm"}
# Calls whose bookkeeping outputs (1 and on) the kernel shapes otherwise than
# PyTorch's fake tensors: the CPU's _embedding_bag leaves offset2bag empty in
# "sum" mode and gives max_indices a bag's shape in "sum" and "mean", where
# the meta function does the reverse. Calibration measures what they hold.
_KERNEL_SHAPED = {"_embedding_bag", "_embedding_bag_forward_only"}
# Normalizations whose statistics (outputs 1 and on), and whose backwards'
# gradients, the CPU's kernels keep in the input's half-precision dtype,
# where the fake ones may be float32.
_HALF_STATS_ON_CPU = {"native_batch_norm", "native_layer_norm", "native_group_norm",
                      "native_batch_norm_backward", "native_layer_norm_backward",
                      "native_group_norm_backward"}
# Random calls where the operator's tags cannot tell (PyTorch before 1.13).
_RANDOM = {"bernoulli", "bernoulli_", "native_dropout", "rand", "randn", "rand_like",
           "randn_like", "randint", "randint_like", "randperm", "normal", "normal_", "uniform_",
           "exponential_", "geometric_", "log_normal_", "cauchy_", "random_", "multinomial",
           "poisson", "rrelu_with_noise", "_fused_dropout", "_standard_gamma", "binomial"}


def is_random(target):
    tags = getattr(target, "tags", ())
    if any(getattr(t, "name", "") == "nondeterministic_seeded" for t in tags):
        return True
    return op_name(target) in _RANDOM


def has_effects(n):
    """Whether eager runs fx call `n` for more than its value: a draw
    advances the generator, a training batch norm writes its running
    statistics (PyTorch 1.13's schema does not say so). Note [Calls kept for
    their effects]."""
    return is_random(n.target) or (op_name(n.target) in _STATS_IN_PLACE and
                                    _stats_updated(n))


def _schema(target):
    return getattr(target, "_schema", None)


def _written_args(target):
    """Names of the arguments the call writes (alias annotations with '!')."""
    schema = _schema(target)
    if schema is None:
        return []
    return [a.name for a in schema.arguments
            if a.alias_info is not None and a.alias_info.is_write]


def _has_output_mask(target):
    schema = _schema(target)
    return schema is not None and any(a.name == "output_mask" for a in schema.arguments)


# Note [CTC's table at its bound]. aten._ctc_loss returns, beside the loss,
# the table of its forward variables (log_alpha), which its backward reads:
# (batch, time, 2 * L + 1) for L the longest target of the batch, read from
# target_lengths' values. So two batches of the same shapes whose longest
# targets differ make tables of other shapes, which a plan (one shape per
# node) cannot hold: the second batch failed ("the shape depends on the
# values"), and PyTorch 1.13's fake kernel gives width 1. Where the targets
# are padded (batch, S), no target is longer than S: the capture holds the
# table at its bound, width 2 * S + 1, and the step pads the kernel's table
# to it (-inf, a probability of 0), handing the backward the kernel's own
# columns (ctc_backward_table): the plan holds the most any batch of these
# shapes needs, and each batch computes as eager's. Targets concatenated
# in one dimension bound it by their total length, quadratic in the batch:
# those keep the kernel's width, and a batch whose longest target differs
# is refused as before.


def ctc_table_at_bound(table, targets):
    """CTC's table `table` (a real, fake or meta tensor) widened to its
    bound where `targets` is padded (2-D), with -inf in the columns added;
    as it is otherwise."""
    if not isinstance(targets, torch.Tensor) or targets.dim() != 2:
        return table
    width = 2 * targets.shape[1] + 1
    if table.shape[-1] == width:
        return table
    bounded = table.new_full(tuple(table.shape[:-1]) + (width,), float("-inf"))
    bounded[..., :table.shape[-1]] = table
    return bounded


def ctc_backward_table(table, target_lengths):
    """The columns of CTC's table (at its bound) that the kernel made for
    these targets: the view the backward reads, as it would read the
    kernel's own table."""
    width = 2 * int(target_lengths.max()) + 1 if target_lengths.numel() else 1
    return table if width >= table.shape[-1] else table[..., :width]


def _arg(node, name, position):
    """An argument of an fx call by schema name or position."""
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[position] if position < len(node.args) else None


def _arg_position(target, name):
    schema = _schema(target)
    for i, a in enumerate(schema.arguments):
        if a.name == name:
            return i
    raise KeyError(name)


class Node:
    """One pebble node. `kind`: "persistent", "op" (a call's fresh output),
    "view" (an alias of `alias_of`'s storage), "accumulate" (adds its first
    input into its second, a parameter's .grad, in place: no bytes), "order"
    (a token of no bytes: Note [Random calls in eager's order], and Note
    [Calls kept for their effects] where `effect`)."""

    def __init__(self, index, id_, kind, fx=None, out_index=None):
        self.index = index
        self.id = id_
        self.kind = kind
        self.fx = fx              # the call (None for a persistent node)
        self.out_index = out_index  # which output of the call (None: the call's value)
        self.inputs = []          # node indices the call reads, in argument order
        self.alias_of = None      # the node whose storage a view shares
        self.fold = []            # in-place calls applied after fx, in order
        self.mask = None          # the one-hot output mask a gradient call runs with
        self.group = None         # fx call shared with sibling nodes (several outputs)
        self.random = False
        self.updates_stats = False  # writes running statistics (batch norm, PyTorch 1.13)
        self.effect = False       # a token that keeps a call for its effect
        self.empty_when_run = False  # the kernel may return it empty (eval batch norm's stats)
        # Its shape and dtype are the kernel's, not the capture's
        # (_KERNEL_SHAPED, _HALF_STATS_ON_CPU).
        self.kernel_shaped = False
        self.slot = None          # persistent: the Slot
        self.constant = None      # persistent: a constant tensor of the trace
        self.value = None         # fake (or real) tensor of the node's output
        self.nbytes = 0           # storage bytes (a view: its logical bytes)
        self.role = None
        # Bytes the computation holds beside the output: the call's other
        # outputs while it runs whole, and the kernel's own temporaries
        # (measured at calibration).
        self.other_outputs_bytes = 0
        self.temporary_bytes = 0

    @property
    def workspace_bytes(self):
        return self.other_outputs_bytes + self.temporary_bytes

    @property
    def op(self):
        if self.kind == "persistent":
            return self.role
        if self.kind == "accumulate":
            return "accumulate_grad"
        if self.kind == "order":
            return "rng_order"
        name = str(self.fx.target)
        if self.out_index is not None:
            name += f"[{self.out_index}]"
        return name

    @property
    def shape(self):
        return tuple(self.value.shape)

    @property
    def dtype(self):
        return self.value.dtype

    def __repr__(self):
        return f"Node({self.id}, {self.kind}, {self.op})"


class StepGraph:
    """The pebble graph of a traced step and how each node is computed."""

    def __init__(self, traced, values, accumulate=(), round_to=1, device=None):
        """accumulate: ids of parameters whose .grad holds a tensor: their
        gradient is added into it in place as soon as it is made (as autograd
        does), by a node `acc:<id>`; the others' gradients are outputs that
        become their .grad. round_to: the allocator's granularity (bytes;
        CUDA's caching allocator rounds every block up to 512). device: the
        step's device; an output a kernel leaves on another one (attention's
        random-number seed and offset stay on the host) holds none of its
        memory and counts no bytes."""
        self.accumulate = set(accumulate)
        self.round_to = round_to
        self.device = torch.device(device) if device is not None else None
        self.traced = traced
        self.gm = traced.gm
        self.values = values  # fx node -> its fake (or real) output
        self.nodes = []
        self._taken = set()   # the nodes' ids
        self.refs = {}        # (fx node, output index or None) -> Node
        self.loss = None
        self.grad_norm = None  # the gradients' norm before clipping, where clipped
        self.grads = []       # (Slot, Node)
        # (Slot, Node): a clipped step's gradient as the backward makes it,
        # whose average the clipping reads, on several ranks (Note [Clipping
        # the averaged gradients] in _capture.py)
        self.unclipped = []
        self.updates = []     # (Slot, Node): buffer <- node after the step
        self.readers = {}     # fx node -> number of calls that read it
        self.accumulators = []  # (Slot, Node of the .grad, Node acc)
        self.kernel_shaped = {}  # fx call -> its nodes whose shape is the kernel's
        self._build()

    # --- building -------------------------------------------------------------

    def _add(self, id_, kind, fx=None, out_index=None):
        # A call's fx name may be a parameter's or buffer's ("mean", "t"),
        # whose ids come first and stay: the call's becomes "call:mean".
        unique, k = id_, 0
        while unique in self._taken:
            if kind not in ("op", "view"):
                raise CaptureError(f"internal: two nodes named '{id_}'")
            k += 1
            unique = f"call:{id_}" if k == 1 else f"call:{id_}:{k}"
        self._taken.add(unique)
        node = Node(len(self.nodes), unique, kind, fx, out_index)
        self.nodes.append(node)
        return node

    def storage_root(self, node):
        """The node whose storage `node` shares (itself where it is no view)."""
        while node.alias_of is not None:
            node = self.nodes[node.alias_of]
        return node

    def _ref(self, a):
        """The node an fx argument stands for."""
        if a.op == "call_function" and a.target is operator.getitem:
            key = (a.args[0], a.args[1])
        else:
            key = (a, None)
        node = self.refs.get(key)
        if node is None:
            raise CaptureError(f"internal: no node for {a.name}")
        return node

    def _tensor_args(self, call):
        """Nodes a call reads, in argument order, leaving out templates."""
        like = op_name(call.target) in TEMPLATE_CALLS
        out = []
        first = True

        def visit(a):
            nonlocal first
            if isinstance(a, torch.fx.Node):
                if like and first:
                    first = False
                    return
                first = False
                out.append(self._ref(a))
            elif isinstance(a, (list, tuple)):
                for b in a:
                    visit(b)
        for a in call.args:
            visit(a)
        for a in call.kwargs.values():
            visit(a)
        return out

    def _build(self):
        gm = self.gm
        for n in gm.graph.nodes:
            for a in n.all_input_nodes:
                self.readers[a] = self.readers.get(a, 0) + 1
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for slot, n in zip(self.traced.slots, placeholders):
            node = self._add(slot.id, "persistent")
            node.slot = slot
            node.value = self.values[n]
            node.nbytes = _persistent_bytes(node.value)
            node.role = {"parameter": "parameter", "buffer": "buffer"}.get(slot.kind, "input")
            self.refs[(n, None)] = node
        constants = {}  # attribute -> its node (the trace may fetch one twice)
        for n in gm.graph.nodes:
            if n.op == "get_attr":
                node = constants.get(n.target)
                if node is None:
                    node = constants[n.target] = self._add(f"constant:{n.target}",
                                                           "persistent")
                    node.constant = getattr(gm, n.target)
                    node.value = self.values[n]
                    node.nbytes = _persistent_bytes(node.value)
                    node.role = "buffer"
                self.refs[(n, None)] = node
            elif n.op == "call_function" and n.target is not operator.getitem:
                self._call(n)
            elif n.op == "output":
                self._outputs(n)
        self._accumulators()
        self._keep_effects()
        self._order_random_calls()
        self._order_statistics_reads()
        self._roles()
        self._ids()
        if self.round_to > 1:
            for node in self.nodes:
                if node.kind != "view":
                    node.nbytes = round_up(node.nbytes, self.round_to)

    def _call(self, n):
        name = op_name(n.target)
        value = self.values[n]
        if name == "_ctc_loss":  # Note [CTC's table at its bound]
            value = self.values[n] = (value[0], ctc_table_at_bound(value[1],
                                                                   self.values.get(n.args[1])))
        if name in _IDENTITY:
            self.refs[(n, None)] = self._ref(n.args[0])
            return
        if is_mean_over_ranks(n.target):  # the plan's all-reduce averages its input
            gradient = self.refs[(n, None)] = self._ref(n.args[0])
            slot = self.traced.grad_slots[n.args[2]]
            if gradient.kind == "persistent" or any(g is gradient for _, g in self.unclipped):
                raise CaptureError(f"internal: the gradient of '{slot.id}' cannot be "
                                   "averaged in place")
            self.unclipped.append((slot, gradient))
            return
        if name == "rrelu_with_noise" and _arg(n, "training", 4):
            # (its schema in PyTorch 1.13 does not say that it writes
            # `noise`, which its backward reads: a plan that freed and made
            # the noise again would hand the backward an empty tensor)
            raise CaptureError("nn.RReLU in training mode (aten.rrelu_with_noise) writes its "
                               "random slopes into a tensor that its backward reads: "
                               "pebble.torch cannot plan it (LeakyReLU, or RReLU in eval "
                               "mode, can be)")
        written = _written_args(n.target)
        if written:
            self._in_place(n, written)
            return
        inputs = self._tensor_args(n)
        if isinstance(value, torch.Tensor):
            self._output(n, None, value, inputs)
            return
        if not isinstance(value, (tuple, list)):
            raise CaptureError(f"operator {n.target} returns {type(value).__name__}, which "
                               "pebble.torch cannot plan")
        used = sorted({u.args[1] for u in n.users if u.target is operator.getitem})
        if not used and has_effects(n):
            used = [0]  # Note [Calls kept for their effects]
        masked = _has_output_mask(n.target)
        # In eval mode cuDNN's, MIOpen's and the CPU's kernels return the
        # saved statistics (outputs 1 and on) empty, where the meta functions
        # give their full shape: they hold no memory. CUDA's native kernel
        # fills them (the running statistics' copies): counted.
        eval_stats = name in _STATS_IN_PLACE and not _arg(n, "training", 5)
        empty_stats = eval_stats and (name != "native_batch_norm" or
                                      value[0].device.type == "cpu")

        def held(j, v):
            return 0 if empty_stats and j > 0 else self._device_bytes(v)

        siblings = []
        for k in used:
            element = value[k]
            if not isinstance(element, torch.Tensor):
                raise CaptureError(f"operator {n.target} returns {type(element).__name__} as "
                                   f"output {k}, which pebble.torch cannot plan")
            node = self._output(n, k, element, inputs)
            node.kernel_shaped = (k > 0 and name in _KERNEL_SHAPED) or (
                (k > 0 or name.endswith("_backward")) and name in _HALF_STATS_ON_CPU and
                element.device.type == "cpu" and any(
                    isinstance(u.value, torch.Tensor) and
                    u.value.dtype in (torch.bfloat16, torch.float16) for u in inputs))
            if node.kernel_shaped:
                self.kernel_shaped.setdefault(n, []).append(node)
            if eval_stats and k > 0:
                node.empty_when_run = True  # (the executor's check takes both)
                if empty_stats:
                    node.nbytes = 0
            if node.kind == "op":
                if masked:
                    node.mask = [i == k for i in range(len(value))]
                else:
                    siblings.append(node)
                    node.other_outputs_bytes = sum(
                        held(j, v) for j, v in enumerate(value)
                        if j != k and isinstance(v, torch.Tensor) and
                        self._shared_input(v, inputs) is None)
        if len(siblings) > 1:
            for node in siblings:
                node.group = n
        if name in _STATS_IN_PLACE and _stats_updated(n):
            for node in self.nodes:
                if node.fx is n:
                    node.updates_stats = True

    def _output(self, n, k, value, inputs):
        """The node of output k (None: the value) of call n."""
        if value.layout != torch.strided:
            raise CaptureError(f"operator {n.target} makes a {value.layout} tensor (a sparse "
                               "gradient: nn.Embedding or nn.EmbeddingBag with sparse=True?), "
                               "which pebble.torch cannot plan: give sparse=False")
        # (a constant's copy: PyTorch 1.13's fake lift_fresh_copy returns the
        # fake constant itself, where the kernel makes a copy)
        base = None if op_name(n.target) == "lift_fresh_copy" else \
            self._shared_input(value, inputs)
        node = self._add(n.name if k is None else _getitem_name(n, k),
                         "view" if base is not None else "op", n, k)
        node.inputs = inputs
        node.value = value
        node.random = is_random(n.target)
        if base is not None:
            node.alias_of = base.index
            node.nbytes = value.numel() * value.element_size() if self._on_device(value) else 0
        else:
            node.nbytes = self._device_bytes(value)
        self.refs[(n, k)] = node
        return node

    def _on_device(self, value):
        return self.device is None or value.device.type == self.device.type

    def _device_bytes(self, value):
        """The bytes of value's storage in the step device's memory."""
        return storage_bytes(value) if self._on_device(value) else 0

    def _shared_input(self, value, inputs):
        """The input whose storage `value` shares, or None (a fresh output)."""
        if value.numel() == 0 and storage_bytes(value) == 0:
            return None
        key = storage_key(value)
        for node in inputs:
            if node.value is not None and storage_key(node.value) == key:
                return node
        return None

    def _in_place(self, n, written):
        """An in-place call: a write-back into a buffer, or a step of the call
        that made a fresh tensor nothing else reads."""
        position = _arg_position(n.target, written[0])
        target_fx = _arg(n, written[0], position)
        if len(written) != 1 or not isinstance(target_fx, torch.fx.Node):
            raise CaptureError(f"operator {n.target} writes {', '.join(written)}: "
                               "pebble.torch cannot plan it")
        target = self._ref(target_fx)
        if target.kind == "persistent":
            if op_name(n.target) == "copy_" and target.slot is not None and \
                    target.slot.kind == "buffer":
                value = self._ref(n.args[1])
                self.updates.append((target.slot, value))
                self.refs[(n, None)] = value
                return
            kind = target.slot.kind if target.slot else None
            what = {"input": "an input", "target": "the target", "parameter": "a parameter",
                    "buffer": "a buffer"}.get(kind, "a constant")
            if kind == "parameter" and not target.slot.trainable:
                raise CaptureError(f"the step writes a frozen parameter in place "
                                   f"('{target.id}', by {n.target}: a momentum encoder's "
                                   "average, say): pebble.torch cannot plan a step that changes "
                                   "what it is given; update it outside the step, under "
                                   "torch.no_grad(), before or after the call")
            if kind == "buffer" and op_name(n.target).startswith("resize"):
                raise CaptureError(resized_buffer_message(target.id, n.target))
            if kind == "buffer":
                raise CaptureError(f"the step writes buffer '{target.id}' in place by "
                                   f"{n.target}: pebble.torch takes a buffer's new value where "
                                   "the forward copies it in (self.b.copy_(new)) or binds it "
                                   "(self.b = new), as batch norm does; write the update so")
            raise CaptureError(f"the step writes {what} in place ('{target.id}', by "
                               f"{n.target}: x.clamp_(...) on an argument, say): pebble.torch "
                               "cannot plan a step that changes what it is given; use the "
                               "out-of-place form (x = x.clamp(...))")
        if target.kind != "op" or self.readers.get(target_fx, 0) != 1 or \
                target.out_index is not None:
            raise CaptureError(f"operator {n.target} writes in place into a tensor that other "
                               f"operations read ('{target.id}'): pebble.torch cannot plan it")
        target.fold.append(n)
        target.random = target.random or is_random(n.target)
        for extra in self._tensor_args(n):
            if extra is not target and extra not in target.inputs:
                target.inputs.append(extra)
        self.refs[(n, None)] = target

    def _outputs(self, n):
        flat = n.args[0]
        if isinstance(flat, (tuple, list)) and len(flat) == 1 and \
                isinstance(flat[0], (tuple, list)):
            flat = flat[0]
        flat = list(flat)
        self.loss = self._ref(flat[0])
        n_grads = len(self.traced.grad_slots)
        for slot, g in zip(self.traced.grad_slots, flat[1:1 + n_grads]):
            self.grads.append((slot, self._ref(g)))
        if len(flat) > 1 + n_grads:  # clipped (_capture._clipped): the norm last
            self.grad_norm = self._ref(flat[1 + n_grads])

    # Note [A gradient added into .grad]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # Where a parameter's .grad holds a tensor before the step (gradient
    # accumulation; PyTorch 1.13's zero_grad() leaves zeros), autograd adds
    # each gradient into it the moment it is made, and frees the gradient.
    # The step's node that does so is an in-place write of the .grad (pebble's
    # in-place node, as an optimizer's update is), so the planners run it as
    # soon as it may and free the gradient after it (Note [Updates early] in
    # scheduler/updates_last.cc). As a plain alias of the .grad that reads the
    # gradient besides, the gradient was kept to the step's end: every
    # gradient held twice (6 Linear layers of 256: 1.59 MB planned at `min`
    # under every policy where eager's step peaks at 292 KB; found 2026-12-04).
    def _accumulators(self):
        """.grad += gradient, in place, for the parameters in `accumulate`."""
        kept = []
        for slot, g in self.grads:
            if slot.id not in self.accumulate:
                kept.append((slot, g))
                continue
            grad = self._add(f"{slot.id}.grad", "persistent")
            grad.slot = slot
            grad.value = g.value  # shape and dtype of the parameter's gradient
            grad.nbytes = _persistent_bytes(slot.tensor)
            grad.role = "gradient"
            # The sum is the .grad itself (an alias of its storage, updated in
            # place), named as a gradient is: the optimizer's update reads it.
            acc = self._add(f"acc:{slot.id}", "accumulate")
            acc.inputs = [g, grad]
            acc.value = grad.value
            acc.alias_of = grad.index
            acc.nbytes = grad.nbytes
            self.accumulators.append((slot, grad, acc))
        self.grads = kept
        # Each addition next after its gradient in the graph's own order, as
        # autograd runs it: the unplanned step (calibration's measured
        # reference of a percentage budget) and baseline free the gradient
        # there, not at the step's end (a reference of 3.2 MB on that MLP,
        # eleven times eager's, until 2026-12-04).
        added = {id(acc) for _, _, acc in self.accumulators}
        after, late = {}, []
        for _, _, acc in self.accumulators:
            if after.setdefault(acc.inputs[0].index, acc) is not acc:
                late.append(acc)  # (a gradient added into two .grads: the second last)
        if after:
            self.nodes = [n for n in self.nodes if id(n) not in added] + late
            self._place(after)

    def _keep_effects(self):
        """Note [Calls kept for their effects]: a token read by the loss for
        each call with an effect that no output needs."""
        if self.loss.kind not in ("op", "view"):
            return  # (a loss the step does not compute: nothing runs before it)
        needed = self.ancestors([n.index for n in self.outputs()])
        after = {}
        for node in reversed(self.nodes):
            if node.kind not in ("op", "view") or node.index in needed or \
                    not (node.random or node.updates_stats):
                continue
            token = Node(-1, f"effect:{node.id}", "order")
            token.effect = True
            token.inputs = [node]
            token.fx = node.fx
            after[node.index] = token
            self.loss.inputs = self.loss.inputs + [token]  # siblings may share one list
            needed |= self.ancestors([node.index])
        if after:
            self._place(after)

    def _order_random_calls(self):
        """Note [Random calls in eager's order]: a token after each random call
        but the last, read by the next one; the nodes are then put in a
        topological order that keeps the trace's where it can (each token
        right after the node it reads) and numbered again."""
        position = {n: i for i, n in enumerate(self.gm.graph.nodes)}

        def draw_position(node):  # where the call draws: itself or a folded call
            calls = [c for c in [node.fx] + node.fold if is_random(c.target)]
            return position[calls[0]] if calls else position[node.fx]

        firsts, by_call = [], {}
        for node in self.nodes:
            if node.kind in ("op", "view") and node.random:
                call = node.group or node.fx
                if call not in by_call:
                    by_call[call] = []
                    firsts.append(node)
                by_call[call].append(node)
        if len(firsts) < 2:
            return
        firsts.sort(key=draw_position)
        after = {}
        for a, b in zip(firsts, firsts[1:]):
            token = Node(-1, f"order:{a.id}", "order")
            token.inputs = [a]
            token.fx = a.fx
            after[a.index] = token
            for node in by_call[b.group or b.fx]:
                node.inputs = node.inputs + [token]  # siblings may share one list
        self._place(after)

    def statistics_reads(self):
        """Note [Reads around running statistics]: per training batch norm
        call that updates running statistics, (its nodes, the calls that
        read those statistics' storage before it in the trace, those that
        read it after), each call as its first node; only where one reads
        them. Found once (the nodes it names stay as tokens are placed)."""
        if getattr(self, "_statistics_reads", None) is not None:
            return self._statistics_reads
        position = {n: i for i, n in enumerate(self.gm.graph.nodes)}

        def root(node):
            return self.storage_root(node).index

        by_call = {}
        for node in self.nodes:
            if node.kind in ("op", "view") and node.updates_stats:
                by_call.setdefault(node.fx, []).append(node)
        found = []
        for call, nodes in by_call.items():
            roots = {root(self._ref(a)) for a in call.args[3:5] if isinstance(a, torch.fx.Node)}
            before, after, seen = [], [], set()
            for node in self.nodes:
                if node.kind != "op" or node.fx is call or node.index in roots or \
                        node.fx in seen or \
                        not any(u.kind != "order" and root(u) in roots for u in node.inputs):
                    continue
                seen.add(node.fx)
                (before if position[node.fx] < position[call] else after).append(node)
            if before or after:
                found.append((nodes, before, after))
        self._statistics_reads = found
        return found

    def _order_statistics_reads(self):
        """Note [Reads around running statistics]: order tokens that make a
        call reading a batch norm's running statistics before it in the
        trace run before it, and one reading them after run after it."""
        after = {}

        def token_after(node):
            if node.index not in after:
                token = Node(-1, f"order:{node.id}:statistics", "order")
                token.inputs = [node]
                token.fx = node.fx
                after[node.index] = token
            return after[node.index]

        for nodes, before, later in self.statistics_reads():
            for reader in before:
                token = token_after(reader)
                for node in nodes:
                    node.inputs = node.inputs + [token]  # siblings may share one list
            if later:
                token = token_after(nodes[0])
                for reader in later:
                    for node in self.nodes:
                        if node.fx is reader.fx and node.kind == "op":
                            node.inputs = node.inputs + [token]
        if after:
            self._place(after)

    def _place(self, after):
        """self.nodes with the nodes of `after` (node index -> a node that
        reads it, not in self.nodes: a new token, an addition into a .grad),
        each listed after its node, then in a topological order that keeps
        the listed one where it can, numbered again."""
        listed = []
        for node in self.nodes:
            listed.append(node)
            if node.index in after:
                listed.append(after[node.index])
        by_index = {node.index: node for node in self.nodes}
        self.nodes = []
        placed = set()

        def place(node):  # depth first: what it reads, then itself
            stack = [(node, False)]
            while stack:
                n, ready = stack.pop()
                if id(n) in placed:
                    continue
                if ready:
                    placed.add(id(n))
                    self.nodes.append(n)
                    continue
                stack.append((n, True))
                reads = list(n.inputs)
                if n.alias_of is not None:
                    reads.append(by_index[n.alias_of])
                stack.extend((u, False) for u in reversed(reads) if id(u) not in placed)
        for node in listed:
            place(node)
        renumbered = {node.index: k for k, node in enumerate(self.nodes) if node.index >= 0}
        for node in self.nodes:
            if node.alias_of is not None:
                node.alias_of = renumbered[node.alias_of]
        for k, node in enumerate(self.nodes):
            node.index = k

    def ancestors(self, roots):
        """Indices of `roots` and of every node they read, directly or not
        (a view reads its base)."""
        found, stack = set(), list(roots)
        while stack:
            i = stack.pop()
            if i in found:
                continue
            found.add(i)
            node = self.nodes[i]
            stack.extend(u.index for u in node.inputs)
            if node.alias_of is not None:
                stack.append(node.alias_of)
        return found

    def _roles(self):
        """Forward: the loss and what it reads; backward: the rest."""
        forward = self.ancestors([self.loss.index])
        for node in self.nodes:
            if node.kind != "persistent":
                node.role = "forward" if node.index in forward else "backward"

    def _ids(self):
        """The loss is `loss`, a gradient `grad:<parameter>`, a buffer's new
        value `new:<buffer>`, the gradients' norm before clipping
        `grad_norm`; other nodes keep their fx names."""
        special = {self.loss.index: "loss"}
        if self.grad_norm is not None:
            special.setdefault(self.grad_norm.index, "grad_norm")
        for slot, node in self.unclipped:
            special.setdefault(node.index, f"unclipped_grad:{slot.id}")
        for slot, node in self.grads:
            special.setdefault(node.index, f"grad:{slot.id}")
        for slot, _, acc in self.accumulators:
            special.setdefault(acc.index, f"grad:{slot.id}")
        for slot, node in self.updates:
            special.setdefault(node.index, f"new:{slot.id}")
        taken = {n.id for n in self.nodes}
        for i, new_id in special.items():
            node = self.nodes[i]
            if node.kind == "persistent" or node.id == new_id:
                continue
            if new_id in taken:
                raise CaptureError(f"internal: two nodes named '{new_id}'")
            taken.discard(node.id)
            node.id = new_id
            taken.add(new_id)

    # --- the pebble graph -----------------------------------------------------

    def backward_gradients(self):
        """(Slot, Node) of each parameter's gradient as the backward makes it:
        the unclipped one where a clipped step on several ranks has it, else
        the step's output (the simulator's BackwardGradient)."""
        unclipped = {slot.id: node for slot, node in self.unclipped}
        return [(slot, unclipped.get(slot.id, node)) for slot, node in self.grads]

    @property
    def unclipped_indices(self):
        return {node.index for _, node in self.unclipped}

    def outputs(self):
        """Nodes that must be resident when the step ends."""
        out = [self.loss] + [n for _, n in self.grads] + [n for _, n in self.updates] + \
            [acc for _, _, acc in self.accumulators] + \
            ([self.grad_norm] if self.grad_norm is not None else [])
        seen, unique = set(), []
        for n in out:
            if n.index not in seen:
                seen.add(n.index)
                unique.append(n)
        return unique

    @property
    def has_order_tokens(self):
        return any(node.kind == "order" and not node.effect for node in self.nodes)

    def document(self, costs, name, order_tokens=True):
        """The pebble-graph JSON document; `costs` by node index (seconds).
        order_tokens: with the tokens that order random calls (Note [Random
        calls in eager's order]); without, a schedule of the document runs
        as well, but may draw out of eager's order."""
        nodes = []
        for node in self.nodes:
            if node.kind == "order" and not node.effect and not order_tokens:
                continue
            doc = {"id": node.id, "op": node.op, "bytes": int(node.nbytes)}
            if node.kind == "persistent":
                doc["persistent"] = True
            else:
                doc["cost"] = float(costs.get(node.index, 0.0))
                doc["inputs"] = [self.nodes[u.index].id for u in node.inputs
                                 if order_tokens or u.kind != "order" or u.effect]
                if node.alias_of is not None:
                    doc["alias_of"] = self.nodes[node.alias_of].id
                    if doc["alias_of"] not in doc["inputs"]:
                        doc["inputs"].append(doc["alias_of"])
                if node.workspace_bytes:
                    doc["workspace"] = int(node.workspace_bytes)
                if node.kind == "accumulate":
                    # Note [A gradient added into .grad]
                    doc["in_place"] = True
            # An existing .grad is persistent state of the step: pebble's
            # "buffer" role.
            doc["role"] = "buffer" if node.role == "gradient" else node.role
            if node.kind != "order":
                doc["attrs"] = {"shape": list(node.shape), "dtype": str(node.dtype).replace(
                    "torch.", "")}
            nodes.append(doc)
        return {"format": "pebble-graph", "version": 1, "name": name, "nodes": nodes,
                "outputs": [n.id for n in self.outputs()]}


def _getitem_name(n, k):
    for u in n.users:
        if u.target is operator.getitem and u.args[1] == k:
            return u.name
    return f"{n.name}.{k}"


def _stats_updated(n):
    """Whether a batch-norm call updates running statistics: training, with them."""
    training = _arg(n, "training", 5)
    return bool(training) and isinstance(_arg(n, "running_mean", 3), torch.fx.Node)


def _persistent_bytes(t):
    """A persistent tensor's bytes: its own elements (a parameter may view a
    larger flat buffer, which other parameters share)."""
    return t.numel() * t.element_size()
