"""Capture: a module's whole training step as one graph of ATen operators.

PyTorch traces its own step: the module's forward, the user's loss and
autograd's backward (torch.autograd.grad), with make_fx. The graph must have
no hidden mutation: where its in-place calls are simple (an activation's
relu_, a residual add_, a batch-norm counter's add_: see _made_functional),
they are replaced here by their functional variants; otherwise the graph is
traced a second time through functionalization (the two-pass scheme of
functorch's AOTAutograd; the second pass costs as much as the first). The
result is a torch.fx.GraphModule whose inputs are the step's persistent
tensors (Slot) and whose outputs are the loss and the gradients; _graph.py
turns it into a pebble graph.

Tracing runs on fake tensors where PyTorch can (nothing is computed or
allocated), else on real ones: then the generator's state and the buffers are
put back as they were. A fake trace records each node's fake value, which
_graph.py reads (shapes, and which storage a view shares); a real one is run
again over fake tensors for them (propagate).
"""

import contextlib
import dis
import functools
import linecache
import math
import operator
import os
import random
import re
import sys
import sysconfig
import threading
import traceback
import types
import warnings
import weakref

import torch
from torch.utils._pytree import tree_flatten

from ._collective_ops import hold_divisors, mean_over_ranks
from ._compat import (FakeTensor, FakeTensorMode, forget_dead_fake_converters,
                      forget_fx_source_with, forget_traces, functional_call, functionalize,
                      make_fx, make_fx_with_stacks, op_name, recompile, storage_alive,
                      storage_bytes, storage_key, traced_frames, traced_node)
from ._memory import is_dense
from ._view_writes import (UNFILLED, functional_through_views, overlapping_write,
                           reshaped_and_written, writes_self)


class CaptureError(ValueError):
    """The module or its loss cannot be captured; the message names the module
    and PyTorch's reason."""


# Note [What a trace reads from the module]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A trace runs the module's Python once: every plain attribute that the
# forward reads (Dropout's p, a batch norm's momentum and training flag, a
# constant of the user's) and every forward hook is baked into the graph.
# Eager PyTorch reads them afresh each call, so a change after the capture
# (a submodule put in eval mode to freeze its statistics, a dropout
# schedule, a hook added or removed) must make a new capture, as new shapes
# do: ModuleSettings is that part of a call's signature. So must the loss's
# settings (a label smoothing, a weight that a schedule anneals in the
# closure: _loss_settings), as far as they can be found without running
# it. An attribute that the forward itself changes (a Python counter)
# changes at capture only, as any Python state in a traced forward does.
# Each module's class, and callables bound to its attributes (a patched
# forward, `self.act = F.gelu`), count too: another class or function runs
# other code. A tensor that a global names, or the loss's closure or
# object holds, counts by identity (_Identity): rebound, the trace's
# constant is the old one; written in place, the graph reads it as it is.

_PLAIN = (bool, int, float, str, type(None))


_NOT_PLAIN = object()


def _plain(value):
    """`value` where it is a plain setting (a number, string, None, or a
    tuple or list of up to 64 of them, as a tuple: a kernel size, not a
    vocabulary), else _NOT_PLAIN."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (tuple, list)) and len(value) <= 64 and \
            all(isinstance(v, _PLAIN) for v in value):
        return tuple(value)
    return _NOT_PLAIN


def _hook_name(hook):
    return getattr(hook, "__qualname__", type(hook).__name__)


class _Local:
    """A setting that the ranks do not compare: it changes a rank's capture
    like any other, but its repr, which the ranks compare (check_same_call),
    is the same whatever it holds, as each rank may hold its own (a
    configuration object with its local rank, a device string that the loss
    names)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, _Local) and self.value == other.value

    def __hash__(self):
        return hash(self.value)

    def __repr__(self):
        return "_Local()"


def _shown(value):
    return value.value if isinstance(value, (_Local, _Shown)) else value


def _shown_after(before, after):
    """How a setting's new value reads beside its old one: a tensor bound
    anew in another's place, of the same shape, as another tensor (their
    reprs are alike: _Identity's has no address)."""
    if isinstance(before, _Identity) and isinstance(after, _Identity):
        return f"another tensor of shape {list(after.shape)}"
    return repr(_shown(after))


class _Shown:
    """A setting equal by `key` (a class, a callable's _callable_key) and
    shown, to people and to the other ranks, as `shown` (a class's
    qualified name: its module is __main__ on one rank and __mp_main__ on a
    spawned one)."""

    __slots__ = ("key", "value")

    def __init__(self, key, shown):
        self.key, self.value = key, shown

    def __eq__(self, other):
        return isinstance(other, _Shown) and self.key == other.key

    def __hash__(self):
        return hash(self.key)

    def __repr__(self):
        return repr(self.value)


def _callable_shown(value):
    """A callable as a person reads it, the same on every rank: its name, a
    functools.partial's with its plain arguments."""
    if not isinstance(value, functools.partial):
        return _hook_name(value)
    arguments = [repr(a) if _plain(a) is not _NOT_PLAIN else "..." for a in value.args] + \
        [f"{k}={v!r}" if _plain(v) is not _NOT_PLAIN else f"{k}=..."
         for k, v in sorted(value.keywords.items())]
    return f"partial({', '.join([_callable_shown(value.func)] + arguments)})"


def _callable_key(value):
    """What tells the code a callable attribute runs from another's: a
    function's code (a lambda that the forward makes again at each eager
    call is the same one) and its closure's plain values, a bound method's
    function and object, a functools.partial's function and plain
    arguments; any other callable itself."""
    if isinstance(value, functools.partial):
        return ("partial", _callable_key(value.func),
                tuple(_plain(a) if _plain(a) is not _NOT_PLAIN else id(a) for a in value.args),
                tuple(sorted((k, _plain(v) if _plain(v) is not _NOT_PLAIN else id(v))
                             for k, v in value.keywords.items())))
    if isinstance(value, types.MethodType):
        return ("method", value.__func__, id(value.__self__))
    if isinstance(value, types.FunctionType):
        cells = []
        for cell in value.__closure__ or ():
            try:
                cells.append(_plain(cell.cell_contents))
            except ValueError:  # (a cell not filled yet)
                cells.append(None)
        return ("function", value.__code__, tuple(c for c in cells if c is not _NOT_PLAIN))
    try:
        hash(value)
        return value
    except TypeError:
        return id(value)


class _Identity:
    """A tensor as a setting: equal while it is the same object (a trace
    holds the tensor itself, so a write in place reaches the graph, and a
    new tensor bound in its place does not)."""

    __slots__ = ("ref", "key", "shape")

    def __init__(self, tensor):
        self.ref = weakref.ref(tensor)
        self.key = id(tensor)
        self.shape = tuple(tensor.shape)

    def __eq__(self, other):
        return isinstance(other, _Identity) and self.key == other.key and \
            self.ref() is not None and self.ref() is other.ref()

    def __hash__(self):
        return hash(self.key)

    def __repr__(self):  # (no address: the ranks compare the settings' text)
        return f"<a tensor of shape {list(self.shape)}>"


def _watched(value, seen=None):
    """A global's or the loss's value as a setting: a tensor by identity
    (_Identity), a dict of up to 64 entries that holds tensors as its plain
    keys' tensors and plain values (sorted pairs), else _setting's."""
    if isinstance(value, torch.Tensor):
        return _Identity(value)
    if isinstance(value, dict) and 0 < len(value) <= 64 and \
            any(isinstance(v, torch.Tensor) for v in value.values()):
        # (its values that are neither, a function say, are not watched)
        items = [(k, _Identity(v) if isinstance(v, torch.Tensor) else _plain(v))
                 for k, v in value.items() if isinstance(k, _PLAIN)]
        return tuple(sorted(((k, v) for k, v in items if v is not _NOT_PLAIN),
                            key=lambda item: repr(item[0])))
    return _setting(value, seen)


def _loss_module_settings(module):
    """A loss module's settings: its plain attributes (_plain_attributes),
    and its buffers and tensor attributes by identity (a trace takes them as
    constants: CrossEntropyLoss's class weights bound anew, `loss.weight =
    w`, must make a new capture)."""
    tensors = [(f"buffer {name}", _Identity(t)) for name, t in module._buffers.items()
               if t is not None]
    tensors += [(name, _Identity(t)) for name, t in vars(module).items()
                if not name.startswith("_") and isinstance(t, torch.Tensor)]
    return _plain_attributes(module) + tuple(tensors)


def _module_label(name, module):
    """How errors name a module: "'layer1.0' (BasicBlock)", the root by its
    class."""
    return f"'{name}' ({type(module).__name__})" if name else type(module).__name__


def _plain_attributes(obj, seen=None):
    """The plain settings among `obj`'s attributes, dicts of them and
    configuration objects included (_setting): ((name, value), ...).
    `seen`: id -> setting of the configuration objects met so far (one
    object held by many modules is read once)."""
    plain = []
    for key, value in getattr(obj, "__dict__", {}).items():
        if key[0] == "_":
            continue  # (parameters, buffers, submodules, hooks)
        value = _setting(value, seen)
        if value is not _NOT_PLAIN:
            plain.append((key, value))
    return tuple(plain)


def _setting(value, seen=None):
    """`value` as a setting a trace may read: plain (_plain), a dict of up
    to 64 plain keys and values (as sorted pairs), the plain attributes of
    a configuration object (one that is no module, tensor, class or
    callable, of up to 256 attributes: a dataclass, a namespace; _Local,
    and memoised in `seen`), else _NOT_PLAIN."""
    plain = _plain(value)
    if plain is not _NOT_PLAIN:
        return plain
    if isinstance(value, dict) and len(value) <= 64:
        items = [(k, _plain(v)) for k, v in value.items() if isinstance(k, _PLAIN)]
        if len(items) == len(value) and all(v is not _NOT_PLAIN for _, v in items):
            return tuple(sorted(items, key=repr))
        return _NOT_PLAIN
    if seen is not None and id(value) in seen:
        return seen[id(value)]
    if not _is_configuration(value):
        return _NOT_PLAIN
    items = tuple((k, _plain(v)) for k, v in vars(value).items() if not k.startswith("_"))
    setting = _Local((type(value).__qualname__,
                      tuple((k, v) for k, v in items if v is not _NOT_PLAIN)))
    if seen is not None:
        seen[id(value)] = setting
    return setting


def _is_configuration(value):
    """Whether `value` is an object whose attributes configure the code that
    reads them (_setting)."""
    if callable(value) or isinstance(value, (torch.nn.Module, torch.Tensor, type,
                                             types.ModuleType)):
        return False
    attrs = getattr(value, "__dict__", None)
    return isinstance(attrs, dict) and len(attrs) <= 256


def _loss_settings(loss_fn):
    """What a trace reads from `loss_fn` besides tensors, as ModuleSettings
    keeps a module's: (name, settings) pairs. A module's plain attributes
    (label smoothing, a weight), for it and each submodule; a function's
    closure cells and the globals its own code names, and a
    functools.partial's arguments: each plain value or dict of them (a
    weight that a schedule anneals), and each module's attributes; a
    callable object's plain attributes; configuration objects among them
    as _setting reads them; what the user's functions that it calls read
    (_function_reads). A function's are _Local. (A loss module's forward is
    read with the model's classes: ModuleSettings.)"""
    if isinstance(loss_fn, torch.nn.Module):
        return tuple((f"loss_fn.{name}" if name else "loss_fn", _loss_module_settings(module))
                     for name, module in loss_fn.named_modules())
    read = []  # (name, value)
    if isinstance(loss_fn, functools.partial):
        read += [(f"arg{k}", v) for k, v in enumerate(loss_fn.args)]
        read += sorted(loss_fn.keywords.items())
        loss_fn = loss_fn.func
    cls = None
    if isinstance(loss_fn, types.MethodType):  # (a trainer's compute_loss: self.alpha)
        # Its object's attributes that the method names (not a step counter
        # that the trainer keeps beside them).
        named = _attributes_named_in(loss_fn.__func__.__code__)
        read += [(f"self.{k}", v) for k, v in vars(loss_fn.__self__).items() if k in named]
        cls = type(loss_fn.__self__)
        loss_fn = loss_fn.__func__
    if isinstance(loss_fn, types.FunctionType):
        read += [(name, value) for name, _, value, _, _ in _function_reads(loss_fn, cls)]
    elif not isinstance(loss_fn, types.BuiltinFunctionType):
        read += list(getattr(loss_fn, "__dict__", {}).items())
    found, modules = [], []
    for name, value in read:
        if isinstance(value, torch.nn.Module):
            modules += [(f"loss_fn:{name}.{sub}" if sub else f"loss_fn:{name}",
                         _loss_module_settings(module)) for sub, module in value.named_modules()]
        elif not name.rpartition(".")[2].startswith("_"):
            value = _watched(value)
            if value is not _NOT_PLAIN:
                found.append((name, value if isinstance(value, _Local) else _Local(value)))
    return ((("loss_fn", tuple(found)),) if found else ()) + tuple(modules)


def _code_and_nested(code):
    """`code` (None: nothing) and the code of the functions defined in it
    (a lambda in a forward, a comprehension), depth first."""
    stack = [code] if code is not None else []
    while stack:
        c = stack.pop()
        yield c
        stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]


@functools.lru_cache(maxsize=512)  # (read at every call: a loss's code)
def _names_in(code):
    """The global names that `code` and the functions defined in it load,
    in order, each once; not attributes (`self.epoch` reads no global
    `epoch`)."""
    return tuple(dict.fromkeys(i.argval for c in _code_and_nested(code)
                               for i in dis.get_instructions(c)
                               if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")))


@functools.lru_cache(maxsize=512)
def _attributes_named_in(code):
    """Every name that `code` and the functions defined in it load or
    store, attributes among them (self.alpha names `alpha`)."""
    return frozenset(name for c in _code_and_nested(code) for name in c.co_names)


def _draws_in_python(value):
    """Whether a global is Python's or NumPy's random module, one of their
    generators (random.Random(0), np.random.default_rng()) or one of their
    functions (`from random import random`)."""
    if isinstance(value, types.ModuleType):
        return value.__name__ in ("random", "numpy.random")
    owner = getattr(value, "__self__", None)
    return any(isinstance(v, random.Random) or type(v).__module__.startswith("numpy.random")
               for v in (value, owner))


def python_randomness(model):
    """The user's module classes whose forward (or a function defined in it)
    names Python's or NumPy's random module or one of their functions, or
    `np.random` through NumPy (a LayerDrop's `random.random() < p`): a
    trace runs that Python once, so every step takes the capture's draw."""
    found = []
    for cls in sorted({type(m) for m in model.modules()},
                      key=lambda c: (c.__module__, c.__qualname__)):
        forward = getattr(cls, "forward", None)
        code = getattr(forward, "__code__", None)
        if cls.__module__.startswith("torch.") or code is None:
            continue
        names = getattr(forward, "__globals__", {})
        attributes = _attributes_named_in(code)
        for name in _names_in(code):
            value = names.get(name)
            if _draws_in_python(value) or (
                    isinstance(value, types.ModuleType) and value.__name__ == "numpy" and
                    "random" in attributes):
                found.append(f"{cls.__qualname__}.forward ({name})")
                break
    return found


def _forward_globals(classes, seen):
    """The settings among what the forwards of `classes` (not PyTorch's
    own) read besides the module (_function_reads: the globals their code
    names, a module of the user's attributes, and the same of the user's
    functions they call): a scale or a flag that a schedule changes at
    module level. (name, ((global, _Local setting), ...)) per class that
    reads any."""
    found = []
    for cls in sorted(classes, key=lambda c: (c.__module__, c.__qualname__)):
        forward = getattr(cls, "forward", None)
        if cls.__module__.startswith("torch.") or not isinstance(forward, types.FunctionType):
            continue
        items = []
        for name, _, value, _, _ in _function_reads(forward, cls):
            setting = _watched(value, seen)
            if setting is not _NOT_PLAIN:
                items.append((name, setting if isinstance(setting, _Local) else _Local(setting)))
        if items:
            found.append((f"globals of {cls.__qualname__}.forward", tuple(items)))
    return found


class ModuleSettings:
    """What a trace of `model` and `loss_fn` reads from them besides tensors
    (Note [What a trace reads from the module]): each module's plain
    attributes (its training flag among them) and its forward hooks, with
    the global ones, and the loss's settings (_loss_settings). Equal in one
    process where the same hooks are on the same modules; the repr names the
    hooks, so that ranks compare it."""

    __slots__ = ("attrs", "hooks")

    def __init__(self, model, loss_fn=None):
        attrs, hooks, seen, classes = [], [], {}, set()
        for name, module in model.named_modules():
            cls = type(module)
            on = module.__dict__
            # (a patched forward, self.act = F.gelu)
            bound = tuple((key, _Shown(_callable_key(value), _callable_shown(value)))
                          for key, value in on.items()
                          if key[0] != "_" and callable(value) and
                          not isinstance(value, (torch.nn.Module, type)))
            attrs.append((name, (("(class)", _Shown(cls, cls.__qualname__)),) + bound +
                          _plain_attributes(module, seen)))
            classes.add(cls)
            for kind in ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks"):
                if on.get(kind):
                    hooks.append((name, kind, tuple(on[kind].values())))
        for kind in ("_global_forward_pre_hooks", "_global_forward_hooks",
                     "_global_backward_hooks"):
            on = getattr(torch.nn.modules.module, kind, None)
            if on:
                hooks.append(("", kind, tuple(on.values())))
        if isinstance(loss_fn, torch.nn.Module):  # (a loss of the user's own class)
            classes.update(type(module) for module in loss_fn.modules())
        attrs += _forward_globals(classes, seen)
        if loss_fn is not None:
            attrs += _loss_settings(loss_fn)
        self.attrs, self.hooks = tuple(attrs), tuple(hooks)

    def __eq__(self, other):
        return isinstance(other, ModuleSettings) and self.attrs == other.attrs and \
            self.hooks == other.hooks

    def __hash__(self):
        return hash((self.attrs, self.hooks))

    def __repr__(self):
        hooks = [(name, kind, [_hook_name(h) for h in on]) for name, kind, on in self.hooks]
        return f"ModuleSettings({self.attrs!r}, {hooks!r})"

    def entries(self):
        """{"layer1.0.bn1.training": "True", "hooks on 'fc'": "..."}: each
        setting as text, which ranks compare (check_same_call's
        `described`)."""
        shown = {f"{name + '.' if name else ''}{key}": repr(_shown(value))
                 for name, items in self.attrs for key, value in items}
        for name, kind, on in self.hooks:
            shown[f"hooks on '{name}'" if name else "global hooks"] = \
                f"{kind} {', '.join(getattr(h, '__qualname__', type(h).__name__) for h in on)}"
        return shown

    def changes_from(self, before):
        """What differs from `before` (another ModuleSettings of the same
        module), as "layer1.0.bn1.training: True -> False" and "hooks on
        'fc'" lines."""
        old = {(name, key): value for name, items in before.attrs for key, value in items}
        new = {(name, key): value for name, items in self.attrs for key, value in items}
        lines = [f"{name + '.' if name else ''}{key}: "
                 f"{_shown(old.get((name, key), '(none)'))!r} -> "
                 f"{_shown_after(old.get((name, key)), new.get((name, key), '(none)'))}"
                 for name, key in sorted(set(old) | set(new))
                 if (name, key) not in old or (name, key) not in new or
                 old[(name, key)] is not new[(name, key)] and
                 old[(name, key)] != new[(name, key)]]
        old_hooks = {(name, kind): on for name, kind, on in before.hooks}
        new_hooks = {(name, kind): on for name, kind, on in self.hooks}
        hooked = {name for name, kind in set(old_hooks) | set(new_hooks)
                  if old_hooks.get((name, kind)) != new_hooks.get((name, kind))}
        return lines + [f"hooks on '{name}'" if name else "global hooks"
                        for name in sorted(hooked)]


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
            self.handles.append(module.register_forward_pre_hook(
                self._enter(_module_label(name, module))))
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
    `grad_slots` order, then, where the gradients are clipped, their total
    norm before clipping. `grad_slots`: the trainable parameters the loss
    reaches (others get no gradient, as in eager mode)."""

    def __init__(self, gm, slots, grad_slots, mode, example):
        self.gm = gm
        self.slots = slots
        self.grad_slots = grad_slots
        self.mode = mode  # "fake" or "real": how it was traced
        self.example = example  # the slots' tensors it was traced with (buffers copied)
        self.values = None  # fx node -> fake value, where the trace recorded them all
        # The fake mode of `example` where it is fakes (Note [Stand-ins for
        # sharded parameters]), else None.
        self.fake_mode = None
        self.passes = 2  # make_fx traces: 1 where in-place calls were made functional here
        # The slots (indices) of the parameters and buffers whose values the
        # trace read in Python (Note [State values read in Python]), and
        # (label, get, tensor) of the tensors in plain attributes that the
        # graph reads (Note [Tensors in plain attributes]).
        self.state_read, self.plain_read = [], []


# Note [Buffers rebound by the forward]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A forward may update a buffer by binding a new tensor to it
# (`self.ema = 0.9 * self.ema + ...`) rather than in place. Eager keeps the
# new tensor as the buffer; functional_call puts the traced buffer back when
# the forward returns, so the new value was lost (the buffer never moved,
# silently). functional_call writes what the forward binds into the dict of
# tensors it was given (PyTorch 1.13 as the forward binds it, 2.x as the
# call returns), and a forward hook on each module with buffers sees what
# its buffers hold when its forward returns: a buffer bound anew by its own
# module's forward or by another's (a parent's `self.child.ema = ...`) is
# found. Each is then written in place with its new value, which the
# capture takes as any in-place update of a buffer (batch norm's
# statistics): the step's new value of it, copied into the module's buffer
# after the step.


@contextlib.contextmanager
def _buffers_rebound(model, state):
    """Yields {buffer name: the tensor the forward bound to it} of the
    buffers of `model` that the forward calls (functional_call with `state`,
    a copy of which this takes) bind to another tensor than `state`'s."""
    rebound, handles = {}, []

    def hook(prefix):
        def seen(module, args, output):
            for name in module._buffers:
                key = prefix + name
                t = getattr(module, name)  # (the call's tensor, in 1.13 and 2.x alike)
                if key in state and isinstance(t, torch.Tensor) and t is not state[key]:
                    rebound[key] = t
        return seen
    try:
        for prefix, module in model.named_modules():
            if module._buffers:
                handles.append(module.register_forward_hook(
                    hook(f"{prefix}." if prefix else "")))
        yield rebound
    finally:
        for h in handles:
            h.remove()


# Note [Tensors the forward binds to attributes]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A forward may bind a tensor to a plain attribute that is neither a
# parameter nor a buffer: torch.nn.utils.weight_norm's and spectral_norm's
# hooks bind `module.weight` before each call, and a module may keep its last
# attention map for logging, in an attribute or a list or dict of them. The
# trace runs the forward on its own tensors (fake ones, or a real trace's),
# so such an attribute was left holding one: a fake tensor that reads as
# zeros and cannot be pickled (torch.save of the model failed). A traced step
# does not run the forward's Python, so such an attribute is not a step's
# value anyway: after the trace, a module whose attributes the forward left
# holding other tensors (bound, added, removed, or in a list or dict changed
# in place) gets its attributes back as they were, all of them (a cache's
# flag with its tensor); a module whose forward changed plain values alone (a
# counter) keeps them (Note [What a trace reads from the module]).


_ABSENT = object()


def _holds_tensor(value):
    """Whether `value` is a tensor, or a list, tuple, set or dict holding one."""
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (list, tuple, set, frozenset)):
        return False
    return any(isinstance(v, torch.Tensor) for v in value)


def _contents(value):
    """A shallow copy of a list's or a dict's items, else None."""
    if type(value) is list:  # noqa: E721 (a subclass may hold more than items)
        return list(value)
    if type(value) is dict:  # noqa: E721
        return dict(value)
    return None


def _same_items(a, b):
    """Whether two lists, or two dicts, hold the same objects."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


class _ModuleState:
    """A module's attributes as they were, and its lists' and dicts' items."""

    def __init__(self, module):
        self.module = module
        self.attributes = dict(vars(module))
        self.items = {k: c for k, v in self.attributes.items()
                      if not k.startswith("_") and (c := _contents(v)) is not None}

    def restore(self):
        """Puts every attribute back, and the lists' and dicts' items (a
        trace that failed: the module as the user left it)."""
        self._put_back(set(self.attributes) | set(vars(self.module)), self.items)

    def _put_back(self, keys, containers):
        """The attributes `keys` as they were (bound, or absent), and the
        items of the lists and dicts `containers` (keys of self.items)."""
        now = vars(self.module)
        for k in keys:
            was = self.attributes.get(k, _ABSENT)
            if was is _ABSENT:
                now.pop(k, None)
            else:
                now[k] = was
        for k in containers:
            container = self.attributes[k]
            container.clear()
            if isinstance(container, list):
                container.extend(self.items[k])
            else:
                container.update(self.items[k])

    def restore_if_tensors_changed(self):
        """Puts the attributes back (Note [Tensors the forward binds to
        attributes]) where the forward left other tensors in them."""
        now = vars(self.module)
        rebound = [k for k in set(self.attributes) | set(now)
                   if self.attributes.get(k, _ABSENT) is not now.get(k, _ABSENT) and
                   (not k.startswith("_") or _holds_tensor(self.attributes.get(k)) or
                    _holds_tensor(now.get(k)))]
        changed_items = [k for k, items in self.items.items()
                         if now.get(k) is self.attributes[k] and
                         not _same_items(_contents(now[k]), items)]
        if not (any(_holds_tensor(self.attributes.get(k)) or _holds_tensor(now.get(k))
                    for k in rebound) or
                any(_holds_tensor(self.items[k]) or _holds_tensor(now[k])
                    for k in changed_items)):
            return
        self._put_back(rebound, changed_items)


@contextlib.contextmanager
def _attributes_restored(model):
    """Puts back every attribute of each module of `model` on the way out
    (_ModuleState.restore): a run that only diagnoses leaves the module as
    it was."""
    states = [_ModuleState(module) for module in model.modules()]
    try:
        yield
    finally:
        for state in states:
            state.restore()


@contextlib.contextmanager
def _tensor_attributes_kept(model):
    """Restores, on the way out, the attributes of each module of `model`
    whose forward left other tensors in them (_ModuleState), and every
    attribute where the trace failed (a forward that set `max_cached` before
    failing would leave it set for eager calls too)."""
    states = [_ModuleState(module) for module in model.modules()]
    try:
        yield
    except BaseException:
        for state in states:
            state.restore()
        raise
    for state in states:
        state.restore_if_tensors_changed()


# Note [Tensors in plain attributes]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A tensor bound to a module's plain attribute, neither a parameter nor a
# buffer (state its author forgot to register_buffer), is a constant to a
# trace: the step reads it as it was at capture. A forward that carries
# state in one from call to call therefore differs from eager:
# - written in place (`self.stats.mul_(0.9).add_(h.mean(0))` under no_grad,
#   a counter's add_): the trace itself wrote the user's tensor, and failed
#   with PyTorch's internal assert about functionalization or a refusal of a
#   written constant that named no attribute (until 2026-12-05). Now the
#   values are put back and the capture is refused, naming the attribute:
#   as a buffer it is updated in place each step, as batch norm's are.
# - rebound from a value the step reads (`self.state = 0.5 * self.state +
#   ...`): every step read the captured value, silently. Now a UserWarning
#   names it. Rebinding alone is not refused: a forward may make the same
#   value at each call (a cast of a mask), and weight_norm's hook binds its
#   weight before each call (Note [Tensors the forward binds to attributes]).
# - rebound between calls, by the user's code (`model.temperature =
#   torch.tensor(t)` as a schedule anneals it): the step read the captured
#   tensor, silently, until 2026-12-06. The capture keeps which such tensors
#   its graph reads (Traced.plain_read), and a call that finds one bound anew
#   captures again, with a warning (TrainStep._stale).
class _WatchedTensors:
    """Tensors noted as a trace starts: each one's object, version counter
    and a host copy of its values (within `copy_limit` bytes in all; None:
    every one), to find those the trace bound anew or wrote, and put them
    back. Entries: (label, get, put, tensor, version, copy); get() reads
    what its name holds now (_ABSENT: nothing), put(t) binds it anew."""

    def __init__(self, copy_limit=None):
        self.entries = []
        self.copy_limit = copy_limit
        self.copied_bytes = 0

    def _add(self, label, get, put, value):
        if not isinstance(value, torch.Tensor) or isinstance(value, FakeTensor) or \
                value.is_inference() or value.is_meta or value.layout != torch.strided:
            return
        nbytes = value.numel() * value.element_size()
        copied = self.copy_limit is None or self.copied_bytes + nbytes <= self.copy_limit
        if copied:
            self.copied_bytes += nbytes
        self.entries.append((label, get, put, value, value._version,
                             value.detach().to("cpu", copy=True) if copied else None))

    def _watch(self, label, mapping, key, value):
        self._add(label, lambda: mapping.get(key, _ABSENT),
                  lambda t: mapping.__setitem__(key, t), value)

    def _watch_attribute(self, label, owner, key, value):
        self._add(label, lambda: vars(owner).get(key, _ABSENT),
                  lambda t: setattr(owner, key, t), value)

    def read_by(self, gm):
        """(label, get, tensor) of the tensors that `gm` reads as constants."""
        read = _constants_read(gm)
        return [(label, get, tensor) for label, get, _, tensor, _, _ in self.entries
                if id(tensor) in read]

    def rebound(self):
        """(label, tensor) of the names bound to another object now."""
        return [(label, tensor) for label, get, _, tensor, _, _ in self.entries
                if get() is not tensor]

    def written_put_back(self):
        """The labels of the tensors written in place since, each given its
        values back (one without a copy: its label says they were not)."""
        labels = (self._values_put_back(label, tensor, version, copy)
                  for label, _, _, tensor, version, copy in self.entries)
        return [label for label in labels if label is not None]

    @staticmethod
    def _values_put_back(label, tensor, version, copy):
        """For a tensor written since its entry was made: its values put back
        from `copy`, and its label (noting where there was no copy); else
        None."""
        if tensor._version == version:
            return None
        if copy is None:
            return f"{label} (written: its values were not put back)"
        with torch.no_grad():
            tensor.copy_(copy)
        return label


class _PlainTensors(_WatchedTensors):
    """The tensors bound to plain attributes of `modules` ((label, module)
    pairs) as a trace starts, every one copied."""

    def __init__(self, modules):
        super().__init__()
        for label, module in modules:
            for key, value in vars(module).items():
                if not key.startswith("_"):
                    self._watch_attribute(f"{label}.{key}", module, key, value)


def _plain_tensors_of(model, loss_fn):
    """_PlainTensors of `model`'s modules and a loss module's."""
    modules = [("model" + (f".{name}" if name else ""), m) for name, m in model.named_modules()]
    if isinstance(loss_fn, torch.nn.Module):
        modules += [("loss_fn" + (f".{name}" if name else ""), m)
                    for name, m in loss_fn.named_modules()]
    return _PlainTensors(modules)


# Note [State the loss carries]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# loss_fn runs outside the module's functional call, on the real tensors it
# reaches: a buffer of the model or of a loss module, a tensor in its
# closure or in a dict there, an attribute of the object of a bound method.
# A loss that updates such state at each call (DINO's centering,
# `self.center = 0.9 * self.center + 0.1 * out.mean(0)`; a running EMA of
# the loss; counts added in place) is traced once: the capture applied the
# update once, on the example batch, bound the user's buffer to the trace's
# tensor (so that the next call captured again), and the step never updated
# it again, silently (or, written in place, failed with PyTorch's internal
# assert about functionalization); until 2026-12-06. Each such tensor's
# object and version are noted before a trace; one rebound or written by it
# is put back as it was (its values too, from a host copy) and the capture
# is refused, naming it. The forward's own updates of buffers are made on
# the trace's copies (functional_call), so they are not such changes.
_LOSS_STATE_COPY_BYTES = 64 << 20  # what _LossState copies to put back, in all


def _names_loss_fn_reads(loss_fn):
    """(label, value, get, put) of each variable that `loss_fn` reads
    (_function_reads; of a functools.partial: its function's, and its
    arguments, which cannot be bound anew; of a loss module: its class's
    forward's): get() reads it now (_ABSENT: unbound), put(v) binds it
    anew."""
    if isinstance(loss_fn, functools.partial):
        for k, value in list(enumerate(loss_fn.args)) + sorted(loss_fn.keywords.items()):
            yield (f"loss_fn's argument {k}", value, lambda value=value: value, lambda t: None)
        loss_fn = loss_fn.func
    function = getattr(loss_fn, "__func__", loss_fn)
    owner = getattr(loss_fn, "__self__", None)
    if isinstance(loss_fn, torch.nn.Module):  # (its forward, as a bound method's)
        function, owner = getattr(type(loss_fn), "forward", None), loss_fn
    if isinstance(function, types.FunctionType):
        for _, label, value, get, put in _function_reads(
                function, type(owner) if owner is not None else None):
            yield label, value, get, put


# Note [What the loss's helpers read]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A loss often calls a function of the user's own that reads a global of
# its module (`return SCALE * F.cross_entropy(out, y)` in losses.py, SCALE
# annealed by the training loop), or reads a module of theirs
# (`config.ALPHA`). The trace bakes such a value in like the loss's own
# globals, so it is a setting (a change makes a new capture) and a tensor
# there is state the loss may carry (_LossState); until 2026-12-06 only
# the loss's own closure and globals were, and a changed SCALE was ignored
# silently. Followed: the functions of the user's code (not PyTorch's,
# pebble's, Python's library or an installed package: _library_directories)
# that the loss's closure or globals hold, or an attribute of the user's
# module that its code names, and theirs in turn, to _HELPERS_FOLLOWED
# functions; for a bound method (a trainer's compute_loss) or a forward,
# also the methods of its class that its code names (`self._act(x)`), and
# theirs. Not followed: methods of other objects, functions held in a list
# or dict, and what a function receives as an argument. A global that a
# helper binds anew without the graph reading the old tensor (a cache it
# grows) is put back, not refused (_LossState.changed_put_back). A forward
# of the user's module class (the model's or a loss module's) is read alike
# (_forward_globals): `helpers.leaky(x)` reading a SLOPE global.
_HELPERS_FOLLOWED = 32


def _function_reads(function, cls=None):
    """(name, label, value, get, put) of each variable that `function` reads,
    each once: its closure's cells and the globals its code loads, the
    attributes its code names of a module of the user's own, and the same of
    the user's functions among them and, where `function` is a method of
    `cls`, of the methods of `cls` that it names (Note [What the loss's
    helpers read]).
    `name` is a setting's name (`alpha`; a global of another module:
    `losses.SCALE`), `label` an error's (`the global losses.SCALE`,
    `make_loss.<locals>.ce's alpha`); get() reads the variable
    now (_ABSENT: unbound), put(v) binds it anew."""
    libraries = _library_directories()
    home = function.__globals__.get("__name__")  # (the loss's module: its globals unqualified)
    # (functions by identity: two closures of one factory share their code,
    # each with its own cells, named apart: `make_term.<locals>.term#2`)
    todo, followed, labels = [(function, None, cls)], {id(function)}, set()
    names = {}

    def follow(value, cls=None):
        if isinstance(value, types.FunctionType) and id(value) not in followed and \
                len(followed) < _HELPERS_FOLLOWED and _users_function(value, libraries):
            followed.add(id(value))
            seen = names[value.__qualname__] = names.get(value.__qualname__, 0) + 1
            todo.append((value, value.__qualname__ + (f"#{seen}" if seen > 1 else ""), cls))
    while todo:
        function, helper, cls = todo.pop(0)
        for read in _own_reads(function, helper, home, libraries):
            if read[1] not in labels:
                labels.add(read[1])
                yield read
                follow(read[2])
        # (a library's class, torchvision's: its methods are no user's code)
        if cls is not None and _users_function(function, libraries):
            for name in sorted(_attributes_named_in(function.__code__)):
                follow(_method_function(cls, name), cls)


def _method_function(cls, name):
    """The function behind `cls`'s attribute `name` where it is a method,
    a static or class method or a property's getter, else None."""
    # (the class dicts along the MRO, as inspect.getattr_static reads them:
    # no descriptor runs, a property that raises included; at every call)
    member = next((vars(c)[name] for c in cls.__mro__ if name in vars(c)), None)
    if isinstance(member, (staticmethod, classmethod)):
        return member.__func__
    return member.fget if isinstance(member, property) else member


def _own_reads(function, helper, home, libraries):
    """_function_reads of `function` alone; `helper`: its name where the
    loss calls it, None for the loss itself; `home`: the loss's module's
    name."""
    code = function.__code__
    for read in _variables_read(function, helper, home):
        yield read
        module = read[2]
        if isinstance(module, types.ModuleType) and _users_module(module, libraries):
            attributes = vars(module)
            for attr in sorted(_attributes_named_in(code) & attributes.keys()):
                if attr.startswith("__") or isinstance(attributes[attr], (type,
                                                                           types.ModuleType)):
                    continue
                name = f"{module.__name__}.{attr}"
                yield (name, f"the global {name}", attributes[attr],
                       lambda a=attr, m=attributes: m.get(a, _ABSENT),
                       lambda t, m=module, a=attr: setattr(m, a, t))


def _variables_read(function, helper, home):
    """_own_reads' variables of `function`: its closure's cells and the
    globals its code loads (not attributes' names)."""
    code = function.__code__
    for var, cell in zip(code.co_freevars, function.__closure__ or ()):
        def get(cell=cell):
            try:
                return cell.cell_contents
            except ValueError:  # (an empty cell)
                return _ABSENT
        if get() is not _ABSENT:
            yield (var if helper is None else f"{helper}.{var}",
                   f"loss_fn's {var}" if helper is None else f"{helper}'s {var}", get(), get,
                   lambda t, cell=cell: setattr(cell, "cell_contents", t))
    module_globals = function.__globals__
    module_name = module_globals.get("__name__")
    for var in _names_in(code):
        if var in module_globals:
            name = var if module_name == home else f"{module_name}.{var}"
            yield (name, f"the global {name}", module_globals[var],
                   lambda var=var: module_globals.get(var, _ABSENT),
                   lambda t, var=var: module_globals.__setitem__(var, t))


def _users_function(function, libraries):
    """Whether `function` is of the user's code: defined in a file outside
    `libraries` (_library_directories), or typed in (a notebook's cell;
    any file name in <>, code made by exec too, but for Python's frozen
    modules)."""
    return _users_path(function.__code__.co_filename, libraries)


def _users_module(module, libraries):
    """Whether `module` is of the user's code (a file outside `libraries`,
    or the script run)."""
    path = getattr(module, "__file__", None)
    return module.__name__ == "__main__" if path is None else _users_path(path, libraries)


@functools.lru_cache(maxsize=4096)  # (read at every call: realpath asks the file system)
def _users_path(path, libraries):
    """_users_function's and _users_module's test of a file's path."""
    if path.startswith("<"):
        return not path.startswith("<frozen")
    return _users_file(path, libraries)


class _LossState(_WatchedTensors):
    """The tensors `loss_fn` reaches besides the batch and the model's
    parameters (Note [State the loss carries]), as a trace starts; host
    copies within _LOSS_STATE_COPY_BYTES in all, the loss's own first."""

    def __init__(self, model, loss_fn):
        super().__init__(copy_limit=_LOSS_STATE_COPY_BYTES)
        for label, value, get, put in _names_loss_fn_reads(loss_fn):
            if isinstance(value, dict):
                self._watch_items(label, value)
            elif not isinstance(value, torch.nn.Module):
                self._add(label, get, put, value)
        owner = getattr(loss_fn, "__self__", None)  # a bound method's object
        if owner is not None and not isinstance(owner, torch.nn.Module):
            for key, value in list(vars(owner).items()) if hasattr(owner, "__dict__") else ():
                self._watch_attribute(f"loss_fn's {type(owner).__name__}.{key}", owner, key,
                                      value)
        seen = set()
        for label, reached in [("model", model)] + _modules_loss_fn_reaches(loss_fn):
            for name, module in reached.named_modules():
                if id(module) in seen:
                    continue
                seen.add(id(module))
                for key, value in module._buffers.items():
                    self._watch(f"buffer {label}{'.' + name if name else ''}.{key}",
                                module._buffers, key, value)

    def _watch_items(self, label, mapping):
        for key, item in list(mapping.items()):
            self._watch(f"{label}[{key!r}]", mapping, key, item)

    def changed_put_back(self, gm=None):
        """The labels of the tensors rebound or written since, each put back
        as it was (one written without a copy: its label says its values
        were not). With the traced `gm`: a tensor rebound that `gm` does not
        read is put back but not counted (a cache that a helper grows:
        `_W = torch.linspace(...)` where `_W` was too short, which the step
        makes again at each call as the trace did)."""
        read = _constants_read(gm) if gm is not None else None
        changed = []
        for label, get, put, tensor, version, copy in self.entries:
            rebound = get() is not tensor
            if rebound:
                put(tensor)
            written = self._values_put_back(label, tensor, version, copy)
            if written is None and rebound and read is not None and id(tensor) not in read:
                continue
            if written is not None or rebound:
                changed.append(written or label)
        return changed


def _loss_state_changed_error(labels):
    return CaptureError(
        f"loss_fn changes {', '.join(labels)} (binds it anew or writes it) at each call: the "
        "step computes the loss in its traced graph, which runs no Python, so that state "
        "would keep the value it held at capture, where eager updates it every step (it is "
        "put back as it was). Update it outside the step, after step(...) returns (with the "
        "model's output, if it needs one, from a forward under torch.no_grad()), or inside "
        "the model's forward as a buffer updated in place")


def _plain_tensor_written_error(labels):
    what = ", ".join(labels)
    return CaptureError(
        f"the forward writes {what} in place, a tensor that is neither a parameter nor a "
        "buffer of its module: a traced step runs no Python, so the step would not carry "
        "its changes from call to call as eager does (its values are put back as they "
        "were). Register it as a buffer (self.register_buffer(name, tensor)), which the "
        "step updates in place as eager does, or make the write outside the step")


def _constants_read(gm):
    """The ids of the tensors that `gm` reads as constants (get_attr)."""
    return {id(getattr(gm, n.target, None)) for n in gm.graph.nodes if n.op == "get_attr"}


def _warn_rebound_plain_tensors(watch, gm):
    """UserWarning naming each plain tensor attribute that the forward bound
    anew while the step reads its old value (Note [Tensors in plain
    attributes])."""
    read = _constants_read(gm)
    labels = [label for label, tensor in watch if id(tensor) in read]
    if labels:
        warnings.warn(
            f"the forward binds a new tensor to {', '.join(labels)} (neither a parameter nor "
            "a buffer) from one the step reads: a traced step runs no Python, so each call "
            "reads the value it held at capture, where eager reads what the last call left. "
            "If it carries state from step to step, make it a buffer updated in place "
            "(self.x.mul_(m).add_(...) under torch.no_grad()); if the forward makes the same "
            "value at every call, the step is right", UserWarning, stacklevel=2)


def _row_major_strides(shape):
    """The strides of a contiguous tensor of `shape`, as Tensor.stride()
    gives them."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _loss_attributes_kept(loss_fn):
    """_tensor_attributes_kept for a loss module (one that keeps its last
    loss, say), else nothing."""
    if isinstance(loss_fn, torch.nn.Module):
        return _tensor_attributes_kept(loss_fn)
    return contextlib.nullcontext()


def _loss_tensors(loss_fn):
    """A loss module's buffers and tensor attributes, each of its modules'."""
    if not isinstance(loss_fn, torch.nn.Module):
        return []
    return [t for m in loss_fn.modules() for t in list(m._buffers.values()) +
            list(vars(m).values()) if isinstance(t, torch.Tensor)]


# The traces watching register_buffer ((labels, found) each), and the
# method that the watch wraps while there is one (Module's own, or what
# the user put in its place before).
_REGISTERS_WATCHED = []
_REGISTER_LOCK = threading.Lock()
_REGISTER_BUFFER = [None]


def _register_buffer_watched(module, name, tensor, *args, **kwargs):
    for labels, found in list(_REGISTERS_WATCHED):
        if id(module) in labels and name in module._buffers:
            found.append((labels[id(module)], name))
    return _REGISTER_BUFFER[0](module, name, tensor, *args, **kwargs)


@contextlib.contextmanager
def _buffers_registered_again(model):
    """Yields a list that gets the 'module' (label, buffer name) of each
    register_buffer call that a module of `model` makes, while this runs,
    for a name it holds already (a cache grown in the forward, as rotary
    embeddings' cos_cached): a trace substitutes the module's buffers, so
    the forward would read the one it held before. Traces in several
    threads share one wrapper, put in place by the first and taken away by
    the last."""
    labels = {id(m): _module_label(name, m) for name, m in model.named_modules()}
    watch = (labels, [])
    with _REGISTER_LOCK:
        if not _REGISTERS_WATCHED:
            _REGISTER_BUFFER[0] = torch.nn.Module.register_buffer
            torch.nn.Module.register_buffer = _register_buffer_watched
        _REGISTERS_WATCHED.append(watch)
    try:
        yield watch[1]
    finally:
        with _REGISTER_LOCK:
            _REGISTERS_WATCHED.remove(watch)
            if not _REGISTERS_WATCHED:
                torch.nn.Module.register_buffer = _REGISTER_BUFFER[0]


def _named_state(slots, tensors):
    """{name: tensor} of the module's parameters and buffers for
    functional_call: each slot's tensor (of `tensors`, in the slots' order)
    under every name that holds it (a tied weight has several)."""
    return {name: t for slot, t in zip(slots, tensors) if slot.kind in ("parameter", "buffer")
            for name in slot.names}


def _step_function(model, loss_fn, slots, grad_found, max_grad_norm=None, norm_type=2.0,
                   ranks=1, accumulating=()):
    """f(*slot tensors) -> [loss, gradient, ...] of the module's step, the
    gradients clipped to a total `norm_type`-norm of `max_grad_norm` where
    given, and then their norm before clipping last. Clipped on `ranks`
    ranks (more than one), each gradient is averaged over them first (Note
    [Clipping the averaged gradients]). Each gradient that becomes a .grad
    is laid out as autograd lays out a new .grad (Note [A gradient as
    .grad]); those of parameters named in `accumulating` (their .grad
    holds a tensor, which the gradient is added into) as the backward
    makes them."""
    n_state = sum(1 for s in slots if s.kind in ("parameter", "buffer"))
    n_inputs = sum(1 for s in slots if s.kind == "input")
    buffer_names = [name for s in slots if s.kind == "buffer" for name in s.names]

    def step(*flat):
        state = _named_state(slots, flat)
        inputs = flat[n_state:n_state + n_inputs]
        target = flat[n_state + n_inputs]
        traced_state = dict(state)  # (functional_call writes rebinds into `state`)
        shapes = {name: tuple(state[name].shape) for name in buffer_names}
        with _buffers_rebound(model, traced_state) as rebound:
            output = functional_call(model, state, tuple(inputs))
        for name, shape in shapes.items():
            if tuple(traced_state[name].shape) != shape:
                raise CaptureError(resized_buffer_message(name, "resize_"))
        rebound.update({name: state[name] for name in buffer_names
                        if state[name] is not traced_state[name]})
        for name, value in rebound.items():  # (Note [Buffers rebound by the forward])
            buffer = traced_state[name]
            if value.shape != buffer.shape or value.dtype != buffer.dtype:
                raise CaptureError(f"the forward binds buffer '{name}' to a tensor of shape "
                                   f"{tuple(value.shape)} and {value.dtype}, where it holds "
                                   f"{tuple(buffer.shape)} and {buffer.dtype}: pebble.torch "
                                   "keeps a buffer's shape and dtype")
            buffer.copy_(value)
        loss = loss_fn(output, target)
        if isinstance(loss, torch.Tensor) and loss.dim() > 0 and loss.numel() == 1:
            loss = loss.reshape(())  # (a loss of shape (1,): eager's backward() takes it)
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
        taken = set()  # ids of the gradients taken as a .grad
        for (slot, parameter), g in zip(trainable, grads):
            if g is not None:
                grad_found.append(slot)
                if not set(slot.names) & accumulating:
                    g = _as_new_grad(g, parameter, taken, flat)
                out.append(g)
        if max_grad_norm is not None:
            if ranks > 1:
                out[1:] = _averaged(out[1:], ranks, flat)
            out[1:], total = _clipped(out[1:], max_grad_norm, norm_type)
            out.append(total)
        return out

    return step


# Note [A gradient as .grad]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# autograd's AccumulateGrad makes a parameter's new .grad of its gradient
# under a layout contract (torch/csrc/autograd/functions/accumulate_grad.h,
# obeys_layout_contract and clone_obey_contract): the gradient itself where
# its strides are the parameter's (dims of size 1 aside; a contiguous one
# where the parameter's elements do not fill one run of memory), else a copy
# with the parameter's strides. torch.autograd.grad, which the trace runs,
# returns the backward's tensors as they are: a transposed one (a linear
# layer read through a transposed input), an expanded one of stride 0 (a
# parameter read only through a sum), one tensor for two parameters (the
# gradient of a + b, given to both). Taken as .grad so, an expanded one
# failed the next in-place write into it ("more than one element of the
# written-to tensor refers to a single memory location": gradient
# accumulation, clip_grad_norm_), and two parameters shared one gradient
# node, so the optimizer's step had an update for the first alone: the
# second was never trained, silently (until 2026-12-05). The trace copies
# them as autograd would, in the plan: the copy's memory is planned, as
# eager holds it.


def _as_new_grad(g, parameter, taken, flat):
    """`g` as AccumulateGrad makes `parameter`'s new .grad of it (Note [A
    gradient as .grad]); also a copy where it is another parameter's
    gradient already (`taken`: their ids, which this adds to) or one of the
    step's arguments (`flat`)."""
    if g.layout != torch.strided:  # (a sparse gradient: autograd's contract is of strides)
        return g
    if id(g) in taken or any(g is t for t in flat) or not _obeys_layout_contract(g, parameter):
        if not is_dense(parameter) or parameter.is_contiguous():
            g = g.clone(memory_format=torch.contiguous_format)
        elif parameter.dim() == 4 and parameter.is_contiguous(memory_format=torch.channels_last):
            g = g.clone(memory_format=torch.channels_last)
        elif parameter.dim() == 5 and \
                parameter.is_contiguous(memory_format=torch.channels_last_3d):
            g = g.clone(memory_format=torch.channels_last_3d)
        else:
            g = torch.empty_strided(parameter.shape, parameter.stride(), dtype=g.dtype,
                                    device=g.device).copy_(g)
    taken.add(id(g))
    return g


def _obeys_layout_contract(g, parameter):
    """Whether autograd takes `g` as `parameter`'s new .grad as it is:
    PyTorch's obeys_layout_contract."""
    if is_dense(parameter):
        return all(size == 1 or gs == ps for size, gs, ps in
                   zip(parameter.shape, g.stride(), parameter.stride()))
    return g.is_contiguous()


def resized_buffer_message(name, how):
    """Why a step that resizes buffer `name` (by `how`) is refused."""
    return (f"the step resizes buffer '{name}' ({how}; torch.ao.quantization's observers "
            "resize theirs): a step keeps each buffer's shape, so copy into a buffer made at "
            "its final shape instead (quantization-aware training, whose observers resize, is "
            "not planned)")


def _averaged(grads, ranks, flat):
    """Each gradient's average over the ranks, marked (mean_over_ranks) for
    the plan to make with an all-reduce in place (Note [Clipping the averaged
    gradients]). A gradient that cannot be averaged in place is copied
    first: one that is another's too (autograd gives a + b's gradient to
    both), a step's argument, or one whose elements do not fill one run of
    memory (an expanded one; a transposed one does, and is summed through
    its storage)."""
    seen, out = set(), []
    for k, g in enumerate(grads):
        if id(g) in seen or any(g is t for t in flat) or not is_dense(g):
            g = g.clone(memory_format=torch.contiguous_format)
        seen.add(id(g))
        out.append(mean_over_ranks(g, ranks, k))
    return out


def _clipped(grads, max_norm, norm_type=2.0):
    """(the gradients clipped, their total norm), as
    torch.nn.utils.clip_grad_norm_(max_norm, norm_type) scales each .grad
    and returns the norm: the p-norm of the gradients' p-norms (the largest
    magnitude for math.inf), and every gradient times min(1, max_norm /
    (total + 1e-6)). These are PyTorch 1.13's operations; 2.x's takes the
    norms with torch._foreach_norm (not checked against this yet). Traced
    into the step, so the plan holds every gradient until the total is
    known, and each update reads its clipped gradient."""
    if norm_type == math.inf:
        norms = [g.detach().abs().max() for g in grads]
        total = norms[0] if len(norms) == 1 else torch.max(torch.stack(norms))
    else:
        norms = [torch.norm(g.detach(), norm_type) for g in grads]
        total = torch.norm(torch.stack(norms), norm_type)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    # (clip_grad_norm_ multiplies each .grad in place, which keeps its dtype:
    # a 0-dim float32 gradient times a float64 factor, of float64 parameters
    # in the norm, is float32 there; out of place it is float64, which the
    # step then failed to write into .grad, until 2026-12-05)
    return [(g * coef).to(g.dtype) for g in grads], total


# Note [Clipping the averaged gradients]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Under DistributedDataParallel, clip_grad_norm_ runs after backward(), on
# the gradients that DDP has averaged over the ranks: every rank clips by the
# same norm, and the replicas stay equal. A clipped step on several ranks is
# traced with each gradient marked where its average is read
# (mean_over_ranks, _collective_ops.py, _averaged): the captured graph names
# the backward's gradient `unclipped_grad:<parameter>`, as the command line's
# clipped steps do (docs/training.md, "Gradient clipping"), and the norms and
# the scaled gradients read it. The plan then places its all_reduce step
# (docs/semantics.md, "Collectives across ranks": the simulator lets the
# clipping read an unclipped gradient only once it is summed) after the
# backward is done with it and before the clipping's first read, alone or
# in a bucket with others, as for an unclipped step's gradients; the
# executor averages it in place (GradientAverage: divided, then summed) and
# waits before the clipping reads it. Where a plan computes an unclipped
# gradient again, that value is averaged again. Until 2026-12-03 the
# average was a collective node of its own, a new tensor beside the
# gradient and its own message: no buckets.


def _describe(x):
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    return type(x).__name__


class _RefusedInTrace(Exception):
    """A call in the traced Python that refuses the capture (`how`: the
    call); capture_error(where, model) is the CaptureError naming it."""

    def __init__(self, how):
        super().__init__(how)
        self.how = how


class _ValuesRead(_RefusedInTrace):
    """A traced tensor's values read in Python (`how`: ".tolist()")."""

    def capture_error(self, where, model):
        return _values_read_error(where, self, _value_read_hint(self, model, where))


class _UpdatedStateRead(_ValuesRead):
    """A value read in Python of a parameter or buffer that the step itself
    writes in place before the read (a batch norm's count of batches)."""

    def capture_error(self, where, model):
        return CaptureError(
            f"{where} reads in Python ({self.how}){_user_line(self)} the value of a parameter "
            "or buffer that the step itself updates in place: the trace would hold one step's "
            "value as a constant, and every call would be captured again, so pebble.torch "
            "refuses it. Compute with it as a tensor, or update it outside the step"
            f"{_value_read_hint(self, model, where)}")


class _GeneratorSet(_RefusedInTrace):
    """The generator reseeded or its state set while a step is traced
    (`how`: "torch.manual_seed"): Note [The generator set inside a step]."""

    def capture_error(self, where, model):
        return _generator_set_error(where, self)


# Calls whose output follows from their input's shape alone: a value read
# from such an output (ones_like(x).sum().tolist(), a batch size) does not
# follow from the input's values.
_SHAPE_ONLY = frozenset({
    "ones_like", "zeros_like", "empty_like", "full_like", "new_ones", "new_zeros",
    "new_empty", "new_full", "sym_size", "sym_numel", "sym_stride", "size", "numel"})


def _from_batch(node, batch_from):
    """Whether the fx `node` follows from the values of the step's inputs or
    target: the placeholders from position `batch_from` on (the parameters
    and buffers come first: values read from them, or from constants, are
    the same at each step, or change with the training, as before)."""
    placeholders = [n for n in node.graph.nodes if n.op == "placeholder"]
    batch = set(placeholders[batch_from:])
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n in batch:
            return True
        if n in seen or (n.op == "call_function" and op_name(n.target) in _SHAPE_ONLY):
            continue
        seen.add(n)
        todo.extend(n.all_input_nodes)
    return False


# Note [Values read in Python]. `.tolist()`, `.numpy()` and NumPy's
# conversions (np.asarray) read a tensor's values without an operator that
# a trace records. A fake trace fails on them, and a trace on real tensors
# (the fallback) takes the captured batch's values as constants: every
# later step replayed them (a loop over `lengths.tolist()` pooled the first
# batch's lengths; `np.bincount(y.numpy())` weighed by its classes). So while
# a trace runs on this thread, reading a tensor whose values follow from
# the step's inputs or target refuses the capture (_ValuesRead); one of
# parameters, buffers or constants (a buffer of split sizes) reads as before,
# and so does .item() of one (_item_read), which make_fx refused.
#
# Note [State values read in Python]. A value read so of a parameter or
# buffer is a constant of the trace too: a buffer of split sizes set once,
# or a temperature that the training loop changes in place. The trace notes
# which it read (_read_in_python; Traced.state_read), the capture keeps their
# values, and a call that finds them changed drops that capture and
# captures again, with a warning (TrainStep._stale); until
# 2026-12-06 the step kept computing with the captured value, silently.
#
# The methods are patched on the classes while any thread traces (counted),
# and act on the tracing thread only (_TRACING): another thread's reads are
# PyTorch's own. So is F.cross_entropy (Note [Label smoothing without
# masked_select]).
_TRACING = threading.local()  # .batch_from: the tracing thread's, else absent
_PATCHES_LOCK = threading.Lock()
_PATCHES = {"users": 0, "saved": []}  # saved: (owner, name, original or None)


def _states_reached(node, batch_from):
    """{placeholder: its position} of the parameters and buffers
    (placeholders before `batch_from`) whose values the fx `node` follows
    from (not through a call of their shapes alone: _SHAPE_ONLY)."""
    placeholders = [n for n in node.graph.nodes if n.op == "placeholder"][:batch_from]
    state = {n: k for k, n in enumerate(placeholders)}
    reached, seen, todo = {}, set(), [node]
    while todo:
        n = todo.pop()
        if n in seen or (n.op == "call_function" and op_name(n.target) in _SHAPE_ONLY):
            continue
        seen.add(n)
        if n in state:
            reached[n] = state[n]
        todo.extend(n.all_input_nodes)
    return reached


def _read_in_python(node, batch_from, shown, by_torch):
    """A read in Python (`shown`: how, ".tolist()") of the traced `node`'s
    values: refused (_ValuesRead) where they follow from the batch, or,
    read by PyTorch's own code (`by_torch`), from a parameter or buffer (a
    distribution's checks of its arguments: a trained parameter's would be
    captured again at every call, where validate_args=False reads none);
    refused (_UpdatedStateRead) where they follow from a parameter or
    buffer that the trace so far writes in place; else the parameters and
    buffers they follow from are noted (Note [State values read in
    Python])."""
    if _from_batch(node, batch_from):
        raise _ValuesRead(shown)
    reached = _states_reached(node, batch_from)
    if reached and by_torch:
        raise _ValuesRead(shown)
    if _state_updated_before(node, reached):
        raise _UpdatedStateRead(shown)
    _TRACING.state_read.update(reached.values())


def _state_updated_before(node, reached):
    """Whether a parameter or buffer that the fx `node` follows from
    (`reached`, _states_reached) is written by an in-place call of the trace
    so far, directly or through a view of it: one that the step updates
    before it reads it (a batch norm's count of batches, add_(1), read as a
    Python number). A fresh tensor written in place (a clone clamped, zeros
    added to) is no such write."""
    if not reached:
        return False
    for n in node.graph.nodes:
        if n.op == "call_function" and writes_self(n) and n.args and \
                _aliased_base(n.args[0]) in reached:
            return True
    return False


def _schema_of(n):
    return getattr(n.target, "_schema", None) if n.op == "call_function" else None


def _aliased_base(n):
    """The tensor whose storage the fx value `n` shares: through views and
    in-place calls (whose output aliases their first argument), to the call
    or placeholder that made it."""
    while isinstance(n, torch.fx.Node):
        schema = _schema_of(n)
        if schema is None or not schema.returns or schema.returns[0].alias_info is None or \
                not n.args or not isinstance(n.args[0], torch.fx.Node):
            return n
        n = n.args[0]
    return n


def _read_refused(name, original):
    @functools.wraps(original)
    def read(self, *args, **kwargs):
        batch_from = getattr(_TRACING, "batch_from", None)
        if batch_from is not None:
            node = traced_node(self)
            if node is not None:
                _read_in_python(node, batch_from, f".{name}()", _called_by_torch(1))
        return original(self, *args, **kwargs)
    return read


# Tensor methods that read a one-element tensor's value as a Python scalar:
# the conversion of its value, and how a refusal names the read.
_SCALAR_READS = {"item": (None, ".item()"), "__int__": (int, "int()"),
                 "__float__": (float, "float()"),
                 "__bool__": (bool, "bool(), an `if` or `and` on a tensor"),
                 "__index__": (operator.index, "a tensor as an index or a range's bound")}


def _item_read(name, original):
    """Tensor.item (and int(), float(), bool() of a tensor, a tensor as an
    index: _SCALAR_READS) while a trace runs on this thread: refused as
    _read_in_python says, else read as .tolist() reads it (make_fx itself
    refuses these reads of any traced tensor: a buffer's, a constant's that
    an operator made, `torch.tensor(x.shape).min()`)."""
    convert, shown = _SCALAR_READS[name]

    @functools.wraps(original)
    def item(self):
        batch_from = getattr(_TRACING, "batch_from", None)
        node = traced_node(self) if batch_from is not None else None
        if node is None:
            return original(self)
        _read_in_python(node, batch_from, shown, _called_by_torch(1))
        try:
            return original(self)  # (a fake constant's, say)
        except RuntimeError:
            if self.numel() != 1:
                raise
        value = self.tolist()
        while isinstance(value, list):
            value = value[0]
        return value if convert is None else convert(value)
    return item


# Note [The generator set inside a step]. A step draws its random numbers
# (dropout's masks, randn_like) from the default generator in the order
# eager does, so the stream continues across steps as eager's. A forward or
# loss that reseeds the generator or sets its state (torch.manual_seed,
# torch.set_rng_state, a torch.random.fork_rng block, which sets the state
# back on leaving) does so in Python, which a traced step does not run: the
# step drew from the one stream, and its masks and loss were not eager's,
# silently (until 2026-12-05). While a trace runs on this thread, those
# calls refuse the capture instead, naming the call.
_GENERATOR_SETTERS = (
    (torch, ("manual_seed", "seed", "set_rng_state")),
    (torch.random, ("manual_seed", "seed", "set_rng_state")),
    (torch.cuda, ("manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state",
                  "set_rng_state_all")))


# PyTorch's own code calls the setters where it restores a state it saved
# (a tracer of another version might): only the user's calls, and
# fork_rng's (torch/random.py), refuse a capture.
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_FORK_RNG_FILE = os.path.abspath(torch.random.__file__)


def _called_by_torch(depth):
    """Whether the caller `depth` frames up is PyTorch's code, fork_rng aside."""
    caller = os.path.abspath(sys._getframe(depth + 1).f_code.co_filename)
    return caller.startswith(_TORCH_DIR) and caller != _FORK_RNG_FILE


def _generator_set_refused(owner):
    def make(name, original):
        @functools.wraps(original)
        def setter(*args, **kwargs):
            # (once refused, the calls run: fork_rng's exit then names no
            # call of its own over the user's)
            if getattr(_TRACING, "batch_from", None) is not None and \
                    not getattr(_TRACING, "generator_set", False) and \
                    not _called_by_torch(1):
                _TRACING.generator_set = True
                raise _GeneratorSet(f"{owner.__name__}.{name}")
            return original(*args, **kwargs)
        return setter
    return make


# Note [fx names in linear time]. PyTorch 1.13's fx names a new node by
# trying base_1, base_2, ... from 1 each time (_Namespace.create_name in
# torch/fx/graph.py): quadratic in the nodes that share a base, and the
# trace of an unrolled LSTM holds thousands of getitems (a bidirectional
# two-layer LSTM over 48 steps spent a quarter of its capture there). While
# a trace runs, each namespace also keeps per base how many numbers from 1
# on are taken, and its search starts past them: the same names, as a
# namespace's names are only ever added. PyTorch 2.x counts per base itself.
def _create_name_counted(name, original):
    def create_name(self, candidate, obj):
        if obj is not None and obj in self._obj_to_name:
            return self._obj_to_name[obj]
        candidate = self._illegal_char_regex.sub("_", candidate)
        if candidate[0].isdigit():
            candidate = f"_{candidate}"
        match = self._name_suffix_regex.match(candidate)
        base, num = (candidate, None) if match is None else (match.group(1), int(match.group(2)))
        candidate = base if num is None else f"{base}_{num}"
        num = num or 0
        if candidate in self._used_names or self._is_illegal_name(candidate, obj):
            taken = self.__dict__.setdefault("_pebble_taken_from_1", {})  # base -> n
            known = taken.get(base, 0)
            start = max(num, known)
            num = start + 1
            candidate = f"{base}_{num}"
            while candidate in self._used_names or self._is_illegal_name(candidate, obj):
                num += 1
                candidate = f"{base}_{num}"
            if start == known:  # base_1 .. base_num are all taken now
                taken[base] = num
        self._used_names.setdefault(candidate, 0)
        if obj is None:
            self._unassociated_names.add(candidate)
        else:
            self._obj_to_name[obj] = candidate
        return candidate
    return create_name


def _fx_name_patches():
    """Note [fx names in linear time]'s patch, on PyTorch 1.x only."""
    namespace = getattr(torch.fx.graph, "_Namespace", None)
    if int(torch.__version__.split(".")[0]) >= 2 or namespace is None or \
            "create_name" not in vars(namespace):
        return []
    return [(namespace, "create_name", _create_name_counted)]


def _patched():
    """(owner, name, replacement maker) of each patch the traces install."""
    owners = [torch.Tensor] + [cls for cls in (FakeTensor,) if "tolist" in vars(cls)]
    patches = [(cls, name, _read_refused) for cls in owners for name in ("tolist", "numpy")
               if name in vars(cls) or cls is torch.Tensor]
    patches += [(torch.Tensor, name, _item_read) for name in _SCALAR_READS]
    patches += [(owner, name, _generator_set_refused(owner))
                for owner, names in _GENERATOR_SETTERS for name in names
                if callable(getattr(owner, name, None))]
    return patches + _fx_name_patches() + [
        (torch.nn.functional, "cross_entropy",
         lambda name, original: _cross_entropy_masked(original))]


@contextlib.contextmanager
def _trace_patches(batch_from):
    """The patches of Notes [Values read in Python], [Label smoothing
    without masked_select] and [fx names in linear time] on, for this
    thread, while the block runs."""
    with _PATCHES_LOCK:
        if _PATCHES["users"] == 0:
            for owner, name, make in _patched():
                own = vars(owner).get(name)  # (None: inherited, deleted again after)
                _PATCHES["saved"].append((owner, name, own))
                setattr(owner, name, make(name, getattr(owner, name)))
        _PATCHES["users"] += 1
    before = getattr(_TRACING, "batch_from", None)
    _TRACING.batch_from = batch_from
    _TRACING.generator_set = False
    read_before = getattr(_TRACING, "state_read", None)
    _TRACING.state_read = set()  # Note [State values read in Python]
    try:
        yield _TRACING.state_read
    finally:
        _TRACING.state_read = read_before
        _TRACING.batch_from = before
        _TRACING.generator_set = False
        with _PATCHES_LOCK:
            _PATCHES["users"] -= 1
            if _PATCHES["users"] == 0:
                for owner, name, own in reversed(_PATCHES["saved"]):
                    if own is None:
                        delattr(owner, name)
                    else:
                        setattr(owner, name, own)
                _PATCHES["saved"].clear()


# Note [Label smoothing without masked_select]. PyTorch's cross-entropy with
# label_smoothing (1.13, with or without class weights; 2.x with them)
# averages its smoothing term over the targets that are not ignore_index
# with a masked_select, whose shape follows from how many are padding: a
# fake trace fails on it, and a real one holds the captured batch's count,
# so the next batch with other padding failed (CapturedValueMismatch). While
# a trace runs, F.cross_entropy with label smoothing and class indices is
# written with masks instead (the same terms, PyTorch's formula: (1 - e) *
# nll + e / C * the smoothing term's mean over the kept targets, weighed by
# their classes' weights), which plans for any padding; the sums run in
# another order, so the loss matches eager's to rounding.
def _cross_entropy_masked(original):
    @functools.wraps(original)
    def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100,
                      reduce=None, reduction="mean", label_smoothing=0.0):
        if getattr(_TRACING, "batch_from", None) is None or not label_smoothing or \
                target.dtype.is_floating_point or size_average is not None or \
                reduce is not None or reduction not in ("mean", "sum", "none"):
            return original(input, target, weight, size_average, ignore_index, reduce,
                            reduction, label_smoothing)
        class_dim = 0 if input.dim() == 1 else 1
        classes = input.shape[class_dim]
        log_p = torch.nn.functional.log_softmax(input, class_dim)
        nll = torch.nn.functional.nll_loss(log_p, target, weight, ignore_index=ignore_index,
                                           reduction=reduction)
        ignored = target == ignore_index
        if weight is not None:
            shape = [1] * log_p.dim()
            shape[class_dim] = classes
            log_p = log_p * weight.view(shape)
        smooth = (-log_p.sum(class_dim)).masked_fill(ignored, 0.0)
        if reduction == "mean":
            if weight is not None:
                kept = weight.gather(0, target.masked_fill(ignored, 0).flatten())
                smooth = smooth.sum() / kept.masked_fill(ignored.flatten(), 0.0).sum()
            else:
                smooth = smooth.sum() / (~ignored).sum()
        elif reduction == "sum":
            smooth = smooth.sum()
        return (1 - label_smoothing) * nll + smooth * (label_smoothing / classes)
    return cross_entropy


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


def trace(model, loss_fn, inputs, target, device, mode=None, one_pass=True, stand_ins=None,
          max_grad_norm=None, norm_type=2.0, ranks=1, accumulating=()):
    """Traced step of `model` on `inputs` and `target`.

    mode: "fake" (no computation), "real", or None: fake where PyTorch can
    trace fake tensors through the step, else real. one_pass: where the
    first trace's in-place calls are simple (see _made_functional), make
    them functional here rather than tracing again through functionalize
    (the same graph, at half the time); False always traces twice.
    stand_ins: parameter name -> shape, for parameters that hold no data
    here (a sharded module's: Note [Stand-ins for sharded parameters]); the
    trace is then fake only. max_grad_norm: the gradients' outputs clipped
    to that total `norm_type`-norm (_clipped), on `ranks` ranks the norm of
    their average (Note [Clipping the averaged gradients]). accumulating:
    the names of the parameters whose .grad holds a tensor, which the
    gradient is added into (else it becomes the .grad: Note [A gradient as
    .grad])."""
    slots = module_slots(model)
    if max_grad_norm is not None and ranks > 1:
        hold_divisors(ranks, {s.tensor.dtype for s in slots if s.trainable})
    n_state = len(slots)  # (the placeholders from here on are the batch's)
    slots += _batch_slots(inputs)
    flat = _placeholder_values(slots, inputs, target)
    modes = [mode] if mode else _modes_to_try(model, slots, flat)
    fake_mode = None
    if stand_ins:
        fake_mode, flat = _with_stand_ins(slots, flat, stand_ins, device)
        modes = ["fake"]
    forget_dead_fake_converters()  # (the finalizers earlier captures left on the module)
    plain = _plain_tensors_of(model, loss_fn)  # Note [Tensors in plain attributes]
    loss_state = _LossState(model, loss_fn)  # Note [State the loss carries]
    try:
        traced = _traced_in_some_mode(model, loss_fn, slots, flat, device, modes, fake_mode,
                                      n_state, max_grad_norm, norm_type, ranks, accumulating,
                                      one_pass, stand_ins, plain)
    except BaseException as e:
        written = plain.written_put_back()
        changed = loss_state.changed_put_back()
        # (a refusal of pebble's own stands: a forward that registers a
        # buffer again has rebound it too; PyTorch's failure to trace a
        # write of the loss's, its internal assert, gives way)
        if changed and isinstance(e, Exception) and (
                not isinstance(e, CaptureError) or getattr(e, "untraced", False)):
            raise _loss_state_changed_error(changed) from e
        if written and isinstance(e, Exception):
            raise _plain_tensor_written_error(written) from e
        raise
    written = plain.written_put_back()
    changed = loss_state.changed_put_back(traced.gm)
    if changed:
        raise _loss_state_changed_error(changed)
    if written:
        raise _plain_tensor_written_error(written)
    return traced


def _traced_in_some_mode(model, loss_fn, slots, flat, device, modes, fake_mode, n_state,
                         max_grad_norm, norm_type, ranks, accumulating, one_pass, stand_ins,
                         plain):
    """trace's Traced in the first of `modes` that traces the step, else its
    CaptureError (_refuse_untraced)."""
    failure = None
    for m in modes:
        grad_found = []
        stack = _ModuleStack(model)

        def attempt(m=m, grad_found=grad_found, stack=stack):
            with _rng_kept(device), _rnn_without_cudnn(model, device), \
                    _rnn_weights_rebound(model), _checkpoints_inline(model), \
                    _tensor_attributes_kept(model), _loss_attributes_kept(loss_fn), \
                    _trace_patches(batch_from=n_state) as state_read:
                step = _step_function(model, loss_fn, slots, grad_found, max_grad_norm,
                                      norm_type, ranks, frozenset(accumulating))
                gm, values, passes = _traced_functional(step, m, flat, fake_mode, slots,
                                                        one_pass, stack)
                rebound = plain.rebound()  # (before the attributes are put back)
            return gm, values, passes, rebound, state_read

        try:
            gm, values, passes, rebound, state_read = attempt()
        except CaptureError:
            stack.close()
            raise
        except _RefusedInTrace as e:
            # (Notes [Values read in Python] and [The generator set inside a step])
            where = stack.where()
            stack.close()
            raise e.capture_error(where, model) from None
        except Exception as e:  # PyTorch's own refusal: try the next mode, else report
            where = stack.where()
            stack.close()
            failure = (where, e, _rerun_for_culprit(model, flat, loss_fn, attempt))
            if isinstance(e, _FunctionalizeFailed) and e.written:
                raise _leaf_written_error(where, e.cause, e.written) from e
            if _LEAF_WRITTEN in str(e):
                # (a trace on real tensors would write the module's own
                # parameters before failing alike: nn.Embedding's max_norm)
                raise _leaf_written_error(where, e) from e
            continue
        finally:
            # (1.13 leaves a proxy slot in each tensor it traced, constants
            # among them: copy.deepcopy of it then fails)
            forget_traces(flat + list(model.buffers()) + _loss_tensors(loss_fn))
        _remove_unused_calls(gm)
        _refuse_tensors_requiring_grad(gm, loss_fn)
        _refuse_unfilled_reads(gm)
        _warn_rebound_plain_tensors(rebound, gm)
        traced = Traced(gm, slots, list(grad_found), m, flat)
        traced.state_read = sorted(state_read)
        traced.plain_read = plain.read_by(gm)
        traced.values = values
        traced.passes = passes
        traced.fake_mode = fake_mode
        return traced
    _refuse_untraced(model, loss_fn, slots, flat, device, failure, sharded=bool(stand_ins))


def _rerun_for_culprit(model, flat, loss_fn, attempt):
    """A callable that runs a failed trace's `attempt` again under autograd's
    anomaly mode, for _backward_reading_values; its traces forgotten after,
    as the first run's."""
    def rerun():
        stack = _ModuleStack(model)
        try:
            return _backward_reading_values(lambda: attempt(stack=stack, grad_found=[]))
        finally:
            stack.close()
            forget_traces(flat + list(model.buffers()) + _loss_tensors(loss_fn))
    return rerun


def _backward_reading_values(run):
    """(autograd node, ' (at file:line: `code`)' of the forward call that
    made it) where `run`, a trace that failed on a tensor's value read in
    PyTorch's own code, fails in a backward function (PyTorch 1.13's of
    scatter_reduce with reduce="prod" calls .item()), else None. Found
    under autograd's anomaly mode, whose warning on a backward's error
    names the node and the forward's stack (without its NaN checks, which
    read values themselves)."""
    libraries = _library_directories()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autograd.detect_anomaly(check_nan=False):
            try:
                run()
            except Exception:  # noqa: BLE001 (the failure looked for)
                pass
            else:
                return None
    for w in caught:
        said = str(w.message)
        node = re.search(r"Error detected in (\w+)", said)
        if node is None:
            continue
        frames = [(path, int(line)) for path, line in
                  re.findall(r'File "([^"]+)", line (\d+)', said)
                  if _users_file(path, libraries)]
        return node.group(1), (_at_line(*frames[-1]) if frames else "")
    return None


def _placeholder_values(slots, inputs, target):
    """The value of each slot's placeholder, in `slots`' order: parameters as
    they are, buffers cloned, then the batch's inputs and target."""
    flat = []
    for slot in slots:
        if slot.kind in ("parameter", "buffer"):
            t = slot.tensor
            # A real trace runs the step: buffers updated in place (batch
            # norm's running statistics) must not be the module's.
            flat.append(t if slot.kind == "parameter" else t.detach().clone())
        else:
            t = inputs[slot.index] if slot.kind == "input" else target
            # One tensor given in two places (step(x, x)): make_fx would
            # take both for one placeholder, and a later call's two tensors
            # would be one. A view of it stands in for the second.
            if isinstance(t, torch.Tensor) and any(t is u for u in flat):
                t = t.view_as(t)
            flat.append(t)
    return flat


def _modes_to_try(model, slots, flat):
    """The trace's modes, in order, where the caller chose none: fake first
    (nothing computed), then real; real alone where a fake trace is known to
    make another graph than the real step."""
    if any(s.kind == "parameter" and t.dim() in (4, 5) and
           t.stride() != _row_major_strides(t.shape) for s, t in zip(slots, flat)):
        # PyTorch 1.13's fake convolution lays its output out by the input
        # alone, a real one by the weight too (a channels-last weight makes
        # a channels-last output): the trace's views must see the real one.
        # (By its strides: a 1x1 kernel made channels-last is contiguous all
        # the same, and its output channels-last; once traced fake, a flatten
        # after it read the wrong order.)
        return ["real"]
    if any(isinstance(m, torch.nn.EmbeddingBag) for m in model.modules()):
        # The CPU's _embedding_bag leaves offset2bag empty where the fake
        # one fills it, and its backward makes it again only where it is
        # empty: a fake trace would skip that and hand the backward an
        # empty one (_graph._KERNEL_SHAPED).
        return ["real"]
    return ["fake", "real"]


def _traced_functional(step, mode, flat, fake_mode, slots, one_pass, stack):
    """(graph module without in-place calls, traced values or None, passes):
    `step` traced once and its in-place calls made functional where they are
    simple (_made_functional), else traced again through functionalize."""
    first = _make_fx(step, mode, flat, fake_mode, stacks=True)
    stack.close()
    if mode == "real":
        _record_values(first, flat, slots)
    _refuse_writes_functionalize_misses(first)
    _refuse_overlapping_writes(first)
    user_lines = _value_shaped_lines(first)
    if one_pass:
        try:
            made = _made_functional(first, slots)
        except Exception:  # noqa: BLE001 (a value it could not make)
            # The graph may be half rewritten: traced again, and twice.
            first = _make_fx(step, mode, flat, fake_mode)
        else:
            if made is not None:
                gm, values = made
                _mark_value_shaped_lines(gm, user_lines)
                # (a real trace's values are run again: _record_values's
                # stand for its first graph's alone)
                return gm, (values if mode == "fake" else None), 1
            # (not simple: nothing was rewritten, so functionalize traces
            # the first trace itself; an LSTM's writes are such)
    _refuse_reshaped_and_written(first)
    try:
        gm = _make_fx(functionalize(first), mode, flat, fake_mode)
    except Exception as e:  # noqa: BLE001 (said as functionalize's: _refuse_untraced)
        written = _parameter_written(first, slots) if _LEAF_WRITTEN in str(e) else None
        raise _FunctionalizeFailed(e, written) from e
    _mark_value_shaped_lines(gm, user_lines)
    return gm, (traced_values(gm) if mode == "fake" else None), 2


def _record_values(gm, flat, slots):
    """Gives each node of `gm`, a trace on real tensors, the value that a
    fake trace records (node.meta["val"]: a fake tensor of the real one's
    shape, strides and storage, as it was made), from a run of it on `flat`
    (`slots`: theirs). It runs on copies of all but the parameters, and of
    a parameter that it writes, so that nothing the trace was given changes
    (a batch norm's running statistics, which PyTorch 1.13's schema does not
    say it writes, among them). The one-pass rewrite and the checks of
    writes read the values."""
    written = {_aliased_base(arg) for n in gm.graph.nodes for arg in _written_arguments(n)}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    example = [t.detach().clone() if isinstance(t, torch.Tensor) and
               (slot.kind != "parameter" or p in written) else t
               for p, slot, t in zip(placeholders, slots, flat)]
    recorder = _MetaRecorder(gm, FakeTensorMode())
    try:
        with torch.no_grad():
            recorder.run(*example)
    except Exception:  # noqa: BLE001 (the graph's own error is said where it runs)
        for n in gm.graph.nodes:  # (none recorded: functionalize traces it, as before)
            n.meta.pop("val", None)


class _MetaRecorder(torch.fx.Interpreter):
    """Runs a graph, giving each node's meta["val"] its value made fake as
    it is made (a later in-place call does not change it): a view, of the
    right shape, strides and offset, of one fake tensor per storage, which
    spans it. (Not FakeTensorMode.from_tensor: PyTorch 1.13's remakes a view
    from its base, and for some views of a channels-last tensor reads past
    the base.)"""

    def __init__(self, gm, fake_mode):
        super().__init__(gm)
        self.fake_mode = fake_mode
        self.storages = {}  # storage key -> (its fake tensor, its dtype, whether it lives)

    def run_node(self, n):
        value = super().run_node(n)
        if isinstance(value, (tuple, list)):
            n.meta["val"] = tuple(self._fake(v) for v in value)
        elif self._fake(value) is not None:
            n.meta["val"] = self._fake(value)
        return value

    def _fake(self, value):
        """`value` made fake, or None where it is no strided tensor (a sparse
        one has no storage to follow)."""
        if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
            return None
        key, alive = storage_key(value), storage_alive(value)
        if key not in self.storages or not self.storages[key][2]():
            # (a storage freed since: its key may be a new one's)
            with self.fake_mode:
                whole = torch.empty(storage_bytes(value) // value.element_size(),
                                    dtype=value.dtype, device=value.device)
            self.storages[key] = (whole, value.dtype, alive)
        whole, dtype, _ = self.storages[key]
        if dtype != value.dtype:
            raise RuntimeError("a storage viewed as two dtypes")  # (_record_values: none)
        with self.fake_mode:
            return whole.as_strided(value.shape, value.stride(), value.storage_offset())


class _FunctionalizeFailed(Exception):
    """PyTorch's functionalize failed over a first trace that make_fx made:
    its error (`cause`) is PyTorch's, on no line of the user's (the pass
    runs the traced graph). `written`: _parameter_written's, where the
    cause is a parameter written in place."""

    def __init__(self, cause, written=None):
        super().__init__(f"{type(cause).__name__}: {_first_line(cause)}")
        self.cause = cause
        self.written = written


def _parameter_written(gm, slots):
    """The first trainable parameter that a call of `gm` (a first trace)
    writes in place, as (its name, " (at file:line: `code`)" or ''), else
    None: a clamp_ under torch.no_grad(), which make_fx records and
    functionalize then refuses, on no line of the user's."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    trained = {p: slot.names[0] for p, slot in zip(placeholders, slots)
               if slot.kind == "parameter" and slot.trainable and slot.names}
    for n in gm.graph.nodes:
        for arg in _written_arguments(n):
            if arg in trained:
                return trained[arg], _traced_user_lines(n)[0]
    return None


def _written_arguments(n):
    """The arguments of fx node `n` that its call writes in place (those its
    schema marks with '!'), as given: fx nodes, or None where not given."""
    from ._graph import _written_args  # noqa: PLC0415 (_graph imports this module)

    names = n.op == "call_function" and _written_args(n.target)
    if not names:
        return []
    return [n.args[k] if k < len(n.args) else n.kwargs.get(a.name)
            for k, a in enumerate(n.target._schema.arguments) if a.name in names]


def _values_read_error(where, e, hint=""):
    how = f"{e.how}, or a NumPy conversion" if e.how == ".numpy()" else e.how
    if hint:
        return CaptureError(f"{where} reads a tensor's values in Python ({how})"
                            f"{_user_line(e)}, which a trace cannot follow{hint}")
    return CaptureError(
        f"{where} reads a tensor's values in Python ({how}){_user_line(e)}, "
        "which a trace cannot follow: the plan would replay the values of the batch it "
        "was captured with at every step. Compute it with tensor operations (a mask "
        "such as torch.arange(T) < lengths[:, None] instead of a loop over "
        "lengths.tolist(); torch.bincount instead of np.bincount), or outside the step "
        "(then pass the result in as an input)")


def _generator_set_error(where, e):
    return CaptureError(
        f"{where} calls {e.how} while the step is captured (a torch.random.fork_rng block "
        "sets the state back with torch.set_rng_state): a traced step runs no Python, so it "
        "cannot reseed the generator inside the step, and its random numbers would not be "
        "eager's. Seed before calling the step (it draws from the default generator, in "
        "eager's order), or keep the seeding out of the forward and the loss")


def _leaf_written_error(where, e, written=None):
    """The CaptureError of a parameter written in place in the forward;
    `written`: _parameter_written's (name, line), else the user's line in
    `e`."""
    who = where if where.startswith("module") else "the step"
    what, line = (f"the parameter '{written[0]}'", written[1]) if written else \
        ("a parameter (a tensor that requires grad)", _user_line(e))
    return CaptureError(
        f"{who} writes {what} in place in the forward{line} (a weight clamped under "
        "torch.no_grad(); nn.Embedding with "
        "max_norm renormalizes its rows so): pebble.torch cannot plan a step "
        "that changes what it is given. Do that write outside the step, under "
        "torch.no_grad(), before or after each call (for nn.Embedding, "
        "max_norm=None and renormalize the rows so; with shard='full', inside `with "
        "step.whole_parameters():`)")


def _refuse_untraced(model, loss_fn, slots, flat, device, failure, sharded):
    """Raises the CaptureError for a step that no mode traced; `failure`:
    (where, exception, a callable that traces that mode again to name a
    backward that read a value: _rerun_for_culprit) of the last mode tried.
    Unsharded, the step is run eagerly first to tell the user's own error
    apart from PyTorch's refusal to trace it."""
    where, e, rerun = failure
    if sharded:
        # (no eager run to tell the user's own error apart: no rank holds the
        # parameters whole)
        said = f"{type(e).__name__}: {_first_line(e)}"
        if _REAL_IN_FAKE in said:
            raise CaptureError(f"{where} cannot be traced by PyTorch with fake tensors "
                               "(make_fx), which a sharded step needs (its parameters are "
                               f"shards): {said.split('(*(')[0]}{_user_line(e)}"
                               f"{_real_tensor_hint(model, where)}") from e
        raise CaptureError(f"{where} cannot be traced by PyTorch with fake tensors (make_fx), "
                           "which a sharded step needs (its parameters are shards): "
                           f"{said}{_user_line(e)}{_trace_hint(e, model, where)}"
                           " (where the module or the loss fails on these inputs without "
                           "pebble too, this is that error: the same step unsharded says "
                           "which)") from e
    with _buffers_registered_again(model) as registered:
        eager = _eager_failure(model, loss_fn, slots, flat, device)
    if eager is not None and registered:
        (who, name), (_, e) = registered[0], eager
        raise CaptureError(
            f"module {who} registers buffer '{name}' again in its forward (a cache grown on "
            "demand, as rotary embeddings' cos_cached): pebble.torch runs the forward on the "
            "buffers the module held before the call, where it fails "
            f"({type(e).__name__}: {_first_line(e)}). Give the buffer its largest size before "
            "the step is made (in __init__), or compute it in the forward without registering "
            "it") from e
    if eager is not None:
        where, e = eager
        raise CaptureError(_eager_failure_text(where, e)) from e
    if _MODIFIED_IN_PLACE in str(e):  # (autograd's own check: eager's backward fails too)
        raise CaptureError(
            "the step's backward fails without pebble too (PyTorch's autograd refuses it in "
            "eager mode as well): an in-place operation in the forward or the loss writes a "
            "tensor that the backward needs, as `y = h.relu_(); y += 1` writes relu's output. "
            "Write that operation out of place (`y = y + 1`). PyTorch said: "
            f"{type(e).__name__}: {_first_line(e)}") from e
    if isinstance(e, _FunctionalizeFailed):
        # (a hint of the cause's own, as a complex tensor's, comes first)
        hint = _trace_hint(e.cause, model, where) or (
            ". A write into part of a tensor that the backward reads (y[:, 0] = 1.0, "
            "x[mask] = 0) is the usual cause: write it out of place (torch.cat of the parts, "
            "torch.where(mask, 0.0, x))")
        refusal = CaptureError(
            f"{where} was traced, but PyTorch's functionalize, which makes its in-place writes "
            f"functional for the plan, fails on it: {e}{hint}")
        refusal.untraced = True
        raise refusal from e.cause
    culprit = rerun() if _reads_a_value(e) and not _user_line(e) else None
    if culprit is not None:
        node, line = culprit
        refusal = CaptureError(
            f"{where} cannot be traced by PyTorch (make_fx): the backward of the call{line} "
            f"(autograd's {node}) reads a tensor's value in PyTorch's own code, which a "
            f"trace cannot follow{_BACKWARD_READING_HINTS.get(node, _BACKWARD_READING_HINT)}")
    else:
        refusal = CaptureError(f"{where} cannot be traced by PyTorch (make_fx): "
                               f"{type(e).__name__}: {_first_line(e)}{_user_line(e)}"
                               f"{_trace_hint(e, model, where)}")
    refusal.untraced = True  # (PyTorch's failure, not a refusal of pebble's: trace())
    raise refusal from e


# What to write instead of a call whose backward reads a tensor's value
# (_backward_reading_values), by autograd's node.
_BACKWARD_READING_HINT = (" (write that operation another way, with operators whose gradient "
                          "PyTorch computes from tensors alone)")
_BACKWARD_READING_HINTS = {
    "ScatterReduceBackward0": (
        " (PyTorch 1.13's gradient of scatter_reduce with reduce='prod' asks in Python "
        "whether a group holds two zeros: for positive values, the product is "
        "torch.exp(torch.zeros_like(out).scatter_add(dim, index, src.log())), whose gradient "
        "reads no value; other reductions trace)"),
    "IndexReduceBackward0": (
        " (PyTorch 1.13's gradient of index_reduce with reduce='prod' asks in Python "
        "whether a group holds two zeros: for positive values, the product is "
        "torch.exp(torch.zeros_like(out).index_add(dim, index, src.log())), whose gradient "
        "reads no value; other reductions trace)"),
}


# How autograd (1.13 and 2.x) refuses a backward whose saved tensor an
# in-place operation changed after the forward saved it.
_MODIFIED_IN_PLACE = "needed for gradient computation has been modified by an inplace operation"


# How PyTorch 1.13 (the first) and 2.x say that a trace read a tensor's value.
_DATA_DEPENDENT = ("get value out of a tracing tensor", "data-dependent", "data dependent",
                   "_local_scalar_dense", "DataDependent")


def _reads_a_value(e):
    """Whether PyTorch's error `e` says that a trace read a tensor's value."""
    said = f"{type(e).__name__}: {e}"
    return any(words in said for words in _DATA_DEPENDENT)


# How PyTorch (1.13 and 2.x) refuses a real tensor in a trace of fake ones.
_REAL_IN_FAKE = "non-Fake Tensor inputs in FakeTensorMode"


def _real_tensor_hint(model, where):
    """Why a real tensor reached a sharded step's fake trace: a parameter or
    buffer that a module also holds in a list, tuple or dict of its own
    (the trace stands in for each where the module registers it, so the
    container hands the trace the real tensor, a shard), a parameter read
    by the loss (`where`: the loss), else a tensor made outside the step."""
    registered = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        registered.setdefault(id(t), name)
    for module_name, module in model.named_modules():
        for attribute, value in vars(module).items():
            if attribute.startswith("_") or not isinstance(value, (list, tuple, dict)):
                continue
            items = value.values() if isinstance(value, dict) else value
            for t in items:
                if isinstance(t, torch.Tensor) and id(t) in registered:
                    return (f" (module {_module_label(module_name, module)} holds "
                            f"'{registered[id(t)]}' in its {type(value).__name__} "
                            f"'{attribute}', outside its parameters and buffers: the trace "
                            "stands in for each parameter where its module registers it, so "
                            "the copy held there reaches it as the real shard. Read it through "
                            f"its module (self.{registered[id(t)]}), or hold it in an "
                            "nn.ParameterList or nn.ParameterDict)")
    if not where.startswith("module"):
        return (" (the loss read a tensor other than the output and the target: the module's "
                "parameters, as a penalty over model.parameters() reads them, are shards that "
                "the trace stands in for inside the forward only. Compute such a term in the "
                "forward and return it with the output, or use the optimizer's weight_decay; "
                "a tensor made outside the step: pass it as an input)")
    return (" (a tensor made outside the step, neither a parameter or buffer of the module "
            "nor one of its inputs, reached the trace: pass it as an input, or register it "
            "as a buffer)")


# How PyTorch 1.13 refuses the legacy constructor torch.Tensor([...]) in a trace.
_LEGACY_CONSTRUCTOR = "Creating a new Tensor subclass Tensor"


def _traceback_entries(e):
    """(code object, line number) of each frame of `e`'s traceback,
    outermost first."""
    tb = e.__traceback__
    while tb is not None:
        yield tb.tb_frame.f_code, tb.tb_lineno
        tb = tb.tb_next


@functools.lru_cache(maxsize=1)  # (read at every call: a loss's settings)
def _library_directories():
    """The folders of code that is not the user's: PyTorch's (functorch's
    with it), pebble's, and Python's own library."""
    paths = sysconfig.get_paths()
    pebble_folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folders = {os.path.dirname(torch.__file__), pebble_folder,
               paths["stdlib"], paths["purelib"], paths["platlib"]}
    try:
        import functorch
        folders.add(os.path.dirname(functorch.__file__))
    except ImportError:
        pass
    return tuple(os.path.realpath(f) + os.sep for f in folders)


def _user_line(e):
    """' (at file:line: `code`)' for the innermost frame of `e`'s traceback
    that runs the user's code (a file outside PyTorch, pebble and Python's
    library: a module's forward, a loss of their own), else ''. Code
    installed in site-packages counts as a library's: no line rather than
    a wrong one."""
    libraries = _library_directories()
    found = None
    for code, line in _traceback_entries(e):
        if _users_file(code.co_filename, libraries):
            found = (code.co_filename, line)
    return _at_line(*found) if found is not None else ""


def _users_file(path, libraries):
    """Whether `path` holds the user's code: a real file outside
    `libraries` (_library_directories)."""
    return not path.startswith("<") and not os.path.realpath(path).startswith(libraries)


def _at_line(path, line):
    """' (at file:line: `code`)'."""
    code = linecache.getline(path, line).strip()
    return f" (at {os.path.basename(path)}:{line}" + (f": `{code}`)" if code else ")")


def _traced_user_line(node, outer, libraries):
    """_user_line of a traced call: the innermost frame of its recorded
    stack (make_fx_with_stacks) that runs the user's code inside the
    step, else ''. `outer`: the (file, line) of the frames that called the
    trace (the user's script, pebble's own), which are not inside it. The
    frames left are the step's own, and their order is told by where the
    outer ones stood (PyTorch versions differ); where none is left to tell,
    the order is taken as traceback.extract_stack's, outermost first."""
    frames = traced_frames(node)
    inner = [(i, path, line) for i, (path, line, _) in enumerate(frames)
             if (path, line) not in outer]
    if not inner:
        return ""
    outer_first = len(inner) == len(frames) or inner[0][0] > 0
    for _, path, line in (reversed(inner) if outer_first else inner):
        if _users_file(path, libraries):
            return _at_line(path, line)
    return ""


def _value_shaped_lines(gm):
    """_traced_user_line of each value-shaped call of a first trace, in the
    graph's order. One that autograd's backward makes has no line of the
    user's: a masked_select by the mask of a masked_scatter is that call's
    gradient, and is told so, at the masked_scatter's line."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and _value_shaped(n)]
    if not calls:  # (most steps: no stack to read)
        return []
    outer = {(f.filename, f.lineno) for f in traceback.extract_stack()}
    libraries = _library_directories()
    scatters = {}  # the mask's node -> the masked_scatter that reads it
    for n in gm.graph.nodes:
        if n.op == "call_function" and op_name(n.target) == "masked_scatter" and \
                len(n.args) > 1:
            scatters.setdefault(n.args[1], n)
    lines = []
    for n in calls:
        line = _traced_user_line(n, outer, libraries)
        scatter = scatters.get(n.args[1]) if op_name(n.target) == "masked_select" and \
            len(n.args) > 1 else None
        if not line and scatter is not None:
            at = _traced_user_line(scatter, outer, libraries)  # ' (at file:line: `code`)'
            line = f" (masked_scatter's gradient{', ' + at[2:-1] if at else ''})"
        lines.append(line)
    return lines


def _mark_value_shaped_lines(gm, lines):
    """Each value-shaped call of `gm` (the first trace's, made functional, or
    traced again through functionalize, which neither adds nor reorders
    them) gets its line in the user's code as meta["user_line"], which the
    errors about its shape name (Note [Shapes that follow values]). Nothing
    where the counts differ."""
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and _value_shaped(n)]
    if len(calls) != len(lines):
        return
    for n, line in zip(calls, lines):
        if line:
            n.meta["user_line"] = line


def _raised_in(e, function):
    """Whether a frame of `e`'s traceback runs `function` (by its name)."""
    return any(code.co_name == function for code, _ in _traceback_entries(e))


def _raised_in_file(e, fragment):
    """Whether a frame of `e`'s traceback runs code of a file whose path
    holds `fragment`."""
    return any(fragment in code.co_filename.replace("\\", "/")
               for code, _ in _traceback_entries(e))


def _torchscript_line(said):
    """The line TorchScript's error marks ("<--- HERE"), else its last."""
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    for k, line in enumerate(lines):
        if "<--- HERE" in line and k > 0:
            return f"at `{lines[k - 1]}`"
    return lines[-1] if lines else said


def _trace_hint(e, model, where):
    """Advice where PyTorch refused a trace for a reason a user can mend: a
    tensor's value read in Python (a batch norm's cumulative average and a
    distribution's argument checks among them), a complex tensor, the legacy
    torch.Tensor constructor, or PyTorch 1.13's code for Tensor.random_(from,
    to). `where`: the module that ran (_ModuleStack)."""
    said = f"{type(e).__name__}: {e}"
    if "TorchScript interpreter" in said:
        return (" (a torch.jit.script function runs in TorchScript's interpreter, which a "
                "trace cannot look into, and it failed there: "
                f"{_torchscript_line(said)}; call the Python function it was made from)")
    if "torch._C.Generator" in said:
        return (" (a torch.Generator of your own in the step, which a trace cannot take: "
                "draw from the default generator, seeded with torch.manual_seed, whose state "
                "the plan replays)")
    data_dependent = _reads_a_value(e)
    if _raised_in(e, "pack_padded_sequence") or data_dependent:
        hint = _value_read_hint(e, model, where)
        if hint:
            return hint
    if _LEGACY_CONSTRUCTOR in said:
        return (" (torch.Tensor([...]), the legacy constructor, in the step: write "
                "torch.tensor([...]), which a trace takes as a constant)")
    if "complex" in said.lower():
        return (" (a complex tensor, as torch.stft(..., return_complex=True) and torch.fft make, "
                "on which PyTorch's trace failed here: compute that part with real tensors "
                "(torch.view_as_real gives the real and imaginary parts, and a magnitude is "
                "the square root of the sum of their squares), or outside the step)")
    if isinstance(e, SyntaxError) and "eval_with_key" in said:
        return (" (PyTorch 1.13's make_fx writes code that Python refuses for some "
                "in-place random fills, as Tensor.random_(low, high), whose overload it names "
                "`from`: write torch.randint_like(t, low, high) instead)")
    if not data_dependent:
        return ""
    return (" (the step reads a tensor's value in Python: .item(), .tolist(), int(), float() "
            "or bool() of a tensor, an `if` on a tensor, or an operator that checks its "
            "values, as F.one_hot(t, num_classes) does; write that part with tensors alone, "
            "such as "
            "torch.zeros_like(out).scatter_(1, t[:, None], 1.0) for a one-hot)")


def _value_read_hint(e, model, where):
    """Advice where the step read a tensor's value in Python (`e`: PyTorch's
    refusal of it, or pebble's _ValuesRead) inside code a user can mend by
    other means than writing tensors: an RNN given a packed sequence, a
    distribution's argument checks, F.gaussian_nll_loss's sign check, a
    batch norm's cumulative average. `where`: the module that ran. "" where
    none of these is it."""
    rnns = [_module_label(name, m) for name, m in model.named_modules()
            if isinstance(m, torch.nn.RNNBase)]
    if _raised_in(e, "pack_padded_sequence") or any(r in where for r in rnns):
        return (" (an RNN given a packed sequence, nn.utils.rnn.pack_padded_sequence's, "
                "reads its lengths in Python: run the RNN on the padded batch and mask its "
                "outputs by length, e.g. gather each sequence's last step at lengths - 1)")
    if _raised_in_file(e, "torch/distributions/"):
        return (" (torch.distributions checks its arguments' values in Python unless made with "
                "validate_args=False: pass it to the distribution, or call "
                "torch.distributions.Distribution.set_default_validate_args(False) before the "
                "step is made)")
    if _raised_in(e, "gaussian_nll_loss"):
        return (" (F.gaussian_nll_loss, nn.GaussianNLLLoss's, checks that var has no "
                "negative entry with an `if` on a tensor: write the loss with tensors "
                "alone, v = var.clamp(min=eps); "
                "0.5 * (v.log() + (input - target) ** 2 / v), then its mean or sum)")
    cumulative = [_module_label(name, m) for name, m in model.named_modules()
                  if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and
                  m.momentum is None and m.training and m.track_running_stats]
    if cumulative and any(c in where for c in cumulative):
        return (" (a batch norm with momentum=None averages its running statistics over "
                "all batches, and reads its batch count as a Python number to do so, "
                "which a trace cannot: give it a momentum, such as PyTorch's default 0.1)")
    return ""


# Note [Checkpoints in the module]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A module may checkpoint its blocks itself (torch.utils.checkpoint, as
# Hugging Face's gradient_checkpointing_enable() does). Traced as it is, the
# checkpoint's recomputation is in the captured graph, but not its putting
# back of the generator's state: a dropout in the block drew a new mask for
# the backward (gradients 0.1 away from eager's, under every plan), and a
# reentrant checkpoint could not be traced at all. What to recompute is the
# plan's to decide, so the capture runs each checkpointed function inline,
# as if it were not checkpointed: eager's numbers (the checkpoint replays the
# forward's generator state, preserve_rng_state=True, its default), and the
# plan recomputes what the budget needs.
_CHECKPOINT_OPTIONS = ("use_reentrant", "preserve_rng_state", "context_fn",
                       "determinism_check", "debug")


# Note [Running statistics in a checkpoint]. Eager's checkpoint runs its
# function again in the backward, in training mode: a batch norm inside
# (torchvision's densenet with memory_efficient=True checkpoints its
# norm1) updates its running statistics, and num_batches_tracked, a second
# time, on the same input (the generator's state put back: the same
# dropout masks before it). Run inline, the step updated them once, and its
# statistics drifted from eager's silently (gradients equal). So each norm
# that tracks running statistics, run inside a checkpointed function that
# eager runs again (reentrant: where an input requires grad; else always),
# runs again on its recorded input outside autograd, after the module's
# forward, the checkpoints' in reverse order, as eager's backward reruns
# them. Its output is not read; the call is kept for its effect on the
# statistics (Note [Calls kept for their effects] in _graph.py).


def _runs_statistics(module):
    """Whether `module` updates running statistics when called (a batch or
    instance norm in training mode that tracks them)."""
    return (isinstance(module, torch.nn.modules.batchnorm._NormBase) and module.training and
            module.track_running_stats and module.running_mean is not None)


@contextlib.contextmanager
def _checkpoints_inline(model):
    """torch.utils.checkpoint's checkpoints run their function inline while
    a trace runs (Note [Checkpoints in the module]): the module's
    `checkpoint(...)`, imported by name or not, reentrant or not, in
    PyTorch 1.13 and 2.x; and the norms with running statistics inside
    them run again after `model`'s forward (Note [Running statistics in a
    checkpoint])."""
    import torch.utils.checkpoint as module

    reruns = []  # per checkpointed call eager runs again: [(norm, its inputs)]

    @contextlib.contextmanager
    def recorded(again):
        """Records the norms with running statistics that the block runs;
        kept for a rerun where again() says eager runs the function again."""
        norms = []
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda m, inputs, output: norms.append((m, inputs)) if _runs_statistics(m) else None)
        try:
            yield
        finally:
            handle.remove()
        if norms and again():
            reruns.append(norms)

    def any_requires_grad(values):
        return any(isinstance(t, torch.Tensor) and t.requires_grad
                   for t in tree_flatten(values)[0])

    def checkpoint(function, *args, **kwargs):
        kwargs = {k: v for k, v in kwargs.items() if k not in _CHECKPOINT_OPTIONS}
        return without_reentrant(function, True, *args, **kwargs)

    def without_reentrant(function, preserve_rng_state=True, *args, **kwargs):  # 1.13
        with recorded(lambda: True):
            return function(*args, **kwargs)

    def reentrant(function, preserve, *args):
        with recorded(lambda: any_requires_grad(args)):
            return function(*args)

    def generator(*args, **kwargs):  # 2.x: checkpoint() calls the function between two next()
        with recorded(lambda: True):
            yield

    def run_again(m, inputs, output):
        with torch.no_grad():
            while reruns:
                for norm, norm_inputs in reruns.pop():
                    norm(*norm_inputs)

    patches = [(module, "checkpoint", checkpoint),
               (module, "_checkpoint_without_reentrant", without_reentrant),
               (module, "_checkpoint_without_reentrant_generator", generator),
               (module.CheckpointFunction, "apply", staticmethod(reentrant))]
    applied = []  # (owner, name, what its own __dict__ held, or _NOT_PLAIN for nothing)
    handle = model.register_forward_hook(run_again)
    try:
        for owner, name, value in patches:
            if name in owner.__dict__ or name == "apply":  # (apply: inherited from Function)
                applied.append((owner, name, owner.__dict__.get(name, _NOT_PLAIN)))
                setattr(owner, name, value)
        yield
    finally:
        handle.remove()
        for owner, name, before in reversed(applied):
            if before is _NOT_PLAIN:
                delattr(owner, name)
            else:
                setattr(owner, name, before)


def _refuse_tensors_requiring_grad(gm, loss_fn):
    """CaptureError where the step reads a tensor that requires grad but is
    no parameter of the module (a learnable weight of the loss, or a tensor
    the forward takes from elsewhere): the trace holds it as a constant, and
    the step would leave its .grad None where eager's backward fills it."""
    names = {}
    for label, module in _modules_loss_fn_reaches(loss_fn):
        for name, p in module.named_parameters():
            names.setdefault(id(p), f"{label}'s parameter '{name}'")
    # (a tensor the loss names itself: a global or closed-over nn.Parameter,
    # a learnable temperature)
    for label, value, _, _ in _names_loss_fn_reads(loss_fn):
        if isinstance(value, torch.Tensor):
            names.setdefault(id(value), f"{label}, a tensor of shape {tuple(value.shape)} that "
                                        "requires grad")
    for n in gm.graph.nodes:
        if n.op != "get_attr":
            continue
        t = getattr(gm, n.target, None)
        if isinstance(t, torch.Tensor) and t.requires_grad:
            what = names.get(id(t), f"a tensor of shape {tuple(t.shape)} that requires grad "
                                    "and is no parameter of the module")
            raise CaptureError(
                f"the step reads {what}: it computes the module's parameters' gradients only, "
                "and would leave its .grad None. Make it a parameter of the module (a loss "
                "with learnable weights can be a submodule of the trained module), or detach "
                "it; where eager computes no gradient for it either (a frozen teacher read "
                "under torch.no_grad()), say so with requires_grad_(False) on it (or on its "
                "module)")


def _modules_loss_fn_reaches(loss_fn):
    """(label, module) of the modules `loss_fn` is, or holds in its closure,
    its bound method's object or the globals its code names: where a tensor
    it reads may be a parameter, to name it."""
    found = []
    if isinstance(loss_fn, torch.nn.Module):
        found.append(("loss_fn", loss_fn))
    found += [(label, value) for label, value, _, _ in _names_loss_fn_reads(loss_fn)
              if isinstance(value, torch.nn.Module)]
    function = loss_fn.func if isinstance(loss_fn, functools.partial) else loss_fn
    owner = getattr(function, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        found.append((f"loss_fn's {type(owner).__name__}", owner))
    elif owner is not None and hasattr(owner, "__dict__"):
        found += [(f"loss_fn's {type(owner).__name__}.{k}", v) for k, v in vars(owner).items()
                  if isinstance(v, torch.nn.Module)]
    return found


# Calls whose only tensor argument is a template (shape, dtype, layout).
TEMPLATE_CALLS = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
                  "randint_like", "new_empty", "new_empty_strided", "new_zeros", "new_ones",
                  "new_full"}
# Operators that take a tensor as their first argument to overwrite it, or
# for its shape and dtype alone (functional or in place).
_OVERWRITES = TEMPLATE_CALLS | {
    "fill", "zero", "copy", "normal", "uniform", "bernoulli", "random", "exponential",
    "geometric", "log_normal", "cauchy", "index_put", "slice_scatter", "select_scatter",
    "diagonal_scatter", "as_strided_scatter", "scatter", "index_copy", "masked_scatter",
    "resize"}


# Operators whose result holds their first argument's values (a copy, a cast).
_SAME_VALUES = {"_to_copy", "clone", "contiguous", "alias", "lift_fresh_copy", "to"}


# The argument (by position) that a kernel writes, though PyTorch 1.13's
# schema does not say so (nn.RReLU's noise, which its backward reads: the
# graph refuses it in training mode, saying why).
_WRITTEN_UNSAID = {"rrelu_with_noise": 1}


def _writes_unsaid(n, of):
    """Whether call n writes its argument `of` where its schema does not say."""
    written = _WRITTEN_UNSAID.get(op_name(n.target))
    return written is not None and len(n.args) > written and n.args[written] is of


def _reads_values(n, of):
    """Whether call n reads the values of its argument `of` (an fx node):
    not where n only overwrites it or takes its shape (_OVERWRITES, as
    their first argument)."""
    positional = [a for a in n.args if isinstance(a, torch.fx.Node)]
    if positional.count(of) != 1 or of in n.kwargs.values():
        return True
    # (functionalization names a random fill normal_functional)
    name = op_name(n.target).rstrip("_")
    if name.endswith("_functional"):
        name = name[:-len("_functional")]
    return not (n.args[0] is of and name in _OVERWRITES)


def _no_elements(n):
    """Whether call n makes a tensor of no elements (torch.empty(0), a start
    to concatenate onto), as its size or its recorded value says."""
    value = n.meta.get("val", n.meta.get("tensor_meta"))
    shape = getattr(value, "shape", None)
    if shape is None:
        size = n.args[1] if op_name(n.target).startswith("new_") and len(n.args) > 1 else \
            (n.args[0] if n.args else None)
        shape = size if isinstance(size, (list, tuple)) else None
    return shape is not None and any(isinstance(d, int) and d == 0 for d in shape)


def _refuse_unfilled_reads(gm):
    """CaptureError where an operator reads a tensor that an empty() made and
    no operator filled: PyTorch filled it outside what a trace sees (C++ code
    that copies a list's data into a new tensor: nn.CTCLoss's lengths given as
    Python lists), so a replay would read garbage. Views of it are followed."""
    for n in gm.graph.nodes:
        if n.op != "call_function" or op_name(n.target) not in UNFILLED or \
                _no_elements(n) or any(_writes_unsaid(u, n) for u in n.users):
            continue
        pending = [n]
        while pending:
            made = pending.pop()
            for user in made.users:
                if user.op != "call_function":
                    continue
                schema = getattr(user.target, "_schema", None)
                returns_view = schema is not None and schema.returns and \
                    schema.returns[0].alias_info is not None and \
                    not schema.returns[0].alias_info.is_write
                if user.args and user.args[0] is made and (
                        returns_view or op_name(user.target) in _SAME_VALUES):
                    pending.append(user)  # (the same values, unfilled still)
                elif _reads_values(user, made):
                    raise CaptureError(
                        f"operator {user.target} reads a tensor that {n.target} made before "
                        "any operator wrote it: its values were written outside what a trace "
                        "sees (C++ code that copies a Python list into a tensor, as "
                        "nn.CTCLoss does with lengths given as lists) or never, so a replay "
                        "would read garbage. Give such values as tensors (nn.CTCLoss: "
                        "input_lengths and target_lengths as tensors), or fill the tensor "
                        "before reading it")


# PyTorch's refusal of an in-place write into a leaf that requires grad.
_LEAF_WRITTEN = "a leaf Variable that requires grad is being used in an in-place operation"


def eager_failure_message(model, loss_fn, inputs, target, device):
    """The refusal of a step whose module or loss_fn fails run eagerly on
    this batch (_eager_failure), else None: where a kernel of the step fails
    at its first run (an int32 target for cross_entropy, which fake tensors
    let through), the user is told that eager fails as well, and where."""
    slots = module_slots(model) + _batch_slots(inputs)
    found = _eager_failure(model, loss_fn, slots, _placeholder_values(slots, inputs, target),
                           device)
    return _eager_failure_text(*found) if found is not None else None


def _eager_failure_text(where, e):
    """The refusal of a step that fails run eagerly (_eager_failure's)."""
    return (f"{where} fails on these inputs without pebble too (run eagerly): "
            f"{type(e).__name__}: {_first_line(e)}{_user_line(e)}")


def _batch_slots(inputs):
    """The slots of a step's batch, after its module's: each input, then
    the target."""
    return [Slot("input", index=k) for k in range(len(inputs))] + [Slot("target")]


def _eager_failure(model, loss_fn, slots, flat, device):
    """(where, what it raised) where the module's forward or loss_fn fails
    run eagerly on the step's tensors, else None: a trace that fails on the
    user's own error (a shape that does not match in a hand-written loss)
    is then reported as that, not as a limit of the trace. Runs without
    gradients, on copies of the parameters and buffers, the generators left
    as they were."""
    n_state = sum(1 for s in slots if s.kind in ("parameter", "buffer"))
    try:  # (copies: a forward may write its parameters or buffers in place)
        state = _named_state(slots, [t.detach().clone() for t in flat[:n_state]])
    except RuntimeError:  # (no room for a copy: no diagnosis)
        return None
    inputs, target = tuple(flat[n_state:-1]), flat[-1]
    stack = _ModuleStack(model)
    try:
        with torch.no_grad(), _rng_kept(device), warnings.catch_warnings(), \
                _attributes_restored(model):
            warnings.simplefilter("ignore")  # (the trace gave the forward's warnings)
            output = functional_call(model, state, inputs)
            stack.close()
            loss_fn(output, target)
    except Exception as e:  # noqa: BLE001 (the user's code's own error, reported)
        if "out of memory" in str(e):  # (the copies' doing, not the user's code)
            return None
        return (stack.where() if stack.stack else "loss_fn"), e
    finally:
        stack.close()
    return None


# Note [Stand-ins for sharded parameters]: a sharded module's parameters
# hold no data between steps (each rank keeps its shards), and gathering
# them whole to trace the step would hold the whole model on every rank,
# which sharding is there to avoid. A fake trace reads no data: each such
# parameter is a fake tensor of its shape, dtype and device, made by a fake
# mode of our own (make_fx's fake mode takes real tensors only), and
# make_fx traces "real" inside that mode, so every tensor of the trace is
# one of its fakes. PyTorch 1.13 and 2.x both trace so.
def _with_stand_ins(slots, flat, stand_ins, device):
    """(a fake mode, `flat` as fake tensors of that mode): each parameter of
    `stand_ins` a fake of its shape, the others converted."""
    fake_mode = FakeTensorMode()
    out = []
    for slot, t in zip(slots, flat):
        shape = stand_ins.get(slot.names[0]) if slot.kind == "parameter" else None
        if shape is None:
            out.append(fake_mode.from_tensor(t))
            continue
        with fake_mode:
            fake = torch.empty(shape, dtype=t.dtype, device=device)
        out.append(fake.requires_grad_(t.requires_grad))
    return fake_mode, out


def _make_fx(fn, mode, flat, fake_mode, stacks=False):
    """make_fx(fn, tracing_mode=mode)(*flat), or, with `fake_mode` (flat its
    fakes: Note [Stand-ins for sharded parameters]), a trace inside it.
    `stacks`: each node keeps its call's Python stack (make_fx_with_stacks)."""
    tracer = make_fx_with_stacks if stacks else make_fx
    if fake_mode is None:
        gm = tracer(fn, tracing_mode=mode)(*flat)
    else:
        with fake_mode:
            gm = tracer(fn, tracing_mode="real")(*flat)
    # PyTorch 1.13 leaves a proxy slot in each value the trace made (the
    # values its graph's nodes keep): proxy, tracer, graph. A value that
    # autograd's graph still holds from C++ is out of the collector's sight,
    # and with its slot it kept the whole trace alive, fake mode and graph
    # (800 objects for a 3-layer MLP, each later full collection slower;
    # real tensors where the trace ran real) for the life of the process,
    # until 2026-12-05.
    forget_traces(v for node in gm.graph.nodes
                  for v in tree_flatten(node.meta.get("val"))[0])
    forget_fx_source_with(gm)
    return gm


@contextlib.contextmanager
def _around_each_forward(modules, before, after):
    """before(module) and after(module) around each forward of `modules`
    while the block runs (after() not where the forward raised)."""
    handles = [h for m in modules
               for h in (m.register_forward_pre_hook(lambda module, args: before(module)),
                         m.register_forward_hook(lambda module, args, out: after(module)))]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _rnn_weights_rebound(model):
    """The model's recurrent layers (nn.LSTM, nn.GRU, nn.RNN) read their
    weights from a list made when they were (_flat_weights), which PyTorch
    1.13's functional_call does not rebind: each forward in the trace reads
    the tensors functional_call binds (a sharded step's stand-ins: Note
    [Stand-ins for sharded parameters]; the module's own parameters, else)
    and gives its list back after."""
    rnns = [m for m in model.modules() if isinstance(m, torch.nn.RNNBase) and
            isinstance(getattr(m, "_flat_weights", None), list)]
    saved = {}

    def before(module):
        saved.setdefault(id(module), []).append(module._flat_weights)
        module.__dict__["_flat_weights"] = [getattr(module, name, None)
                                            for name in module._flat_weights_names]

    def after(module):
        module.__dict__["_flat_weights"] = saved[id(module)].pop()

    try:
        with _around_each_forward(rnns, before, after):
            yield
    finally:
        for m in rnns:  # (where a forward raised)
            if saved.get(id(m)):
                m.__dict__["_flat_weights"] = saved[id(m)][0]


@contextlib.contextmanager
def _rnn_without_cudnn(model, device):
    """On a GPU, the model's recurrent layers (nn.LSTM, nn.GRU, nn.RNN) are
    traced through PyTorch's own cells: cuDNN's RNN takes its weights as one
    flat buffer passed as an untyped storage, which make_fx cannot record
    (PyTorch 2). Other layers keep cuDNN."""
    rnns = [m for m in model.modules() if isinstance(m, torch.nn.RNNBase)]
    if device.type != "cuda" or not rnns:
        yield
        return
    saved = []

    def before(module):
        saved.append(torch.backends.cudnn.enabled)
        torch.backends.cudnn.enabled = False

    def after(module):
        torch.backends.cudnn.enabled = saved.pop()

    enabled = torch.backends.cudnn.enabled
    try:
        with _around_each_forward(rnns, before, after):
            yield
    finally:
        torch.backends.cudnn.enabled = enabled  # also where a forward raised


# --- values recorded by the trace ----------------------------------------------------

def traced_values(gm):
    """fx node -> its fake value as make_fx recorded it (node.meta["val"]);
    a call of several outputs -> the tuple of its getitem nodes' values
    (make_fx makes one for each output). None where a value is missing:
    then propagate() runs the graph. Call before unused getitems are
    removed."""
    values, parts = {}, {}
    fake_mode = None
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, FakeTensor):
            values[n] = v
            fake_mode = fake_mode or v.fake_mode
        if n.op == "call_function" and n.target is operator.getitem:
            if v is None and n.users:
                return None
            # An output that is no tensor (None: convolution_backward's
            # bias gradient without a bias) has no value; nothing reads it.
            parts.setdefault(n.args[0], {})[n.args[1]] = v
    if fake_mode is None:
        return None
    for n in gm.graph.nodes:
        if n in values or n.op == "output" or \
                (n.op == "call_function" and n.target is operator.getitem):
            continue
        if n.op == "get_attr":  # a constant: fake_mode's converter keeps one per tensor
            values[n] = fake_mode.from_tensor(getattr(gm, n.target))
        elif n.op == "call_function" and n in parts:
            got = parts[n]
            if sorted(got) != list(range(len(got))) or \
                    len(got) < _returns(n.target, len(got)):
                return None
            values[n] = tuple(got[k] for k in range(len(got)))
        else:
            return None
    return values


def _returns(target, default):
    """How many values a call returns (a list's length is not in its schema)."""
    schema = getattr(target, "_schema", None)
    if schema is None or any(str(r.type).endswith("[]") for r in schema.returns):
        return default
    return len(schema.returns)


def _fake_call(n, values, fake_mode):
    """n's call run on its arguments' fake values: its value, made anew.
    (Without autograd: a trace's values may be views that autograd made
    under no_grad, of which it refuses in-place calls' and views' variants
    with grad mode on; the graph already holds the backward.)"""
    args = torch.fx.node.map_arg(n.args, values.__getitem__)
    kwargs = torch.fx.node.map_arg(n.kwargs, values.__getitem__)
    with fake_mode, torch.no_grad():
        return n.target(*args, **kwargs)


# --- in-place calls made functional in the first trace --------------------------------

def _functional_variant(target):
    """aten.add.Tensor for aten.add_.Tensor: the same arguments, none
    written, a fresh result; None where there is none."""
    packet = getattr(target, "overloadpacket", None)
    name = getattr(packet, "__name__", "")
    if getattr(target, "namespace", None) != "aten" or not name.endswith("_") or \
            name.startswith("_"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    try:
        variant = getattr(packet, target._overloadname)
    except (AttributeError, RuntimeError):
        return None
    if _same_arguments(variant._schema, target._schema):
        return variant  # (add.Tensor for add_.Tensor)
    # Its own overload takes other types (pow.Scalar, a number for `self`,
    # for pow_.Scalar): the overload that takes its arguments
    # (pow.Tensor_Scalar).
    for overload in packet.overloads():
        variant = getattr(packet, overload)
        if _same_arguments(variant._schema, target._schema):
            return variant
    return None


def _same_arguments(functional, in_place):
    """Whether schema `functional` takes `in_place`'s arguments, of its types,
    writes none and returns one fresh tensor."""
    ours, theirs = functional.arguments, in_place.arguments
    return [(a.name, str(a.type)) for a in ours] == [(a.name, str(a.type)) for a in theirs] \
        and not any(a.alias_info is not None for a in ours) and \
        len(functional.returns) == 1 and functional.returns[0].alias_info is None


# Note [Writes that functionalize misses]. torch.unsafe_split's and
# unsafe_chunk's pieces, and _unsafe_view's result, share their input's
# storage, but their schemas do not say so (they exist to skip autograd's
# view checks: an LSTM cell writes its gates' pieces in place). functionalize
# and the one-pass rewrite follow aliases by schema, so they take such a
# piece for a tensor of its own. Where a write through one tensor of a
# storage meets a read, after it, of another that existed before it and is
# not the same tensor to them (the split tensor read whole after a piece was
# written, a piece read after the whole was written, pieces of two splits
# that overlap, a buffer or an input written through such a piece: its value
# after the step is the caller's), the plan would compute other numbers than
# eager; pebble.torch refuses the step. Tensors that lie in distinct pieces of
# one split cannot overlap (a row of an unbind and a piece of another row):
# writes and reads among them are followed, and so are reads that nothing
# needs. A write into a part of such a piece (b[1] = 0.5) is refused too:
# autograd's backward of a partial write reads where the part lies in its
# storage, which functionalize gives the piece anew, and its gradients were
# not eager's.
_UNANNOTATED_ALIASES = frozenset({"unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk",
                                  "_unsafe_view"})


def _alias_step(n):
    """(the fx node whose storage `n`'s value shares, whether its schema
    says so), or None where `n` makes a tensor of its own (Note [Writes
    that functionalize misses])."""
    call = n.args[0] if n.op == "call_function" and n.target is operator.getitem else n
    if not isinstance(call, torch.fx.Node) or call.op != "call_function" or \
            not call.args or not isinstance(call.args[0], torch.fx.Node):
        return None
    if _unannotated(call):
        return call.args[0], False
    schema = _schema_of(call)
    if schema is None or not schema.returns or schema.returns[0].alias_info is None:
        return None
    return call.args[0], True


def _write_functionalize_misses(nodes):
    """(an in-place call, the tensor a later read of which takes it as
    unwritten, or that it writes a part of, and which of the two) of a first
    trace, or None (Note [Writes that functionalize misses]). A tensor's
    root is the tensor that functionalize takes its views and writes to be
    of; its path, the pieces of splits it lies in, from its storage's first
    tensor on: two tensors whose paths part at one split with other indices
    cannot overlap. Reads count where the output or a write needs them (a
    view made and never read is none); a placeholder's own value counts as
    read at the end (an input or buffer written is the caller's)."""
    position = {n: k for k, n in enumerate(nodes)}
    root, storage, path = {}, {}, {}
    whole = {}  # node -> whether it is all of its root (the root, or a write through it)
    for n in nodes:
        step = _alias_step(n)
        if step is None:
            root[n], storage[n], path[n], whole[n] = n, n, (), True
            continue
        base, annotated = step
        storage[n] = storage.get(base, base)
        root[n] = root.get(base, base) if annotated else n
        whole[n] = not annotated or (whole.get(base, True) and writes_self(n))
        piece = _split_of(n)
        path[n] = path.get(base, ()) + (((piece, n.args[1]),) if piece is not None else ())
    writes = [w for w in nodes if writes_self(w) and w.args and
              isinstance(w.args[0], torch.fx.Node) and w.args[0] in storage]
    # (a write changes what later reads of its storage see: each counts)
    live = _needed(nodes, writes)
    in_storage = {}
    for n in nodes:
        in_storage.setdefault(storage[n], []).append(n)
    end = len(nodes)
    for w in writes:
        x = w.args[0]
        if not whole[x] and root[x].op == "call_function" and \
                root[x].target is operator.getitem and _unannotated(root[x].args[0]):
            return w, root[x], "part"
        tensors = in_storage[storage[x]]
        if len({root[n] for n in tensors}) == 1:
            continue  # (views and writes functionalize follows)
        for n in tensors:
            if root[n] is root[x] or position[n] >= position[w] or \
                    _disjoint(path[n], path[x]):
                continue
            last = end if n.op == "placeholder" else \
                max((position[u] for u in n.users if u in live), default=-1)
            if last > position[w]:
                return w, n, "read"
    return None


def _unannotated(call):
    """Whether fx call `call` makes aliases its schema does not declare."""
    return call.op == "call_function" and op_name(call.target) in _UNANNOTATED_ALIASES


def _disjoint(path_a, path_b):
    """Whether tensors of these split paths cannot overlap: they part at one
    split, as distinct pieces of it."""
    for a, b in zip(path_a, path_b):
        if a != b:
            return a[0] is b[0] and a[1] != b[1]
    return False  # (one lies in the other)


def _needed(nodes, roots):
    """The nodes that the output or one of `roots` reads, through their
    inputs, them included."""
    needed = set()
    stack = [n for n in nodes if n.op == "output"] + list(roots)
    while stack:
        n = stack.pop()
        if n not in needed:
            needed.add(n)
            stack.extend(n.all_input_nodes)
    return needed


def _traced_user_lines(*nodes):
    """_traced_user_line of each of the first trace's `nodes`, called here."""
    outer = {(f.filename, f.lineno) for f in traceback.extract_stack()}
    libraries = _library_directories()
    return [_traced_user_line(n, outer, libraries) for n in nodes]


def _refuse_writes_functionalize_misses(gm):
    """Raises a CaptureError naming the lines where the first trace `gm`
    writes a tensor in place that a later read takes as unwritten, or writes
    a part of an unsafe split's piece (Note [Writes that functionalize
    misses])."""
    found = _write_functionalize_misses(list(gm.graph.nodes))
    if found is None:
        return
    write, other, how = found
    lines = _traced_user_lines(write, other)
    made = f"a piece of {op_name(other.args[0].target)}" \
        if other.op == "call_function" and other.target is operator.getitem \
        else "the step's input or buffer" if other.op == "placeholder" \
        else f"a tensor made earlier by {op_name(other.target)}"
    if how == "part":
        raise CaptureError(
            f"the step writes in place with {op_name(write.target)}{lines[0]} into a part of "
            f"{made}{lines[1]}: such a piece does not tell PyTorch's tracing where it lies in "
            "the tensor it was split from, which autograd's backward of a partial write "
            "reads, so the plan's gradients would not be eager's. Use torch.split or chunk "
            "(views that autograd checks), or clone the piece before writing it")
    raise CaptureError(
        f"the step writes in place with {op_name(write.target)}{lines[0]} into memory that "
        f"{made}{lines[1]} shares, and reads that "
        "tensor after the write; the two share it through torch.unsafe_split, unsafe_chunk "
        "or _unsafe_view, which do not tell PyTorch's tracing so: the plan would read the "
        "values from before the write, unlike eager. Use torch.split or chunk (views that "
        "autograd checks), or clone the piece before writing it")


def _refuse_overlapping_writes(gm):
    """Raises a CaptureError naming the line where the first trace `gm`
    writes in place into memory that the same call reads in part (Note
    [Writes that read what they write])."""
    found = overlapping_write(list(gm.graph.nodes))
    if found is None:
        return
    write, other, how = found
    line = next((said for said in _traced_user_lines(write, other) if said), "")
    if how == "out":
        raise CaptureError(
            f"the step writes the result of {op_name(write.target)}{line} into a view of another "
            f"tensor given as out= ({op_name(other.target)}), which the plan's functional graph "
            "does not follow: assign it instead (y[:, 0] = torch.add(a, 1))")
    if how == "view":
        raise CaptureError(
            f"the step writes in place with {op_name(write.target)}{line} through a view "
            f"whose elements share memory ({op_name(other.target)}: an expanded tensor, or an "
            "as_strided view whose elements overlap): the write changes the elements that "
            "share it too, which the plan's functional graph and autograd do not follow. "
            "Write into a tensor of its own (clone, or contiguous, before writing)")
    raise CaptureError(
        f"the step writes in place with {op_name(write.target)}{line} into memory that the "
        "same call reads, in part (y[:, 1:] = y[:, :-1]): eager PyTorch computes it in the "
        "order of its kernel's loop, reading elements it has already written (or refuses it, "
        "where the tensors are contiguous), and a plan would read the values from before the "
        "write. Clone the source first (y[:, 1:] = y[:, :-1].clone())")


def _refuse_reshaped_and_written(gm):
    """Raises a CaptureError naming the line where the first trace `gm`,
    which functionalize is to trace again, reshapes in place (t_,
    unsqueeze_) a tensor whose memory a call writes in place too: PyTorch
    1.13's functionalize gave such steps other gradients than eager's."""
    found = reshaped_and_written(list(gm.graph.nodes))
    if found is None:
        return
    reshape, write = found
    lines = _traced_user_lines(reshape, write)
    raise CaptureError(
        f"the step reshapes a tensor in place with {op_name(reshape.target)}{lines[0]} and "
        f"writes its memory in place with {op_name(write.target)}{lines[1]}: PyTorch's "
        "functionalize, which makes such a step's writes functional for the plan, computes "
        "other gradients than eager for it. Reshape out of place (x = x.t(), "
        "x = x.unsqueeze(0))")


def _made_functional(gm, slots):
    """(gm, values) with each in-place call of the first trace replaced by its
    functional variant, as functionalize would (a later reader of the
    tensor reads the variant's result; a buffer written in place gets a
    final copy_ of its new value), or None where a case is not simple:
    functionalize then traces the graph again.

    Simple: a call writes only its first argument (`self`), and what shares
    that tensor's storage is the tensor and the calls that write it, but for
    views made after the last write (they then view the last result), or
    distinct pieces of one split written each in place, as an LSTM cell
    writes its gates (_pieces_renewed); else writes through views whose
    inverses are known, as y[:, 0] = 1.0 makes (Note [Writes through
    views]). An in-place call without a
    functional variant (bernoulli_.float) stays where it writes a fresh
    tensor nothing else reads, as functionalize leaves it. Values are
    make_fx's, the variants' and the later views' made anew on fake
    tensors."""
    values = traced_values(gm)
    if values is None:
        return None
    nodes = list(gm.graph.nodes)
    found = _simple_writes(nodes, values, slots)
    if found is None:
        from ._graph import _written_args  # noqa: PLC0415 (_graph imports this module)
        fake_mode = next(v.fake_mode for v in values.values() if isinstance(v, FakeTensor))
        return functional_through_views(
            gm, nodes, values, slots, _functional_variant,
            lambda n, of: _fake_call(n, of, fake_mode), _written_args)
    chains, variants, later_views = found
    if chains:
        _write_functionally(gm.graph, nodes, values, chains, variants, later_views)
    return gm, values  # trace() recompiles it once its unused calls are gone


def _simple_writes(nodes, values, slots):
    """(chains, variants, later_views) of a traced graph's in-place calls
    where each is simple (_made_functional), else None. chains: the tensor
    written (its head) -> [the head, then each call writing it]; variants:
    in-place call -> its functional variant, or None where it stays;
    later_views: the calls whose values are made anew (views of a written
    tensor made after its last write)."""
    # node -> storage key of its value (a call of several outputs: its
    # getitem nodes stand for it)
    storage = {n: storage_key(v) for n, v in values.items() if isinstance(v, torch.Tensor)}
    found = _write_chains(nodes, storage)
    if found is None:
        return None
    chains, variants = found
    position = {n: k for k, n in enumerate(nodes)}
    heads_in = {}  # storage key -> the heads of the chains writing it, in order
    for head in sorted(chains, key=position.get):
        heads_in.setdefault(storage[head], []).append(head)
    later_views = []
    for key, heads in heads_in.items():
        aliases = [n for n, k in storage.items()
                   if k == key and not any(n in chains[h] for h in heads)]
        views = _views_renewed(heads, chains, aliases, position) if len(heads) == 1 else \
            _pieces_renewed(heads, chains, aliases, position)
        if views is None:
            return None
        later_views += views
    placeholders = {n: slot for n, slot in zip([n for n in nodes if n.op == "placeholder"],
                                                 slots)}
    for chain in chains.values():
        slot = placeholders.get(chain[0])
        if chain[0].op == "placeholder" and (slot is None or slot.kind != "buffer"):
            return None  # a parameter or an input written: functionalize's error
    return chains, variants, later_views


def _write_chains(nodes, storage):
    """(chains, variants) of _simple_writes (`storage`: its node -> storage
    key of the node's tensor), or None where a call writes
    more than its `self`, writes through a tensor that is not a placeholder
    or a call's result, or stays in place (no functional variant) where it
    does not write a fresh tensor nothing else reads."""
    from ._graph import _written_args  # noqa: PLC0415 (_graph imports this module)
    chains = {}    # head -> [head, then each call writing it]
    head_of = {}   # a chain's node -> its head
    variants = {}
    for n in nodes:
        names = n.op == "call_function" and _written_args(n.target)
        if not names:
            continue
        self_name = n.target._schema.arguments[0].name
        x = n.args[0] if n.args else n.kwargs.get(self_name)
        if names != [self_name] or not isinstance(x, torch.fx.Node) or \
                x.op not in ("placeholder", "call_function") or \
                x not in storage or storage.get(n) != storage[x]:
            return None
        head = head_of.setdefault(x, x)
        chain = chains.setdefault(head, [head])
        chain.append(n)
        head_of[n] = head
        variants[n] = _functional_variant(n.target)
        if variants[n] is None and not (len(chain) == 2 and x.op == "call_function" and
                                        x.target is not operator.getitem and
                                        len(x.users) == 1):
            return None
    return chains, variants


def _views_renewed(heads, chains, aliases, position):
    """The views to make anew of one tensor written in place (`heads` holds
    it alone): its `aliases` made after its last write. None where another
    alias is read at or after its first write (a view made before it, or a
    base of the tensor), or is a placeholder (a buffer's view written)."""
    chain = chains[heads[0]]
    renewed = []
    for n in aliases:
        if n.op != "call_function":
            return None
        if position[n] > position[chain[-1]]:
            renewed.append(n)
        elif any(position[user] >= position[chain[1]] for user in n.users if _may_read(user)):
            return None
    return renewed


def _may_read(user):
    """Whether fx node `user` may read its input's values for the step: not
    a call whose result nothing takes (a view made and left unused)."""
    return bool(user.users) or user.op != "call_function" or writes_self(user)


# Pieces of one tensor that cannot overlap: the outputs of one call of these.
_SPLITS = frozenset({"split", "unsafe_split", "split_with_sizes", "unsafe_split_with_sizes",
                     "chunk", "unsafe_chunk", "unbind"})


def _split_of(n):
    """The call that made `n` as one of its pieces (_SPLITS), or None."""
    if n.op != "call_function" or n.target is not operator.getitem or \
            not isinstance(n.args[0], torch.fx.Node):
        return None
    split = n.args[0]
    return split if split.op == "call_function" and op_name(split.target) in _SPLITS else None


def _pieces_renewed(heads, chains, aliases, position):
    """The views to make anew where several tensors of one storage are
    written in place, or None where that is not simple. Simple, as an LSTM
    cell writes its gates: the tensors are distinct pieces of one split
    (they cannot overlap), perhaps after the split tensor itself was written
    (the first head, the base), and what else of the storage is read once a
    piece is written is a piece's sibling or a view of a piece made after
    its last write (autograd's detach of a saved sigmoid_). Those views are
    made anew, and with a base, the pieces, their siblings and the base's
    other later views too."""
    base = None if _split_of(heads[0]) else chains[heads[0]]
    if any(n.op == "placeholder" for n in aliases + (base or [])):
        return None  # (an input or buffer written: its copy back is functionalize's)
    pieces = heads if base is None else heads[1:]
    split = _split_of(pieces[0])
    if split is None or any(_split_of(p) is not split for p in pieces) or \
            len({p.args[1] for p in pieces}) != len(pieces) or \
            (base is not None and (split.args[0] not in base or
                                   position[base[-1]] > position[split])):
        return None
    first_write = min(position[chains[p][1]] for p in pieces)
    of_piece = {n: p for p in pieces for n in chains[p]}  # and later views of it
    renewed = []
    for n in sorted(aliases, key=position.get) + (base or []):
        viewed = n.args[0] if n.op == "call_function" and n.args else None
        if _split_of(n) is split:
            renewed.append(n)  # a sibling: it cannot overlap a piece
        elif viewed in of_piece and position[n] > position[chains[of_piece[viewed]][-1]]:
            of_piece[n] = of_piece[viewed]
            renewed.append(n)
        elif base is not None and n not in base and position[n] < position[base[-1]]:
            return None  # made before the base's last write: _views_renewed's rule
        elif any(position[user] >= first_write for user in n.users
                 if user not in (base or []) and _may_read(user)):
            return None  # read after a piece is written
        elif n.op == "call_function" and n not in (base or []):
            renewed.append(n)
    if base is None:
        return [n for n in renewed if n in of_piece]
    return renewed + list(pieces)


def _write_functionally(graph, nodes, values, chains, variants, later_views):
    """Replaces the in-place calls of `chains` (_simple_writes) by their
    functional `variants` in `graph`, and `values` with it: later readers
    read the variant's result, later views are made anew from it, and a
    buffer written in place gets a final copy_ of its new value."""
    fake_mode = next(v.fake_mode for v in values.values() if isinstance(v, FakeTensor))

    holder = {head: head for head in chains}  # the tensor's value now
    same = {n: head for head, chain in chains.items() for n in chain}

    def now(a):
        return holder[same[a]] if a in same else a

    renew = set(later_views)
    for view in later_views:  # a getitem's values come from its call
        if view.op == "call_function" and view.target is operator.getitem:
            renew.add(view.args[0])
    for n in nodes:
        if n.op not in ("call_function", "output"):
            continue
        n.args = torch.fx.node.map_arg(n.args, now)
        n.kwargs = torch.fx.node.map_arg(n.kwargs, now)
        if n in variants:
            key = same[n]
            if variants[n] is None:
                holder[key] = n
                continue
            with graph.inserting_before(n):
                made = graph.call_function(variants[n], n.args, n.kwargs)
            values[made] = _fake_call(made, values, fake_mode)
            holder[key] = made
        elif n in renew:
            if n.op == "call_function" and n.target is operator.getitem:
                values[n] = values[n.args[0]][n.args[1]]
            else:
                values[n] = _fake_call(n, values, fake_mode)
    output = next(n for n in reversed(nodes) if n.op == "output")
    for head, chain in chains.items():
        if head.op == "placeholder":
            with graph.inserting_before(output):
                back = graph.call_function(torch.ops.aten.copy_.default,
                                           (head, holder[head]))
            values[back] = values[chain[0]]
    for n in reversed(nodes):
        if n in variants and variants[n] is not None:
            graph.erase_node(n)
            del values[n]


# Note [Shapes that follow values]. Some operators make an output whose
# shape follows from their input's values (_VALUE_SHAPED, an index by a
# boolean mask). A trace on real tensors records the captured batch's shape,
# and the executor checks it at each call (CapturedValueMismatch). Such an
# error at a later batch, or a count of such an output read in Python, names
# the user's line that made the call: the first trace records each call's
# Python stack (make_fx_with_stacks), and the innermost frame of the user's
# code in it is kept as the call's meta["user_line"]. The ATen name alone
# ("aten.index.Tensor") tells a user little of `x[mask]`.
_VALUE_SHAPED = frozenset({
    "nonzero", "nonzero_numpy", "argwhere", "masked_select", "unique", "_unique", "_unique2",
    "unique_dim", "unique_consecutive", "unique_dim_consecutive", "repeat_interleave",
    "bincount"})


def _value_shaped(n):
    """Whether call `n` makes an output whose shape its input's values
    decide (_VALUE_SHAPED, or an index by a boolean mask)."""
    name = op_name(n.target)
    if name == "repeat_interleave":  # (a count given as a number: a fixed shape)
        return getattr(n.target, "_overloadname", "") != "self_int"
    if name in _VALUE_SHAPED:
        return True
    if name == "index" and len(n.args) > 1 and isinstance(n.args[1], (list, tuple)):
        for index in n.args[1]:
            value = index.meta.get("val", index.meta.get("tensor_meta")) \
                if isinstance(index, torch.fx.Node) else None
            if getattr(value, "dtype", None) in (torch.bool, torch.uint8):
                return True
    return False


def _remove_unused_calls(gm):
    """Drops calls whose value nothing reads, but for those that write into
    an argument (a write-back into a buffer such as num_batches_tracked's
    copy_): FX's own dead-code pass would drop those too; and for those with
    another effect, a draw or a batch norm's running statistics (Note [Calls
    kept for their effects] in _graph.py). A call of a
    value-shaped output that nothing reads was traced for its size alone
    (`len(x.nonzero())`, `mask.nonzero().numel()` as a count): a CaptureError,
    as the captured batch's count would be replayed at every step, where no
    check could see it change."""
    from ._graph import has_effects  # (_graph imports this module)

    changed = True
    while changed:
        changed = False
        for n in reversed(list(gm.graph.nodes)):
            if n.op != "call_function" or n.users:
                continue
            if _value_shaped(n):
                raise CaptureError(
                    f"the step reads the size of {op_name(n.target)}'s output in Python "
                    "(a count such as len(mask.nonzero()) or x[mask].numel()) and uses no "
                    f"value of it{n.meta.get('user_line', '')}: the plan would replay the captured batch's count at every step. "
                    "Count with tensor operations (mask.sum(), clamped with .clamp(min=1) "
                    "where it divides), which the plan computes at each step")
            schema = getattr(n.target, "_schema", None)
            writes = schema is not None and any(
                a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
            if not writes and not has_effects(n):
                gm.graph.erase_node(n)
                changed = True
    recompile(gm)


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


def propagate(traced, device, fake=True):
    """fx node -> its value: fake tensors where PyTorch can (nothing is
    computed), else real ones (a shape that depends on the data). Returns
    (values, "fake" or "real"). The trace's own values where it recorded
    them all (Traced.values), else a run of the graph; fake=False: a run on
    real tensors."""
    if fake and traced.values is not None:
        return traced.values, "fake"
    if traced.fake_mode is not None:  # Note [Stand-ins for sharded parameters]
        recorder = _Recorder(traced.gm, traced.fake_mode.from_tensor)
        with traced.fake_mode, torch.no_grad():
            recorder.run(*traced.example)
        return recorder.values, "fake"
    if fake:
        try:
            mode = FakeTensorMode()
            fake_example = [mode.from_tensor(t) for t in traced.example]
            recorder = _Recorder(traced.gm, mode.from_tensor)
            with mode, torch.no_grad():
                recorder.run(*fake_example)
            return recorder.values, "fake"
        except Exception:  # noqa: BLE001 (fake tensors cannot follow this graph: run it)
            pass
    recorder = _Recorder(traced.gm)
    example = [t.detach().clone() if s.kind == "buffer" else t
               for s, t in zip(traced.slots, traced.example)]
    with _rng_kept(device), torch.no_grad():
        recorder.run(*example)
    return recorder.values, "real"
