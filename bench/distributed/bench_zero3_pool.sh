#!/usr/bin/env bash
# ZeRO-3's reused gather pages on the CPU (issue 19; core/train/zero_layers.c's pool): 2 ranks of SFT
# (mpirun, 1 thread each) on a Qwen2.5-0.5B-shaped model (LAYERS of its 24 layers, the tiny vocabulary,
# common.sh) with checkpointing and zero3, the layers' released ranges backed by the pool's pages while
# in use (now) against faulted again at each use (CTRL_TEST_ZERO3_REFAULT=1, the code before), the same
# build. Each way runs STEPS and 2 x STEPS steps, so that loading and the final save cancel: CPU seconds
# (user + system) and minor page faults per step per rank are the difference of the two runs over STEPS
# (/usr/bin/time); the peak RSS per rank is the longer run's (the final save included); the pool's own
# line and the final losses (the same both ways) from the longer run.
# usage: bench/distributed/bench_zero3_pool.sh BUILD_DIR [LAYERS STEPS]
set -euo pipefail
BUILD=$1 LAYERS=${2:-24} STEPS=${3:-2}
source "$(dirname "$0")/common.sh"
qwen_model "$TMP/model" "$LAYERS"
machine
echo "model: Qwen2.5-0.5B-shaped, $LAYERS layers; 2 ranks x 1 thread, checkpointing + zero3, $STEPS and $((2 * STEPS)) steps; load average $(load)"
echo "| gathers | peak RSS per rank | CPU s per step per rank | minor faults per step per rank | final loss |"
echo "|---|---|---|---|---|"
for way in refault pool; do
  rank_env
  [ "$way" = refault ] && rank_env CTRL_TEST_ZERO3_REFAULT=1
  for s in "$STEPS" $((2 * STEPS)); do
    sft_ini "$TMP/run.ini" "$TMP/model" "$s" 1
    timed "$TMP/$way-$s.log" "${MPI[@]}" "${ENV[@]}" "${C[@]}" train "$TMP/run.ini" \
      --set run.output_dir="$TMP/$way-$s" --set memory.strategies=checkpointing,zero3
    rm -f "$TMP/$way-$s"/model*.safetensors
  done
  # EXPR FORMAT: EXPR of the rank-time fields, the longer run's less the shorter's over STEPS, each
  # rank (in the order the ranks wrote their lines)
  per_step() { paste <(awk "/^rank-time/ { print $1 }" "$TMP/$way-$STEPS.log") \
    <(awk "/^rank-time/ { print $1 }" "$TMP/$way-$((2 * STEPS)).log") |
    awk -v s="$STEPS" -v f="$2" '{ printf "%s" f, (NR > 1 ? " / " : ""), ($2 - $1) / s }'; }
  echo "| $way | $(ranks_rss "$TMP/$way-$((2 * STEPS)).log") | $(per_step '$2 + $3' '%.2f') | $(per_step '$5' '%.0f') | $(last "$TMP/$way-$((2 * STEPS))" loss) |"
  grep -o "zero3: gathers into reused pages.*\|zero3: gradients on reused pages.*\|zero3: the released pages.*\|zero3: process memory.*" "$TMP/$way-$((2 * STEPS)).log" || true
done
echo "load average after: $(load)"
