#!/usr/bin/env bash
# ZeRO-3 on CUDA with offload_optimizer, 2 ranks under the CUDA emulator (issue 19; core/train/
# zero_device.c): the layers sliced and gathered on the device as zero3's, the gradients
# reduce-scattered over NCCL into each rank's slices' sums on the device, brought to the host, where
# AdamW steps the rank's fp32 slices (the host's parameters: the masters) with its state in host
# memory; the updated slices are copied to the device (in bf16 rounded there into the bf16 slices)
# and those outside the layers all-gathered. The curve is zero3's on the device (fp32: 1e-6; bf16:
# bf16's tolerance against data parallel in bf16), no optimizer state nor fp32 master in device
# memory (the run's log line), and a 2-rank resume of checkpoint-3 repeats the curve and the model.
# The host step is overlapped with the next step's compute (offload_overlap.c over zero3's units:
# each unit's slice stepped on a host thread in forward order, uploaded on the upload stream, waited
# for before the unit's gather -- the emulator runs an upload only when the compute stream waits for
# it, so a missing wait gathers the last step's slice): the curve and model of offload_overlap =
# false bit for bit (fp32 with checkpoints; bf16 with gradient accumulation), unit steps running
# after the next forward began (CTRL_TEST_OFFLOAD_HOLD).
# usage: test_zero3_offload_cuda_emu.sh CTRL_BINARY EMU_PLUGIN_DIR SOURCE_DIR EMU_LIBCTRL_CUDA EMU_LIBCTRL_MPI
source "$(dirname "$0")/e2e_common.sh"
cuda_emu_mpi_setup "$4" "$5"
tiny_setup 7 3
cuda_run_ini "$TMP/run.ini"
run() { mpi_train "$@"; }
z3=(--set memory.reduce_bucket_size=1)
run z3 "${z3[@]}" --set memory.strategies=zero3 --set train.save_strategy=no
m0=("${MPI[@]}") && export CTRL_TEST_OFFLOAD_HOLD=1 && MPI+=(-x CTRL_TEST_OFFLOAD_HOLD)
run z3o "${z3[@]}" --set memory.strategies=zero3,offload_optimizer
MPI=("${m0[@]}") && unset CTRL_TEST_OFFLOAD_HOLD
run z3on "${z3[@]}" --set memory.strategies=zero3,offload_optimizer --set memory.offload_overlap=false
curve() { sed 's/, "tokens_per_second": [0-9.]*//' "$1/metrics.jsonl"; }
late=$(grep -o "offload_optimizer: the host step overlapped with the next step's compute in 6 steps of [0-9]* units .* [0-9]* unit steps ran on the host after the next forward had begun" "$TMP/z3o.log" |
  sed -E 's/.* ([0-9]+) unit steps ran.*/\1/')
echo "zero3 offload on CUDA, overlapped: $late unit steps after the next forward began"
[ "${late:-0}" -gt 0 ] && grep -q "offload_optimizer: the host step not overlapped (\[memory\] offload_overlap = false): the whole rank's slices" "$TMP/z3on.log" &&
  [ "$(curve "$TMP/z3o")" = "$(curve "$TMP/z3on")" ] && cmp -s "$TMP/z3o/model.safetensors" "$TMP/z3on/model.safetensors" && ok ||
  bad "zero3 offload overlapped: not offload_overlap = false's curve and model, or not overlapped ('$late')"
curve_close "$TMP/z3" "$TMP/z3o" loss 1e-6
curve_close "$TMP/z3" "$TMP/z3o" grad_norm 1e-5
grep -q "optimizer adamw: steps this rank's slices on the host (zero3 with offload_optimizer" "$TMP/z3o.log" && ok ||
  bad "zero3 offload: $(grep optimizer "$TMP/z3o.log")"
# the device holds the slices' sums but no optimizer state; the host steps half of the trainable floats
d3() { grep -o "zero3 on the device: per rank between steps at most [0-9]* of the model's [0-9]* bytes of parameters (layers, embeddings and head [0-9]* bytes, sliced over 2 ranks), [0-9]* of [0-9]* bytes of gradients, [0-9]* bytes of gradient slices' sums and [0-9]* of optimizer state" "$1"; }
read -r g sums state < <(d3 "$TMP/z3o.log" | grep -o '[0-9][0-9]*' | sed -n '7p;8p;9p' | tr '\n' ' ')
zl=$(grep -o "zero3: 2 ranks, each steps [0-9]* of [0-9]* trainable floats; optimizer adamw: at most [0-9]* bytes of state per rank" "$TMP/z3o.log")
read -r mine all host < <(echo "$zl" | grep -o '[0-9][0-9]*' | sed -n '3p;4p;5p' | tr '\n' ' ')
echo "zero3 offload on CUDA: device optimizer state $state bytes, gradient sums $sums of $g; host: AdamW state $host bytes, $mine of $all floats stepped"
[ "$state" = 0 ] && [ $((2 * sums)) -le $((g + 64)) ] && [ -n "$host" ] && [ "$host" = $((8 * mine)) ] && [ $((2 * mine)) -le $((all + 8)) ] && ok ||
  bad "zero3 offload bytes: '$(d3 "$TMP/z3o.log")' '$zl'"
# its checkpoint (the per-rank optimizer files, written from the host's state) resumes the same curve
mkdir -p "$TMP/r3" && cp -r "$TMP/z3o/checkpoint-3" "$TMP/r3/"
grep '"step": [1-3],' "$TMP/z3o/metrics.jsonl" >"$TMP/r3/metrics.jsonl"
run r3 "${z3[@]}" --set memory.strategies=zero3,offload_optimizer --set train.resume_from_checkpoint=last
diff <(curve "$TMP/z3o") <(curve "$TMP/r3") >"$TMP/diff" && cmp -s "$TMP/z3o/model.safetensors" "$TMP/r3/model.safetensors" && ok ||
  { bad "zero3 offload on cuda: resumed curve or model differs"; cat "$TMP/diff"; }
# bf16: the fp32 masters on the host, the bf16 slices refreshed on the device after each step
run dpb --set train.save_strategy=no --set train.dtype=bf16
run z3ob "${z3[@]}" --set memory.strategies=zero3,offload_optimizer --set train.save_strategy=no --set train.dtype=bf16
curve_close "$TMP/dpb" "$TMP/z3ob" loss 1e-3
curve_close "$TMP/dpb" "$TMP/z3ob" grad_norm 1e-2
# ... overlapped with gradient accumulation: offload_overlap = false's curve
for o in true false; do
  run "ga$o" "${z3[@]}" --set memory.strategies=zero3,offload_optimizer --set train.save_strategy=no --set train.dtype=bf16 \
    --set train.gradient_accumulation_steps=2 --set train.max_steps=3 --set memory.offload_overlap=$o
done
[ -n "$(curve_col "$TMP/gatrue" loss)" ] && [ "$(curve "$TMP/gatrue")" = "$(curve "$TMP/gafalse")" ] && ok ||
  bad "zero3 offload bf16 overlapped with gradient accumulation: another curve"
grep -q "zero3 on the device in bf16: per rank between steps 0 bytes of the layers' fp32 master slices and [1-9][0-9]* of the bf16 copy's" "$TMP/z3ob.log" && ok ||
  bad "zero3 offload bf16: $(grep -o "zero3 on the device in bf16.*" "$TMP/z3ob.log")"
finish
