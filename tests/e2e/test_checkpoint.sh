#!/usr/bin/env bash
# Checkpoints end to end: a run resumed from checkpoint-4 logs exactly the uninterrupted run's
# metrics for steps 5..12 (the logging window open at the save and the eval_steps evaluations
# included); a checkpoint is written at the end (as the HF Trainer), save_total_limit keeps the
# newest, save_strategy = no writes none; kill -9 in the middle of a save, and at random moments,
# leaves only complete checkpoints, and `resume_from_checkpoint = last` continues the same curve;
# SIGINT and SIGTERM save a
# checkpoint and exit 130 (while the data loads: nothing is saved); a non-finite loss stops the run naming the last good checkpoint, which
# stays as it was; a missing or damaged checkpoint, or another optimizer, is a clear error; a save
# that fails for lack of space leaves the earlier checkpoints intact and the run resumable.
# usage: test_checkpoint.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
# ~40 short runs: one thread each keeps them quick beside parallel tests (the curves compared are
# all made with the same setting)
export OMP_NUM_THREADS=1
tiny_setup 5 2
head -40 "$TMP/data/eval.jsonl" >"$TMP/data/eval40.jsonl"
cat >"$TMP/run.ini" <<INI
[run]
output_dir = $TMP/full
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train.jsonl
eval_file = $TMP/data/eval40.jsonl
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
eval_steps = 4
INI
# metrics without the wall-clock rate, which no two runs share
curve() { sed 's/, "tokens_per_second": [0-9.]*//' "$1/metrics.jsonl" | grep '"step"'; }
same_curve() { # same_curve DIR WHAT: DIR's metrics equal the uninterrupted run's
  if diff <(curve "$TMP/full") <(curve "$1") >"$TMP/diff"; then ok; else
    bad "$2: curve differs"
    cat "$TMP/diff"
  fi
}
# every checkpoint-STEP directory in $1 holds everything a resume needs
all_complete() {
  local d f
  for d in "$1"/checkpoint-*; do
    [ -d "$d" ] || continue
    case "$d" in *.tmp-*) continue ;; esac
    for f in config.json model.safetensors tokenizer.json optimizer.safetensors trainer_state.json; do
      [ -s "$d/$f" ] || { echo "$d/$f missing"; return 1; }
    done
  done
}

# 1. The uninterrupted run: checkpoints at 4, 8 and 12 (the end), nothing temporary left.
"${C[@]}" train "$TMP/run.ini" >"$TMP/log" 2>&1 || { bad "full run"; tail -5 "$TMP/log"; }
all_complete "$TMP/full" && [ -d "$TMP/full/checkpoint-4" ] && [ -d "$TMP/full/checkpoint-8" ] &&
  [ -d "$TMP/full/checkpoint-12" ] && ok || bad "checkpoints missing: $(ls "$TMP/full")"
ls "$TMP/full" | grep -q tmp && bad "a temporary checkpoint was left behind" || ok
grep -q '"global_step":.*8,' "$TMP/full/checkpoint-8/trainer_state.json" &&
  grep -q '"epoch":' "$TMP/full/checkpoint-8/trainer_state.json" && ok || bad "trainer_state.json"
[ "$(grep -c '"eval_loss"' "$TMP/full/metrics.jsonl")" = 3 ] && ok || bad "eval_steps: $(grep eval_loss "$TMP/full/metrics.jsonl")"

# 2. Resume from checkpoint-4 in a fresh directory: steps 5..12 exactly as in the full run.
mkdir -p "$TMP/resumed" && cp -r "$TMP/full/checkpoint-4" "$TMP/resumed/"
grep '"step": [1-4],' "$TMP/full/metrics.jsonl" >"$TMP/resumed/metrics.jsonl" # the log as of step 4
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/resumed" --set train.resume_from_checkpoint=last \
  >"$TMP/log" 2>&1 || { bad "resume"; tail -5 "$TMP/log"; }
same_curve "$TMP/resumed" "resume from checkpoint-4"
grep -q "resuming from .*checkpoint-4 at step 4" "$TMP/log" && ok || bad "no resume message"
# ... and from an explicit path, over a metrics.jsonl that had run ahead of it
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/resumed" \
  --set train.resume_from_checkpoint="$TMP/full/checkpoint-8" >"$TMP/log" 2>&1 || { bad "resume (path)"; tail -5 "$TMP/log"; }
same_curve "$TMP/resumed" "resume from a path"

# 3. save_total_limit = 1 keeps only the newest checkpoint; save_strategy = no writes none.
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/limit" --set train.save_total_limit=1 >/dev/null 2>&1
[ "$(ls "$TMP/limit" | grep checkpoint)" = checkpoint-12 ] && ok || bad "save_total_limit: $(ls "$TMP/limit")"
# save_strategy = no: no checkpoint, the model still saved
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/nosave" --set train.save_strategy=no >/dev/null 2>&1
! ls "$TMP/nosave" | grep -q checkpoint && [ -f "$TMP/nosave/model.safetensors" ] && ok || bad "save_strategy = no: $(ls "$TMP/nosave")"

# 4. kill -9 while checkpoint-8 is being written (a test hook pauses between its files).
CTRL_TEST_SAVE_DELAY_MS=400 "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/killed" >"$TMP/log" 2>&1 &
pid=$!
for i in $(seq 200); do ls "$TMP/killed" 2>/dev/null | grep -q '^checkpoint-8\.tmp' && break; sleep 0.05; done
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
[ ! -d "$TMP/killed/checkpoint-8" ] && [ -f "$TMP/killed/checkpoint-4/trainer_state.json" ] &&
  all_complete "$TMP/killed" && ok || bad "kill mid-save: $(ls "$TMP/killed")"
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/killed" --set train.resume_from_checkpoint=last \
  >"$TMP/log" 2>&1 || { bad "resume after kill"; tail -5 "$TMP/log"; }
same_curve "$TMP/killed" "kill mid-save and resume"
ls "$TMP/killed" | grep -q tmp && bad "stale temporary checkpoint kept" || ok

# 5. kill -9 at random moments of a run that saves every step (limit 2: older checkpoints are
#    removed while it runs): only complete checkpoints, and resuming gives the same curve.
for round in 1 2 3 4 5 6; do
  out="$TMP/random$round"
  CTRL_TEST_SAVE_DELAY_MS=20 "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$out" --set train.save_steps=1 \
    --set train.save_total_limit=2 >"$TMP/log" 2>&1 &
  pid=$!
  # from the first checkpoint on (a loaded machine runs slower), a random 0..400 ms later
  for i in $(seq 300); do [ -d "$out/checkpoint-1" ] && break; sleep 0.02; done
  sleep "0.$(printf %03d $((RANDOM % 400)))"
  kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
  all_complete "$out" && ok || bad "random kill $round: $(ls "$out")"
  resume=()
  ls -d "$out"/checkpoint-* 2>/dev/null | grep -qv tmp && resume=(--set train.resume_from_checkpoint=last)
  "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$out" "${resume[@]}" >"$TMP/log" 2>&1 ||
    { bad "random kill $round: resume"; tail -3 "$TMP/log"; }
  same_curve "$out" "random kill $round"
done

# 6. SIGINT and SIGTERM: the step finishes, a checkpoint is saved, exit 130; resuming continues.
for sig in INT TERM; do
  out="$TMP/sig$sig"
  "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$out" --set train.max_steps=100000 --set train.save_steps=0 \
    >"$TMP/log" 2>&1 &
  pid=$!
  for i in $(seq 100); do [ -s "$out/metrics.jsonl" ] && break; sleep 0.1; done
  kill -$sig $pid
  wait $pid
  rc=$?
  ckpt=$(ls -d "$out"/checkpoint-* 2>/dev/null | head -1)
  [ $rc -eq 130 ] && [ -n "$ckpt" ] && [ -f "$ckpt/trainer_state.json" ] && [ -f "$out/model.safetensors" ] &&
    grep -q "interrupted after step" "$TMP/log" && ok || { bad "SIG$sig: exit $rc, $ckpt"; tail -3 "$TMP/log"; }
  step=${ckpt##*-}
  "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$out" --set train.max_steps=$((step + 2)) \
    --set train.resume_from_checkpoint=last --set train.logging_steps=1 >"$TMP/log" 2>&1 && ok ||
    { bad "resume after SIG$sig"; tail -3 "$TMP/log"; }
  grep -q "\"step\": $((step + 2))," "$out/metrics.jsonl" && ok || bad "no step $((step + 2)) after SIG$sig"
done

# 7. A non-finite loss (the learning rate raised to 1e30 after checkpoint-4) stops the run with a
#    message naming the last good checkpoint, which is left as it was; no model is saved.
mkdir -p "$TMP/nan" && cp -r "$TMP/full/checkpoint-4" "$TMP/nan/"
sums() { (cd "$TMP/nan/checkpoint-4" && md5sum *); }
before=$(sums)
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/nan" --set train.resume_from_checkpoint=last \
  --set train.learning_rate=1e30 --set train.save_steps=0 >"$TMP/log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "non-finite .*the last good checkpoint, $TMP/nan/checkpoint-4, is intact" "$TMP/log" &&
  [ "$(sums)" = "$before" ] && [ ! -f "$TMP/nan/model.safetensors" ] && ok ||
  { bad "non-finite loss: exit $rc"; tail -3 "$TMP/log"; }
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/nan" --set train.resume_from_checkpoint=last \
  >"$TMP/log" 2>&1 || { bad "resume after a non-finite loss"; tail -3 "$TMP/log"; }

# 7b. SIGINT while the data is still loading (a long row being tokenized): exit 130 saying nothing
#     was saved, and output_dir is left as it was -- no model of the initial weights written over it.
row="{\"text\": \"$(printf 'ab cd %.0s' $(seq 20000))\"}"
for i in $(seq 400); do echo "$row"; done >"$TMP/data/big.jsonl"
mkdir -p "$TMP/loading" && echo keep >"$TMP/loading/model.safetensors"
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/loading" --set data.train_file="$TMP/data/big.jsonl" \
  --set data.max_length=64 >"$TMP/log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "effective config written" "$TMP/log" && break; sleep 0.1; done
sleep 0.3
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] && grep -q "interrupted before a step was trained: nothing saved" "$TMP/log" &&
  [ "$(cat "$TMP/loading/model.safetensors")" = keep ] && [ ! -d "$TMP/loading/checkpoint-0" ] && ok ||
  { bad "SIGINT while loading: exit $rc"; tail -3 "$TMP/log"; }

# 8. Errors: no checkpoint to resume, a directory that is not one, another optimizer, a damaged state.
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/none" --set train.resume_from_checkpoint=last >"$TMP/log" 2>&1
[ $? -ne 0 ] && grep -q "no complete checkpoint" "$TMP/log" && ok || bad "resume with nothing to resume"
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/none" --set train.resume_from_checkpoint="$TMP/data" >"$TMP/log" 2>&1
[ $? -ne 0 ] && grep -q "not a complete checkpoint" "$TMP/log" && ok || bad "resume from a non-checkpoint"
# ... with another optimizer, or from a damaged trainer_state.json
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/none" --set train.resume_from_checkpoint="$TMP/full/checkpoint-4" \
  --set train.optimizer=sgd >"$TMP/log" 2>&1
[ $? -ne 0 ] && grep -q "made with optimizer 'adamw', \[train\] optimizer = sgd" "$TMP/log" && ok ||
  { bad "resume with another optimizer"; tail -2 "$TMP/log"; }
mkdir -p "$TMP/damaged" && cp -r "$TMP/full/checkpoint-4" "$TMP/damaged/"
sed -i 's/"cursor":.*/"cursor": -3,/' "$TMP/damaged/checkpoint-4/trainer_state.json"
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/damaged" --set train.resume_from_checkpoint=last >"$TMP/log" 2>&1
[ $? -ne 0 ] && grep -q "checkpoint-4/trainer_state.json: not a ctrl trainer state (cursor: missing or invalid)" "$TMP/log" && ok ||
  { bad "resume from a damaged trainer_state.json"; tail -2 "$TMP/log"; }

# 9. Disk full during a save (issue 15: "held perfectly -- keep it so"): with a file-size limit
#    smaller than model.safetensors (RLIMIT_FSIZE: writes past it fail as on a full disk), saving
#    checkpoint-8 fails with an error naming the file and exit 1; nothing of checkpoint-8 is left,
#    checkpoint-4 is as it was, and a resume without the limit completes the run.
mkdir -p "$TMP/diskfull" && cp -r "$TMP/full/checkpoint-4" "$TMP/diskfull/"
sums_df() { (cd "$TMP/diskfull/checkpoint-4" && md5sum *); }
before=$(sums_df)
(
  trap '' XFSZ
  ulimit -f 40
  exec "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/diskfull" --set train.resume_from_checkpoint=last
) >"$TMP/log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "checkpoint-8.tmp-[0-9]*/model.safetensors: cannot write" "$TMP/log" &&
  [ -z "$(ls -d "$TMP/diskfull"/checkpoint-8* 2>/dev/null)" ] && [ "$(sums_df)" = "$before" ] && ok ||
  { bad "disk full during a save: exit $rc, $(ls "$TMP/diskfull")"; tail -3 "$TMP/log"; }
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/diskfull" --set train.resume_from_checkpoint=last \
  >"$TMP/log" 2>&1 && all_complete "$TMP/diskfull" && [ -d "$TMP/diskfull/checkpoint-12" ] &&
  [ -f "$TMP/diskfull/model.safetensors" ] && ok || { bad "resume after a failed save"; tail -3 "$TMP/log"; }

finish
