"""The optimizer's step under the plan (docs/torch.md, "The optimizer in the plan").

train_step(..., optimizer=opt) plans the whole step: pebble.with_optimizer
adds the optimizer's state (persistent) and its updates (in place, run last,
after every gradient is complete) to the captured graph. The updates run in
the plan's order with PyTorch's in-place operators on the module's
parameters and on the state kept in opt.state, in torch.optim's own format,
so opt.state_dict() stays loadable. Each follows torch.optim's
single-tensor SGD and Adam of PyTorch 1.13 operation by operation; an
operation that needs a temporary of the parameter's size (Adam's
denominator, a coupled weight decay) is the update node's workspace in the
plan, so the allocator's peak is the plan's.

With optimizer_state="host" the state's home is the host (pinned memory
beside a GPU), and with "auto" the plan chooses per tensor (Note [State
placement] in scheduler/state_placement.cc). The plan's steps say where
each state tensor lives (Placement): on the host where its first step is a
prefetch or an update on the host. opt.state holds those on the host
between steps. A device update streams them (Note [Updates last] in
scheduler/updates_last.cc): a device copy made where the plan prefetches
it, updated in place, copied back where the plan offloads it and dropped
where it frees it. A state tensor whose home is the device may be streamed
through the host for an update there (the plan offloads and frees it, and
fetches it back): it is copied into a host buffer made before the step,
opt.state holds that buffer while the device copy is freed, and the fetched
copy once the plan fetches it back.

With optimizer_updates="host" every update runs on the host, ZeRO-Offload's
rule, and with "auto" the plan chooses per parameter (Note [Updates on the
host], Note [Update placement]). An update on the host runs the same
operations on the CPU, on the host copies the plan made of the gradient and
the parameter (the program's offloads) and on the state in opt.state, its
temporaries in a host scratch buffer made before the step; the plan then
frees the parameter's device storage and fetches the updated copy back
(the program rebinds the module's parameter: Note [Steps of the
optimizer] in _executor.py). The plan may run such updates early, as soon
as a gradient is complete, while the backward goes on.
"""

import copy
import functools
import json
import math
import numbers
import time

import torch

from .. import _core
from ._compat import storage_bytes, storage_key
from ._memory import allocated_where_profiled, round_up

_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


class OptimizerError(ValueError):
    """An optimizer that pebble.torch cannot plan (the message says why)."""


_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_ITEM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
# Parameter dtypes that pebble's graph format has no name for, with their
# bytes per element: Note [Updates of float64 parameters].
_UNNAMED_ITEM_BYTES = {"float64": 8}

# Each optimizer's update ops, in their order, and how many tensors each
# reads and writes as the host cost model counts them (its output and
# tensor operands: graph/optimizer.cc).
_OPS_OF = {"sgd": ("sgd_momentum", "sgd_update"),
           "adam": ("adam_exp_avg", "adam_exp_avg_sq", "adam_update"),
           "adamw": ("adam_exp_avg", "adam_exp_avg_sq", "adam_update")}
# The update ops whose rule (_update) takes a held scalar as an operand.
_SCALAR_OPERAND = ("sgd_momentum", "adam_exp_avg", "adam_exp_avg_sq", "adam_update")
_TENSORS_MOVED = {"sgd_momentum": 4, "sgd_update": 3, "adam_exp_avg": 4,
                  "adam_exp_avg_sq": 4, "adam_update": 4}
# This process's measured host rates (bytes per second), by kind of rule:
# Updates.measure_host_rate.
_HOST_RATES = {}


def check_choices(state, updates, gradients, parameters):
    """ValueError, naming the argument, for a placement of train_step's that
    is not among those it takes (None: the default of state and gradients)."""
    if state not in (None, "device", "host", "auto"):
        raise ValueError(f"optimizer_state must be 'device', 'host' or 'auto', not {state!r}")
    if updates not in ("device", "host", "auto"):
        raise ValueError(f"optimizer_updates must be 'device', 'host' or 'auto', not "
                         f"{updates!r}")
    if gradients not in (None, "keep", "drop"):
        raise ValueError(f"optimizer_gradients must be 'keep' or 'drop', not {gradients!r}")
    if parameters not in ("device", "host", "auto"):
        raise ValueError(f"optimizer_parameters must be 'device', 'host' or 'auto', not "
                         f"{parameters!r}")


def _check_options(optimizer, state, updates, gradients, parameters, max_grad_norm):
    """TypeError or ValueError, naming the argument, for train_step's
    optimizer arguments that are not among those it takes, or that conflict."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, not "
                        f"{type(optimizer).__name__}")
    check_choices(state, updates, gradients, parameters)
    if max_grad_norm is not None and (
            isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, numbers.Real)
            or not math.isfinite(max_grad_norm) or max_grad_norm <= 0):
        raise ValueError(f"max_grad_norm must be a positive finite number, not "
                         f"{max_grad_norm!r}")
    if state in ("host", "auto") and type(optimizer) is torch.optim.SGD and \
            not any(group.get("momentum") for group in optimizer.param_groups):
        raise ValueError(f"optimizer_state={state!r}, but SGD without momentum keeps no "
                         "state: leave optimizer_state out, or give the SGD (or a parameter "
                         "group) momentum")
    if updates == "auto" and state == "device":
        # (as the command line's optimizer spec: updates=host with state=device
        # is planned, each update moving its state out and back)
        raise ValueError("optimizer_updates='auto' with optimizer_state='device' is not "
                         "planned (an update placed on the host would move its state out and "
                         "back each step): give optimizer_state='host' or 'auto', or leave it "
                         "out (the host)")


def _graph_spec(kind, groups, state, updates, gradients, parameters):
    """pebble's optimizer spec ("adam:lr=0.001,...,state=host") for the plan's
    graph: the first group's settings (the groups differ in numbers only, which
    the updates read per parameter); SGD's momentum the largest of the groups'
    (its buffers: extend takes them out of the groups with none, Note [SGD
    groups without momentum])."""
    spec = dict(groups[0])
    if kind == "sgd":
        spec["momentum"] = max(group["momentum"] for group in groups)
    text = kind + ":" + ",".join(f"{k}={float(v)!r}" for k, v in spec.items() if k != "decoupled")
    if state is not None and (state != "device" or updates != "device"):
        text += f",state={state}"  # (the spec's default with updates on the host: the host)
    if updates != "device":
        text += f",updates={updates}"
    if gradients == "drop":
        text += ",gradients=drop"
    if parameters != "device":
        text += f",parameters={parameters}"
    return text


def _planned_parameters(optimizer, model):
    """{name: parameter} of `model`'s trainable parameters, each of which
    `optimizer` must hold; OptimizerError where one is missing, or where the
    optimizer holds a tensor that is not the module's (frozen parameters may
    be in it: torch.optim skips them, having no .grad)."""
    in_optimizer = set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) in in_optimizer:
                name = next((n for n, q in model.named_parameters() if q is p), "?")
                raise OptimizerError(
                    f"the optimizer holds parameter '{name}' twice (a tied weight listed "
                    "through both of its modules?): eager torch.optim would update it twice a "
                    "step, and warns that this will be an error; list each parameter once")
            in_optimizer.add(id(p))
    params = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) not in in_optimizer:
            raise OptimizerError(f"parameter '{name}' is trainable but not in the "
                                 "optimizer: pebble plans one optimizer for every "
                                 "trainable parameter")
        params[name] = p
    extra = in_optimizer - {id(p) for p in model.parameters()}
    if extra:
        raise OptimizerError(f"the optimizer holds {len(extra)} tensor(s) that are not "
                             "parameters of the module")
    return params


class Updates:
    """A torch.optim optimizer as pebble's optimizer step of a module, and
    the runner of its steps in a plan (Note [Steps of the optimizer])."""

    def __init__(self, optimizer, model, state=None, updates="device", gradients="keep",
                 parameters="device", max_grad_norm=None, grad_norm_type=2.0):
        _check_options(optimizer, state, updates, gradients, parameters, max_grad_norm)
        # The gradients' total norm is clipped to this in the captured step
        # (_capture._clipped); None: not clipped. The norm: a p-norm's p, or
        # math.inf (clip_grad_norm_'s norm_type).
        self.max_grad_norm = None if max_grad_norm is None else float(max_grad_norm)
        self.grad_norm_type = _norm_type(grad_norm_type)
        self.optimizer = optimizer
        # The graph's spec takes the first group's settings: the groups differ
        # in numbers only (_settings), which the updates read per parameter
        # (settings_of) and the plan's graph does not depend on, but for the
        # temporaries of a coupled weight decay, which extend() gives each
        # update node as its own parameter's group decides.
        self.kind, groups = _settings(optimizer)
        self.settings = groups[0]
        self.spec = _graph_spec(self.kind, groups, state, updates, gradients, parameters)
        self._spec_on_device = _graph_spec(self.kind, groups, None, "device", "keep", "device")
        self.parameters = parameters  # the parameters' home: device, host or auto
        self.device = None  # the step's device (TrainStep's), once known
        self.on_host = updates != "device"  # whether some update may run on the host
        self.keep_gradients = gradients == "keep"
        # The host's rate for an update's host_cost (bytes read and written
        # per second): pebble's default until measure_host_rate measures it.
        self.host_bytes_per_s = _core.DEFAULT_HOST_BYTES_PER_S
        self.ops = {}  # node id -> op of the optimizer's nodes (extend)
        # Update node id -> the ids it reads, and the storages it touches
        # (its inputs' and its own, as the graph's alias_of chains say).
        self.inputs, self.touches = {}, {}
        # The plan's bytes of the state that may be resident (home device or
        # auto: what a budget is framed with), and of each update's
        # workspace and each state tensor by node id (extend): the graph's,
        # rounded as the capture rounds every tensor.
        self.planned_state_bytes = 0
        self.workspace_bytes = {}
        self.state_bytes = {}
        self.on_device = {}  # streamed state node id -> its device copy, during a run
        # State node id -> its host buffer, for the state whose home is the
        # device that the plan offloads (ensure_state).
        self._host_copies = {}
        self._offloaded = False
        # The bytes of the state whose home is the host (ensure_state), held
        # there from a run's start; counted in the run's host peak as it
        # begins, with each host copy above the first time it is made
        # current, as the plan's host peak counts them.
        self._host_homes, self._host_home_bytes = frozenset(), 0
        # Note [Plans of other captures]. Updates is the step's, one for
        # every capture (a signature: shapes, the parameters that require
        # grad), and extend() makes state_bytes and workspace_bytes anew
        # for each. A run reads those of its own plan (its Placement's,
        # which ensure_state takes before it): a plan of an earlier capture,
        # run again when a frozen layer is trainable again, streams state
        # that the latest capture has not (until 2026-12-06 that failed,
        # "the plan prefetchs 'momentum_buffer:0.weight'", at every call).
        self._run_placement = None
        self._copies_counted = set()
        self._host_scratch = {}  # dtype -> flat host buffer for host updates' temporaries
        # Note [Scalars without allocations]: a Python number as an operand
        # (x.mul_(0.9)) makes a small CPU tensor on each call, outside the
        # plan (the CPU device's profiler counts it); a held CPU 0-dim tensor,
        # filled in place, takes the same path through ATen (a CPU scalar,
        # read in the operation's precision) without one. On the CPU device a
        # tensor of another dtype (bfloat16) has the scalar cast to its dtype
        # all the same (the kernel reads the float32 value), a 0-dim tensor
        # that the update's workspace holds (_scalar_cast_bytes). A host
        # update reads a held scalar of its parameter's dtype where the CPU's
        # operators round the float32 one to it anyway (_scalar_for): its
        # cast, a host temporary, would land in the CPU device's allocator.
        self._scalar = torch.zeros(())
        self._scalar64 = torch.zeros((), dtype=torch.float64)  # Note [Updates of float64 ...]
        self._scalars = {}  # dtype -> the held scalar of host updates (_scalar_for)
        self._one = torch.ones(())  # Adam's step count is a CPU tensor
        self.params = _planned_parameters(optimizer, model)  # name -> trainable parameter
        self._name = {p: name for name, p in self.params.items()}
        self._settings_of = _settings_by_name(optimizer, groups, self.params)
        if self.on_host:
            self._check_host_updates()
            # (made now: a step allocates nothing outside its plan, and the
            # probe allocates)
            for dtype in {p.dtype for p in self.params.values()} & {torch.bfloat16, torch.float16}:
                if _cpu_rounds_scalars(dtype):
                    self._scalars[dtype] = torch.zeros((), dtype=dtype)
        if self.on_host or parameters != "device":
            self._check_storages_apart(
                "optimizer_updates" if self.on_host else "optimizer_parameters")

    def rebind(self, replaced):
        """The parameters in `replaced` ({id(old): new}) are new objects (a
        module built in shards: Note [A module built in shards]): in the
        optimizer's param_groups and here. Their optimizer state, if any, is
        refused before (build_in_shards: a module on the meta device has taken
        no step)."""
        for group in self.optimizer.param_groups:
            group["params"] = [replaced.get(id(p), p) for p in group["params"]]
        for name, p in list(self.params.items()):
            self.params[name] = replaced.get(id(p), p)
        self._name = {p: name for name, p in self.params.items()}
        # (_settings_of is by name: the new objects keep their groups' settings)

    def settings_of(self, node_id):
        """The settings of the group whose parameter the update or state node
        `node_id` is of (the first group's for Adam's step count)."""
        if ":" not in node_id:
            return self.settings
        return self._settings_of[_parameter_of(node_id)]

    def _check_storages_apart(self, option):
        """OptimizerError where two trainable parameters share memory
        (nn.Parameter(a.weight.data) beside a.weight, or of a slice of it):
        an update on the host, or a parameter kept there, moves or frees one
        of them apart from the other, which then reads or writes what is no
        longer the first (both trained wrong, silently, until 2026-12-05).
        Views of one flat buffer that do not overlap are fine. `option`: what
        placed them so."""
        ranges = {}  # storage -> [(first byte, end byte, name)]
        for name, p in self.params.items():
            start = p.storage_offset() * p.element_size()
            end = start + max(1, sum((n - 1) * st for n, st in zip(p.shape, p.stride())) + 1) \
                * p.element_size() if p.numel() else start
            held = ranges.setdefault(storage_key(p), [])
            other = next((o for a, b, o in held if a < end and start < b), None)
            if other is not None:
                raise OptimizerError(
                    f"parameters '{other}' and '{name}' share memory (one made of the other's "
                    f".data, or of a slice of it): with {option} other than 'device' one is "
                    "moved to the host or freed apart from the other. Give "
                    f"{option}='device', or tie them as one parameter (assign the same "
                    "nn.Parameter to both modules)")
            held.append((start, end, name))

    def _check_host_updates(self):
        """OptimizerError where an update could not run on the host: a
        parameter that shares its storage (the plan frees a parameter's
        storage for its update, which would free nothing there), or a dtype
        this PyTorch has no CPU kernel of the update for (float16 in 1.13)."""
        for name, p in self.params.items():
            if p.storage_offset() != 0 or storage_bytes(p) != p.numel() * p.element_size():
                raise OptimizerError(f"parameter '{name}' is a view of a larger storage (a "
                                     "flattened parameter buffer): its update cannot run on "
                                     "the host, which frees the parameter's storage meanwhile; "
                                     "give optimizer_updates='device'")
        for dtype in {p.dtype for p in self.params.values()}:
            one = torch.ones(2, dtype=dtype)
            try:
                for op in _OPS_OF[self.kind]:
                    state = {"momentum_buffer": one.clone(), "exp_avg": one.clone(),
                             "exp_avg_sq": one.clone(), "step": torch.zeros(())}
                    _update(op, self.kind, dict(self.settings, momentum=0.9), one.clone(),
                            one.clone(), state, lambda: torch.empty(2, dtype=dtype),
                            torch.zeros(()).fill_, torch.ones(()))
            except RuntimeError as e:
                raise OptimizerError(
                    f"updates on the host: PyTorch {torch.__version__} cannot run "
                    f"{type(self.optimizer).__name__}'s update of {dtype} tensors on the CPU "
                    f"({str(e).splitlines()[0]}); give optimizer_updates='device'") from None

    # --- the graph ----------------------------------------------------------------

    def extend(self, graph, round_to=1):
        """`graph` (a captured training graph) with the optimizer's step, each
        update's temporaries as its workspace. round_to: the allocator's
        granularity, to which the capture rounded every tensor's bytes (512
        on a GPU): the optimizer's tensors are rounded alike. The step's
        bookkeeping of its nodes (ops, inputs, state and workspace bytes)
        becomes this graph's."""
        doc = self._whole_step_document(graph, self.spec, round_to)
        self.planned_state_bytes = 0
        self.workspace_bytes, self.state_bytes = {}, {}
        alias_of = {node["id"]: node.get("alias_of") for node in doc["nodes"]}

        def storage(node_id):
            while alias_of.get(node_id) is not None:
                node_id = alias_of[node_id]
            return node_id
        for node in doc["nodes"]:
            # (the optimizer's nodes, graph/optimizer.h: each update's role
            # is "update", and Updates._run runs it by its op)
            if node.get("role") in ("update", "optimizer_state"):
                self.ops[node["id"]] = node["op"]
            if node.get("role") == "update":
                self.inputs[node["id"]] = frozenset(node["inputs"])
                self.touches[node["id"]] = frozenset(map(storage, node["inputs"] + [node["id"]]))
                if node.get("workspace"):
                    self.workspace_bytes[node["id"]] = node["workspace"]
            if node.get("role") == "optimizer_state":
                self.state_bytes[node["id"]] = node["bytes"]
                if node.get("home") != "host":
                    self.planned_state_bytes += node["bytes"]
        return _core.from_json(json.dumps(doc))

    def extend_on_device(self, graph, round_to=1):
        """extend's graph with eager's placement, whatever the step's: the
        state, the updates, the gradients and the parameters on the device
        (a percentage budget's reference: the unplanned step). The step's
        bookkeeping is left as it is."""
        return _core.from_json(json.dumps(
            self._whole_step_document(graph, self._spec_on_device, round_to)))

    def _whole_step_document(self, graph, spec, round_to):
        """The graph document of `graph` with the optimizer's step of `spec`
        (_graph_spec), each update's temporaries as its workspace, the
        optimizer's tensors rounded to `round_to`."""
        # The parameters' shapes and dtypes, which the optimizer's nodes take
        # (the capture keeps them in attrs).
        doc = json.loads(graph.to_json())
        for node in doc["nodes"]:
            # A .grad kept from before the step, of a parameter the optimizer updates.
            kept = node["id"][:-len(".grad")] if node.get("persistent") and \
                node["id"].endswith(".grad") else None
            if kept in self.params and self.max_grad_norm is not None:
                raise OptimizerError(
                    f"parameter '{kept}' has a .grad from before the "
                    "step, which the step would add to after clipping its own gradient, "
                    "where clip_grad_norm_ clips the sum: clear the gradients with "
                    "optimizer.zero_grad(set_to_none=True) (PyTorch 1.13's zero_grad() "
                    "keeps zero tensors) to train with max_grad_norm")
            if kept in self.params and (self.on_host or not self.keep_gradients):
                raise OptimizerError(
                    f"parameter '{kept}' has a .grad from before the "
                    "step, which the step adds to: an update on the host reads a host copy "
                    "of its gradient, and a dropped gradient leaves the device, but pebble "
                    "plans neither for a .grad that lives across steps; clear the gradients "
                    "with optimizer.zero_grad(set_to_none=True) (PyTorch 1.13's zero_grad() "
                    "keeps zero tensors)" + (
                        "" if self.parameters != "device" else  # (they drop the gradients)
                        ", or give optimizer_updates='device' and optimizer_gradients='keep'"))
            if node.get("role") != "parameter" or node["id"] not in self.params:
                continue  # a frozen parameter takes no update
            attrs = node.get("attrs") or {}
            torch_dtype = attrs.get("dtype")
            dtype = _DTYPES.get(torch_dtype)
            if dtype is None and torch_dtype not in _UNNAMED_ITEM_BYTES:
                raise OptimizerError(f"parameter '{node['id']}' is {torch_dtype}: "
                                     "pebble's optimizer step takes float32, float64, "
                                     "float16 and bfloat16 parameters")
            # The tensor's own bytes, which its shape holds (rounded again below).
            node["shape"] = attrs["shape"]
            if dtype is None:  # Note [Updates of float64 parameters]
                node["bytes"] = math.prod(attrs["shape"]) * _UNNAMED_ITEM_BYTES[torch_dtype]
            else:
                node["dtype"] = dtype
                node["bytes"] = math.prod(attrs["shape"]) * _ITEM_BYTES[dtype]
        graph = _core.from_json(json.dumps(doc))
        doc = json.loads(_core.with_optimizer(
            graph, spec, host_bytes_per_s=self.host_bytes_per_s).to_json())
        self._without_momentum(doc)
        if round_to > 1:
            _round_bytes(doc, round_to)
        for node in doc["nodes"]:
            if node.get("role") == "update":
                settings = self.settings_of(node["id"])
                attrs = node.get("attrs")
                if attrs and node["op"] != "optimizer_step":  # (the graph's: the first group's)
                    attrs.update({k: v for k, v in settings.items() if k in attrs})
                workspace = (round_up(node["bytes"], round_to)
                             if _temporary(node["op"], settings) else 0)
                workspace += self._scalar_cast_bytes(node)
                if workspace:
                    node["workspace"] = workspace
        return doc

    def _without_momentum(self, doc):
        """The graph document `doc` without the momentum buffers (and their
        updates) of parameters whose SGD group has momentum 0, each update
        reading its gradient instead (Note [SGD groups without momentum])."""
        plain = {name for name in self.params
                 if self.kind == "sgd" and self._settings_of[name]["momentum"] == 0}
        dropped = {f"momentum_buffer:{name}{suffix}" for name in plain for suffix in ("", "#1")}
        if not dropped.intersection(n["id"] for n in doc["nodes"]):
            return
        doc["nodes"] = [n for n in doc["nodes"] if n["id"] not in dropped]
        for node in doc["nodes"]:
            if node["id"].startswith("update:") and node["id"][len("update:"):] in plain:
                name = node["id"][len("update:"):]
                node["inputs"] = [f"grad:{name}" if i == f"momentum_buffer:{name}#1" else i
                                  for i in node["inputs"]]
        doc["outputs"] = [o for o in doc.get("outputs", []) if o not in dropped]

    def _scalar_for(self, dtype, on_host):
        """The held scalar an update of a `dtype` parameter reads (Note
        [Scalars without allocations]): float64's own, else float32's, but
        for a host update of a bfloat16 or float16 parameter where the CPU's
        operators round a float32 scalar to that dtype before they read it
        (_cpu_rounds_scalars): one of that dtype then gives the same bits
        without the cast. The cast's element is a host temporary, which on
        the CPU device lands in the allocator the step is measured by."""
        if dtype == torch.float64:
            return self._scalar64
        return self._scalars.get(dtype, self._scalar) if on_host else self._scalar

    def _scalar_cast_bytes(self, node):
        """The bytes of the update node's cast of a held scalar (Note [Scalars
        without allocations]): one element of its dtype where the rule
        (_update) takes a scalar operand and the step's device is the CPU,
        whose operators cast a CPU scalar of another dtype (a GPU's read it
        as it is)."""
        dtype = node.get("dtype")
        if dtype is None or dtype == "fp32" or node["op"] not in _SCALAR_OPERAND or \
                self.device is None or self.device.type != "cpu":
            return 0
        return _ITEM_BYTES[dtype]

    def measure_host_rate(self, repeat=3):
        """Measures host_bytes_per_s: the bytes per second this machine's CPU
        reads and writes in one parameter's updates, as pebble's host cost
        model counts them (each update's output and tensor operands: twelve
        tensors for Adam's three updates, seven for SGD's two), the best of
        `repeat` runs on float32 tensors of 2**22 elements (16 MiB each):
        larger than most caches, as the gradients, parameters and state of
        a step are when their updates read them. A rate is a property of the
        machine: it is measured once per process for each kind of rule
        (optimizer, momentum or not, weight decay or not) and reused."""
        settings = self.settings
        ops = tuple(op for op in _OPS_OF[self.kind]
                    if op != "sgd_momentum" or settings.get("momentum", 0) > 0)
        key = (self.kind, ops, settings["weight_decay"] != 0, repeat)
        if key not in _HOST_RATES:
            _HOST_RATES[key] = self._timed_host_rate(ops, repeat)
        self.host_bytes_per_s = _HOST_RATES[key]
        return self.host_bytes_per_s

    def _timed_host_rate(self, ops, repeat):
        """measure_host_rate's measurement: bytes per second of `ops`."""
        numel = 2 ** 22
        # Distinct normal values: the rules' arithmetic costs the same on any
        # (random draws of this size took longer than the updates timed).
        g, p, m, v, b = (torch.full((numel,), value) for value in (0.1, 0.5, 0.2, 0.3, 0.4))
        state = {"momentum_buffer": b, "exp_avg": m, "exp_avg_sq": v, "step": torch.zeros(())}
        counted = sum(_TENSORS_MOVED[op] for op in ops) * numel * 4
        scratch = torch.empty(numel)
        best = math.inf
        for _ in range(repeat + 1):  # the first warms the caches
            started = time.perf_counter()
            for op in ops:
                _update(op, self.kind, self.settings, p, g, state, lambda: scratch,
                        self._scalar.fill_, self._one)
            best = min(best, time.perf_counter() - started)
        return counted / max(best, 1e-9)

    def owns(self, node_id):
        """Whether `node_id` is one of the optimizer's nodes (state, updates)."""
        return node_id in self.ops

    def placement(self, schedule):
        """Where the plan `schedule` keeps the state and runs the updates."""
        return Placement(self, schedule)

    # --- the state ----------------------------------------------------------------

    @property
    def state_keys(self):
        """The entries of some parameter's state that hold a tensor of its
        shape (torch.optim's names)."""
        return tuple(dict.fromkeys(key for name in self.params
                                   for key in self.state_keys_of(name)))

    def state_keys_of(self, name):
        """The entries of parameter `name`'s state that hold a tensor of its
        shape: SGD's momentum buffer where its group has momentum."""
        if self.kind == "sgd":
            return ("momentum_buffer",) if self._settings_of[name]["momentum"] > 0 else ()
        return ("exp_avg", "exp_avg_sq")

    def take_state_shapes(self, like=None, cut=None):
        """Each entry of the state (state_keys) in the shape the step keeps it:
        `like`'s (ensure_state's), where `cut(name, t)` makes it of an entry
        `t` of the parameter's own shape (a whole state loaded into a sharded
        step's optimizer: this rank's shard of it); OptimizerError, naming the
        entry, where one is of neither shape. Nothing is made or moved. Every
        call checks it first (TrainStep._state_refusal): ensure_state takes
        the shapes as they are."""
        state = self.optimizer.state
        for name, p in self.params.items():
            s = state.get(p)
            if not s:
                continue
            template = like[name] if like is not None and name in like else p
            step = s.get("step")
            if self.kind != "sgd" and step is not None and not torch.is_tensor(step):
                # (eager's step fails on it too: AttributeError on add_)
                raise OptimizerError(
                    f"the optimizer's state of '{name}' holds step={step!r} "
                    f"({type(step).__name__}): torch.optim's {self.kind} keeps a tensor "
                    "(torch.tensor(float(step)))")
            if self.kind != "sgd" and step is not None and not step.is_floating_point():
                if step.dtype in _INTEGER_DTYPES:
                    # (a count saved as an integer tensor: eager 1.13 adds to it as it
                    # is; 2.x loads it as float32, as this does, the same count)
                    s["step"] = step.detach().to(torch.float32)
                else:
                    raise OptimizerError(
                        f"the optimizer's state of '{name}' holds step={step!r}: torch.optim's "
                        f"{self.kind} keeps its count of steps as a float32 tensor")
            for key in self.state_keys_of(name):
                t = s.get(key)
                if t is not None and (not torch.is_tensor(t) or t.dtype != template.dtype):
                    # (eager fails in ATen's internal assert on another dtype)
                    what = (f"a {str(t.dtype).replace('torch.', '')} tensor"
                            if torch.is_tensor(t) else f"a {type(t).__name__}")
                    raise OptimizerError(
                        f"the optimizer's state '{key}' of '{name}' is {what}, its parameter "
                        f"{str(template.dtype).replace('torch.', '')}: torch.optim keeps the "
                        "state in the parameter's dtype")
                if t is None or t.shape == template.shape:
                    continue
                made = cut(name, t) if cut is not None else None
                if made is None:
                    raise OptimizerError(_state_shape_error(name, key, t, template,
                                                            sharded=cut is not None))
                s[key] = made

    def ensure_state(self, placement, like=None):
        """Every parameter's state in opt.state, as torch.optim makes it on its
        first step (zeros; Adam's step count 0), where it is not there yet:
        made before the step, it is held before the step as the plan holds
        it (persistent): on the device, or on the host (pinned beside a GPU)
        where the plan keeps it there (`placement`); a tensor moves where
        the plan of these shapes wants it (state a loaded state_dict put on
        the device, say). A momentum buffer starts at zeros: momentum 0 + g
        is the copy of g that torch.optim makes. The host updates' scratch
        buffer is made here too, outside the step. `like`: parameter name ->
        the tensor its state is shaped as where that is not the parameter
        (its shard, in a sharded step), as take_state_shapes left it. A
        parameter that the plan does not update (the loss does not reach it:
        no gradient) gets none, as torch.optim skips a parameter without a
        .grad."""
        state = self.optimizer.state
        for name, p in self.params.items():
            if name not in placement.updated_parameters:
                continue
            s = state[p]
            template = like[name] if like is not None and name in like else p
            if self.kind != "sgd" and "step" not in s:
                s["step"] = torch.tensor(0.0)
            if self.kind == "sgd" and not self.state_keys_of(name) and \
                    _sgd_keeps_none_buffers():
                s.setdefault("momentum_buffer", None)  # as this PyTorch's SGD leaves it
            for key in self.state_keys_of(name):
                on_host = f"{key}:{name}" in placement.host_state
                if s.get(key) is None:  # (made where it lives: on the host, not the device)
                    s[key] = torch.zeros_like(template, memory_format=torch.preserve_format,
                                              device="cpu" if on_host else self.step_device(p))
                # (the step's device, not p's nor the template's: a parameter or a
                # shard may live on the host)
                s[key] = self._at_home(s[key], self.step_device(p), on_host)
        copies = {}  # (made here, outside the step, as the program's host buffers are)
        for node_id in placement.offloaded_device_state:
            s, key = self._entry(node_id)
            t = s[key]
            held = self._host_copies.get(node_id)
            if held is None or held.shape != t.shape or held.dtype != t.dtype:
                held = torch.empty_like(t, device="cpu",
                                        pin_memory=self._device_of(node_id).type == "cuda")
            copies[node_id] = held
        self._host_copies = copies
        self._host_homes = frozenset(placement.host_state)
        # The run's plan (Note [Plans of other captures]).
        self._run_placement = placement
        self._host_home_bytes = sum(b for n, b in placement.state_bytes.items()
                                    if n in self._host_homes)
        scratch_numel = {}  # dtype -> the largest tensor a host update of that dtype takes
        for name in placement.scratch_parameters:
            t = like[name] if like is not None and name in like else self.params[name]
            scratch_numel[t.dtype] = max(scratch_numel.get(t.dtype, 0), t.numel())
        for dtype, numel in scratch_numel.items():
            held = self._host_scratch.get(dtype)
            if held is None or held.numel() < numel:
                self._host_scratch[dtype] = torch.empty(numel, dtype=dtype)

    def reallocate_offloaded_state(self):
        """The state whose home is the device that the plan offloads (and
        frees), each in a copy made where the CPU profiler sees it
        (allocated_where_profiled), so that it measures their frees."""
        entries = [self._entry(node_id) for node_id in self._host_copies]
        for (s, key), fresh in zip(entries, allocated_where_profiled([s[k] for s, k in entries])):
            s[key] = fresh

    def step_device(self, p):
        """The device the step runs on (TrainStep sets it: a parameter may live
        on the host between steps); p's, where it is not set."""
        return self.device if self.device is not None else p.device

    @staticmethod
    def _at_home(t, device, on_host):
        """State tensor t where its home is: the step's `device`, or the host
        (pinned beside a GPU)."""
        if not on_host:
            return t if t.device == device else t.to(device)
        if device.type == "cuda":
            if t.device.type == "cpu" and t.is_pinned():
                return t
            return t.to("cpu").pin_memory()
        return t

    # --- running (called by the program: Note [Steps of the optimizer]) ----------

    def begin(self, run):
        """Before `run` (the program's run of the plan): the settings the
        optimizer holds now (a learning-rate scheduler's lr), the count that
        optimizer.step() keeps (learning-rate schedulers check it), and the
        state whose home is the host in the run's host peak (held from the
        step's start, as the plan counts it)."""
        self._follow_settings()
        if hasattr(self.optimizer, "_step_count"):
            self.optimizer._step_count += 1
        self.on_device = {}
        self._offloaded = False
        self._copies_counted = set()
        run.count_host(self._host_home_bytes)

    def step(self, action, node_id, run):
        """One step of the plan on the optimizer's node `node_id`; `run` is the
        program's run (_executor._RunState): its resident tensors, host copies
        and count of device memory."""
        if node_id in self._run_placement.state_bytes:
            self._move(action, node_id, run)
        elif action == "free":  # an update's version of its storage: nothing held
            return
        elif action in ("compute", "host_compute"):
            op = self.ops[node_id]
            if op != "optimizer_step":  # each parameter's count, at its update
                self._apply(op, node_id, run, on_host=action == "host_compute")
        else:
            raise RuntimeError(f"internal: the plan {action}s '{node_id}' in the "
                               "optimizer's step, which pebble.torch does not run")

    def abort(self):
        """After a failed run: the streamed state's device copies are dropped
        (opt.state keeps its host tensors, as the last completed copy left
        them); the state whose home is the device, freed there, gets a device
        copy of its host buffer, the last copy the run made."""
        self.on_device = {}
        for node_id, buffer in self._host_copies.items():
            s, key = self._entry(node_id)
            if s.get(key) is buffer:
                s[key] = buffer.to(self._device_of(node_id), copy=True)

    def finish(self, run):
        """After the run's last step."""
        if self.on_device:
            raise RuntimeError(f"internal: the plan leaves '{next(iter(self.on_device))}' on "
                               "the device after the optimizer's step")
        if self._offloaded and any(self.step_device(p).type == "cuda"
                                   for p in self.params.values()):
            # The host copies are opt.state's: complete before the caller reads them.
            torch.cuda.current_stream().synchronize()

    def _move(self, action, node_id, run):
        """A streamed state tensor's prefetch, offload or free, counted in `run`."""
        nbytes = self._run_placement.state_bytes[node_id]
        host = self._host_state(node_id)  # None: Adam's step count (below)
        if action == "offload" and node_id not in self._host_homes and \
                node_id not in self._copies_counted:
            # A host copy of state whose home is the device (Adam's step
            # count's too), in the host peak from its first offload on.
            self._copies_counted.add(node_id)
            run.count_host(nbytes)
        buffer = self._host_copies.get(node_id)
        if buffer is not None:  # its home the device: opt.state's tensor moves
            s, key = self._entry(node_id)
            if action == "prefetch":
                device = self._device_of(node_id)
                s[key] = buffer.clone() if device.type == "cpu" else \
                    buffer.to(device, non_blocking=True)
                run.hold(nbytes)
                run.result.transfer_bytes += nbytes
            elif action == "offload":
                buffer.copy_(s[key])  # (blocking: an update on the host reads it next)
                run.result.transfer_bytes += nbytes
            elif action == "free":  # the device copy released; a host update finds the buffer
                s[key] = buffer
                run.hold(-nbytes)
            else:
                raise RuntimeError(f"internal: the plan {action}s the state '{node_id}'")
            return
        if action == "prefetch":
            copy = None  # Adam's step count: nothing to copy
            if host is not None:
                device = self._device_of(node_id)
                # On the CPU device (allow_cpu_offload), a copy as on a GPU.
                copy = host.clone() if device.type == "cpu" else host.to(device, non_blocking=True)
            self.on_device[node_id] = copy
            run.hold(nbytes)
            run.result.transfer_bytes += nbytes
        elif action == "offload":
            if host is not None:
                host.copy_(self.on_device[node_id], non_blocking=True)
                self._offloaded = True
            run.result.transfer_bytes += nbytes
        elif action == "free":
            del self.on_device[node_id]
            run.hold(-nbytes)
        else:
            raise RuntimeError(f"internal: the plan {action}s the state '{node_id}'")

    def _host_state(self, node_id):
        """opt.state's tensor of the state node `node_id`; None for Adam's step
        count, which torch.optim keeps per parameter as a CPU tensor and
        pebble.torch leaves there (the plan counts it as one small tensor)."""
        if ":" not in node_id:
            return None
        s, key = self._entry(node_id)
        return s[key]

    def _entry(self, node_id):
        """(opt.state's dict of the parameter, the key) of the state node
        `node_id` ("exp_avg:fc.weight")."""
        key, name = node_id.split(":", 1)
        return self.optimizer.state[self.params[name]], key

    def _device_of(self, node_id):
        return self.step_device(self.params[node_id.split(":", 1)[1]])

    def _state(self, p, key):
        """The tensor an update of p's state `key` reads and writes on the
        device: the device copy of streamed state, else opt.state's."""
        copy = self.on_device.get(f"{key}:{self._name[p]}")
        return copy if copy is not None else self.optimizer.state[p][key]

    def _follow_settings(self):
        """Takes each group's current lr, betas and eps (a scheduler changes
        them), and AdamW's weight decay; another weight decay or a momentum
        turned on or off would change the
        update's temporaries or state, which the plan holds, and a parameter
        taken out of the optimizer would keep its update: OptimizerError."""
        _, groups = _settings(self.optimizer)
        now = _settings_by_name(self.optimizer, groups, self.params)
        for name, was in self._settings_of.items():
            if name not in now:
                raise OptimizerError(f"parameter '{name}' is no longer in the optimizer's "
                                     "param_groups, but the step was planned to update it: "
                                     "make a new train_step")
            for key in ("weight_decay", "momentum"):
                if key == "weight_decay" and was.get("decoupled"):
                    continue  # (AdamW's scales the parameter in place: no temporary)
                if key in was and (now[name][key] == 0) != (was[key] == 0):
                    raise OptimizerError(
                        f"the optimizer's {key} of '{name}' changed from {was[key]} to "
                        f"{now[name][key]} since the step was planned: make a new train_step")
        self.settings, self._settings_of = groups[0], now

    def _apply(self, op, node_id, run, on_host):
        """The update `node_id`: on the device, on the resident parameter and
        gradient, a temporary being the node's planned workspace; on the
        host, on their host copies, a temporary in the host scratch."""
        name = _parameter_of(node_id)
        p = self.params[name]
        # (a group without momentum may hold momentum_buffer=None, as
        # torch.optim's SGD leaves it after a step of its own)
        keys = [k for k in self.state_keys_of(name)
                if torch.is_tensor(self.optimizer.state[p].get(k))]
        # Only what the node reads: a gradient the plan dropped after its
        # last reader is gone by Adam's final update.
        value = run.host_value if on_host else run.device_value
        # (the clipped shard where a sharded step clips: Note [Clipping
        # sharded gradients] in _sharding.py)
        gradient = next((i for i in (f"clip:{name}", f"grad:{name}") if i in self.inputs[node_id]),
                        None)
        grad = value(gradient) if gradient is not None else None
        if on_host:
            param = run.host_value(name)
            s = {key: self.optimizer.state[p][key] for key in keys}
            for key, t in s.items():
                if t.device.type != "cpu":
                    raise RuntimeError(f"internal: the plan updates '{key}:{name}' on the "
                                       "host, but its home is the device")
            # The host copy's shape: the parameter itself is freed meanwhile.
            scratch = lambda: self._host_scratch[param.dtype][:param.numel()].view(  # noqa: E731
                param.shape)
        else:
            param = run.device_value(name)
            s = {key: self._state(p, key) for key in keys}
            scratch = lambda: torch.empty_like(param)  # noqa: E731
            run.hold(0, self._run_placement.workspace_bytes.get(node_id, 0))
        s["step"] = self.optimizer.state[p].get("step")
        scalar = self._scalar_for(param.dtype, on_host)
        _update(op, self.kind, self._settings_of[name], param, grad, s, scratch, scalar.fill_,
                self._one)


class Placement:
    """Where one plan keeps the optimizer's state and runs its updates: the
    homes that the plan's steps imply, as ResolveHomes (scheduler/schedule.h)
    resolves them: the host where a tensor's first step is a prefetch, or an
    update on the host that touches its storage."""

    def __init__(self, updates, schedule):
        self.host_updates = {node_id for action, node_id, *_ in schedule
                             if action == "host_compute" and updates.owns(node_id)}
        self.host_state = host_homes(updates, schedule, lambda node_id: node_id,
                                     updates.state_bytes)
        self.streamed = frozenset(n for action, n, *_ in schedule
                                  if action == "prefetch" and n in updates.state_bytes)
        # The state whose home is the device that the plan offloads (for an
        # update on the host): Updates keeps a host buffer of each.
        self.offloaded_device_state = frozenset(
            n for action, n, *_ in schedule if action == "offload" and ":" in n and
            n in updates.state_bytes and n not in self.host_state)
        # (its capture's: Updates.extend makes new ones for the next capture)
        self.state_bytes = updates.state_bytes
        self.workspace_bytes = updates.workspace_bytes
        self.resident_state_bytes = sum(b for n, b in updates.state_bytes.items()
                                        if n not in self.host_state)
        self.host_parameters = sorted({_parameter_of(n) for n in self.host_updates
                                       if updates.ops[n] != "optimizer_step"})
        # The parameters the plan updates: those the step computes a gradient of.
        self.updated_parameters = frozenset(
            _parameter_of(n) for action, n, *_ in schedule
            if action in ("compute", "host_compute") and updates.owns(n) and
            updates.ops[n] not in ("optimizer_step", "optimizer_state"))
        self.device_parameters = sorted(self.updated_parameters - set(self.host_parameters))
        self.max_grad_norm = updates.max_grad_norm  # the clipping in the plan, or None
        self.grad_norm_type = updates.grad_norm_type
        # The parameters whose host updates take a temporary (the host
        # scratch holds the largest of a dtype: Updates.ensure_state).
        self.scratch_parameters = sorted({
            _parameter_of(n) for n in self.host_updates
            if updates.ops[n] != "optimizer_step" and
            _temporary(updates.ops[n], updates.settings_of(n))})

    def report(self):
        """The report's "optimizer_state" and "optimizer_updates" entries."""
        state = self.state_bytes
        host = self.host_state
        return {
            "optimizer_state": {
                "resident_tensors": sum(1 for n in state if n not in host),
                "host_tensors": len(host),
                "streamed_tensors": len(self.streamed),
                "resident_bytes": self.resident_state_bytes,
                "host_bytes": sum(state[n] for n in host),
                "streamed_bytes": sum(state[n] for n in self.streamed)},
            "optimizer_updates": {
                "host_parameters": len(self.host_parameters),
                "device_parameters": len(self.device_parameters),
                "max_grad_norm": self.max_grad_norm,
                "grad_norm_type": (None if self.max_grad_norm is None else
                                   "inf" if self.grad_norm_type == math.inf else
                                   self.grad_norm_type)},
        }


def host_homes(updates, schedule, stored, tensors):
    """The ids of `tensors` whose home `schedule` puts on the host, as
    ResolveHomes (scheduler/schedule.h) resolves a home: the host where the
    first step on the tensor is a prefetch, or an update on the host (of
    `updates`) that touches its storage. `stored(node_id)`: the tensor id a
    step's node id names, or None."""
    first_on_host = {}
    for action, node_id, *_ in schedule:
        if action == "host_compute" and updates.owns(node_id):
            for root in updates.touches[node_id]:
                first_on_host.setdefault(root, True)
        tensor = stored(node_id)
        if tensor is not None:
            first_on_host.setdefault(tensor, action == "prefetch")
    return frozenset(t for t, on_host in first_on_host.items() if on_host and t in tensors)


# Note [Updates of float64 parameters]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# pebble's graph format names float32, float16 and bfloat16 (and the
# integer types), not float64. A float64 parameter's node in the graph that
# extend() gives the optimizer carries its shape and its bytes (8 a value)
# without a dtype, and so do the optimizer's state and updates that
# graph/optimizer.cc makes for it: the plan needs bytes only, and
# pebble.torch runs the updates itself. The updates read their scalars from
# a held float64 tensor (Note [Scalars without allocations]): eager's
# Python numbers are doubles, so the bits are eager's, and no cast is made.


@functools.lru_cache(maxsize=None)
def _cpu_rounds_scalars(dtype):
    """Whether this PyTorch's CPU operators round a float32 CPU scalar
    operand of a `dtype` tensor (bfloat16, float16) to `dtype` before they
    read it, in the updates' operations (mul_, div_, add_): PyTorch 1.13's
    do, through a cast they allocate. A held scalar of `dtype` then gives
    the same bits (checked here on values the updates take: betas, 1 minus
    them, eps, a step size) and allocates nothing."""
    x = torch.linspace(-3, 3, 509).to(dtype)
    for value in (0.9, 0.999, 0.1, 1e-3, 1e-8, 1 / 3, 0.0123):
        wide, narrow = torch.tensor(value), torch.tensor(value, dtype=dtype)
        for op in ("mul_", "div_", "add_"):
            if not torch.equal(getattr(x.clone(), op)(wide), getattr(x.clone(), op)(narrow)):
                return False
    return True


@functools.lru_cache(maxsize=None)
def _sgd_keeps_none_buffers():
    """Whether this PyTorch's SGD leaves momentum_buffer=None in the state of
    a parameter whose group has no momentum, after a step (1.13 does; 2.2
    and later leave no entry): the step's state is then the same."""
    p = torch.zeros(1, requires_grad=True)
    p.grad = torch.zeros(1)
    optimizer = torch.optim.SGD([p], lr=0.1)
    optimizer.step()
    return "momentum_buffer" in optimizer.state[p]


def _round_bytes(doc, round_to):
    """Each tensor of the graph `doc` that owns its storage (no view, no
    in-place update) at the allocator's granularity, as the capture rounds
    its own; a shape that no longer holds the bytes is dropped. Adam's step
    count stays as it is: torch.optim keeps it on the CPU."""
    for node in doc["nodes"]:
        if node.get("alias_of") is not None or node["id"] == "optimizer.step":
            continue
        rounded = round_up(node["bytes"], round_to)
        if rounded != node["bytes"]:
            node["bytes"] = rounded
            node.pop("shape", None)
            node.pop("dtype", None)


def state_dict_on_cpu(optimizer, entry=None):
    """optimizer.state_dict() as a copy, every state tensor on the CPU, its
    dicts its own (torch.optim's share the live state's). `entry(p, key,
    value)`: the copy of parameter p's entry `key`, where it gives one (not
    None)."""
    saved = optimizer.state_dict()
    params = [p for group in optimizer.param_groups for p in group["params"]]

    def copied(p, key, value):
        made = entry(p, key, value) if entry is not None else None
        if made is not None:
            return made
        return value.detach().to("cpu", copy=True) if torch.is_tensor(value) else \
            copy.deepcopy(value)
    with torch.no_grad():
        state = {index: {key: copied(params[index], key, value)
                         for key, value in entries.items()}
                 for index, entries in saved["state"].items()}
    return dict(saved, state=state, param_groups=copy.deepcopy(saved["param_groups"]))


def _state_shape_error(name, key, t, template, sharded):
    """The refusal of a state entry `t` that the step cannot take as it is."""
    if sharded:
        return (f"the optimizer's {key} of '{name}' is {tuple(t.shape)}: neither the "
                f"parameter's shape nor this rank's shard's {tuple(template.shape)} (a state "
                "that a step sharded over another number of ranks saved with "
                "optimizer.state_dict()? step.full_optimizer_state_dict() saves it whole, "
                "which a step on any number of ranks takes)")
    return (f"the optimizer's {key} of '{name}' is {tuple(t.shape)}; the step keeps it "
            f"{tuple(template.shape)} (a sharded step's own state, saved with "
            "optimizer.state_dict()? step.full_optimizer_state_dict() saves it whole, as this "
            "step takes it)")


def _parameter_of(node_id):
    """The parameter an update node ("exp_avg:fc.weight#1", "update:fc.weight") updates."""
    return node_id.split(":", 1)[1].split("#", 1)[0]


def _update(op, kind, c, p, g, s, scratch, scalar, one):
    """torch.optim's single-tensor SGD or Adam (PyTorch 1.13), operation by
    operation, for the update node's op: p, g and the state `s` (key ->
    tensor; "step" Adam's count) are updated in place; scratch() gives a
    tensor of p's shape for the one temporary an op may need; scalar(x) is
    a held CPU scalar tensor holding x (Note [Scalars without allocations])."""
    wd = c["weight_decay"]

    def decayed():  # g + wd * p, torch.optim's coupled weight decay
        return torch.add(g, p, alpha=wd, out=scratch())

    if op == "sgd_momentum":
        d = decayed() if wd != 0 else g
        s["momentum_buffer"].mul_(scalar(c["momentum"])).add_(d)
    elif op == "sgd_update":
        if c["momentum"] > 0:
            d = s["momentum_buffer"]
        else:
            d = decayed() if wd != 0 else g
        p.add_(d, alpha=-c["lr"])
    elif op in ("adam_exp_avg", "adam_exp_avg_sq"):
        d = decayed() if wd != 0 and kind == "adam" else g
        if op == "adam_exp_avg":
            s["exp_avg"].mul_(scalar(c["beta1"])).add_(d, alpha=1 - c["beta1"])
        else:
            s["exp_avg_sq"].mul_(scalar(c["beta2"])).addcmul_(d, d, value=1 - c["beta2"])
    elif op == "adam_update":
        s["step"].add_(one)
        t = float(s["step"])
        if kind == "adamw" and wd != 0:
            p.mul_(scalar(1 - c["lr"] * wd))
        bias_correction2_sqrt = math.sqrt(1 - c["beta2"] ** t)
        step_size = c["lr"] / (1 - c["beta1"] ** t)
        denom = torch.sqrt(s["exp_avg_sq"], out=scratch())
        denom.div_(scalar(bias_correction2_sqrt)).add_(scalar(c["eps"]))
        p.addcdiv_(s["exp_avg"], denom, value=-step_size)
    else:
        raise RuntimeError(f"internal: no update rule for op {op}")


def _temporary(op, c):
    """Whether pebble.torch's rule for `op` makes a temporary of the
    parameter's size (Updates._run)."""
    coupled = c["weight_decay"] != 0 and not c.get("decoupled", False)
    if op == "adam_update":
        return True
    if op in ("adam_exp_avg", "adam_exp_avg_sq", "sgd_momentum"):
        return coupled
    if op == "sgd_update":
        return coupled and c["momentum"] == 0
    return False


def _norm_type(value):
    """clip_grad_norm_'s norm_type as a float (math.inf for "inf"); ValueError
    for what is not a positive number or infinity."""
    number = value
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        number = math.inf
    if isinstance(number, bool) or not isinstance(number, numbers.Real) or \
            math.isnan(number) or number <= 0:
        raise ValueError(f"grad_norm_type must be a positive number (a p-norm's p) or 'inf', "
                         f"not {value!r}")
    return float(number)


# Note [SGD groups without momentum]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# torch.optim.SGD's groups may differ in momentum (on the weights, none on
# biases and norms: the buffer costs a parameter's bytes), and a parameter
# of a group with momentum 0 keeps no buffer in eager PyTorch. pebble's
# spec sets momentum per group too, but its groups are globs of ids
# (graph/optimizer.h, Note [Parameter groups]) and the optimizer's are sets
# of tensors, whose names need not make a glob (any character may be in a
# module's name). So the spec takes the largest momentum of the groups, and
# extend() takes out the buffer and its update of each parameter whose
# group has none: its sgd_update reads the gradient, as the spec makes it
# without momentum. The plan then holds, moves and updates only the buffers
# that eager keeps, and state_keys_of() says which parameter has one.


# The way out of an optimizer that the plan cannot take.
_STEP_OUTSIDE = ("to train with it, leave out optimizer= and call optimizer.step() after each "
                 "step (the plan then covers the forward and the backward, and .grad holds "
                 "every gradient)")


def _settings(optimizer):
    """("sgd" | "adam" | "adamw", each parameter group's settings, the keys
    of pebble's optimizer spec, in param_groups' order); OptimizerError for
    what pebble does not plan. Groups may differ in their numbers (a weight
    decay for the weights only, a learning rate per layer, SGD's momentum
    on or off: Note [SGD groups without momentum])."""
    if type(optimizer) is torch.optim.SGD:
        kind = "sgd"
    elif type(optimizer) in (torch.optim.Adam, torch.optim.AdamW):
        kind = "adam" if type(optimizer) is torch.optim.Adam else "adamw"
    else:
        raise OptimizerError(f"optimizer {type(optimizer).__name__}: pebble.torch plans "
                             f"torch.optim.SGD, Adam and AdamW; {_STEP_OUTSIDE}")
    groups = optimizer.param_groups
    per_group = [_group_settings(type(optimizer).__name__, kind, group,
                                 f" (parameter group {i})" if len(groups) > 1 else "")
                 for i, group in enumerate(groups)]
    return kind, per_group


def _group_settings(name, kind, group, where):
    """One parameter group's settings (see _settings); `name` the
    optimizer's class, `where` names the group in a refusal."""
    unsupported = []
    for key, fine in (("nesterov", False), ("maximize", False), ("amsgrad", False),
                      ("capturable", False), ("differentiable", False), ("fused", None),
                      ("dampening", 0)):
        if key == "dampening" and not group.get("momentum"):
            continue  # (SGD reads it only with momentum)
        if key in group and group[key] not in (fine, False) and group[key] is not None:
            unsupported.append(f"{key}={group[key]}")
    if unsupported:
        raise OptimizerError(f"{name} with {', '.join(unsupported)}{where}: pebble plans plain "
                             f"SGD (momentum, weight decay), Adam and AdamW; {_STEP_OUTSIDE}")
    if kind == "sgd":
        settings = {"lr": group["lr"], "momentum": group["momentum"],
                    "weight_decay": group["weight_decay"]}
    else:
        beta1, beta2 = group["betas"]
        settings = {"lr": group["lr"], "beta1": beta1, "beta2": beta2, "eps": group["eps"],
                    "weight_decay": group["weight_decay"]}
    for key, value in settings.items():
        if torch.is_tensor(value):
            raise OptimizerError(f"{name}: a tensor {key}{where} is not planned")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            # (None or a string from a config: eager's step fails on it too,
            # in an operator's words)
            raise OptimizerError(f"{name}: {key}={value!r}{where} is not a number")
        if not isinstance(value, (int, float)):
            # (a NumPy scalar, as a config or np.linspace gives: eager reads
            # it as this double; the plan's spec and JSON take Python floats)
            value = settings[key] = float(value)
        # (lr 0: a warm-up's first steps, and eps 0, which PyTorch takes)
        if key in ("eps", "lr") and not value >= 0:
            raise OptimizerError(f"{name}: {key}={value}{where}; pebble plans {key} of 0 or "
                                 "more")
    if kind == "adamw":
        settings["decoupled"] = True
    return settings


def _settings_by_name(optimizer, per_group, params):
    """Parameter name -> the settings of its group (per_group, _settings'),
    for the parameters `params` (name -> tensor) that the optimizer holds."""
    of_id = {id(p): s for group, s in zip(optimizer.param_groups, per_group)
             for p in group["params"]}
    return {name: of_id[id(p)] for name, p in params.items() if id(p) in of_id}
