"""Collectives traced into a captured step.

A step that clips its gradients on several ranks (Note [Clipping the
averaged gradients]) needs the gradients' average before their norm, inside
the traced graph: `mean_over_ranks(gradient, ranks)` stands for it there.
Its kernel does the local part only, a new contiguous tensor of the gradient
over `ranks` (divided first, as DistributedDataParallel divides); the
executor then sums that tensor over the ranks in place, asynchronously, and
waits before a reader (_executor.py, _RunState.compute). The graph marks the
node as a collective (op "all_reduce", timed on the network link), so the
plan's memory and time are the step's.
"""

import torch

# The operator's name in the graph and in the plan (docs/semantics.md:
# a collective node of op all_reduce).
ALL_REDUCE_OP = "all_reduce"
MEAN_OVER_RANKS = "mean_over_ranks"


# (ranks, dtype) -> a held 0-dim CPU tensor of `ranks`: a Python number
# would make a tensor of itself at each division, and a divisor of another
# dtype a cast, which the allocator counts (Note [Scalars without
# allocations] in _optimizer.py).
_DIVISORS = {}


def hold_divisors(ranks, dtypes):
    """Makes the divisors of `ranks` for gradients of `dtypes` before a step
    is traced and measured."""
    for dtype in dtypes:
        if (ranks, dtype) not in _DIVISORS:  # (setdefault would make one at every call)
            _DIVISORS[(ranks, dtype)] = torch.full((), float(ranks), dtype=dtype)


def divisor(ranks, dtype):
    """The held divisor of `ranks` for a gradient of `dtype` (made here where
    hold_divisors did not make it)."""
    hold_divisors(ranks, [dtype])
    return _DIVISORS[(ranks, dtype)]


def _kernel(gradient, ranks):
    out = torch.empty(gradient.shape, dtype=gradient.dtype, device=gradient.device)
    return torch.div(gradient, divisor(ranks, gradient.dtype), out=out)


def _meta(gradient, ranks):
    return torch.empty(gradient.shape, dtype=gradient.dtype, device="meta")


def _define():
    """Defines pebble::mean_over_ranks once per process. A library is global
    to PyTorch's dispatcher, and dropping the Library object undefines its
    operators: it is kept on torch.ops' namespace, which lives as long as
    the process, so that a module imported again finds the operator."""
    namespace = torch.ops.pebble
    if hasattr(namespace, MEAN_OVER_RANKS):
        return
    library = torch.library.Library("pebble", "DEF")
    library.define(f"{MEAN_OVER_RANKS}(Tensor gradient, int ranks) -> Tensor")
    for key in ("CPU", "CUDA"):
        library.impl(MEAN_OVER_RANKS, _kernel, key)
    library.impl(MEAN_OVER_RANKS, _meta, "Meta")
    namespace._pebble_library = library


_define()


def mean_over_ranks(gradient, ranks):
    """The gradient's average over `ranks` ranks, as the traced step sees it."""
    return torch.ops.pebble.mean_over_ranks(gradient, ranks)


def is_mean_over_ranks(target):
    """Whether an fx call's target is mean_over_ranks."""
    return target is torch.ops.pebble.mean_over_ranks.default
