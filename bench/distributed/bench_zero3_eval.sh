#!/usr/bin/env bash
# zero3's evaluation (issue 19; core/train/train_eval_save.c, data_parallel.h's lockstep): SFT on 2 ranks
# under zero3, EVAL eval rows in batches of 8 (an uneven last round: a rank runs a padding forward), on a
# Qwen2.5-0.5B-shaped model (LAYERS of its 24, the tiny vocabulary; 1 step at learning rate 1e-30, an
# evaluation after it). The evaluation's forwards with the layers gathered around each use (the default)
# against the whole model gathered on every rank first (CTRL_TEST_ZERO3_WHOLE_EVAL=1, the old way), and
# a run without the eval set: each rank's peak RSS (/usr/bin/time), CPU seconds, the eval_loss (the same).
# usage: bench/distributed/bench_zero3_eval.sh BUILD_DIR [LAYERS EVAL]
set -euo pipefail
BUILD=$1 LAYERS=${2:-8} EVAL=${3:-36}
source "$(dirname "$0")/common.sh"
qwen_model "$TMP/model" "$LAYERS"
head -"$EVAL" "$TMP/data/train.jsonl" >"$TMP/eval.jsonl"
sft_ini "$TMP/run.ini" "$TMP/model" 1 1 "eval_file = $TMP/eval.jsonl"
sed -i 's/^learning_rate = .*/learning_rate = 1e-30/' "$TMP/run.ini"
printf 'per_device_eval_batch_size = 8\n[memory]\nstrategies = zero3\n' >>"$TMP/run.ini"
machine
echo "model: Qwen2.5-0.5B-shaped, $LAYERS layers, tiny vocabulary; SFT under zero3 on 2 ranks, $EVAL eval rows in batches of 8; load average $(load)"
echo "| evaluation | peak RSS per rank | CPU s per rank | eval_loss |"
echo "|---|---|---|---|"
run() { # NAME ENV_VAR...: a row
  local name=$1 && shift
  rank_env "$@"
  timed "$TMP/$name.log" env "$@" "${MPI[@]}" "${ENV[@]}" "${C[@]}" train "$TMP/run.ini" \
    --set run.output_dir="$TMP/$name"
  grep -q "whole model gathered on every rank" "$TMP/$name.log" || { echo "$name: failed"; tail -5 "$TMP/$name.log"; exit 1; }
  echo "| $name ($(grep -o 'on every rank [0-9]* time(s)' "$TMP/$name.log" | sed 's/on every rank/whole gathers:/')) | $(ranks_rss "$TMP/$name.log") | $(cpu_times "$TMP/$name.log" | paste -sd/ | sed 's|/| / |') | $(last "$TMP/$name" eval_loss) |"
}
run "layers gathered around each use"
run "whole model gathered first" CTRL_TEST_ZERO3_WHOLE_EVAL=1
echo "load average after: $(load)"
