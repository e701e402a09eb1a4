#!/usr/bin/env bash
# ZeRO stages 1, 2 and 3 over MPI on the CPU (issue 19; core/train/zero.c, plugins/memory/zero/):
# `mpirun -np 2` SFT with [memory] strategies = zero1 and zero2 follows plain data parallel's loss
# curve (<= 1e-6 relative, fp32; with gradient clipping active and weight decay on), each rank
# holds half of the optimizer state (the state's bytes each rank reports: the largest at most 1/2 of
# the unsharded plus one float per buffer, the sum equal to the unsharded), the checkpoint holds one
# optimizer file per rank, and a 2-rank resume continues the same curve; a checkpoint sharded or not
# is refused by a run that is the other way, naming the key; two ZeRO stages at once are refused;
# zero3 (section 5) follows the plain curve with the layers sliced, holds less parameter memory.
# Skipped (77) only when mpirun or libctrl_mpi.so is absent.
# usage: test_zero_mpi.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
tiny_setup 7 2
cat >"$TMP/run.ini" <<INI
[run]
output_dir = $TMP/dp
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train.jsonl
[memory]
strategies = checkpointing
[train]
learning_rate = 3e-3
lr_scheduler_type = cosine
warmup_steps = 2
max_steps = 8
per_device_train_batch_size = 2
gradient_accumulation_steps = 2
logging_steps = 1
save_steps = 4
weight_decay = 0.1
max_grad_norm = 0.5
dtype = fp32
INI
state_bytes() { grep -o "optimizer adamw: $2 bytes of state" "$1" | grep -o '[0-9]*' | head -1; }

# 1. Plain data parallel, zero1, zero2 (beside checkpointing): the same curve.
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" >"$TMP/dp.log" 2>&1 || { bad "plain 2 ranks"; tail -20 "$TMP/dp.log"; }
for z in zero1 zero2; do
  "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/$z" --set "memory.strategies=checkpointing,$z" \
    >"$TMP/$z.log" 2>&1 || { bad "$z 2 ranks exited $?"; tail -20 "$TMP/$z.log"; }
  curve_close "$TMP/dp" "$TMP/$z" loss 1e-6
  curve_close "$TMP/dp" "$TMP/$z" mean_token_accuracy 1e-6
  curve_close "$TMP/dp" "$TMP/$z" grad_norm 1e-5 # the slices' sums of squares added in another order
  # 2. The optimizer state per rank: at most half of the unsharded (+ one float per buffer when
  #    a slice ends mid-tensor), and the ranks' together exactly the unsharded.
  full=$(grep -o "optimizer adamw: [0-9]* bytes of state per rank" "$TMP/dp.log" | grep -o '[0-9]*' | head -1)
  line=$(grep -o "$z: 2 ranks, each steps [0-9]* of [0-9]* trainable floats; optimizer adamw: at most [0-9]* bytes of state per rank, [0-9]* over the ranks" "$TMP/$z.log")
  max=$(echo "$line" | sed 's/.*at most \([0-9]*\) bytes.*/\1/') sum=$(echo "$line" | sed 's/.*rank, \([0-9]*\) over.*/\1/')
  echo "$z: unsharded $full bytes, per rank at most $max, over the ranks $sum"
  [ -n "$full" ] && [ -n "$max" ] && [ "$sum" = "$full" ] && [ $((max * 2)) -le $((full + 64)) ] && ok ||
    bad "$z: optimizer state: unsharded '$full', per rank '$max', sum '$sum'"
  # the checkpoint: the model as ever, one optimizer file per rank, the stage in trainer_state.json
  ck=$TMP/$z/checkpoint-4
  [ -f "$ck/model.safetensors" ] && [ -f "$ck/optimizer.rank-0.safetensors" ] && [ -f "$ck/optimizer.rank-1.safetensors" ] &&
    [ ! -e "$ck/optimizer.safetensors" ] && grep -q '"zero_stage":.*'"${z#zero}" "$ck/trainer_state.json" && ok ||
    bad "$z: checkpoint-4 holds $(ls "$ck" | tr '\n' ' ')"
done
# the slices' files together are the unsharded file's size (same buffers, cut in two), give or
# take the headers
a=$(stat -c %s "$TMP/dp/checkpoint-4/optimizer.safetensors")
b=$(($(stat -c %s "$TMP/zero2/checkpoint-4/optimizer.rank-0.safetensors") + $(stat -c %s "$TMP/zero2/checkpoint-4/optimizer.rank-1.safetensors")))
[ $((b - a)) -lt 4096 ] && [ $((a - b)) -lt 4096 ] && ok || bad "optimizer files: $a bytes unsharded, $b sharded"

# LoRA (the adapters alone are sliced, the frozen base stays whole on every rank) and 3 ranks (the
# slices uneven, cut inside tensors): the plain curve again.
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/lora" --set peft.enabled=true \
  --set peft.target_modules=all-linear >"$TMP/lora.log" 2>&1 || { bad "lora 2 ranks"; tail -20 "$TMP/lora.log"; }
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/lora2" --set peft.enabled=true \
  --set peft.target_modules=all-linear --set memory.strategies=zero2 >"$TMP/lora2.log" 2>&1 ||
  { bad "lora zero2 2 ranks"; tail -20 "$TMP/lora2.log"; }
curve_close "$TMP/lora" "$TMP/lora2" loss 1e-6
MPI3=("${MPI[@]}") && MPI3[2]=3
"${MPI3[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/dp3" --set train.per_device_train_batch_size=1 \
  --set train.save_strategy=no >"$TMP/dp3.log" 2>&1 || { bad "plain 3 ranks"; tail -20 "$TMP/dp3.log"; }
"${MPI3[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/z3" --set train.per_device_train_batch_size=1 \
  --set train.save_strategy=no --set memory.strategies=zero2 >"$TMP/z3.log" 2>&1 || { bad "zero2 3 ranks"; tail -20 "$TMP/z3.log"; }
curve_close "$TMP/dp3" "$TMP/z3" loss 1e-6
grep -q "zero2: 3 ranks, each steps 32887 of 98656 trainable floats" "$TMP/z3.log" && ok ||
  bad "3 ranks: $(grep 'zero2:' "$TMP/z3.log")"

# GRPO (a kind that splits the generation batch itself): zero2 samples the same completions and
# follows the same curve.
INI_TRAIN="dtype = fp32" online_ini grpo g 8 "[grpo]" "num_generations = 4" "max_completion_length = 12" >"$TMP/grpo.ini"
"${MPI[@]}" "${C[@]}" train "$TMP/grpo.ini" >"$TMP/g.log" 2>&1 || { bad "grpo 2 ranks"; tail -20 "$TMP/g.log"; }
"${MPI[@]}" "${C[@]}" train "$TMP/grpo.ini" --set run.output_dir="$TMP/gz" --set memory.strategies=zero2 >"$TMP/gz.log" 2>&1 ||
  { bad "grpo zero2 2 ranks"; tail -20 "$TMP/gz.log"; }
curve_close "$TMP/g" "$TMP/gz" reward 1e-6
curve_close "$TMP/g" "$TMP/gz" grad_norm 1e-5
# zero3: the layers sliced, gathered whole for each generation phase and released after
# (ds3_gather_for_generation), the gradients reduced one layer at a time
"${MPI[@]}" "${C[@]}" train "$TMP/grpo.ini" --set run.output_dir="$TMP/gz3" --set memory.strategies=zero3 \
  --set memory.reduce_bucket_size=1 --set memory.prefetch_bucket_size=0 >"$TMP/gz3.log" 2>&1 || { bad "grpo zero3 2 ranks"; tail -20 "$TMP/gz3.log"; }
curve_close "$TMP/g" "$TMP/gz3" reward 1e-6
curve_close "$TMP/g" "$TMP/gz3" grad_norm 1e-5
grep -q "zero3: gradients during the backward: .* (2 buckets of layers" "$TMP/gz3.log" && ok || bad "grpo zero3: $(grep 'zero3:' "$TMP/gz3.log")"

# 3. Resumed with 2 ranks and zero2 from checkpoint-4: steps 5..8 as before.
mkdir -p "$TMP/res" && cp -r "$TMP/zero2/checkpoint-4" "$TMP/res/"
grep '"step": [1-4],' "$TMP/zero2/metrics.jsonl" >"$TMP/res/metrics.jsonl"
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/res" --set memory.strategies=checkpointing,zero2 \
  --set train.resume_from_checkpoint=last >"$TMP/res.log" 2>&1 || { bad "zero2 resume"; tail -20 "$TMP/res.log"; }
curve() { sed 's/, "tokens_per_second": [0-9.]*//' "$1/metrics.jsonl"; }
diff <(curve "$TMP/zero2") <(curve "$TMP/res") >"$TMP/diff" && ok || { bad "zero2 resumed curve differs"; cat "$TMP/diff"; }

# 4. Sharded and unsharded checkpoints do not mix (exit 2 naming the key); one ZeRO stage at a time.
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/res" --set train.resume_from_checkpoint=last \
  >"$TMP/mix.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "made with ZeRO, \[memory\] strategies has none" "$TMP/mix.log" && ok ||
  { bad "unsharded resume of a zero2 checkpoint: exit $rc"; tail -3 "$TMP/mix.log"; }
# zero2 on the CPU cuts its slices per bucket of layers, zero1 over the whole buffer: not each other's
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/res" --set memory.strategies=zero1 \
  --set train.resume_from_checkpoint=last >"$TMP/mix1.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "made with ZeRO-2, whose optimizer slices were cut otherwise than this run's zero1" "$TMP/mix1.log" && ok ||
  { bad "zero1 resume of a zero2 checkpoint: exit $rc"; tail -3 "$TMP/mix1.log"; }
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/two" --set memory.strategies=zero1,zero2 >"$TMP/two.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "\[memory\] strategies: zero1 and zero2: one ZeRO stage at a time" "$TMP/two.log" && ok ||
  { bad "zero1,zero2: exit $rc"; tail -3 "$TMP/two.log"; }
# 5. zero3 (SFT, a 4-layer model): each rank keeps its slice of every layer, gathered per layer for
#    the forward and the backward (with checkpointing: before the recompute) and released after, its
#    gradients reduce-scattered right after its backward and released;
#    the evaluations (each rank its share) and the saves gather the whole model. The plain curve, evaluations and
#    final weights; the resident parameter memory between steps (mincore) at most the model less
#    half its layers plus two pages per layer; a checkpoint resumes the same curve; zero2 cannot
#    resume it (other slices). Each rank reads only its slices of the layers from the files (and
#    no broadcast follows): a slice not read would be zeros and change the curve.
"${C[@]}" model init --arch qwen2 --hidden 64 --layers 4 --heads 2 --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" \
  --out "$TMP/model4" >/dev/null || bad "model init"
z3=(--set model.path="$TMP/model4" --set data.eval_file="$TMP/data/eval.jsonl" --set train.eval_steps=4)
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/p4" "${z3[@]}" >"$TMP/p4.log" 2>&1 ||
  { bad "plain 4 layers"; tail -20 "$TMP/p4.log"; }
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/z3" "${z3[@]}" --set memory.strategies=checkpointing,zero3 \
  >"$TMP/z3.log" 2>&1 || { bad "zero3 2 ranks exited $?"; tail -20 "$TMP/z3.log"; }
grep -q "zero3: each rank read its slices of the layers' parameters from $TMP/model4" "$TMP/z3.log" && ok ||
  bad "zero3: not loaded sliced"
curve_close "$TMP/p4" "$TMP/z3" loss 1e-6
curve_close "$TMP/p4" "$TMP/z3" grad_norm 1e-5
# the evaluations (at step 4 and the end) within 1e-6: zero3 averages each micro-batch's gradients
# as the backward makes them (DeepSpeed's order), plain data parallel the accumulated sum
n=$(paste <(curve_col "$TMP/p4" eval_loss) <(curve_col "$TMP/z3" eval_loss) |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6 * $1) bad++; n++ } END { print n + 0, bad + 0 }')
[ "$n" = "2 0" ] && ok || bad "zero3 evaluations ($n): $(curve_col "$TMP/z3" eval_loss | tr '\n' ' ') vs $(curve_col "$TMP/p4" eval_loss | tr '\n' ' ')"
line=$(grep -o "zero3: parameters resident between steps: at most [0-9]* of the model's [0-9]* bytes per rank (layers, embeddings and head [0-9]* bytes, sliced over 2 ranks); gradients: at most [0-9]* of [0-9]* bytes" "$TMP/z3.log")
read -r res buf lay < <(echo "$line" | grep -o '[0-9][0-9]*' | sed -n '2p;3p;4p' | tr '\n' ' ')
read -r gres gbuf < <(echo "$line" | grep -o '[0-9][0-9]*' | sed -n '6p;7p' | tr '\n' ' ')
echo "zero3: resident $res of $buf bytes per rank, layers $lay bytes; gradients $gres of $gbuf bytes"
# the layers' gradients are released after each backward (their slices' sums kept apart)
[ -n "$gres" ] && [ "$gres" -le $((gbuf - lay + 4 * 2 * 4096)) ] && ok || bad "zero3 resident gradients: '$line'"
[ -n "$lay" ] && [ "$res" -le $((buf - lay / 2 + 4 * 2 * 4096)) ] && [ "$res" -ge $((buf - lay / 2 - 4 * 2 * 4096)) ] && ok ||
  bad "zero3 resident parameters: '$line'"
# the final save and checkpoint-N's model streamed to rank 0 (each layer gathered to it alone as the
# writer reaches it; its bytes against the old way's below, at the resume): the final save the same
# bytes as the checkpoint of the same step
for f in model.safetensors config.json generation_config.json; do
  cmp -s "$TMP/z3/$f" "$TMP/z3/checkpoint-8/$f" && ok || bad "zero3: the streamed save's $f differs from checkpoint-8's"
done
for what in "the model" "checkpoint-4's model" "checkpoint-8's model"; do
  grep -q "zero3: $what saved by rank 0 alone, 6 units (layers, embeddings, head) gathered to it one at a time (no rank held the whole model); peak resident memory per rank so far (VmHWM): [0-9]* / [0-9]* MiB" "$TMP/z3.log" && ok ||
    bad "zero3: no streamed-save line for $what: $(grep -o "zero3: .* saved by rank 0.*" "$TMP/z3.log")"
done
# prefetch_bucket_size = auto: 0.9 x 64^2 = 3686 floats, below one 65,856-float layer: the next layer
# only, as DeepSpeed counts (checked before each start); 2 micro-batches x (3 forward + 3 backward)
pf=$(grep -o "[0-9]* layer gathers prefetched in the step (prefetch_bucket_size = 3686 floats: auto, 0.9 x hidden^2)" "$TMP/z3.log" | grep -o '^[0-9]*')
[ "$pf" = 12 ] && ok || bad "zero3 prefetch auto: '$pf' gathers prefetched: $(grep -o "[0-9]* layer gathers prefetched.*" "$TMP/z3.log")"
zl=$(grep -o "zero3: 2 ranks, each steps [0-9]* of [0-9]* trainable floats; optimizer adamw: at most [0-9]* bytes of state per rank, [0-9]* over the ranks" "$TMP/z3.log")
full=$(grep -o "optimizer adamw: [0-9]* bytes of state per rank" "$TMP/p4.log" | grep -o '[0-9]*' | head -1)
[ -n "$zl" ] && [ "$(echo "$zl" | sed 's/.*rank, \([0-9]*\) over.*/\1/')" = "$full" ] && ok || bad "zero3 state: '$zl' vs $full"
# zero3 with offload_activations (the layer inputs in a file on each rank): the same curve, bit for bit
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/z3o" "${z3[@]}" \
  --set memory.strategies=checkpointing,zero3,offload_activations >"$TMP/z3o.log" 2>&1 || { bad "zero3 offload"; tail -20 "$TMP/z3o.log"; }
[ -n "$(curve_col "$TMP/z3" loss)" ] && [ "$(curve_col "$TMP/z3" loss)" = "$(curve_col "$TMP/z3o" loss)" ] &&
  [ "$(curve_col "$TMP/z3" grad_norm)" = "$(curve_col "$TMP/z3o" grad_norm)" ] && ok || bad "zero3 with offload_activations: the curve differs"
mkdir -p "$TMP/z3r" && cp -r "$TMP/z3/checkpoint-4" "$TMP/z3r/"
grep '"step": [1-4],' "$TMP/z3/metrics.jsonl" >"$TMP/z3r/metrics.jsonl"
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/z3r" "${z3[@]}" --set memory.strategies=checkpointing,zero3 \
  --set train.resume_from_checkpoint=last >"$TMP/z3r.log" 2>&1 || { bad "zero3 resume"; tail -20 "$TMP/z3r.log"; }
diff <(curve "$TMP/z3") <(curve "$TMP/z3r") >"$TMP/diff" && ok || { bad "zero3 resumed curve differs"; cat "$TMP/diff"; }
# the same resume saving the old way (CTRL_TEST_ZERO_SAVE_WHOLE: the whole model gathered on every
# rank, then written): its checkpoint-8 and final model byte for byte the streamed run's, and its
# optimizer slices too (the resume from the streamed checkpoint-4 is exact)
mkdir -p "$TMP/z3w" && cp -r "$TMP/z3/checkpoint-4" "$TMP/z3w/"
CTRL_TEST_ZERO_SAVE_WHOLE=1 "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/z3w" "${z3[@]}" \
  --set memory.strategies=checkpointing,zero3 --set train.resume_from_checkpoint=last >"$TMP/z3w.log" 2>&1 ||
  { bad "zero3 resume saving the old way"; tail -20 "$TMP/z3w.log"; }
! grep -q "saved by rank 0 alone" "$TMP/z3w.log" && ok || bad "zero3: CTRL_TEST_ZERO_SAVE_WHOLE still streamed"
for f in model.safetensors checkpoint-8/model.safetensors checkpoint-8/optimizer.rank-0.safetensors \
  checkpoint-8/optimizer.rank-1.safetensors checkpoint-8/config.json; do
  cmp -s "$TMP/z3/$f" "$TMP/z3w/$f" && ok || bad "zero3: the streamed $f differs from the old way's"
done
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/z3r" "${z3[@]}" --set memory.strategies=zero2 \
  --set train.resume_from_checkpoint=last >"$TMP/z3x.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "made with ZeRO-3, \[memory\] strategies has zero2" "$TMP/z3x.log" && ok ||
  { bad "zero2 resume of a zero3 checkpoint: exit $rc"; tail -3 "$TMP/z3x.log"; }
# the next layers' gathers started ahead while fewer than prefetch_bucket_size floats are in flight
# (140000: three 65,856-float layers): the same curve
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/zp" "${z3[@]}" --set memory.strategies=checkpointing,zero3 \
  --set memory.prefetch_bucket_size=140000 --set train.save_strategy=no >"$TMP/zp.log" 2>&1 || { bad "zero3 prefetch"; tail -20 "$TMP/zp.log"; }
curve_close "$TMP/p4" "$TMP/zp" loss 1e-6
curve_close "$TMP/p4" "$TMP/zp" grad_norm 1e-5
pf=$(grep -o "[0-9]* layer gathers prefetched in the step (prefetch_bucket_size = 140000 floats)" "$TMP/zp.log" | grep -o '^[0-9]*')
echo "zero3 prefetch: $pf layer gathers prefetched in the first step"
# 2 micro-batches x (forward: layers 1-3 ahead, backward: 2-0) = 12
[ "$pf" = 12 ] && ok || bad "zero3 prefetch: '$pf' gathers prefetched"
# bf16 compute: the layers' bf16 products read the gathered weights; where the CPU has no bf16
# instructions (forced: CTRL_NO_AVX512BF16) and [train] bf16_fallback = rounded (set here: bf16's
# numbers on every CPU) the model multiplies by a rounded copy, whose layers the gathers round (the
# rest rounded after each step): both follow plain data parallel in bf16.
# (one micro-batch a step, no clipping: the gradients are then plain data parallel's bit for bit --
# a micro-batch's average is the same sum over the ranks -- where rounding the weights to bf16 would
# otherwise turn zero3's reordered sums, 1e-7 apart, into bf16 steps apart)
zb=(--set train.save_strategy=no --set train.dtype=bf16 --set train.bf16_fallback=rounded --set memory.reduce_bucket_size=1
  --set train.gradient_accumulation_steps=1 --set train.max_grad_norm=0)
for nb in 0 1; do
  env=() && [ $nb = 1 ] && env=(-x CTRL_NO_AVX512BF16=1)
  "${MPI[@]}" "${env[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/pb$nb" "${z3[@]}" "${zb[@]}" \
    >"$TMP/pb$nb.log" 2>&1 || { bad "bf16 plain ($nb)"; tail -20 "$TMP/pb$nb.log"; }
  "${MPI[@]}" "${env[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/zb$nb" "${z3[@]}" "${zb[@]}" \
    --set memory.strategies=checkpointing,zero3 >"$TMP/zb$nb.log" 2>&1 || { bad "bf16 zero3 ($nb)"; tail -20 "$TMP/zb$nb.log"; }
  curve_close "$TMP/pb$nb" "$TMP/zb$nb" loss 1e-6
  curve_close "$TMP/pb$nb" "$TMP/zb$nb" grad_norm 1e-5
done
# LoRA: the frozen base's layers sliced too (gathered with the adapters, never reduced or stepped);
# the adapters' curve as plain data parallel's, the base's parameters resident about halved
zl=(--set peft.enabled=true --set peft.target_modules=all-linear --set train.save_strategy=no)
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/pl" "${z3[@]}" "${zl[@]}" >"$TMP/pl.log" 2>&1 ||
  { bad "lora plain 4 layers"; tail -20 "$TMP/pl.log"; }
CTRL_TEST_ZERO3_DIGEST=1 "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/zl" "${z3[@]}" "${zl[@]}" --set memory.strategies=checkpointing,zero3 \
  --set memory.reduce_bucket_size=1 --set train.save_strategy=steps >"$TMP/zl.log" 2>&1 || { bad "lora zero3"; tail -20 "$TMP/zl.log"; }
curve_close "$TMP/pl" "$TMP/zl" loss 1e-6
curve_close "$TMP/pl" "$TMP/zl" grad_norm 1e-5
# its saves (checkpoint-4, checkpoint-8, the final adapter) all-gather the adapters alone, never the
# frozen base: the same bytes as the old way's (the whole model gathered on every rank first,
# CTRL_TEST_ZERO_SAVE_WHOLE, after the base was read whole on every rank, CTRL_TEST_ZERO3_WHOLE_LORA:
# each rank then holds after attach exactly what the sliced read gave it, the digests equal), and a
# resume from the streamed checkpoint-4 follows the same curve
CTRL_TEST_ZERO_SAVE_WHOLE=1 CTRL_TEST_ZERO3_WHOLE_LORA=1 CTRL_TEST_ZERO3_DIGEST=1 "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/zlw" "${z3[@]}" "${zl[@]}" \
  --set memory.strategies=checkpointing,zero3 --set memory.reduce_bucket_size=1 --set train.save_strategy=steps >"$TMP/zlw.log" 2>&1 ||
  { bad "lora zero3 saving the old way"; tail -20 "$TMP/zlw.log"; }
for f in adapter_model.safetensors adapter_config.json checkpoint-4/adapter_model.safetensors \
  checkpoint-8/adapter_model.safetensors checkpoint-8/optimizer.rank-0.safetensors checkpoint-8/optimizer.rank-1.safetensors; do
  [ -f "$TMP/zl/$f" ] && cmp -s "$TMP/zl/$f" "$TMP/zlw/$f" && ok || bad "zero3 LoRA: $f differs from the old way's save (or is missing)"
done
[ ! -e "$TMP/zl/model.safetensors" ] && [ ! -e "$TMP/zl/checkpoint-4/model.safetensors" ] && ok || bad "zero3 LoRA: the base was written"
grep -q "zero3 + LoRA: each rank read its slices of the frozen base from" "$TMP/zl.log" &&
  grep -q "zero3 + LoRA: the frozen base read whole on every rank (CTRL_TEST_ZERO3_WHOLE_LORA)" "$TMP/zlw.log" && ok ||
  bad "zero3 LoRA: no sliced-read line (or whole-read line)"
dz=$(grep -o "zero3: the model gathered whole after attach: digest [0-9a-f]* (every rank's the same)" "$TMP/zl.log")
[ -n "$dz" ] && [ "$dz" = "$(grep -o "zero3: the model gathered whole after attach: digest [0-9a-f]* (every rank's the same)" "$TMP/zlw.log")" ] &&
  ok || bad "zero3 LoRA: the sliced read's slices differ from the whole read's: '$dz'"
# digest_pair NAME WHAT SETTINGS...: a zero3 LoRA run reading its base sliced (NAME) and one reading it whole
# (NAME-w), each hashing the model gathered after attach: the same digest and loss curve, and the sliced
# read said; the digest into DIGEST
digest_pair() {
  local name=$1 what=$2 w d && shift 2
  for w in "$name" "$name-w"; do
    env $([ "$w" = "$name-w" ] && echo CTRL_TEST_ZERO3_WHOLE_LORA=1) CTRL_TEST_ZERO3_DIGEST=1 "${MPI[@]}" "${C[@]}" \
      train "$TMP/run.ini" --set run.output_dir="$TMP/$w" "${z3[@]}" --set peft.enabled=true \
      --set train.save_strategy=no "$@" >"$TMP/$w.log" 2>&1 || { bad "lora zero3 $what ($w)"; tail -20 "$TMP/$w.log"; }
  done
  curve_close "$TMP/$name-w" "$TMP/$name" loss 1e-6
  DIGEST=$(grep -o "zero3: the model gathered whole after attach: digest [0-9a-f]*" "$TMP/$name.log")
  [ -n "$DIGEST" ] && [ "$DIGEST" = "$(grep -o "zero3: the model gathered whole after attach: digest [0-9a-f]*" "$TMP/$name-w.log")" ] &&
    grep -q "zero3 + LoRA: each rank read its slices of the frozen base from" "$TMP/$name.log" && ok ||
    bad "zero3 LoRA $what: not read sliced, or its slices differ from the whole read's: '$DIGEST'"
}
# [peft] adapter_path (zl's adapter): the base read sliced as without it, the adapters read into the
# model after it (as a resume's); its digest is not zl's (the adapters read, not made)
digest_pair za adapter_path --set peft.adapter_path="$TMP/zl" --set memory.strategies=checkpointing,zero3
[ "$DIGEST (every rank's the same)" != "$dz" ] && ok || bad "zero3 LoRA adapter_path: the adapter was not read"
# modules_to_save = embed_tokens, lm_head: their trained copies read sliced as the rest (rank 0 then holds
# only its slices of them, so they are not broadcast from it)
digest_pair zm modules_to_save --set peft.modules_to_save=embed_tokens,lm_head --set memory.strategies=zero3
# DoRA: the base read sliced too -- the magnitudes the load sets are the norms of each rank's part of
# every row, made whole by summing their squares over the ranks (train_lora.c) --; the whole read's
# curve (its digest differs in the magnitudes' last bits: a row's squares are added in another order);
# with init_lora_weights = false (B not zero: each rank's part counted s B A whole, the extra ranks'
# ||s B A||^2 taken off) too
for w in zd zd-w zf zf-w; do
  f=() && case $w in zf*) f=(--set peft.init_lora_weights=false) ;; esac
  env $(case $w in *-w) echo CTRL_TEST_ZERO3_WHOLE_LORA=1 ;; esac) "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" \
    --set run.output_dir="$TMP/$w" "${z3[@]}" "${zl[@]}" --set peft.use_dora=true --set memory.strategies=zero3 "${f[@]}" \
    >"$TMP/$w.log" 2>&1 || { bad "DoRA zero3 ($w)"; tail -20 "$TMP/$w.log"; }
done
for d in zd zf; do
  curve_close "$TMP/$d-w" "$TMP/$d" loss 1e-6
  curve_close "$TMP/$d-w" "$TMP/$d" grad_norm 1e-5
  grep -q "zero3 + LoRA: each rank read its slices of the frozen base from" "$TMP/$d.log" && ok || bad "zero3 DoRA ($d): not read sliced"
done
[ "$(curve_col "$TMP/zf" loss | head -1)" != "$(curve_col "$TMP/zd" loss | head -1)" ] && ok || bad "zero3 DoRA init false: init true's first loss"
for what in "the adapter" "checkpoint-4's adapter" "checkpoint-8's adapter"; do
  grep -q "zero3: $what saved from the adapters alone, 4 layers' adapter slices all-gathered (the frozen base never gathered); peak resident memory per rank so far (VmHWM): [0-9]* / [0-9]* MiB" "$TMP/zl.log" && ok ||
    bad "zero3 LoRA: no adapter-save line for $what: $(grep -o "zero3: .* saved .*" "$TMP/zl.log")"
done
mkdir -p "$TMP/zlr" && cp -r "$TMP/zl/checkpoint-4" "$TMP/zlr/"
grep '"step": [1-4],' "$TMP/zl/metrics.jsonl" >"$TMP/zlr/metrics.jsonl"
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/zlr" "${z3[@]}" "${zl[@]}" --set memory.strategies=checkpointing,zero3 \
  --set memory.reduce_bucket_size=1 --set train.save_strategy=steps --set train.resume_from_checkpoint=last >"$TMP/zlr.log" 2>&1 ||
  { bad "lora zero3 resume"; tail -20 "$TMP/zlr.log"; }
diff <(curve "$TMP/zl") <(curve "$TMP/zlr") >"$TMP/diff" && cmp -s "$TMP/zl/adapter_model.safetensors" "$TMP/zlr/adapter_model.safetensors" &&
  ok || { bad "zero3 LoRA resumed curve or adapter differs"; cat "$TMP/diff"; }
line=$(grep -o "zero3: parameters resident between steps: at most [0-9]* of the model's [0-9]* bytes per rank (layers, embeddings and head [0-9]* bytes, sliced over 2 ranks)" "$TMP/zl.log")
read -r res buf lay < <(echo "$line" | grep -o '[0-9][0-9]*' | sed -n '2p;3p;4p' | tr '\n' ' ')
echo "zero3 LoRA: resident $res of $buf bytes per rank, layers (base + adapters) $lay bytes"
[ -n "$lay" ] && [ "$lay" -ge 1053696 ] && [ "$res" -le $((buf - lay / 2 + 8 * 2 * 4096)) ] && ok || bad "zero3 LoRA resident: '$line'"
# (server-mode generation with zero3: tests/e2e/test_zero3_trainers_mpi.sh)

# 6. zero2's gradients partitioned during the backward (DeepSpeed stage 2): buckets of consecutive
#    layers (reduce_bucket_size floats: here two of the four 65,856-float layers) reduce-scattered
#    as the backward completes them, then released, the units outside the layers at its end; each
#    rank keeps its slices' averages. The plain curve; the gradient buffer's resident bytes just
#    before each reduction (mincore, the first step) at most what lies outside the layers plus one
#    bucket (+ two pages per unit at the slices' edges); the averaged slices half the buffer.
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/z2b" "${z3[@]}" --set memory.strategies=checkpointing,zero2 \
  --set memory.reduce_bucket_size=140000 >"$TMP/z2b.log" 2>&1 || { bad "zero2 buckets 2 ranks exited $?"; tail -20 "$TMP/z2b.log"; }
curve_close "$TMP/p4" "$TMP/z2b" loss 1e-6
curve_close "$TMP/p4" "$TMP/z2b" grad_norm 1e-5
line=$(grep -o "zero2: gradients during the backward: at most [0-9]* of [0-9]* bytes resident per rank ([0-9]* buckets of layers, reduce_bucket_size = 140000 floats); averaged slices kept: [0-9]* bytes" "$TMP/z2b.log")
read -r peak gbuf nb kept < <(echo "$line" | grep -o '[0-9][0-9]*' | sed -n '2p;3p;4p;6p' | tr '\n' ' ')
whole=$(grep -o "zero3: gradients during the backward: at most [0-9]* of" "$TMP/z3.log" | grep -o '[0-9][0-9]*' | sed -n 2p)
echo "zero2 (buckets of 2 layers): gradients resident at most $peak of $gbuf bytes during the backward, $nb buckets, slices kept $kept bytes; a bucket a layer (zero3's default, auto: hidden^2 = 4096 floats): $whole"
lay=1053696 # the 4 layers' bytes (4 x 65,856 floats; zero3's line above counts the embeddings and head too)
[ "$nb" = 2 ] && [ -n "$peak" ] && [ "$peak" -le $((gbuf - lay + lay / 2 + 6 * 2 * 4096)) ] && [ $((kept * 2)) -le $((gbuf + 64)) ] &&
  [ $((kept * 2)) -ge $((gbuf - 64)) ] && ok || bad "zero2 gradient partitions: '$line' (layers $lay bytes)"
[ -n "$whole" ] && [ "$whole" -lt "$peak" ] && ok || bad "zero2's buckets of 2 layers hold no more than auto's bucket a layer: $peak vs '$whole'"
grep -q "zero3: gradients during the backward: .* (4 buckets of layers, reduce_bucket_size = 4096 floats: auto, hidden^2)" "$TMP/z3.log" && ok ||
  bad "zero3: reduce_bucket_size auto: $(grep -o 'zero3: gradients during the backward.*' "$TMP/z3.log")"

# overlap_comm: each bucket's reduce-scatters left in flight while the backward goes on (finished
# when the next bucket closes or the backward ends): the same curve, zero2 and zero3 (with prefetch)
for z in zero2 zero3; do
  "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/ov$z" "${z3[@]}" --set memory.strategies=checkpointing,$z \
    --set memory.reduce_bucket_size=1 --set memory.overlap_comm=true --set train.save_strategy=no >"$TMP/ov$z.log" 2>&1 ||
    { bad "$z overlap_comm"; tail -20 "$TMP/ov$z.log"; }
  curve_close "$TMP/p4" "$TMP/ov$z" loss 1e-6
  curve_close "$TMP/p4" "$TMP/ov$z" grad_norm 1e-5
done

# 7. DPO (the sequence kind: a live reference model) with zero3 on 2 ranks: plain data parallel's
#    curve and metrics (TR-DPO's reference sync with zero3: tests/e2e/test_zero3_trainers_mpi.sh).
FIX="$SRC/tests/fixtures"
sed -e "s|@DIR@/|$FIX/trl_dpo/|; s|@DIR@|$FIX/trl_dpo|; s|@SFT@|$FIX/trl_sft|; s|@OUT@|$TMP/dpo|" -e "s/^max_steps = 20/max_steps = 6/" \
  -e "s/^per_device_train_batch_size = .*/per_device_train_batch_size = 2/" "$FIX/trl_dpo/sigmoid.ini" >"$TMP/dpo.ini"
"${MPI[@]}" "${C[@]}" train "$TMP/dpo.ini" >"$TMP/dpo.log" 2>&1 || { bad "dpo 2 ranks"; tail -20 "$TMP/dpo.log"; }
"${MPI[@]}" "${C[@]}" train "$TMP/dpo.ini" --set run.output_dir="$TMP/dpo3" --set memory.strategies=checkpointing,zero3 \
  --set memory.reduce_bucket_size=1 >"$TMP/dpo3.log" 2>&1 || { bad "dpo zero3 2 ranks"; tail -20 "$TMP/dpo3.log"; }
for key in loss rewards/margins logps/chosen logps/rejected; do curve_close "$TMP/dpo" "$TMP/dpo3" "$key" 1e-6 1e-9; done
curve_close "$TMP/dpo" "$TMP/dpo3" grad_norm 1e-5
finish
