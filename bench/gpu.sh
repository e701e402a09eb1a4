#!/usr/bin/env bash
# The whole GPU check in one command (for a lent H100/H200 or any CUDA machine): build for the
# local GPU, run every test (the CUDA ones included), compute-sanitizer on the CUDA tests, then the
# benchmarks with their PyTorch peers. Logs go to $OUT (or build-gpu/logs); the last lines printed
# are a compact summary.
#
# Machines without the Debian -dev packages (no network) can carry them: `apt-get download` the
# packages listed in scripts/install-deps.sh into .gpudeps/ on a Debian machine; this script
# unpacks them into /opt/ctrl-deps and points the build there.
#
# usage: bench/gpu.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
QUICK=""
[ "${1:-}" = "--quick" ] && QUICK="--quick"
LOG=${OUT:-build-gpu/logs}
mkdir -p "$LOG"
SUMMARY="$LOG/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
stage() { echo; echo "=== $* ($(date +%T))"; }

stage "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee "$LOG/gpu.txt"
nvcc --version | tail -n 2
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1)"

EXTRA=()
if [ -d .gpudeps ] && ls .gpudeps/*.deb >/dev/null 2>&1; then
  stage "unpacking carried packages"
  D=/opt/ctrl-deps
  mkdir -p $D
  for f in .gpudeps/*.deb; do dpkg -x "$f" $D; done
  A=$D/usr/lib/x86_64-linux-gnu
  export PATH=$D/usr/bin:$PATH
  export LD_LIBRARY_PATH=$A:$A/openblas-pthread:${LD_LIBRARY_PATH:-}
  export PKG_CONFIG_PATH=$A/pkgconfig:$A/openblas-pthread/pkgconfig
  EXTRA=(-DCMAKE_PREFIX_PATH=$D/usr -DCMAKE_LIBRARY_PATH="$A;$A/openblas-pthread")
  CONFIG_ENV=(env PKG_CONFIG_SYSROOT_DIR=$D)
else
  CONFIG_ENV=(env)
fi

stage "configure and build"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
"${CONFIG_ENV[@]}" timeout 300 cmake -S . -B build-gpu "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCTRL_CUDA=ON "${EXTRA[@]}" >"$LOG/configure.log" 2>&1
rc=$?
tail -n 3 "$LOG/configure.log"
if [ $rc -ne 0 ]; then cat "$LOG/configure.log"; note "configure: FAILED"; exit 1; fi
timeout 400 cmake --build build-gpu -j "$(nproc)" >"$LOG/build.log" 2>&1
rc=$?
tail -n 3 "$LOG/build.log"
if [ $rc -ne 0 ]; then grep -E "error|FAILED" "$LOG/build.log" | head -40; note "build: FAILED"; exit 1; fi
note "build: ok"

stage "tests (all, CUDA included)"
timeout 400 ctest --test-dir build-gpu --output-on-failure -j 8 >"$LOG/ctest.log" 2>&1
rc=$?
grep -E "tests passed|FAILED|Failed|Skipped|\*\*\*" "$LOG/ctest.log" | head -40
note "ctest: $(grep -E 'tests passed' "$LOG/ctest.log" | tail -n1)"
for t in build-gpu/test_cuda_*; do
  [ -x "$t" ] || continue
  "$t" >"$LOG/$(basename "$t").log" 2>&1
  note "$(basename "$t"): $(tail -n 1 "$LOG/$(basename "$t").log")"
  grep -E "^  (linear|device|seed)" "$LOG/$(basename "$t").log" | tee -a "$SUMMARY"
done

stage "compute-sanitizer"
if command -v compute-sanitizer >/dev/null; then
  for t in build-gpu/test_cuda_*; do
    [ -x "$t" ] || continue
    CTRL_TEST_SMALL=1 timeout 300 compute-sanitizer --tool memcheck --leak-check full "$t" >"$LOG/memcheck-$(basename "$t").log" 2>&1
    note "memcheck $(basename "$t"): $(grep -E 'ERROR SUMMARY' "$LOG/memcheck-$(basename "$t").log" | tail -n1)"
  done
else
  note "compute-sanitizer: not found"
fi

stage "benchmarks"
timeout 300 build-gpu/bench_cuda_ceilings $QUICK 2>&1 | tee "$LOG/bench_ceilings.log" | tee -a "$SUMMARY"
timeout 300 python3 bench/cuda/torch_ceilings.py $QUICK 2>&1 | tee "$LOG/torch_ceilings.log" | tee -a "$SUMMARY"
timeout 300 build-gpu/bench_cuda_ops 2>&1 | tee -a "$SUMMARY"
timeout 300 python3 bench/cuda/torch_ops.py 2>&1 | tail -n 6 | tee -a "$SUMMARY"
timeout 300 build-gpu/bench_cuda_head 2>&1 | tee -a "$SUMMARY"
timeout 300 python3 bench/cuda/torch_head.py 2>&1 | tail -n 3 | tee -a "$SUMMARY"
timeout 300 build-gpu/bench_cuda_flash build-gpu/plugins 2>&1 | tee -a "$SUMMARY"
timeout 300 python3 bench/cuda/torch_flash.py 2>&1 | tail -n 8 | tee -a "$SUMMARY"

echo
echo "=== summary"
cat "$SUMMARY"
