#!/bin/sh
# ctest's fuzz_<target>: fuzzes one libFuzzer program of a PEBBLE_FUZZ build
# (scripts/fuzz --build-only) for a fixed time, on a scratch copy of the
# checked-in corpus (which it never writes). Exit 77 (skipped) when the
# program is not built; non-zero when the fuzzer finds a crash, a leak, a
# timeout or a broken property, with the reproducer under WORKDIR/artifacts.
#
#   ci_fuzz.sh PROGRAM CORPUS_DIR WORKDIR SECONDS [DICTIONARY]
set -eu
bin=$1 corpus=$2 work=$3 seconds=$4 dict=${5:-}
if [ ! -x "$bin" ]; then
  echo "skipped: $bin is not built (scripts/fuzz --build-only builds it)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
cp "$corpus"/* "$work/corpus/"
ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS UBSAN_OPTIONS
# libFuzzer's own exit code for a finding is 77 (and 70 for a timeout): the
# code ctest reads as "skipped". Every finding must fail the test instead.
set -- -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
  -error_exitcode=1 -timeout_exitcode=1 -artifact_prefix="$work/artifacts/"
[ -n "$dict" ] && set -- "$@" -dict="$dict"
rc=0
"$bin" "$@" "$work/corpus" || rc=$?
if [ "$rc" -ne 0 ]; then
  for f in "$work"/artifacts/*; do
    [ -e "$f" ] && echo "reproducer: $f (run: $bin $f)"
  done
fi
exit "$rc"
