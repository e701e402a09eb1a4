#!/usr/bin/env bash
# Online DPO over MPI: 2 ranks x 2 prompts per micro-batch follow 1 process x 4 (fp32): each rank
# samples and scores half of the prompts, every pair stays on one rank, the gradients are averaged,
# the metrics gathered; loss and grad_norm to 1e-6, TRL's metrics to float rounding.
# usage: test_online_dpo_mpi.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
tiny_setup 7 2
cat >"$TMP/o.ini" <<INI
[run]
trainer = online_dpo
output_dir = $TMP/o1
seed = 3
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train_prompts.jsonl
[train]
learning_rate = 3e-3
lr_scheduler_type = constant
max_steps = 4
per_device_train_batch_size = 4
gradient_accumulation_steps = 2
logging_steps = 1
save_strategy = no
dtype = fp32
[generation]
kv_cache_bytes = 8000000
[reward.len]
plugin = length
target_length = 8
[online_dpo]
max_new_tokens = 12
missing_eos_penalty = 0.5
INI
"${C[@]}" train "$TMP/o.ini" >"$TMP/log1" 2>&1 && ok || { bad "1 rank"; tail -5 "$TMP/log1"; }
"${MPI[@]}" "${C[@]}" train "$TMP/o.ini" --set run.output_dir="$TMP/o2" --set train.per_device_train_batch_size=2 \
  >"$TMP/log2" 2>&1 && ok || { bad "2 ranks"; tail -20 "$TMP/log2"; }
col() { grep -o "\"$2\": [-0-9.e]*" "$TMP/$1/metrics.jsonl" | awk '{print $2}'; }
# close NAME REL ABS: every step's value of NAME within REL relative or ABS absolute
close() {
  local a b
  a=$(col o1 "$1") b=$(col o2 "$1")
  [ -n "$a" ] && [ "$(echo "$a" | wc -l)" = 4 ] &&
    paste <(echo "$a") <(echo "$b") | awk -v r="$2" -v e="$3" '{ d = $1 - $2; if (d < 0) d = -d; m = $1 < 0 ? -$1 : $1;
      if (d > r * m && d > e) exit 1 }' && ok || bad "$1: 1 rank $(echo $a) vs 2 ranks $(echo $b)"
}
close loss 1e-6 1e-7
close grad_norm 1e-6 1e-7
for k in objective/scores objective/scores_margin val/contain_eos_token objective/kl objective/entropy \
  rewards/chosen rewards/rejected rewards/margins rewards/accuracies logps/chosen; do
  close "$k" 1e-4 1e-6
done
finish
