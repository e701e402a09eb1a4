#!/usr/bin/env bash
# Training from parquet end to end on the CPU: SFT on a `datasets`-written parquet file (a
# conversational `messages` column, several row groups) gives the same loss curve as the same rows
# in JSONL (tests/reference/make_parquet_fixtures.py wrote both), and so do a `datasets`
# save_to_disk folder (Arrow IPC), DPO on a zstd preference file and GRPO on a prompt file; a Hub dataset id trains from a local Hugging Face cache; `ctrl config check`
# verifies the files a config names, each problem at file:line and the key.
# usage: test_parquet_train.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/../e2e/e2e_common.sh"
tiny_setup 7 1
FX=$SRC/tests/fixtures/parquet
tiny_ini "$TMP/run.ini" "$TMP/out" <<INI
learning_rate = 3e-3
max_steps = 6
per_device_train_batch_size = 4
logging_steps = 1
INI
run() { # NAME TRAIN_FILE [--set ...]
  "${C[@]}" train "$TMP/run.ini" --set data.train_file="$2" --set run.output_dir="$TMP/$1" --set data.max_length=64 "${@:3}" >"$TMP/$1.log" 2>&1 ||
    { bad "train $1 exited $?"; tail -5 "$TMP/$1.log"; }
}
run sft_jsonl "$FX/arithmetic.jsonl"
run sft_parquet "$FX/arithmetic.parquet"
curve_close "$TMP/sft_jsonl" "$TMP/sft_parquet" loss 0 0
curve_close "$TMP/sft_jsonl" "$TMP/sft_parquet" num_tokens 0 0

# a `datasets` save_to_disk folder (Arrow IPC; its train/ folder): the same rows as sft_messages.jsonl
run chat_jsonl "$FX/sft_messages.jsonl"
run chat_arrow "$SRC/tests/fixtures/arrow/chat_dict"
curve_close "$TMP/chat_jsonl" "$TMP/chat_arrow" loss 0 0

DPO=(--set run.trainer=dpo --set data.max_length=48)
run dpo_jsonl "$FX/preference.jsonl" "${DPO[@]}"
run dpo_parquet "$FX/preference.parquet" "${DPO[@]}"
curve_close "$TMP/dpo_jsonl" "$TMP/dpo_parquet" loss 0 0

# GRPO's prompts (and their other columns, for the rewards) from parquet: the JSONL run's curves
INI_BATCH=8 online_ini grpo grpo 6 "[grpo]" "num_generations = 4" "max_completion_length = 12" >"$TMP/grpo.ini"
for f in jsonl parquet; do
  "${C[@]}" train "$TMP/grpo.ini" --set data.train_file="$FX/prompt_completion.$f" --set run.output_dir="$TMP/grpo_$f" \
    >"$TMP/grpo_$f.log" 2>&1 || { bad "grpo from $f"; tail -3 "$TMP/grpo_$f.log"; }
done
curve_close "$TMP/grpo_jsonl" "$TMP/grpo_parquet" loss 0 0
curve_close "$TMP/grpo_jsonl" "$TMP/grpo_parquet" reward 0 0

# A Hub dataset id: datasets--org--arith in HF_HOME/hub, the train split's shard under data/.
snap=$TMP/hf/hub/datasets--org--arith/snapshots/5e6f
mkdir -p "$snap/data" "$TMP/hf/hub/datasets--org--arith/refs"
echo 5e6f >"$TMP/hf/hub/datasets--org--arith/refs/main"
cp "$FX/arithmetic.parquet" "$snap/data/train-00000-of-00001.parquet"
cp "$FX/prompt_completion.parquet" "$snap/data/test-00000-of-00001.parquet"
HF_HOME="$TMP/hf" run sft_hub org/arith
curve_close "$TMP/sft_jsonl" "$TMP/sft_hub" loss 0 0
HF_HOME="$TMP/hf" run sft_hub_eval org/arith --set data.eval_file=org/arith --set train.eval_steps=3 --set train.max_steps=3
grep -q '"eval_loss"' "$TMP/sft_hub_eval/metrics.jsonl" 2>/dev/null && ok || bad "no eval on the Hub id's test split"

HF_HOME="$TMP/hf" run sft_hub_subset org/arith --set data.subset=default # push_to_hub's default config: data/
curve_close "$TMP/sft_jsonl" "$TMP/sft_hub_subset" loss 0 0

# config check: the files a config names.
"${C[@]}" config check "$TMP/run.ini" >"$TMP/check.log" 2>&1 && ok || { bad "config check of a good config"; cat "$TMP/check.log"; }
sed "s#^train_file = .*#train_file = $TMP/none.parquet#" "$TMP/run.ini" >"$TMP/bad.ini"
"${C[@]}" config check "$TMP/bad.ini" --set model.path="$TMP/nomodel" >"$TMP/check.log" 2>&1
[ $? -eq 2 ] && grep -q -- "--set model.path: \[model\] path = $TMP/nomodel: no such model directory" "$TMP/check.log" &&
  grep -q "bad.ini:7: \[data\] train_file = $TMP/none.parquet: .*no such file or folder" "$TMP/check.log" &&
  ok || { bad "config check of missing files"; cat "$TMP/check.log"; }
HF_HOME="$TMP/hf" "${C[@]}" config check "$TMP/run.ini" --set data.train_file=org/arith --set data.split=validation \
  >"$TMP/check.log" 2>&1
[ $? -eq 2 ] && grep -q "no data files of split 'validation' (splits found: test, train)" "$TMP/check.log" && ok ||
  { bad "config check of a missing split"; cat "$TMP/check.log"; }
# a reward model's path, and a chat template that is not there
"${C[@]}" config check "$TMP/run.ini" --set run.trainer=grpo --set data.train_file="$TMP/data/train_prompts.jsonl" \
  --set reward.rm.plugin=reward_model --set reward.rm.path="$TMP/norm" --set data.chat_template_path="$TMP/no.jinja" \
  >"$TMP/check.log" 2>&1
[ $? -eq 2 ] && grep -q -- "--set reward.rm.path: \[reward.rm\] path = $TMP/norm: no such model directory" "$TMP/check.log" &&
  grep -q "chat_template_path = $TMP/no.jinja: $TMP/no.jinja: no such file" "$TMP/check.log" && ok ||
  { bad "config check of a reward model and a template"; cat "$TMP/check.log"; }
HF_HOME="$TMP/hf" "${C[@]}" config check "$TMP/run.ini" --set data.train_file=org/arith --set data.subset=nope \
  >"$TMP/check.log" 2>&1
[ $? -eq 2 ] && grep -q "no data files in the folder of subset 'nope' (folders: data)" "$TMP/check.log" && ok ||
  { bad "config check of a missing subset"; cat "$TMP/check.log"; }
# a split for one file would do nothing: refused
"${C[@]}" config check "$TMP/run.ini" --set data.split=test >"$TMP/check.log" 2>&1
[ $? -eq 2 ] && grep -q -- "--set data.split: \[data\] split = test: \[data\] train_file = .* is one file" "$TMP/check.log" &&
  ok || { bad "a split for one file"; cat "$TMP/check.log"; }
"${C[@]}" config check "$TMP/run.ini" --set model.path="$TMP/nomodel" --no-files >/dev/null 2>&1 && ok ||
  bad "config check --no-files still looked at the files"
finish
