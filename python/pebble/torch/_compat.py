"""What differs between PyTorch 1.13 (functorch) and 2.x (torch.func).

Every other file of pebble.torch imports these names from here, so that one
place knows where each lives.
"""

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
           "functional_call", "functionalize", "make_fx", "storage_bytes", "storage_key",
           "traced_node"]


def autocast_state(device_type):
    """(enabled, dtype) of torch.autocast for `device_type` ("cpu" or
    "cuda") where the caller is: a trace under autocast records its casts."""
    if hasattr(torch, "get_autocast_dtype"):  # PyTorch 2.4 and later
        return (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
    if device_type == "cpu":
        return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()


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
