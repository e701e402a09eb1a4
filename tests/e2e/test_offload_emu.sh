#!/usr/bin/env bash
# offload_optimizer on a CUDA run, under the CUDA emulator (issue 19; plugins/memory/offload/): the
# optimizer state and step on the host follow the device optimizer's loss curve (<= 1e-6 relative)
# with the same first gradient norm (the gradients are the device's, bit for bit); its host step
# overlapped layer by layer with the next forward (offload_overlap, the default) gives the same curve
# and weights bit for bit as the whole-model host step, with and without clipping, with accumulation,
# in bf16, resumed, and steps every layer but the embeddings during the next forward (a test hook
# holds the host thread until that forward begins; the per-unit waits counted); and zero1 on one
# rank (its sharded step is the host's) and zero2 too; offload_optimizer on the CPU is refused naming the key;
# offload_activations (the checkpointed layers' inputs in page-locked host memory, copied on a side
# stream) gives the same curve and weights bit for bit with less device activation memory, and is refused without checkpointing.
# usage: test_offload_emu.sh CTRL_BINARY EMU_PLUGIN_DIR SOURCE_DIR EMU_LIBCTRL_CUDA
source "$(dirname "$0")/e2e_common.sh"
export CTRL_CUDA_LIBRARY=$4 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
tiny_setup 7 2
cat >"$TMP/run.ini" <<INI
[run]
output_dir = $TMP/dev
device = cuda
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train.jsonl
[train]
learning_rate = 3e-3
max_steps = 6
per_device_train_batch_size = 2
logging_steps = 1
save_strategy = no
weight_decay = 0.1
max_grad_norm = 1.0
dtype = fp32
INI
"${C[@]}" train "$TMP/run.ini" >"$TMP/dev.log" 2>&1 || { bad "device optimizer"; tail -5 "$TMP/dev.log"; }
grep -q "optimizer adamw: steps on the device" "$TMP/dev.log" && ok || bad "not on the device: $(grep optimizer "$TMP/dev.log")"
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/off" --set memory.strategies=checkpointing,offload_optimizer \
  >"$TMP/off.log" 2>&1 || { bad "offload_optimizer"; tail -5 "$TMP/off.log"; }
grep -q "optimizer adamw: steps on the host, its state in host memory (\[memory\] strategies = offload_optimizer)" "$TMP/off.log" &&
  ! grep -q "steps on the device" "$TMP/off.log" && ok || bad "offload: $(grep optimizer "$TMP/off.log")"
[ "$(curve_col "$TMP/dev" grad_norm | head -1)" = "$(curve_col "$TMP/off" grad_norm | head -1)" ] && ok || bad "first gradient norms differ"
curve_close "$TMP/dev" "$TMP/off" loss 1e-6
curve_close "$TMP/dev" "$TMP/off" grad_norm 1e-5
# the overlap (offload_overlap.c): the host step layer by layer on a host thread beside the next
# forward, each layer's upload waited for just before its forward; exact -- the same curve and
# weights bit for bit as the whole-model host step ([memory] offload_overlap = false), with
# clipping (run.ini: max_grad_norm = 1.0), without, with accumulation, in bf16, and resumed. The
# emulator runs an upload only when the compute stream waits for its event, so a wait missing or
# late would read the previous step's weights there.
grep -q "offload_optimizer: the host step overlapped with the next step's compute, layer by layer .*the host's parameters and gradients page-locked" "$TMP/off.log" && ok ||
  bad "overlap not on by default: $(grep offload_optimizer "$TMP/off.log")"
same_run() { # same_run A B WHAT: identical curves and weights
  local key
  for key in loss grad_norm mean_token_accuracy; do
    [ -n "$(curve_col "$1" $key)" ] && [ "$(curve_col "$1" $key)" = "$(curve_col "$2" $key)" ] && ok || bad "$3: $key differs"
  done
  cmp -s "$1/model.safetensors" "$2/model.safetensors" && ok || bad "$3: the weights differ"
}
offload=(--set memory.strategies=offload_optimizer)
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/nov" "${offload[@]}" --set memory.offload_overlap=false \
  >"$TMP/nov.log" 2>&1 || { bad "offload_overlap = false"; tail -5 "$TMP/nov.log"; }
grep -q "offload_optimizer: the host step not overlapped (\[memory\] offload_overlap = false)" "$TMP/nov.log" && ok ||
  bad "offload_overlap = false: $(grep offload_optimizer "$TMP/nov.log")"
# the structure: with CTRL_TEST_OFFLOAD_HOLD the host thread, its first unit (the embeddings) stepped,
# waits until the next forward has begun: every other unit (2 layers, the head) is then stepped while
# that forward runs, and each forward waits for each unit's upload on its own (4 a step)
CTRL_TEST_OFFLOAD_HOLD=1 "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/ov" "${offload[@]}" \
  >"$TMP/ov.log" 2>&1 || { bad "overlapped (held)"; tail -5 "$TMP/ov.log"; }
same_run "$TMP/nov" "$TMP/ov" "overlap with clipping"
line=$(grep -o "overlapped with the next step's compute in [0-9]* steps of [0-9]* units (the embeddings, [0-9]* layers, the final norm and head), each uploaded on its own stream as soon as stepped; the device waited for [0-9]* uploads, each only where its unit is read; [0-9]* unit steps ran on the host after the next forward had begun" "$TMP/ov.log")
read -r steps units layers waits late < <(echo "$line" | grep -o '[0-9][0-9]*' | tr '\n' ' ')
echo "offload overlap: $steps steps, $units units, $waits per-unit waits, $late unit steps during the next forward"
[ "$steps" = 6 ] && [ "$units" = 4 ] && [ "$waits" = 24 ] && [ "$late" = 15 ] && ok || bad "overlap structure: '$line'"
# no clipping; gradient accumulation (2 micro-batches: the first one's forward waits)
for v in "noclip train.max_grad_norm=0" "accum train.gradient_accumulation_steps=2" "bf16 train.dtype=bf16"; do
  read -r name set <<<"$v"
  "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/$name-n" "${offload[@]}" --set memory.offload_overlap=false \
    --set "$set" >"$TMP/$name-n.log" 2>&1 || { bad "$name, not overlapped"; tail -5 "$TMP/$name-n.log"; }
  "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/$name-o" "${offload[@]}" --set "$set" \
    >"$TMP/$name-o.log" 2>&1 || { bad "$name, overlapped"; tail -5 "$TMP/$name-o.log"; }
  same_run "$TMP/$name-n" "$TMP/$name-o" "overlap ($name)"
done
# resume: checkpoint-3 of an overlapped run (drained before the save) continues to the same weights
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/ck3" "${offload[@]}" --set train.save_strategy=steps \
  --set train.save_steps=3 >"$TMP/ck3.log" 2>&1 || { bad "overlap with checkpoints"; tail -5 "$TMP/ck3.log"; }
mkdir -p "$TMP/rs" && cp -r "$TMP/ck3/checkpoint-3" "$TMP/rs/"
grep '"step": [1-3],' "$TMP/ck3/metrics.jsonl" >"$TMP/rs/metrics.jsonl"
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/rs" "${offload[@]}" --set train.save_strategy=steps \
  --set train.save_steps=3 --set train.resume_from_checkpoint=last >"$TMP/rs.log" 2>&1 || { bad "overlap resumed"; tail -5 "$TMP/rs.log"; }
same_run "$TMP/nov" "$TMP/ck3" "overlap saving checkpoints"
same_run "$TMP/ck3" "$TMP/rs" "overlap resumed from checkpoint-3"
# offload_overlap where there is nothing to overlap: refused, naming the key
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/ovbad" --set memory.offload_overlap=true >"$TMP/ovbad.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "\-\-set memory.offload_overlap: \[memory\] offload_overlap applies to offload_optimizer on a device run without ZeRO or with zero3 only (here: no offload_optimizer)" "$TMP/ovbad.log" && ok ||
  { bad "offload_overlap without offload_optimizer: exit $rc"; tail -3 "$TMP/ovbad.log"; }
# zero1 on one rank: the host's sharded step on a CUDA model
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/z1" --set memory.strategies=zero1 >"$TMP/z1.log" 2>&1 ||
  { bad "zero1 on cuda"; tail -5 "$TMP/z1.log"; }
curve_close "$TMP/dev" "$TMP/z1" loss 1e-6
# zero2 on a CUDA model is not refused: the device's gradients brought back, reduce-scattered and
# stepped on the host (one rank here: the emulator has one device)
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/z2" --set memory.strategies=zero2 >"$TMP/z2.log" 2>&1 ||
  { bad "zero2 on cuda"; tail -5 "$TMP/z2.log"; }
curve_close "$TMP/dev" "$TMP/z2" loss 1e-6
# offload_activations: the checkpointed layers' inputs in host memory between forward and backward
# (a 4-layer model: two device slots instead of four inputs); the gradients bit for bit the same,
# so the printed curve is identical
"${C[@]}" model init --arch qwen2 --hidden 32 --layers 4 --heads 2 --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" \
  --out "$TMP/model4" >/dev/null || bad "model init"
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/ck" --set model.path="$TMP/model4" \
  --set memory.strategies=checkpointing >"$TMP/ck.log" 2>&1 || { bad "checkpointing on cuda"; tail -5 "$TMP/ck.log"; }
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/oa" --set model.path="$TMP/model4" \
  --set memory.strategies=checkpointing,offload_activations >"$TMP/oa.log" 2>&1 || { bad "offload_activations"; tail -5 "$TMP/oa.log"; }
for key in loss grad_norm mean_token_accuracy; do
  [ "$(curve_col "$TMP/ck" $key)" = "$(curve_col "$TMP/oa" $key)" ] && [ -n "$(curve_col "$TMP/ck" $key)" ] && ok ||
    bad "offload_activations: $key differs"
done
# the weights after the 6 steps: the same bytes (the side stream's copies, which the emulator runs
# only when waited for, brought back what went out)
cmp -s "$TMP/ck/model.safetensors" "$TMP/oa/model.safetensors" && ok || bad "offload_activations: the weights differ"
line=$(grep -o "offload_activations: [0-9]* bytes of layer inputs in page-locked host memory, copied on a side stream; activations in device memory: [0-9]* bytes ([0-9]* with every input there)" "$TMP/oa.log")
read -r host dev whole < <(echo "$line" | grep -o '[0-9][0-9]*' | tr '\n' ' ')
echo "offload_activations: $host bytes in host memory, device activations $dev bytes ($whole without)"
[ -n "$host" ] && [ "$host" -gt 0 ] && [ $((whole - dev)) = $((host / 2)) ] && ok || bad "offload_activations: '$line'"
# refused without a layer strategy that recomputes (naming the key); on the CPU: test_offload_cpu.sh
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/oa0" --set memory.strategies=offload_activations >"$TMP/oa0.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "\[memory\] strategies = offload_activations: no layer is recomputed" "$TMP/oa0.log" && ok ||
  { bad "offload_activations alone: exit $rc"; tail -3 "$TMP/oa0.log"; }
# nothing to offload on the CPU: refused, naming the key
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/cpu" --set run.device=cpu --set memory.strategies=offload_optimizer \
  >"$TMP/cpu.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "\[memory\] strategies = offload_optimizer with \[run\] device = cpu: .*nothing to offload" "$TMP/cpu.log" && ok ||
  { bad "offload on the cpu: exit $rc"; tail -3 "$TMP/cpu.log"; }
finish
