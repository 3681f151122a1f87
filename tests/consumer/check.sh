#!/usr/bin/env bash
# Installs a pebble build into a fresh prefix, then uses it from outside as a
# user would: a CMake project (find_package), a pkg-config compile of the
# same program, and the installed Python module. Each must give the document
# of `pebble plan --json` on the same model, policy and budget.
#   check.sh BUILD_DIR WORK_DIR PYTHON
set -euo pipefail
build=$(cd "$1" && pwd)
work=$2
python=$3
here=$(cd "$(dirname "$0")" && pwd)
model="linear:n=20" policy=rotor budget=60%  # a plan that fits: it recomputes

rm -rf "$work"
mkdir -p "$work"
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for must in bin/pebble include/pebble/pebble.h include/pebble/config.h \
            include/pebble/graph/graph.h lib/cmake/pebble/pebbleConfig.cmake \
            lib/pkgconfig/pebble.pc; do
  [[ -e "$prefix/$must" ]] || { echo "FAIL: $must is not installed" >&2; exit 1; }
done
# With the CUDA backend, the binary's plugin is installed where it looks
# (docs/cuda.md): --backend cuda loads it, and without a GPU the backend
# itself answers "no CUDA device".
reldir=$(sed -n 's/^PEBBLE_CUDA_PLUGIN_RELDIR:INTERNAL=//p' "$build/CMakeCache.txt")
if [[ -n "$reldir" ]]; then
  [[ -e "$prefix/bin/$reldir/libpebble_cuda.so" ]] ||
    { echo "FAIL: bin/$reldir/libpebble_cuda.so is not installed" >&2; exit 1; }
  if ! cuda_err=$("$prefix/bin/pebble" run --model "$model" --policy "$policy" \
                  --budget "$budget" --backend cuda --json 2>&1 >/dev/null); then
    if [[ "$cuda_err" != *"no CUDA device"* ]]; then
      echo "FAIL: the installed pebble's --backend cuda: $cuda_err" >&2
      exit 1
    fi
  fi
  echo "ok: the installed pebble loads its CUDA backend"
fi
if [[ -e "$prefix/include/pebble/graph/models/zoo_internal.h" ]]; then
  echo "FAIL: an internal header was installed" >&2
  exit 1
fi

# A `plan --json` document without plan_time_s and the KEYs named:
# normalize [KEY...] < JSON (tests/normalize_plan_json.py).
normalize() {
  "$python" "$here/../normalize_plan_json.py" "$@"
}
cli_document=$("$prefix/bin/pebble" plan --model "$model" --policy "$policy" \
               --budget "$budget" --json)
same() {  # same WHAT JSON [KEY...]: JSON is the CLI's document, the KEYs aside
  local got expected
  got=$(printf '%s' "$2" | normalize "${@:3}")
  expected=$(printf '%s' "$cli_document" | normalize "${@:3}")
  if [[ "$got" != "$expected" ]]; then
    echo "FAIL: $1 disagrees with pebble plan --json" >&2
    echo "  got      $got" >&2
    echo "  expected $expected" >&2
    exit 1
  fi
  echo "ok: $1 gives the CLI's document"
}

# CMake: find_package(pebble) and pebble::pebble, nothing else.
cmake -S "$here" -B "$work/cmake-build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
      >"$work/cmake.log"
cmake --build "$work/cmake-build" >"$work/cmake-build.log"
same "find_package(pebble)" "$("$work/cmake-build/consumer" "$model" "$policy" "$budget")"

# The whole step from C++ (graph/optimizer.h, scheduler/collectives.h): Adam's
# updates, sharded over 2 ranks.
step_model="mnist-cnn:batch=2"
step_document=$("$prefix/bin/pebble" plan --model "$step_model" --optimizer adam --shard full \
                --ranks 2 --policy "$policy" --budget min --json)
[[ "$step_document" == *'"gather:conv1.weight"'* ]] ||
  { echo "FAIL: pebble plan --shard full gave no gather: $step_document" >&2; exit 1; }
single_document=$cli_document
cli_document=$step_document
same "find_package(pebble), a sharded Adam step" \
     "$("$work/cmake-build/consumer" "$step_model" "$policy" min adam 2)"
cli_document=$single_document

# pkg-config. A CUDA toolkit's own .pc files (cudart-X.Y.pc), where pebble.pc
# requires them, are where its variable cuda_pcdir says.
pc="$prefix/lib/pkgconfig/pebble.pc"
cuda_pcdir=$(sed -n 's/^cuda_pcdir=//p' "$pc")
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${cuda_pcdir:+:$cuda_pcdir}"
if grep -E '^Libs:.*\.(so|a)( |$)' "$pc" >/dev/null; then
  echo "FAIL: pebble.pc links library files by path: $(grep '^Libs:' "$pc")" >&2
  exit 1
fi
c++ "$here/main.cc" -o "$work/consumer-pc" $(pkg-config --cflags --libs pebble)
same "pkg-config pebble" "$("$work/consumer-pc" "$model" "$policy" "$budget")"

# Python, from the prefix's site-packages.
site=$(find "$prefix/lib" -maxdepth 3 -type d -name site-packages | head -n 1)
if [[ -n "$site" ]]; then
  # The module names the graph by its name, not by the model spec.
  got=$(PYTHONPATH="$site" "$python" -c "
import json, pebble
p = pebble.plan(pebble.model('$model'), policy='$policy', budget='$budget')
assert p.report == p.document['report'] and p.feasible == p.document['feasible']
print(json.dumps(p.document))")
  same "the installed Python module" "$got" graph
  # pebble.torch is installed beside it (where PyTorch is there to import it).
  if PYTHONPATH="$site" "$python" -c "import torch" 2>/dev/null; then
    PYTHONPATH="$site" "$python" -c "import pebble.torch as pt; assert callable(pt.train_step)" ||
      { echo "FAIL: the installed pebble.torch does not import" >&2; exit 1; }
    echo "ok: the installed pebble.torch imports"
  fi
fi
