#!/usr/bin/env bash
# Checkpoints end to end: a run resumed from checkpoint-4 logs exactly the uninterrupted run's
# metrics for steps 5..12 (the logging window open at the save included); save_total_limit keeps the
# newest; kill -9 in the middle of a save leaves the previous checkpoint complete and resumable;
# SIGINT saves a checkpoint, exits 130, and `resume_from_checkpoint = last` continues from it; a
# missing checkpoint is a clear error.
# usage: test_checkpoint.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
tiny_setup 5 2
cat >"$TMP/run.ini" <<INI
[run]
output_dir = $TMP/full
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train.jsonl
[train]
learning_rate = 3e-3
lr_scheduler_type = cosine
warmup_steps = 2
weight_decay = 0.01
max_steps = 12
per_device_train_batch_size = 4
gradient_accumulation_steps = 2
logging_steps = 3
save_steps = 4
INI
# metrics without the wall-clock rate, which no two runs share
curve() { sed 's/, "tokens_per_second": [0-9.]*//' "$1/metrics.jsonl" | grep '"step"'; }

# 1. The uninterrupted run, saving at 4 and 8 (and keeping both).
"${C[@]}" train "$TMP/run.ini" >"$TMP/log" 2>&1 || { bad "full run"; tail -5 "$TMP/log"; }
[ -f "$TMP/full/checkpoint-4/trainer_state.json" ] && [ -f "$TMP/full/checkpoint-8/optimizer.safetensors" ] &&
  [ -f "$TMP/full/checkpoint-8/model.safetensors" ] && [ -f "$TMP/full/checkpoint-8/tokenizer.json" ] && ok ||
  bad "checkpoints missing: $(ls "$TMP/full")"
ls "$TMP/full" | grep -q tmp && bad "a temporary checkpoint was left behind" || ok

# 2. Resume from checkpoint-4 in a fresh directory: steps 5..12 exactly as in the full run.
mkdir -p "$TMP/resumed" && cp -r "$TMP/full/checkpoint-4" "$TMP/resumed/"
head -1 "$TMP/full/metrics.jsonl" >"$TMP/resumed/metrics.jsonl" # the log the run had written by step 4
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/resumed" --set train.resume_from_checkpoint=last \
  >"$TMP/log" 2>&1 || { bad "resume"; tail -5 "$TMP/log"; }
if diff <(curve "$TMP/full") <(curve "$TMP/resumed") >"$TMP/diff"; then ok; else
  bad "resumed curve differs"; cat "$TMP/diff"; fi
grep -q "resuming from .*checkpoint-4 at step 4" "$TMP/log" && ok || bad "no resume message"

# 3. save_total_limit = 1 keeps only the newest checkpoint.
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/limit" --set train.save_total_limit=1 >/dev/null 2>&1
[ ! -d "$TMP/limit/checkpoint-4" ] && [ -d "$TMP/limit/checkpoint-8" ] && ok || bad "save_total_limit: $(ls "$TMP/limit")"

# 4. kill -9 while checkpoint-8 is being written (a test hook slows the save down).
CTRL_TEST_SAVE_DELAY_MS=400 "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/killed" >"$TMP/log" 2>&1 &
pid=$!
for i in $(seq 200); do ls "$TMP/killed" 2>/dev/null | grep -q '^checkpoint-8\.tmp' && break; sleep 0.05; done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
[ ! -d "$TMP/killed/checkpoint-8" ] && [ -f "$TMP/killed/checkpoint-4/trainer_state.json" ] && ok ||
  bad "kill mid-save: $(ls "$TMP/killed")"
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/killed" --set train.resume_from_checkpoint=last \
  >"$TMP/log" 2>&1 || { bad "resume after kill"; tail -5 "$TMP/log"; }
if diff <(curve "$TMP/full") <(curve "$TMP/killed") >"$TMP/diff"; then ok; else
  bad "curve after kill and resume differs"; cat "$TMP/diff"; fi
ls "$TMP/killed" | grep -q tmp && bad "stale temporary checkpoint kept" || true

# 5. SIGINT: the step finishes, a checkpoint is saved, exit 130; resuming continues from it.
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/int" --set train.max_steps=100000 --set train.save_steps=0 \
  >"$TMP/log" 2>&1 &
pid=$!
for i in $(seq 100); do [ -s "$TMP/int/metrics.jsonl" ] && break; sleep 0.1; done
kill -INT $pid
wait $pid
rc=$?
ckpt=$(ls -d "$TMP"/int/checkpoint-* 2>/dev/null | head -1)
[ $rc -eq 130 ] && [ -n "$ckpt" ] && [ -f "$ckpt/trainer_state.json" ] && ok || { bad "SIGINT: exit $rc, $ckpt"; tail -3 "$TMP/log"; }
step=${ckpt##*-}
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/int" --set train.max_steps=$((step + 2)) \
  --set train.resume_from_checkpoint=last --set train.logging_steps=1 >"$TMP/log" 2>&1 && ok || { bad "resume after SIGINT"; tail -3 "$TMP/log"; }
grep -q "\"step\": $((step + 2))," "$TMP/int/metrics.jsonl" && ok || bad "no step $((step + 2)) after resuming"

# 6. Errors: no checkpoint to resume, or a directory that is not one.
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/none" --set train.resume_from_checkpoint=last >"$TMP/log" 2>&1
[ $? -ne 0 ] && grep -q "no complete checkpoint" "$TMP/log" && ok || bad "resume with nothing to resume"
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/none" --set train.resume_from_checkpoint="$TMP/data" >"$TMP/log" 2>&1
[ $? -ne 0 ] && grep -q "not a complete checkpoint" "$TMP/log" && ok || bad "resume from a non-checkpoint"

finish
