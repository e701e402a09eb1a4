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
# curve. overlap_comm with zero2 on CUDA is refused naming the key.
# usage: test_zero_cuda_emu.sh CTRL_BINARY EMU_PLUGIN_DIR SOURCE_DIR EMU_LIBCTRL_CUDA EMU_LIBCTRL_MPI
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
export CTRL_CUDA_LIBRARY=$4 CTRL_MPI_LIBRARY=$5 CTRL_EMU_DEVICES=2
MPI+=(-x CTRL_CUDA_LIBRARY -x CTRL_MPI_LIBRARY -x CTRL_EMU_DEVICES -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
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
run() { # run NAME ARGS...: a 2-rank run into $TMP/NAME
  local name=$1 && shift
  "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/$name" "$@" >"$TMP/$name.log" 2>&1 ||
    { bad "$name: exited $?"; tail -20 "$TMP/$name.log"; }
}
run cpu --set train.save_strategy=no
run dp --set run.device=cuda --set train.save_strategy=no
run z2 --set run.device=cuda --set memory.strategies=zero2 --set memory.reduce_bucket_size=1
grep -q "optimizer adamw: steps on the device" "$TMP/dp.log" && ok || bad "dp: $(grep optimizer "$TMP/dp.log")"
curve_close "$TMP/cpu" "$TMP/dp" loss 1e-5
curve_close "$TMP/cpu" "$TMP/dp" grad_norm 1e-4
grep -q "optimizer adamw: steps this rank's slices on the device (zero2" "$TMP/z2.log" && ok ||
  bad "zero2: $(grep optimizer "$TMP/z2.log")"
curve_close "$TMP/dp" "$TMP/z2" loss 1e-6
curve_close "$TMP/dp" "$TMP/z2" mean_token_accuracy 1e-6
curve_close "$TMP/dp" "$TMP/z2" grad_norm 1e-5
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
# overlap_comm: not on the device yet, refused naming the key (exit 2)
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/ov" --set run.device=cuda --set memory.strategies=zero2 \
  --set memory.overlap_comm=true >"$TMP/ov.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "\[memory\] overlap_comm = true with zero2 on \[run\] device = cuda" "$TMP/ov.log" && ok ||
  { bad "overlap_comm on cuda: exit $rc"; tail -3 "$TMP/ov.log"; }
finish
