#!/usr/bin/env bash
# Data-parallel scaling on the CPU (issue 19): SFT on the same global batch as 1 rank x 1 thread
# (batch B) and 2 ranks x 1 thread (batch B/2 each, mpirun), the training loop's tokens/s (model
# loading and MPI start-up excluded), the final losses (equal), and the ratio.
# usage: bench/distributed/bench_dp.sh BUILD_DIR [HIDDEN LAYERS STEPS BATCH]
set -euo pipefail
BUILD=$1 HIDDEN=${2:-256} LAYERS=${3:-4} STEPS=${4:-30} BATCH=${5:-32}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
C=("$BUILD/ctrl" --plugin-dir "$BUILD/plugins")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
MPI=(mpirun -np 2 --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
[ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
bash "$SRC/scripts/make_quickstart_data.sh" "$TMP/data" 3 >/dev/null
"${C[@]}" model init --arch qwen2 --hidden "$HIDDEN" --layers "$LAYERS" --heads 4 \
  --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/model" >/dev/null
cat >"$TMP/run.ini" <<INI
[run]
output_dir = $TMP/one
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train.jsonl
[train]
learning_rate = 1e-3
max_steps = $STEPS
per_device_train_batch_size = $BATCH
logging_steps = $STEPS
save_strategy = no
INI
last() { tail -1 "$1/metrics.jsonl" | sed "s/.*\"$2\": \([-0-9.e]*\).*/\1/"; }
"${C[@]}" train "$TMP/run.ini" >/dev/null 2>&1
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/two" \
  --set train.per_device_train_batch_size=$((BATCH / 2)) >/dev/null 2>&1
params=$("${C[@]}" model info "$TMP/model" | sed -n 's/^parameters *\([0-9]*\).*/\1/p')
one=$(last "$TMP/one" tokens_per_second) two=$(last "$TMP/two" tokens_per_second)
echo "model: hidden $HIDDEN, $LAYERS layers, $params parameters; $STEPS steps of global batch $BATCH"
echo "1 rank  x 1 thread: $one tok/s, final loss $(last "$TMP/one" loss)"
echo "2 ranks x 1 thread: $two tok/s, final loss $(last "$TMP/two" loss)"
awk -v a="$one" -v b="$two" 'BEGIN { printf "speed-up: %.2fx\n", b / a }'
