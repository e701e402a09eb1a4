#!/usr/bin/env bash
# The ppo trainer end to end (arguments: CTRL_BINARY PLUGIN_DIR SOURCE_DIR): a tiny model trained
# with a value model beside it, generation co-located and from `ctrl serve` (the same first step),
# sleep mode, LoRA, TRL's metric names in metrics.jsonl, a value_model directory, bad [ppo]
# options refused naming the key, and checkpoints that hold the value model (resume on the same curve).
source "$(dirname "$0")/e2e_common.sh"
tiny_setup 11 2

ppo_ini() {
  local out=$1 steps=$2
  shift 2
  INI_TARGET=6 online_ini ppo "$out" "$steps" "[ppo]" "response_length = 10" "num_ppo_epochs = 2" "$@"
}

ppo_ini ppo 6 "stop_token = eos" "kl_estimator = k3" "missing_eos_penalty = 0.5" >"$TMP/ppo.ini"
if "${C[@]}" train "$TMP/ppo.ini" --set train.dtype=fp32 >"$TMP/ppo.log" 2>&1; then ok; else bad "ppo run"; tail -5 "$TMP/ppo.log"; fi
M=$TMP/ppo/metrics.jsonl
for k in objective/kl objective/entropy objective/non_score_reward objective/rlhf_reward objective/scores \
  policy/approxkl_avg policy/clipfrac_avg loss/policy_avg loss/value_avg val/clipfrac_avg policy/entropy_avg \
  val/ratio val/ratio_var val/num_eos_tokens value_model/grad_norm; do
  grep -q "\"$k\": " "$M" && ok || bad "metric $k missing from $M"
done
grep -q '"eval_reward": ' "$M" && ok || bad "no eval_reward line"
grep -q "value model: .*fresh value head" "$TMP/ppo.log" && ok || bad "the log does not say which value model"
[ -f "$TMP/ppo/model.safetensors" ] && ok || bad "no policy saved"

# a value model directory (here the tiny model again: a causal LM gets a fresh value head), with
# no stop token, whitened rewards and k1
ppo_ini vm 2 "value_model = $TMP/model" "whiten_rewards = true" >"$TMP/vm.ini"
if "${C[@]}" train "$TMP/vm.ini" >"$TMP/vm.log" 2>&1; then ok; else bad "ppo with value_model"; tail -5 "$TMP/vm.log"; fi

PORT=$(free_port)
"${C[@]}" serve --model "$TMP/model" --port "$PORT" >"$TMP/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; rm -rf "$TMP"' EXIT
ppo_ini srv 2 "stop_token = eos" >"$TMP/srv.ini"
printf 'mode = server\nserver_url = http://127.0.0.1:%s\n' "$PORT" >"$TMP/gen.txt"
sed -i "/^\[generation\]$/r $TMP/gen.txt" "$TMP/srv.ini"
if "${C[@]}" train "$TMP/srv.ini" >"$TMP/srv.log" 2>&1; then ok; else bad "server-mode ppo run"; tail -5 "$TMP/srv.log"; fi
grep -q "ctrl serve at" "$TMP/srv.log" && ok || bad "server mode did not say where it generates"
grep -q '"loss/value_avg": ' "$TMP/srv/metrics.jsonl" && ok || bad "server-mode ppo logs no value loss"
# the first step from the server's samples is the colocated run's (same seed, same initial weights;
# the colocated one with the engine asleep while training)
ppo_ini ref 2 "stop_token = eos" >"$TMP/ref.ini"
"${C[@]}" train "$TMP/ref.ini" --set generation.sleep=1 >"$TMP/ref.log" 2>&1 && ok || bad "colocated reference run (sleep mode)"
for k in loss objective/scores loss/value_avg; do
  a=$(grep -o "\"$k\": [-0-9.e]*" "$TMP/ref/metrics.jsonl" | head -n 1)
  b=$(grep -o "\"$k\": [-0-9.e]*" "$TMP/srv/metrics.jsonl" | head -n 1)
  [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "server-mode first step $b, colocated $a"
done
kill $SERVER 2>/dev/null

# LoRA: the reference is the policy with its adapters off, so the first batch's KL is 0; the value
# model trains in full beside the adapters, and the adapters are what is saved
ppo_ini lora 2 "[peft]" "enabled = true" "lora_dropout = 0" >"$TMP/lora.ini"
if "${C[@]}" train "$TMP/lora.ini" >"$TMP/lora.log" 2>&1; then ok; else bad "lora run"; tail -5 "$TMP/lora.log"; fi
grep -q '"objective/kl": 0,' "$TMP/lora/metrics.jsonl" && ok || bad "LoRA: the first batch's KL is not 0"
[ -f "$TMP/lora/adapter_model.safetensors" ] && ok || bad "LoRA: no adapter saved"

expect_error() { # expect_error NAME PATTERN INI-EXTRA...
  local name=$1 pat=$2
  shift 2
  ppo_ini "$name" 1 "$@" >"$TMP/$name.ini"
  out=$("${C[@]}" train "$TMP/$name.ini" 2>&1) && bad "$name accepted" ||
    { echo "$out" | grep -q -- "$pat" && ok || bad "$name: unclear error: $out"; }
}
expect_error both "\[ppo\] stop_token_id" "stop_token = eos" "stop_token_id = 5"
expect_error minib "\[ppo\] num_mini_batches" "num_mini_batches = 3"
expect_error whiten "\[ppo\] whiten_rewards" "whiten_rewards = true" "num_mini_batches = 2"
expect_error est "kl_estimator" "kl_estimator = k2"
expect_error unknown "total_episodes" "total_episodes = 10"
expect_error vmdir "value_model" "value_model = $TMP/no-such-dir"

# Checkpoints hold the value model (its weights and AdamW state): a run resumed from checkpoint-2
# (a generation batch boundary: 2 epochs of one batch per 2 steps) logs exactly the uninterrupted
# run's steps 3 and 4, the value loss and the value model's gradient norm among them
metric() {
  awk -v s="$2" -v k="\"$3\": " 'index($0, "{\"step\": " s ",") == 1 && index($0, k) {
    v = substr($0, index($0, k) + length(k)); sub(/[,}].*/, "", v); print v; exit }' "$1"
}
INI_SAVE="save_steps = 1" ppo_ini full 4 "stop_token = eos" >"$TMP/full.ini"
"${C[@]}" train "$TMP/full.ini" >"$TMP/full.log" 2>&1 && ok || { bad "ppo run with checkpoints"; tail -3 "$TMP/full.log"; }
for f in value_model.safetensors value_optimizer.safetensors; do
  [ -f "$TMP/full/checkpoint-2/$f" ] && ok || bad "checkpoint-2 has no $f"
done
mkdir -p "$TMP/resumed" && cp -r "$TMP/full/checkpoint-2" "$TMP/resumed/"
"${C[@]}" train "$TMP/full.ini" --set run.output_dir="$TMP/resumed" --set train.resume_from_checkpoint=last \
  >"$TMP/resumed.log" 2>&1 && ok || { bad "ppo resume"; tail -3 "$TMP/resumed.log"; }
for sk in 3:loss 3:grad_norm 3:value_model/grad_norm 3:objective/scores 4:loss 4:grad_norm \
  4:value_model/grad_norm 4:loss/value_avg 4:loss/policy_avg; do # the update's metrics at its last step
  s=${sk%%:*} k=${sk#*:}
  a=$(metric "$TMP/full/metrics.jsonl" $s $k) b=$(metric "$TMP/resumed/metrics.jsonl" $s $k)
  [ -n "$a" ] && [ "$a" != null ] && [ "$a" = "$b" ] && ok || bad "step $s $k after resume: '$b', uninterrupted '$a'"
done
# inside a generation batch (after step 1 of its 2): resumed with a warning saying the curve differs
mkdir -p "$TMP/mid" && cp -r "$TMP/full/checkpoint-1" "$TMP/mid/"
"${C[@]}" train "$TMP/full.ini" --set run.output_dir="$TMP/mid" --set train.resume_from_checkpoint=last \
  >"$TMP/mid.log" 2>&1 && ok || { bad "ppo resume mid-batch"; tail -3 "$TMP/mid.log"; }
grep -q "inside a generation batch .*multiples of 2 steps" "$TMP/mid.log" && ok || bad "no mid-batch warning"
# a checkpoint without the value model (one from before, or another trainer's) is refused
mkdir -p "$TMP/novm" && cp -r "$TMP/full/checkpoint-2" "$TMP/novm/" && rm "$TMP/novm/checkpoint-2/value_model.safetensors"
out=$("${C[@]}" train "$TMP/full.ini" --set run.output_dir="$TMP/novm" --set train.resume_from_checkpoint=last 2>&1) &&
  bad "resume without a value model accepted" ||
  { echo "$out" | grep -q "resume_from_checkpoint = .*value model is not there" && ok || bad "resume: unclear error: $out"; }
finish

