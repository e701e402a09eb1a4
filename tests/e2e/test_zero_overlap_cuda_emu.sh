#!/usr/bin/env bash
# overlap_comm on CUDA (issue 19; core/train/zero_device.c, core/collective/backend_nccl.c): with zero2
# and zero3 on [run] device = cuda, each bucket's reduce-scatter is queued on the communication stream
# (NCCL) after the kernels that wrote its gradients, the backward goes on with the next layers on the
# compute stream, and the compute stream waits for it (an event) before the slice is added to the sums
# and the bucket zeroed. 2 ranks under the CUDA emulator, whose NCCL runs a collective queued on a
# stream only when something waits for it (kernels/cuda/emu/README.md): a missing wait reads the
# gradients from before the reduction. The same reductions in the same order on the same buffers as
# overlap_comm = false, so the same curve and weights bit for bit -- zero2 and zero3, fp32 and bf16,
# with gradient accumulation and clipping; zero3 with offload_optimizer --, a resume from an overlapped run's checkpoint repeats it
# exactly, and the run's log line counts the reductions still in flight when a later layer's backward
# began. Where nothing is reduced during the backward (zero1, zero2 + offload_optimizer, no ZeRO) the
# key is refused.
# usage: test_zero_overlap_cuda_emu.sh CTRL_BINARY EMU_PLUGIN_DIR SOURCE_DIR EMU_LIBCTRL_CUDA EMU_LIBCTRL_MPI
source "$(dirname "$0")/e2e_common.sh"
cuda_emu_mpi_setup "$4" "$5"
tiny_setup 7 3
INI_DEVICE=cuda tiny_ini "$TMP/run.ini" "$TMP/x" <<INI
learning_rate = 3e-3
max_steps = 4
per_device_train_batch_size = 2
gradient_accumulation_steps = 2
logging_steps = 1
save_strategy = no
weight_decay = 0.1
max_grad_norm = 0.05
INI
run() { mpi_train "$@"; }
curve() { sed 's/, "tokens_per_second": [0-9.e+-]*//' "$1/metrics.jsonl"; }
same() { # same DIR_A DIR_B WHAT: the curves and the final weights bit for bit
  [ -s "$TMP/$1/metrics.jsonl" ] && diff <(curve "$TMP/$1") <(curve "$TMP/$2") >"$TMP/diff" && ok ||
    { bad "$3: the curves differ"; cat "$TMP/diff"; }
  cmp -s "$TMP/$1/model.safetensors" "$TMP/$2/model.safetensors" && ok || bad "$3: the weights differ"
}
flight() { grep -o "overlap_comm on cuda: [0-9]* reduce-scatters queued on the communication stream during the backwards, [0-9]* of them still in flight when a later layer's backward began" "$1"; }
for z in zero2 zero3; do
  for dt in fp32 bf16; do
    s=(--set memory.strategies=$z --set memory.reduce_bucket_size=1 --set train.dtype=$dt)
    run "$z$dt" "${s[@]}"
    run "$z${dt}o" "${s[@]}" --set memory.overlap_comm=true
    same "$z$dt" "$z${dt}o" "$z $dt overlap_comm"
    # 3 layers, a bucket each, 4 steps x 2 micro-batches: 24 reductions started; in flight as a later
    # layer's backward began: layer 2's as layer 1's begins, layer 1's as layer 0's does, 16
    read -r started behind < <(flight "$TMP/$z${dt}o.log" | grep -o '[0-9][0-9]*' | tr '\n' ' ')
    echo "$z $dt overlap_comm on cuda: $started reduce-scatters started, $behind in flight when a later layer's backward began"
    [ "$started" = 24 ] && [ "$behind" = 16 ] && ok || bad "$z $dt overlap_comm: '$(flight "$TMP/$z${dt}o.log")'"
  done
done
# zero3 with offload_optimizer (the slices' sums brought to the host after the backward's last wait,
# stepped there): the same bit for bit too
s=(--set memory.strategies=zero3,offload_optimizer --set memory.reduce_bucket_size=1)
run z3off "${s[@]}"
run z3offo "${s[@]}" --set memory.overlap_comm=true
same z3off z3offo "zero3 offload_optimizer overlap_comm"
[ -n "$(flight "$TMP/z3offo.log")" ] && ok || bad "zero3 offload_optimizer overlap_comm: no overlap line"
# clipping was active (max_grad_norm 0.05 under every step's norm)
[ -z "$(curve_col "$TMP/zero2fp32o" grad_norm | awk '$1 <= 0.05')" ] && ok || bad "clipping not active: $(curve_col "$TMP/zero2fp32o" grad_norm | tr '\n' ' ')"
# a resume from an overlapped run's checkpoint-2 repeats steps 3-4 exactly (zero2 fp32, zero3 bf16)
for zd in "zero2 fp32" "zero3 bf16"; do
  read -r z dt <<<"$zd"
  s=(--set memory.strategies=$z --set memory.reduce_bucket_size=1 --set train.dtype=$dt --set memory.overlap_comm=true)
  run "c$z" "${s[@]}" --set train.save_strategy=steps --set train.save_steps=2
  same "$z${dt}o" "c$z" "$z $dt overlap_comm saving checkpoints"
  mkdir -p "$TMP/r$z" && cp -r "$TMP/c$z/checkpoint-2" "$TMP/r$z/"
  grep '"step": [1-2],' "$TMP/c$z/metrics.jsonl" >"$TMP/r$z/metrics.jsonl"
  run "r$z" "${s[@]}" --set train.resume_from_checkpoint=last
  same "c$z" "r$z" "$z $dt overlap_comm resumed from checkpoint-2"
done
# where nothing is reduced during the backward, refused naming the key (exit 2): zero1 (all-reduced after
# it), zero2 with offload_optimizer on the device (reduced on the host), no ZeRO
for s in zero1 zero2,offload_optimizer checkpointing; do
  "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/ref" --set memory.strategies=$s --set memory.overlap_comm=true \
    >"$TMP/ref.log" 2>&1
  rc=$?
  [ $rc = 2 ] && grep -q -- "--set memory.overlap_comm: \[memory\] overlap_comm = true applies to zero2 and zero3" "$TMP/ref.log" && ok ||
    { bad "overlap_comm with $s: exit $rc"; tail -3 "$TMP/ref.log"; }
done
finish
