"""An exec: policy for tests/ranks/check.sh that plans differently on each
call: the first call takes pebble's baseline plan, the second rotor's, and
so on, each after a wait. Ranks that each planned with it would run
different schedules; under `pebble run --ranks` rank 0 alone calls it.
    one_plan_policy.py PEBBLE CALLS_DIR WAIT_S
Each call leaves a file in CALLS_DIR (call-0, call-1, ...)."""
import json
import os
import subprocess
import sys
import tempfile
import time

pebble, calls, wait_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
doc = json.load(sys.stdin)
number = 0
while True:  # O_EXCL numbers calls that run at once apart
    try:
        os.close(os.open(os.path.join(calls, f"call-{number}"), os.O_CREAT | os.O_EXCL))
        break
    except FileExistsError:
        number += 1
time.sleep(wait_s)
with tempfile.TemporaryDirectory() as tmp:
    graph, schedule = os.path.join(tmp, "graph.json"), os.path.join(tmp, "schedule.json")
    with open(graph, "w") as f:
        json.dump(doc["graph"], f)
    subprocess.run([pebble, "plan", "--graph", graph, "--policy",
                    ("baseline", "rotor")[number % 2], "--budget", "min",
                    "--schedule-out", schedule], check=True, stdout=subprocess.DEVNULL)
    with open(schedule) as f:
        sys.stdout.write(f.read())
