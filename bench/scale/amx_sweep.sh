#!/usr/bin/env bash
# The AMX bf16 GEMM's configurations swept on a CPU with AMX (issue 21; bench/scale/amx_sweep.py
# says what is measured and printed): every configuration of the tile variant and the blocking
# (the values CTRL_AMX_TILE / CTRL_AMX_BLOCKS set, kernels/cpu/gemm_bf16.c) on the twelve
# projections of the 0.5B shape against torch's bf16 matmul, one thread, each checked against fp64
# (FAIL marks a configuration that computes wrong); the best configuration is written to
# $BUILD/amx_best.env (and $OUT/amx_best.env where $OUT is set) as one line, e.g.
#   CTRL_AMX_BLOCKS=512,256,8192 CTRL_AMX_TILE=1
# for `env $(cat build-gpu/amx_best.env) ...`. Run after bench/gpu.sh has built $BUILD (default
# build-gpu), from anywhere:
#   bash bench/scale/amx_sweep.sh
# CONFIGS="tile:kc,mc,nc ..." replaces amx_sweep.py's list; ROUNDS (3), TOKENS (1024), BUDGET_S (80: no
# shape starts past it), PYTHON (python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-gpu}
export BUILD
# the Debian libraries bench/gpu.sh unpacked for the build, where it did
A=/opt/ctrl-deps/usr/lib/x86_64-linux-gnu
[ -d $A ] && export LD_LIBRARY_PATH=$A:$A/openblas-openmp:${LD_LIBRARY_PATH:-}
export OMP_WAIT_POLICY=PASSIVE
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); flags: $(grep -m1 flags /proc/cpuinfo |
  tr ' ' '\n' | grep -E '^(avx512_bf16|amx_bf16|amx_tile)$' | tr '\n' ' '); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
EXTRA=()
[ -n "${CONFIGS:-}" ] && EXTRA=(--configs "$CONFIGS")
"${PYTHON:-python3}" bench/scale/amx_sweep.py --tokens "${TOKENS:-1024}" --rounds "${ROUNDS:-3}" --threads 1 \
  --budget-s "${BUDGET_S:-80}" --env "$BUILD/amx_best.env" "${EXTRA[@]}"
rc=$?
if [ -n "${OUT:-}" ] && [ -f "$BUILD/amx_best.env" ]; then cp "$BUILD/amx_best.env" "$OUT/"; fi
exit $rc
