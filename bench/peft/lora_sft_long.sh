#!/usr/bin/env bash
# LoRA SFT at a model's shape with rows long enough to measure speed (issue 18 item 7), ctrl
# against TRL + PEFT on the same random Qwen2-shaped model and the same text rows: all-linear, r 16,
# alpha 32, dropout 0, AdamW, lr 1e-4, STEPS steps of BATCH rows of ~ROW tokens (arithmetic facts,
# the loss on every token), one thread each (OMP_NUM_THREADS=1: CPU time is the steadier measure on
# a shared machine). Runs: ctrl [train] dtype = bf16 (the frozen base held in bf16), ctrl fp32, TRL
# + PEFT bf16 with the base in fp32 under autocast (what ctrl's bf16 computes), TRL + PEFT with
# the base loaded in bf16 (dtype=torch.bfloat16, the common practice; trl_lora_long.py). Per run:
# peak RSS (/usr/bin/time -v or ru_maxrss, loading included), wall, CPU seconds (ctrl: user + sys
# of the whole process, loading included; TRL: process time of trainer.train() only -- both
# against ctrl), tokens/s by wall (ctrl's last tokens_per_second, TRL's num_tokens / train_runtime)
# and by CPU, the tokens trained, the last loss. Qwen2.5-0.5B's shape:
#   bench/peft/lora_sft_long.sh build 896 24 14 2 4864 --tokenizer /work/shared/data/tokenizers/qwen3 \
#     --vocab 151936 --tie-embeddings
# usage: bench/peft/lora_sft_long.sh BUILD_DIR HIDDEN LAYERS HEADS KV_HEADS INTERMEDIATE [--tokenizer DIR]
#        [--vocab N] [--tie-embeddings] [--steps N (3)] [--batch N (4)] [--row N (256)] [--no-trl]
#        [--ctrl "bf16 fp32" (ctrl's runs; "" none; bf16-store: bf16 with the base in the 2-byte store
#        widened per layer, CTRL_NO_BASE_PANELS=1, as before the panels; a suffix +keep: no activation
#        checkpointing, [memory] strategies = (empty), every activation kept; +mlp: selective
#        checkpointing, [checkpointing] keep_mlp = true; +emb16: the frozen embedding held in bf16,
#        [peft] embedding_dtype = bf16 (what the default, auto, does under bf16 on the CPU); +emb32: the
#        fp32 table autocast keeps, embedding_dtype = fp32; +rounded: [train] bf16_fallback = rounded,
#        bf16's rounded products where no bf16 GEMM kernel runs)] [--trl-modes "autocast bf16" (also fp32: no
#        autocast, bf16=False)] [--tokens IDS (comma-separated: PEFT's trainable_token_indices in every run,
#        ctrl's and TRL's)]
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
. "$SRC/bench/peft/watch_run.sh"
BUILD=$(cd "$1" && pwd)
shift
STEPS=3 BATCH=4 ROW=256 TRL=1 TOK=$SRC/tests/fixtures/tokenizer/tiny_bpe DTYPES="bf16 fp32" MODES="autocast bf16" TOKENS=
ARGS=() INIT=()
while [ $# -gt 0 ]; do
  case $1 in
    --tokenizer) TOK=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --batch) BATCH=$2; shift ;;
    --row) ROW=$2; shift ;;
    --no-trl) TRL=0 ;;
    --ctrl) DTYPES=$2; shift ;;
    --trl-modes) MODES=$2; shift ;;
    --tokens) TOKENS=$2; shift ;;
    --vocab) INIT+=(--vocab "$2"); shift ;;
    --tie-embeddings) INIT+=(--tie-embeddings) ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
C=("$BUILD/ctrl" --plugin-dir "$BUILD/plugins")
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
"${C[@]}" model init --arch qwen2 --hidden "${ARGS[0]}" --layers "${ARGS[1]}" --heads "${ARGS[2]}" \
  --kv-heads "${ARGS[3]}" --intermediate "${ARGS[4]}" "${INIT[@]}" --tokenizer "$TOK" --out "$TMP/model" >/dev/null
# rows of arithmetic facts, ~ROW tokens each by the model's tokenizer
/work/venv/bin/python - "$TMP/model" "$TMP/train.jsonl" "$ROW" "$((STEPS * BATCH))" <<'PY'
import json, random, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
row, n = int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(1)
with open(sys.argv[2], "w") as f:
    for _ in range(n):
        text = ""
        while True:
            a, b = rng.randrange(100), rng.randrange(100)
            more = text + "%d+%d=%d. " % (a, b, a + b)
            if len(tok(more.strip())["input_ids"]) + 1 > row: break
            text = more
        f.write(json.dumps({"text": text.strip()}) + "\n")
PY
cat >"$TMP/run.ini" <<INI
[run]
device = cpu
seed = 1
[model]
path = $TMP/model
[data]
train_file = $TMP/train.jsonl
max_length = 1024
[train]
learning_rate = 1e-4
max_steps = $STEPS
per_device_train_batch_size = $BATCH
logging_steps = 1
save_strategy = no
[peft]
enabled = true
target_modules = all-linear
r = 16
lora_alpha = 32
lora_dropout = 0
INI
echo "rows: $((STEPS * BATCH)) of ~$ROW tokens; $STEPS steps of $BATCH; one thread each${TOKENS:+; trainable_token_indices $TOKENS}"
echo "load: $(uptime | sed 's/.*load/load/')"
printf '| run | peak RSS (MiB) | wall (s) | CPU (s) | CPU s/step | tokens/s (wall) | tokens/s (CPU) | tokens | last loss |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for dtype in $DTYPES; do
  out=$TMP/out-$dtype
  env=() real=${dtype%+*} sets=()
  case $dtype in
    *+keep) sets=(--set memory.strategies=) ;;
    *+mlp) sets=(--set checkpointing.keep_mlp=true) ;;
    *+emb16) sets=(--set peft.embedding_dtype=bf16) ;;
    *+emb32) sets=(--set peft.embedding_dtype=fp32) ;;
    *+rounded) sets=(--set train.bf16_fallback=rounded) ;;
  esac
  [ "$real" = bf16-store ] && env=(CTRL_NO_BASE_PANELS=1) real=bf16
  [ -n "$TOKENS" ] && sets+=(--set peft.trainable_token_indices="$TOKENS")
  env "${env[@]}" /usr/bin/time -v -o "$TMP/time-$dtype" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$out" \
    --set train.dtype=$real "${sets[@]}" >"$TMP/log-$dtype" 2>&1 &
  watch_run $! "$out/metrics.jsonl" "$STEPS" || { tail -5 "$TMP/log-$dtype"; exit 1; }
  cps=$(awk -v a="${cpu1:-0}" -v b="${cpun:-0}" -v t="$(getconf CLK_TCK)" -v n="$STEPS" \
    'BEGIN {print (n > 1 && b > a) ? sprintf("%.2f", (b - a) / t / (n - 1)) : "-"}')
  peak=$(awk -F': ' '/Maximum resident/ {print $2}' "$TMP/time-$dtype")
  wall=$(awk -F': ' '/Elapsed/ {print $2}' "$TMP/time-$dtype")
  cpu=$(awk -F': ' '/User time|System time/ {t += $2} END {print t}' "$TMP/time-$dtype")
  last=$(grep '"step"' "$out/metrics.jsonl" | tail -1)
  loss=$(echo "$last" | sed 's/.*"loss": \([0-9.]*\).*/\1/')
  tps=$(echo "$last" | sed 's/.*"tokens_per_second": \([0-9.]*\).*/\1/')
  tokens=$(echo "$last" | sed -n 's/.*"num_tokens": \([0-9.]*\).*/\1/p')
  printf '| ctrl LoRA, dtype = %s | %d | %s | %.1f | %s | %.1f | %s | %s | %s |\n' $dtype $((peak / 1024)) "$wall" "$cpu" "$cps" \
    "$tps" "$([ -n "$tokens" ] && awk -v n="$tokens" -v c="$cpu" 'BEGIN {printf "%.1f", n / c}' || echo -)" \
    "${tokens:--}" "$loss"
  awk -F': ' '/User time/ {u = $2} /System time/ {s = $2} /Minor/ {f = $2} END {
    printf "  (user %s s, system %s s, %s minor page faults: the whole process)\n", u, s, f}' "$TMP/time-$dtype"
  grep -h "frozen base\|frozen embedding" "$TMP/log-$dtype" | sed 's/^.*LoRA: /  (ctrl log: /; s/$/)/' || true
  grep -h "memory after the first step" "$TMP/log-$dtype" | sed 's/^.*memory after/  (ctrl log: memory after/; s/$/)/' || true
done
if [ $TRL = 1 ]; then
  for mode in $MODES; do
    /work/venv/bin/python "$SRC/bench/peft/trl_lora_long.py" "$TMP/model" "$TMP/train.jsonl" $mode "$STEPS" \
      "$BATCH" "$TOKENS" 2>"$TMP/trl-$mode.err" | grep '^| TRL' || tail -3 "$TMP/trl-$mode.err"
  done
fi
echo "load after: $(uptime | sed 's/.*load/load/')"
