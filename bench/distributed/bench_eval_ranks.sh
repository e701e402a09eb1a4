#!/usr/bin/env bash
# An evaluation split over the ranks (issue 19; core/train/data_parallel.h: train_dp_eval_mine):
# SFT's evaluation of EVAL rows (the quickstart's arithmetic rows, batches of 8) on a
# Qwen2.5-0.5B-shaped model (LAYERS of its 24, the tiny test vocabulary), one process against 2 ranks
# (mpirun, 1 OpenMP thread each). Each configuration runs once with the eval set and once without
# (1 step of batch 1 at learning rate 1e-30, which changes no weight: the same evaluation both ways);
# the evaluation's cost is the difference -- wall seconds, and each rank's CPU seconds (user + system,
# /usr/bin/time). Prints eval_loss both ways (the same) and rank 0's share of the batches.
# usage: bench/distributed/bench_eval_ranks.sh BUILD_DIR [LAYERS EVAL]
set -euo pipefail
BUILD=$1 LAYERS=${2:-2} EVAL=${3:-200}
source "$(dirname "$0")/common.sh"
qwen_model "$TMP/model" "$LAYERS"
head -"$EVAL" "$TMP/data/train.jsonl" >"$TMP/eval.jsonl"
sft_ini "$TMP/run.ini" "$TMP/model" 1 1
sed -i 's/^learning_rate = .*/learning_rate = 1e-30/' "$TMP/run.ini"
printf 'per_device_eval_batch_size = 8\n' >>"$TMP/run.ini"
machine
echo "model: Qwen2.5-0.5B-shaped, $LAYERS layers, tiny vocabulary; $EVAL eval rows in batches of 8; load average $(load)"
echo "| evaluation | wall s | CPU s per rank | eval_loss |"
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
# diff_cpu A B: per-line A - B of two CPU lists
diff_cpu() { paste <(echo "$1") <(echo "$2") | awk '{ printf "%s%.1f", (NR > 1 ? " / " : ""), $1 - $2 }'; }
for cfg in one two; do
  launch=("${C[@]}") && [ $cfg = two ] && launch=("${MPI[@]}" "${ENV[@]}" "${C[@]}")
  run "$cfg-no" 0 "${launch[@]}" && w0=$W c0=$CPU
  run "$cfg-ev" 1 "${launch[@]}" && w1=$W c1=$CPU
  [ $cfg = two ] || c0=$(echo "$c0" | head -1) c1=$(echo "$c1" | head -1)
  echo "| $([ $cfg = one ] && echo "1 process" || echo "2 ranks") | $(awk -v a="$w1" -v b="$w0" 'BEGIN { printf "%.1f", a - b }') | $(diff_cpu "$c1" "$c0") | $(last "$TMP/$cfg-ev" eval_loss) |"
done
grep -o "rank 0 evaluated [^)]*" "$TMP/two-ev.log" | head -1
echo "load average after: $(load)"
