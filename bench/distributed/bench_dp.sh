#!/usr/bin/env bash
# Data-parallel scaling on the CPU (issue 19): SFT on a Qwen2.5-0.5B-shaped model (LAYERS of its
# layers, common.sh) with the same global batch as 1 rank x 1 thread (batch B) and 2 ranks x 1
# thread (batch B/2 each, mpirun): the training loop's tokens/s (model loading and MPI start-up
# excluded), each process's CPU time (user + system, loading included) per step, the final losses
# (equal), the gradient allreduce's wall-clock and CPU time per step (rank 0's log line: the
# transfer alone, the ranks having met just before it) and the wall-clock speed-up. On a machine
# shared with other work the wall-clock ratio measures the load, not the scaling, and a rank's CPU
# time includes OpenMPI's polling (with sched_yield) while it waits for the slower one; so one rank
# is also run alone on half the batch: the CPU time per step of the whole batch over that of half
# of it plus the allreduce's CPU time is the speed-up two ranks would reach on two free cores. The
# machine (CPU model, cores, MPI), the date and the load average before and after are printed:
# a wall-clock speed-up means something only with a load average below the number of cores.
# usage: bench/distributed/bench_dp.sh BUILD_DIR [LAYERS STEPS BATCH]
set -euo pipefail
BUILD=$1 LAYERS=${2:-2} STEPS=${3:-10} BATCH=${4:-16}
source "$(dirname "$0")/common.sh"
qwen_model "$TMP/model" "$LAYERS"
sft_ini "$TMP/run.ini" "$TMP/model" "$STEPS" "$BATCH"
before=$(load)
timed "$TMP/one.log" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/one"
timed "$TMP/two.log" "${MPI[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/two" \
  --set train.per_device_train_batch_size=$((BATCH / 2))
timed "$TMP/half.log" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/half" \
  --set train.per_device_train_batch_size=$((BATCH / 2))
params=$("${C[@]}" model info "$TMP/model" | sed -n 's/^parameters *\([0-9]*\).*/\1/p')
one=$(last "$TMP/one" tokens_per_second) two=$(last "$TMP/two" tokens_per_second)
c1=$(cpu_times "$TMP/one.log") c2=$(cpu_times "$TMP/two.log" | tr '\n' ' ')
echo "machine: $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(getconf _NPROCESSORS_ONLN) cores; $(mpirun --version 2>&1 | head -1); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "model: Qwen2.5-0.5B-shaped, $LAYERS layers, $params parameters; $STEPS steps of global batch $BATCH; load average $before before, $(load) after"
echo "1 rank  x 1 thread: $one tok/s, CPU $(awk -v c="$c1" -v s="$STEPS" 'BEGIN { printf "%.2f", c / s }') s/step, final loss $(last "$TMP/one" loss)"
echo "2 ranks x 1 thread: $two tok/s, CPU $(echo "$c2" | awk -v s="$STEPS" '{ printf "%.2f and %.2f", $1 / s, $2 / s }') s/step per rank, final loss $(last "$TMP/two" loss)"
ch=$(cpu_times "$TMP/half.log")
echo "1 rank  x 1 thread, half the batch: CPU $(awk -v c="$ch" -v s="$STEPS" 'BEGIN { printf "%.2f", c / s }') s/step"
sync=$(grep -o "gradient allreduce of .*" "$TMP/two.log" || echo "gradient allreduce: no line in the log")
echo "2 ranks: $sync"
sync_cpu=$(echo "$sync" | sed -n 's/.* wall clock, \([0-9.]*\) ms CPU per step.*/\1/p')
[ "$(last "$TMP/one" loss)" = "$(last "$TMP/two" loss)" ] && echo "final losses: equal" || echo "final losses: DIFFER"
awk -v a="$one" -v b="$two" 'BEGIN { printf "wall-clock speed-up: %.2fx\n", b / a }'
awk -v a="$c1" -v b="$ch" 'BEGIN { printf "CPU-time speed-up (whole batch over half of it, one rank alone): %.2fx\n", a / b }'
awk -v a="$c1" -v b="$ch" -v r="${sync_cpu:-0}" -v s="$STEPS" 'BEGIN { printf "expected on two free cores (whole batch over half of it + the allreduce'"'"'s CPU time): %.2fx\n", (a / s) / (b / s + r / 1000) }'
