#!/usr/bin/env bash
# offload_optimizer on a GPU, natively (docs/distributed.md "Offloading the optimizer"): the same SFT
# run with the optimizer on the device, with offload_optimizer stepping the whole model on the host
# ([memory] offload_overlap = false) and with the host step overlapped layer by layer with the next
# forward (the default), and the same pair under zero3 (one rank). Checks that the two offloaded runs
# of each pair save the same weights bit for bit and the
# same curve, and prints each run's wall and CPU seconds a step (the steps after the first) and the
# overlap's log line. A Qwen2-shaped model of LAYERS layers (default 12), hidden HIDDEN (1024),
# randomly initialised with the repository's tiny tokenizer, STEPS (8) steps of batch 4 x SEQ (512)
# tokens, bf16. PLUGINS: another plugin directory (the emulator's: build/plugins-emu with
# CTRL_CUDA_LIBRARY=build/cuda-emu/libctrl_cuda.so, to try the script on a machine without a GPU).
# usage: [SEQ=N] bench/cuda/offload_overlap.sh BUILD_DIR [LAYERS] [HIDDEN] [STEPS]
set -uo pipefail
B=$1 L=${2:-12} H=${3:-1024} S=${4:-8} T=${SEQ:-512}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
C=("$B/ctrl" --plugin-dir "${PLUGINS:-$B/plugins}")
"${C[@]}" model init --arch qwen2 --hidden "$H" --layers "$L" --heads $((H / 64)) --vocab 4096 \
  --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$W/model" >/dev/null || { echo "FAIL model init"; exit 1; }
python3 - "$W/train.jsonl" <<'PY'
import json, random, sys
r = random.Random(0)
with open(sys.argv[1], "w") as f:
    for i in range(256):
        words = " ".join(str(r.randrange(1000)) for _ in range(700))
        f.write(json.dumps({"prompt": "count: ", "completion": words}) + "\n")
PY
cat >"$W/run.ini" <<INI
[run]
device = cuda
[model]
path = $W/model
[data]
train_file = $W/train.jsonl
max_length = $T
[train]
learning_rate = 1e-4
max_steps = $S
per_device_train_batch_size = 4
logging_steps = 1
save_strategy = no
max_grad_norm = 1.0
dtype = bf16
INI
run() { # NAME ARGS...: the process's wall and CPU seconds, the run's mean tokens/s
  local n=$1
  shift
  /usr/bin/time -f "%e %U %S" -o "$W/$n.time" "${C[@]}" train "$W/run.ini" --set run.output_dir="$W/$n" "$@" \
    >"$W/$n.log" 2>&1 || { echo "FAIL $n: $(tail -n 3 "$W/$n.log")"; return; }
  local wall user sys
  read -r wall user sys <"$W/$n.time"
  echo "$n: ${wall}s wall, $(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')s CPU for the process ($S steps, load $(cut -d' ' -f1 /proc/loadavg)); $(grep -o '"tokens_per_second": [0-9.]*' "$W/$n/metrics.jsonl" | tail -n1) (mean over the run)"
}
run device
run whole --set memory.strategies=checkpointing,offload_optimizer --set memory.offload_overlap=false
run overlap --set memory.strategies=checkpointing,offload_optimizer
curve() { grep -o '"loss": [-0-9.e]*\|"grad_norm": [-0-9.e]*' "$1/metrics.jsonl"; }
if cmp -s "$W/whole/model.safetensors" "$W/overlap/model.safetensors" && [ "$(curve "$W/whole")" = "$(curve "$W/overlap")" ]; then
  echo "offload overlap: the same weights bit for bit and the same curve as the whole-model host step"
else
  echo "FAIL offload overlap: the weights or the curve differ from the whole-model host step"
fi
grep -o "offload_optimizer: the host step overlapped with the next step's compute in .*" "$W/overlap.log"
grep -o "optimizer adamw: .*" "$W/device.log" | head -n1
# under zero3 (one rank: its slices are the whole model, stepped unit by unit on the host, each put on
# the device before its gather), the same pair
run z3whole --set memory.strategies=checkpointing,zero3,offload_optimizer --set memory.offload_overlap=false
run z3overlap --set memory.strategies=checkpointing,zero3,offload_optimizer
if cmp -s "$W/z3whole/model.safetensors" "$W/z3overlap/model.safetensors" && [ "$(curve "$W/z3whole")" = "$(curve "$W/z3overlap")" ]; then
  echo "zero3 offload overlap: the same weights bit for bit and the same curve as the whole host step"
else
  echo "FAIL zero3 offload overlap: the weights or the curve differ from the whole host step"
fi
grep -o "offload_optimizer: the host step overlapped with the next step's compute in .*" "$W/z3overlap.log"
