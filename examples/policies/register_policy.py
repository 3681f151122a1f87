#!/usr/bin/env python3
"""A policy written in Python, registered with pebble and compared with the
built-in ones under pebble's simulator.

    PYTHONPATH=build/python python3 examples/policies/register_policy.py

(after `cmake --install`, PYTHONPATH is the prefix's site-packages).
"""

import json
import os
import sys

import pebble

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import greedy_order  # noqa: E402  (the policy, shared with the exec: example)


def greedy(graph, options):
    # pebble hands over a pebble.Graph and the options as a dict
    # (budget_bytes, min_budget, host_budget_bytes, ...); the policy works
    # on the graph's JSON.
    return greedy_order.schedule(json.loads(graph.to_json()), options)


pebble.register_policy("greedy-py", greedy, description="memory-greedy order (Python)",
                       kind="one-shot")

graph = pebble.model(sys.argv[1] if len(sys.argv) > 1 else "resnet18:batch=4,image=64")
print(f"{'policy':<12} {'budget':>6} {'fits':>5} {'peak MiB':>9} {'overhead':>9}")
for row in pebble.compare(graph, policies=["baseline", "best-order", "greedy-py", "rotor"],
                          budgets=["100%", "min"]):
    if "error" in row:
        print(f"{row['policy']:<12} {row['budget']:>6} error: {row['error']}")
        continue
    r = row["report"]
    print(f"{row['policy']:<12} {row['budget']:>6} {str(row['feasible']):>5} "
          f"{r['peak_bytes'] / 2**20:>9.2f} {round(100 * r['overhead'], 1) + 0.0:>8.1f}%")
