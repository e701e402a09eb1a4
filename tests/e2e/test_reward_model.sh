#!/usr/bin/env bash
# GRPO and RLOO against a learned reward: [reward.rm] plugin = reward_model with the tiny
# Qwen2ForSequenceClassification of tests/fixtures/score/qwen2 (the tiny_bpe vocabulary) as the
# reward. A few steps each: the runs finish, log rewards/rm/mean and rewards/rm/std (finite, and
# the reward is the model's, not a constant), and completions.jsonl carries the rm scores.
# usage: test_reward_model.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
tiny_setup 7 1

rm_ini() {
  cat <<INI
[run]
trainer = $1
output_dir = $TMP/$1
seed = 3
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train_prompts.jsonl
[train]
learning_rate = 1e-3
max_steps = 3
per_device_train_batch_size = 8
logging_steps = 1
save_strategy = no
[generation]
kv_cache_bytes = 8000000
log_completions = true
[reward.rm]
plugin = reward_model
path = $SRC/tests/fixtures/score/qwen2
tokenizer = $SRC/tests/fixtures/tokenizer/tiny_bpe
batch_size = 5
[$1]
num_generations = 4
max_completion_length = 8
INI
}

for trainer in grpo rloo; do
  rm_ini $trainer >"$TMP/$trainer.ini"
  if "${C[@]}" train "$TMP/$trainer.ini" >"$TMP/$trainer.log" 2>&1; then ok; else bad "$trainer run"; tail -5 "$TMP/$trainer.log"; continue; fi
  M=$TMP/$trainer/metrics.jsonl
  for k in rewards/rm/mean rewards/rm/std reward; do
    grep -q "\"$k\": -\?[0-9]" "$M" && ok || bad "$trainer: metric $k missing or not a number in $M"
  done
  # the scores vary from completion to completion (a model, not a constant)
  n=$(grep -o '"rm":[-0-9.e]*' "$TMP/$trainer/completions.jsonl" | sort -u | wc -l)
  [ "$n" -gt 4 ] && ok || bad "$trainer: only $n distinct rm scores in completions.jsonl"
done

# A causal LM as the reward model: the config error names the section.
rm_ini grpo | sed "s#^path = $SRC/tests/fixtures/score/qwen2#path = $TMP/model#" >"$TMP/bad.ini"
if "${C[@]}" train "$TMP/bad.ini" >"$TMP/bad.log" 2>&1; then bad "a causal LM as reward model ran"; else
  grep -q "reward.rm" "$TMP/bad.log" && grep -q "not a reward model" "$TMP/bad.log" && ok || { bad "unclear error"; cat "$TMP/bad.log"; }
fi
finish
