#!/usr/bin/env bash
# CPU training-step benchmark: forward + backward of a ~10M-parameter Qwen2-shaped model on a
# batch of 4 x 256 tokens, ctrl against PyTorch, same model, same threads, one run.
# usage: bench/cpu/run.sh [THREADS]   (after scripts/build.sh; needs python3 with torch+transformers)
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${1:-$(nproc)}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
python3 bench/cpu/torch_model.py create "$DIR/model" 2>/dev/null
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=1 build/bench_cpu_model "$DIR/model" build/plugins 4 256 5
python3 bench/cpu/torch_model.py time "$DIR/model" 4 256 5 "$THREADS" 2>/dev/null
