#!/usr/bin/env bash
# Runs the fuzz targets of a -DCTRL_FUZZ=ON build, one at a time (-jobs=1: the CI machine is small
# and shared), each for SECONDS over its seed corpus (docs/fuzzing.md).
#   run_fuzz.sh BUILD SECONDS [TARGET...] [-- extra libFuzzer flags]
# TARGET is a name like `config` (default: every BUILD/fuzz_* binary). New inputs go to
# BUILD/fuzz-corpus/TARGET (kept between runs), a crashing input to BUILD/fuzz-artifacts/TARGET/,
# each run's output to BUILD/fuzz-logs/TARGET.log. Prints one line per target and exits 1 when any
# target crashed, leaked, timed out (-timeout, 10 s per input) or ran out of memory.
set -uo pipefail
build=$(cd "$1" && pwd) secs=$2
shift 2
targets=() extra=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then
    shift
    extra=("$@")
    break
  fi
  targets+=("$1")
  shift
done
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$build"/fuzz_*; do [ -x "$f" ] && targets+=("${f##*/fuzz_}"); done
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "run_fuzz: no fuzz targets in $build (configure with -DCTRL_FUZZ=ON)" >&2
  exit 1
fi

# One input at a time, each on one thread: OpenMP/OpenBLAS thread pools only add noise here.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
supp=$(dirname "$0")/lsan.supp
[ -f "$supp" ] && export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(cd "$(dirname "$supp")" && pwd)/lsan.supp}

failed=0
for t in "${targets[@]}"; do
  bin=$build/fuzz_$t seeds=$build/fuzz-seeds/$t corpus=$build/fuzz-corpus/$t art=$build/fuzz-artifacts/$t
  log=$build/fuzz-logs/$t.log
  mkdir -p "$corpus" "$art" "$build/fuzz-logs"
  start=$(date +%s)
  "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$art/" "${extra[@]}" "$corpus" "$seeds" >"$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  took=$(($(date +%s) - start))
  if [ $rc -eq 0 ]; then
    echo "fuzz_$t: ok, ${runs:-?} inputs in ${took} s"
  else
    failed=$((failed + 1))
    echo "fuzz_$t: FAILED (exit $rc) after ${runs:-?} inputs in ${took} s; log $log"
    grep -E '^(SUMMARY|==[0-9]+==ERROR)|runtime error|Test unit written|^Base64' "$log" | head -8 | sed 's/^/  /'
  fi
done
echo "fuzz: ${#targets[@]} targets, $failed failed (${secs} s each)"
[ $failed -eq 0 ]
