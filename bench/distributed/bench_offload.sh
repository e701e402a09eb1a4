#!/usr/bin/env bash
# Activation offloading on the CPU (issue 19): one process of SFT with checkpointing, with and without
# offload_activations (the layers' inputs in a file in [memory] offload_dir), on sequences of SEQ
# packed tokens: peak RSS and CPU time per step (/usr/bin/time), the run's own line (bytes in the
# file, activation bytes in memory), and the final loss (bit for bit the same).
# usage: bench/distributed/bench_offload.sh BUILD_DIR [LAYERS SEQ STEPS HIDDEN]
set -euo pipefail
BUILD=$1 LAYERS=${2:-24} SEQ=${3:-4096} STEPS=${4:-2} HIDDEN=${5:-256}
source "$(dirname "$0")/common.sh"
"${C[@]}" model init --arch qwen2 --hidden "$HIDDEN" --layers "$LAYERS" --heads 4 --kv-heads 2 --intermediate $((HIDDEN * 2)) \
  --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/model" >/dev/null
sft_ini "$TMP/run.ini" "$TMP/model" "$STEPS" 1 "packing = true" "max_length = $SEQ"
echo "model: hidden $HIDDEN, $LAYERS layers; sequences of $SEQ packed tokens, $STEPS steps; load average $(load)"
echo "| memory strategies | peak RSS | CPU s per step | final loss |"
echo "|---|---|---|---|"
mkdir -p "$TMP/spill"
for mem in checkpointing checkpointing,offload_activations; do
  extra=()
  [ "$mem" != checkpointing ] && extra=(--set memory.offload_dir="$TMP/spill")
  timed "$TMP/$mem.log" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/$mem" --set "memory.strategies=$mem" "${extra[@]}"
  echo "| $mem | $(peak_rss "$TMP/$mem.log") MiB | $(cpu_times "$TMP/$mem.log" | awk -v s="$STEPS" '{ printf "%.1f", $1 / s }') | $(last "$TMP/$mem" loss) |"
  grep -o "offload_activations: .*" "$TMP/$mem.log" || true
done
cmp -s "$TMP/checkpointing/model.safetensors" "$TMP/checkpointing,offload_activations/model.safetensors" &&
  echo "weights after $STEPS steps: identical" || echo "weights after $STEPS steps: DIFFER"
echo "load average after: $(load)"
