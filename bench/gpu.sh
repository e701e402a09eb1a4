#!/usr/bin/env bash
# The whole GPU check in one command (for a lent H100/H200 or any CUDA machine): build for the
# local GPU, run every test (the CUDA ones natively, the CPU suite beside them), compute-sanitizer
# on the CUDA tests, then the benchmarks with their PyTorch peers and SFT end to end on the GPU.
# The last lines printed are a compact summary; the logs are packed into logs.tgz.
#
# Where the results go: $OUT (the device tool's folder, which returns at most 8 files: only
# summary.txt and logs.tgz are written there) or build-gpu/out.
# CTRL_GPU_BUDGET_S=N: start no stage that would not end within N seconds of the script's start
# (a lease is short; what ran is still reported). 0 or unset: no limit.
# CTRL_GPU_ONLY=a,b,...: run only these stages after the build (default: all): cuda (the CUDA tests
# natively), cpu (the CPU suite in the background), sanitize, flash, sft, profile (ncu per kernel of
# an SFT step: bench/cuda/profile_sft.py), grpo (a GRPO step against TRL: bench/scale/
# bench_grpo_scale.py --device cuda), amx (the host CPU's bf16 GEMM paths: bench/scale/
# bench_gemm.py, AMX where the host has it), sftcpu (bench/scale/bench_scale.py: SFT on the host CPU
# against TRL, 24 layers, the two rows side by side), cpuprof (where ctrl's CPU step goes on the host,
# sampled by bench/common/pc_sample.c), amxsft (the AMX sweep and the SFT rows with its best
# configuration, against TRL), extra (ceilings, head, ops), health (test_train_health 8x), offload
# (bench/cuda/offload_overlap.sh: offload_optimizer's host step overlapped with the next forward
# against the whole-model host step and the device optimizer: the same weights, the step times).
# CTRL_GPU_TESTS="device ops ...": which test_cuda_* binaries the cuda stage runs (default: all).
# CTRL_GPU_SANITIZE_TESTS="online ...": which of them compute-sanitizer runs (default: the same),
# CTRL_GPU_TEST_CAP_S / CTRL_GPU_SANITIZE_CAP_S: seconds for each test / memcheck run (240 / 90).
#
# Machines without the Debian -dev packages (no network) can carry them: `apt-get download` the
# packages listed in scripts/install-deps.sh (and pkg-config) into .gpudeps/ on a Debian machine;
# this script unpacks them into /opt/ctrl-deps and points the build there. Tests that read
# ../shared (real tokenizers) find it if .gpushared/ (a copy of ../shared) was carried.
#
# usage: bench/gpu.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
QUICK=""
[ "${1:-}" = "--quick" ] && QUICK="--quick"
BUDGET=${CTRL_GPU_BUDGET_S:-0}
RESULTS=${OUT:-build-gpu/out}
LOG=build-gpu/logs
mkdir -p "$LOG" "$RESULTS"
SUMMARY="$RESULTS/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
stage() { echo; echo "=== $* ($(date +%T), ${SECONDS}s)"; }
pack() { tar -czf "$RESULTS/logs.tgz" -C build-gpu logs 2>/dev/null; }
left() { if [ "$BUDGET" -gt 0 ]; then echo $((BUDGET - SECONDS)); else echo 100000; fi; }
# cap N: N seconds, or what is left of the budget if less (at least 5)
cap() { local l; l=$(left); if [ "$l" -lt "$1" ]; then echo $((l > 5 ? l : 5)); else echo "$1"; fi; }
# enough N WHAT: true when N seconds are left, else notes the skip
enough() { [ "$(left)" -ge "$1" ] && return 0; note "skipped (budget): $2"; return 1; }
# Python runs without the carried libraries (the image's own torch and numpy): env -u, since
# `timeout` runs programs, not shell functions.
py() { env -u LD_LIBRARY_PATH python3 "$@"; }
ONLY=",${CTRL_GPU_ONLY:-cuda,cpu,sanitize,flash,sft,grpo,profile,amx,sftcpu,amxsft,cpuprof,extra,health,offload},"
want() { [[ $ONLY == *",$1,"* ]]; }

stage "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee "$LOG/gpu.txt"
nvcc --version | tail -n 2
note "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); flags: $(grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512_bf16|amx_bf16|avx512f|avx2)$' | tr '\n' ' ')"
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1); $(nproc) cores; $(nvcc --version | tail -n1)"
note "tools: compute-sanitizer $(command -v compute-sanitizer >/dev/null && echo yes || echo no), torch $(py -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"

if [ -d .gpushared ] && [ ! -e ../shared ]; then ln -s "$PWD/.gpushared" ../shared; fi

EXTRA=()
CONFIG_ENV=(env)
if [ -d .gpudeps ] && ls .gpudeps/*.deb >/dev/null 2>&1; then
  stage "unpacking carried packages"
  D=/opt/ctrl-deps
  mkdir -p $D
  for f in .gpudeps/*.deb; do dpkg -x "$f" $D; done
  A=$D/usr/lib/x86_64-linux-gnu
  # the private requirements (gnutls and its -dev chain) are not carried: ctrl links it shared
  sed -i '/^Requires.private/d' $A/pkgconfig/*.pc
  export PATH=$D/usr/bin:$PATH
  export LD_LIBRARY_PATH=$A:$A/openblas-openmp:${LD_LIBRARY_PATH:-}
  export PKG_CONFIG_PATH=$A/pkgconfig:$A/openblas-openmp/pkgconfig
  EXTRA=(-DCMAKE_PREFIX_PATH=$D/usr -DOPENBLAS_OPENMP_LIBRARY=$A/openblas-openmp/libopenblas.so
         -DOPENBLAS_OPENMP_INCLUDE_DIR=$D/usr/include/x86_64-linux-gnu/openblas-openmp)
  CONFIG_ENV=(env PKG_CONFIG_SYSROOT_DIR=$D)
fi

if ls .whl/*.whl >/dev/null 2>&1; then # Python packages the image lacks (TRL for the GRPO bench)
  stage "installing carried wheels"
  py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ctrl-site .whl/*.whl &&
    export PYTHONPATH=/tmp/ctrl-site${PYTHONPATH:+:$PYTHONPATH}
fi

stage "configure and build"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
"${CONFIG_ENV[@]}" timeout "$(cap 300)" cmake -S . -B build-gpu "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCTRL_CUDA=ON -DCTRL_CUDA_EMU=OFF "${EXTRA[@]}" >"$LOG/configure.log" 2>&1
rc=$?
tail -n 3 "$LOG/configure.log"
if [ $rc -ne 0 ]; then tail -n 40 "$LOG/configure.log"; note "configure: FAILED"; pack; exit 1; fi
timeout "$(cap 400)" cmake --build build-gpu -j "$(nproc)" >"$LOG/build.log" 2>&1
rc=$?
tail -n 3 "$LOG/build.log"
if [ $rc -ne 0 ]; then grep -E "error|FAILED" "$LOG/build.log" | head -40; note "build: FAILED"; pack; exit 1; fi
note "build: ok (${SECONDS}s)"
pack

# The CPU suite (everything but the native CUDA tests) in the background while the GPU is used.
stage "tests: CPU suite in the background, CUDA tests natively"
export OMP_WAIT_POLICY=PASSIVE
CPU_SUITE=""
if want cpu; then
  OMP_NUM_THREADS=2 timeout "$(cap 420)" ctest --test-dir build-gpu -j 8 -LE '^cuda$' --output-on-failure >"$LOG/ctest-cpu.log" 2>&1 &
  CPU_SUITE=$!
fi
read -r -a CUDA_TESTS <<<"${CTRL_GPU_TESTS:-device ops model train online sampling trainers nf4 lora flash paged}"
want cuda || CUDA_TESTS=()
for t in "${CUDA_TESTS[@]}"; do
  b=build-gpu/test_cuda_$t
  [ -x "$b" ] || { note "test_cuda_$t: not built"; continue; }
  enough 20 "test_cuda_$t" || continue
  OMP_NUM_THREADS=8 timeout "$(cap "${CTRL_GPU_TEST_CAP_S:-240}")" "$b" >"$LOG/test_cuda_$t.log" 2>&1
  note "test_cuda_$t: exit $? ($(grep -cE '^ok|PASS' "$LOG/test_cuda_$t.log") ok lines) $(tail -n 1 "$LOG/test_cuda_$t.log")"
  grep -E "FAIL|error|mismatch" "$LOG/test_cuda_$t.log" | head -n 8 | tee -a "$SUMMARY"
done
pack

stage "compute-sanitizer memcheck (small shapes)"
if ! want sanitize; then
  :
elif command -v compute-sanitizer >/dev/null; then
  read -r -a SAN_TESTS <<<"${CTRL_GPU_SANITIZE_TESTS:-${CUDA_TESTS[*]}}"
  for t in "${SAN_TESTS[@]}"; do
    [ "$t" = train ] && continue # below, after the benchmarks
    enough 40 "memcheck test_cuda_$t" || continue
    CTRL_TEST_SMALL=1 timeout "$(cap "${CTRL_GPU_SANITIZE_CAP_S:-90}")" compute-sanitizer --tool memcheck --leak-check full \
      "build-gpu/test_cuda_$t" >"$LOG/memcheck-$t.log" 2>&1
    note "memcheck test_cuda_$t: exit $? $(grep -E 'ERROR SUMMARY' "$LOG/memcheck-$t.log" | tail -n1)"
  done
  for t in flash paged; do  # the kernels that share memory among a block's threads
    [[ " ${SAN_TESTS[*]} " == *" $t "* ]] || continue
    enough 40 "racecheck test_cuda_$t" || continue
    CTRL_TEST_SMALL=1 timeout "$(cap 90)" compute-sanitizer --tool racecheck "build-gpu/test_cuda_$t" \
      >"$LOG/racecheck-$t.log" 2>&1
    note "racecheck test_cuda_$t: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/racecheck-$t.log" | tail -n1)"
  done
else
  note "compute-sanitizer: not found"
fi
pack

stage "waiting for the CPU suite"
if [ -n "$CPU_SUITE" ]; then
  wait $CPU_SUITE
  note "ctest (CPU suite): exit $? $(grep -E 'tests passed' "$LOG/ctest-cpu.log" | tail -n1)"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess)" "$LOG/ctest-cpu.log" | head -20 | tee -a "$SUMMARY"
fi
pack

stage "benchmarks"
run_bench() { # SECONDS_CAP NAME COMMAND...
  local c=$1 n=$2; shift 2
  enough 30 "$n" || return
  if [ "$1" = python3 ]; then set -- env -u LD_LIBRARY_PATH "$@"; fi
  timeout "$(cap "$c")" "$@" >"$LOG/$n.log" 2>&1
  note "--- $n (exit $?)"
  tail -n "${TAIL:-12}" "$LOG/$n.log" | tee -a "$SUMMARY"
}
if want flash; then
  TAIL=10 run_bench 90 bench_flash build-gpu/bench_cuda_flash build-gpu/plugins
  TAIL=10 run_bench 90 torch_flash python3 bench/cuda/torch_flash.py
fi
pack
# SFT end to end: a Qwen2.5-0.5B-shaped model at sequence length 2048 (issue 20's MFU target)
TOKDIR=tests/fixtures/tokenizer/tiny_bpe
[ -d ../shared/data/tokenizers/qwen3 ] && TOKDIR=../shared/data/tokenizers/qwen3
want sft && TAIL=12 run_bench 200 sft_cuda env -u LD_LIBRARY_PATH CTRL_LIBS="${LD_LIBRARY_PATH:-}" python3 \
  bench/cuda/bench_sft_cuda.py --build build-gpu --tokenizer "$TOKDIR" --batch 4 --seq 2048 --steps 8 --timeout 90 \
  --dtypes "${CTRL_GPU_SFT_DTYPES:-bf16,fp32}"
pack
# offload_optimizer (issue 19): the host step overlapped layer by layer with the next forward, its
# weights bit for bit the whole-model host step's, and the step times of device / whole / overlap
want offload && TAIL=6 run_bench 150 offload_overlap bash bench/cuda/offload_overlap.sh build-gpu 12 1024 8
pack
# a GRPO step on the GPU (issue 20): ctrl against TRL's GRPOTrainer with transformers' generate (no vLLM
# on these machines); TRL and its datasets come from carried wheels (.whl, see docs/performance.md)
want grpo && TAIL=8 run_bench 170 grpo_cuda env BUILD=build-gpu python3 bench/scale/bench_grpo_scale.py \
  --device cuda --layers 24 --steps 3 --batch 32 --generations 8 --max-completion-length 64 --threads 8 \
  --only ctrl-bf16,trl-bf16
pack
# where the SFT step's time goes: ncu's per-kernel GPU time against the step's wall time
want profile && TAIL=32 run_bench 180 profile_sft env -u LD_LIBRARY_PATH CTRL_LIBS="${LD_LIBRARY_PATH:-}" python3 \
  bench/cuda/profile_sft.py --build build-gpu --tokenizer "$TOKDIR" --layers 4 --batch 4 --seq 2048 --timeout 150
pack
# the host CPU's bf16 GEMM (issue 21): AMX tiles against AVX-512 BF16 and torch (oneDNN), one thread
want amx && TAIL=20 run_bench 90 bench_gemm env BUILD=build-gpu python3 bench/scale/bench_gemm.py --tokens 1024 \
  --rounds 3 --threads 1
# SFT on the host CPU against TRL (issue 21's AMX target), one thread each as the issue measures:
# the model made once, then every row side by side, each pinned to a core of its own (the host has
# 16), so that the 24-layer comparison fits a lease. CTRL_GPU_SFTCPU_LAYERS (24), CTRL_GPU_SFTCPU_STEPS
# (3), CTRL_GPU_SFTCPU_CAP_S (300) and CTRL_GPU_SFTCPU_ROWS (bench_scale.py run names; those ending in avx2, e.g. ctrl-bf16avx2
# trl-fp32avx2, are its stand-in for an AVX2-only CPU: ctrl from build-gpu-avx2, built here first with
# -DCTRL_CPU_ARCH=haswell, and each side held to AVX2 by its own switches) size it.
if want sftcpu && enough 60 "sftcpu"; then
  SL=${CTRL_GPU_SFTCPU_LAYERS:-24}
  SD=build-gpu/sftcpu-L$SL
  SC=$(cap "${CTRL_GPU_SFTCPU_CAP_S:-300}")
  env BUILD=build-gpu timeout "$SC" python3 bench/scale/bench_scale.py --layers "$SL" --dir "$SD" --only none \
    >"$LOG/sft_cpu_init.log" 2>&1
  avx2=""
  for row in ${CTRL_GPU_SFTCPU_ROWS:-}; do [[ $row == ctrl-*avx2* ]] && avx2=1; done
  if [ -n "$avx2" ]; then # ctrl's AVX2-only build (bench_scale's ctrl-*avx2 rows), CPU parts only
    "${CONFIG_ENV[@]}" cmake -S . -B build-gpu-avx2 "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCTRL_CUDA=OFF \
      -DCTRL_CUDA_EMU=OFF -DCTRL_BUILD_TESTS=OFF -DCTRL_CPU_ARCH=haswell "${EXTRA[@]}" >"$LOG/sft_cpu_avx2_build.log" 2>&1 &&
      timeout "$(cap 200)" cmake --build build-gpu-avx2 -j "$(nproc)" >>"$LOG/sft_cpu_avx2_build.log" 2>&1 ||
      note "sftcpu: the AVX2 build failed: $(tail -n 3 "$LOG/sft_cpu_avx2_build.log")"
  fi
  SC=$(cap "$SC")
  core=1
  for row in ${CTRL_GPU_SFTCPU_ROWS:-ctrl-bf16 trl-bf16}; do
    BUILD=build-gpu BUILD_AVX2=build-gpu-avx2 timeout "$SC" taskset -c $core python3 bench/scale/bench_scale.py \
      --layers "$SL" --dir "$SD" --steps "${CTRL_GPU_SFTCPU_STEPS:-3}" --threads 1 --only "$row" \
      >"$LOG/sft_cpu_$row.log" 2>&1 &
    core=$((core + 2))
  done
  wait
  for f in init ${CTRL_GPU_SFTCPU_ROWS:-ctrl-bf16 trl-bf16}; do
    note "--- sft_cpu_$f"
    tail -n 6 "$LOG/sft_cpu_$f.log" | tee -a "$SUMMARY"
  done
fi
# issue 21 on an AMX host in one go (amxsft): the AMX GEMM sweep (bench/scale/amx_sweep.sh, at most
# CTRL_GPU_AMXSWEEP_S = 90 s) on one core while TRL's bf16 SFT row and ctrl's with its default AMX
# configuration run on two others; then ctrl's row again with the configuration the sweep found best
# (build-gpu/amx_best.env). 24 layers (CTRL_GPU_SFTCPU_LAYERS), 2 steps, one thread each.
if want amxsft && enough 120 "amxsft"; then
  SL=${CTRL_GPU_SFTCPU_LAYERS:-24}
  for d in default best; do
    env BUILD=build-gpu timeout "$(cap 120)" python3 bench/scale/bench_scale.py --layers "$SL" \
      --dir "build-gpu/amxsft-$d" --only none >"$LOG/amxsft_init_$d.log" 2>&1 &
  done
  wait
  sftrow() { # CORE DIR RUN NAME [VAR=VALUE...]
    local core=$1 dir=$2 run=$3 name=$4
    shift 4
    env "$@" BUILD=build-gpu timeout "$(cap 240)" taskset -c "$core" python3 bench/scale/bench_scale.py \
      --layers "$SL" --dir "build-gpu/amxsft-$dir" --steps 2 --threads 1 --only "$run" >"$LOG/amxsft_$name.log" 2>&1
  }
  sftrow 3 default trl-bf16 trl &
  sftrow 5 default ctrl-bf16 ctrl_default &
  BUILD=build-gpu BUDGET_S=${CTRL_GPU_AMXSWEEP_S:-90} timeout "$(cap 150)" taskset -c 1 bash bench/scale/amx_sweep.sh \
    >"$LOG/amx_sweep.log" 2>&1
  AMX_BEST=$(cat build-gpu/amx_best.env 2>/dev/null)
  note "amx sweep's best configuration: ${AMX_BEST:-none}"
  # shellcheck disable=SC2086 # the file holds VAR=VALUE words
  sftrow 1 best ctrl-bf16 ctrl_best $AMX_BEST
  wait
  for f in trl ctrl_default ctrl_best; do
    note "--- amxsft $f"
    grep -E 'tokens/s|cpu: |OpenBLAS' "$LOG/amxsft_$f.log" | tee -a "$SUMMARY"
  done
  tail -n 40 "$LOG/amx_sweep.log" | tee -a "$SUMMARY"
fi
# where ctrl's CPU step goes on the host (no perf there): bench/common/pc_sample.c preloaded into each
# row of bench_scale.py (NAME or NAME:ENV=VALUE,ENV=VALUE), each in its own folder on a core of its
# own; CTRL_GPU_CPUPROF_ROWS, CTRL_GPU_CPUPROF_LAYERS (24), CTRL_GPU_CPUPROF_CAP_S (170)
if want cpuprof && enough 60 "cpuprof"; then
  cc -O2 -shared -fPIC -o build-gpu/libpc_sample.so bench/common/pc_sample.c -ldl
  note "openblas: $(OPENBLAS_VERBOSE=2 build-gpu/ctrl --version 2>&1 | grep -i core | head -n 2 | tr '\n' ' ')"
  PL=${CTRL_GPU_CPUPROF_LAYERS:-24}
  PC=$(cap "${CTRL_GPU_CPUPROF_CAP_S:-170}")
  core=1
  for row in ${CTRL_GPU_CPUPROF_ROWS:-ctrl-bf16 ctrl-bf16:CTRL_NO_AMX=1}; do
    tag=${row//[:=,]/_}
    vars=()
    [[ $row == *:* ]] && IFS=, read -ra vars <<<"${row#*:}"
    env "${vars[@]}" BUILD=build-gpu LD_PRELOAD="$PWD/build-gpu/libpc_sample.so" PC_SAMPLE_OUT="$LOG/pcs-$tag" \
      timeout "$PC" taskset -c $core python3 bench/scale/bench_scale.py --layers "$PL" --dir "build-gpu/prof-$tag" \
      --steps 2 --threads 1 --only "${row%%:*}" >"$LOG/cpuprof-$tag.log" 2>&1 &
    core=$((core + 2))
  done
  wait
  for row in ${CTRL_GPU_CPUPROF_ROWS:-ctrl-bf16 ctrl-bf16:CTRL_NO_AMX=1}; do
    tag=${row//[:=,]/_}
    note "--- cpuprof $row"
    grep -E 'tokens/s|cpu: ' "$LOG/cpuprof-$tag.log" | tee -a "$SUMMARY"
    ls "$LOG"/pcs-"$tag".* >/dev/null 2>&1 &&
      python3 bench/common/pc_report.py "$LOG"/pcs-"$tag".* --match _2.ini --top 30 2>&1 | tee -a "$SUMMARY"
  done
fi
pack
if [ -z "$QUICK" ] && want extra; then # --quick: the reference numbers recorded already are not measured again
  run_bench 60 bench_ceilings build-gpu/bench_cuda_ceilings --quick
  run_bench 60 torch_ceilings python3 bench/cuda/torch_ceilings.py --quick
  run_bench 60 bench_head build-gpu/bench_cuda_head
  TAIL=3 run_bench 60 torch_head python3 bench/cuda/torch_head.py
fi
pack

if want sanitize && [[ " ${CTRL_GPU_SANITIZE_TESTS:-${CUDA_TESTS[*]}} " == *" train "* ]] && command -v compute-sanitizer >/dev/null &&
  enough 60 "memcheck test_cuda_train"; then
  CTRL_TEST_SMALL=1 timeout "$(cap 120)" compute-sanitizer --tool memcheck "build-gpu/test_cuda_train" \
    >"$LOG/memcheck-train.log" 2>&1
  note "memcheck test_cuda_train: exit $? $(grep -E 'ERROR SUMMARY' "$LOG/memcheck-train.log" | tail -n1)"
fi
pack
if [ -z "$QUICK" ] && want extra; then
  run_bench 60 bench_ops build-gpu/bench_cuda_ops
  TAIL=6 run_bench 60 torch_ops python3 bench/cuda/torch_ops.py
fi
pack

# test_train_health on this host's CPU, 8 times (it went non-finite in 4 of 8 runs on an H200 host)
if want health && enough 60 "test_train_health x8"; then
  h=0
  for i in 1 2 3 4 5 6 7 8; do
    OMP_NUM_THREADS=1 timeout 60 bash tests/e2e/test_train_health.sh build-gpu/ctrl build-gpu/plugins . \
      >"$LOG/health-$i.log" 2>&1 && h=$((h + 1))
  done
  note "test_train_health: $h of 8 runs passed"
fi
pack

echo
echo "=== summary (${SECONDS}s)"
cat "$SUMMARY"
