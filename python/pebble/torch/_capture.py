"""Capture: a module's whole training step as one graph of ATen operators.

PyTorch traces its own step: the module's forward, the user's loss and
autograd's backward (torch.autograd.grad), with make_fx, then a second time
through functionalization, so that the graph has no hidden mutation (the
two-pass scheme of functorch's AOTAutograd). The result is a
torch.fx.GraphModule whose inputs are the step's persistent tensors (Slot)
and whose outputs are the loss and the gradients; _graph.py turns it into a
pebble graph.

Tracing runs on fake tensors where PyTorch can (nothing is computed or
allocated), else on real ones: then the generator's state and the buffers are
put back as they were.
"""

import contextlib

import torch

from ._compat import functional_call, functionalize, make_fx


class CaptureError(ValueError):
    """The module or its loss cannot be captured; the message names the module
    and PyTorch's reason."""


class Slot:
    """A persistent tensor of the step, as the traced graph takes it.

    kind: "parameter", "buffer", "input" or "target". `names`: every
    attribute path under the module that holds the tensor (a tied weight has
    several; the first is its state_dict() key and the pebble id). `index`:
    the position of an input among the step's inputs."""

    def __init__(self, kind, names=(), index=None, trainable=False):
        self.kind = kind
        self.names = tuple(names)
        self.index = index
        self.trainable = trainable
        self.tensor = None  # the module's tensor when captured (parameters, buffers)

    @property
    def id(self):
        if self.kind in ("parameter", "buffer"):
            return self.names[0]
        if self.kind == "target":
            return "target"
        return f"input{self.index}" if self.index else "input"

    def __repr__(self):
        return f"Slot({self.kind}, {self.id})"


def module_slots(model):
    """The parameters and buffers of `model`, each tensor once with every name
    that holds it (tied weights), in named_parameters() / named_buffers()
    order."""
    slots, by_tensor = [], {}
    for kind in ("parameter", "buffer"):
        for module_name, module in model.named_modules(remove_duplicate=False):
            table = module._parameters if kind == "parameter" else module._buffers
            for attr, t in table.items():
                if t is None:
                    continue
                name = f"{module_name}.{attr}" if module_name else attr
                slot = by_tensor.get(id(t))
                if slot is None:
                    slot = Slot(kind, (name,), trainable=kind == "parameter" and t.requires_grad)
                    slot.tensor = t
                    by_tensor[id(t)] = slot
                    slots.append(slot)
                elif name not in slot.names:
                    slot.names += (name,)
    # The first name of each is its state_dict() key: both walk the modules
    # in registration order.
    return slots


class _ModuleStack:
    """Forward hooks that know which submodule runs, to name it in errors."""

    def __init__(self, model):
        self.stack = []
        self.handles = []
        for name, module in model.named_modules():
            label = f"'{name}' ({type(module).__name__})" if name else type(module).__name__
            self.handles.append(module.register_forward_pre_hook(self._enter(label)))
            self.handles.append(module.register_forward_hook(self._leave))

    def _enter(self, label):
        def hook(module, args):
            self.stack.append(label)  # returns None: the inputs stay as they are
        return hook

    def _leave(self, module, args, output):
        if self.stack:
            self.stack.pop()  # returns None: the output stays as it is

    def close(self):
        for h in self.handles:
            h.remove()

    def where(self):
        return f"module {self.stack[-1]}" if self.stack else "the loss or the backward pass"


def _first_line(e):
    text = str(e).strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return type(e).__name__


class Traced:
    """The functional graph of one step and what its inputs and outputs are.

    gm: inputs are the slots' tensors, in `slots` order, flat; its output is
    a flat list: the loss, then the gradient of each parameter in
    `grad_slots` order. `grad_slots`: the trainable parameters the loss
    reaches (others get no gradient, as in eager mode)."""

    def __init__(self, gm, slots, grad_slots, mode, example):
        self.gm = gm
        self.slots = slots
        self.grad_slots = grad_slots
        self.mode = mode  # "fake" or "real": how it was traced
        self.example = example  # the slots' tensors it was traced with (buffers copied)


def _step_function(model, loss_fn, slots, grad_found):
    """f(*slot tensors) -> [loss, gradient, ...] of the module's step."""
    n_state = sum(1 for s in slots if s.kind in ("parameter", "buffer"))
    n_inputs = sum(1 for s in slots if s.kind == "input")

    def step(*flat):
        state = {}
        for slot, t in zip(slots[:n_state], flat[:n_state]):
            for name in slot.names:
                state[name] = t
        inputs = flat[n_state:n_state + n_inputs]
        target = flat[n_state + n_inputs]
        output = functional_call(model, state, tuple(inputs))
        loss = loss_fn(output, target)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0 or \
                not loss.dtype.is_floating_point:
            raise CaptureError(f"loss_fn must return a scalar floating-point tensor, got "
                               f"{_describe(loss)}")
        trainable = [(slot, t) for slot, t in zip(slots[:n_state], flat[:n_state])
                     if slot.trainable]
        if not loss.requires_grad:
            raise CaptureError("the loss does not depend on any parameter that requires a "
                               "gradient")
        grads = torch.autograd.grad(loss, [t for _, t in trainable], allow_unused=True)
        grad_found.clear()
        out = [loss]
        for (slot, _), g in zip(trainable, grads):
            if g is not None:
                grad_found.append(slot)
                out.append(g)
        return out

    return step


def _describe(x):
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    return type(x).__name__


@contextlib.contextmanager
def _rng_kept(device):
    """Puts the generator(s) back as they were: a real trace draws numbers."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)


def trace(model, loss_fn, inputs, target, device, mode=None):
    """Traced step of `model` on `inputs` and `target`.

    mode: "fake" (no computation), "real", or None: fake where PyTorch can
    trace fake tensors through the step, else real."""
    slots = module_slots(model)
    slots += [Slot("input", index=k) for k in range(len(inputs))]
    slots.append(Slot("target"))
    flat = []
    for slot in slots:
        if slot.kind in ("parameter", "buffer"):
            t = slot.tensor
            # A real trace runs the step: buffers updated in place (batch
            # norm's running statistics) must not be the module's.
            flat.append(t if slot.kind == "parameter" else t.detach().clone())
        elif slot.kind == "input":
            flat.append(inputs[slot.index])
        else:
            flat.append(target)
    modes = [mode] if mode else ["fake", "real"]
    failure = None
    for m in modes:
        grad_found = []
        stack = _ModuleStack(model)
        try:
            with _rng_kept(device):
                step = _step_function(model, loss_fn, slots, grad_found)
                first = make_fx(step, tracing_mode=m)(*flat)
                stack.close()

                def rerun(*args):
                    return torch.fx.Interpreter(first).run(*args)

                gm = make_fx(functionalize(rerun), tracing_mode=m)(*flat)
        except CaptureError:
            stack.close()
            raise
        except Exception as e:  # PyTorch's own refusal: try the next mode, else report
            where = stack.where()
            stack.close()
            failure = (where, e)
            continue
        _remove_unused_calls(gm)
        return Traced(gm, slots, list(grad_found), m, flat)
    where, e = failure
    raise CaptureError(f"{where} cannot be traced by PyTorch (make_fx): "
                       f"{type(e).__name__}: {_first_line(e)}") from e


def _remove_unused_calls(gm):
    """Drops calls whose value nothing reads, but for those that write into
    an argument (a write-back into a buffer such as num_batches_tracked's
    copy_): FX's own dead-code pass would drop those too."""
    changed = True
    while changed:
        changed = False
        for n in reversed(list(gm.graph.nodes)):
            if n.op != "call_function" or n.users:
                continue
            schema = getattr(n.target, "_schema", None)
            writes = schema is not None and any(
                a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
            if not writes:
                gm.graph.erase_node(n)
                changed = True
    gm.recompile()


class _Recorder(torch.fx.Interpreter):
    """Runs a graph and keeps every node's value."""

    def __init__(self, gm, convert=None):
        super().__init__(gm)
        self.values = {}
        self.convert = convert

    def run_node(self, n):
        value = super().run_node(n)
        self.values[n] = value
        return value

    def get_attr(self, target, args, kwargs):
        value = super().get_attr(target, args, kwargs)
        return self.convert(value) if self.convert is not None and \
            isinstance(value, torch.Tensor) else value


def propagate(traced, device):
    """fx node -> its value: fake tensors where PyTorch can (nothing is
    computed), else real ones (a shape that depends on the data). Returns
    (values, "fake" or "real")."""
    from ._compat import FakeTensorMode
    try:
        mode = FakeTensorMode()
        fake = [mode.from_tensor(t) for t in traced.example]
        recorder = _Recorder(traced.gm, mode.from_tensor)
        with mode, torch.no_grad():
            recorder.run(*fake)
        return recorder.values, "fake"
    except Exception:  # noqa: BLE001 (fake tensors cannot follow this graph: run it)
        pass
    recorder = _Recorder(traced.gm)
    example = [t.detach().clone() if s.kind == "buffer" else t
               for s, t in zip(traced.slots, traced.example)]
    with _rng_kept(device), torch.no_grad():
        recorder.run(*example)
    return recorder.values, "real"
