#!/usr/bin/env bash
# Data parallel and ZeRO on CUDA over NCCL, 2 ranks under the CUDA emulator (issue 19; core/train/
# zero_device.c, core/collective/backend_nccl.c): `mpirun -np 2 ctrl train` with [run] device = cuda
# on the emulated runtime (CTRL_CUDA_LIBRARY), NCCL (emu_nccl.c, TCP between the ranks) and the
# libctrl_mpi.so built on them (CTRL_MPI_LIBRARY), each rank its own emulated device
# (CTRL_EMU_DEVICES=2). Plain data parallel (ncclAllReduce of the device gradients) follows the CPU's
# 2-rank curve (loss within 1e-5, as test_cuda_train's CUDA-vs-CPU curves); zero2 on the device
# (ncclReduce per rank's slice as each bucket of layers completes in the backward, the slices' sums
# and AdamW's state in device memory, the slices all-gathered with ncclBroadcast after the step)
# follows plain data parallel on CUDA (1e-6) with half of the optimizer state and of the gradient
# sums per rank (the run's log line, checked), and a 2-rank resume of its checkpoint repeats the
# curve; zero3 on the device (each rank's slices of the layers in device memory, the rest of a layer
# mapped, gathered over NCCL and unmapped around each use: section below; no device ever holding the
# whole model, each rank putting its slices there from its host) follows it too, with the per-rank
# device bytes the run logs checked. zero3 with NF4 on CUDA is refused naming the key
# (overlap_comm on CUDA: test_zero_overlap_cuda_emu.sh; GKD and server mode with zero3 on CUDA:
# test_zero3_trainers_cuda_emu.sh).
# usage: test_zero_cuda_emu.sh CTRL_BINARY EMU_PLUGIN_DIR SOURCE_DIR EMU_LIBCTRL_CUDA EMU_LIBCTRL_MPI
source "$(dirname "$0")/e2e_common.sh"
cuda_emu_mpi_setup "$4" "$5"
tiny_setup 7 4
cat >"$TMP/run.ini" <<INI
[run]
output_dir = $TMP/cpu
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train.jsonl
[train]
learning_rate = 3e-3
max_steps = 6
per_device_train_batch_size = 2
gradient_accumulation_steps = 2
logging_steps = 1
save_steps = 3
weight_decay = 0.1
max_grad_norm = 0.5
dtype = fp32
INI
run() { mpi_train "$@"; }
run cpu --set train.save_strategy=no
head -16 "$TMP/data/eval.jsonl" >"$TMP/data/eval16.jsonl" # evaluations on the emulator: few rows
ev=(--set data.eval_file="$TMP/data/eval16.jsonl" --set train.eval_steps=3)
run dp --set run.device=cuda --set train.save_strategy=no "${ev[@]}"
run z2 --set run.device=cuda --set memory.strategies=zero2 --set memory.reduce_bucket_size=1
grep -q "optimizer adamw: steps on the device" "$TMP/dp.log" && ok || bad "dp: $(grep optimizer "$TMP/dp.log")"
curve_close "$TMP/cpu" "$TMP/dp" loss 1e-5
curve_close "$TMP/cpu" "$TMP/dp" grad_norm 1e-4
grep -q "optimizer adamw: steps this rank's slices on the device (zero2" "$TMP/z2.log" && ok ||
  bad "zero2: $(grep optimizer "$TMP/z2.log")"
curve_close "$TMP/dp" "$TMP/z2" loss 1e-6
curve_close "$TMP/dp" "$TMP/z2" mean_token_accuracy 1e-6
curve_close "$TMP/dp" "$TMP/z2" grad_norm 1e-5
curve_close "$TMP/cpu" "$TMP/z2" loss 1e-5
# what each rank holds on the device: half of AdamW's state and of the gradient sums
zl=$(grep -o "zero2: 2 ranks, each steps [0-9]* of [0-9]* trainable floats; optimizer adamw: at most [0-9]* bytes of state per rank, [0-9]* over the ranks" "$TMP/z2.log")
full=$(echo "$zl" | sed 's/.*rank, \([0-9]*\) over.*/\1/')
n_train=$(echo "$zl" | grep -o '[0-9][0-9]*' | sed -n 4p)
[ -n "$n_train" ] && [ "$full" = $((8 * n_train)) ] && ok || bad "zero2: AdamW's state over the ranks: '$zl'" # exp_avg, exp_avg_sq
line=$(grep -o "zero2 on the device: per rank at most [0-9]* bytes of gradient slices' sums (of [0-9]*) and [0-9]* of optimizer state" "$TMP/z2.log")
read -r sums grads state < <(echo "$line" | grep -o '[0-9][0-9]*' | sed -n '2p;3p;4p' | tr '\n' ' ')
echo "zero2 on CUDA, per rank: gradient sums $sums of $grads bytes, optimizer state $state of $full bytes"
[ -n "$state" ] && [ -n "$full" ] && [ $((state * 2)) -le $((full + 64)) ] && [ $((state * 2)) -ge $((full - 64)) ] &&
  [ $((sums * 2)) -le $((grads + 64)) ] && ok || bad "zero2 device bytes: '$line' (unsharded state '$full')"
# the checkpoint (each rank's state from the device) resumes the same curve on 2 ranks
ck=$TMP/z2/checkpoint-3
[ -f "$ck/optimizer.rank-0.safetensors" ] && [ -f "$ck/optimizer.rank-1.safetensors" ] && ok || bad "checkpoint-3: $(ls "$ck")"
mkdir -p "$TMP/res" && cp -r "$ck" "$TMP/res/"
grep '"step": [1-3],' "$TMP/z2/metrics.jsonl" >"$TMP/res/metrics.jsonl"
run res --set run.device=cuda --set memory.strategies=zero2 --set memory.reduce_bucket_size=1 \
  --set train.resume_from_checkpoint=last
curve() { sed 's/, "tokens_per_second": [0-9.]*//' "$1/metrics.jsonl"; }
diff <(curve "$TMP/z2") <(curve "$TMP/res") >"$TMP/diff" && ok || { bad "zero2 on CUDA: resumed curve differs"; cat "$TMP/diff"; }
# GRPO (its own share of the generation batch per rank, sampled on the device): zero2 on CUDA draws the
# same completions and follows the same rewards and gradient norms as plain data parallel on CUDA
INI_TRAIN="dtype = fp32" online_ini grpo g 2 "[grpo]" "num_generations = 4" "max_completion_length = 12" |
  sed 's/^device = cpu/device = cuda/' >"$TMP/grpo.ini"
for name in g gz; do
  z=() && [ $name = gz ] && z=(--set memory.strategies=zero2)
  "${MPI[@]}" "${C[@]}" train "$TMP/grpo.ini" --set run.output_dir="$TMP/$name" "${z[@]}" >"$TMP/$name.log" 2>&1 ||
    { bad "grpo $name: exited $?"; tail -20 "$TMP/$name.log"; }
done
for key in reward grad_norm; do
  [ -n "$(curve_col "$TMP/g" $key)" ] && [ "$(curve_col "$TMP/g" $key)" = "$(curve_col "$TMP/gz" $key)" ] && ok ||
    bad "grpo zero2 on cuda: $key $(curve_col "$TMP/gz" $key | tr '\n' ' ') vs $(curve_col "$TMP/g" $key | tr '\n' ' ')"
done
# zero3 on CUDA: each rank keeps its slice of every layer on its device (the pieces of device memory
# that hold the rest unmapped), each layer all-gathered over NCCL into memory mapped for its forward
# and again for its backward, unmapped after (the emulator faults on a touch of unmapped memory: a
# missing gather crashes the run), its gradients mapped for its backward and reduce-scattered and
# unmapped after (one layer a bucket here), the next layers' gathers prefetched; the evaluations'
# forwards gather each layer around its use as the training's (every rank running as many), the saves
# gather the whole model (checkpoint-3, checkpoint-6 and the final one: 3 whole gathers). The plain
# curve and evaluations of data parallel on CUDA.
run z3 --set run.device=cuda --set memory.strategies=zero3 --set memory.reduce_bucket_size=1 "${ev[@]}"
curve_close "$TMP/dp" "$TMP/z3" loss 1e-6
curve_close "$TMP/dp" "$TMP/z3" grad_norm 1e-5
curve_close "$TMP/cpu" "$TMP/z3" loss 1e-5 # and the CPU's 2-rank run, as data parallel on CUDA
n=$(paste <(curve_col "$TMP/dp" eval_loss) <(curve_col "$TMP/z3" eval_loss) |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6 * $1) bad++; n++ } END { print n + 0, bad + 0 }')
[ "$n" = "2 0" ] && ok || bad "zero3 evaluations ($n)"
grep -q "zero3: the whole model gathered on every rank 3 time(s)" "$TMP/z3.log" && ok ||
  bad "zero3 on cuda: $(grep -o 'the whole model gathered on every rank [0-9]* time' "$TMP/z3.log"), want 3 (the saves)"
# no device ever held the whole model (as DeepSpeed's zero.Init): the move to the device copied none of
# it, each rank put its slices there from its host; the allocator's memory in use then (the emulator's
# count leaves the mapped pieces out) under the model's parameter bytes -- a whole copy, freed, stays
# in the caching allocator
zi=$(grep -o "zero3 on cuda: each rank put its slices of the parameters on its device from the host (the move to the device copied none: no device held the whole model); device memory in use now [0-9]* of [0-9]* bytes (the model's parameters [0-9]* bytes)" "$TMP/z3.log")
read -r used _ pbytes < <(echo "$zi" | grep -o '[0-9][0-9]*' | tail -3 | tr '\n' ' ')
echo "zero3 on CUDA at its start: device memory in use $used bytes, the model's parameters $pbytes bytes"
[ -n "$pbytes" ] && [ "$used" -lt "$pbytes" ] && ok || bad "zero3 on cuda: the whole model on the device at start: '$zi'"
# what a rank holds on its device between steps: the model less the other rank's half of the layers,
# the embeddings and the head (all sliced), the gradients of the final norm only (the embeddings' and
# head's mapped from their first use in a backward to their reduce-scatter, as a layer's), half
# of the gradient sums and of AdamW's state (give or take the pieces the slices share: two per unit
# and the ends)
d3() { grep -o "zero3 on the device: per rank between steps at most [0-9]* of the model's [0-9]* bytes of parameters (layers, embeddings and head [0-9]* bytes, sliced over 2 ranks), [0-9]* of [0-9]* bytes of gradients, [0-9]* bytes of gradient slices' sums and [0-9]* of optimizer state; the most mapped in the first step: parameters [0-9]*, gradients [0-9]* bytes (pieces of [0-9]* bytes); [0-9]* layer gathers prefetched" "$1"; }
read -r pm p lay gm g sums state pk gk piece pf < <(d3 "$TMP/z3.log" | grep -o '[0-9][0-9]*' | sed -n '2p;3p;4p;6p;7p;8p;9p;10p;11p;12p;13p' | tr '\n' ' ')
echo "zero3 on CUDA, per rank between steps: parameters $pm of $p bytes (layers $lay), gradients $gm of $g, sums $sums, optimizer state $state; the most mapped in the step: parameters $pk, gradients $gk (pieces of $piece bytes); $pf gathers prefetched"
echo "zero3 on CUDA: $((pm + gm + sums + state)) bytes per rank of parameters, gradients and optimizer state against $((p + g + 2 * g)) unsharded"
slop=$((10 * ${piece:-0}))
[ -n "$pf" ] && [ $((2 * (pm - (p - lay)) - lay)) -le $((2 * slop)) ] && [ $((2 * (pm - (p - lay)) - lay)) -ge $((-2 * slop)) ] &&
  [ $((gm - (g - lay))) -le "$slop" ] && [ $((sums * 2)) -le $((g + 64)) ] && [ $((state * 2)) -le $((2 * g + 64)) ] && ok ||
  bad "zero3 device bytes: '$(d3 "$TMP/z3.log")'"
# the next layers' gathers prefetched on the side stream (prefetch_bucket_size: every layer here): 2
# micro-batches x (forward: layers 1-3 ahead, backward: 2-0); with 0 none, and at most one layer's other
# half mapped beyond the slices at a time
[ "$pf" = 12 ] && ok || bad "zero3 prefetch: '$pf' gathers"
run z3p --set run.device=cuda --set memory.strategies=zero3 --set memory.reduce_bucket_size=1 \
  --set memory.prefetch_bucket_size=0 --set train.save_strategy=no --set train.max_steps=2
[ "$(curve_col "$TMP/z3p" loss)" = "$(curve_col "$TMP/z3" loss | head -2)" ] && ok || bad "zero3 without prefetch: another curve"
read -r pm0 pk0 pf0 < <(d3 "$TMP/z3p.log" | grep -o '[0-9][0-9]*' | sed -n '2p;10p;13p' | tr '\n' ' ')
[ "$pf0" = 0 ] && [ -n "$pk0" ] && [ $((pk0 - pm0)) -le $((lay / 4 / 2 + 2 * ${piece:-0})) ] && ok ||
  bad "zero3 without prefetch: '$(d3 "$TMP/z3p.log")'"
# its checkpoint resumes the same curve on 2 ranks
mkdir -p "$TMP/r3" && cp -r "$TMP/z3/checkpoint-3" "$TMP/r3/"
grep '"step": [1-3],' "$TMP/z3/metrics.jsonl" >"$TMP/r3/metrics.jsonl"
run r3 --set run.device=cuda --set memory.strategies=zero3 --set memory.reduce_bucket_size=1 "${ev[@]}" \
  --set train.resume_from_checkpoint=last
diff <(curve "$TMP/z3") <(curve "$TMP/r3") >"$TMP/diff" && ok || { bad "zero3 on CUDA: resumed curve differs"; cat "$TMP/diff"; }
# stage3_param_persistence_threshold = auto (10 x hidden: 320 elements) in fp32 (bf16: test_zero3_cuda_emu.sh): the norms and biases kept
# whole on every rank's device (mapped for the run, their slices all-gathered over NCCL after each step),
# each layer's gathers fetching its other tensors' runs: data parallel on CUDA's curve (1e-6) and the
# CPU's zero3 run at auto (1e-5), the same tensors kept whole, fewer floats gathered than at 0
run pz --set run.device=cuda --set memory.strategies=zero3 --set memory.reduce_bucket_size=1 \
  --set memory.stage3_param_persistence_threshold=auto --set train.save_strategy=no
run pc --set memory.strategies=zero3 --set memory.reduce_bucket_size=1 \
  --set memory.stage3_param_persistence_threshold=auto --set train.save_strategy=no
curve_close "$TMP/dp" "$TMP/pz" loss 1e-6
curve_close "$TMP/dp" "$TMP/pz" grad_norm 1e-5
curve_close "$TMP/pc" "$TMP/pz" loss 1e-5
gl() { grep -o "zero3: the step all-gathered [0-9]* parameter floats in [0-9]* collectives, [0-9]* tensors around their uses and persistent (stage3_param_persistence_threshold = [0-9]* elements: [0-9]* tensors" "$1" | sed 's/^zero3: //'; }
nums() { gl "$1" | sed 's/.*gathered \([0-9]*\) parameter floats.*threshold = \([0-9]*\) elements: \([0-9]*\) tensors/\1 \2 \3/'; }
read -r fz _ _ < <(nums "$TMP/z3.log")
read -r fp tp np < <(nums "$TMP/pz.log")
read -r _ tc nc < <(nums "$TMP/pc.log")
echo "zero3 on CUDA at threshold auto: $(gl "$TMP/pz.log"); at 0: $fz floats"
[ "$tp" = 320 ] && [ "${np:-0}" -gt 0 ] && [ "$np" = "$nc" ] && [ "$tc" = 320 ] && [ "$fp" -lt "$fz" ] && ok ||
  bad "zero3 persistence on cuda: '$(gl "$TMP/pz.log")' vs the cpu's '$(gl "$TMP/pc.log")', at 0 $fz floats"
finish
