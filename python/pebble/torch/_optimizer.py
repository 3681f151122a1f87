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
placement] in scheduler/state_placement.cc). Either way the plan's steps
say which state tensors are streamed: those it prefetches. opt.state holds
them on the host between steps, and each is streamed through the update
phase (Note [Updates last] in scheduler/updates_last.cc): a device copy
made where the plan prefetches it, updated in place, copied back where the
plan offloads it and dropped where it frees it.
"""

import json
import math

import torch

from .. import _core


class OptimizerError(ValueError):
    """An optimizer that pebble.torch cannot plan (the message says why)."""


# The node ops of graph/optimizer.h, each run by Updates._run.
_UPDATE_OPS = ("sgd_momentum", "sgd_update", "adam_exp_avg", "adam_exp_avg_sq", "adam_update",
               "optimizer_step")


_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


class Updates:
    """A torch.optim optimizer as pebble's optimizer step of a module."""

    def __init__(self, optimizer, model, state="device"):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, not "
                            f"{type(optimizer).__name__}")
        if state not in ("device", "host", "auto"):
            raise ValueError(f"optimizer_state must be 'device', 'host' or 'auto', not {state!r}")
        self.optimizer = optimizer
        self.kind, self.settings = _settings(optimizer)
        self.spec = self.kind + ":" + ",".join(
            f"{k}={float(v)!r}" for k, v in self.settings.items() if k != "decoupled")
        if state != "device":
            self.spec += f",state={state}"
        self.ops = {}  # node id -> op of the optimizer's nodes (extend)
        # The plan's bytes of the state that may be resident (home device or
        # auto: what a budget is framed with), and of each update's
        # workspace and each state tensor by node id (extend): the graph's,
        # rounded as the capture rounds every tensor.
        self.planned_state_bytes = 0
        self.workspace_bytes = {}
        self.state_bytes = {}
        self.on_device = {}  # streamed state node id -> its device copy, during run()
        # Note [Scalars without allocations]: a Python number as an operand
        # (x.mul_(0.9)) makes a small CPU tensor on each call, outside the
        # plan (the CPU device's profiler counts it); a held CPU 0-dim tensor,
        # filled in place, takes the same path through ATen (a CPU scalar,
        # read in the operation's precision) without one.
        self._scalar = torch.zeros(())
        self._one = torch.ones(())  # Adam's step count is a CPU tensor
        in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self.params = {}
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            if id(p) not in in_optimizer:
                raise OptimizerError(f"parameter '{name}' is trainable but not in the "
                                     "optimizer: pebble plans one optimizer for every "
                                     "trainable parameter")
            self.params[name] = p
        self._name = {p: name for name, p in self.params.items()}
        # Frozen parameters may be in it: torch.optim skips them (no .grad).
        extra = in_optimizer - {id(p) for p in model.parameters()}
        if extra:
            raise OptimizerError(f"the optimizer holds {len(extra)} tensor(s) that are not "
                                 "parameters of the module")

    # --- the graph ----------------------------------------------------------------

    def extend(self, graph):
        """`graph` (a captured training graph) with the optimizer's step, each
        update's temporaries as its workspace."""
        # The parameters' shapes and dtypes, which the optimizer's nodes take
        # (the capture keeps them in attrs).
        doc = json.loads(graph.to_json())
        for node in doc["nodes"]:
            if node.get("role") != "parameter" or node["id"] not in self.params:
                continue  # a frozen parameter takes no update
            attrs = node.get("attrs") or {}
            dtype = _DTYPES.get(attrs.get("dtype"))
            if dtype is None:
                raise OptimizerError(f"parameter '{node['id']}' is {attrs.get('dtype')}: "
                                     "pebble's optimizer step takes float32, float16 and "
                                     "bfloat16 parameters")
            node["shape"], node["dtype"] = attrs["shape"], dtype
        graph = _core.from_json(json.dumps(doc))
        doc = json.loads(_core.with_optimizer(graph, self.spec).to_json())
        self.planned_state_bytes = 0
        self.workspace_bytes, self.state_bytes = {}, {}
        for node in doc["nodes"]:
            if node.get("op") in _UPDATE_OPS or node.get("role") == "optimizer_state":
                self.ops[node["id"]] = node["op"]
            if node.get("role") == "optimizer_state":
                self.state_bytes[node["id"]] = node["bytes"]
                if node.get("home") != "host":
                    self.planned_state_bytes += node["bytes"]
            if node.get("op") in _UPDATE_OPS and _temporary(node["op"], self.settings):
                node["workspace"] = node["bytes"]
                self.workspace_bytes[node["id"]] = node["bytes"]
        return _core.from_json(json.dumps(doc))

    # --- the state ----------------------------------------------------------------

    @staticmethod
    def streamed_in(steps):
        """The state node ids that the plan's optimizer steps stream (prefetch)."""
        return frozenset(node_id for action, node_id in steps if action == "prefetch")

    def resident_state_bytes(self, streamed):
        """The plan's bytes of the state that stays on the device."""
        return sum(b for node_id, b in self.state_bytes.items() if node_id not in streamed)

    def ensure_state(self, streamed):
        """Every parameter's state in opt.state, as torch.optim makes it on its
        first step (zeros; Adam's step count 0), where it is not there yet:
        made before the step, it is held before the step as the plan holds
        it (persistent): on the device, or on the host (pinned beside a GPU)
        where the plan streams it (`streamed`, node ids); a tensor moves
        where the plan of these shapes wants it (state a loaded state_dict
        put on the device, say). A momentum buffer starts at zeros:
        momentum 0 + g is the copy of g that torch.optim makes."""
        state = self.optimizer.state
        for p in self.params.values():
            s = state[p]
            if self.kind == "sgd":
                keys = ("momentum_buffer",) if self.settings["momentum"] > 0 else ()
            else:
                keys = ("exp_avg", "exp_avg_sq")
                if "step" not in s:
                    s["step"] = torch.tensor(0.0)
            for key in keys:
                if s.get(key) is None:
                    s[key] = torch.zeros_like(p, memory_format=torch.preserve_format)
                s[key] = self._at_home(s[key], p, f"{key}:{self._name[p]}" in streamed)

    @staticmethod
    def _at_home(t, p, on_host):
        """State tensor t where its home is: p's device, or the host."""
        if not on_host:
            return t if t.device == p.device else t.to(p.device)
        if p.device.type == "cuda":
            if t.device.type == "cpu" and t.is_pinned():
                return t
            return t.to("cpu").pin_memory()
        return t

    # --- running ------------------------------------------------------------------

    def run(self, steps):
        """Runs the optimizer's steps of the plan, (action, node id) pairs in
        order, reading each parameter's .grad, with the settings the
        optimizer holds now (a learning-rate scheduler's lr)."""
        self._follow_settings()
        # What optimizer.step() counts, which learning-rate schedulers check
        # (they warn of a scheduler step before any optimizer step).
        if hasattr(self.optimizer, "_step_count"):
            self.optimizer._step_count += 1
        # The largest device memory the updates hold at once: streamed state
        # copies and one update's temporaries (pebble's count, not measured).
        self.counted_peak_bytes = live = 0
        self.transfer_bytes = 0  # the streamed state's copies, both ways
        offloaded = False
        for action, node_id in steps:
            if node_id in self.state_bytes and action != "compute":
                live += self._move(action, node_id)
                offloaded = offloaded or action == "offload"
                if action != "free":
                    self.transfer_bytes += self.state_bytes[node_id]
            elif action == "free":  # an update's version of its storage: nothing held
                continue
            elif action != "compute":
                raise RuntimeError(f"internal: the plan {action}s '{node_id}' in the "
                                   "optimizer's step, which pebble.torch does not run")
            else:
                self._run(self.ops[node_id], node_id)
            self.counted_peak_bytes = max(self.counted_peak_bytes,
                                          live + self.workspace_bytes.get(node_id, 0))
        if self.on_device:
            raise RuntimeError(f"internal: the plan leaves '{next(iter(self.on_device))}' on "
                               "the device after the optimizer's step")
        if offloaded and any(p.device.type == "cuda" for p in self.params.values()):
            # The host copies are opt.state's: complete before the caller reads them.
            torch.cuda.current_stream().synchronize()

    def _move(self, action, node_id):
        """A streamed state tensor's prefetch, offload or free; the device
        bytes it adds (or, negative, drops)."""
        key, name = node_id.split(":", 1)
        p = self.params[name]
        host = self.optimizer.state[p][key]
        if action == "prefetch":
            if p.device.type == "cpu":  # allow_cpu_offload: a copy, as on a GPU
                self.on_device[node_id] = host.clone()
            else:
                self.on_device[node_id] = host.to(p.device, non_blocking=True)
            return self.state_bytes[node_id]
        if action == "offload":
            host.copy_(self.on_device[node_id], non_blocking=True)
            return 0
        if action == "free":
            del self.on_device[node_id]
            return -self.state_bytes[node_id]
        raise RuntimeError(f"internal: the plan {action}s the state '{node_id}'")

    def _state(self, p, key):
        """The tensor an update of p's state `key` reads and writes: the
        device copy of streamed state, else opt.state's."""
        copy = self.on_device.get(f"{key}:{self._name[p]}")
        return copy if copy is not None else self.optimizer.state[p][key]

    def _follow_settings(self):
        """Takes the optimizer's current lr, betas and eps (a scheduler changes
        them); a change of weight decay or momentum would change the
        update's temporaries, which the plan holds: OptimizerError."""
        kind, now = _settings(self.optimizer)
        for key in ("weight_decay", "momentum"):
            if key in now and (now[key] == 0) != (self.settings[key] == 0):
                raise OptimizerError(f"the optimizer's {key} changed from {self.settings[key]} "
                                     f"to {now[key]} since the step was planned: make a new "
                                     "train_step")
        self.settings = now

    def _run(self, op, node_id):
        if op == "optimizer_step":  # each parameter's count, at its update
            return
        name = node_id.split(":", 1)[1].split("#", 1)[0]
        p = self.params[name]
        g = p.grad
        s = {key: self._state(p, key) for key in ("momentum_buffer", "exp_avg", "exp_avg_sq")
             if key in self.optimizer.state[p]}
        s["step"] = self.optimizer.state[p].get("step")
        c = self.settings
        wd = c["weight_decay"]
        scalar = self._scalar.fill_
        if op == "sgd_momentum":
            d = g.add(p, alpha=wd) if wd != 0 else g
            s["momentum_buffer"].mul_(scalar(c["momentum"])).add_(d)
        elif op == "sgd_update":
            if c["momentum"] > 0:
                d = s["momentum_buffer"]
            else:
                d = g.add(p, alpha=wd) if wd != 0 else g
            p.add_(d, alpha=-c["lr"])
        elif op in ("adam_exp_avg", "adam_exp_avg_sq"):
            d = g.add(p, alpha=wd) if wd != 0 and self.kind == "adam" else g
            if op == "adam_exp_avg":
                s["exp_avg"].mul_(scalar(c["beta1"])).add_(d, alpha=1 - c["beta1"])
            else:
                s["exp_avg_sq"].mul_(scalar(c["beta2"])).addcmul_(d, d, value=1 - c["beta2"])
        elif op == "adam_update":
            s["step"].add_(self._one)
            t = float(s["step"])
            if self.kind == "adamw" and wd != 0:
                p.mul_(scalar(1 - c["lr"] * wd))
            bias_correction2_sqrt = math.sqrt(1 - c["beta2"] ** t)
            step_size = c["lr"] / (1 - c["beta1"] ** t)
            denom = s["exp_avg_sq"].sqrt()
            denom.div_(scalar(bias_correction2_sqrt)).add_(scalar(c["eps"]))
            p.addcdiv_(s["exp_avg"], denom, value=-step_size)
        else:
            raise RuntimeError(f"internal: no update rule for op {op}")


def split_schedule(schedule, optimizer_ids):
    """(the captured step's steps, the optimizer's steps): the updates run
    last (Note [Updates last]), so every optimizer step follows the others."""
    for i, (_, node_id) in enumerate(schedule):
        if node_id in optimizer_ids:
            rest = schedule[i:]
            if any(n not in optimizer_ids for _, n in rest):
                raise RuntimeError("internal: the plan interleaves the optimizer's updates "
                                   "with the step")
            return schedule[:i], rest
    return list(schedule), []


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


def _settings(optimizer):
    """("sgd" | "adam" | "adamw", the settings pebble's optimizer spec takes);
    OptimizerError for what pebble does not plan."""
    groups = optimizer.param_groups
    first = groups[0]
    for group in groups[1:]:
        differ = [k for k in first if k != "params" and group.get(k) != first[k]]
        if differ:
            raise OptimizerError(f"the optimizer's parameter groups differ in "
                                 f"{', '.join(differ)}: pebble plans one setting for all")
    unsupported = []
    for key, fine in (("nesterov", False), ("maximize", False), ("amsgrad", False),
                      ("capturable", False), ("differentiable", False), ("fused", None),
                      ("dampening", 0)):
        if key in first and first[key] not in (fine, False) and first[key] is not None:
            unsupported.append(f"{key}={first[key]}")
    if type(optimizer) is torch.optim.SGD:
        kind = "sgd"
        settings = {"lr": first["lr"], "momentum": first["momentum"],
                    "weight_decay": first["weight_decay"]}
    elif type(optimizer) in (torch.optim.Adam, torch.optim.AdamW):
        kind = "adam" if type(optimizer) is torch.optim.Adam else "adamw"
        beta1, beta2 = first["betas"]
        settings = {"lr": first["lr"], "beta1": beta1, "beta2": beta2, "eps": first["eps"],
                    "weight_decay": first["weight_decay"]}
    else:
        raise OptimizerError(f"optimizer {type(optimizer).__name__}: pebble.torch plans "
                             "torch.optim.SGD, Adam and AdamW")
    if unsupported:
        raise OptimizerError(f"{type(optimizer).__name__} with {', '.join(unsupported)}: "
                             "pebble plans plain SGD (momentum, weight decay), Adam and AdamW")
    for key, value in settings.items():
        if torch.is_tensor(value):
            raise OptimizerError(f"{type(optimizer).__name__}: a tensor {key} is not planned")
        if key in ("lr", "eps") and not value > 0:
            raise OptimizerError(f"{type(optimizer).__name__}: {key}={value}; pebble plans "
                                 f"{key} above 0")
    if kind == "adamw":
        settings["decoupled"] = True
    return kind, settings
