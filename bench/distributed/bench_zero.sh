#!/usr/bin/env bash
# ZeRO memory per rank on the CPU (issue 19): 2 ranks of SFT (mpirun, 1 thread each) on a
# Qwen2.5-0.5B-shaped model (LAYERS of its 24 layers, common.sh) with no ZeRO, zero1, zero2 and
# zero3: each rank's peak resident memory and CPU time (/usr/bin/time: maximum RSS, user + system,
# loading included), the optimizer state each rank holds and zero3's resident parameters between
# steps (the run's own lines: each rank's memory right after loading -- zero3 reads its slices only --
# and after the first step), and the final loss (the same for all four). The peak RSS includes the
# final save (zero3: streamed to rank 0 a layer at a time, core/train/zero_save.c).
# usage: bench/distributed/bench_zero.sh BUILD_DIR [LAYERS STEPS]
set -euo pipefail
BUILD=$1 LAYERS=${2:-4} STEPS=${3:-3}
source "$(dirname "$0")/common.sh"
qwen_model "$TMP/model" "$LAYERS"
sft_ini "$TMP/run.ini" "$TMP/model" "$STEPS" 1
params=$("${C[@]}" model info "$TMP/model" | sed -n 's/^parameters *\([0-9]*\).*/\1/p')
machine
echo "model: Qwen2.5-0.5B-shaped, $LAYERS layers, $params parameters ($((params * 4 / 1048576)) MiB fp32); 2 ranks x 1 thread, $STEPS steps; load average $(load)"
echo "| strategy | peak RSS per rank | CPU s per step per rank | optimizer state per rank | final loss |"
echo "|---|---|---|---|---|"
for z in none zero1 zero2 zero3; do
  mem=checkpointing
  [ "$z" != none ] && mem="checkpointing,$z"
  timed "$TMP/$z.log" "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/$z" --set "memory.strategies=$mem"
  rss=$(ranks_rss "$TMP/$z.log")
  cpu=$(ranks_cpu "$TMP/$z.log" "$STEPS")
  state=$(grep -o "at most [0-9]* bytes of state per rank\|adamw: [0-9]* bytes of state per rank" "$TMP/$z.log" |
    grep -o "[0-9][0-9]*" | awk '{printf "%.0f MiB", $1 / 1048576}')
  echo "| $z | $rss | $cpu | $state | $(last "$TMP/$z" loss) |"
  grep -o "after loading the model.*\|zero3: parameters resident.*\|zero3: process memory.*\|zero3: the model saved by rank 0.*" "$TMP/$z.log" || true
  rm -f "$TMP/$z"/model*.safetensors # the disk: 4 saves of the model otherwise
done
echo "load average after: $(load)"
