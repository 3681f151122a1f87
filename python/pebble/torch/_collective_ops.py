"""The average over the ranks, marked in a captured step.

A step that clips its gradients on several ranks (Note [Clipping the
averaged gradients] in _capture.py) clips their average: in the trace,
`mean_over_ranks(gradient, ranks, index)` stands for the average of the
`index`-th gradient. The captured graph keeps no node of it: the gradient
it reads becomes `unclipped_grad:<parameter>`, which the plan averages in
place with an all_reduce step (in a bucket or alone) before the clipping
reads it, as for the command line's clipped steps. Its kernel (run by a
trace on real tensors only) gives the rank's own part, the gradient over
`ranks`.
"""

import torch

# The op of a collective node that sums over the ranks (docs/semantics.md).
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


def _kernel(gradient, ranks, index):
    out = torch.empty(gradient.shape, dtype=gradient.dtype, device=gradient.device)
    return torch.div(gradient, divisor(ranks, gradient.dtype), out=out)


def _meta(gradient, ranks, index):
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
    library.define(f"{MEAN_OVER_RANKS}(Tensor gradient, int ranks, int index) -> Tensor")
    for key in ("CPU", "CUDA"):
        library.impl(MEAN_OVER_RANKS, _kernel, key)
    library.impl(MEAN_OVER_RANKS, _meta, "Meta")
    namespace._pebble_library = library


_define()


def mean_over_ranks(gradient, ranks, index):
    """The average over `ranks` ranks of the step's `index`-th gradient (in
    the order of Traced.grad_slots), as the traced step sees it."""
    return torch.ops.pebble.mean_over_ranks(gradient, ranks, index)


def is_mean_over_ranks(target):
    """Whether an fx call's target is mean_over_ranks."""
    return target is torch.ops.pebble.mean_over_ranks.default
