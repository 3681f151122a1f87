"""pebble: plans how a training step uses memory, and proves it.

The functions come from the compiled module pebble._core; docs/library.md
documents them. In short:

    import pebble
    g = pebble.model("resnet18:batch=8,image=128")
    p = pebble.plan(g, policy="rotor", budget="60%")
    p.feasible, p.report["peak_bytes"], p.schedule[:3]
    pebble.compare(g, policies=["baseline", "rotor"], budgets=["100%", "min"])

Bad input and bad arguments raise ValueError, with the command line's
message where it has one; docs/library.md ("Errors") has the rules.
"""

import copyreg as _copyreg

from ._core import (  # noqa: F401
    DEFAULT_HOST_BYTES_PER_S,
    Graph,
    Plan,
    collective_seconds,
    compare,
    fit,
    from_json,
    import_onnx,
    load,
    model,
    plan,
    policies,
    register_policy,
    shard,
    simulate,
    train,
    unregister_policy,
    with_optimizer,
)


def _graph_from_json(text):
    """Unpickles a Graph (copy, deepcopy and pickle go through its JSON text)."""
    return from_json(text)


_copyreg.pickle(Graph, lambda graph: (_graph_from_json, (graph.to_json(),)))

__all__ = [
    "DEFAULT_HOST_BYTES_PER_S", "Graph", "Plan", "collective_seconds", "compare", "fit", "from_json", "import_onnx",
    "load", "model", "plan", "policies", "register_policy", "shard", "simulate", "train",
    "unregister_policy", "with_optimizer",
]
