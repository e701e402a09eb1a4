#!/usr/bin/env bash
# CLI contract: exit codes 0 ok / 1 run-time / 2 usage or config, and messages naming what is wrong.
# usage: test_cli.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/../e2e/e2e_common.sh"

# expect CODE DESCRIPTION -- COMMAND...: runs it, checks the exit code; output in $TMP/out
expect() {
  local code=$1 desc=$2
  shift 3
  "$@" >"$TMP/out" 2>&1 </dev/null
  local rc=$?
  if [ "$rc" -eq "$code" ]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL $desc: exit $rc, expected $code"
    sed 's/^/    /' "$TMP/out" | head -20
  fi
}

# contains TEXT DESCRIPTION: the last command's output contains TEXT
contains() {
  if grep -qF -- "$1" "$TMP/out"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL $2: output lacks '$1'"
    sed 's/^/    /' "$TMP/out" | head -20
  fi
}


expect 2 "no command" -- "$CTRL"
contains "usage: ctrl" "no command prints usage"
expect 0 "--help" -- "$CTRL" --help
contains "Commands:" "--help lists commands"
expect 2 "unknown command" -- "$CTRL" frobnicate
contains "unknown command 'frobnicate'" "unknown command named"
expect 2 "unknown global option" -- "$CTRL" --frob plugins
contains "unknown option '--frob'" "unknown option named"
expect 2 "--plugin-dir without value" -- "$CTRL" --plugin-dir
expect 2 "bad log level" -- "$CTRL" --log-level loud plugins
contains "--log-level 'loud'" "bad log level named"
expect 0 "version" -- "$CTRL" version
contains "plugin ABI" "version prints the ABI"
expect 0 "--version" -- "$CTRL" --version
for cmd in train plugins config model tokenize version; do
  expect 0 "$cmd --help" -- "$CTRL" "$cmd" --help
  contains "usage: ctrl $cmd" "$cmd --help prints its usage"
done

expect 0 "plugins" -- "${C[@]}" plugins
for p in "optimizer  adamw" "optimizer  sgd" "trainer    sft"; do
  contains "$p" "plugins lists '$p'"
done
expect 0 "describe optimizer/adamw" -- "${C[@]}" plugins describe optimizer/adamw
contains "adam_beta1" "describe shows options"
expect 0 "describe by bare name" -- "${C[@]}" plugins describe sgd
contains "nesterov" "describe sgd shows nesterov"
expect 2 "describe unknown plugin" -- "${C[@]}" plugins describe optimizer/lion
contains "no plugin 'optimizer/lion'" "describe names the missing plugin"
expect 2 "describe unknown kind" -- "${C[@]}" plugins describe widget/x
expect 2 "plugins extra argument" -- "${C[@]}" plugins list
expect 2 "missing plugin dir" -- "$CTRL" --plugin-dir "$TMP/nope" plugins
contains "$TMP/nope" "missing plugin dir named"

cat >"$TMP/good.ini" <<'INI'
[run]
trainer = sft
output_dir = OUT
[model]
path = model
[train]
optimizer = adamw
learning_rate = 1e-4
INI
sed -i "s#OUT#$TMP/run#; s#^path = model#path = $SRC/tests/fixtures/models/qwen2#" "$TMP/good.ini" # config check reads it
expect 0 "config check good" -- "${C[@]}" config check "$TMP/good.ini"
contains "ok" "config check says ok"

cp "$TMP/good.ini" "$TMP/typo.ini"
echo "learning_rat = 3" >>"$TMP/typo.ini"
expect 2 "unknown key" -- "${C[@]}" config check "$TMP/typo.ini"
contains "typo.ini:9" "unknown key: file:line"
contains "learning_rat" "unknown key: the key"
contains "learning_rate" "unknown key: did-you-mean"

expect 2 "missing config file" -- "${C[@]}" config check "$TMP/absent.ini"
contains "absent.ini" "missing file named"
expect 2 "config check without file" -- "${C[@]}" config check
expect 2 "bad --set" -- "${C[@]}" config check "$TMP/good.ini" --set train.learning_rate
expect 2 "--set out of range" -- "${C[@]}" config check "$TMP/good.ini" --set train.gradient_accumulation_steps=0
contains "gradient_accumulation_steps" "--set out of range names the key"
expect 0 "--set good" -- "${C[@]}" config check "$TMP/good.ini" --set train.optimizer=sgd
expect 2 "unknown optimizer" -- "${C[@]}" config check "$TMP/good.ini" --set train.optimizer=lion
contains "adamw" "unknown optimizer lists the available ones"
# A plugin's own checks (ctrl_plugin.check_options) refuse in config check too, located at the key.
expect 2 "plugin check: sgd nesterov" -- "${C[@]}" config check "$TMP/good.ini" --set train.optimizer=sgd \
  --set sgd.nesterov=true
contains "--set sgd.nesterov: [sgd] nesterov" "plugin check: where the key was set"
cp "$TMP/good.ini" "$TMP/dpo.ini"
sed -i 's/trainer = sft/trainer = dpo/' "$TMP/dpo.ini"
printf '[dpo]\nloss_type = exo_pair\n' >>"$TMP/dpo.ini"
expect 2 "plugin check: dpo exo_pair" -- "${C[@]}" config check "$TMP/dpo.ini"
contains "dpo.ini:10: [dpo] loss_type: exo_pair needs label_smoothing > 0" "plugin check: file:line and key"
expect 0 "plugin check: dpo exo_pair with label_smoothing" -- "${C[@]}" config check "$TMP/dpo.ini" \
  --set dpo.label_smoothing=0.001

# train validates first (exit 2 on a bad config, before any work) ...
expect 2 "train bad config" -- "${C[@]}" train "$TMP/typo.ini"
# ... and writes the effective config to output_dir/config.ini.
"${C[@]}" train "$TMP/good.ini" >"$TMP/out" 2>&1
if [ -f "$TMP/run/config.ini" ] && grep -q "learning_rate" "$TMP/run/config.ini"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1))
  echo "FAIL train writes output_dir/config.ini"
fi

# model init / info / logprobs and tokenize, on the committed tiny tokenizer.
TOKDIR="$SRC/tests/fixtures/tokenizer/tiny_bpe"
expect 0 "model init" -- "${C[@]}" model init --arch qwen3 --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
  --tokenizer "$TOKDIR" --out "$TMP/m"
expect 0 "model info" -- "$CTRL" model info "$TMP/m"
contains "qwen3" "model info names the architecture"
contains "heads / kv heads  4 / 2" "model info shows the heads"
printf '{"text": "Hello world"}\n{"input_ids": [5, 6, 7]}\n' >"$TMP/in.jsonl"
expect 0 "model logprobs" -- "${C[@]}" model logprobs --model "$TMP/m" --input "$TMP/in.jsonl"
contains '"logprobs":[null,' "model logprobs writes per-token log-probs"
contains '"input_ids":[5,6,7]' "model logprobs keeps given ids"
printf '{"text": "Hello world, and more words"}\nnot json\n' >"$TMP/bad.jsonl"
expect 1 "model logprobs bad line" -- "${C[@]}" model logprobs --model "$TMP/m" --input "$TMP/bad.jsonl"
contains "bad.jsonl:2" "model logprobs names file:line"
expect 2 "model init bad arch" -- "$CTRL" model init --arch gpt2 --hidden 8 --layers 1 --heads 1 --tokenizer "$TOKDIR" --out "$TMP/x"
printf '{"text": "Hello world"}\n' >"$TMP/text.jsonl"
expect 0 "tokenize" -- "$CTRL" tokenize --tokenizer "$TOKDIR" --input "$TMP/text.jsonl" --no-special
contains '"input_ids":[' "tokenize writes ids"
expect 1 "tokenize wrong field" -- "$CTRL" tokenize --tokenizer "$TOKDIR" --input "$TMP/in.jsonl"
contains "in.jsonl:2" "tokenize names file:line"
printf '{"input_ids": [877, 878]}\n' >"$TMP/ids.jsonl"
expect 0 "tokenize --decode" -- "$CTRL" tokenize --tokenizer "$TOKDIR" --input "$TMP/ids.jsonl" --decode
contains '"text":' "decode writes text"
printf '{"messages": [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}]}\n' >"$TMP/chat.jsonl"
expect 0 "tokenize --chat" -- "$CTRL" tokenize --tokenizer "$TOKDIR" --input "$TMP/chat.jsonl" --chat \
  --assistant-mask --chat-template "$SRC/tests/fixtures/templates/qwen2_5_training.jinja"
contains '"assistant_masks":[0,' "tokenize --chat writes the assistant mask"
printf '{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}\n' >"$TMP/alt.jsonl"
expect 1 "tokenize --chat template raises" -- "$CTRL" tokenize --tokenizer "$TOKDIR" --input "$TMP/alt.jsonl" \
  --chat --chat-template "$SRC/tests/fixtures/templates/mistral_v0.3.jinja"
contains "alt.jsonl:1" "template error names file:line"
contains "must alternate" "template error carries the template's message"
expect 2 "tokenize --assistant-mask without --chat" -- "$CTRL" tokenize --tokenizer "$TOKDIR" --input "$TMP/chat.jsonl" --assistant-mask

# generate: completions for JSONL prompts; a bad line names file:line; bad values are usage errors.
printf '{"prompt": "1+2="}\n{"prompt": "Hello"}\n' >"$TMP/prompts.jsonl"
expect 0 "generate" -- "${C[@]}" generate --model "$TMP/m" --prompts "$TMP/prompts.jsonl" --out "$TMP/gen.jsonl" \
  --n 2 --max-tokens 4 --seed 3
[ "$(grep -c '"completions":\[{"text"' "$TMP/gen.jsonl")" = 2 ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL generate output"; }
expect 0 "generate --stop" -- "${C[@]}" generate --model "$TMP/m" --prompts "$TMP/prompts.jsonl" --out "$TMP/gen2.jsonl" \
  --max-tokens 4 --stop "e" --stop "a"
printf '{"prompt": "ok"}\n{"text": "no prompt"}\n' >"$TMP/badp.jsonl"
expect 1 "generate bad line" -- "${C[@]}" generate --model "$TMP/m" --prompts "$TMP/badp.jsonl" --out "$TMP/x.jsonl"
contains "badp.jsonl:2" "generate names file:line"
expect 2 "generate bad top-p" -- "${C[@]}" generate --model "$TMP/m" --prompts "$TMP/prompts.jsonl" --out "$TMP/x.jsonl" --top-p 2
expect 0 "generate bf16 KV cache" -- "${C[@]}" generate --model "$TMP/m" --prompts "$TMP/prompts.jsonl" \
  --out "$TMP/gen16.jsonl" --n 2 --max-tokens 4 --seed 3 --kv-cache-dtype bf16
[ "$(grep -c '"completions":\[{"text"' "$TMP/gen16.jsonl")" = 2 ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL generate bf16 output"; }
expect 2 "generate bad kv dtype" -- "${C[@]}" generate --model "$TMP/m" --prompts "$TMP/prompts.jsonl" --out "$TMP/x.jsonl" \
  --kv-cache-dtype fp8
contains "fp32 or bf16" "bad kv dtype says what it takes"
expect 0 "generate --dtype bf16" -- "${C[@]}" generate --model "$TMP/m" --prompts "$TMP/prompts.jsonl" \
  --out "$TMP/genb.jsonl" --n 2 --max-tokens 4 --seed 3 --dtype bf16
[ "$(grep -c '"completions":\[{"text"' "$TMP/genb.jsonl")" = 2 ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL generate --dtype bf16 output"; }
expect 2 "generate bad dtype" -- "${C[@]}" generate --model "$TMP/m" --prompts "$TMP/prompts.jsonl" --out "$TMP/x.jsonl" \
  --dtype fp16
contains "--dtype fp16: fp32 or bf16" "bad dtype says what it takes"

# serve: health, TRL-style /generate, OpenAI /v1/completions, errors as HTTP codes, SIGINT stops it.
PORT=$(free_port)
"${C[@]}" serve --model "$TMP/m" --port "$PORT" --max-body-kb 1 >"$TMP/serve.log" 2>&1 &
spid=$!
for i in $(seq 50); do curl -sf "localhost:$PORT/health" >/dev/null 2>&1 && break; sleep 0.1; done
http() { curl -s -o "$TMP/out" -w "%{http_code}" "$@"; }
check_http() { # CODE DESCRIPTION CURL-ARGS...
  local code=$1 desc=$2
  shift 2
  if [ "$(http "$@")" = "$code" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $desc"; cat "$TMP/out"; fi
}
check_http 200 "serve /health" "localhost:$PORT/health"
check_http 200 "serve /v1/models" "localhost:$PORT/v1/models"
check_http 200 "serve /generate" -X POST "localhost:$PORT/generate" -d '{"prompts": ["1+2=", "Hi"], "n": 2, "max_tokens": 3}'
contains '"completion_ids":[[' "serve /generate returns completion ids"
check_http 200 "serve /generate ids" -X POST "localhost:$PORT/generate" -d '{"prompt_token_ids": [[5, 6, 7]], "max_tokens": 2, "temperature": 0}'
check_http 200 "serve /v1/completions" -X POST "localhost:$PORT/v1/completions" -d '{"model": "m", "prompt": "1+2=", "max_tokens": 3}'
contains '"object":"text_completion"' "serve /v1/completions shape"
check_http 400 "serve unknown field" -X POST "localhost:$PORT/generate" -d '{"prompts": ["x"], "bogus": 1}'
contains "bogus" "serve names the unknown field"
check_http 400 "serve bad JSON" -X POST "localhost:$PORT/generate" -d '{"prompts": '
check_http 400 "serve bad ids" -X POST "localhost:$PORT/generate" -d '{"prompt_token_ids": [[99999999]]}'
check_http 413 "serve oversized body" -X POST "localhost:$PORT/generate" --data-binary "@$SRC/tests/fixtures/templates/qwen3.jinja"
check_http 404 "serve unknown endpoint" "localhost:$PORT/nope"
check_http 200 "serve /sleep" -X POST "localhost:$PORT/sleep" -d '{"level": 2}'
check_http 503 "serve generate while asleep" -X POST "localhost:$PORT/generate" -d '{"prompts": ["x"]}'
check_http 200 "serve /wake_up" -X POST "localhost:$PORT/wake_up"
check_http 200 "serve generate after wake_up" -X POST "localhost:$PORT/generate" -d '{"prompts": ["x"], "max_tokens": 2}'
# OpenAI chat completions (the tokenizer's ChatML template), and SSE streaming of both OpenAI
# endpoints: the streamed text equals the non-streamed one (greedy), then `data: [DONE]`.
check_http 200 "serve /v1/chat/completions" -X POST "localhost:$PORT/v1/chat/completions" \
  -d '{"model": "m", "messages": [{"role": "user", "content": "1+2="}], "max_tokens": 4}'
contains '"object":"chat.completion"' "chat completion shape"
contains '"message":{"role":"assistant","content":' "chat completion message"
check_http 400 "serve chat without messages" -X POST "localhost:$PORT/v1/chat/completions" -d '{"model": "m"}'
whole=$(curl -s -X POST "localhost:$PORT/v1/completions" -d '{"prompt": "1+2=", "max_tokens": 6, "temperature": 0}' |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])' 2>/dev/null)
curl -sN -X POST "localhost:$PORT/v1/completions" \
  -d '{"prompt": "1+2=", "max_tokens": 6, "temperature": 0, "stream": true}' >"$TMP/sse.txt"
streamed=$(python3 -c '
import json, sys
print("".join(json.loads(l[6:])["choices"][0]["text"] for l in open(sys.argv[1]) if l.startswith("data: {")))' \
  "$TMP/sse.txt" 2>/dev/null)
if [ "$(tail -n 2 "$TMP/sse.txt" | head -n 1)" = "data: [DONE]" ] && grep -q '"finish_reason":"length"' "$TMP/sse.txt" &&
  { ! command -v python3 >/dev/null || [ "$streamed" = "$whole" ]; }; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL SSE completions: '$streamed' vs '$whole'"; cat "$TMP/sse.txt"
fi
curl -sN -X POST "localhost:$PORT/v1/chat/completions" \
  -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": true}' >"$TMP/sse2.txt"
grep -q '"object":"chat.completion.chunk"' "$TMP/sse2.txt" && grep -q '"delta":{"role":"assistant"' "$TMP/sse2.txt" &&
  grep -q '^data: \[DONE\]' "$TMP/sse2.txt" && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL SSE chat"; cat "$TMP/sse2.txt"; }
# 64 concurrent requests are batched together (fewer engine generations than requests) and each
# gets the tokens it gets when served alone (seeded sampling: per-request generators).
mkdir -p "$TMP/alone" "$TMP/together"
body() { echo "{\"prompts\": [\"$1+$1=\"], \"max_tokens\": 8, \"seed\": $1, \"n\": 2}"; }
for i in $(seq 64); do curl -s -X POST "localhost:$PORT/generate" -d "$(body $i)" >"$TMP/alone/$i"; done
before=$(curl -s "localhost:$PORT/health" | sed 's/.*"generations":\([0-9]*\).*/\1/')
pids=()
for i in $(seq 64); do
  curl -s -X POST "localhost:$PORT/generate" -d "$(body $i)" >"$TMP/together/$i" &
  pids+=($!)
done
wait "${pids[@]}" # not a bare wait: the server is a background job too
after=$(curl -s "localhost:$PORT/health" | sed 's/.*"generations":\([0-9]*\).*/\1/')
most=$(curl -s "localhost:$PORT/health" | sed 's/.*"max_requests_per_generation":\([0-9]*\).*/\1/')
same=0
ids_of() { grep -o '"completion_ids":.*,"logprobs"' "$1"; } # the tokens (log-probs vary in the last bits with the batch)
for i in $(seq 64); do
  [ -n "$(ids_of "$TMP/alone/$i")" ] && [ "$(ids_of "$TMP/alone/$i")" = "$(ids_of "$TMP/together/$i")" ] && same=$((same + 1))
done
[ "$same" = 64 ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL concurrent requests: $same/64 as when alone"; }
[ $((after - before)) -lt 64 ] && [ "$most" -gt 1 ] && pass=$((pass + 1)) ||
  { fail=$((fail + 1)); echo "FAIL concurrent requests not batched: $((after - before)) generations, at most $most together"; }
echo "64 concurrent requests: $((after - before)) generations, up to $most requests in one"
# A request that arrives while a long generation runs joins it (continuous batching across
# requests): it is answered before the long one ends, with the tokens it gets alone.
health() { curl -s "localhost:$PORT/health" | sed "s/.*\"$1\":\([0-9]*\).*/\1/"; }
short='{"prompts": ["7+7="], "max_tokens": 4, "seed": 11}'
curl -s -X POST "localhost:$PORT/generate" -d "$short" >"$TMP/short_alone"
g0=$(health generations) j0=$(health joined_requests)
(curl -s -X POST "localhost:$PORT/generate" -d '{"prompts": ["1+1="], "max_tokens": 1000, "n": 64, "seed": 1}' >"$TMP/long"
  date +%s%N >"$TMP/long_end") &
long_pid=$!
for i in $(seq 200); do [ "$(health generations)" -gt "$g0" ] && break; sleep 0.01; done # it is generating
curl -s -X POST "localhost:$PORT/generate" -d "$short" >"$TMP/short_joined"
date +%s%N >"$TMP/short_end"
wait "$long_pid"
if [ "$(health joined_requests)" -gt "$j0" ] && [ "$(cat "$TMP/short_end")" -lt "$(cat "$TMP/long_end")" ] &&
  [ -n "$(ids_of "$TMP/short_alone")" ] && [ "$(ids_of "$TMP/short_alone")" = "$(ids_of "$TMP/short_joined")" ]; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL joining a running generation: joined $j0 -> $(health joined_requests)," \
    "short done $(cat "$TMP/short_end"), long done $(cat "$TMP/long_end")"
fi
# The prefix cache across requests: a repeated long prompt reuses its blocks (same greedy tokens);
# after /reset_prefix_cache nothing is reused.
long=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' 1 2 3 4 5 6)
hits() { curl -s "localhost:$PORT/health" | sed 's/.*"prefix_cache_hits":\([0-9]*\).*/\1/'; }
req="{\"prompts\": [\"$long\"], \"max_tokens\": 6, \"temperature\": 0}"
curl -s -X POST "localhost:$PORT/generate" -d "$req" >"$TMP/pc1"
h1=$(hits)
curl -s -X POST "localhost:$PORT/generate" -d "$req" >"$TMP/pc2"
h2=$(hits)
curl -s -X POST "localhost:$PORT/reset_prefix_cache" >/dev/null
curl -s -X POST "localhost:$PORT/generate" -d "$req" >"$TMP/pc3"
h3=$(hits)
[ "$h2" -gt "$h1" ] && [ "$h3" = "$h2" ] && [ "$(ids_of "$TMP/pc1")" = "$(ids_of "$TMP/pc2")" ] &&
  [ "$(ids_of "$TMP/pc1")" = "$(ids_of "$TMP/pc3")" ] && pass=$((pass + 1)) ||
  { fail=$((fail + 1)); echo "FAIL prefix cache: hits $h1 -> $h2 -> $h3 (after reset)"; }
kill -INT $spid
wait $spid && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL serve did not stop cleanly"; cat "$TMP/serve.log"; }

# An API key: /health stays open, everything else wants the bearer token. SIGTERM lets the request
# in flight finish (200) before the server exits 0 (a drain of up to 240 s: a sanitizer build on a
# busy machine needed more than the default 60; test_serve.sh checks the deadline itself).
"${C[@]}" serve --model "$TMP/m" --port "$PORT" --api-key s3cret --drain-s 240 >"$TMP/serve2.log" 2>&1 &
spid=$!
for i in $(seq 50); do curl -sf "localhost:$PORT/health" >/dev/null 2>&1 && break; sleep 0.1; done
check_http 200 "serve /health without the key" "localhost:$PORT/health"
check_http 401 "serve without the key" -X POST "localhost:$PORT/generate" -d '{"prompts": ["x"]}'
check_http 401 "serve with a wrong key" -H "Authorization: Bearer nope" "localhost:$PORT/v1/models"
# a body sent without the key is refused from its headers on, not held: 15 MB to /update_weights
# (its limit is the model's size + 16 MB) leave the server's peak memory where it was
hwm() { sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$spid/status"; }
h0=$(hwm)
head -c 15000000 /dev/zero >"$TMP/zeros.bin"
check_http 401 "serve weights without the key" -X POST "localhost:$PORT/update_weights" --data-binary "@$TMP/zeros.bin"
h1=$(hwm)
[ -n "$h0" ] && [ -n "$h1" ] && [ $((h1 - h0)) -lt 8000 ] && pass=$((pass + 1)) ||
  { fail=$((fail + 1)); echo "FAIL an unauthorized body was kept: peak memory $h0 -> $(hwm) kB"; }
check_http 200 "serve with the key" -H "Authorization: Bearer s3cret" -X POST "localhost:$PORT/generate" -d '{"prompts": ["x"], "max_tokens": 2}'
curl -s -o "$TMP/long.json" -w "%{http_code}" -H "Authorization: Bearer s3cret" -X POST "localhost:$PORT/generate" \
  -d '{"prompts": ["x"], "n": 64, "max_tokens": 400}' >"$TMP/long.code" &
cpid=$!
for i in $(seq 100); do # until the server has it
  curl -s "localhost:$PORT/health" | grep -q '"requests_in_flight":[1-9]' && break
  sleep 0.05
done
kill -TERM $spid
wait $cpid
wait $spid && [ "$(cat "$TMP/long.code")" = 200 ] && grep -q completion_ids "$TMP/long.json" && pass=$((pass + 1)) ||
  { fail=$((fail + 1)); echo "FAIL SIGTERM drain: HTTP $(cat "$TMP/long.code")"; cat "$TMP/serve2.log"; }

# OpenBLAS kernels older than the CPU (kernels/cpu/blas_core.c): ctrl restarts itself with
# OPENBLAS_CORETYPE set and says so; a user's own OPENBLAS_CORETYPE is left alone.
# CTRL_TEST_BLAS_CORENAME pretends OpenBLAS chose Prescott (as on a lent Xeon VM).
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  expect 0 "OpenBLAS on Prescott kernels" -- env -u OPENBLAS_CORETYPE CTRL_TEST_BLAS_CORENAME=Prescott OPENBLAS_VERBOSE=2 "${C[@]}" plugins
  contains "ctrl restarted itself with OPENBLAS_CORETYPE=" "restart with better OpenBLAS kernels said"
  if grep -qE "Core: (SkylakeX|Haswell)" "$TMP/out"; then pass=$((pass + 1)); else
    fail=$((fail + 1)); echo "FAIL the restarted OpenBLAS did not load the kernels named"; sed 's/^/    /' "$TMP/out"; fi
  expect 0 "a user's OPENBLAS_CORETYPE" -- env CTRL_TEST_BLAS_CORENAME=Prescott OPENBLAS_CORETYPE=Haswell "${C[@]}" plugins
  if grep -q "restarted itself" "$TMP/out"; then fail=$((fail + 1)); echo "FAIL restarted despite OPENBLAS_CORETYPE"; else
    pass=$((pass + 1)); fi
fi

# config reference is generated from the option tables and the committed copy is current.
expect 0 "config reference" -- "${C[@]}" config reference --out "$TMP/ref.md"
if [ -f "$SRC/docs/config-reference.md" ] && cmp -s "$TMP/ref.md" "$SRC/docs/config-reference.md"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1))
  echo "FAIL docs/config-reference.md is out of date: regenerate with"
  echo "     build/ctrl --plugin-dir build/plugins config reference --out docs/config-reference.md"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
