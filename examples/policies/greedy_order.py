#!/usr/bin/env python3
"""A memory-greedy one-shot policy written outside pebble, in two roles.

As a stand-alone program (`pebble compare --policy exec:...`) it reads the
policy input document on stdin and writes a pebble-schedule document on
stdout:

    pebble plan --model resnet18:batch=8 \
        --policy "exec:python3 examples/policies/greedy_order.py"

As a module, `schedule(graph, options)` is the same policy for
pebble.register_policy (see register_policy.py beside this file).

The policy: compute the non-persistent ancestors of the outputs in a
topological order that, at each step, takes the ready node whose
computation frees the most bytes net of its own output (ties: the graph's
order), freeing each tensor right after its last reader. It ignores the
budget: pebble's simulator measures the peak and says whether it fits.
"""

import json
import sys


def schedule(graph, options=None):
    """The steps, as (action, node) pairs, for a pebble-graph dict."""
    nodes = {n["id"]: n for n in graph["nodes"]}
    position = {n["id"]: i for i, n in enumerate(graph["nodes"])}
    outputs = set(graph["outputs"])

    def inputs(node_id):
        return set(nodes[node_id].get("inputs", []))

    # The tensors to compute: non-persistent ancestors of the outputs.
    needed, stack = set(), [o for o in outputs if not nodes[o].get("persistent")]
    while stack:
        node_id = stack.pop()
        if node_id in needed:
            continue
        needed.add(node_id)
        stack.extend(i for i in inputs(node_id) if not nodes[i].get("persistent"))

    readers = {n: set() for n in needed}
    for n in needed:
        for i in inputs(n) & needed:
            readers[i].add(n)
    unread = {n: len(readers[n]) for n in needed}
    missing = {n: len(inputs(n) & needed) for n in needed}
    ready = {n for n in needed if missing[n] == 0}

    def freed_by(n):
        return sum(nodes[i]["bytes"] for i in inputs(n) & needed
                   if unread[i] == 1 and i not in outputs)

    steps = []
    while ready:
        best = max(ready, key=lambda n: (freed_by(n) - nodes[n]["bytes"], -position[n]))
        ready.remove(best)
        steps.append(("compute", best))
        for i in sorted(inputs(best) & needed, key=position.get):
            unread[i] -= 1
            if unread[i] == 0 and i not in outputs:
                steps.append(("free", i))
        for r in readers[best]:
            missing[r] -= 1
            if missing[r] == 0:
                ready.add(r)
    return steps


def main():
    request = json.load(sys.stdin)
    steps = schedule(request["graph"], request["options"])
    json.dump({"format": "pebble-schedule", "version": 1,
               "steps": [{"action": a, "node": n} for a, n in steps]}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
