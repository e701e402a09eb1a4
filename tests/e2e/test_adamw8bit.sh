#!/usr/bin/env bash
# [train] optimizer = adamw_8bit end to end: an SFT run trains with the 8-bit moments (its state
# reported in bytes, the checkpoint's optimizer.safetensors holding U8 moments beside fp32 absmax),
# a run resumed from checkpoint-4 logs exactly the uninterrupted run's metrics for steps 5..8 (the
# 8-bit state restored byte for byte), resuming it with adamw is a clear error; transformers' optim
# name for it gets ctrl's. With ZeRO over 2 ranks: tests/e2e/test_adamw8bit_mpi.sh. The plugin's numerics against bitsandbytes:
# tests/optimizer/test_adamw8bit.c.
# usage: test_adamw8bit.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
export OMP_NUM_THREADS=1
tiny_setup 3 2
source "$(dirname "$0")/adamw8bit_ini.sh"
adamw8bit_ini "$TMP/full" cpu 4 0.01
curve() { sed 's/, "tokens_per_second": [0-9.]*//' "$1/metrics.jsonl" | grep '"step"'; }

# 1. The uninterrupted run: its state in bytes (2 a trainable parameter in 8 bits, 8 below 256).
"${C[@]}" train "$TMP/run.ini" >"$TMP/log" 2>&1 || { bad "full run"; tail -5 "$TMP/log"; }
grep -q "optimizer adamw_8bit: [0-9]* bytes of state" "$TMP/log" && ok || bad "no state bytes: $(grep optimizer "$TMP/log")"
# 8-bit moments in the checkpoint: the safetensors header names U8 tensors
head -c 4096 "$TMP/full/checkpoint-4/optimizer.safetensors" | grep -aq '"dtype":"U8"' && ok || bad "no U8 state in the checkpoint"
[ "$(wc -l <"$TMP/full/metrics.jsonl")" -ge 8 ] && ok || bad "metrics: $(cat "$TMP/full/metrics.jsonl")"

# 2. Resume from checkpoint-4: steps 5..8 exactly as in the full run.
mkdir -p "$TMP/resumed" && cp -r "$TMP/full/checkpoint-4" "$TMP/resumed/"
grep '"step": [1-4],' "$TMP/full/metrics.jsonl" >"$TMP/resumed/metrics.jsonl"
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/resumed" --set train.resume_from_checkpoint=last \
  >"$TMP/log" 2>&1 || { bad "resume"; tail -5 "$TMP/log"; }
if diff <(curve "$TMP/full") <(curve "$TMP/resumed") >"$TMP/diff"; then ok; else bad "resumed curve differs"; cat "$TMP/diff"; fi

# 3. The same checkpoint with adamw: refused, naming the optimizer.
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/resumed" --set train.resume_from_checkpoint=last \
  --set train.optimizer=adamw >"$TMP/log" 2>&1 && bad "adamw resumed adamw_8bit's state" ||
  { grep -q "adamw_8bit" "$TMP/log" && ok || bad "no clear error: $(tail -2 "$TMP/log")"; }

# 5. transformers' name for it (optim="adamw_bnb_8bit") points at ctrl's.
"${C[@]}" config check "$TMP/run.ini" --set train.optimizer=adamw_bnb_8bit >"$TMP/log" 2>&1 && bad "adamw_bnb_8bit accepted" ||
  { grep -q "did you mean 'adamw_8bit'" "$TMP/log" && ok || bad "adamw_bnb_8bit: $(tail -1 "$TMP/log")"; }
finish
