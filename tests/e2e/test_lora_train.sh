#!/usr/bin/env bash
# LoRA ([peft] enabled) end to end: SFT trains the adapters only (the loss falls; output_dir and
# every checkpoint hold a PEFT adapter -- adapter_config.json + adapter_model.safetensors -- and no
# model; the optimizer state is the adapters' only, a fraction of a full fine-tune's); a run
# resumed from a checkpoint continues the same curve (dropout included); a run continues from an
# adapter directory ([peft] adapter_path); GRPO with a KL term uses the base with the adapters
# switched off as its reference (KL exactly 0 at the first step, where B = 0), also in server mode (the
# server sent the merged weights generates what the adapter does), RLOO and DPO train.
# usage: test_lora_train.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/e2e_common.sh"
export OMP_NUM_THREADS=1
tiny_setup 5 2
tiny_ini "$TMP/sft.ini" "$TMP/lora" "seed = 11" <<INI
learning_rate = 2e-2
lr_scheduler_type = constant
max_steps = 8
per_device_train_batch_size = 4
gradient_accumulation_steps = 2
logging_steps = 1
save_steps = 4
[peft]
enabled = true
r = 4
lora_alpha = 8
lora_dropout = 0.1
target_modules = all-linear
INI
curve() { sed 's/, "tokens_per_second": [0-9.]*//' "$1/metrics.jsonl" | grep '"step"'; }
loss_at() { grep "\"step\": $2," "$1/metrics.jsonl" | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/'; }

# 1. SFT with LoRA: adapters saved in PEFT's format, no full model anywhere; the loss falls.
"${C[@]}" train "$TMP/sft.ini" >"$TMP/log" 2>&1 || { bad "lora sft run"; tail -5 "$TMP/log"; }
for d in "$TMP/lora" "$TMP/lora/checkpoint-4" "$TMP/lora/checkpoint-8"; do
  [ -s "$d/adapter_config.json" ] && [ -s "$d/adapter_model.safetensors" ] && ok || bad "$d: no adapter"
  [ -e "$d/model.safetensors" ] && bad "$d: a full model was saved" || ok
done
grep -q "\"peft_type\":[[:space:]]*\"LORA\"" "$TMP/lora/adapter_config.json" &&
  grep -q "\"base_model_name_or_path\":[[:space:]]*\"$TMP/model\"" "$TMP/lora/adapter_config.json" &&
  grep -q "\"task_type\":[[:space:]]*\"CAUSAL_LM\"" "$TMP/lora/adapter_config.json" &&
  grep -q "\"lora_dropout\":[[:space:]]*0.1," "$TMP/lora/adapter_config.json" && ok || bad "adapter_config.json"
grep -q "LoRA: r 4, scale 2, .* trainable parameters" "$TMP/log" && ok || bad "no LoRA line in the log"
grep -q "LoRA: the frozen base held in bf16" "$TMP/log" && ok || bad "bf16 LoRA: the base not held in bf16"
grep -q "frozen embedding held in bf16 (\[peft\] embedding_dtype = auto, the default)" "$TMP/log" && ok ||
  bad "bf16 LoRA on the CPU: the embedding not held in bf16 by default"
# (the frozen random base's head keeps this small model near uniform: a modest but clear drop)
first=$(loss_at "$TMP/lora" 1) last=$(for s in 5 6 7 8; do loss_at "$TMP/lora" $s; done | awk '{ t += $1 } END { print t / NR }')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.05) }' && ok || bad "loss did not fall: $first -> $last (mean of 5-8)"

# 1b. ctrl model merge: the merged model scores what the base under the adapter does
# (`ctrl model logprobs --adapter`), and differs from the base.
printf '{"text": "12+7=19"}\n{"text": "40+3=43"}\n' >"$TMP/lp.jsonl"
"${C[@]}" model merge --base "$TMP/model" --adapter "$TMP/lora" --out "$TMP/merged" >/dev/null 2>&1 &&
  [ -s "$TMP/merged/model.safetensors" ] && [ -s "$TMP/merged/tokenizer.json" ] && ok || bad "model merge"
lp() { "${C[@]}" model logprobs --input "$TMP/lp.jsonl" "$@" 2>/dev/null | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/' | tr '\n' ' '; }
with=$(lp --model "$TMP/model" --adapter "$TMP/lora") merged=$(lp --model "$TMP/merged") base=$(lp --model "$TMP/model")
awk -v a="$with" -v b="$merged" -v c="$base" 'BEGIN { n = split(a, x, " "); split(b, y, " "); split(c, z, " ");
  for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > 1e-5 * y[i] || x[i] == z[i]) exit 1 }
  exit !(n == 2) }' && ok || bad "merged losses $merged, with the adapter $with, base $base"
# 1c. PEFT's other choices of modules and per-module rank / alpha ([peft] rank_pattern, alpha_pattern,
# exclude_modules, layers_to_transform + layers_pattern): saved in adapter_config.json as PEFT writes them,
# and the merged model (each module at its own scale) scores what the adapter does; a pattern that is not
# a regular expression is a config error naming the key.
pat=(--set train.max_steps=2 --set train.save_strategy=no --set peft.target_modules=q_proj,k_proj,v_proj,down_proj
  --set 'peft.rank_pattern={"q_proj": 2, "layers\\.1\\.mlp\\.down_proj": 6}' --set 'peft.alpha_pattern={"v_proj": 3}'
  --set peft.exclude_modules=k_proj --set peft.layers_to_transform=1 --set peft.layers_pattern=layers)
"${C[@]}" train "$TMP/sft.ini" "${pat[@]}" --set run.output_dir="$TMP/pat" >"$TMP/log" 2>&1 || { bad "patterns run"; tail -3 "$TMP/log"; }
tr -d ' \t\n' <"$TMP/pat/adapter_config.json" >"$TMP/pat.json"
grep -q '"rank_pattern":{"q_proj":2,"layers\\\\.1\\\\.mlp\\\\.down_proj":6}' "$TMP/pat.json" &&
  grep -q '"alpha_pattern":{"v_proj":3}' "$TMP/pat.json" && grep -q '"exclude_modules":\["k_proj"\]' "$TMP/pat.json" &&
  grep -q '"layers_to_transform":\[1\]' "$TMP/pat.json" && grep -q '"layers_pattern":\["layers"\]' "$TMP/pat.json" &&
  grep -q "(other ranks / scales where rank_pattern / alpha_pattern say)" "$TMP/log" && ok ||
  { bad "patterns: adapter_config.json or log"; cat "$TMP/pat.json"; }
"${C[@]}" model merge --base "$TMP/model" --adapter "$TMP/pat" --out "$TMP/pmerged" >/dev/null 2>&1 || bad "patterns: merge"
with=$(lp --model "$TMP/model" --adapter "$TMP/pat") merged=$(lp --model "$TMP/pmerged")
awk -v a="$with" -v b="$merged" -v c="$base" 'BEGIN { n = split(a, x, " "); split(b, y, " "); split(c, z, " ");
  for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > 1e-5 * y[i] || x[i] == z[i]) exit 1 }
  exit !(n == 2) }' && ok || bad "patterns: merged losses $merged, with the adapter $with, base $base"
"${C[@]}" train "$TMP/sft.ini" --set 'peft.rank_pattern={"q_(proj": 2}' >"$TMP/log" 2>&1
[ $? = 2 ] && grep -q "\[peft\] rank_pattern: 'q_(proj'" "$TMP/log" && ok || { bad "a bad rank_pattern not refused"; tail -3 "$TMP/log"; }
"${C[@]}" train "$TMP/sft.ini" --set peft.layers_to_transform=0 >"$TMP/log" 2>&1
[ $? = 2 ] && grep -q "layers_to_transform / layers_pattern cannot be used when target_modules is a string" "$TMP/log" && ok ||
  { bad "layers_to_transform with all-linear not refused"; tail -3 "$TMP/log"; }
# 1c2. init_lora_weights = pissa / olora (the adapters from each weight's SVD / QR, the base its residual)
# and orthogonal (B A = 0 with neither zero): the first step's loss is the base model's (the default
# init's, B = 0) up to bf16 rounding; the adapter says so (PEFT recomputes the residual when it loads it).
for init in pissa olora orthogonal; do
  "${C[@]}" train "$TMP/sft.ini" --set train.max_steps=1 --set train.save_strategy=no --set peft.lora_dropout=0 \
    --set peft.init_lora_weights=$init --set run.output_dir="$TMP/i$init" >"$TMP/log" 2>&1 || { bad "$init run"; tail -3 "$TMP/log"; }
  a=$(loss_at "$TMP/i$init" 1) b=$(loss_at "$TMP/lora" 1)
  grep -q "\"init_lora_weights\":[[:space:]]*\"$init\"" "$TMP/i$init/adapter_config.json" &&
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 2e-3 * b) }' && ok ||
    bad "$init: first loss $a against the base's $b, or adapter_config.json"
done
# ... and converted to a plain LoRA adapter of twice the rank over the original base (ctrl model
# convert-adapter, PEFT's path_initial_model_for_weight_conversion), it scores what the PiSSA adapter does
for init in pissa olora; do
  "${C[@]}" model convert-adapter --base "$TMP/model" --adapter "$TMP/i$init" --out "$TMP/c$init" >/dev/null 2>&1 ||
    bad "$init: convert-adapter"
  x=$(lp --model "$TMP/model" --adapter "$TMP/i$init") y=$(lp --model "$TMP/model" --adapter "$TMP/c$init")
  grep -q '"r":[[:space:]]*8' "$TMP/c$init/adapter_config.json" &&
    awk -v a="$x" -v b="$y" 'BEGIN { n = split(a, p, " "); split(b, q, " "); for (i = 1; i <= n; i++) {
      d = p[i] - q[i]; if (d < 0) d = -d; if (d > 1e-5 * q[i]) exit 1 } exit !(n == 2) }' && ok ||
    bad "$init converted: losses $y against the adapter's $x"
done
# 1c3. lora_bias: lora_B's bias trained and saved under PEFT's name; with use_dora a config error (as PEFT)
"${C[@]}" train "$TMP/sft.ini" --set train.max_steps=2 --set train.save_strategy=no --set peft.lora_bias=true \
  --set run.output_dir="$TMP/lb" >"$TMP/log" 2>&1 || { bad "lora_bias run"; tail -3 "$TMP/log"; }
grep -q '"lora_bias":[[:space:]]*true' "$TMP/lb/adapter_config.json" &&
  [ "$(grep -a -o 'lora_B\.bias' "$TMP/lb/adapter_model.safetensors" | wc -l)" = 14 ] && ok ||
  bad "lora_bias: adapter_config.json or the 14 lora_B.bias tensors (2 layers x 7 projections)"
"${C[@]}" train "$TMP/sft.ini" --set peft.lora_bias=true --set peft.use_dora=true >"$TMP/log" 2>&1
[ $? = 2 ] && grep -q "\[peft\]: lora_bias with use_dora" "$TMP/log" && ok || { bad "lora_bias with DoRA not refused"; tail -3 "$TMP/log"; }
"${C[@]}" train "$TMP/sft.ini" --set peft.init_lora_weights=pissa_niter_4 >"$TMP/log" 2>&1
[ $? = 2 ] && grep -q "init_lora_weights" "$TMP/log" && ok || bad "init_lora_weights = pissa_niter_4 not refused"
"${C[@]}" model merge --base "$TMP/model" --adapter "$TMP/nowhere" --out "$TMP/m2" >/dev/null 2>&1
[ $? = 1 ] && ok || bad "merge of a missing adapter: not a run-time error"

# 1c. ctrl generate --adapter: greedy completions with the adapter applied live equal the merged model's.
printf '{"prompt": "12+7="}\n{"prompt": "40+3="}\n' >"$TMP/prompts.jsonl"
"${C[@]}" generate --model "$TMP/model" --adapter "$TMP/lora" --prompts "$TMP/prompts.jsonl" --out "$TMP/g1.jsonl" \
  --temperature 0 --max-tokens 8 >/dev/null 2>&1 || bad "generate --adapter"
"${C[@]}" generate --model "$TMP/merged" --prompts "$TMP/prompts.jsonl" --out "$TMP/g2.jsonl" --temperature 0 \
  --max-tokens 8 >/dev/null 2>&1 || bad "generate (merged)"
ids() { sed 's/.*"token_ids":\[\([0-9,]*\)\].*/\1/' "$1"; }
[ -s "$TMP/g1.jsonl" ] && [ "$(ids "$TMP/g1.jsonl")" = "$(ids "$TMP/g2.jsonl")" ] && ok ||
  bad "generate --adapter: $(ids "$TMP/g1.jsonl") vs merged $(ids "$TMP/g2.jsonl")"
# with --dtype bf16 the frozen base is held as the bf16 GEMM's panels before the first step (where a bf16
# GEMM kernel runs; the log says so): the same completions as decoding packing its own panels
# (CTRL_NO_BASE_PANELS=1, the fp32 base kept), and the log says which it was.
"${C[@]}" generate --model "$TMP/model" --adapter "$TMP/lora" --prompts "$TMP/prompts.jsonl" --out "$TMP/g3.jsonl" \
  --temperature 0 --max-tokens 8 --dtype bf16 >"$TMP/g3.log" 2>&1 || bad "generate --adapter --dtype bf16"
CTRL_NO_BASE_PANELS=1 "${C[@]}" generate --model "$TMP/model" --adapter "$TMP/lora" --prompts "$TMP/prompts.jsonl" \
  --out "$TMP/g4.jsonl" --temperature 0 --max-tokens 8 --dtype bf16 >"$TMP/g4.log" 2>&1 || bad "generate, base not held"
[ -s "$TMP/g3.jsonl" ] && [ "$(ids "$TMP/g3.jsonl")" = "$(ids "$TMP/g4.jsonl")" ] && ok ||
  bad "generate --adapter --dtype bf16, held: $(ids "$TMP/g3.jsonl") vs not held $(ids "$TMP/g4.jsonl")"
grep -q "CTRL_NO_BASE_PANELS is set" "$TMP/g4.log" && ok || bad "generate: no note that the base was not held"
if grep -q "held as bf16 GEMM panels" "$TMP/g3.log"; then ok; else
  grep -q "weights packed for bf16 as decoding first multiplies" "$TMP/g3.log" && ok || bad "generate: no note of the hold"
fi
# ctrl serve --lora NAME=DIR --dtype bf16: a completion naming the adapter is generate --adapter --dtype bf16's,
# one naming the base the base's under generate --dtype bf16 (adapter and base batched by one bf16 engine).
"${C[@]}" generate --model "$TMP/model" --prompts "$TMP/prompts.jsonl" --out "$TMP/g5.jsonl" --temperature 0 \
  --max-tokens 8 --dtype bf16 >/dev/null 2>&1 || bad "generate --dtype bf16 (base)"
PORT=$(free_port)
"${C[@]}" serve --model "$TMP/model" --port "$PORT" --lora a="$TMP/lora" --dtype bf16 >"$TMP/serve16.log" 2>&1 &
spid=$!
for _ in $(seq 100); do curl -sf "localhost:$PORT/health" >/dev/null 2>&1 && break; sleep 0.1; done
for name in a model; do
  curl -s -X POST "localhost:$PORT/v1/completions" -d "{\"model\": \"$name\", \"prompt\": \"12+7=\", \"max_tokens\": 8,
    \"temperature\": 0, \"return_token_ids\": true}" >"$TMP/http16_$name.json"
  want="$TMP/g5.jsonl" && [ $name = a ] && want="$TMP/g3.jsonl"
  got=$(sed 's/.*"token_ids":\[\([0-9,]*\)\].*/\1/' "$TMP/http16_$name.json") w=$(head -1 "$want" | ids /dev/stdin)
  [ -n "$w" ] && [ "$got" = "$w" ] && ok || bad "serve --dtype bf16, model $name: '$got', generate: '$w'"
done
kill -INT "$spid" 2>/dev/null; wait "$spid" 2>/dev/null

# 1d. DoRA ([peft] use_dora): the adapter holds PEFT's lora_magnitude_vector tensors and says
# use_dora; the merged model (W = m / ||W + s B A|| (W + s B A)) scores what the adapter does.
"${C[@]}" train "$TMP/sft.ini" --set peft.use_dora=true --set run.output_dir="$TMP/dora" --set train.max_steps=4 \
  >"$TMP/log" 2>&1 || { bad "dora sft run"; tail -5 "$TMP/log"; }
grep -q "\"use_dora\":[[:space:]]*true" "$TMP/dora/adapter_config.json" &&
  grep -q "base_model.model.model.layers.0.mlp.down_proj.lora_magnitude_vector" "$TMP/dora/adapter_model.safetensors" &&
  ok || bad "DoRA adapter files"
"${C[@]}" model merge --base "$TMP/model" --adapter "$TMP/dora" --out "$TMP/dmerged" >/dev/null 2>&1 || bad "DoRA merge"
with=$(lp --model "$TMP/model" --adapter "$TMP/dora") merged=$(lp --model "$TMP/dmerged")
awk -v a="$with" -v b="$merged" -v c="$base" 'BEGIN { n = split(a, x, " "); split(b, y, " "); split(c, z, " ");
  for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > 1e-5 * y[i] || x[i] == z[i]) exit 1 }
  exit !(n == 2) }' && ok || bad "DoRA merged losses $merged, with the adapter $with, base $base"

# 1e. QLoRA ([peft] quantization = nf4): the base in NF4, the adapters train (the loss falls as with
# LoRA), PEFT's adapter files, in bf16 compute too; without [peft] enabled it is refused by key.
"${C[@]}" train "$TMP/sft.ini" --set peft.quantization=nf4 --set run.output_dir="$TMP/qlora" >"$TMP/log" 2>&1 ||
  { bad "qlora sft run"; tail -5 "$TMP/log"; }
grep -q "in NF4 (QLoRA" "$TMP/log" && [ -s "$TMP/qlora/adapter_model.safetensors" ] && ok || bad "QLoRA run: log or adapter"
qfirst=$(loss_at "$TMP/qlora" 1) qlast=$(for s in 5 6 7 8; do loss_at "$TMP/qlora" $s; done | awk '{ t += $1 } END { print t / NR }')
awk -v a="$qfirst" -v b="$qlast" 'BEGIN { exit !(b < a - 0.05) }' && ok || bad "QLoRA loss did not fall: $qfirst -> $qlast"
"${C[@]}" train "$TMP/sft.ini" --set peft.quantization=nf4 --set train.dtype=fp32 --set train.max_steps=2 \
  --set run.output_dir="$TMP/qlora32" >"$TMP/log" 2>&1 && [ -s "$TMP/qlora32/adapter_model.safetensors" ] && ok ||
  bad "QLoRA in fp32"
"${C[@]}" train "$TMP/sft.ini" --set peft.quantization=nf4 --set peft.enabled=false >"$TMP/log" 2>&1
[ $? = 2 ] && grep -q "quantization = nf4 without" "$TMP/log" && ok || bad "quantization without [peft] enabled not refused"

# 1g. [peft] embedding_dtype = bf16: the frozen embedding held in bf16 (the log says so), the
# adapters train and are saved; with fp32 compute the key is refused by name.
"${C[@]}" train "$TMP/sft.ini" --set peft.embedding_dtype=bf16 --set train.max_steps=2 \
  --set run.output_dir="$TMP/emb16" >"$TMP/log" 2>&1 && grep -q "frozen embedding held in bf16" "$TMP/log" &&
  [ -s "$TMP/emb16/adapter_model.safetensors" ] && ok || { bad "embedding_dtype = bf16 run"; tail -5 "$TMP/log"; }
"${C[@]}" train "$TMP/sft.ini" --set peft.embedding_dtype=bf16 --set train.dtype=fp32 >"$TMP/log" 2>&1
[ $? = 2 ] && grep -q "embedding_dtype = bf16 needs \[train\] dtype = bf16" "$TMP/log" && ok ||
  bad "embedding_dtype = bf16 with fp32 compute not refused"
# the default (auto) holds it in fp32 wherever bf16 cannot be -- fp32 compute, a trained embedding --
# without an error, and embedding_dtype = fp32 keeps it fp32 under bf16 compute
for set in "peft.embedding_dtype=fp32" "train.dtype=fp32" "peft.modules_to_save=embed_tokens"; do
  "${C[@]}" train "$TMP/sft.ini" --set "$set" --set train.max_steps=2 --set run.output_dir="$TMP/emb32" \
    >"$TMP/log" 2>&1 && ! grep -q "frozen embedding held in bf16" "$TMP/log" &&
    [ -s "$TMP/emb32/adapter_model.safetensors" ] && ok || { bad "embedding fp32 with $set"; tail -5 "$TMP/log"; }
done

# 1f. QDoRA (use_dora with quantization = nf4, as PEFT runs DoRA over bitsandbytes' Linear4bit): the
# magnitudes over the NF4 base train with the adapters, the adapter says use_dora and holds them, the
# loss falls; a run resumed from checkpoint-4 follows the uninterrupted one.
qd=(--set peft.use_dora=true --set peft.quantization=nf4)
"${C[@]}" train "$TMP/sft.ini" "${qd[@]}" --set run.output_dir="$TMP/qdora" >"$TMP/log" 2>&1 ||
  { bad "qdora sft run"; tail -5 "$TMP/log"; }
grep -q "DoRA magnitudes (QDoRA), the base frozen in NF4 (QLoRA): every layer's attention and MLP" "$TMP/log" &&
  grep -q "\"use_dora\":[[:space:]]*true" "$TMP/qdora/adapter_config.json" &&
  grep -q "base_model.model.model.layers.1.self_attn.k_proj.lora_magnitude_vector" "$TMP/qdora/adapter_model.safetensors" &&
  ok || { bad "QDoRA run: log or adapter"; grep "LoRA: r" "$TMP/log"; }
qfirst=$(loss_at "$TMP/qdora" 1) qlast=$(for s in 5 6 7 8; do loss_at "$TMP/qdora" $s; done | awk '{ t += $1 } END { print t / NR }')
awk -v a="$qfirst" -v b="$qlast" 'BEGIN { exit !(b < a - 0.05) }' && ok || bad "QDoRA loss did not fall: $qfirst -> $qlast"
mkdir -p "$TMP/qdora_r" && cp -r "$TMP/qdora/checkpoint-4" "$TMP/qdora_r/"
grep '"step": [1-4],' "$TMP/qdora/metrics.jsonl" >"$TMP/qdora_r/metrics.jsonl"
"${C[@]}" train "$TMP/sft.ini" "${qd[@]}" --set run.output_dir="$TMP/qdora_r" --set train.resume_from_checkpoint=last \
  >"$TMP/log" 2>&1 || { bad "qdora resume"; tail -5 "$TMP/log"; }
diff <(curve "$TMP/qdora") <(curve "$TMP/qdora_r") >"$TMP/diff" &&
  cmp -s "$TMP/qdora/adapter_model.safetensors" "$TMP/qdora_r/adapter_model.safetensors" && ok ||
  { bad "QDoRA: the resumed run differs"; cat "$TMP/diff"; }

# 2. The optimizer state is the adapters' only: against a full fine-tune's.
"${C[@]}" train "$TMP/sft.ini" --set peft.enabled=false --set run.output_dir="$TMP/full" --set train.max_steps=4 \
  >"$TMP/log" 2>&1 || { bad "full run"; tail -5 "$TMP/log"; }
lo=$(stat -c %s "$TMP/lora/checkpoint-4/optimizer.safetensors") fu=$(stat -c %s "$TMP/full/checkpoint-4/optimizer.safetensors")
[ "$lo" -lt $((fu / 4)) ] && ok || bad "optimizer state: LoRA $lo bytes, full fine-tune $fu"

# 3. Resumed from checkpoint-4: steps 5..8 as in the uninterrupted run (dropout's masks too).
mkdir -p "$TMP/resumed" && cp -r "$TMP/lora/checkpoint-4" "$TMP/resumed/"
grep '"step": [1-4],' "$TMP/lora/metrics.jsonl" >"$TMP/resumed/metrics.jsonl"
"${C[@]}" train "$TMP/sft.ini" --set run.output_dir="$TMP/resumed" --set train.resume_from_checkpoint=last \
  >"$TMP/log" 2>&1 || { bad "resume"; tail -5 "$TMP/log"; }
diff <(curve "$TMP/lora") <(curve "$TMP/resumed") >"$TMP/diff" && ok || { bad "resumed curve differs"; cat "$TMP/diff"; }
cmp -s "$TMP/lora/adapter_model.safetensors" "$TMP/resumed/adapter_model.safetensors" && ok || bad "resumed adapter differs"

# 4. Continued from the adapter directory: the first step starts where the first run ended.
sed '/^r = \|^lora_alpha = \|^target_modules = /d' "$TMP/sft.ini" >"$TMP/cont.ini"
"${C[@]}" train "$TMP/cont.ini" --set run.output_dir="$TMP/cont" --set peft.adapter_path="$TMP/lora" \
  --set train.max_steps=1 >"$TMP/log" 2>&1 || { bad "adapter_path run"; tail -5 "$TMP/log"; }
c1=$(loss_at "$TMP/cont" 1)
awk -v a="$first" -v c="$c1" 'BEGIN { exit !(c < a - 0.05) }' && ok || bad "adapter_path: step 1 loss $c1, fresh $first"
grep -q "adapter from $TMP/lora" "$TMP/log" && ok || bad "adapter_path not reported"

# 5. GRPO with beta: the reference is the base (adapters off): KL 0 while B = 0, then not.
cat >"$TMP/grpo.ini" <<INI
[run]
trainer = grpo
output_dir = $TMP/grpo
seed = 3
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/data/train_prompts.jsonl
[train]
learning_rate = 2e-2
lr_scheduler_type = constant
max_steps = 3
per_device_train_batch_size = 8
gradient_accumulation_steps = 1
logging_steps = 1
save_strategy = no
[generation]
kv_cache_bytes = 8000000
[reward.len]
plugin = length
target_length = 8
[grpo]
num_generations = 4
max_completion_length = 12
beta = 0.05
[peft]
enabled = true
lora_dropout = 0
INI
"${C[@]}" train "$TMP/grpo.ini" >"$TMP/log" 2>&1 || { bad "grpo lora run"; tail -5 "$TMP/log"; }
# (this model's head is its own: the default embedding_dtype = auto holds the table as bf16 values, which
# only the lookups read)
grep -q "frozen embedding held in bf16 (\[peft\] embedding_dtype = auto, the default) as bf16 values" "$TMP/log" &&
  ok || bad "grpo: the default did not hold the untied table as bf16 values"
kl1=$(grep '"step": 1,' "$TMP/grpo/metrics.jsonl" | sed 's/.*"kl": \([0-9.e+-]*\).*/\1/')
kl3=$(grep '"step": 3,' "$TMP/grpo/metrics.jsonl" | sed 's/.*"kl": \([0-9.e+-]*\).*/\1/')
awk -v a="$kl1" -v b="$kl3" 'BEGIN { exit !(a == 0 && b > 0) }' && ok || bad "grpo kl: step 1 $kl1, step 3 $kl3"
[ -s "$TMP/grpo/adapter_model.safetensors" ] && ok || bad "grpo: no adapter saved"
# QLoRA GRPO: generation decodes over the NF4 base too; the reference is that base, adapters off
"${C[@]}" train "$TMP/grpo.ini" --set peft.quantization=nf4 --set train.max_steps=2 --set run.output_dir="$TMP/qgrpo" \
  >"$TMP/log" 2>&1 || { bad "grpo qlora run"; tail -5 "$TMP/log"; }
qkl1=$(grep '"step": 1,' "$TMP/qgrpo/metrics.jsonl" | sed 's/.*"kl": \([0-9.e+-]*\).*/\1/')
[ "$qkl1" = 0 ] || [ "$qkl1" = 0.000000 ] && [ -s "$TMP/qgrpo/adapter_model.safetensors" ] && ok ||
  bad "grpo qlora: kl at step 1 $qkl1, or no adapter"
# GRPO with the embedding in bf16: decoding's lookups and the tied head read the bf16 table; KL 0
# at the first step as above (the reference is the same model, adapters off)
"${C[@]}" train "$TMP/grpo.ini" --set peft.embedding_dtype=bf16 --set train.max_steps=2 \
  --set run.output_dir="$TMP/egrpo" >"$TMP/log" 2>&1 || { bad "grpo embedding_dtype = bf16 run"; tail -5 "$TMP/log"; }
ekl1=$(grep '"step": 1,' "$TMP/egrpo/metrics.jsonl" | sed 's/.*"kl": \([0-9.e+-]*\).*/\1/')
[ "$ekl1" = 0 ] || [ "$ekl1" = 0.000000 ] && [ -s "$TMP/egrpo/adapter_model.safetensors" ] && ok ||
  bad "grpo embedding_dtype = bf16: kl at step 1 $ekl1, or no adapter"
# A tied head: under auto a loop that decodes holds the table as the head's panels where a bf16 GEMM
# kernel runs (never as values: decoding would pack the head from them in every step), and as the
# head's panels or as bf16 values (CTRL_NO_EMBED_PANELS=1) the run is the same, completions and losses
# bit for bit
"${C[@]}" model init --arch qwen2 --hidden 32 --layers 2 --heads 2 --tie-embeddings \
  --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/tmodel" >/dev/null || bad "tied model init"
tg=(--set model.path="$TMP/tmodel" --set train.max_steps=2)
"${C[@]}" train "$TMP/grpo.ini" "${tg[@]}" --set run.output_dir="$TMP/tgrpo" >"$TMP/log" 2>&1 ||
  { bad "grpo tied run"; tail -5 "$TMP/log"; }
grep "frozen embedding held in bf16" "$TMP/log" | grep -q "as bf16 values" &&
  bad "grpo: the default held a tied table as bf16 values" || ok
numbers() { grep -o '"\(loss\|reward\|entropy\|grad_norm\|kl\|completions/mean_length\)": [^,]*' "$1/metrics.jsonl"; }
for how in panels values; do
  [ $how = values ] && export CTRL_NO_EMBED_PANELS=1
  "${C[@]}" train "$TMP/grpo.ini" "${tg[@]}" --set peft.embedding_dtype=bf16 --set run.output_dir="$TMP/t$how" \
    >"$TMP/log" 2>&1 || { bad "grpo tied, the table as $how"; tail -5 "$TMP/log"; }
  unset CTRL_NO_EMBED_PANELS
  if [ $how = panels ] && ! grep -q "as the tied LM head's bf16 GEMM panels" "$TMP/log"; then
    echo "  (no bf16 GEMM kernel here: the table as bf16 values both times)"
  fi
done
grep -q "as bf16 values" "$TMP/log" && ok || bad "grpo: CTRL_NO_EMBED_PANELS=1 did not hold the table as values"
[ -n "$(numbers "$TMP/tpanels")" ] && [ "$(numbers "$TMP/tpanels")" = "$(numbers "$TMP/tvalues")" ] && ok ||
  bad "grpo: the table as the head's panels and as bf16 values differ"
# 5a. trainable_token_indices (rows of the tied table, so of the head, trained beside the adapters): GRPO's
# reference is the base's rows (KL 0 at the first step, where the rows start as the base's and B = 0); the
# adapter holds the rows under PEFT's name and lists them; the table stays fp32 under the default; an SFT
# run's adapter, merged (the rows written into the table), scores what it does applied live; refusals by key
tt=(--set peft.trainable_token_indices=13,31,18,1000)
"${C[@]}" train "$TMP/grpo.ini" "${tg[@]}" "${tt[@]}" --set run.output_dir="$TMP/ttgrpo" >"$TMP/log" 2>&1 ||
  { bad "grpo trainable tokens run"; tail -5 "$TMP/log"; }
tkl1=$(grep '"step": 1,' "$TMP/ttgrpo/metrics.jsonl" | sed 's/.*"kl": \([0-9.e+-]*\).*/\1/')
{ [ "$tkl1" = 0 ] || [ "$tkl1" = 0.000000 ]; } && ! grep -q "frozen embedding held in bf16" "$TMP/log" &&
  grep -q "embed_tokens.token_adapter.trainable_tokens_delta" "$TMP/ttgrpo/adapter_model.safetensors" &&
  tr -d ' \t\n' <"$TMP/ttgrpo/adapter_config.json" | grep -q '"trainable_token_indices":\[13,31,18,1000\]' && ok ||
  bad "grpo trainable tokens: kl at step 1 $tkl1, the table in bf16, or the adapter without the rows"
"${C[@]}" train "$TMP/sft.ini" "${tt[@]}" --set model.path="$TMP/tmodel" --set train.max_steps=4 \
  --set train.save_steps=2 --set run.output_dir="$TMP/ttsft" >"$TMP/log" 2>&1 || { bad "sft trainable tokens"; tail -3 "$TMP/log"; }
# resumed from checkpoint-2 (the rows and their optimizer state in it): steps 3, 4 and the adapter as before
mkdir -p "$TMP/ttres" && cp -r "$TMP/ttsft/checkpoint-2" "$TMP/ttres/"
grep '"step": [1-2],' "$TMP/ttsft/metrics.jsonl" >"$TMP/ttres/metrics.jsonl"
"${C[@]}" train "$TMP/sft.ini" "${tt[@]}" --set model.path="$TMP/tmodel" --set train.max_steps=4 \
  --set train.save_steps=2 --set run.output_dir="$TMP/ttres" --set train.resume_from_checkpoint=last >"$TMP/log" 2>&1 ||
  { bad "resume trainable tokens"; tail -3 "$TMP/log"; }
[ -n "$(curve "$TMP/ttsft")" ] && diff <(curve "$TMP/ttsft") <(curve "$TMP/ttres") >/dev/null &&
  cmp -s "$TMP/ttsft/adapter_model.safetensors" "$TMP/ttres/adapter_model.safetensors" && ok ||
  bad "trainable tokens: the resumed run differs"
"${C[@]}" model merge --base "$TMP/tmodel" --adapter "$TMP/ttsft" --out "$TMP/ttmerged" >/dev/null 2>&1 || bad "merge tt"
with=$(lp --model "$TMP/tmodel" --adapter "$TMP/ttsft") merged=$(lp --model "$TMP/ttmerged") base=$(lp --model "$TMP/tmodel")
awk -v a="$with" -v b="$merged" -v c="$base" 'BEGIN { n = split(a, x, " "); split(b, y, " "); split(c, z, " ");
  for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > 1e-5 * y[i] || x[i] == z[i]) exit 1 }
  exit !(n == 2) }' && ok || bad "trainable tokens merged: losses $merged, with the adapter $with, base $base"
# the untied model: rows of the table and of the head (PEFT's {"embed_tokens": ..., "lm_head": ...})
"${C[@]}" train "$TMP/sft.ini" "${tt[@]}" --set peft.trainable_token_indices_lm_head=31,18,900 --set train.max_steps=2 \
  --set train.save_strategy=no --set run.output_dir="$TMP/tthead" >"$TMP/log" 2>&1 || { bad "sft head tokens"; tail -3 "$TMP/log"; }
"${C[@]}" model merge --base "$TMP/model" --adapter "$TMP/tthead" --out "$TMP/tthmerged" >/dev/null 2>&1 || bad "merge tt head"
with=$(lp --model "$TMP/model" --adapter "$TMP/tthead") merged=$(lp --model "$TMP/tthmerged") base=$(lp --model "$TMP/model")
grep -q "lm_head.token_adapter.trainable_tokens_delta" "$TMP/tthead/adapter_model.safetensors" &&
  tr -d ' \t\n' <"$TMP/tthead/adapter_config.json" | grep -q '"lm_head":\[31,18,900\]' &&
  awk -v a="$with" -v b="$merged" -v c="$base" 'BEGIN { n = split(a, x, " "); split(b, y, " "); split(c, z, " ");
  for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > 1e-5 * y[i] || x[i] == z[i]) exit 1 }
  exit !(n == 2) }' && ok || bad "head tokens: the adapter or merged losses $merged, with the adapter $with, base $base"
# modules_to_save on the tied table: refused as PEFT would untie it, unless ensure_weight_tying (one trained
# table, saved under both names as PEFT saves it; the merged model scores what the adapter does)
tms=(--set model.path="$TMP/tmodel" --set peft.modules_to_save=embed_tokens --set train.max_steps=2 --set train.save_strategy=no)
"${C[@]}" train "$TMP/sft.ini" "${tms[@]}" >"$TMP/log" 2>&1
[ $? != 0 ] && grep -q "ensure_weight_tying" "$TMP/log" && ok || bad "modules_to_save on a tied table without ensure_weight_tying"
"${C[@]}" train "$TMP/sft.ini" "${tms[@]}" --set peft.ensure_weight_tying=true --set run.output_dir="$TMP/ewt" >"$TMP/log" 2>&1 ||
  { bad "ensure_weight_tying run"; tail -3 "$TMP/log"; }
"${C[@]}" model merge --base "$TMP/tmodel" --adapter "$TMP/ewt" --out "$TMP/ewtmerged" >/dev/null 2>&1 || bad "merge ewt"
with=$(lp --model "$TMP/tmodel" --adapter "$TMP/ewt") merged=$(lp --model "$TMP/ewtmerged") base=$(lp --model "$TMP/tmodel")
grep -q "base_model.model.lm_head.weight" "$TMP/ewt/adapter_model.safetensors" &&
  grep -q "base_model.model.model.embed_tokens.weight" "$TMP/ewt/adapter_model.safetensors" &&
  awk -v a="$with" -v b="$merged" -v c="$base" 'BEGIN { n = split(a, x, " "); split(b, y, " "); split(c, z, " ");
  for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > 1e-5 * y[i] || x[i] == z[i]) exit 1 }
  exit !(n == 2) }' && ok || bad "ensure_weight_tying: the adapter or merged losses $merged, with the adapter $with, base $base"
"${C[@]}" train "$TMP/sft.ini" "${tt[@]}" --set peft.embedding_dtype=bf16 >"$TMP/log" 2>&1
[ $? = 2 ] && grep -q "embedding_dtype = bf16 with trainable_token_indices" "$TMP/log" && ok ||
  { bad "trainable tokens with embedding_dtype = bf16 not refused"; tail -2 "$TMP/log"; }
"${C[@]}" train "$TMP/sft.ini" "${tt[@]}" --set peft.modules_to_save=embed_tokens >"$TMP/log" 2>&1
[ $? = 2 ] && grep -q "trainable_token_indices with modules_to_save = embed_tokens" "$TMP/log" && ok ||
  { bad "trainable tokens with modules_to_save = embed_tokens not refused"; tail -2 "$TMP/log"; }
"${C[@]}" train "$TMP/sft.ini" --set peft.trainable_token_indices=13,5000 >"$TMP/log" 2>&1
[ $? != 0 ] && grep -q "token 5000 is outside" "$TMP/log" && ok || { bad "a token outside the vocabulary"; tail -2 "$TMP/log"; }
# and QDoRA GRPO: decoding applies the magnitudes over the NF4 base (at the start they are the norms:
# KL 0), the adapter holds them
"${C[@]}" train "$TMP/grpo.ini" "${qd[@]}" --set train.max_steps=2 --set run.output_dir="$TMP/qdgrpo" \
  >"$TMP/log" 2>&1 || { bad "grpo qdora run"; tail -5 "$TMP/log"; }
qkl1=$(grep '"step": 1,' "$TMP/qdgrpo/metrics.jsonl" | sed 's/.*"kl": \([0-9.e+-]*\).*/\1/')
{ [ "$qkl1" = 0 ] || [ "$qkl1" = 0.000000 ]; } && grep -q "lora_magnitude_vector" "$TMP/qdgrpo/adapter_model.safetensors" &&
  ok || bad "grpo qdora: kl at step 1 $qkl1, or no magnitudes in the adapter"
# 5b. Server mode with LoRA (TRL's vllm_mode = server with PEFT): every push sends the base with the
# adapters folded in, so the server then generates what the saved adapter does over the base; with a
# QLoRA base it sends the dequantized base, merged (on a device and under zero3: test_online_cuda_emu,
# test_zero3_trainers_mpi).
PORT=$(free_port)
"${C[@]}" serve --model "$TMP/model" --port "$PORT" >"$TMP/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; rm -rf "$TMP"' EXIT
for q in nf4 none; do # the LoRA run last: the server then holds its final weights
  "${C[@]}" train "$TMP/grpo.ini" --set generation.mode=server --set generation.server_url="http://127.0.0.1:$PORT" \
    --set peft.quantization=$q --set run.output_dir="$TMP/sgrpo_$q" >"$TMP/log" 2>&1 ||
    { bad "grpo lora server mode ($q)"; tail -5 "$TMP/log"; }
  kl3=$(grep '"step": 3,' "$TMP/sgrpo_$q/metrics.jsonl" | sed 's/.*"kl": \([0-9.e+-]*\).*/\1/')
  awk -v b="$kl3" 'BEGIN { exit !(b > 0) }' && ok || bad "grpo lora server mode ($q): kl at step 3 '$kl3'"
done
n=$(curl -s "localhost:$PORT/health" | sed -n 's/.*"weight_updates":\([0-9]*\).*/\1/p')
[ "$n" = 8 ] && ok || bad "grpo lora server mode: /health weight_updates '$n', want 8 (2 runs x (the start + 3 steps))"
echo '{"prompt": "12+7="}' >"$TMP/p.jsonl"
"${C[@]}" generate --model "$TMP/model" --adapter "$TMP/sgrpo_none" --prompts "$TMP/p.jsonl" --temperature 0 \
  --max-tokens 12 --out "$TMP/local.jsonl" >/dev/null 2>&1
local_ids=$(sed 's/.*"token_ids":\[\([0-9,]*\)\].*/\1/' "$TMP/local.jsonl")
server_ids=$(curl -s -X POST "localhost:$PORT/generate" -d '{"prompts": ["12+7="], "temperature": 0, "max_tokens": 12}' |
  sed 's/.*"completion_ids":\[\[\([0-9,]*\)\]\].*/\1/')
[ -n "$local_ids" ] && [ "$local_ids" = "$server_ids" ] && ok ||
  bad "grpo lora server mode: the server generates '$server_ids', the saved adapter '$local_ids'"
"${C[@]}" generate --model "$TMP/model" --prompts "$TMP/p.jsonl" --temperature 0 --max-tokens 12 --out "$TMP/b.jsonl" >/dev/null 2>&1
base_ids=$(sed 's/.*"token_ids":\[\([0-9,]*\)\].*/\1/' "$TMP/b.jsonl")
[ "$base_ids" != "$local_ids" ] && ok || bad "grpo lora server mode: the adapter generates what the base does ('$base_ids')"
kill $SERVER 2>/dev/null
sed 's/trainer = grpo/trainer = rloo/; s/^\[grpo\]/[rloo]/; s/beta = 0.05/beta = 0.05/' "$TMP/grpo.ini" >"$TMP/rloo.ini"
"${C[@]}" train "$TMP/rloo.ini" --set run.output_dir="$TMP/rloo" >"$TMP/log" 2>&1 || { bad "rloo lora run"; tail -5 "$TMP/log"; }
[ -s "$TMP/rloo/adapter_model.safetensors" ] && ok || bad "rloo: no adapter saved"
# 6. DPO (the sequence kind) with LoRA: the reference (the policy with its adapters off) equals the
# policy at the start (B = 0): loss ln 2.
D=$SRC/tests/fixtures/trl_dpo
sed "s|@DIR@|$D|g; s|@SFT@|$SRC/tests/fixtures/trl_sft|g; s|@OUT@|$TMP/dpo|g" "$D/sigmoid.ini" >"$TMP/dpo.ini"
printf '[peft]\nenabled = true\nlora_dropout = 0\n' >>"$TMP/dpo.ini"
"${C[@]}" train "$TMP/dpo.ini" --set train.max_steps=3 >"$TMP/log" 2>&1 || { bad "dpo lora run"; tail -5 "$TMP/log"; }
[ "$(loss_at "$TMP/dpo" 1)" = 0.693147 ] && [ -s "$TMP/dpo/adapter_model.safetensors" ] && ok ||
  bad "dpo lora: step 1 loss $(loss_at "$TMP/dpo" 1)"

# 7. The reward trainer with LoRA (PEFT's task_type SEQ_CLS) on the causal LM's trunk: a fresh score
# trains beside the adapters and is saved in the adapter (base_model.model.score.weight), no model;
# resumed from checkpoint-2 the curve and the adapter are the uninterrupted run's. An SFT run with
# modules_to_save = score is refused by key.
R=$SRC/tests/fixtures/trl_reward
sed "s|@DIR@|$R|g; s|@MODEL@|$TMP/model|g; s|@OUT@|$TMP/rm|g; /^adapter_path/d; s/^save_strategy = no/save_steps = 2/" \
  "$R/lora_margin.ini" >"$TMP/rm.ini"
"${C[@]}" train "$TMP/rm.ini" --set train.max_steps=4 --set train.learning_rate=1e-2 --set peft.r=4 \
  >"$TMP/log" 2>&1 || { bad "reward lora run"; tail -5 "$TMP/log"; }
grep -q "\"task_type\":[[:space:]]*\"SEQ_CLS\"" "$TMP/rm/adapter_config.json" &&
  grep -q "base_model.model.score.weight" "$TMP/rm/adapter_model.safetensors" && [ ! -e "$TMP/rm/model.safetensors" ] &&
  [ -s "$TMP/rm/checkpoint-2/adapter_model.safetensors" ] && ok || bad "reward lora: adapter files"
mkdir -p "$TMP/rm2" && cp -r "$TMP/rm/checkpoint-2" "$TMP/rm2/"
grep '"step": [1-2],' "$TMP/rm/metrics.jsonl" >"$TMP/rm2/metrics.jsonl"
"${C[@]}" train "$TMP/rm.ini" --set train.max_steps=4 --set train.learning_rate=1e-2 --set peft.r=4 \
  --set run.output_dir="$TMP/rm2" --set train.resume_from_checkpoint=last >"$TMP/log" 2>&1 || { bad "reward lora resume"; tail -5 "$TMP/log"; }
diff <(curve "$TMP/rm") <(curve "$TMP/rm2") >"$TMP/diff" && cmp -s "$TMP/rm/adapter_model.safetensors" \
  "$TMP/rm2/adapter_model.safetensors" && ok || { bad "reward lora: resumed run differs"; cat "$TMP/diff"; }
"${C[@]}" train "$TMP/sft.ini" --set peft.modules_to_save=score >"$TMP/log" 2>&1
[ $? = 2 ] && grep -q "modules_to_save = score: trainer sft" "$TMP/log" && ok || { bad "sft with modules_to_save = score not refused"; tail -3 "$TMP/log"; }

# 8. LoRA on an MoE model's experts (PEFT's target_parameters): SFT trains them, the adapter holds PEFT's
# names (gate_up_proj's wrapper under base_layer.), a run resumed from checkpoint-2 (the adapter read
# back from PEFT's layout, its optimizer state ctrl's) follows the uninterrupted one; all-linear on an
# MoE model (PEFT converts it) and lora_dropout with target_parameters are refused by key.
"${C[@]}" model init --arch qwen3_moe --hidden 32 --layers 2 --heads 2 --experts 4 --experts-per-tok 2 \
  --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/moe" >/dev/null || bad "moe model init"
moe=(--set model.path="$TMP/moe" --set train.max_steps=4 --set train.save_steps=2 --set peft.lora_dropout=0
  --set peft.target_modules=q_proj --set peft.target_parameters=experts.gate_up_proj,experts.down_proj)
"${C[@]}" train "$TMP/sft.ini" "${moe[@]}" --set run.output_dir="$TMP/moel" >"$TMP/log" 2>&1 || { bad "moe lora run"; tail -5 "$TMP/log"; }
grep -q '"target_parameters"' "$TMP/moel/adapter_config.json" &&
  grep -q "model.layers.1.mlp.experts.base_layer.lora_A.weight" "$TMP/moel/adapter_model.safetensors" &&
  grep -q "model.layers.1.mlp.experts.lora_B.weight" "$TMP/moel/adapter_model.safetensors" && ok || bad "moe lora: adapter files"
mkdir -p "$TMP/moel2" && cp -r "$TMP/moel/checkpoint-2" "$TMP/moel2/"
grep '"step": [1-2],' "$TMP/moel/metrics.jsonl" >"$TMP/moel2/metrics.jsonl"
"${C[@]}" train "$TMP/sft.ini" "${moe[@]}" --set run.output_dir="$TMP/moel2" --set train.resume_from_checkpoint=last \
  >"$TMP/log" 2>&1 || { bad "moe lora resume"; tail -5 "$TMP/log"; }
diff <(curve "$TMP/moel") <(curve "$TMP/moel2") >"$TMP/diff" && cmp -s "$TMP/moel/adapter_model.safetensors" \
  "$TMP/moel2/adapter_model.safetensors" && ok || { bad "moe lora: resumed run differs"; cat "$TMP/diff"; }
"${C[@]}" train "$TMP/sft.ini" --set model.path="$TMP/moe" >"$TMP/log" 2>&1
[ $? != 0 ] && grep -q "all-linear" "$TMP/log" && ok || { bad "all-linear on an MoE model not refused"; tail -3 "$TMP/log"; }

# 8a. `ctrl serve --lora` with an MoE expert adapter (target_parameters), over HTTP: a completion that
# names the adapter in "model" is what `ctrl generate --adapter` gives (greedy), one naming the base
# is the base's (`ctrl generate` without it), and the two differ. The adapter: A and B both random
# (init_lora_weights = false), one step, so that it moves the greedy tokens.
"${C[@]}" train "$TMP/sft.ini" "${moe[@]}" --set peft.init_lora_weights=false --set train.max_steps=1 \
  --set train.save_strategy=no --set run.output_dir="$TMP/moes" >"$TMP/log" 2>&1 || { bad "moe adapter for serve"; tail -3 "$TMP/log"; }
printf '{"prompt": "12+7="}\n' >"$TMP/p1.jsonl"
for a in adapter base; do
  extra=() && [ $a = adapter ] && extra=(--adapter "$TMP/moes")
  "${C[@]}" generate --model "$TMP/moe" "${extra[@]}" --prompts "$TMP/p1.jsonl" --out "$TMP/gen_$a.jsonl" \
    --temperature 0 --max-tokens 12 >/dev/null 2>&1 || bad "generate on the moe model ($a)"
done
PORT=$(free_port)
"${C[@]}" serve --model "$TMP/moe" --port "$PORT" --lora experts="$TMP/moes" >"$TMP/serve.log" 2>&1 &
spid=$!
for _ in $(seq 100); do curl -sf "localhost:$PORT/health" >/dev/null 2>&1 && break; sleep 0.1; done
text() { sed 's/.*"text":"\([^"]*\)".*/\1/' "$1" | head -1; }
for a in adapter base; do
  name=experts && [ $a = base ] && name=moe
  curl -s -X POST "localhost:$PORT/v1/completions" -d "{\"model\": \"$name\", \"prompt\": \"12+7=\", \"max_tokens\": 12, \"temperature\": 0}" >"$TMP/http_$a.json"
  got=$(text "$TMP/http_$a.json") want=$(text "$TMP/gen_$a.jsonl")
  [ -n "${CTRL_TEST_VERBOSE:-}" ] && echo "  serve, model $name: $got"
  [ -n "$want" ] && grep -q '"choices"' "$TMP/http_$a.json" && [ "$got" = "$want" ] && ok ||
    { bad "serve, model $name: '$got', ctrl generate: '$want'"; head -c 300 "$TMP/http_$a.json"; }
done
[ "$(text "$TMP/http_adapter.json")" != "$(text "$TMP/http_base.json")" ] && ok ||
  bad "serve: the expert adapter's completion equals the base's ($(text "$TMP/http_base.json"))"
curl -s "localhost:$PORT/v1/models" | grep -q '"id":"experts"' && ok || bad "serve: /v1/models does not list the adapter"
kill -INT "$spid" 2>/dev/null; wait "$spid" 2>/dev/null

# 8b. QLoRA on fused and MoE projections, as transformers + bitsandbytes load them: a Phi-3 (qkv_proj and
# gate_up_proj each ONE NF4 tensor, the adapters over the fused modules) and the MoE model above (its
# attention in NF4, the experts fp32 with their adapters): SFT runs, the log says which projections are
# NF4 and which stay fp32, the adapter is saved and the loss falls.
"${C[@]}" model init --arch phi3 --hidden 32 --layers 2 --heads 2 \
  --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/phi3" >/dev/null || bad "phi3 model init"
for q in phi3 moe; do
  extra=(--set model.path="$TMP/$q" --set peft.quantization=nf4 --set train.save_strategy=no)
  [ $q = moe ] && extra=("${moe[@]}" "${extra[@]}" --set train.max_steps=8)
  "${C[@]}" train "$TMP/sft.ini" "${extra[@]}" --set run.output_dir="$TMP/q$q" >"$TMP/log" 2>&1 ||
    { bad "$q qlora run"; tail -5 "$TMP/log"; }
  first=$(loss_at "$TMP/q$q" 1) last=$(for s in 6 7 8; do loss_at "$TMP/q$q" $s; done | awk '{ t += $1 } END { print t / NR }')
  words="every layer's attention and MLP projections (q/k/v/o, gate/up/down), [0-9]* weights; fp32: the embeddings"
  [ $q = moe ] && words="every layer's attention projections (q/k/v/o).*; fp32, as bitsandbytes leaves them (not nn.Linear): the experts and routers of [0-9]* MoE layer"
  grep -q "in NF4 (QLoRA): $words" "$TMP/log" && [ -s "$TMP/q$q/adapter_model.safetensors" ] &&
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.02) }' && ok ||
    { bad "$q QLoRA: log, adapter or loss ($first -> $last)"; tail -3 "$TMP/log"; }
done
"${C[@]}" train "$TMP/sft.ini" "${moe[@]}" --set peft.lora_dropout=0.1 >"$TMP/log" 2>&1
[ $? != 0 ] && grep -q "lora_dropout" "$TMP/log" && ok || { bad "lora_dropout with target_parameters not refused"; tail -3 "$TMP/log"; }
finish
