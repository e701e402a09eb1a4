#!/usr/bin/env bash
# ZeRO memory per rank on the CPU (issue 19): 2 ranks of SFT (mpirun, 1 thread each) on a
# Qwen2.5-0.5B-shaped model (hidden 896, 14 heads, 2 KV heads, intermediate 4864; LAYERS of its 24
# layers and the tiny test tokenizer's vocabulary, so that it fits beside other work) with no ZeRO,
# zero1, zero2 and zero3: each rank's peak resident memory (/usr/bin/time's maximum RSS), the
# optimizer state each rank holds and zero3's resident parameters between steps (the run's own
# lines), and the final loss (the same for all four).
# usage: bench/distributed/bench_zero.sh BUILD_DIR [LAYERS STEPS]
set -euo pipefail
BUILD=$1 LAYERS=${2:-4} STEPS=${3:-3}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
C=("$BUILD/ctrl" --plugin-dir "$BUILD/plugins")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
MPI=(mpirun -np 2 --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
[ "$(id -u)" = 0 ] && MPI+=(--allow-run-as-root)
bash "$SRC/scripts/make_quickstart_data.sh" "$TMP/data" 3 >/dev/null
"${C[@]}" model init --arch qwen2 --hidden 896 --layers "$LAYERS" --heads 14 --kv-heads 2 --intermediate 4864 \
  --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/model" >/dev/null
cat >"$TMP/run.ini" <<INI
[run]
output_dir = $TMP/none
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train.jsonl
[train]
learning_rate = 1e-4
max_steps = $STEPS
per_device_train_batch_size = 1
logging_steps = 1
save_strategy = no
dtype = fp32
INI
params=$("${C[@]}" model info "$TMP/model" | sed -n 's/^parameters *\([0-9]*\).*/\1/p')
echo "model: Qwen2.5-0.5B-shaped, $LAYERS layers, $params parameters; 2 ranks x 1 thread, $STEPS steps; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| strategy | peak RSS, one rank | the other | optimizer state per rank | final loss |"
echo "|---|---|---|---|---|"
for z in none zero1 zero2 zero3; do
  mem=checkpointing
  [ "$z" != none ] && mem="checkpointing,$z"
  "${MPI[@]}" /usr/bin/time -f "peak-rss-kb %M" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/$z" \
    --set "memory.strategies=$mem" >"$TMP/$z.log" 2>&1
  rss=$(grep -o "peak-rss-kb [0-9]*" "$TMP/$z.log" | awk '{printf "%s%.0f MiB", (NR > 1 ? " | " : ""), $2 / 1024}')
  state=$(grep -o "at most [0-9]* bytes of state per rank\|adamw: [0-9]* bytes of state per rank" "$TMP/$z.log" |
    grep -o "[0-9][0-9]*" | awk '{printf "%.0f MiB", $1 / 1048576}')
  loss=$(tail -1 "$TMP/$z/metrics.jsonl" | sed 's/.*"loss": \([-0-9.e]*\).*/\1/')
  echo "| $z | $rss | $state | $loss |"
  grep -o "zero3: parameters resident.*" "$TMP/$z.log" || true
done
