#!/usr/bin/env bash
# The online_dpo trainer end to end on a tiny random model: colocated generation logs TRL's metric
# names and its step counts prompts (per_device_train_batch_size prompts x 2 completions); a beta
# list, missing_eos_penalty and max_length run; server mode generates through ctrl serve with the
# weights pushed after every step, and its first step's loss equals the colocated run's (same seed,
# same samples; that one with sleep mode); with LoRA the reference is the adapters-off policy; a
# reward model ranks the pairs; bad options are clear errors. usage: test_online_dpo.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
tiny_setup 7 2

# odpo_ini OUT STEPS [extra lines...]: a run on the arithmetic prompts, length reward
odpo_ini() {
  local out=$1 steps=$2
  shift 2
  online_ini online_dpo "$out" "$steps" "[online_dpo]" "max_new_tokens = 12" "$@"
}

# 1. Colocated: TRL's metrics, 2 x 4 prompts x 2 completions a step; prompt + completion past
#    max_length = 16 lose prompt tokens in the log-prob forwards.
odpo_ini colo 3 "beta = 0.2, 0.1" "missing_eos_penalty = 1.0" "max_length = 16" >"$TMP/colo.ini"
if "${C[@]}" train "$TMP/colo.ini" >"$TMP/colo.log" 2>&1; then ok; else bad "colocated run"; tail -5 "$TMP/colo.log"; fi
M=$TMP/colo/metrics.jsonl
for k in loss grad_norm objective/kl objective/entropy objective/non_score_reward objective/rlhf_reward \
  objective/scores objective/scores_margin rewards/chosen rewards/rejected rewards/accuracies rewards/margins \
  logps/chosen logps/rejected val/contain_eos_token beta rewards/len/mean; do
  grep -q "\"$k\": " "$M" && ok || bad "metric $k missing from $M"
done
grep -q '"beta": 0.2,' "$M" && ok || bad "beta of the first epoch is not 0.2"
grep -q '"eval_reward": ' "$M" && ok || bad "no eval_reward line"
grep -q "steps of 8 x 2 completions" "$TMP/colo.log" && ok || bad "a micro-batch is not 4 prompts x 2 completions"

# max_length only shortens the log-prob forwards: without it the first step samples and scores the
# same completions, and their log-probs differ (the truncated prompts were longer).
odpo_ini nolim 1 "beta = 0.2, 0.1" "missing_eos_penalty = 1.0" "max_length = 0" >"$TMP/nolim.ini"
"${C[@]}" train "$TMP/nolim.ini" >"$TMP/nolim.log" 2>&1 && ok || bad "run without max_length"
step1() { grep '"step": 1,' "$1" | grep -o "\"$2\": [-0-9.e]*"; }
[ -n "$(step1 "$M" objective/scores)" ] && [ "$(step1 "$M" objective/scores)" = "$(step1 "$TMP/nolim/metrics.jsonl" objective/scores)" ] &&
  ok || bad "max_length changed the samples: $(step1 "$M" objective/scores) vs $(step1 "$TMP/nolim/metrics.jsonl" objective/scores)"
[ "$(step1 "$M" logps/chosen)" != "$(step1 "$TMP/nolim/metrics.jsonl" logps/chosen)" ] && ok ||
  bad "max_length = 16 did not truncate: logps/chosen $(step1 "$M" logps/chosen) either way"

# 2. Server mode: ctrl serve generates; the first step (same seed, same initial weights) is the
#    colocated one's, and the pushed weights keep the runs together.
PORT=$(free_port)
"${C[@]}" serve --model "$TMP/model" --port "$PORT" >"$TMP/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; rm -rf "$TMP"' EXIT
odpo_ini srv 2 >"$TMP/srv.ini"
odpo_ini ref 2 >"$TMP/ref.ini"
printf 'mode = server\nserver_url = http://127.0.0.1:%s\n' "$PORT" >"$TMP/gen.txt"
sed -i "/^\[generation\]$/r $TMP/gen.txt" "$TMP/srv.ini"
if "${C[@]}" train "$TMP/srv.ini" >"$TMP/srv.log" 2>&1; then ok; else bad "server-mode run"; tail -5 "$TMP/srv.log"; fi
grep -q "ctrl serve at" "$TMP/srv.log" && ok || bad "server mode did not say where it generates"
"${C[@]}" train "$TMP/ref.ini" --set generation.sleep=1 >"$TMP/ref.log" 2>&1 && ok || bad "colocated reference run (sleep mode)"
a=$(grep -o '"loss": [-0-9.e]*' "$TMP/ref/metrics.jsonl" | head -n 1)
b=$(grep -o '"loss": [-0-9.e]*' "$TMP/srv/metrics.jsonl" | head -n 1)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "server-mode first step $b, colocated $a"
kill $SERVER 2>/dev/null

# 3. LoRA: the reference is the policy with its adapters off (no second copy): KL 0 at the first
#    step, then not; the adapters are what is saved.
odpo_ini lora 3 "[peft]" "enabled = true" "lora_dropout = 0" >"$TMP/lora.ini"
if "${C[@]}" train "$TMP/lora.ini" >"$TMP/lora.log" 2>&1; then ok; else bad "lora run"; tail -5 "$TMP/lora.log"; fi
kl1=$(grep '"step": 1,' "$TMP/lora/metrics.jsonl" | sed 's/.*"objective\/kl": \([0-9.e+-]*\).*/\1/')
kl3=$(grep '"step": 3,' "$TMP/lora/metrics.jsonl" | sed 's/.*"objective\/kl": \([0-9.e+-]*\).*/\1/')
awk -v a="$kl1" -v b="$kl3" 'BEGIN { exit !(a == 0 && b != 0) }' && ok || bad "lora objective/kl: step 1 $kl1, step 3 $kl3"
[ -s "$TMP/lora/adapter_model.safetensors" ] && ok || bad "lora: no adapter saved"

# 4. Ranked by a reward model ([reward.rm] plugin = reward_model, the tiny sequence classifier of
#    tests/fixtures/score/qwen2): objective/scores is the model's mean score (no penalty here).
odpo_ini rm 2 | sed '/^\[reward.len\]$/,/^target_length/d' >"$TMP/rm.ini"
printf '[reward.rm]\nplugin = reward_model\npath = %s\ntokenizer = %s\n' "$SRC/tests/fixtures/score/qwen2" \
  "$SRC/tests/fixtures/tokenizer/tiny_bpe" >>"$TMP/rm.ini"
if "${C[@]}" train "$TMP/rm.ini" >"$TMP/rm.log" 2>&1; then ok; else bad "reward-model run"; tail -5 "$TMP/rm.log"; fi
s=$(grep '"step": 1,' "$TMP/rm/metrics.jsonl" | sed 's/.*"objective\/scores": \([-0-9.e+]*\).*/\1/')
r=$(grep '"step": 1,' "$TMP/rm/metrics.jsonl" | sed 's/.*"rewards\/rm\/mean": \([-0-9.e+]*\).*/\1/')
awk -v a="$s" -v b="$r" 'BEGIN { exit !(a != "" && a == b && a != 0) }' && ok ||
  bad "objective/scores $s is not the reward model's mean $r"

# 5. Bad settings: clear errors naming the key.
odpo_ini bad1 1 "beta = 0.1, nope" >"$TMP/bad1.ini"
out=$("${C[@]}" config check "$TMP/bad1.ini" 2>&1) && bad "bad beta list accepted" ||
  { echo "$out" | grep -q "bad1.ini:[0-9]*: \[online_dpo\] beta" && ok || bad "unclear error: $out"; }
odpo_ini bad2 1 "loss_type = hinge" >"$TMP/bad2.ini"
out=$("${C[@]}" train "$TMP/bad2.ini" 2>&1) && bad "loss_type hinge accepted" ||
  { echo "$out" | grep -q "loss_type" && ok || bad "unclear error: $out"; }
odpo_ini bad3 1 "max_length = 12" >"$TMP/bad3.ini"
out=$("${C[@]}" train "$TMP/bad3.ini" 2>&1) && bad "max_length <= max_new_tokens accepted" ||
  { echo "$out" | grep -q "bad3.ini:[0-9]*: \[online_dpo\] max_length" && ok || bad "unclear error: $out"; }
odpo_ini bad4 1 | sed '/^\[reward.len\]$/,/^target_length/d' >"$TMP/bad4.ini"
out=$("${C[@]}" train "$TMP/bad4.ini" 2>&1) && bad "no reward accepted" ||
  { echo "$out" | grep -q "reward.NAME" && ok || bad "unclear error: $out"; }
finish
