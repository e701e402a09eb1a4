#!/usr/bin/env bash
# zero3 over a QLoRA base (issues 19, 18; core/train/zero_nf4.c): 2 ranks of LoRA SFT (mpirun, 1
# thread each) on a Qwen2.5-0.5B-shaped model (hidden 896, 14 heads, 2 KV heads, intermediate 4864;
# LAYERS of its 24, the tiny test tokenizer's vocabulary so that the layers are what is measured) with
# [peft] quantization = nf4 (all-linear, r 16): plain data parallel (every rank the whole NF4 store)
# against zero3 (each rank its slice, a layer's gathered around each use). Per rank: the peak resident
# memory and CPU time (/usr/bin/time: maximum RSS, user + system, loading included -- the load's peak:
# every rank quantizes the whole base as it loads), the resident memory while training (VmRSS sampled
# every 0.5 s from /proc: each rank's median over the second half of its samples), the NF4 bytes held between steps
# (zero3's line), the final loss (the same both ways). (The load's peak: every rank used to read and
# quantize the whole base; now a zero3 rank reads its slices and keeps its super-blocks, zero_load.c.)
# QUANT=none: plain LoRA (the base fp32), to measure zero3 + LoRA's sliced load the same way.
# usage: [QUANT=none] bench/distributed/bench_zero3_nf4.sh BUILD_DIR [LAYERS STEPS]
set -euo pipefail
BUILD=$1 LAYERS=${2:-2} STEPS=${3:-3}
source "$(dirname "$0")/common.sh"
qwen_model "$TMP/model" "$LAYERS"
sft_ini "$TMP/run.ini" "$TMP/model" "$STEPS" 1
printf '[peft]\nenabled = true\ntarget_modules = all-linear\nr = 16\nlora_alpha = 32\n' >>"$TMP/run.ini"
[ "${QUANT:-nf4}" = nf4 ] && printf 'quantization = nf4\n' >>"$TMP/run.ini"
params=$("${C[@]}" model info "$TMP/model" | sed -n 's/^parameters *\([0-9]*\).*/\1/p')
machine
echo "model: Qwen2.5-0.5B-shaped, $LAYERS layers, tiny vocabulary, $params parameters ($((params * 4 / 1048576)) MiB fp32); $([ "${QUANT:-nf4}" = nf4 ] && echo "QLoRA (nf4," || echo "LoRA (fp32 base,") all-linear, r 16); 2 ranks x 1 thread, $STEPS steps; load average $(load)"
echo "| QLoRA over 2 ranks | peak RSS per rank | VmRSS while training per rank | CPU s per step per rank | NF4 store per rank | final loss |"
echo "|---|---|---|---|---|---|"
rank_env
# sample OUT: every 0.5 s, "PID VmRSS_kB" of each rank of this run (its ctrl processes) into OUT
sample() {
  local p
  while :; do
    for p in $(pgrep -f "$TMP/run.ini" || true); do
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = ctrl ] && echo "$p $(awk '/^VmRSS/ { print $2 }' "/proc/$p/status" 2>/dev/null)"
    done
    sleep 0.5
  done >>"$1"
}
# each rank's median sample over the second half of its samples (training: past the load's peak,
# before the teardown), "a / b MiB"
mid_rss() {
  local p
  for p in $(awk 'NF == 2 { print $1 }' "$1" | sort -u); do
    awk -v p="$p" '$1 == p && $2 != "" { print $2 }' "$1" >"$TMP/one"
    tail -n $(($(wc -l <"$TMP/one") / 2 + 1)) "$TMP/one" | sort -n |
      awk '{ v[NR] = $1 } END { printf "%.0f\n", v[int((NR + 1) / 2)] / 1024 }'
  done | paste -sd/ | sed 's|/| / |g; s/$/ MiB/'
}
for way in plain zero3; do
  st=() && [ $way = zero3 ] && st=(--set memory.strategies=zero3)
  sample "$TMP/$way.rss" &
  sampler=$!
  timed "$TMP/$way.log" "${MPI[@]}" "${ENV[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/$way" \
    "${st[@]}" || { kill $sampler; tail -20 "$TMP/$way.log"; exit 1; }
  kill $sampler && wait $sampler 2>/dev/null || true
  rss=$(ranks_rss "$TMP/$way.log")
  cpu=$(ranks_cpu "$TMP/$way.log" "$STEPS")
  held=$(grep -o "the NF4 base between steps: at most [0-9]* of its [0-9]* bytes" "$TMP/$way.log" |
    sed 's/.*at most \([0-9]*\) of its \([0-9]*\) bytes/\1 of \2 B/' || true)
  echo "| $way | $rss | $(mid_rss "$TMP/$way.rss") | $cpu | ${held:-whole} | $(last "$TMP/$way" loss) |"
  grep -o "zero3: the NF4 base.*\|zero3: process memory.*\|after loading the model.*\|LoRA: r .*" "$TMP/$way.log" | sort -u || true
done
echo "load average after: $(load)"
