#!/usr/bin/env bash
# ZeRO-3 over a QLoRA base on the CPU (issues 19 and 18; core/train/zero_nf4.c): with [memory]
# strategies = zero3 and [peft] quantization = nf4, each of 2 ranks keeps its slice of every layer's
# NF4 weights and all-gathers a layer's just before its forward and backward. The adapters' SFT curve
# is plain data parallel + nf4's (<= 1e-6 relative loss, 1e-5 grad_norm: the slices' sums of squares
# added in another order); each rank holds about half of the NF4 store (the measured bytes printed and
# asserted: at most half plus two super-blocks' 8,452 bytes, the ranks' together the whole); a resume from
# the zero3 checkpoint follows the same curve to the same adapter bytes; QDoRA (use_dora, its base read
# sliced too: the whole read's bytes after attach) follows plain
# data parallel's curve too; GRPO generates the same completions with the layers gathered whole for
# generation and one at a time. The model: hidden 256, 2 layers, intermediate 576 (9 super-blocks of
# 16,384 values in each MLP weight: an odd number, whose extra super-block goes to each rank in turn),
# 4 heads and 1 KV head of 40 (q, o: 2.5 super-blocks; k, v: 10,240 values, less than one, so that one
# rank's piece of each is empty -- after the other's partial one, or before it).
# Skipped (77) only when mpirun or libctrl_mpi.so is absent.
# usage: test_zero3_nf4_mpi.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
bash "$SRC/scripts/make_quickstart_data.sh" "$TMP/data" 7 >/dev/null
"${C[@]}" model init --arch qwen2 --hidden 256 --layers 2 --heads 4 --kv-heads 1 --head-dim 40 --intermediate 576 \
  --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/model" >/dev/null || bad "model init"
zero3_ini "$TMP/run.ini" "$TMP/model"
q=(--set peft.enabled=true --set peft.target_modules=all-linear --set peft.quantization=nf4)
curve() { sed 's/, "tokens_per_second": [0-9.]*//' "$1/metrics.jsonl"; }

# 1. the curve: plain data parallel + nf4 against zero3 + nf4
mpi_train plain "${q[@]}"
mpi_train z3 "${q[@]}" --set memory.strategies=zero3
curve_close "$TMP/plain" "$TMP/z3" loss 1e-6
curve_close "$TMP/plain" "$TMP/z3" grad_norm 1e-5
# each rank read its slices of the base and quantized-and-kept its super-blocks of each NF4 weight:
# after attach the ranks' slices gathered whole are the same bytes (parameters; codes, absmax, scales,
# offsets) as when the base is read and quantized whole on every rank first (CTRL_TEST_ZERO3_WHOLE_LORA;
# one step each: the hash is taken before it)
for w in zs zw; do
  env $([ $w = zw ] && echo CTRL_TEST_ZERO3_WHOLE_LORA=1) CTRL_TEST_ZERO3_DIGEST=1 "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" \
    --set run.output_dir="$TMP/$w" "${q[@]}" --set memory.strategies=zero3 --set train.max_steps=1 --set train.save_strategy=no \
    >"$TMP/$w.log" 2>&1 || { bad "$w: exited $?"; tail -20 "$TMP/$w.log"; }
done
dz=$(grep -o "zero3: the model gathered whole after attach: digest [0-9a-f]* (every rank's the same)" "$TMP/zs.log")
[ -n "$dz" ] && [ "$dz" = "$(grep -o "zero3: the model gathered whole after attach: digest [0-9a-f]* (every rank's the same)" "$TMP/zw.log")" ] &&
  grep -q "zero3 + QLoRA: each rank read its slices of the frozen embeddings" "$TMP/z3.log" && ok ||
  bad "zero3 nf4: the sliced read's slices differ from the whole read's: '$dz'"

# 2. the NF4 store per rank: each rank's bytes, the whole's, the weights (2 layers x 7), the sum
line=$(grep -o "zero3: the NF4 base sliced over 2 ranks: each rank holds [0-9]* to [0-9]* of its [0-9]* bytes ([0-9]* weights; [0-9]* over the ranks)" "$TMP/z3.log")
read -r lo hi whole nw sum < <(echo "$line" | grep -o '[0-9][0-9]*' | sed -n '4,8p' | tr '\n' ' ')
echo "zero3 nf4: NF4 store per rank $lo to $hi of $whole bytes ($nw weights, $sum over the ranks)"
[ -n "$hi" ] && [ "$nw" = 14 ] && [ "$sum" = "$whole" ] && [ $((lo + hi)) = "$whole" ] &&
  [ "$hi" -le $((whole / 2 + 2 * (8192 + 256 + 4))) ] && ok ||
  bad "zero3 nf4: NF4 store per rank: '$line'"

# between steps a rank holds its slices alone (every layer's freed after its use); the first step
# gathered 2 layers x (forward + backward) x 2 micro-batches
line=$(grep -o "zero3: the NF4 base between steps: at most [0-9]* of its [0-9]* bytes held per rank; [0-9]* layer gathers of it so far" "$TMP/z3.log")
read -r held whole2 ng < <(echo "$line" | grep -o '[0-9][0-9]*' | sed -n '3,5p' | tr '\n' ' ')
echo "zero3 nf4: between steps $held of $whole2 bytes held per rank, $ng layer gathers in the first step"
[ -n "$ng" ] && [ "$held" = "$hi" ] && [ "$whole2" = "$whole" ] && [ "$ng" = 8 ] && ok || bad "zero3 nf4: '$line'"
# the next layer's gathers (its NF4 weights with its adapters) started ahead: prefetch_bucket_size auto
# (0.9 x 256^2 floats) counts a layer's NF4 bytes too (about 70,000 floats' worth), so one layer ahead --
# layer 1 in the forward, 0 in the backward, each micro-batch
pf=$(grep -o "[0-9]* layer gathers prefetched in the step" "$TMP/z3.log" | grep -o '^[0-9]*')
[ "$pf" = 4 ] && ok || bad "zero3 nf4: '$pf' layer gathers prefetched"

# 3. the adapter saved (never the base), and a resume from checkpoint-3 reaches the same curve and bytes
[ -f "$TMP/z3/adapter_model.safetensors" ] && [ -f "$TMP/z3/checkpoint-3/adapter_model.safetensors" ] &&
  [ ! -e "$TMP/z3/model.safetensors" ] && ok || bad "zero3 nf4: saved $(ls "$TMP/z3" | tr '\n' ' ')"
mkdir -p "$TMP/zr" && cp -r "$TMP/z3/checkpoint-3" "$TMP/zr/"
grep '"step": [1-3],' "$TMP/z3/metrics.jsonl" >"$TMP/zr/metrics.jsonl"
mpi_train zr "${q[@]}" --set memory.strategies=zero3 --set train.resume_from_checkpoint=last
diff <(curve "$TMP/z3") <(curve "$TMP/zr") >"$TMP/diff" &&
  cmp -s "$TMP/z3/adapter_model.safetensors" "$TMP/zr/adapter_model.safetensors" && ok ||
  { bad "zero3 nf4: the resumed curve or adapter differs"; cat "$TMP/diff"; }

# 4. QDoRA: the weight norms of each layer read from its gathered NF4 weights
mpi_train pd "${q[@]}" --set peft.use_dora=true --set train.save_strategy=no
mpi_train zd "${q[@]}" --set peft.use_dora=true --set train.save_strategy=no --set memory.strategies=zero3
curve_close "$TMP/pd" "$TMP/zd" loss 1e-6
curve_close "$TMP/pd" "$TMP/zd" grad_norm 1e-5
# ... its base read sliced too (each NF4 weight's row norms taken while it loads whole, the magnitudes
# those norms, B being 0; with init_lora_weights = false, B != 0, ||W + s B A|| computed then from the
# whole weight as a whole read computes it): after attach the ranks' slices gathered whole are the
# whole read's bytes
for init in true false; do
  for w in zds zdw; do
    env $([ $w = zdw ] && echo CTRL_TEST_ZERO3_WHOLE_LORA=1) CTRL_TEST_ZERO3_DIGEST=1 "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" \
      --set run.output_dir="$TMP/$w" "${q[@]}" --set peft.use_dora=true --set peft.init_lora_weights=$init \
      --set memory.strategies=zero3 --set train.max_steps=1 --set train.save_strategy=no >"$TMP/$w.log" 2>&1 ||
      { bad "$w: exited $?"; tail -20 "$TMP/$w.log"; }
  done
  dd=$(grep -o "zero3: the model gathered whole after attach: digest [0-9a-f]* (every rank's the same)" "$TMP/zds.log")
  [ -n "$dd" ] && [ "$dd" = "$(grep -o "zero3: the model gathered whole after attach: digest [0-9a-f]* (every rank's the same)" "$TMP/zdw.log")" ] &&
    grep -q "zero3 + QLoRA: each rank read its slices of the frozen embeddings" "$TMP/zds.log" && ok ||
    bad "zero3 QDoRA (init_lora_weights = $init): not read sliced, or its slices differ from the whole read's: '$dd'"
done

# 5. GRPO (colocated generation): the base's layers gathered whole for each generation phase
# (ds3_gather_for_generation, the default) or one at a time per decoding pass (false): the same
# completions (rewards) and gradients as plain data parallel + nf4
INI_TRAIN="dtype = fp32" INI_BATCH=2 online_ini grpo g 6 "[grpo]" "num_generations = 2" "max_completion_length = 4" \
  "[peft]" "enabled = true" "target_modules = all-linear" "quantization = nf4" >"$TMP/run.ini"
mpi_train gp
mpi_train gz --set memory.strategies=zero3
mpi_train gl --set memory.strategies=zero3 --set generation.ds3_gather_for_generation=false
for g in gz gl; do
  curve_close "$TMP/gp" "$TMP/$g" reward 1e-6
  curve_close "$TMP/gp" "$TMP/$g" grad_norm 1e-5
done
finish
