#!/usr/bin/env bash
# The SFT loop end to end on the CPU: a tiny model learns (loss falls, metrics.jsonl written, the
# model saved and loadable again), gradient accumulation does not change the loss (bs 4 x ga 1
# equals bs 1 x ga 4 at step 1), a malformed row is reported with file:line, SIGINT saves.
# usage: test_train.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
tiny_setup 7 1
cat >"$TMP/run.ini" <<INI
[run]
output_dir = $TMP/out
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train.jsonl
eval_file = $TMP/data/eval.jsonl
[train]
learning_rate = 3e-3
max_steps = 60
per_device_train_batch_size = 8
logging_steps = 20
INI
if "${C[@]}" train "$TMP/run.ini" >"$TMP/log" 2>&1; then ok; else bad "train exited $?"; cat "$TMP/log"; fi
# Where the memory went after the first step (core/train/memory_report.c): logged once, the parts
# accounted for no more than what was resident (the rest, libraries and heap, is positive).
n=$(grep -c "memory after the first step: peak" "$TMP/log")
rest=$(sed -n 's/.*memory after the first step: .*heap) \([0-9-]*\) MiB.*/\1/p' "$TMP/log")
[ "$n" = 1 ] && [ -n "$rest" ] && [ "$rest" -gt 0 ] && ok || { bad "memory report: $n lines, rest '$rest'"; grep memory "$TMP/log"; }
[ -f "$TMP/out/metrics.jsonl" ] && [ -f "$TMP/out/model.safetensors" ] && [ -f "$TMP/out/tokenizer.json" ] && ok || bad "outputs missing"
if command -v gnuplot >/dev/null; then # the curves as a PNG (the magic bytes \x89PNG)
  [ "$(head -c 4 "$TMP/out/metrics.png" 2>/dev/null | od -An -c | tr -d ' ')" = "211PNG" ] && ok || bad "metrics.png missing or not a PNG"
fi
first=$(sed -n 1p "$TMP/out/metrics.jsonl" | sed 's/.*"loss": \([0-9.]*\).*/\1/')
last=$(sed -n 3p "$TMP/out/metrics.jsonl" | sed 's/.*"loss": \([0-9.]*\).*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a * 0.7) }' && ok || bad "loss did not fall: $first -> $last"
grep -q '"eval_exact_match"' "$TMP/out/metrics.jsonl" && ok || bad "no eval metrics"
for k in loss grad_norm learning_rate mean_token_accuracy num_tokens epoch; do
  grep -q "\"$k\"" "$TMP/out/metrics.jsonl" && ok || bad "metric $k missing"
done
# The saved model scores again.
printf '{"text": "1+2=3"}\n' >"$TMP/one.jsonl"
"${C[@]}" model logprobs --model "$TMP/out" --input "$TMP/one.jsonl" >/dev/null 2>&1 && ok || bad "saved model does not load"

# [run] log_level: warn keeps the INFO lines out (the OpenBLAS restart's too: a host whose OpenBLAS
# picks old kernels logged it before the level was read); the command line's --log-level wins over it.
env -u OPENBLAS_CORETYPE CTRL_TEST_BLAS_CORENAME=Prescott "${C[@]}" train "$TMP/run.ini" --set train.max_steps=1 --set run.log_level=warn --set run.output_dir="$TMP/quiet" \
  >"$TMP/log" 2>&1 && ! grep -q " INFO " "$TMP/log" && ok || bad "[run] log_level = warn still logs INFO"
"$CTRL" --plugin-dir "$PLUGINS" --log-level info train "$TMP/run.ini" --set train.max_steps=1 \
  --set run.log_level=warn --set run.output_dir="$TMP/loud" >"$TMP/log" 2>&1 && grep -q " INFO " "$TMP/log" && ok ||
  bad "--log-level info did not win over [run] log_level = warn"

# A model named by its Hub id, found in the local Hugging Face cache (no network); a missing one says
# where it was looked for.
mkdir -p "$TMP/hf/hub/models--org--tiny/refs" "$TMP/hf/hub/models--org--tiny/snapshots"
echo "0123abc" >"$TMP/hf/hub/models--org--tiny/refs/main"
cp -r "$TMP/model" "$TMP/hf/hub/models--org--tiny/snapshots/0123abc"
HF_HOME="$TMP/hf" "${C[@]}" train "$TMP/run.ini" --set model.path=org/tiny --set train.max_steps=1 \
  --set run.output_dir="$TMP/hubid" >"$TMP/log" 2>&1 && grep -q "local Hugging Face cache" "$TMP/log" && ok ||
  { bad "[model] path = org/tiny from HF_HOME's cache"; tail -3 "$TMP/log"; }
HF_HOME="$TMP/hf" "${C[@]}" model info org/missing >"$TMP/log" 2>&1
[ $? -ne 0 ] && grep -q "models--org--missing/refs/main" "$TMP/log" && ok || { bad "a missing Hub id"; cat "$TMP/log"; }

# Gradient accumulation: the same 4 examples as one batch or four micro-batches.
run_one() {
  "${C[@]}" train "$TMP/run.ini" --set data.shuffle=false --set train.max_steps=1 --set train.logging_steps=1 \
    --set run.output_dir="$TMP/$1" "${@:2}" >/dev/null 2>&1
  sed -n 1p "$TMP/$1/metrics.jsonl" | sed 's/.*"loss": \([0-9.]*\), "grad_norm": \([0-9.]*\).*/\1 \2/'
}
a=$(run_one ga1 --set train.per_device_train_batch_size=4 --set train.gradient_accumulation_steps=1)
b=$(run_one ga4 --set train.per_device_train_batch_size=1 --set train.gradient_accumulation_steps=4)
awk -v a="$a" -v b="$b" 'BEGIN { split(a, x, " "); split(b, y, " ");
  d1 = x[1] - y[1]; d2 = x[2] - y[2]; if (d1 < 0) d1 = -d1; if (d2 < 0) d2 = -d2;
  exit !(x[1] > 0 && d1 <= 1e-5 * x[1] && d2 <= 1e-4 * x[2]) }' && ok || bad "GA changes the step: [$a] vs [$b]"

# report_to: TensorBoard event files in output_dir/runs (the records of metrics.jsonl, HF's tags;
# tests/unit/test_tensorboard.c checks the bytes against the tensorboard package), no plot without png,
# and an integration ctrl does not have refused naming the key.
"${C[@]}" train "$TMP/run.ini" --set train.max_steps=2 --set train.logging_steps=1 --set train.report_to=tensorboard \
  --set run.output_dir="$TMP/tb" >"$TMP/log" 2>&1 && ok || { bad "report_to = tensorboard"; tail -3 "$TMP/log"; }
ev=$(ls "$TMP"/tb/runs/events.out.tfevents.* 2>/dev/null | head -n 1)
[ -n "$ev" ] && grep -q "brain.Event:2" "$ev" && grep -q "train/loss" "$ev" && grep -q "eval/exact_match" "$ev" && ok ||
  bad "no TensorBoard events with train/loss and eval/exact_match in $TMP/tb/runs"
[ ! -e "$TMP/tb/metrics.png" ] && ok || bad "metrics.png written though report_to has no png"
"${C[@]}" config check "$TMP/run.ini" --set train.report_to=wandb >"$TMP/log" 2>&1
[ $? -eq 2 ] && grep -q "report_to" "$TMP/log" && ok || { bad "report_to = wandb not refused"; cat "$TMP/log"; }

# A malformed row names file:line.
cp "$TMP/data/train.jsonl" "$TMP/broken.jsonl"
sed -i '5s/.*/{"prompt": 3}/' "$TMP/broken.jsonl"
"${C[@]}" train "$TMP/run.ini" --set data.train_file="$TMP/broken.jsonl" >"$TMP/log" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "broken.jsonl:5" "$TMP/log" && ok || { bad "malformed row: exit $rc"; cat "$TMP/log"; }
"${C[@]}" train "$TMP/run.ini" --set data.train_file="$TMP/broken.jsonl" --set data.skip_bad_rows=true \
  --set train.max_steps=2 >/dev/null 2>&1 && ok || bad "skip_bad_rows"

# SIGINT: finish the step, save, exit 130.
"${C[@]}" train "$TMP/run.ini" --set train.max_steps=100000 --set run.output_dir="$TMP/int" >"$TMP/log" 2>&1 &
pid=$!
for i in $(seq 50); do [ -f "$TMP/int/metrics.jsonl" ] && break; sleep 0.1; done
sleep 0.5
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] && [ -f "$TMP/int/model.safetensors" ] && ok || { bad "SIGINT: exit $rc"; tail -3 "$TMP/log"; }

# A CPU run never maps a CUDA library (libctrl_cuda, the CUDA runtime, cuBLAS): the loader's own
# list of the files it opens, dlopen included.
LD_DEBUG=files "${C[@]}" train "$TMP/run.ini" --set train.max_steps=1 --set run.output_dir="$TMP/nocuda" \
  >"$TMP/log" 2>&1 || { bad "one-step CPU run"; tail -3 "$TMP/log"; }
grep -q "file=.*libctrl.so" "$TMP/log" && ! grep -Eq "file=[^ ]*(libctrl_cuda|libcudart|libcublas|libcuda\.)" "$TMP/log" &&
  ok || bad "a CPU run loaded a CUDA library: $(grep -Eo "file=[^ ]*(cuda|cublas)[^ ]*" "$TMP/log" | sort -u | head -3)"

# [run] device: auto falls back to the CPU (saying so); cuda without a usable GPU is a clear error.
if [ ! -e /proc/driver/nvidia/version ]; then
  "${C[@]}" train "$TMP/run.ini" --set run.device=auto --set train.max_steps=1 --set run.output_dir="$TMP/auto" \
    >"$TMP/log" 2>&1 && grep -q "device auto: no NVIDIA driver; running on the CPU" "$TMP/log" && ok ||
    { bad "device auto"; tail -3 "$TMP/log"; }
  "${C[@]}" train "$TMP/run.ini" --set run.device=cuda:1 --set run.output_dir="$TMP/cuda" >"$TMP/log" 2>&1
  rc=$?
  [ $rc -eq 1 ] && grep -q "\[run\] device = cuda:1: " "$TMP/log" && ok || { bad "device cuda without a GPU: exit $rc"; cat "$TMP/log"; }
fi

finish
