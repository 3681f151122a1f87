"""Peak tensor memory of any PyTorch code, on the CPU as on a GPU.

`TensorMemory` counts the storages that PyTorch's operators return while it
is active (forward, loss and backward alike: a dispatch mode sees every
ATen call, autograd's included), each storage once however many views share
it, until the last tensor using it is gone. Its peak plus the bytes of the
tensors that existed before (parameters, the batch) is what the step held:
the rule pebble's executors measure by, so eager PyTorch, checkpointing and a
pebble plan compare on equal terms where torch.cuda.max_memory_allocated is
not available. Caching allocators and kernel scratch outside tensors are not
seen.
"""

import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def storage_of(t):
    """The tensor's storage (its untyped storage where PyTorch has that)."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


class TensorMemory(TorchDispatchMode):
    """with TensorMemory() as m: ...; m.peak_bytes: the largest sum of the
    bytes of live storages that operators created inside the block."""

    def __init__(self, existing=()):
        """`existing`: tensors made before (parameters, the batch); views of
        them and in-place results on them add no bytes."""
        super().__init__()
        self._storages = {}  # data pointer -> [tensors referring to it, bytes]
        self._existing = {storage_of(t).data_ptr() for t in existing
                          if isinstance(t, torch.Tensor)}
        self.live_bytes = 0
        self.peak_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._hold(t)
        return out

    def _hold(self, t):
        storage = storage_of(t)
        key = storage.data_ptr()
        if key == 0 or key in self._existing:
            return
        entry = self._storages.get(key)
        if entry is None:
            entry = self._storages[key] = [0, storage.nbytes()]
            self.live_bytes += entry[1]
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        entry[0] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key):
        entry = self._storages.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live_bytes -= entry[1]
            del self._storages[key]


def tensor_bytes(tensors):
    """The bytes of distinct storages among `tensors` (parameters, a batch)."""
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = storage_of(t)
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def measure(fn, held, uncounted=()):
    """Runs fn(); returns (its result, peak bytes, seconds).

    The peak is the bytes of `held` (parameters, buffers, the batch: resident
    throughout) plus what the call added at most: on a GPU (`held` on CUDA)
    torch.cuda.max_memory_allocated over the call less what was allocated
    when it began (so other tensors on the device do not count); elsewhere
    the TensorMemory peak of the call. `uncounted`: tensors that exist but
    are not device memory (a plan's host copies)."""
    held = [t for t in held if isinstance(t, torch.Tensor)]
    device = held[0].device if held else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        at_start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        result = fn()
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        added = torch.cuda.max_memory_allocated(device) - at_start
        return result, tensor_bytes(held) + added, seconds
    with TensorMemory(held + list(uncounted)) as memory:
        start = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - start
    return result, tensor_bytes(held) + memory.peak_bytes, seconds
