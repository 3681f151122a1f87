#!/usr/bin/env python3
"""A `plan --json` document without what changes from run to run.

    normalize_plan_json.py [KEY...] < JSON

Prints the document read on stdin, keys sorted, without plan_time_s and
without the top-level KEYs named: two plans of one graph compare equal as
text. Shared by the install tests (tests/consumer/check.sh, tests/pip/check.sh).
"""

import json
import sys

doc = json.load(sys.stdin)
for key in ["plan_time_s"] + sys.argv[1:]:
    doc.pop(key, None)
print(json.dumps(doc, sort_keys=True))
