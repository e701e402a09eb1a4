#!/usr/bin/env bash
# ZeRO-3's persistent parameters ([memory] stage3_param_persistence_threshold; core/train/zero_persist.c,
# zero_layers.c): on 2 ranks, a 2-layer hidden-64 Qwen2 model (tied embeddings) trained with zero3 at
# threshold 0 (nothing whole), auto (10 x 64 = 640 elements: the norms and the q/k/v biases whole on
# every rank, the layers' gathers fetching their weight matrices only) and 1e9 (every tensor whole: no
# gather around any use) follows plain data parallel's curve (loss 1e-6, gradient norm 1e-5) and saves
# the same model bytes as threshold 0; the run's own count of the step's all-gathered tensors and
# floats drops; a checkpoint resumes the same curve (with auto, and with 0: the optimizer slices do not
# depend on the threshold); the released pages' reuse changes no bit (against CTRL_TEST_ZERO3_REFAULT=1);
# the key is refused without zero3 and below 0, naming it.
# Skipped (77) when mpirun or libctrl_mpi.so is absent.
# usage: test_zero3_persist_mpi.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
bash "$SRC/scripts/make_quickstart_data.sh" "$TMP/data" 5 >/dev/null
"${C[@]}" model init --arch qwen2 --hidden 64 --layers 2 --heads 2 --tie-embeddings \
  --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/m" >/dev/null || bad "model init"
zero3_ini "$TMP/run.ini" "$TMP/m"
curve() { sed 's/, "tokens_per_second": [0-9.]*//' "$1/metrics.jsonl"; }
mpi_train p
for t in 0 auto 1e9; do mpi_train "z$t" --set memory.strategies=zero3 --set memory.stage3_param_persistence_threshold=$t; done
counts='zero3: the step all-gathered [0-9]* parameter floats in [0-9]* collectives, [0-9]* tensors'
kept='stage3_param_persistence_threshold = [0-9]* elements: [0-9]* tensors, [0-9]* bytes'
field() { grep -o "$2" "$TMP/$1.log" | head -1 | grep -ow '[0-9][0-9]*' | sed -n "${3}p"; }
for t in 0 auto 1e9; do
  curve_close "$TMP/p" "$TMP/z$t" loss 1e-6
  curve_close "$TMP/p" "$TMP/z$t" grad_norm 1e-5
  cmp -s "$TMP/z0/model.safetensors" "$TMP/z$t/model.safetensors" && ok || bad "threshold $t: the saved model differs from threshold 0's"
  echo "threshold $t: $(grep -o "$counts" "$TMP/z$t.log" | head -1); $(grep -o "$kept" "$TMP/z$t.log" | head -1)"
done
f0=$(field z0 "$counts" 1) v0=$(field z0 "$counts" 3) fa=$(field zauto "$counts" 1) va=$(field zauto "$counts" 3)
c0=$(field z0 "$counts" 2) cb=$(field z1e9 "$counts" 2) vb=$(field z1e9 "$counts" 3)
# auto keeps the tensors of fewer than 640 elements whole: each layer's 2 norms and 3 biases (10 tensors;
# the final norm is whole at any threshold, a unit of its own)
[ "$(field zauto "$kept" 1)" = 640 ] && [ "$(field zauto "$kept" 2)" = 10 ] && [ "$(field z0 "$kept" 2)" = 0 ] && ok ||
  bad "persistent tensors: $(grep -o "$kept" "$TMP/zauto.log" | head -1)"
# fewer tensors and floats all-gathered in the step (more collectives: each layer's gather cut in one per
# run of weight matrices between the biases); at 1e9 nothing around the uses: the final norm's unit and the
# one gather of every persistent tensor's slices after the step
[ -n "$va" ] && [ "$va" -lt "$v0" ] && [ "$fa" -lt "$f0" ] && ok || bad "auto gathers $va tensors $fa floats, 0: $v0 $f0"
[ "$cb" = 2 ] && [ "$c0" -gt 2 ] && ok || bad "1e9: $cb collectives (0: $c0)"
# resumed from auto's checkpoint-3 with auto and with 0: the same curve and model
for t in auto 0; do
  mkdir -p "$TMP/r$t" && cp -r "$TMP/zauto/checkpoint-3" "$TMP/r$t/"
  grep '"step": [1-3],' "$TMP/zauto/metrics.jsonl" >"$TMP/r$t/metrics.jsonl"
  mpi_train "r$t" --set memory.strategies=zero3 \
    --set memory.stage3_param_persistence_threshold=$t --set train.resume_from_checkpoint=last
  diff <(curve "$TMP/zauto") <(curve "$TMP/r$t") >"$TMP/diff" && ok || { bad "resumed with $t: the curve differs"; cat "$TMP/diff"; }
  cmp -s "$TMP/zauto/model.safetensors" "$TMP/r$t/model.safetensors" && ok || bad "resumed with $t: the model differs"
done
# the released pages reused (zero_layers.c's pool: the gathers and the layers' gradients on its pages)
# against faulted again at each use (CTRL_TEST_ZERO3_REFAULT=1, the way before): the same curve and
# model bytes, bit for bit; the run counts the uses on the pool's frames
CTRL_TEST_ZERO3_REFAULT=1 mpi_train zr --set memory.strategies=zero3
diff <(curve "$TMP/z0") <(curve "$TMP/zr") >"$TMP/diff" && cmp -s "$TMP/z0/model.safetensors" "$TMP/zr/model.safetensors" &&
  grep -q "zero3: the released pages are faulted again at each use (CTRL_TEST_ZERO3_REFAULT)" "$TMP/zr.log" && ok ||
  { bad "the pool changed the curve or the model"; head -4 "$TMP/diff"; }
for t in 0 auto; do
  pool=$(grep -o "zero3: gathers into reused pages: [0-9]* uses on [12] of 2 frames of [0-9]* bytes, [0-9]* the old way" "$TMP/z$t.log" | head -1)
  grads=$(grep -o "zero3: gradients on reused pages: [0-9]* backwards of a layer on [12] of 2 frames of [0-9]* bytes, 0 the old way" "$TMP/z$t.log" | head -1)
  echo "threshold $t: $pool; $grads"
  [ "$(echo "$pool" | grep -ow '[0-9][0-9]*' | sed -n 1p)" -gt 0 ] 2>/dev/null && [ -n "$grads" ] && ok ||
    bad "threshold $t: the pool's line: '$pool' '$grads'"
done
# refusals, naming the key
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/e1" --set memory.strategies=zero2 \
  --set memory.stage3_param_persistence_threshold=100 >"$TMP/e1.log" 2>&1 && bad "zero2 with the threshold ran"
grep -q "stage3_param_persistence_threshold: only zero3 slices parameters" "$TMP/e1.log" && ok || { bad "zero2: no refusal"; tail -3 "$TMP/e1.log"; }
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/e2" --set memory.strategies=zero3 \
  --set memory.stage3_param_persistence_threshold=-1 >"$TMP/e2.log" 2>&1 && bad "a negative threshold ran"
grep -q "\[memory\] stage3_param_persistence_threshold = -1: expected auto or a whole number" "$TMP/e2.log" && ok ||
  { bad "negative: no refusal"; tail -3 "$TMP/e2.log"; }
finish
