#!/usr/bin/env bash
# `pip install` of the source tree into a fresh virtual environment, then
# pebble used from outside the tree as a user would: the module, pebble.torch
# and the `pebble` command, whose plans must be the build's own CLI's. The
# install reuses BUILD_DIR (setup.py's PEBBLE_BUILD_DIR): when it is up to
# date nothing is compiled, but its build tool runs, so this must not run
# while something else builds BUILD_DIR. Nothing is downloaded (--no-index).
#   check.sh SOURCE_DIR BUILD_DIR WORK_DIR PYTHON
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
work=$3
python=$4
here=$(cd "$(dirname "$0")" && pwd)
model="linear:n=20" policy=rotor budget=60%  # a plan that fits: it recomputes
# Only the venv may supply `pebble`, not a build tree on PYTHONPATH.
unset PYTHONPATH

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
venv="$work/venv"
# Debian's PyTorch, and the setuptools and wheel the build uses, come from
# the system's site-packages.
"$python" -m venv --system-site-packages "$venv" ||
  fail "$python -m venv failed (Debian: python3-venv)"

untracked() { git -C "$src" ls-files --others --exclude-standard 2>/dev/null | sort; }
untracked_before=$(untracked)
if ! PEBBLE_BUILD_DIR="$build" "$venv/bin/python" -m pip install --no-build-isolation \
       --no-index --disable-pip-version-check "$src" >"$work/pip.log" 2>&1; then
  cat "$work/pip.log" >&2
  fail "pip install $src failed"
fi
untracked_after=$(untracked)
if [[ "$untracked_before" != "$untracked_after" ]]; then
  fail "pip install left files in the source tree that git does not ignore:" \
       "$(comm -13 <(echo "$untracked_before") <(echo "$untracked_after"))"
fi
echo "ok: pip install $src (log: $work/pip.log)"

cd "$work"  # away from the source tree, whose python/ holds a `pebble` too
# A `plan --json` document without plan_time_s and the KEYs named:
# normalize [KEY...] < JSON (tests/normalize_plan_json.py).
normalize() {
  "$python" "$here/../normalize_plan_json.py" "$@"
}
expected=$("$build/bin/pebble" plan --model "$model" --policy "$policy" --budget "$budget" --json)
same() {  # same WHAT JSON [KEY...]: JSON is the build's CLI document, the KEYs aside
  if [[ "$(normalize "${@:3}" <<<"$2")" != "$(normalize "${@:3}" <<<"$expected")" ]]; then
    fail "$1 disagrees with $build/bin/pebble plan --json" \
         "(got $(normalize <<<"$2" | head -c 300)...)"
  fi
  echo "ok: $1 gives the build's plan"
}

# The module, from the venv: a plan through the Python API.
document=$("$venv/bin/python" - "$venv" "$model" "$policy" "$budget" <<'EOF'
import json, os, sys
venv, model, policy, budget = sys.argv[1:]
import pebble
where = os.path.realpath(pebble.__file__)
if not where.startswith(os.path.realpath(venv) + os.sep):
    sys.exit(f"pebble was imported from {where}, not from the venv")
p = pebble.plan(pebble.model(model), policy=policy, budget=budget)
assert p.feasible == p.document["feasible"] and p.report == p.document["report"]
print(json.dumps(p.document))
EOF
) || fail "the installed module"
same "the installed module" "$document" graph  # the module labels the graph by its name

# pebble.torch, where PyTorch is there: one planned training step.
if "$venv/bin/python" -c "import torch" 2>/dev/null; then
  "$venv/bin/python" - <<'EOF' || fail "the installed pebble.torch"
import torch
import pebble.torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
x, target = torch.randn(3, 8), torch.randn(3, 4)
step = pebble.torch.train_step(model, torch.nn.functional.mse_loss, x, target,
                               policy="rotor", budget="min", calibrate=False)
loss = step(x, target)
expected = torch.nn.functional.mse_loss(model(x), target)
assert torch.allclose(loss, expected.detach()), (loss, expected)
EOF
  echo "ok: the installed pebble.torch runs a planned step"
else
  echo "skipped: pebble.torch (no PyTorch for $python)"
fi

# The `pebble` command: the venv's console script, on PATH as after
# `source venv/bin/activate`.
version=$("$venv/bin/python" -c \
  'import importlib.metadata as m; print(m.version("pebble-memplan"))')
[[ "$(PATH="$venv/bin:$PATH" pebble --version)" == "pebble $version" ]] ||
  fail "pebble --version says '$(PATH="$venv/bin:$PATH" pebble --version)', the wheel is $version"
echo "ok: pebble --version is the wheel's $version"
same "the installed pebble command" "$(PATH="$venv/bin:$PATH" pebble plan --model "$model" \
  --policy "$policy" --budget "$budget" --json)"
# Its errors, exit status and stderr are the binary's.
bad=(plan --model "$model" --budget nonsense)
status=0 expected_status=0
PATH="$venv/bin:$PATH" pebble "${bad[@]}" 2>"$work/error.txt" || status=$?
"$build/bin/pebble" "${bad[@]}" 2>"$work/expected-error.txt" || expected_status=$?
if [[ $status -eq 0 || $status -ne $expected_status ]] ||
   ! cmp -s "$work/error.txt" "$work/expected-error.txt"; then
  fail "pebble ${bad[*]}: exit $status, stderr '$(cat "$work/error.txt")';" \
       "the binary: exit $expected_status, '$(cat "$work/expected-error.txt")'"
fi
echo "ok: the installed pebble command fails as the binary does (exit $status)"
# Where the build has the CUDA backend, the wheel carries the binary's plugin
# beside it (docs/cuda.md): --backend cuda loads it, and without a GPU the
# backend itself answers "no CUDA device".
if grep -q '^PEBBLE_CUDA_PLUGIN_RELDIR:INTERNAL=' "$build/CMakeCache.txt"; then
  if ! cuda_err=$(PATH="$venv/bin:$PATH" pebble run --model "$model" --policy "$policy" \
                  --budget "$budget" --backend cuda --json 2>&1 >/dev/null) &&
     [[ "$cuda_err" != *"no CUDA device"* ]]; then
    fail "the installed pebble's --backend cuda: $cuda_err"
  fi
  echo "ok: the installed pebble command loads its CUDA backend"
fi
