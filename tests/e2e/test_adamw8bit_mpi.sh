#!/usr/bin/env bash
# [train] optimizer = adamw_8bit with ZeRO over MPI (mpirun -np 2, CPU): each rank keeps the 8-bit
# state of its slice only (blocks of 256 counted from the slice's start, so a tensor cut by the
# slice boundary is quantized in other blocks than unsharded: the curve follows plain data
# parallel's closely, not bit for bit), about half the state's bytes per rank, one optimizer file
# per rank with the U8 moments, and a 2-rank resume from checkpoint-4 continues the same curve
# exactly, for zero1, zero2 and zero3. Skipped (77) only when mpirun or libctrl_mpi.so is absent.
# usage: test_adamw8bit_mpi.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
mpi_setup
tiny_setup 5 2
source "$(dirname "$0")/adamw8bit_ini.sh"
adamw8bit_ini "$TMP/dp" cpu 2 0.1 "dtype = fp32"
"${MPI[@]}" "${C[@]}" train "$TMP/run.ini" >"$TMP/dp.log" 2>&1 || { bad "plain 2 ranks"; tail -20 "$TMP/dp.log"; }
full=$(grep -o "optimizer adamw_8bit: [0-9]* bytes of state per rank" "$TMP/dp.log" | head -1 | sed 's/.*: \([0-9]*\) bytes.*/\1/')
for z in zero1 zero2 zero3; do
  "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/$z" --set "memory.strategies=$z" \
    >"$TMP/$z.log" 2>&1 || { bad "$z 2 ranks exited $?"; tail -20 "$TMP/$z.log"; }
  curve_close "$TMP/dp" "$TMP/$z" loss 2e-3
  line=$(grep -o "$z: 2 ranks.*optimizer adamw_8bit: at most [0-9]* bytes of state per rank" "$TMP/$z.log")
  max=$(echo "$line" | sed 's/.*at most \([0-9]*\) bytes.*/\1/')
  echo "$z: unsharded $full bytes, per rank at most $max"
  [ -n "$full" ] && [ -n "$max" ] && [ $((max * 2)) -le $((full + full / 10)) ] && ok ||
    bad "$z: optimizer state: unsharded '$full', per rank '$max'"
  ck=$TMP/$z/checkpoint-4
  for r in 0 1; do
    head -c 4096 "$ck/optimizer.rank-$r.safetensors" 2>/dev/null | grep -aq '"dtype":"U8"' && ok ||
      bad "$z: no U8 state in $ck/optimizer.rank-$r.safetensors"
  done
  mkdir -p "$TMP/$z-res" && cp -r "$ck" "$TMP/$z-res/"
  grep '"step": [1-4],' "$TMP/$z/metrics.jsonl" >"$TMP/$z-res/metrics.jsonl"
  "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/$z-res" --set "memory.strategies=$z" \
    --set train.resume_from_checkpoint=last >"$TMP/$z-res.log" 2>&1 || { bad "$z resume"; tail -20 "$TMP/$z-res.log"; }
  curve_close "$TMP/$z" "$TMP/$z-res" loss 1e-7
done
finish
