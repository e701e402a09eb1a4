#!/usr/bin/env bash
# The online trainers' evaluation split over the ranks (issue 19; core/train/online_loop.c's
# ctrl_online_evaluate). With `mpirun -np 2` the eval prompts are cut, in file order, into batches of
# per_device_eval_batch_size completions (whole groups of num_generations), batch i on rank i % 2 as
# Accelerate shards the eval dataloader; each rank samples its prompts' completions -- seeded by each
# prompt's place in the eval set, so they are one process's -- scores them, and the sums and counts of
# the rewards that are not NaN are added over the ranks. Every eval_ line of the 2-rank run must be
# one process's: the same keys in the same order, the values within 1e-6 relative (+ 1e-9; the
# printed values are expected identical: the test prints how many are not), and rank 0's log must
# show its share (the batch count summed over the ranks: a rank evaluating every batch shows).
# Both runs evaluate the same weights (learning_rate 1e-30), before and after the one step, sampling
# at temperature 1 (a completion sampled from another seed would change the means). 5 eval prompts,
# two of them without a parseable solution (the accuracy reward NaN there: its mean is over the
# others, and in batches of one prompt rank 1 holds both, so its accuracy count is 0); rewards: the
# length, digits counted (regex) and accuracy.
#   grpo: batches of 1 prompt (rank 0 3 of 5), of 2 (rank 0 2 of 3, the last batch one prompt), one
#     batch of 32 completions (rank 1 evaluates nothing); zero3 with ds3_gather_for_generation true
#     and false; server mode (one `ctrl serve`, each rank sends its prompts), also under zero3 (the
#     weights pushed at the first evaluation with the model gathered for it).
#   rloo: batches of 1 prompt; online_dpo (2 completions a prompt): batches of 2 prompts; ppo (one
#     completion a prompt): batches of per_device_eval_batch_size = 1 prompt.
#   a rank whose scoring fails ends the job, rank 0's error naming it.
# Skipped (77) only when mpirun or the MPI backend (libctrl_mpi.so) is absent.
# usage: test_eval_online_mpi.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
tiny_setup 7 2

# 5 eval prompts; the 2nd and 4th with a solution the accuracy reward cannot read (NaN)
head -5 "$TMP/data/eval_prompts.jsonl" |
  awk 'NR == 2 || NR == 4 { sub(/"solution": "[^"]*"/, "\"solution\": \"none\"") } 1' >"$TMP/ev5.jsonl"
grep -c '"none"' "$TMP/ev5.jsonl" | grep -qx 2 && ok || bad "the eval file has no rows without a solution"
REWARDS=("[reward.digits]" "plugin = regex" 'pattern = [0-9]' "count = true" "score = 0.5" "else_score = -1"
  "[reward.acc]" "plugin = accuracy")

# same_evals, eval_split and run1: e2e_common.sh. keys NAME: NAME-two's 2 eval lines hold the 6 keys (step,
# eval_reward, the 3 functions' means, eval_prompts), the accuracy's mean not null (the rows without a
# solution left out, on the rank that has only those too)
keys() {
  local n
  n=$(grep '"eval_' "$TMP/$1/metrics.jsonl" | tr ',' '\n' | grep -c '"')
  [ "$n" = 12 ] && ! grep '"eval_' "$TMP/$1/metrics.jsonl" | grep -q '"eval_rewards/acc/mean": null' && ok ||
    bad "$1: $n eval keys, or the accuracy's mean null: $(grep '"eval_' "$TMP/$1/metrics.jsonl" | head -1)"
}
# ini NAME TRAINER [LINE...]: a one-step run of TRAINER evaluating ev5 before and after the step
ini() {
  local name=$1 trainer=$2 && shift 2
  INI_TRAIN=$'dtype = fp32\neval_steps = 1\nper_device_eval_batch_size = 4' online_ini "$trainer" "$name" 1 \
    "${REWARDS[@]}" "$@" |
    sed "s|^eval_file = .*|eval_file = $TMP/ev5.jsonl|; s/^learning_rate = .*/learning_rate = 1e-30/" >"$TMP/$name.ini"
}
# both NAME INI MINE ALL [--set ...]: $TMP/INI.ini on one process (NAME-one, 4 prompts a micro-batch) and
# on 2 ranks (NAME-two, 2 each): the same evaluations, rank 0's share MINE of ALL batches
both() {
  local name=$1 ini=$2 mine=$3 all=$4 && shift 4
  run1 "$name-one" "${C[@]}" train "$TMP/$ini.ini" --set run.output_dir="$TMP/$name-one" "$@"
  run1 "$name-two" "${MPI[@]}" "${C[@]}" train "$TMP/$ini.ini" --set run.output_dir="$TMP/$name-two" \
    --set train.per_device_train_batch_size=2 "$@"
  same_evals "$name-one" "$name-two" 2
  eval_split "$name-two" "$mine" "$all"
  keys "$name-two"
}

ini grpo grpo "[grpo]" "num_generations = 4" "max_completion_length = 8"
both grpo grpo 3 5
[ "$(grep -c '"eval_reward"' "$TMP/grpo-two/metrics.jsonl")" = 2 ] && ok || bad "grpo: rank 0 did not write 2 eval lines"
grep -q 'eval: mean reward .* (5 batches of 1 prompts)$' "$TMP/grpo-one.log" && ok || bad "grpo: one process's eval line has a note"
both grpo8 grpo 2 3 --set train.per_device_eval_batch_size=8
both grpo32 grpo 1 1 --set train.per_device_eval_batch_size=32
for g in true false; do
  run1 "grpo-z3$g" "${MPI[@]}" "${C[@]}" train "$TMP/grpo.ini" --set run.output_dir="$TMP/grpo-z3$g" \
    --set train.per_device_train_batch_size=2 --set memory.strategies=zero3 \
    --set generation.ds3_gather_for_generation=$g
  same_evals grpo-one "grpo-z3$g" 2
  eval_split "grpo-z3$g" 3 5
done
# the evaluations generate as the training does: a layer at a time (false) never gathers the whole model
grep -q "zero3: the whole model gathered on every rank 0 time(s)" "$TMP/grpo-z3false.log" && ok ||
  bad "grpo zero3, ds3_gather_for_generation = false: $(grep -o 'whole model gathered on every rank [0-9]* time' "$TMP/grpo-z3false.log")"

# server mode: one server; both runs evaluate what it generates from the same weights
PORT=$(free_port)
"${C[@]}" serve --model "$TMP/model" --port "$PORT" >"$TMP/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; rm -rf "$TMP"' EXIT
INI_GEN=$(printf 'mode = server\nserver_url = http://127.0.0.1:%s' "$PORT") \
  ini gsrv grpo "[grpo]" "num_generations = 4" "max_completion_length = 8"
both gsrv gsrv 3 5
run1 gsrv-z3 "${MPI[@]}" "${C[@]}" train "$TMP/gsrv.ini" --set run.output_dir="$TMP/gsrv-z3" \
  --set train.per_device_train_batch_size=2 --set memory.strategies=zero3
same_evals gsrv-one gsrv-z3 2
eval_split gsrv-z3 3 5
grep -q "zero3: the whole model gathered on every rank 0 time(s)" "$TMP/gsrv-z3.log" && ok ||
  bad "grpo zero3 server mode: $(grep -o 'whole model gathered on every rank [0-9]* time' "$TMP/gsrv-z3.log")"
kill $SERVER 2>/dev/null

ini rloo rloo "[rloo]" "num_generations = 4" "max_completion_length = 8"
both rloo rloo 3 5
ini odpo online_dpo "[online_dpo]" "max_new_tokens = 8"
both odpo odpo 2 3
INI_TARGET=6 ini ppo ppo "[ppo]" "response_length = 8"
both ppo ppo 3 5 --set train.per_device_eval_batch_size=1
# a rank whose scoring fails (a command reward that exits on rank 1, in the evaluation before the first
# step): the job ends with an error, rank 0's naming rank 1, never a hang
HELPER="$(dirname "${C[0]}")/reward_command_helper"
printf '[ "${OMPI_COMM_WORLD_RANK:-0}" = 1 ] && exit 3\nexec %s len8\n' "$HELPER" >"$TMP/rew.sh"
INI_TARGET= ini fail grpo "[reward.cmd]" "plugin = command" "command = sh $TMP/rew.sh" "[grpo]" "num_generations = 4" \
  "max_completion_length = 8"
if timeout 120 "${MPI[@]}" "${C[@]}" train "$TMP/fail.ini" --set train.per_device_train_batch_size=2 >"$TMP/fail.log" 2>&1; then
  bad "fail: a rank's failed evaluation did not fail the job"
else
  grep -q "rank 0: evaluation: rank 1 failed" "$TMP/fail.log" && grep -q "rank 1: reward 'cmd'" "$TMP/fail.log" && ok ||
    { bad "fail: no error naming rank 1"; tail -5 "$TMP/fail.log"; }
fi
finish
