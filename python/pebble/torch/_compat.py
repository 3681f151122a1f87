"""What differs between PyTorch 1.13 (functorch) and 2.x (torch.func).

Every other file of pebble.torch imports these names from here, so that one
place knows where each lives.
"""

import contextlib
import gc
import inspect
import linecache
import re
import weakref

import torch

try:  # PyTorch 2.x
    from torch.func import functional_call, functionalize
except ImportError:  # 1.13: functorch beside torch
    from functorch import functionalize
    from torch.nn.utils.stateless import functional_call

try:
    from torch.fx.experimental.proxy_tensor import make_fx
except ImportError:  # pragma: no cover (1.13 has it there too)
    from functorch import make_fx

from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

__all__ = ["FakeTensor", "FakeTensorMode", "autocast_state", "forget_traces", "free_storage",
           "functional_call", "functionalize", "make_fx", "make_fx_with_stacks",
           "storage_bytes", "storage_key", "traced_frames", "traced_node"]


def autocast_state(device_type):
    """(enabled, dtype) of torch.autocast for `device_type` ("cpu" or
    "cuda") where the caller is: a trace under autocast records its casts."""
    if hasattr(torch, "get_autocast_dtype"):  # PyTorch 2.4 and later
        return (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
    if device_type == "cpu":
        return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()


def make_fx_with_stacks(fn, tracing_mode):
    """make_fx(fn, tracing_mode=...), its tracer keeping the Python stack of
    each call it records (the node's stack_trace): through make_fx's
    record_stack_traces where this PyTorch has it (there, of the frames of
    forward methods alone), else through FX's tracer attribute, set on
    make_fx's tracer class while it traces and put back after."""
    if "record_stack_traces" in inspect.signature(make_fx).parameters:
        return make_fx(fn, tracing_mode=tracing_mode, record_stack_traces=True)
    traced = make_fx(fn, tracing_mode=tracing_mode)

    def call(*args):
        with _tracer_class_records_stacks():
            return traced(*args)
    return call


@contextlib.contextmanager
def _tracer_class_records_stacks():
    try:
        from torch.fx.experimental.proxy_tensor import PythonKeyTracer
    except ImportError:  # pragma: no cover
        yield
        return
    had = "record_stack_traces" in PythonKeyTracer.__dict__
    before = PythonKeyTracer.__dict__.get("record_stack_traces")
    PythonKeyTracer.record_stack_traces = True
    try:
        yield
    finally:
        if had:
            PythonKeyTracer.record_stack_traces = before
        else:
            del PythonKeyTracer.record_stack_traces


_FRAME_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def traced_frames(node):
    """(file, line, function) of each frame node.stack_trace names, in its
    order: innermost first in PyTorch 1.13 (from the call outwards), and
    outermost first in the PyTorch versions that format it as
    traceback.extract_stack does. [] where none was recorded."""
    text = getattr(node, "stack_trace", None) or node.meta.get("stack_trace") or ""
    return [(path, int(line), function) for path, line, function in _FRAME_LINE.findall(text)]


def op_name(target):
    """'convolution' for aten.convolution.default."""
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", getattr(target, "__name__", str(target)))


def _storage(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def storage_bytes(t):
    """Bytes of the storage under `t` (all of it, whatever part `t` views)."""
    return _storage(t).nbytes()


def free_storage(t):
    """Frees the memory under `t` now, on this thread, whoever else still
    refers to the tensor (its storage stays, empty): a collective's worker
    thread that lets go of it later frees nothing that PyTorch's CPU
    profiler would miss."""
    _storage(t).resize_(0)


def storage_key(t):
    """An identity of the storage under `t`, the same for every view of it,
    for real and fake tensors alike (a weak reference's handle)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    ref = StorageWeakRef(_storage(t))
    return getattr(ref, "cdata", None) or getattr(ref, "_cdata")


def storage_alive(t):
    """A callable that says whether the storage under `t` still exists (its
    storage_key is then its own, not a later storage's)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    ref = StorageWeakRef(_storage(t))
    return lambda: not ref.expired()


def traced_node(t):
    """The fx node by which a trace in progress (make_fx) made or took `t`,
    or None where no trace follows it. 1.13 keeps it in the tensor's own
    __dict__ (its proxy slot), 2.x in the tracer of the proxy mode that is
    on."""
    from torch.fx.experimental import proxy_tensor
    slot = getattr(proxy_tensor, "proxy_slot", None)
    found = t.__dict__.get(slot) if slot is not None else None
    for entry in (found or {}).values():
        proxy = getattr(entry, "proxy", None)
        if proxy is not None:
            return proxy.node
    stack = getattr(torch.utils._python_dispatch, "_get_current_dispatch_mode_stack", None)
    for mode in (stack() if stack is not None else ()):
        tracker = getattr(getattr(mode, "tracer", None), "tensor_tracker", None)
        entry = tracker.get(t) if tracker is not None else None
        if entry is not None and getattr(entry, "proxy", None) is not None:
            return entry.proxy.node
    return None


def forget_dead_fake_converters():
    """Detaches the finalizers that dead tensor converters left on real
    tensors. PyTorch's FakeTensorConverter and MetaConverter (1.13's
    set_tensor_memo) register a weakref.finalize on each real tensor they
    convert (the parameters, buffers and constants of a trace), which lives
    as long as that tensor, and so as long as the module: a finalizer, its
    callback and keys for each tensor of each capture ever made, about 120
    objects per capture of a small MLP, grew without end where captures
    were dropped and made again (max_shapes). The callback of a converter
    that has died (its capture dropped) does nothing. Such callbacks are
    found by their name and their weak reference to the converter
    (`self_weak_ref`)."""
    registry = getattr(weakref.finalize, "_registry", None)
    if not isinstance(registry, dict):
        return
    # (a collection while the registry is read may run finalizers, which
    # take themselves out of it: read with the collector off, as
    # weakref.finalize's own exit does)
    collecting = gc.isenabled()
    gc.disable()
    try:
        entries = list(registry.items())
    finally:
        if collecting:
            gc.enable()
    for finalizer, info in entries:
        callback = getattr(info, "func", None)
        if not getattr(callback, "__qualname__", "").endswith("set_tensor_memo.<locals>.del_ten"):
            continue
        names = getattr(getattr(callback, "__code__", None), "co_freevars", ())
        cells = dict(zip(names, callback.__closure__ or ()))
        try:
            converter = cells["self_weak_ref"].cell_contents
        except (KeyError, ValueError):  # (another PyTorch's callback, or an empty cell)
            continue
        if isinstance(converter, weakref.ref) and converter() is None:
            finalizer.detach()


# torch.fx keeps the Python source of every GraphModule's forward it
# compiles, in its loader's cache and in linecache (for tracebacks), for the
# life of the process: a capture's two graphs (the first trace, and the one
# compiled again without its unused calls) left two entries, each holding
# the graph's whole source, at every capture, where max_shapes dropped and
# made captures without end. pebble's graphs give theirs back when they die.
def _fx_source_key(gm):
    """The name under which torch.fx keeps `gm`'s forward's source, or None."""
    name = getattr(getattr(getattr(gm, "forward", None), "__code__", None), "co_filename", "")
    return name if isinstance(name, str) and name.startswith("<eval_with_key>") else None


def _forget_fx_source(key):
    linecache.cache.pop(key, None)
    cache = getattr(getattr(torch.fx.graph_module, "_loader", None), "eval_cache", None)
    if isinstance(cache, dict):
        cache.pop(key, None)


def forget_fx_source_with(gm):
    """Forgets `gm`'s forward's source once `gm` dies."""
    key = _fx_source_key(gm)
    if key is not None:
        weakref.finalize(gm, _forget_fx_source, key)


def recompile(gm):
    """gm.recompile(), its former source forgotten at once and its new one
    once `gm` dies."""
    key = _fx_source_key(gm)
    gm.recompile()
    if key is not None and key != _fx_source_key(gm):
        _forget_fx_source(key)
    forget_fx_source_with(gm)


def forget_traces(tensors):
    """Takes the traces' proxy slots out of `tensors` (1.13 leaves them in
    each traced tensor's __dict__, where copy.deepcopy of the user's own
    tensor then fails; 2.x keeps them in its tracer)."""
    from torch.fx.experimental import proxy_tensor
    slot = getattr(proxy_tensor, "proxy_slot", None)
    if slot is None:
        return
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t.__dict__.pop(slot, None)
