#!/usr/bin/env bash
# Memory of LoRA and QLoRA against a full fine-tune: SFT on the CPU, the same random Qwen2-shaped
# model and data, `[peft] enabled` false, then true (all-linear, r 16, alpha 32), then true with
# `quantization = nf4` (QLoRA), 3 steps of 8 rows, fp32,
# AdamW. Per run: peak RSS (/usr/bin/time -v, loading included), the largest RSS sampled while the
# steps run (/proc/PID/status every 0.05 s once the first step is logged), wall time, the last loss.
# With `--trl`, the same two runs with TRL's SFTTrainer (+ PEFT's LoraConfig) in /work/venv. Each
# run's tokens/s: its num_tokens (the same count in both: every attended token) over the training
# time, all steps (ctrl's last tokens_per_second; TRL's num_tokens / train_runtime); CPU s/step: the
# process's CPU time (user + system) per step after the first (ctrl: /proc/PID/stat sampled when
# step 1 and step N are logged; TRL: time.process_time() at each step's end), the steadier measure
# on a shared machine. --dtype bf16: ctrl's [train] dtype = bf16 (QLoRA: bnb_4bit_compute_dtype
# bfloat16's arithmetic), TRL's bf16=True (autocast).
# INTERMEDIATE (default 4 x HIDDEN), --tokenizer DIR (default the 1024-token tiny_bpe; a real
# vocabulary, e.g. /work/shared/data/tokenizers/qwen3), --vocab N and --tie-embeddings (ctrl model
# init's), --steps N (default 3), --dtype fp32|bf16 (default fp32), --repeat R (each row's prompt
# is its own "a+b=c, " R - 1 times before "a+b=": R times the tokens per step, both frameworks),
# --no-full (skip the full fine-tunes, ctrl's and TRL's: at 0.5B they need 8+ GiB). Qwen2.5-0.5B's
# shape:
#   bench/peft/memory.sh build 896 24 14 2 4864 --tokenizer /work/shared/data/tokenizers/qwen3 \
#     --vocab 151936 --tie-embeddings --trl --no-full
# usage: bench/peft/memory.sh BUILD_DIR [HIDDEN LAYERS HEADS KV_HEADS [INTERMEDIATE]] [--tokenizer DIR]
#        [--vocab N] [--tie-embeddings] [--steps N] [--dtype fp32|bf16] [--repeat R] [--no-full] [--trl]
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/peft/watch_run.sh"
BUILD=$(cd "$1" && pwd)
shift
TRL=0 FULL=1 STEPS=3 DTYPE=fp32 REPEAT=1 TOK=$SRC/tests/fixtures/tokenizer/tiny_bpe
ARGS=() INIT=()
while [ $# -gt 0 ]; do
  case $1 in
    --trl) TRL=1 ;;
    --no-full) FULL=0 ;;
    --tokenizer) TOK=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --dtype) DTYPE=$2; shift ;;
    --repeat) REPEAT=$2; shift ;;
    --vocab) INIT+=(--vocab "$2"); shift ;;
    --tie-embeddings) INIT+=(--tie-embeddings) ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
HIDDEN=${ARGS[0]:-1024} LAYERS=${ARGS[1]:-12} HEADS=${ARGS[2]:-16} KV=${ARGS[3]:-4}
INTER=${ARGS[4]:-$((4 * HIDDEN))}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
C=("$BUILD/ctrl" --plugin-dir "$BUILD/plugins")
export OMP_WAIT_POLICY=PASSIVE
bash "$SRC/scripts/make_quickstart_data.sh" "$TMP/data" 1 >/dev/null
if [ "$REPEAT" -gt 1 ]; then # longer rows: {"prompt": "P", "completion": "C"} -> prompt (P C, ) x (R - 1) P
  awk -v r="$REPEAT" -F'"' '{ s = ""; for (i = 1; i < r; i++) s = s $4 $8 ", "
    printf "{\"prompt\": \"%s%s\", \"completion\": \"%s\"}\n", s, $4, $8 }' "$TMP/data/train.jsonl" >"$TMP/data/long.jsonl"
  mv "$TMP/data/long.jsonl" "$TMP/data/train.jsonl"
fi
"${C[@]}" model init --arch qwen2 --hidden "$HIDDEN" --layers "$LAYERS" --heads "$HEADS" --kv-heads "$KV" \
  --intermediate "$INTER" "${INIT[@]}" --tokenizer "$TOK" --out "$TMP/model" >/dev/null
cat >"$TMP/run.ini" <<INI
[run]
device = cpu
seed = 1
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train.jsonl
[train]
learning_rate = 1e-4
max_steps = $STEPS
per_device_train_batch_size = 8
logging_steps = 1
save_strategy = no
dtype = $DTYPE
[peft]
target_modules = all-linear
r = 16
lora_alpha = 32
lora_dropout = 0
INI
echo "model: $("${C[@]}" model info "$TMP/model" | grep parameters | awk '{print $2}') parameters (hidden $HIDDEN, $LAYERS layers, intermediate $INTER, vocabulary $("${C[@]}" model info "$TMP/model" | awk '/vocab/ {print $2; exit}'))"
echo "load: $(uptime | sed 's/.*load/load/')"
echo "dtype: $DTYPE, rows repeated $REPEAT x"
printf '| run | peak RSS (MiB) | RSS while training (MiB) | wall (s) | tokens/s | CPU s/step | last loss |\n|---|---|---|---|---|---|---|\n'
TICK=$(getconf CLK_TCK)
RUNS="false true nf4"
[ $FULL = 0 ] && RUNS="true nf4"
for peft in $RUNS; do
  out=$TMP/out-$peft
  /usr/bin/time -v -o "$TMP/time-$peft" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$out" \
    $([ $peft = nf4 ] && echo "--set peft.enabled=true --set peft.quantization=nf4" || echo "--set peft.enabled=$peft") \
    >"$TMP/log-$peft" 2>&1 &
  watch_run $! "$out/metrics.jsonl" "$STEPS"
  peak=$(awk -F': ' '/Maximum resident/ {print $2}' "$TMP/time-$peft")
  wall=$(awk -F': ' '/Elapsed/ {print $2}' "$TMP/time-$peft")
  loss=$(grep '"step"' "$out/metrics.jsonl" | tail -1 | sed 's/.*"loss": \([0-9.]*\).*/\1/')
  tps=$(grep '"step"' "$out/metrics.jsonl" | tail -1 | sed 's/.*"tokens_per_second": \([0-9.]*\).*/\1/')
  name=$(case $peft in true) echo "ctrl LoRA" ;; nf4) echo "ctrl QLoRA (nf4)" ;; *) echo "ctrl full fine-tune" ;; esac)
  cps=$(awk -v a="${cpu1:-0}" -v b="${cpun:-0}" -v t="$TICK" -v n="$STEPS" 'BEGIN {print (n > 1 && b > a) ? sprintf("%.2f", (b - a) / t / (n - 1)) : "-"}')
  printf '| %s | %d | %d | %s | %.1f | %s | %s |\n' "$name" $((peak / 1024)) $((max / 1024)) "$wall" "$tps" "$cps" "$loss"
done
if [ $TRL = 1 ]; then
  for peft in $([ $FULL = 1 ] && echo 0) 1; do
    /work/venv/bin/python "$SRC/bench/peft/trl_sft.py" "$TMP/model" "$TMP/data/train.jsonl" $peft "$STEPS" "$DTYPE" 2>/dev/null |
      grep '^| TRL'
  done
fi
echo "load after: $(uptime | sed 's/.*load/load/')"
