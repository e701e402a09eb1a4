#!/usr/bin/env bash
# ZeRO-3 slices the embeddings and the LM head (issue 19; core/train/zero.c, zero_layers.c): on 2
# ranks each keeps its half of model.embed_tokens.weight (and of an untied lm_head.weight), gathered
# around the embedding lookup and the head's forward and backward and released after, its gradient
# reduce-scattered, its AdamW state sliced. For a tied and an untied model: SFT follows plain data
# parallel's curve (loss 1e-6, gradient norm 1e-5, the evaluations 1e-6); the run's own accounting
# (parameters and gradients resident between steps, the gradient slices' sums, the optimizer state)
# is at most half the unsharded plus a few edge pages, where the embeddings kept whole
# (CTRL_TEST_ZERO3_WHOLE_EMBED, the old way) hold more; a checkpoint resumes the same curve; the final
# save streamed to rank 0 equals the whole gather's byte for byte. LoRA with the embeddings frozen
# (sliced as the frozen base is) and with modules_to_save = embed_tokens (trained, sliced) follow
# plain data parallel LoRA (the untied model). Skipped (77) when mpirun or libctrl_mpi.so is absent.
# usage: test_zero3_embed_mpi.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
bash "$SRC/scripts/make_quickstart_data.sh" "$TMP/data" 5 >/dev/null
for tie in tied untied; do
  flag=() && [ $tie = tied ] && flag=(--tie-embeddings)
  "${C[@]}" model init --arch qwen2 --hidden 64 --layers 2 --heads 2 "${flag[@]}" \
    --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/m_$tie" >/dev/null || bad "model init $tie"
done
zero3_ini "$TMP/run.ini" "$TMP/m_tied"
curve() { sed 's/, "tokens_per_second": [0-9.]*//' "$1/metrics.jsonl"; }
num() { grep -o "$2" "$1" | head -1 | grep -o '[0-9][0-9]*' | sed -n "${3}p"; }
acct='zero3: per rank between steps at most [0-9]* bytes of parameters, gradients and optimizer state ([^)]*) against [0-9]* unsharded'
for tie in tied untied; do
  m=(--set model.path="$TMP/m_$tie" --set data.eval_file="$TMP/data/eval.jsonl" --set train.eval_steps=3)
  "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/p_$tie" "${m[@]}" >"$TMP/p_$tie.log" 2>&1 ||
    { bad "plain $tie"; tail -20 "$TMP/p_$tie.log"; }
  "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/z_$tie" "${m[@]}" --set memory.strategies=zero3 \
    >"$TMP/z_$tie.log" 2>&1 || { bad "zero3 $tie"; tail -20 "$TMP/z_$tie.log"; }
  curve_close "$TMP/p_$tie" "$TMP/z_$tie" loss 1e-6
  curve_close "$TMP/p_$tie" "$TMP/z_$tie" grad_norm 1e-5
  n=$(paste <(curve_col "$TMP/p_$tie" eval_loss) <(curve_col "$TMP/z_$tie" eval_loss) |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6 * $1) bad++; n++ } END { print n + 0, bad + 0 }')
  [ "$n" = "2 0" ] && ok || bad "$tie: zero3 evaluations ($n)"
  # the old way (the embeddings and head whole on every rank): the same curve, more bytes
  CTRL_TEST_ZERO3_WHOLE_EMBED=1 "${MPI[@]}" -x CTRL_TEST_ZERO3_WHOLE_EMBED "${C[@]}" train "$TMP/run.ini" \
    --set run.output_dir="$TMP/w_$tie" "${m[@]}" --set memory.strategies=zero3 --set train.save_strategy=no \
    >"$TMP/w_$tie.log" 2>&1 || { bad "zero3 whole embeddings $tie"; tail -20 "$TMP/w_$tie.log"; }
  curve_close "$TMP/p_$tie" "$TMP/w_$tie" loss 1e-6
  mine=$(num "$TMP/z_$tie.log" "$acct" 2) whole=$(num "$TMP/z_$tie.log" "$acct" 3)
  old=$(num "$TMP/w_$tie.log" "$acct" 2)
  res=$(num "$TMP/z_$tie.log" "parameters resident between steps: at most [0-9]* of the model's [0-9]* bytes" 1)
  model=$(num "$TMP/z_$tie.log" "parameters resident between steps: at most [0-9]* of the model's [0-9]* bytes" 2)
  ores=$(num "$TMP/w_$tie.log" "parameters resident between steps: at most [0-9]* of the model's [0-9]* bytes" 1)
  echo "$tie: per rank $mine bytes of parameters + gradients + optimizer state of $whole unsharded (embeddings whole: $old); parameters resident $res of $model bytes (embeddings whole: $ores)"
  # half of everything but the final norm (64 floats), plus the slices' edge pages (2 a unit: 4 units
  # tied, 5 untied) in the parameters and the gradients
  [ -n "$mine" ] && [ -n "$whole" ] && [ $((2 * mine)) -le $((whole + 2 * 20 * 4096)) ] && ok ||
    bad "$tie: per-rank bytes $mine of $whole (not about half)"
  [ -n "$res" ] && [ $((2 * res)) -le $((model + 2 * 10 * 4096)) ] && ok || bad "$tie: parameters resident $res of $model"
  [ -n "$old" ] && [ "$mine" -lt "$old" ] && [ "$res" -lt "$ores" ] && ok || bad "$tie: the sliced embeddings hold no less ($mine vs $old)"
  # the optimizer state: the ranks' together the unsharded, each at most half (+ a float a buffer)
  full=$(num "$TMP/p_$tie.log" "optimizer adamw: [0-9]* bytes of state per rank" 1)
  zl=$(grep -o "zero3: 2 ranks, each steps [0-9]* of [0-9]* trainable floats; optimizer adamw: at most [0-9]* bytes of state per rank, [0-9]* over the ranks" "$TMP/z_$tie.log")
  smax=$(echo "$zl" | sed 's/.*at most \([0-9]*\) bytes.*/\1/') ssum=$(echo "$zl" | sed 's/.*rank, \([0-9]*\) over.*/\1/')
  [ -n "$full" ] && [ "$ssum" = "$full" ] && [ $((2 * smax)) -le $((full + 64)) ] && ok || bad "$tie: optimizer state '$zl' vs $full"
  # the saves streamed to rank 0 (the embeddings and head gathered to it as the layers are)
  units=3 && [ $tie = untied ] && units=4
  grep -q "zero3: the model saved by rank 0 alone, $units units (layers, embeddings, head) gathered to it one at a time" "$TMP/z_$tie.log" &&
    ok || bad "$tie: streamed save: $(grep -o 'zero3: the model saved.*' "$TMP/z_$tie.log")"
  # resumed from checkpoint-3: the same curve; saving the old way (the whole model gathered on every
  # rank) writes the same bytes
  mkdir -p "$TMP/r_$tie" && cp -r "$TMP/z_$tie/checkpoint-3" "$TMP/r_$tie/"
  grep '"step": [1-3],' "$TMP/z_$tie/metrics.jsonl" >"$TMP/r_$tie/metrics.jsonl"
  CTRL_TEST_ZERO_SAVE_WHOLE=1 "${MPI[@]}" -x CTRL_TEST_ZERO_SAVE_WHOLE "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/r_$tie" "${m[@]}" \
    --set memory.strategies=zero3 --set train.resume_from_checkpoint=last >"$TMP/r_$tie.log" 2>&1 || { bad "zero3 resume $tie"; tail -20 "$TMP/r_$tie.log"; }
  diff <(curve "$TMP/z_$tie") <(curve "$TMP/r_$tie") >"$TMP/diff" && ok || { bad "$tie: resumed curve differs"; cat "$TMP/diff"; }
  for f in model.safetensors checkpoint-6/model.safetensors checkpoint-6/optimizer.rank-0.safetensors checkpoint-6/optimizer.rank-1.safetensors; do
    cmp -s "$TMP/z_$tie/$f" "$TMP/r_$tie/$f" && ok || bad "$tie: $f differs from the old way's save"
  done
done
# LoRA: the frozen embeddings and head sliced with the frozen base; modules_to_save = embed_tokens:
# the embeddings trained (a sliced unit of their own, saved with the adapter)
zl=(--set model.path="$TMP/m_untied" --set peft.enabled=true --set peft.target_modules=all-linear --set train.save_strategy=no)
for mts in "" embed_tokens; do
  k=${mts:-frozen}
  "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/pl_$k" "${zl[@]}" --set peft.modules_to_save="$mts" \
    >"$TMP/pl_$k.log" 2>&1 || { bad "lora plain $k"; tail -20 "$TMP/pl_$k.log"; }
  "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/zl_$k" "${zl[@]}" --set peft.modules_to_save="$mts" \
    --set memory.strategies=zero3 --set train.save_strategy=steps >"$TMP/zl_$k.log" 2>&1 || { bad "lora zero3 $k"; tail -20 "$TMP/zl_$k.log"; }
  curve_close "$TMP/pl_$k" "$TMP/zl_$k" loss 1e-6
  curve_close "$TMP/pl_$k" "$TMP/zl_$k" grad_norm 1e-5
  res=$(num "$TMP/zl_$k.log" "parameters resident between steps: at most [0-9]* of the model's [0-9]* bytes" 1)
  model=$(num "$TMP/zl_$k.log" "parameters resident between steps: at most [0-9]* of the model's [0-9]* bytes" 2)
  echo "LoRA ($k): parameters resident $res of $model bytes per rank"
  [ -n "$res" ] && [ $((2 * res)) -le $((model + 2 * 20 * 4096)) ] && ok || bad "LoRA $k: parameters resident $res of $model"
done
# the adapter saved with the trained embeddings (gathered with the adapters' slices), the same bytes
# as the old way's save (the whole model gathered on every rank first)
CTRL_TEST_ZERO_SAVE_WHOLE=1 "${MPI[@]}" -x CTRL_TEST_ZERO_SAVE_WHOLE "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/zlw" \
  "${zl[@]}" --set peft.modules_to_save=embed_tokens --set memory.strategies=zero3 --set train.save_strategy=steps \
  >"$TMP/zlw.log" 2>&1 || { bad "lora zero3 save whole"; tail -20 "$TMP/zlw.log"; }
f=adapter_model.safetensors
head -c 4096 "$TMP/zl_embed_tokens/$f" | grep -q "embed_tokens" && cmp -s "$TMP/zl_embed_tokens/$f" "$TMP/zlw/$f" &&
  cmp -s "$TMP/zl_embed_tokens/checkpoint-3/$f" "$TMP/zlw/checkpoint-3/$f" && ok ||
  bad "LoRA modules_to_save = embed_tokens: the adapter differs from the old way's save (or has no embeddings)"
finish
