#!/usr/bin/env bash
# ZeRO-3's generation one layer at a time ([generation] ds3_gather_for_generation = false, issue 19;
# core/train/zero_generate.c), 2 MPI ranks on the CPU: every decoding pass of the colocated engine
# gathers each layer just before it and releases it after, the ranks in lockstep (a rank whose
# requests are done runs passes without tokens until none is left). Against the same runs with the
# whole model gathered for each generation phase (true, the default): GRPO (with rank 0's
# evaluations, on the model it gathers whole itself), RLOO, Online DPO and PPO sample the same
# completions and log the same losses, rewards and gradient norms bit for bit (the same products on
# the same weights; GRPO in bf16 too, without packed decoding panels, and with LoRA); the ranks' pass counts differ (one request decoded at a time, prompts prefilled
# 8 tokens a pass) and do not hang; the parameter bytes resident on a rank during generation are at
# most its slices of the layers, what lies outside them, and one layer more (plus the pages a slice
# shares), and the largest gather it reports is what a gather fetches (0 with every tensor kept whole);
# the setting is refused without zero3 and for a trainer that does not generate; a rank
# stopped during generation ends the job after [train] ddp_timeout.
# usage: test_zero3_generate_mpi.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
tiny_setup 7 6
head -8 "$TMP/data/eval_prompts.jsonl" >"$TMP/data/eval8.jsonl"
LAYERWISE=(--set generation.ds3_gather_for_generation=false)
# the ranks' passes differ: one sequence decoded at a time, prompts prefilled 8 tokens a pass
SYNC=(--set memory.strategies=zero3 --set generation.max_num_seqs=1 --set generation.max_num_batched_tokens=8)
run2() { # NAME INI ARGS...: a 2-rank run into $TMP/NAME
  local name=$1 ini=$2 && shift 2
  "${MPI[@]}" "${C[@]}" train "$ini" --set run.output_dir="$TMP/$name" "${SYNC[@]}" "$@" >"$TMP/$name.log" 2>&1 ||
    { bad "$name: exited $?"; tail -20 "$TMP/$name.log"; }
}
# the metrics lines without the wall-clock ones
timeless() { sed -E 's/"(tokens_per_second|step_time|timing\/[a-z_]+)": [-0-9.e]+,? ?//g' "$1/metrics.jsonl"; }
same() { # A B WHAT: the same metrics lines (and completions when logged)
  [ -s "$TMP/$1/metrics.jsonl" ] && diff <(timeless "$TMP/$1") <(timeless "$TMP/$2") >"$TMP/diff" && ok ||
    { bad "$3: the metrics differ"; head -4 "$TMP/diff"; }
}

# 1. GRPO with evaluations (rank 0 alone generates on the model its evaluation gathered whole)
INI_TRAIN=$'dtype = fp32\neval_steps = 2' INI_GEN="log_completions = true" online_ini grpo g 4 "[grpo]" "num_generations = 4" \
  "max_completion_length = 12" | sed "s|^eval_file = .*|eval_file = $TMP/data/eval8.jsonl|" >"$TMP/grpo.ini"
run2 gw "$TMP/grpo.ini"
run2 gl "$TMP/grpo.ini" "${LAYERWISE[@]}"
same gw gl "grpo"
grep -q '"eval_reward"' "$TMP/gl/metrics.jsonl" && ok || bad "grpo: no evaluation"
[ -s "$TMP/gl/completions.jsonl" ] && cmp -s "$TMP/gw/completions.jsonl" "$TMP/gl/completions.jsonl" && ok ||
  bad "grpo: the completions differ"
line=$(grep -o "zero3 generation one layer at a time (ds3_gather_for_generation = false): parameters resident at most [0-9]* of the model's [0-9]* bytes per rank (layers, embeddings and head [0-9]* bytes, sliced over 2 ranks, the largest [0-9]* bytes); [0-9]* forward passes on every rank, up to [0-9]* of them idle" "$TMP/gl.log")
read -r res model layers largest passes idle < <(echo "$line" | grep -o '[0-9][0-9]*' | sed -n '3p;4p;5p;7p;8p;9p' | tr '\n' ' ')
whole=$(grep -o "ds3_gather_for_generation = true): parameters resident at most [0-9]*" "$TMP/gw.log" | grep -o '[0-9]*$')
echo "grpo zero3, parameters resident per rank during generation: layer by layer $res, whole $whole of the model's $model bytes (layers $layers, the largest $largest); $passes passes, up to $idle idle"
# lockstep: a rank ran passes without tokens while the other still generated
[ -n "$idle" ] && [ "$idle" -gt 0 ] && ok || bad "grpo: no idle pass ('$line')"
# at most: outside the layers + half of the layers + one more layer + two pages per layer's slice edge
[ -n "$res" ] && [ -n "$whole" ] && [ "$whole" -ge "$model" ] &&
  [ "$res" -le $((model - layers + layers / 2 + largest + 6 * 2 * 4096)) ] && ok ||
  bad "grpo: resident $res (whole $whole) of $model bytes, layers $layers, largest $largest"

# bf16: the same too, both without the packed decoding panels (CTRL_NO_PACKED_DECODE=1): the whole
# gather decodes on bf16 panels (the LM head a bf16 product) where the sliced layers cannot keep
# panels and the head is multiplied in fp32 (model_decode.c), so with them the logits differ by the
# head's bf16 rounding and a sampled token may too
export CTRL_NO_PACKED_DECODE=1
run2 bw "$TMP/grpo.ini" --set train.dtype=bf16 && run2 bl "$TMP/grpo.ini" --set train.dtype=bf16 "${LAYERWISE[@]}"
unset CTRL_NO_PACKED_DECODE
same bw bl "grpo bf16"
cmp -s "$TMP/bw/completions.jsonl" "$TMP/bl/completions.jsonl" && ok || bad "grpo bf16: the completions differ"

# LoRA (the frozen base's layer slices gathered with the adapters): the same
run2 aw "$TMP/grpo.ini" --set peft.enabled=true --set peft.target_modules=all-linear --set train.max_steps=2 &&
  run2 al "$TMP/grpo.ini" --set peft.enabled=true --set peft.target_modules=all-linear --set train.max_steps=2 "${LAYERWISE[@]}"
same aw al "grpo lora"

# 2. RLOO, Online DPO, PPO: the same metrics both ways
INI_TRAIN="dtype = fp32" online_ini rloo r 2 "[rloo]" "num_generations = 4" "max_completion_length = 10" |
  sed '/^eval_file/d' >"$TMP/rloo.ini"
run2 rw "$TMP/rloo.ini" && run2 rl "$TMP/rloo.ini" "${LAYERWISE[@]}"
same rw rl "rloo"
# with every tensor kept whole (stage3_param_persistence_threshold above the largest) a pass gathers
# nothing: the report's largest gather is 0 bytes (it counted the sliced ranges whole before)
run2 rk "$TMP/rloo.ini" "${LAYERWISE[@]}" --set memory.stage3_param_persistence_threshold=1e9 --set train.max_steps=1
grep -q "over 2 ranks, the largest 0 bytes)" "$TMP/rk.log" && ok ||
  bad "rloo, every tensor whole: $(grep -o 'the largest [0-9]* bytes' "$TMP/rk.log")"
INI_TRAIN="dtype = fp32" online_ini online_dpo o 2 "[online_dpo]" "max_new_tokens = 10" | sed '/^eval_file/d' >"$TMP/odpo.ini"
run2 ow "$TMP/odpo.ini" && run2 ol "$TMP/odpo.ini" "${LAYERWISE[@]}"
same ow ol "online_dpo"
INI_BATCH=2 INI_TARGET=6 INI_TRAIN="dtype = fp32" online_ini ppo p 2 "[ppo]" "response_length = 8" "num_ppo_epochs = 1" |
  sed '/^eval_file/d' >"$TMP/ppo.ini"
run2 pw "$TMP/ppo.ini" && run2 pl "$TMP/ppo.ini" "${LAYERWISE[@]}"
same pw pl "ppo"

# 3. Refused, naming the key: without zero3 (every rank holds the whole model), and with a trainer
#    that has no generation phase
"${C[@]}" train "$TMP/rloo.ini" --set run.output_dir="$TMP/no3" "${LAYERWISE[@]}" >"$TMP/no3.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "\[generation\] ds3_gather_for_generation = false: applies to \[memory\] strategies = zero3" "$TMP/no3.log" && ok ||
  { bad "without zero3: exit $rc"; tail -2 "$TMP/no3.log"; }
cat >"$TMP/sft.ini" <<INI
[run]
output_dir = $TMP/sft
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train.jsonl
[train]
max_steps = 1
[memory]
strategies = zero3
INI
"${C[@]}" train "$TMP/sft.ini" "${LAYERWISE[@]}" >"$TMP/sft.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "ds3_gather_for_generation = false: trainer sft has no generation phase" "$TMP/sft.log" && ok ||
  { bad "sft: exit $rc"; tail -2 "$TMP/sft.log"; }

# 4. A rank stopped while the ranks generate (long completions, one at a time: generation is most of
#    each step) ends the job after [train] ddp_timeout, non-zero, never a hang.
"${MPI[@]}" "${C[@]}" train "$TMP/rloo.ini" --set run.output_dir="$TMP/stop" "${SYNC[@]}" "${LAYERWISE[@]}" \
  --set train.max_steps=1000 --set rloo.max_completion_length=400 --set train.ddp_timeout=2 >"$TMP/stop.log" 2>&1 &
mp=$! t0=$SECONDS
# the first generation phase (8 completions of up to 400 tokens a rank, one pass each) follows this line
while ! grep -qs "data parallel: 2 ranks" "$TMP/stop.log" && [ $((SECONDS - t0)) -lt 60 ]; do sleep 0.2; done
sleep 0.3
rank=$(pgrep -P $mp | tail -1)
kill -STOP "$rank"
wait $mp
rc=$? secs=$((SECONDS - t0))
kill -CONT "$rank" 2>/dev/null
echo "a rank stopped during generation: exit $rc after $secs s"
# ... inside the first generation phase: its report (logged as it ends) never came
[ "$rc" != 0 ] && [ "$secs" -lt 90 ] && grep -q "within 2 s (\[train\] ddp_timeout)" "$TMP/stop.log" &&
  ! grep -q "zero3 generation one layer at a time" "$TMP/stop.log" && ok ||
  { bad "a stopped rank: exit $rc after $secs s"; grep -v '^step' "$TMP/stop.log" | tail -5; }
finish
