#!/usr/bin/env bash
# An evaluation split over the ranks (issue 19; core/train/data_parallel.h: train_dp_eval_mine):
# KIND sft (the default): SFT's evaluation of EVAL rows (the quickstart's arithmetic rows, batches of
# 8); KIND grpo: GRPO's evaluation of EVAL of the quickstart's prompts (core/train/online_loop.c's
# ctrl_online_evaluate: 4 completions of up to 16 tokens each, sampled at temperature 1 and scored by
# the length reward, in batches of 8 completions), on a Qwen2.5-0.5B-shaped model (LAYERS of its 24,
# the tiny test vocabulary), one process against 2 ranks (mpirun, 1 OpenMP thread each). Each
# configuration runs once with the eval set and once without (1 step at learning rate 1e-30, which
# changes no weight: the same evaluation both ways); the evaluation's cost is the difference divided
# by the evaluations run (GRPO: 2, before and after the step) -- wall seconds, and each rank's CPU
# seconds (user + system, /usr/bin/time). Prints the last eval_loss / eval_reward both ways (the
# same) and rank 0's share of the batches.
# usage: bench/distributed/bench_eval_ranks.sh BUILD_DIR [LAYERS EVAL KIND]
set -euo pipefail
BUILD=$1 LAYERS=${2:-2} EVAL=${3:-200} KIND=${4:-sft}
source "$(dirname "$0")/common.sh"
qwen_model "$TMP/model" "$LAYERS"
KEY=eval_loss EVALS=1
if [ "$KIND" = grpo ]; then
  KEY=eval_reward EVALS=2
  head -"$EVAL" "$TMP/data/train_prompts.jsonl" >"$TMP/eval.jsonl"
  cat >"$TMP/run.ini" <<INI
[run]
trainer = grpo
output_dir = $TMP/run
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train_prompts.jsonl
[train]
learning_rate = 1e-30
max_steps = 1
per_device_train_batch_size = 4
per_device_eval_batch_size = 8
logging_steps = 1
save_strategy = no
dtype = fp32
[grpo]
num_generations = 4
max_completion_length = 16
[reward.len]
plugin = length
target_length = 8
INI
  what="$EVAL eval prompts x 4 completions (up to 16 tokens) in batches of 8 completions"
else
  head -"$EVAL" "$TMP/data/train.jsonl" >"$TMP/eval.jsonl"
  sft_ini "$TMP/run.ini" "$TMP/model" 1 1
  sed -i 's/^learning_rate = .*/learning_rate = 1e-30/' "$TMP/run.ini"
  printf 'per_device_eval_batch_size = 8\n' >>"$TMP/run.ini"
  what="$EVAL eval rows in batches of 8"
fi
machine
echo "model: Qwen2.5-0.5B-shaped, $LAYERS layers, tiny vocabulary; $KIND: $what; load average $(load)"
echo "| evaluation | wall s | CPU s per rank | $KEY |"
echo "|---|---|---|---|"
rank_env
# run NAME EVAL(0/1) COMMAND...: wall seconds into W, the per-rank CPU seconds into CPU (one line each)
run() {
  local name=$1 eval=$2 && shift 2
  local set=() t0 && [ "$eval" = 1 ] && set=(--set data.eval_file="$TMP/eval.jsonl")
  t0=$(date +%s.%N)
  timed "$TMP/$name.log" "$@" train "$TMP/run.ini" --set run.output_dir="$TMP/$name" "${set[@]}"
  W=$(seconds_since "$t0")
  CPU=$(cpu_times "$TMP/$name.log")
}
# diff_cpu A B: per-line (A - B) / EVALS of two CPU lists
diff_cpu() { paste <(echo "$1") <(echo "$2") | awk -v n="$EVALS" '{ printf "%s%.1f", (NR > 1 ? " / " : ""), ($1 - $2) / n }'; }
for cfg in one two; do
  launch=("${C[@]}") && [ $cfg = two ] && launch=("${MPI[@]}" "${ENV[@]}" "${C[@]}")
  run "$cfg-no" 0 "${launch[@]}" && w0=$W c0=$CPU
  run "$cfg-ev" 1 "${launch[@]}" && w1=$W c1=$CPU
  [ $cfg = two ] || c0=$(echo "$c0" | head -1) c1=$(echo "$c1" | head -1)
  echo "| $([ $cfg = one ] && echo "1 process" || echo "2 ranks") | $(awk -v a="$w1" -v b="$w0" -v n="$EVALS" 'BEGIN { printf "%.1f", (a - b) / n }') | $(diff_cpu "$c1" "$c0") | $(last "$TMP/$cfg-ev" "$KEY") |"
done
grep -o "rank 0 evaluated [^)]*" "$TMP/two-ev.log" | head -1
echo "load average after: $(load)"
