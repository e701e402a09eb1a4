#!/usr/bin/env bash
# offload_activations on the CPU (issue 19): the checkpointed layers' inputs go to a file between
# forward and backward (plugins/memory/offload/, core/model/model_offload.c). The weights after 6
# AdamW steps are the same bytes as with checkpointing alone (the gradients are bit for bit the
# same), the printed curve identical; the run's own line says how many bytes left memory (two of the
# 4 layers' inputs stay); the file is made in [memory] offload_dir (unlinked at once: the directory
# is empty after the run); offload_dir that is not a directory, or set without offload_activations,
# is refused naming the key.
# usage: test_offload_cpu.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
tiny_setup 7 4
tiny_ini "$TMP/run.ini" "$TMP/ck" <<INI
learning_rate = 3e-3
max_steps = 6
per_device_train_batch_size = 2
logging_steps = 1
save_strategy = no
weight_decay = 0.1
max_grad_norm = 1.0
dtype = fp32
INI
"${C[@]}" train "$TMP/run.ini" --set memory.strategies=checkpointing >"$TMP/ck.log" 2>&1 ||
  { bad "checkpointing"; tail -5 "$TMP/ck.log"; }
mkdir -p "$TMP/spill"
"${C[@]}" --log-level debug train "$TMP/run.ini" --set run.output_dir="$TMP/oa" \
  --set memory.strategies=checkpointing,offload_activations --set memory.offload_dir="$TMP/spill" >"$TMP/oa.log" 2>&1 ||
  { bad "offload_activations"; tail -5 "$TMP/oa.log"; }
cmp -s "$TMP/ck/model.safetensors" "$TMP/oa/model.safetensors" && ok || bad "the weights differ with offload_activations"
for key in loss grad_norm mean_token_accuracy; do
  [ -n "$(curve_col "$TMP/ck" $key)" ] && [ "$(curve_col "$TMP/ck" $key)" = "$(curve_col "$TMP/oa" $key)" ] && ok ||
    bad "offload_activations: $key differs"
done
grep -q "the layer inputs go to an unlinked file in $TMP/spill" "$TMP/oa.log" && ok || bad "the file is not in offload_dir"
[ -z "$(ls -A "$TMP/spill")" ] && ok || bad "offload_dir not empty after the run: $(ls -A "$TMP/spill")"
line=$(grep -o "offload_activations: [0-9]* bytes of layer inputs in a file; activations in host memory: [0-9]* bytes ([0-9]* with every input there)" "$TMP/oa.log")
read -r file mem whole < <(echo "$line" | grep -o '[0-9][0-9]*' | tr '\n' ' ')
echo "offload_activations (CPU): $file bytes in the file, activations in memory $mem bytes ($whole without)"
[ -n "$file" ] && [ "$file" -gt 0 ] && [ $((whole - mem)) = $((file / 2)) ] && ok || bad "offload_activations: '$line'"
# the default place: output_dir (nothing left there but the run's own files)
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/od" --set memory.strategies=checkpointing,offload_activations \
  --set train.max_steps=2 >"$TMP/od.log" 2>&1 || { bad "offload_activations in output_dir"; tail -5 "$TMP/od.log"; }
! ls -A "$TMP/od" | grep -q ctrl-activations && ok || bad "a file left in output_dir: $(ls -A "$TMP/od")"
# refused, naming the key
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/nd" --set memory.strategies=checkpointing,offload_activations \
  --set memory.offload_dir="$TMP/run.ini" >"$TMP/nd.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "\[memory\] offload_dir = $TMP/run.ini: not a directory" "$TMP/nd.log" && ok ||
  { bad "offload_dir a file: exit $rc"; tail -3 "$TMP/nd.log"; }
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/nu" --set memory.offload_dir="$TMP/spill" >"$TMP/nu.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "\[memory\] offload_dir is where offload_activations keeps .*does not list offload_activations" "$TMP/nu.log" && ok ||
  { bad "offload_dir without offload_activations: exit $rc"; tail -3 "$TMP/nu.log"; }
finish
