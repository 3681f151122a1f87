"""A user's own code in a module of its own, which a loss or a forward
calls: what it reads is watched like the loss's and the forward's own
globals (step_check.py, check_helpers; Note [What the loss's helpers read]
in pebble/torch/_capture.py)."""

import torch

SCALE = 1.0  # a weight that the training loop anneals between steps
COUNTS = None  # a tensor that counted_cross_entropy writes at each call
SLOPE = 0.1  # a setting of leaky(), changed between steps


def scaled_cross_entropy(out, target):
    return SCALE * torch.nn.functional.cross_entropy(out, target)


def counted_cross_entropy(out, target):
    with torch.no_grad():
        COUNTS.add_(torch.zeros_like(COUNTS).scatter_add_(
            0, target, torch.ones(target.shape, device=target.device)))
    return torch.nn.functional.cross_entropy(out, target, weight=1.0 / (COUNTS + 1.0))


def leaky(x):
    return torch.nn.functional.leaky_relu(x, SLOPE)


_WEIGHTS = torch.ones(1)  # a cache that class_weights grows as it needs


def weighted_cross_entropy(out, target):
    global _WEIGHTS
    n = out.shape[1]
    if _WEIGHTS.shape[0] < n:
        _WEIGHTS = torch.linspace(1.0, 2.0, n, device=out.device)
    return torch.nn.functional.cross_entropy(out, target, weight=_WEIGHTS[:n])


def make_term(weight):
    """A loss term weighted by `weight["value"]`: each term a closure of
    its own over one code."""
    def term(out, target):
        return weight["value"] * torch.nn.functional.cross_entropy(out, target)
    return term
