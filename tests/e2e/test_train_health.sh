#!/usr/bin/env bash
# Training health end to end (issue 15 item 5), for the shared step loop of every trainer kind:
# a learning rate of 1e6 collapses the model to a uniform distribution with grad_norm exactly 0 --
# the run goes on but warns once, clearly; a healthy run does not warn; a non-finite loss with no
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

# 2. lr 1e6: collapsed (grad_norm 0 in the metrics), exit 0, one warning naming the steps and the cause.
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/collapsed" --set train.learning_rate=1e6 >"$TMP/log" 2>&1 &&
  ok || { bad "collapsed run: exit $?"; tail -3 "$TMP/log"; }
[ "$(grep -c '"grad_norm": 0.000000' "$TMP/collapsed/metrics.jsonl")" -ge 3 ] && ok ||
  bad "lr 1e6 did not collapse to grad_norm 0: $(cut -c1-80 "$TMP/collapsed/metrics.jsonl")"
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
