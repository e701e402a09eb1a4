#!/usr/bin/env bash
# The online trainers over MPI (fp32): 2 ranks x 2 prompts per micro-batch follow 1 process x 4 step
# for step, loss and grad_norm within 1e-5 relative (metrics.jsonl's six digits are 1.4e-6 apart at
# 0.7: tighter fails on rounding alone, as online DPO's 1e-6 did on an AMX host), the trainers' metrics within 1e-4
# relative or 1e-6 absolute (objective/kl is a small difference of log-probs).
#   online_dpo: each rank samples and scores half of the prompts, every pair stays on one rank.
#   gkd (lmbda 0.5: on-policy and dataset micro-batches): rank r's micro-batch g is its part of one
#     process's micro-batch g, with the same draw and the same sampling seeds.
#   gkd in server mode: `ctrl serve` gets one weight push at the start and one a step (from rank 0;
#     /health's weight_updates), and then generates what the saved student does.
#   ppo: every rank holds the whole generation batch's log-probs, values and rollout (GAE and
#     whitening over the batch); the value model's gradients are averaged as the policy's.
# usage: test_online_mpi.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
tiny_setup 7 2
tiny_teacher

# pair NAME TRAINER [LINE...]: online_ini's run of TRAINER (STEPS steps, 6 unless set; fp32, no eval
# set) on 1 rank with 4 prompts per micro-batch, then on 2 ranks with 2 each
pair() {
  local name=$1 trainer=$2
  shift 2
  INI_TRAIN="dtype = fp32" online_ini "$trainer" "${name}1" "${STEPS:-6}" "$@" | sed '/^eval_file = /d' >"$TMP/$name.ini"
  "${C[@]}" train "$TMP/$name.ini" >"$TMP/$name.log1" 2>&1 && ok || { bad "$name: 1 rank"; tail -5 "$TMP/$name.log1"; }
  "${MPI[@]}" "${C[@]}" train "$TMP/$name.ini" --set run.output_dir="$TMP/${name}2" \
    --set train.per_device_train_batch_size=2 >"$TMP/$name.log2" 2>&1 && ok ||
    { bad "$name: 2 ranks"; tail -20 "$TMP/$name.log2"; }
}
# same NAME RELATIVE ABSOLUTE KEY...: each KEY's curve of the 2-rank run follows the 1-rank run's
same() {
  local name=$1 rel=$2 abs=$3 k
  shift 3
  for k in "$@"; do curve_close "$TMP/${name}1" "$TMP/${name}2" "$k" "$rel" "$abs"; done
}

pair odpo online_dpo "[online_dpo]" "max_new_tokens = 12" "missing_eos_penalty = 0.5"
same odpo 1e-5 1e-7 loss grad_norm
same odpo 1e-4 1e-6 objective/scores objective/scores_margin val/contain_eos_token objective/kl objective/entropy \
  rewards/chosen rewards/rejected rewards/margins rewards/accuracies logps/chosen

INI_DATA=rows INI_TARGET= INI_MODEL=$'[teacher]\npath = '"$TMP/teacher" \
  pair gkd gkd "[gkd]" "lmbda = 0.5" "max_new_tokens = 4"
same gkd 1e-5 1e-7 loss grad_norm
same gkd 1e-4 1e-6 on_policy
grep -q '"on_policy": 0.5' "$TMP/gkd1/metrics.jsonl" && ok || bad "gkd: no step mixes on-policy and dataset micro-batches"

# gkd in server mode on 2 ranks: the server gets the weights once at the start and once a step (rank
# 0 pushes, the other rank waits), not once per rank; after training it generates what the saved
# student does.
PORT=$(free_port)
"${C[@]}" serve --model "$TMP/model" --port "$PORT" >"$TMP/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; rm -rf "$TMP"' EXIT
INI_DATA=rows INI_TARGET= INI_MODEL=$'[teacher]\npath = '"$TMP/teacher" INI_TRAIN="dtype = fp32" \
  INI_GEN=$(printf 'mode = server\nserver_url = http://127.0.0.1:%s' "$PORT") \
  online_ini gkd gsrv 3 "[gkd]" "lmbda = 1" "max_new_tokens = 4" | sed '/^eval_file = /d' >"$TMP/gsrv.ini"
"${MPI[@]}" "${C[@]}" train "$TMP/gsrv.ini" --set train.per_device_train_batch_size=2 >"$TMP/gsrv.log" 2>&1 && ok ||
  { bad "gkd server mode: 2 ranks"; tail -20 "$TMP/gsrv.log"; }
n=$(curl -s "localhost:$PORT/health" | sed -n 's/.*"weight_updates":\([0-9]*\).*/\1/p')
[ "$n" = 4 ] && ok || bad "gkd server mode: the server got '$n' weight pushes from 2 ranks x 3 steps, want 4 (start + 3 steps)"
server_greedy_same "$PORT" "$TMP/gsrv" 8 "gkd server mode, 2 ranks"
kill $SERVER 2>/dev/null

# 12 steps: 6 generation batches of 2 epochs (the rollout's and the updates' metrics are logged once
# a generation batch)
STEPS=12 INI_TARGET=6 pair ppo ppo "[ppo]" "response_length = 8" "num_ppo_epochs = 2" "kl_estimator = k3"
same ppo 1e-5 1e-7 loss grad_norm loss/value_avg value_model/grad_norm
same ppo 1e-4 1e-6 objective/scores objective/kl objective/entropy objective/rlhf_reward policy/approxkl_avg \
  policy/clipfrac_avg loss/policy_avg val/clipfrac_avg val/ratio
finish
