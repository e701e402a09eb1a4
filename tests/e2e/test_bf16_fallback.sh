#!/usr/bin/env bash
# [train] dtype = bf16 where the CPU has no bf16 kernel (forced here by CTRL_NO_AVX512BF16=1, so that
# the test means the same on an AVX2-only CPU and on one with AVX-512 BF16 or AMX): with the default
# [train] bf16_fallback = fp32 the linear products are plain fp32's -- a full SFT run saves the fp32
# run's weights bit for bit and logs its curve; a LoRA run over a model stored in bf16 (the base held
# in bf16: its values are bf16's, as they are in the file) saves the fp32 LoRA run's adapter bit for
# bit --; with bf16_fallback = rounded they are bf16's (torch.autocast's: the weights differ). The log
# says once which path the products take and how to get the other. Where the CPU has a bf16 kernel
# (unforced), the key changes nothing: the two fallbacks save the same weights.
# usage: test_bf16_fallback.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
export OMP_NUM_THREADS=1
tiny_setup 3 2
tiny_ini "$TMP/run.ini" "$TMP/out" <<'INI'
learning_rate = 3e-3
max_steps = 4
per_device_train_batch_size = 4
logging_steps = 1
save_strategy = no
INI
curve() { sed 's/, "tokens_per_second": [0-9.]*//' "$1/metrics.jsonl" | grep '"step"'; }
# train NAME INI DTYPE FALLBACK [ENV...]: a run into $TMP/NAME (log $TMP/NAME.log)
train() {
  local name=$1 ini=$2 dt=$3 fb=$4
  shift 4
  env "$@" "${C[@]}" train "$ini" --set run.output_dir="$TMP/$name" --set train.dtype="$dt" \
    --set train.bf16_fallback="$fb" >"$TMP/$name.log" 2>&1 || { bad "$name: exited $?"; tail -5 "$TMP/$name.log"; }
}
same() { cmp -s "$TMP/$1/$3" "$TMP/$2/$3" && ok || bad "$1 and $2 saved different $3"; }
differ() { cmp -s "$TMP/$1/$3" "$TMP/$2/$3" && bad "$1 and $2 saved the same $3" || ok; }
NOFAST=(CTRL_NO_AVX512BF16=1)

# 1. Full SFT: bf16 without a bf16 kernel = fp32, bit for bit; rounded differs.
train f32 "$TMP/run.ini" fp32 fp32
train bf "$TMP/run.ini" bf16 fp32 "${NOFAST[@]}"
train rd "$TMP/run.ini" bf16 rounded "${NOFAST[@]}"
same f32 bf model.safetensors
differ f32 rd model.safetensors
if diff <(curve "$TMP/f32") <(curve "$TMP/bf") >"$TMP/diff"; then ok; else bad "bf16 (fp32 fallback) logs another curve than fp32"; cat "$TMP/diff"; fi
[ "$(wc -l < <(curve "$TMP/bf"))" -eq 4 ] && ok || bad "bf: $(cat "$TMP/bf/metrics.jsonl")"

# 2. The log: once, the path and the way to the other one.
# (why: this CPU has none, or they are turned off)
WHY='\((this CPU has no AVX-512 BF16|AVX-512 BF16 and AMX turned off by CTRL_NO_AVX512BF16)\)'
n=$(grep -cE "bf16 compute has no fast path here $WHY: the linear layers' products run in plain fp32" "$TMP/bf.log")
[ "$n" = 1 ] && ok || bad "bf16 (fp32 fallback): the path said $n times: $(grep -i bf16 "$TMP/bf.log")"
grep -q "bf16_fallback = rounded" "$TMP/bf.log" && ok || bad "bf: no word of bf16_fallback = rounded"
n=$(grep -cE "no fast path here: linear layers run as fp32 SGEMM on bf16-rounded inputs $WHY" "$TMP/rd.log")
[ "$n" = 1 ] && ok || bad "bf16 (rounded): the path said $n times: $(grep -i bf16 "$TMP/rd.log")"
grep -q "bf16_fallback = fp32 (the default) multiplies in plain fp32" "$TMP/rd.log" && ok || bad "rd: no word of the fp32 fallback"
grep -q "fast path" "$TMP/f32.log" && bad "fp32 run speaks of bf16: $(grep 'fast path' "$TMP/f32.log")" || ok

# 3. LoRA over a model stored in bf16: the base held in bf16 keeps its values, the products are fp32's.
"${C[@]}" model convert --model "$TMP/model" --out "$TMP/model16" --dtype bf16 >/dev/null || bad "convert to bf16"
{
  sed "s|^path = $TMP/model\$|path = $TMP/model16|" "$TMP/run.ini"
  printf '[peft]\nenabled = true\nr = 4\nlora_alpha = 8\ntarget_modules = all-linear\n'
} >"$TMP/lora.ini"
train lf32 "$TMP/lora.ini" fp32 fp32
train lbf "$TMP/lora.ini" bf16 fp32 "${NOFAST[@]}"
train lrd "$TMP/lora.ini" bf16 rounded "${NOFAST[@]}"
grep -q "frozen base held in bf16" "$TMP/lbf.log" && ok || bad "lbf: the base not held in bf16: $(grep LoRA "$TMP/lbf.log")"
same lf32 lbf adapter_model.safetensors
differ lf32 lrd adapter_model.safetensors

# 4. With a bf16 kernel (this CPU's, unforced) the key changes nothing.
train kf "$TMP/run.ini" bf16 fp32
if grep -q "bf16 linear layers on" "$TMP/kf.log"; then
  train kr "$TMP/run.ini" bf16 rounded
  same kf kr model.safetensors
  differ f32 kf model.safetensors
else
  grep -q "no fast path here (this CPU has no AVX-512 BF16)" "$TMP/kf.log" && ok || bad "kf: $(grep -i bf16 "$TMP/kf.log")"
  same f32 kf model.safetensors
  echo "(no bf16 kernel on this CPU: the key's no-op there not checked)"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
