#!/usr/bin/env bash
# [train] optimizer = adamw_8bit on a CUDA run, under the CUDA emulator: the plugin has no device
# kernel, so the core steps it on the host (its 8-bit state in host memory, the gradients brought
# back each step, as for sgd); the loss curve follows the CPU run's with the same optimizer, and a
# checkpoint saved on the device resumes to the uninterrupted curve.
# usage: test_adamw8bit_emu.sh CTRL_BINARY EMU_PLUGIN_DIR SOURCE_DIR EMU_LIBCTRL_CUDA
source "$(dirname "$0")/e2e_common.sh"
export CTRL_CUDA_LIBRARY=$4 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
tiny_setup 5 2
source "$(dirname "$0")/adamw8bit_ini.sh"
adamw8bit_ini "$TMP/dev" cuda 2 0.1 "dtype = fp32"
"${C[@]}" train "$TMP/run.ini" >"$TMP/dev.log" 2>&1 || { bad "device run"; tail -5 "$TMP/dev.log"; }
grep -q "optimizer adamw_8bit: steps on the host" "$TMP/dev.log" && ok || bad "not on the host: $(grep optimizer "$TMP/dev.log")"
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/cpu" --set run.device=cpu >"$TMP/cpu.log" 2>&1 ||
  { bad "cpu run"; tail -5 "$TMP/cpu.log"; }
curve_close "$TMP/cpu" "$TMP/dev" loss 1e-4
# resume on the device from checkpoint-4: steps 5..8 as the uninterrupted device run
mkdir -p "$TMP/res" && cp -r "$TMP/dev/checkpoint-4" "$TMP/res/"
grep '"step": [1-4],' "$TMP/dev/metrics.jsonl" >"$TMP/res/metrics.jsonl"
"${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/res" --set train.resume_from_checkpoint=last >"$TMP/res.log" 2>&1 ||
  { bad "resume"; tail -5 "$TMP/res.log"; }
curve_close "$TMP/dev" "$TMP/res" loss 1e-6
finish
