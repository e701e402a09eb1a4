#!/usr/bin/env bash
# CPU training-step benchmark: forward + backward of a ~10M-parameter Qwen2-shaped model on a
# batch of 4 x 256 tokens, ctrl against PyTorch, same model, same threads, one run.
# With --checkpointing: 2 x 2048 tokens, each side without and with activation checkpointing
# (ctrl's `checkpointing` memory plugin, transformers' gradient_checkpointing_enable), one process
# per run so that each peak RSS is its own.
# With --bf16: 4 x 256 tokens with each side in bf16 (ctrl's [train] dtype = bf16; torch.autocast).
# usage: [BUILD=build-dir] bench/cpu/run.sh [THREADS] [--checkpointing|--bf16]   (after scripts/build.sh;
# needs python3 with torch+transformers)
set -euo pipefail
cd "$(dirname "$0")/../.."
THREADS=${1:-$(nproc)}
BUILD=${BUILD:-build}
MODE=${2:-}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
python3 bench/cpu/torch_model.py create "$DIR/model" 2>/dev/null
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=1
if [ "$MODE" = "--checkpointing" ]; then
    for memory in none checkpointing; do
        "$BUILD"/bench_cpu_model "$DIR/model" "$BUILD"/plugins 2 2048 3 "$memory"
    done
    for memory in none checkpointing; do
        python3 bench/cpu/torch_model.py time "$DIR/model" 2 2048 3 "$THREADS" "$memory" 2>/dev/null
    done
elif [ "$MODE" = "--bf16" ]; then
    "$BUILD"/bench_cpu_model "$DIR/model" "$BUILD"/plugins 4 256 5 none bf16
    python3 bench/cpu/torch_model.py time "$DIR/model" 4 256 5 "$THREADS" none bf16 2>/dev/null
else
    "$BUILD"/bench_cpu_model "$DIR/model" "$BUILD"/plugins 4 256 5
    python3 bench/cpu/torch_model.py time "$DIR/model" 4 256 5 "$THREADS" 2>/dev/null
fi
