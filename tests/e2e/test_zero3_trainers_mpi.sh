#!/usr/bin/env bash
# What zero3 refused until issue 19's trainers piece, on 2 ranks on the CPU against plain data
# parallel on 2 ranks (the same rows per rank):
#   1. TR-DPO's sync_ref_model (TRL's fixture sigmoid_tr_dpo, 6 steps, a sync every 2): the sliced
#      reference mixed on each rank's own slices (no gather) -- loss, rewards/*, logps/* within 1e-5
#      relative; a zero3 run resumed from checkpoint-3 follows a data parallel run resumed from it
#      (both reload the initial reference, as TRL); with the reference whole (CTRL_TEST_ZERO3_WHOLE_REF,
#      as a CUDA model holds it) each sync gathers the whole policy: the same curve.
#   2. GKD (lmbda 0.5 with seq_kd: the student's, the teacher's and the dataset's completions): the
#      teacher sliced as the student, both gathered whole around their generation and the evaluations
#      -- loss, grad_norm, on_policy and the evaluations within 1e-5; the teacher's resident bytes
#      about half of it between uses; a zero3 run resumed from checkpoint-3 repeats the curve.
#      With LoRA on the student (6 steps): data parallel's loss, grad_norm and eval_loss, the teacher sliced.
#   2b. GRPO with beta 0.1 (6 steps of 2 completions a rank x 2 micro-batches): the online kind's
#      reference sliced as the policy, each rank running the same reference forwards (its micro-batches
#      of the generation batch) -- loss, kl, grad_norm and reward within 1e-5 of data parallel (whose
#      reference is whole); its resident bytes about half of it between uses, more during them.
#   2c. PPO (6 steps, 2 PPO epochs): the value model read and kept sliced as the policy (its own train_zero: layers
#      gathered around each forward and backward, gradients reduce-scattered, optimizer over its
#      slices) -- loss, grad_norm, value_model/grad_norm, loss/value_avg within 1e-5 of data parallel
#      (value model whole); its parameters, gradients and optimizer state per rank about half of the
#      whole (the log line); a zero3 run resumed from checkpoint-4 repeats the curve.
#   3. Server mode (the weights pushed to `ctrl serve`): each push streamed to rank 0 a layer at a
#      time as its file is written (the log says so; over a QLoRA base each layer's NF4 weights gathered
#      with it), rank 0 pushes, the others wait. GRPO and GKD (lmbda 1) against data
#      parallel in server mode (each its own server): the same curves (1e-5), one push before the
#      first generation and one a step, and the server then generates what the saved model does; a
#      zero3 GKD run resumed from checkpoint-3 (its server holding the last step's weights) repeats
#      the curve: the checkpoint's weights are pushed before its first generation. GRPO with LoRA: each
#      push folds the adapters into each streamed layer's base (data parallel's curve; the server then generates
#      what the saved adapter does over the base); over a QLoRA base (both servers then complete alike,
#      and the run with its pushes made the old way -- the whole model gathered on every rank,
#      CTRL_TEST_ZERO_SAVE_WHOLE -- gives the streamed run's rewards and curve exactly, and its server
#      then completes as the streamed run's did: the pushed files are the same).
# Every zero3 run's gathers (the policy's, the reference's, the teacher's) go through the page pool
# (core/page_pool.h), checked in the logs; with CTRL_TEST_ZERO3_REFAULT=1 in the environment (the pool
# off) the same checks pass against the old way.
# Skipped (77) only when mpirun or the MPI backend (libctrl_mpi.so) is absent.
# usage: test_zero3_trainers_mpi.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
FIX="$SRC/tests/fixtures"
# two NAME INI [--set ...]: plain data parallel (NAME-dp) and zero3 (NAME-z3) on 2 ranks
two() {
  local name=$1 ini=$2 && shift 2
  "${MPI[@]}" "${C[@]}" train "$ini" --set run.output_dir="$TMP/$name-dp" "$@" >"$TMP/$name-dp.log" 2>&1 &&
    ok || { bad "$name: data parallel"; tail -5 "$TMP/$name-dp.log"; }
  "${MPI[@]}" "${C[@]}" train "$ini" --set run.output_dir="$TMP/$name-z3" --set memory.strategies=zero3 "$@" \
    >"$TMP/$name-z3.log" 2>&1 && ok || { bad "$name: zero3"; tail -5 "$TMP/$name-z3.log"; }
}
# resume NAME INI STRATEGY [--set ...]: NAME's run with STRATEGY resumed from its checkpoint-3 into NAME-STRATEGY-res
resume() {
  local name=$1 ini=$2 z=$3 && shift 3
  local out="$TMP/$name-$z-res"
  mkdir -p "$out" && cp -r "$TMP/$name-$z/checkpoint-3" "$out/"
  grep -E '"step": [0-3],' "$TMP/$name-$z/metrics.jsonl" >"$out/metrics.jsonl"
  local strat=()
  [ "$z" = z3 ] && strat=(--set memory.strategies=zero3)
  "${MPI[@]}" "${C[@]}" train "$ini" --set run.output_dir="$out" "${strat[@]}" --set train.resume_from_checkpoint=last "$@" \
    >"$out.log" 2>&1 && ok || { bad "$name $z resume"; tail -5 "$out.log"; }
}
# pooled LOG WHAT: the run's zero3 gathers went through the page pool (core/page_pool.h) and it never
# failed -- or, with CTRL_TEST_ZERO3_REFAULT=1 (the pool off: this test passes either way), said so
pooled() {
  if [ -n "${CTRL_TEST_ZERO3_REFAULT:-}" ]; then
    grep -q "zero3: the released pages are faulted again at each use" "$1" && ok || bad "$2: no REFAULT line"
  else
    grep -q "zero3: gathers into reused pages: [1-9][0-9]* uses" "$1" && ! grep -q "failed, off" "$1" && ok ||
      bad "$2: the pool: '$(grep 'reused pages' "$1")'"
  fi
}
curve() { sed 's/, "tokens_per_second": [0-9.]*//; s/, "train_runtime": [0-9.]*//; s/, "timing\/[a-z_]*": [-0-9.e]*//g' "$1/metrics.jsonl" | grep -v runtime; }

# 1. TR-DPO: 6 steps of 2 rows a rank, the reference mixed (alpha 0.5) after steps 2, 4 and 6.
sed -e "s|@DIR@/|$FIX/trl_dpo/|; s|@DIR@|$FIX/trl_dpo|; s|@SFT@|$FIX/trl_sft|; s|@OUT@|$TMP/trdpo|" \
  -e "s/^max_steps = 20/max_steps = 6/" -e "s/^per_device_train_batch_size = .*/per_device_train_batch_size = 2/" \
  -e "s/^ref_model_sync_steps = .*/ref_model_sync_steps = 2/" -e "s/^save_strategy = .*/save_strategy = steps\nsave_steps = 3/" \
  "$FIX/trl_dpo/sigmoid_tr_dpo.ini" >"$TMP/trdpo.ini"
two trdpo "$TMP/trdpo.ini"
for key in loss rewards/chosen rewards/rejected rewards/margins logps/chosen logps/rejected; do
  curve_close "$TMP/trdpo-dp" "$TMP/trdpo-z3" "$key" 1e-5 1e-7
done
curve_close "$TMP/trdpo-dp" "$TMP/trdpo-z3" grad_norm 1e-4 1e-7
[ "$(grep -c 'sync_ref_model: reference mixed with the policy (alpha 0.5) after step [246], each rank its zero3 slices' "$TMP/trdpo-z3.log")" = 3 ] &&
  ok || bad "trdpo zero3: not 3 syncs of the slices: $(grep 'sync_ref_model' "$TMP/trdpo-z3.log")"
grep -q "reference model sliced as the policy" "$TMP/trdpo-z3.log" && ok || bad "trdpo zero3: the reference not sliced"
pooled "$TMP/trdpo-z3.log" "trdpo zero3"
# the sync moved the reference: after it the rewards are no longer plain DPO's (step 3 onwards)
"${MPI[@]}" "${C[@]}" train "$TMP/trdpo.ini" --set run.output_dir="$TMP/dpo-z3" --set memory.strategies=zero3 \
  --set dpo.sync_ref_model=false --set train.max_steps=3 --set train.save_strategy=no >"$TMP/dpo-z3.log" 2>&1 ||
  bad "dpo zero3 without the sync"
a=$(grep '"step": 3,' "$TMP/trdpo-z3/metrics.jsonl" | grep -o '"rewards/chosen": [-0-9.e]*')
b=$(grep '"step": 3,' "$TMP/dpo-z3/metrics.jsonl" | grep -o '"rewards/chosen": [-0-9.e]*')
[ -n "$a" ] && [ "$a" != "$b" ] && ok || bad "trdpo zero3: the sync changed nothing at step 3 ('$a' vs '$b')"
# resumed from checkpoint-3: the reference is the initial weights again (TRL keeps none in checkpoints)
# and the syncs stay at steps 4 and 6 -- zero3's resumed run follows data parallel's resumed run
resume trdpo "$TMP/trdpo.ini" dp
resume trdpo "$TMP/trdpo.ini" z3
for key in loss rewards/chosen rewards/margins logps/chosen; do
  curve_close "$TMP/trdpo-dp-res" "$TMP/trdpo-z3-res" "$key" 1e-5 1e-7
done
# the reference whole beside the sliced policy (the benchmarks' switch; a CUDA model's way): each sync
# gathers the whole policy first -- the same curve
"${MPI[@]}" -x CTRL_TEST_ZERO3_WHOLE_REF=1 "${C[@]}" train "$TMP/trdpo.ini" --set run.output_dir="$TMP/trw" \
  --set memory.strategies=zero3 >"$TMP/trw.log" 2>&1 && ok || { bad "trdpo whole reference"; tail -3 "$TMP/trw.log"; }
for key in loss rewards/chosen rewards/margins logps/chosen; do curve_close "$TMP/trdpo-dp" "$TMP/trw" "$key" 1e-5 1e-7; done
[ "$(grep -c 'sync_ref_model: reference mixed with the policy (alpha 0.5) after step [246], the policy gathered whole' "$TMP/trw.log")" = 3 ] &&
  ok || bad "trdpo whole reference: not 3 syncs of the gathered policy: $(grep 'sync_ref_model' "$TMP/trw.log")"

# 2. GKD on tiny_setup's model (2 layers, hidden 32) and a 1-layer hidden-48 teacher: 6 steps of 2
#    rows a rank x 2 micro-batches, half the micro-batches on-policy, the others the teacher's
#    samples (seq_kd); evaluations before and after; checkpoints at 3 and 6.
tiny_setup 7 2
tiny_teacher
INI_DATA=rows INI_TARGET= INI_MODEL=$'[teacher]\npath = '"$TMP/teacher" INI_TRAIN="dtype = fp32" INI_BATCH=2 \
  INI_SAVE=$'save_strategy = steps\nsave_steps = 3' \
  online_ini gkd gkd 6 "[gkd]" "lmbda = 0.5" "seq_kd = true" "max_new_tokens = 4" >"$TMP/gkd.ini"
two gkd "$TMP/gkd.ini"
curve_close "$TMP/gkd-dp" "$TMP/gkd-z3" loss 1e-5 1e-7
curve_close "$TMP/gkd-dp" "$TMP/gkd-z3" grad_norm 1e-5 1e-7
curve_close "$TMP/gkd-dp" "$TMP/gkd-z3" on_policy 1e-6 1e-9
grep -q '"on_policy": 0.5' "$TMP/gkd-z3/metrics.jsonl" && ok || bad "gkd zero3: no step mixes on-policy and other micro-batches"
for key in eval_loss eval_mean_token_accuracy eval_exact_match eval_teacher_exact_match; do
  paste <(curve_col "$TMP/gkd-dp" "$key") <(curve_col "$TMP/gkd-z3" "$key") | awk '
    { n++; d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; if (d > 1e-5 * a + 1e-7) bad = 1 }
    END { exit (bad || n != 2) }' && ok || bad "gkd zero3: $key differs from data parallel's"
done
# the teacher sliced: between uses at most 0.55 of its bytes (1/2 plus the final norm and the slices'
# partial pages), during its forwards above that and below the whole
line=$(grep -o "zero3: the teacher sliced over the ranks as the student: parameters resident at most [0-9]* of its [0-9]* bytes" "$TMP/gkd-z3.log")
echo "$line" | awk '{ r = $(NF - 4); w = $(NF - 1); exit !(w > 0 && r <= 0.55 * w) }' && ok || bad "gkd: the teacher's resident bytes: '$line'"
peak=$(grep -o "the teacher's parameters resident per rank: at most [0-9]* bytes during its forwards of the first step, [0-9]* after them, of its [0-9]*" "$TMP/gkd-z3.log")
echo "$peak" | awk '{ p = $9; a = $18; w = $NF; exit !(w > 0 && a <= 0.55 * w && p > a && p <= w) }' && ok ||
  bad "gkd: the teacher's bytes in its forwards: '$peak'"
echo "gkd zero3: $line; $peak"
pooled "$TMP/gkd-z3.log" "gkd zero3"
# the teacher's gathers on its own pool's frames too (or its pages faulted again with the pool off)
if [ -n "${CTRL_TEST_ZERO3_REFAULT:-}" ]; then want="its released pages faulted again at each use)"
else want="[1-9][0-9]* of its gathers into reused pages, [0-9]* the old way)"; fi
grep -q "the teacher's parameters resident per rank: .*prefetched; $want" "$TMP/gkd-z3.log" && ok ||
  bad "gkd zero3: the teacher's pool: '$(grep "the teacher's parameters resident per rank" "$TMP/gkd-z3.log")'"
resume gkd "$TMP/gkd.ini" z3
diff <(curve "$TMP/gkd-z3") <(curve "$TMP/gkd-z3-res") >"$TMP/diff" && ok || { bad "gkd zero3 resumed curve differs"; head "$TMP/diff"; }
# GKD with LoRA on the student (its frozen base sliced as zero3 LoRA's, read whole first): the teacher
# sliced all the same; on-policy and dataset micro-batches, 6 steps -- data parallel's curve
INI_DATA=rows INI_TARGET= INI_MODEL=$'[teacher]\npath = '"$TMP/teacher" INI_TRAIN="dtype = fp32" INI_BATCH=2 \
  online_ini gkd gkl 6 "[gkd]" "lmbda = 0.5" "max_new_tokens = 4" "[peft]" "enabled = true" >"$TMP/gkl.ini"
two gkl "$TMP/gkl.ini"
curve_close "$TMP/gkl-dp" "$TMP/gkl-z3" loss 1e-5 1e-7
curve_close "$TMP/gkl-dp" "$TMP/gkl-z3" grad_norm 1e-5 1e-7
paste <(curve_col "$TMP/gkl-dp" eval_loss) <(curve_col "$TMP/gkl-z3" eval_loss) | awk '
  { n++; d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; if (d > 1e-5 * a + 1e-7) bad = 1 }
  END { exit (bad || n != 2) }' && ok || bad "gkd lora zero3: eval_loss differs from data parallel's"
grep -q "zero3: the teacher sliced over the ranks as the student" "$TMP/gkl-z3.log" && grep -q "LoRA adapter" "$TMP/gkl-z3.log" &&
  ok || bad "gkd lora zero3: the teacher not sliced, or no adapter saved"
pooled "$TMP/gkl-z3.log" "gkd lora zero3"

# 2b. GRPO with beta > 0: the online kind's reference (core/train/kind_online.c) sliced as the policy
INI_TRAIN="dtype = fp32" INI_BATCH=2 online_ini grpo gb 6 "[grpo]" "num_generations = 4" "max_completion_length = 8" \
  "beta = 0.1" | sed '/^eval_file = /d' >"$TMP/gb.ini"
two gb "$TMP/gb.ini"
for key in loss kl grad_norm reward; do curve_close "$TMP/gb-dp" "$TMP/gb-z3" "$key" 1e-5 1e-7; done
grep -q '"kl": [0-9.]*[1-9]' "$TMP/gb-z3/metrics.jsonl" && ok || bad "grpo beta zero3: no step with kl > 0"
line=$(grep -o "zero3: the reference model sliced as the policy: parameters resident at most [0-9]* of its [0-9]* bytes" "$TMP/gb-z3.log")
peak=$(grep -o "the reference model's parameters resident per rank: at most [0-9]* bytes during its forwards of the first step, [0-9]* after them, of its [0-9]*" "$TMP/gb-z3.log")
echo "grpo beta zero3: $line; $peak"
echo "$line $peak" | awk '{ n = split($0, w, " "); k = 0; for (i = 1; i <= n; i++) if (w[i] ~ /^[0-9]+$/) v[++k] = w[i]
  m = v[2] / 2 + 4 * 2 * 4096; exit !(k == 5 && v[1] <= m && v[4] <= m && v[3] > v[4] && v[3] < v[5]) }' && ok ||
  bad "grpo beta zero3: the reference's resident bytes: '$line' '$peak'"
! grep -q "the reference model sliced" "$TMP/gb-dp.log" && ok || bad "grpo beta: data parallel's reference sliced"
pooled "$TMP/gb-z3.log" "grpo beta zero3"

# 2c. PPO (6 steps of 2 completions a rank x 2 micro-batches, 2 PPO epochs): the value model sliced as
#    the policy (core/train/online_ppo.c: each rank reads its slices; its layers gathered around each forward and backward, its
#    gradients reduce-scattered, its optimizer over its slices) -- loss, grad_norm, value_model/grad_norm
#    and loss/value_avg within 1e-5 of data parallel (whose value model is whole); its parameters,
#    gradients and optimizer state per rank about half of the whole; a zero3 run resumed from
#    checkpoint-4 (a generation batch's end: the value model's slices gathered to rank 0, its
#    optimizer state one file per rank) repeats the curve.
INI_TRAIN="dtype = fp32" INI_BATCH=2 INI_TARGET=6 INI_SAVE=$'save_strategy = steps\nsave_steps = 2' \
  online_ini ppo pp 6 "[ppo]" "response_length = 8" "num_ppo_epochs = 2" | sed '/^eval_file = /d' >"$TMP/pp.ini"
two pp "$TMP/pp.ini"
for key in loss grad_norm value_model/grad_norm; do curve_close "$TMP/pp-dp" "$TMP/pp-z3" "$key" 1e-5 1e-7; done
CURVE_MIN=3 curve_close "$TMP/pp-dp" "$TMP/pp-z3" loss/value_avg 1e-5 1e-7
line=$(grep -o "zero3: the value model sliced as the policy: parameters resident at most [0-9]* of its [0-9]* bytes" "$TMP/pp-z3.log")
mem=$(grep -o "zero3: the value model per rank after its first step: parameters [0-9]* of its [0-9]* bytes resident, gradients [0-9]* bytes (its slices' sums and the buffer; whole [0-9]*), optimizer state [0-9]* bytes ([0-9]* over the 2 ranks)" "$TMP/pp-z3.log")
echo "ppo zero3: $line; $mem"
# half of the whole plus the units kept whole (the final norm, the score head) and the slices' edge pages
echo "$mem" | awk '{ n = split($0, w, " "); k = 0; for (i = 1; i <= n; i++) { x = w[i]; gsub(/[(),]/, "", x); if (x ~ /^[0-9]+$/) v[++k] = x }
  m = v[2] / 2 + 4 * 2 * 4096
  exit !(k == 7 && v[1] <= m && v[3] <= m && v[4] == v[2] && v[5] > 0 && 2 * v[5] <= 1.01 * v[6]) }' && ok ||
  bad "ppo zero3: the value model's bytes per rank: '$mem'"
[ -n "$line" ] && grep -q "each rank read its slices of the value model's layers" "$TMP/pp-z3.log" &&
  ! grep -q "value model sliced" "$TMP/pp-dp.log" && ok || bad "ppo: the value model not read and kept sliced under zero3, or sliced under data parallel"
[ -s "$TMP/pp-z3/checkpoint-4/value_optimizer.rank-1.safetensors" ] && [ -s "$TMP/pp-z3/checkpoint-4/value_model.safetensors" ] &&
  ok || bad "ppo zero3: checkpoint-4 holds no value model or no sharded value optimizer state"
mkdir -p "$TMP/pp-res" && cp -r "$TMP/pp-z3/checkpoint-4" "$TMP/pp-res/"
grep -E '"step": [0-4],' "$TMP/pp-z3/metrics.jsonl" >"$TMP/pp-res/metrics.jsonl"
"${MPI[@]}" "${C[@]}" train "$TMP/pp.ini" --set run.output_dir="$TMP/pp-res" --set memory.strategies=zero3 \
  --set train.resume_from_checkpoint=last >"$TMP/pp-res.log" 2>&1 && ok || { bad "ppo zero3 resume"; tail -5 "$TMP/pp-res.log"; }
# (the values; without the wall-clock ones, nor the metrics a window lacks: logged null once seen before)
values() { sed -E 's/"(step_time|tokens_per_second|timing\/[a-z_]+)": [-0-9.e]+,? ?//g; s/"[^"]*": null,? ?//g' "$1/metrics.jsonl" | grep -v runtime; }
diff <(values "$TMP/pp-z3") <(values "$TMP/pp-res") >"$TMP/diff" && ok || { bad "ppo zero3 resumed curve differs"; head -4 "$TMP/diff"; }
# 2d. PPO with [peft]: the policy's adapters over its sliced base, the value model (no adapters, trained in
#     full as TRL's PPO with a peft_config trains it) sliced as in 2c: data parallel's curves within
#     1e-5, the value model read sliced, and a resume from checkpoint-4 repeating the curve.
{ cat "$TMP/pp.ini" && printf '[peft]\nenabled = true\nr = 4\nlora_alpha = 8\n'; } |
  sed 's/^learning_rate = .*/learning_rate = 2e-2/' >"$TMP/ppl.ini"
two ppl "$TMP/ppl.ini"
for key in loss grad_norm value_model/grad_norm; do curve_close "$TMP/ppl-dp" "$TMP/ppl-z3" "$key" 1e-5 1e-7; done
CURVE_MIN=3 curve_close "$TMP/ppl-dp" "$TMP/ppl-z3" loss/value_avg 1e-5 1e-7
grep -q "each rank read its slices of the value model's layers" "$TMP/ppl-z3.log" &&
  grep -q "zero3: the value model per rank after its first step" "$TMP/ppl-z3.log" && grep -q "LoRA adapter" "$TMP/ppl-z3.log" &&
  [ -s "$TMP/ppl-z3/checkpoint-4/value_optimizer.rank-1.safetensors" ] && ok ||
  bad "ppo lora zero3: the value model not sliced, or no adapter / sharded value optimizer state"
grep -m1 -o "zero3: the value model per rank after its first step: .*" "$TMP/ppl-z3.log"
mkdir -p "$TMP/ppl-res" && cp -r "$TMP/ppl-z3/checkpoint-4" "$TMP/ppl-res/"
grep -E '"step": [0-4],' "$TMP/ppl-z3/metrics.jsonl" >"$TMP/ppl-res/metrics.jsonl"
"${MPI[@]}" "${C[@]}" train "$TMP/ppl.ini" --set run.output_dir="$TMP/ppl-res" --set memory.strategies=zero3 \
  --set train.resume_from_checkpoint=last >"$TMP/ppl-res.log" 2>&1 && ok || { bad "ppo lora zero3 resume"; tail -5 "$TMP/ppl-res.log"; }
diff <(values "$TMP/ppl-z3") <(values "$TMP/ppl-res") >"$TMP/diff" && ok || { bad "ppo lora zero3 resumed curve differs"; head -4 "$TMP/diff"; }
# and over a QLoRA base (the value model is not quantized, as TRL's is not): the same
{ cat "$TMP/ppl.ini" && echo "quantization = nf4"; } | sed 's/^save_strategy = .*/save_strategy = no/' >"$TMP/ppq.ini"
two ppq "$TMP/ppq.ini"
for key in loss grad_norm value_model/grad_norm; do curve_close "$TMP/ppq-dp" "$TMP/ppq-z3" "$key" 1e-5 1e-7; done
grep -q "each rank read its slices of the value model's layers" "$TMP/ppq-z3.log" && ok || bad "ppo qlora zero3: the value model not sliced"

# 3. Server mode: two servers of the initial model, one for data parallel (port A), one for zero3 (B).
PA=$(free_port)
"${C[@]}" serve --model "$TMP/model" --port "$PA" >"$TMP/serveA.log" 2>&1 &
SA=$!
PB=$(free_port)
while [ "$PB" = "$PA" ]; do PB=$(free_port); done
"${C[@]}" serve --model "$TMP/model" --port "$PB" >"$TMP/serveB.log" 2>&1 &
SB=$!
trap 'kill $SA $SB 2>/dev/null; rm -rf "$TMP"' EXIT
pushes() { curl -s "localhost:$1/health" | sed -n 's/.*"weight_updates":\([0-9]*\).*/\1/p'; }
srv() { printf 'mode = server\nserver_url = http://127.0.0.1:%s' "$1"; }
# streamed LOG WHAT [no]: the pushes streamed each layer to rank 0 (no rank gathered the whole model; a run
# without eval prompts), or not
streamed() {
  if [ -z "${3:-}" ]; then
    grep -q "zero3: server mode's push streamed to rank 0, [1-9][0-9]* units" "$1" && ok || bad "$2: the push not streamed"
    # and nothing else gathered the whole model: no eval prompts, so no evaluation either (an online run
    # once gathered it at each evaluation point with nothing to evaluate)
    grep -q "zero3: the whole model gathered on every rank 0 time(s)" "$1" && ok || bad "$2: the whole model gathered"
  else
    ! grep -q "push streamed" "$1" && ok || bad "$2: streamed, want the whole gather"
  fi
}
# servers NAME INI STEPS: NAME-dp through server A, NAME-z3 through B; B's pushes counted (1 + STEPS)
servers() {
  local name=$1 ini=$2 steps=$3 before
  before=$(pushes "$PB")
  "${MPI[@]}" "${C[@]}" train "$ini" --set run.output_dir="$TMP/$name-dp" --set generation.server_url="http://127.0.0.1:$PA" \
    >"$TMP/$name-dp.log" 2>&1 && ok || { bad "$name: data parallel"; tail -5 "$TMP/$name-dp.log"; }
  "${MPI[@]}" "${C[@]}" train "$ini" --set run.output_dir="$TMP/$name-z3" --set memory.strategies=zero3 \
    --set generation.server_url="http://127.0.0.1:$PB" >"$TMP/$name-z3.log" 2>&1 && ok || { bad "$name: zero3"; tail -5 "$TMP/$name-z3.log"; }
  [ "$(($(pushes "$PB") - ${before:-0}))" = $((steps + 1)) ] && ok ||
    bad "$name zero3: the server got $(($(pushes "$PB") - ${before:-0})) pushes from 2 ranks x $steps steps, want $((steps + 1))"
}
INI_TRAIN="dtype = fp32" INI_BATCH=2 INI_GEN=$(srv "$PA") online_ini grpo gs 6 "[grpo]" "num_generations = 4" \
  "max_completion_length = 8" | sed '/^eval_file = /d' >"$TMP/gs.ini"
servers gs "$TMP/gs.ini" 6
for key in loss grad_norm reward; do curve_close "$TMP/gs-dp" "$TMP/gs-z3" "$key" 1e-5 1e-7; done
pooled "$TMP/gs-z3.log" "grpo zero3 server mode"
streamed "$TMP/gs-z3.log" "grpo zero3 server mode"
server_greedy_same "$PB" "$TMP/gs-z3" 8 "grpo zero3 server mode"
# with LoRA: each push folds the adapters into the gathered base; the server then generates what the saved
# adapter does over the base
{ cat "$TMP/gs.ini" && printf '[peft]\nenabled = true\nr = 4\nlora_alpha = 8\n'; } |
  sed 's/^learning_rate = .*/learning_rate = 2e-2/' >"$TMP/gsl.ini"
servers gsl "$TMP/gsl.ini" 6
for key in loss grad_norm reward; do curve_close "$TMP/gsl-dp" "$TMP/gsl-z3" "$key" 1e-5 1e-7; done
server_greedy_same "$PB" "$TMP/gsl-z3" 8 "grpo lora zero3 server mode" "$TMP/model"
streamed "$TMP/gsl-z3.log" "grpo lora zero3 server mode"
# and over a QLoRA base (each layer's NF4 slices gathered with it, dequantized, merged): both servers then
# complete alike
sed 's/^r = 4$/r = 4\nquantization = nf4/' "$TMP/gsl.ini" >"$TMP/gsq.ini"
servers gsq "$TMP/gsq.ini" 6
for key in loss grad_norm reward; do curve_close "$TMP/gsq-dp" "$TMP/gsq-z3" "$key" 1e-5 1e-7; done
streamed "$TMP/gsq-z3.log" "grpo qlora zero3 server mode"
grep -q "push streamed to rank 0, .*; the NF4 base's weights gathered to it with their layer" "$TMP/gsq-z3.log" && ok ||
  bad "grpo qlora zero3 server mode: the push's line names no NF4 gathers"
greedy() { curl -s -X POST "localhost:$1/generate" -d '{"prompts": ["12+7="], "temperature": 0, "max_tokens": 8}'; }
a=$(greedy "$PA") b=$(greedy "$PB")
[[ $a == *completion_ids* ]] && [ "$a" = "$b" ] && ok || bad "grpo qlora server mode: zero3's server completes '$b', data parallel's '$a'"
# the old way (the whole model gathered on every rank for each push) through server B: the same pushed
# files -- the server's completions, so the rewards and the whole curve, the streamed run's exactly, and
# the server's last weights completing as the streamed run's did
CTRL_TEST_ZERO_SAVE_WHOLE=1 "${MPI[@]}" -x CTRL_TEST_ZERO_SAVE_WHOLE "${C[@]}" train "$TMP/gsq.ini" \
  --set run.output_dir="$TMP/gsq-zw" --set memory.strategies=zero3 --set generation.server_url="http://127.0.0.1:$PB" \
  >"$TMP/gsq-zw.log" 2>&1 && ok || { bad "grpo qlora zero3, pushes whole"; tail -5 "$TMP/gsq-zw.log"; }
streamed "$TMP/gsq-zw.log" "grpo qlora zero3 server mode, CTRL_TEST_ZERO_SAVE_WHOLE" no
same() { curve "$1" | sed 's/, "step_time": [0-9.e-]*//'; }
[ "$(same "$TMP/gsq-zw" | grep -c '"reward": ')" = 6 ] && diff <(same "$TMP/gsq-z3") <(same "$TMP/gsq-zw") >"$TMP/diff" &&
  ok || { bad "grpo qlora zero3 server mode: the pushes gathered whole give another curve"; head -4 "$TMP/diff"; }
[ "$(greedy "$PB")" = "$b" ] && ok || bad "grpo qlora server mode: the whole pushes' server completes '$(greedy "$PB")', the streamed ones' '$b'"
INI_DATA=rows INI_TARGET= INI_MODEL=$'[teacher]\npath = '"$TMP/teacher" INI_TRAIN="dtype = fp32" INI_BATCH=2 \
  INI_SAVE=$'save_strategy = steps\nsave_steps = 3' INI_GEN=$(srv "$PA") \
  online_ini gkd gks 6 "[gkd]" "lmbda = 1" "max_new_tokens = 4" | sed '/^eval_file = /d' >"$TMP/gks.ini"
servers gks "$TMP/gks.ini" 6
for key in loss grad_norm; do curve_close "$TMP/gks-dp" "$TMP/gks-z3" "$key" 1e-5 1e-7; done
pooled "$TMP/gks-z3.log" "gkd zero3 server mode"
streamed "$TMP/gks-z3.log" "gkd zero3 server mode"
server_greedy_same "$PB" "$TMP/gks-z3" 8 "gkd zero3 server mode"
resume gks "$TMP/gks.ini" z3 --set generation.server_url="http://127.0.0.1:$PB"
diff <(curve "$TMP/gks-z3") <(curve "$TMP/gks-z3-res") >"$TMP/diff" && ok || { bad "gkd zero3 server mode: resumed curve differs"; head "$TMP/diff"; }
kill $SA $SB 2>/dev/null
finish
