#!/usr/bin/env bash
# Training health end to end (issue 15 item 5), for the shared step loop of every trainer kind:
# a model with no gradient left (every weight 0: a uniform distribution, grad_norm exactly 0, what a
# far too high learning rate can collapse a model to) -- the run goes on but warns once, clearly; a healthy run does not warn; a non-finite loss with no
# checkpoint yet stops the run (exit 1) saying so and saves no model; the online kind (GRPO) stops
# the same way. (A non-finite loss after a checkpoint keeps it intact: test_checkpoint.sh, case 7.)
# usage: test_train_health.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
export OMP_NUM_THREADS=1
tiny_setup 5 2
tiny_ini "$TMP/run.ini" "$TMP/ok" <<INI
learning_rate = 3e-3
lr_scheduler_type = constant
max_steps = 12
per_device_train_batch_size = 4
logging_steps = 2
save_strategy = no
INI
WARNING="grad_norm has been exactly 0 for the last"

# 1. A healthy run: no warning.
"${C[@]}" train "$TMP/run.ini" >"$TMP/log" 2>&1 && ok || { bad "healthy run"; tail -3 "$TMP/log"; }
grep -q "$WARNING" "$TMP/log" && bad "a healthy run warned of a zero gradient" || ok

# 2. A collapsed model (every weight zeroed in place: uniform logits, grad_norm exactly 0 from the
# first step): exit 0, one warning naming the steps and the cause. (It was lr 1e6 on the random model:
# whether that collapses or overflows is chaotic -- 1e4 and 1e6 collapse here, 1e5 goes non-finite,
# and another CPU's arithmetic flipped 1e6 in 4 of 8 runs.)
cp -r "$TMP/model" "$TMP/zero"
ST="$TMP/zero/model.safetensors"
HDR=$(od -An -tu8 -N8 "$ST" | tr -d ' ')
head -c $(($(stat -c %s "$ST") - 8 - HDR)) /dev/zero | dd of="$ST" bs=65536 seek=$((8 + HDR)) oflag=seek_bytes conv=notrunc 2>/dev/null
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/collapsed" --set model.path="$TMP/zero" >"$TMP/log" 2>&1 &&
  ok || { bad "collapsed run: exit $?"; tail -3 "$TMP/log"; }
[ "$(grep -c '"grad_norm": 0.000000' "$TMP/collapsed/metrics.jsonl")" -eq 6 ] && ok ||
  bad "the zeroed model did not keep grad_norm 0: $(cut -c1-80 "$TMP/collapsed/metrics.jsonl")"
[ "$(grep -c "$WARNING" "$TMP/log")" -eq 1 ] && grep "$WARNING" "$TMP/log" | grep -q "WARN" &&
  grep "$WARNING" "$TMP/log" | grep -q "3 logged windows" && grep "$WARNING" "$TMP/log" | grep -q "learning rate" &&
  ok || { bad "collapse warning (wanted exactly one)"; grep -c "$WARNING" "$TMP/log"; }

# 3. lr 1e30 from scratch: non-finite, no checkpoint to name, no model saved, exit 1.
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/nan" --set train.learning_rate=1e30 >"$TMP/log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "non-finite .*; stopping, nothing of this step is saved; no checkpoint was saved before it" "$TMP/log" &&
  [ ! -f "$TMP/nan/model.safetensors" ] && ok || { bad "non-finite from scratch: exit $rc"; tail -3 "$TMP/log"; }

# 4. The online kind goes through the same checks: GRPO at lr 1e30 stops with the same message.
cat >"$TMP/grpo.ini" <<INI
[run]
trainer = grpo
output_dir = $TMP/grpo
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train_prompts.jsonl
[train]
learning_rate = 1e30
lr_scheduler_type = constant
max_steps = 4
per_device_train_batch_size = 8
logging_steps = 1
save_strategy = no
[generation]
kv_cache_bytes = 8000000
[reward.len]
plugin = length
target_length = 8
[grpo]
num_generations = 4
max_completion_length = 8
INI
"${C[@]}" train "$TMP/grpo.ini" >"$TMP/log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "non-finite .*no checkpoint was saved before it" "$TMP/log" &&
  [ ! -f "$TMP/grpo/model.safetensors" ] && ok || { bad "grpo non-finite: exit $rc"; tail -3 "$TMP/log"; }
finish
