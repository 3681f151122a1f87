#!/usr/bin/env bash
# `pebble run --ranks` through scripts/pebble-ranks (docs/runtime.md,
# "Several ranks"): N processes of this machine train one step under one
# plan, each on its own batch. Checks: every rank exits 0 with measured peak
# == predicted; every parameter and optimizer state that the update wrote is
# the same, to the bit, on every rank (the all-reduced gradients are); the
# losses differ (each rank's own batch). Sharded (--shard full, 2 ranks):
# each rank's dumped tensors are its shards of the data-parallel run's, to
# the bit. Skipped (77) without gloo.
#   tests/ranks/check.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source_dir="$1"
build_dir="$2"
pebble="$build_dir/bin/pebble"
work="$(mktemp -d "${TMPDIR:-/tmp}/pebble-ranks-check.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

run_ranks() {  # run_ranks N OPTIMIZER POLICY OUT [OPTIONS...]
  local ranks="$1" optimizer="$2" policy="$3" out="$4"
  shift 4
  PEBBLE_BIN="$pebble" "$source_dir/scripts/pebble-ranks" "$ranks" -- run \
    --model mnist-cnn:batch=4 --optimizer "$optimizer" --policy "$policy" --budget min \
    --dump "$out/rank{rank}" "$@" > "$out.log" 2>&1
}

check() {  # check N OPTIMIZER POLICY
  local ranks="$1" optimizer="$2" policy="$3" out="$work/$1-$3"
  echo "== $ranks ranks, $optimizer, $policy"
  if ! run_ranks "$ranks" "$optimizer" "$policy" "$out"; then
    cat "$out.log"
    if grep -q "has no gloo" "$out.log"; then echo "SKIP: no gloo"; exit 77; fi
    fail "$ranks ranks, $policy: a rank failed"
  fi
  [[ "$(grep -c "measured == predicted" "$out.log")" == "$ranks" ]] ||
    { cat "$out.log"; fail "a rank's measured peak differs from the prediction"; }
  local files=0
  for file in "$out"/rank0/*.npy; do
    name="$(basename "$file")"
    for ((r = 1; r < ranks; r++)); do
      if [[ "$name" == loss.npy ]]; then
        cmp -s "$file" "$out/rank$r/$name" && fail "rank $r's loss equals rank 0's: one batch"
      else
        cmp -s "$file" "$out/rank$r/$name" || fail "$name differs between rank 0 and rank $r"
      fi
    done
    files=$((files + 1))
  done
  [[ $files -gt 8 ]] || fail "only $files dumped tensors"
  echo "ok: $files tensors compared"
}

check 2 sgd:lr=0.1,momentum=0.9 rotor
check 3 adam dtr

# Rank 0 alone plans (docs/runtime.md, "Several ranks"): a policy that plans
# differently on each call, and for longer than --rank-timeout, is called once,
# and every rank runs its plan; rank 0's planning error is every rank's.
echo "== 2 ranks, rank 0 plans"
calls="$work/calls"
mkdir "$calls"
PEBBLE_BIN="$pebble" "$source_dir/scripts/pebble-ranks" 2 -- run \
  --model mnist-cnn:batch=4 --optimizer sgd --budget min --rank-timeout 3 \
  --trace "$work/trace{rank}.json" --policy "exec:/usr/bin/python3 $source_dir/tests/ranks/one_plan_policy.py $pebble $calls 4" \
  > "$work/rank0-plans.log" 2>&1 || { cat "$work/rank0-plans.log"; fail "rank 0's plan: a rank failed"; }
[[ "$(ls "$calls" | wc -l)" == 1 ]] ||
  fail "the policy was called $(ls "$calls" | wc -l) times: every rank planned"
[[ "$(grep -c "measured == predicted" "$work/rank0-plans.log")" == 2 ]] ||
  { cat "$work/rank0-plans.log"; fail "rank 0's plan: a rank's measured peak differs"; }
for r in 0 1; do  # each rank's trace names it
  /usr/bin/python3 -c "import json, sys; d = json.load(open(sys.argv[1]))['otherData']; \
assert (d['rank'], d['ranks']) == ($r, 2), d" "$work/trace$r.json" ||
    fail "rank $r's trace does not name its rank"
done
# two_ranks NAME RANK1_OPTIONS OPTIONS...: ranks 0 and 1 of `pebble run
# OPTIONS`, rank 1 with RANK1_OPTIONS (words) too, started here rather than
# through pebble-ranks (which stops the others once one fails), so that each
# rank's own message is kept in $work/NAME/R.log. Both must fail.
two_ranks() {
  local dir="$work/$1" extra="$2"
  shift 2
  mkdir -p "$dir/meet"
  local pids=()
  "$pebble" run "$@" --ranks 2 --rank 0 --rendezvous "$dir/meet" > "$dir/0.log" 2>&1 &
  pids+=($!)
  # shellcheck disable=SC2086 # RANK1_OPTIONS are words
  "$pebble" run "$@" $extra --ranks 2 --rank 1 --rendezvous "$dir/meet" > "$dir/1.log" 2>&1 &
  pids+=($!)
  for r in 0 1; do
    wait "${pids[r]}" && { cat "$dir"/*.log; fail "$(basename "$dir"): rank $r ran"; }
  done
  return 0
}
two_ranks too-small "" --model mnist-cnn:batch=4 --optimizer sgd --policy rotor --budget 10%
grep -q "^pebble: rank 0: the plan does not fit" "$work/too-small/1.log" ||
  { cat "$work/too-small/1.log"; fail "rank 1 did not give rank 0's error"; }
# Whether the plan fits is each rank's verdict (here rank 1's host budget).
two_ranks host-budget "--host-budget 1KiB" --model mnist-cnn:batch=4 --optimizer adam:state=host \
  --policy rotor --budget min
grep -q "^pebble: rank 0's plan does not fit this rank: host peak" "$work/host-budget/1.log" ||
  { cat "$work/host-budget/1.log"; fail "rank 1 ran over its host budget"; }
grep -q "^pebble: rank 1 failed to take rank 0's plan" "$work/host-budget/0.log" ||
  { cat "$work/host-budget/0.log"; fail "rank 0 did not say that rank 1 failed"; }
echo "ok: one plan, made on rank 0 in 4 s, under a 3 s timeout"

# Sharded against the data-parallel run of 2 ranks with the same optimizer.
echo "== 2 ranks sharded, adam, fsdp and dtr"
run_ranks 2 adam baseline "$work/dp" || { cat "$work/dp.log"; fail "the data-parallel run failed"; }
for policy in fsdp dtr; do
  out="$work/sharded-$policy"
  run_ranks 2 adam "$policy" "$out" --shard full ||
    { cat "$out.log"; fail "sharded $policy: a rank failed"; }
  [[ "$(grep -c "measured == predicted" "$out.log")" == 2 ]] ||
    { cat "$out.log"; fail "sharded $policy: a rank's measured peak differs from the prediction"; }
  /usr/bin/python3 - "$work/dp" "$out" <<'PY' || fail "sharded $policy: not the data-parallel run's shards"
import os, sys
import numpy as np
dp, sharded = sys.argv[1:3]
compared = 0
for name in sorted(os.listdir(f"{sharded}/rank0")):
    if name == "loss.npy":
        continue
    whole = np.load(f"{dp}/rank0/{name}").reshape(-1)
    shards = [np.load(f"{sharded}/rank{r}/{name}").reshape(-1) for r in (0, 1)]
    if all(s.size == whole.size for s in shards):  # not sharded: Adam's step count
        if any(s.tobytes() != whole.tobytes() for s in shards):
            sys.exit(f"{name}: not the data-parallel run's")
        continue
    joined = np.concatenate(shards)
    if joined[:whole.size].tobytes() != whole.tobytes() or np.any(joined[whole.size:] != 0):
        sys.exit(f"{name}: the shards are not the data-parallel tensor's")
    compared += 1
if compared < 20:
    sys.exit(f"only {compared} tensors compared")
print(f"ok: {compared} tensors, each the data-parallel run's in two shards")
PY
done
# The launcher gives each rank --ranks, --rank and --rendezvous: given too,
# it refuses at once, saying so (not CLI11's "received 2" from each rank).
if PEBBLE_BIN="$pebble" "$source_dir/scripts/pebble-ranks" 2 -- run --model mnist-cnn:batch=2 \
    --rank 1 > "$work/twice.log" 2>&1 || [[ $? -ne 2 ]] ||
    ! grep -q "gives each rank --rank itself" "$work/twice.log"; then
  cat "$work/twice.log"
  fail "scripts/pebble-ranks given --rank: not refused as its own"
fi
# The link, measured by calibrate on 2 ranks, is what plan then assumes.
echo "== calibrate --ranks 2, then plan --profile"
PEBBLE_BIN="$pebble" "$source_dir/scripts/pebble-ranks" 2 -- calibrate \
  --model mnist-cnn:batch=2 --repeat 1 --transfer-size 1MiB --output "$work/profile.json" \
  > "$work/calibrate.log" 2>&1 || { cat "$work/calibrate.log"; fail "calibrate --ranks failed"; }
"$pebble" plan --model mnist-cnn:batch=2 --ranks 2 --profile "$work/profile.json" \
  --policy rotor --budget min --json > "$work/plan.json" 2> /dev/null
/usr/bin/python3 - "$work/profile.json" "$work/plan.json" <<'PY' || fail "plan did not take the measured link"
import json, sys
profile, plan = (json.load(open(p)) for p in sys.argv[1:3])
link = plan["details"]["collectives"]
assert profile["network_ranks"] == 2 and profile["network_bandwidth_bytes_per_s"] > 0, profile
assert link["network_bandwidth_bytes_per_s"] == profile["network_bandwidth_bytes_per_s"], link
assert link["network_latency_s"] == profile["network_latency_s"], link
print(f"ok: plan assumes the measured {link['network_bandwidth_bytes_per_s'] / 1e9:.3g} GB/s")
PY
echo "PASS: 2 and 3 ranks of pebble run give every rank the same parameters and state;" \
     "rank 0 plans for all; sharded runs hold the data-parallel run's shards; calibrate measures the link plan uses"
