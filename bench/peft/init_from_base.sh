#!/usr/bin/env bash
# PEFT's initialisations that read the base (init_lora_weights = pissa: the top-r SVD of every adapted
# weight; olora: its QR), ctrl against PEFT on the same model in the same run: ctrl's one-step LoRA SFT
# run with each init against the same run with the default init (the difference is the
# initialisation), PEFT's get_peft_model timed around it (torch's threads as ctrl's). all-linear, r R.
#   bench/peft/init_from_base.sh BUILD_DIR MODEL_DIR [R (16)] [THREADS (2)]
# MODEL_DIR: a Hugging Face model directory (e.g. the Qwen2.5-0.5B-shaped random model of
# bench/scale: `ctrl model init --arch qwen2 --hidden 896 --layers 24 --heads 14 --kv-heads 2
# --intermediate 4864 --tie-embeddings --tokenizer ../shared/data/tokenizers/qwen3 --out DIR`).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "$1" && pwd) MODEL=$(cd "$2" && pwd) R=${3:-16} THREADS=${4:-2}
PY=${PYTHON:-/work/venv/bin/python}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=$THREADS OMP_WAIT_POLICY=PASSIVE
for i in 1 2 3 4; do echo '{"text": "the model learns a gradient from each token of the batch while the optimizer moves every weight"}'; done >"$TMP/train.jsonl"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $THREADS threads; $(date -u '+%Y-%m-%d %H:%M UTC'); r $R, all-linear"
printf '%-8s %12s %12s %14s %14s\n' init "ctrl wall s" "ctrl CPU s" "PEFT wall s" "PEFT CPU s"
declare -A base
for init in true pissa olora; do
  cat >"$TMP/$init.ini" <<INI
[run]
output_dir = $TMP/out_$init
[model]
path = $MODEL
[data]
train_file = $TMP/train.jsonl
max_length = 32
[train]
max_steps = 1
per_device_train_batch_size = 1
save_strategy = no
[peft]
enabled = true
r = $R
lora_alpha = $((2 * R))
target_modules = all-linear
init_lora_weights = $init
INI
  /usr/bin/time -f "%e %U %S" -o "$TMP/time" "$BUILD/ctrl" --plugin-dir "$BUILD/plugins" train "$TMP/$init.ini" >"$TMP/$init.log" 2>&1 ||
    { echo "ctrl $init failed:"; tail -3 "$TMP/$init.log"; exit 1; }
  read -r wall user sys <"$TMP/time"
  peft=$("$PY" - "$MODEL" "$init" "$R" "$THREADS" 2>/dev/null <<'PY'
import sys, time, torch
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model
torch.set_num_threads(int(sys.argv[4]))
init = {"true": True}.get(sys.argv[2], sys.argv[2])
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
r = int(sys.argv[3])
t0, c0 = time.time(), time.process_time()
get_peft_model(m, LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", init_lora_weights=init))
print("%.1f %.1f" % (time.time() - t0, time.process_time() - c0))
PY
)
  printf '%-8s %12.1f %12.1f %14s %14s\n' "$init" "$wall" "$(echo "$user + $sys" | bc)" ${peft}
done
echo "(ctrl: the whole one-step run; its initialisation is the difference from init true's row. PEFT: get_peft_model alone.)"
