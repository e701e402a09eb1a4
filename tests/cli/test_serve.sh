#!/usr/bin/env bash
# ctrl serve under abuse: every invalid request field is a 400 naming it; prompts x n and prompt +
# max_tokens are bounded; a refused /update_weights body changes no weight; partial requests
# (slowloris) are closed after --timeout-s; a request of many sequences does not hold up a small
# one; a client that leaves (streaming or not) cancels its generation; the SIGTERM drain ends after
# --drain-s, answering what still runs with 503, while /health answers 503 and new requests are refused. (The happy
# paths are in test_cli.sh.)
# usage: test_serve.sh CTRL_BINARY PLUGIN_DIR SOURCE_DIR
source "$(dirname "$0")/../e2e/e2e_common.sh"

"${C[@]}" model init --arch qwen3 --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
  --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/m" >/dev/null || bad "model init"
PORT=$(free_port)
start() { # FLAGS...: a server on $PORT, waited for
  "${C[@]}" serve --model "$TMP/m" --port "$PORT" "$@" >"$TMP/serve.log" 2>&1 &
  spid=$!
  for _ in $(seq 100); do curl -sf "localhost:$PORT/health" >/dev/null 2>&1 && return; sleep 0.1; done
  bad "serve did not start"; cat "$TMP/serve.log"
}
post() { curl -s -o "$TMP/out" -w "%{http_code}" -X POST "localhost:$PORT$1" "${@:2}"; }
# refused BODY TEXT: POST /generate BODY is a 400 whose message contains TEXT
refused() {
  local code
  code=$(post /generate -d "$1")
  if [ "$code" = 400 ] && grep -qF -- "$2" "$TMP/out"; then ok; else bad "$1: HTTP $code, wanted 400 naming '$2': $(cat "$TMP/out")"; fi
}

start --max-seqs-per-request 64 --max-queued-seqs 80

# every invalid sampling field: a 400 naming it (these were 500s, or silently ignored)
refused '{"prompts": ["x"], "temperature": -1}' "temperature"
refused '{"prompts": ["x"], "temperature": 1e999}' "temperature"
refused '{"prompts": ["x"], "temperature": 1e-30}' "temperature"
refused '{"prompts": ["x"], "top_p": 0}' "top_p"
refused '{"prompts": ["x"], "top_p": 1.5}' "top_p"
refused '{"prompts": ["x"], "top_p": 1e-320}' "top_p"
refused '{"prompts": ["x"], "top_k": -5}' "top_k"
refused '{"prompts": ["x"], "top_k": 2.5}' "top_k"
refused '{"prompts": ["x"], "min_p": 2}' "min_p"
refused '{"prompts": ["x"], "repetition_penalty": 0}' "repetition_penalty"
refused '{"prompts": ["x"], "repetition_penalty": 1e-310}' "repetition_penalty"
refused '{"prompts": ["x"], "repetition_penalty": -1}' "repetition_penalty"
refused '{"prompts": ["x"], "seed": -3}' "seed"
# wrong JSON types are named, not ignored
refused '{"prompts": ["x"], "n": "5"}' "n:"
refused '{"prompts": ["x"], "max_tokens": "3"}' "max_tokens"
refused '{"prompts": ["x"], "temperature": "hot"}' "temperature"
refused '{"prompts": "x", "n": [2]}' "n:"
refused '{"prompts": 5}' "prompts"
refused '{"prompts": ["x", 7]}' "prompts[1]"
refused '{"prompt_token_ids": [[1, 2.5]]}' "prompt_token_ids[0][1]"
refused '{"prompts": ["x"], "prompt_token_ids": [[1]]}' "prompts and prompt_token_ids"
code=$(post /v1/completions -d '{"prompt": "x", "stream": "yes"}')
[ "$code" = 400 ] && grep -q '"stream: true or false"' "$TMP/out" && ok || bad "stream type: $code $(cat "$TMP/out")"
code=$(post /v1/completions -d '{"prompt": "x", "model": 3}')
[ "$code" = 400 ] && grep -q 'model: a string' "$TMP/out" && ok || bad "model type: $code $(cat "$TMP/out")"
# runtime LoRA updating is off unless asked for (--allow-runtime-lora-updating): 404, as vLLM
code=$(post /v1/load_lora_adapter -d '{"lora_name": "a", "lora_path": "/tmp"}')
[ "$code" = 404 ] && grep -q 'allow-runtime-lora-updating' "$TMP/out" && ok || bad "load_lora_adapter while off: $code $(cat "$TMP/out")"
code=$(post /sleep -d '{"level": 7}')
[ "$code" = 400 ] && grep -q 'level' "$TMP/out" && ok || bad "sleep level: $code $(cat "$TMP/out")"
# null is the default; valid edge values pass
code=$(post /generate -d '{"prompts": ["x"], "n": null, "top_k": -1, "temperature": 0, "max_tokens": 2}')
[ "$code" = 200 ] && ok || bad "null and edge values: $code $(cat "$TMP/out")"
# prompts x n within --max-seqs-per-request; prompt + max_tokens within the context
refused '{"prompts": ["a", "b", "c"], "n": 30}' "prompts x n = 3 x 30 exceeds the server's limit of 64 sequences per request (--max-seqs-per-request)"
refused '{"prompts": ["x"], "n": 65}' "n: an integer between 1 and 64"
refused '{"prompts": ["x"], "max_tokens": 5000}' "max_tokens: an integer between 1 and 4096"
ids=$(seq -s, 1 100)
refused "{\"prompt_token_ids\": [[$ids]], \"max_tokens\": 4000}" \
  "prompt_token_ids[0]: 100 prompt tokens + max_tokens 4000 exceed the model's context of 4096 tokens"
long=$(head -c 20000 /dev/zero | tr '\0' 'a')
refused "{\"prompts\": [\"x\", \"$long\"]}" "prompts[1]: more than 4096 prompt tokens"
code=$(curl -s -o "$TMP/out" -w "%{http_code}" "localhost:$PORT/generate")
[ "$code" = 405 ] && ok || bad "GET /generate: $code, wanted 405"

# /update_weights is all or nothing: one valid tensor and one of the wrong dtype (I32) is a 400
# naming the bad one, and the valid one is not applied (greedy output unchanged); alone, the valid
# one is applied (the output changes: the check can see a change).
st_body() { # OUT NAME1 DTYPE1 [NAME2 DTYPE2]: [64] tensors, the first 7, -3, 7, -3..., the second zeros
  local h="{\"$2\":{\"dtype\":\"$3\",\"shape\":[64],\"data_offsets\":[0,256]}"
  [ -n "${4:-}" ] && h="$h,\"$4\":{\"dtype\":\"$5\",\"shape\":[64],\"data_offsets\":[256,512]}"
  h="$h}"
  local n=${#h}
  {
    printf "\\x$(printf %02x $((n & 255)))\\x$(printf %02x $((n >> 8)))\\x00\\x00\\x00\\x00\\x00\\x00"
    printf '%s' "$h"
    for _ in $(seq 32); do printf '\x00\x00\xe0\x40\x00\x00\x40\xc0'; done
    [ -n "${4:-}" ] && head -c 256 /dev/zero
  } >"$1"
}
greedy() { curl -s -X POST "localhost:$PORT/generate" -d '{"prompts": ["1+2="], "max_tokens": 8, "temperature": 0}' |
  grep -o '"completion_ids":[^]]*'; }
before=$(greedy)
st_body "$TMP/mixed.st" model.layers.0.post_attention_layernorm.weight F32 model.norm.weight I32
code=$(post /update_weights --data-binary "@$TMP/mixed.st")
[ "$code" = 400 ] && grep -q "model.norm.weight' is i32" "$TMP/out" && ok ||
  bad "mixed weights body: $code $(cat "$TMP/out")"
[ -n "$before" ] && [ "$(greedy)" = "$before" ] && ok || bad "a refused weights body changed the model"
st_body "$TMP/nan.st" model.layers.0.post_attention_layernorm.weight F32
printf '\x00\x00\xc0\x7f' | dd of="$TMP/nan.st" bs=1 seek=$(($(stat -c %s "$TMP/nan.st") - 8)) conv=notrunc 2>/dev/null
code=$(post /update_weights --data-binary "@$TMP/nan.st")
[ "$code" = 400 ] && grep -q "post_attention_layernorm.weight' holds nan at element 62" "$TMP/out" && ok ||
  bad "a NaN weight: $code $(cat "$TMP/out")"
[ "$(greedy)" = "$before" ] && ok || bad "a refused NaN body changed the model"
st_body "$TMP/one.st" model.layers.0.post_attention_layernorm.weight F32
code=$(post /update_weights --data-binary "@$TMP/one.st")
[ "$code" = 200 ] && [ "$(greedy)" != "$before" ] && ok || bad "the valid tensor alone: $code, output $(greedy)"
# The sequences of all requests queued or running are bounded: while 64 run, a request of 32 more
# is a 503 naming --max-queued-seqs, one of 16 is served.
curl -s -o /dev/null -X POST "localhost:$PORT/generate" -d '{"prompts": ["x"], "n": 64, "max_tokens": 400}' &
qpid=$!
for _ in $(seq 200); do curl -s "localhost:$PORT/health" | grep -q '"requests_in_flight":1' && break; sleep 0.02; done
sleep 0.2
code=$(post /generate -d '{"prompts": ["x"], "n": 32, "max_tokens": 2}')
[ "$code" = 503 ] && grep -q "max-queued-seqs" "$TMP/out" && ok || bad "over --max-queued-seqs: $code $(cat "$TMP/out")"
code=$(post /generate -d '{"prompts": ["x"], "n": 16, "max_tokens": 2}')
[ "$code" = 200 ] && ok || bad "within --max-queued-seqs: $code $(cat "$TMP/out")"
wait $qpid

# A streaming client that disconnects cancels its generation: a request sent a moment later finds
# the engine idle instead of joining a generation that runs on for nobody (as it did before).
joined() { curl -s "localhost:$PORT/health" | sed 's/.*"joined_requests":\([0-9]*\).*/\1/'; }
j0=$(joined)
curl -sN --max-time 1 -X POST "localhost:$PORT/v1/completions" \
  -d '{"prompt": "x", "n": 64, "max_tokens": 4000, "stream": true}' >"$TMP/sse_cut.txt" 2>/dev/null
grep -q '^data: {' "$TMP/sse_cut.txt" || bad "the stream sent nothing before the client left"
sleep 0.5
code=$(post /generate -d '{"prompts": ["x"], "max_tokens": 2}')
[ "$code" = 200 ] && [ "$(joined)" = "$j0" ] && ok ||
  bad "a disconnected stream still generates: HTTP $code, joined_requests $j0 -> $(joined)"

# A non-streaming client that disconnects cancels its generation too (it ran on for minutes): the
# server is idle again right after the client leaves.
curl -s --max-time 1 -o /dev/null -X POST "localhost:$PORT/v1/completions" \
  -d '{"prompt": "x", "n": 64, "max_tokens": 4000}' 2>/dev/null
idle=0
for _ in $(seq 40); do
  curl -s "localhost:$PORT/health" | grep -q '"requests_in_flight":0' && idle=1 && break
  sleep 0.05
done
[ "$idle" = 1 ] && ok || bad "a disconnected non-streaming request still runs: $(curl -s "localhost:$PORT/health")"

kill -INT $spid
wait $spid && ok || bad "serve did not stop cleanly"

# --dtype bf16 (vLLM's --dtype bfloat16): greedy completions are ctrl generate --dtype bf16's, and after
# /update_weights changes a projection (packed into bf16 panels at the first step) the output follows
# it: the weight is packed again, not served stale. --dtype takes fp32 or bf16.
"${C[@]}" serve --model "$TMP/m" --port "$PORT" --dtype fp16 >"$TMP/out" 2>&1
[ $? = 2 ] && grep -q -- "--dtype fp16: fp32 or bf16" "$TMP/out" && ok || bad "serve --dtype fp16: $(cat "$TMP/out")"
start --dtype bf16
echo '{"prompt": "1+2="}' >"$TMP/p.jsonl"
"${C[@]}" generate --model "$TMP/m" --prompts "$TMP/p.jsonl" --out "$TMP/g.jsonl" --temperature 0 --max-tokens 8 \
  --dtype bf16 >/dev/null 2>&1 || bad "generate --dtype bf16"
want=$(sed 's/.*"token_ids":\[\([0-9,]*\)\].*/\1/' "$TMP/g.jsonl")
got=$(greedy | sed 's/.*\[//')
[ -n "$want" ] && [ "$got" = "$want" ] && ok || bad "serve --dtype bf16 greedy '$got', generate --dtype bf16 '$want'"
{ # q_proj of layer 0 ([64, 64]) as 7, -3, 7, -3, ...
  h='{"model.layers.0.self_attn.q_proj.weight":{"dtype":"F32","shape":[64,64],"data_offsets":[0,16384]}}'
  printf "\\x$(printf %02x ${#h})\\x00\\x00\\x00\\x00\\x00\\x00\\x00%s" "$h"
  for _ in $(seq 2048); do printf '\x00\x00\xe0\x40\x00\x00\x40\xc0'; done
} >"$TMP/q.st"
code=$(post /update_weights --data-binary "@$TMP/q.st")
after=$(greedy | sed 's/.*\[//')
[ "$code" = 200 ] && [ -n "$after" ] && [ "$after" != "$got" ] && ok ||
  bad "serve --dtype bf16 after a q_proj update: HTTP $code, output '$after' (before '$got')"
# (held as bf16 GEMM panels where a bf16 kernel runs: q_proj's panels were packed again from the update)
# the checkpoint itself as the body: every weight back -- the held ones packed again -- and the output
code=$(post /update_weights --data-binary "@$TMP/m/model.safetensors")
back=$(greedy | sed 's/.*\[//')
[ "$code" = 200 ] && [ "$back" = "$got" ] && ok ||
  bad "serve --dtype bf16, the checkpoint posted back: HTTP $code, output '$back' (at first '$got')"
grep -q "serve: .*held as bf16 GEMM panels" "$TMP/serve.log" && ok || bad "serve --dtype bf16: no hold logged"
kill -INT $spid
wait $spid && ok || bad "serve --dtype bf16 did not stop cleanly"

# Two tied models, one stored in fp32 (its table kept in fp32, the head's panels held beside it), another in
# bf16 (the table held in bf16 alone, as the head's panels where a bf16 kernel runs): served, each gives ctrl generate
# --dtype bf16's greedy tokens, and after the other checkpoint is posted over it, the other's -- the head's
# panels packed again from the new table (they were served stale before), the table put back in fp32
# where the new values are not bf16 ones.
"${C[@]}" model init --arch qwen3 --hidden 64 --layers 2 --heads 4 --kv-heads 2 --tie-embeddings --seed 5 \
  --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/mt" >/dev/null || bad "tied model init"
"${C[@]}" model init --arch qwen3 --hidden 64 --layers 2 --heads 4 --kv-heads 2 --tie-embeddings --seed 11 \
  --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/mt11" >/dev/null || bad "tied model init"
"${C[@]}" model convert --model "$TMP/mt11" --out "$TMP/mt16" --dtype bf16 >/dev/null || bad "model convert bf16"
gen_ids() { # MODEL: generate --dtype bf16's greedy token ids and their log-probs for p.jsonl
  "${C[@]}" generate --model "$1" --prompts "$TMP/p.jsonl" --out "$TMP/g.jsonl" --temperature 0 --max-tokens 8 \
    --dtype bf16 >/dev/null 2>&1 || bad "generate --dtype bf16 $1"
  sed 's/.*"token_ids":\[\([0-9,]*\)\],"logprobs":\[\([^]]*\)\].*/\1 \2/' "$TMP/g.jsonl"
}
greedy_lp() { # the server's: the same, from /generate
  curl -s -X POST "localhost:$PORT/generate" -d '{"prompts": ["1+2="], "max_tokens": 8, "temperature": 0}' |
    sed 's/.*"completion_ids":\[\[\([0-9,]*\)\]\],"logprobs":\[\[\([^]]*\)\]\].*/\1 \2/'
}
w32=$(gen_ids "$TMP/mt") w16=$(gen_ids "$TMP/mt16")
[ -n "$w32" ] && [ -n "$w16" ] && [ "$w32" != "$w16" ] && ok || bad "tied checkpoints: generate '$w32', '$w16'"
# (token ids and their log-probs: the completions of these small random models are near constant)
for first in mt mt16; do
  other=mt16 want=$w32 then=$w16
  [ $first = mt16 ] && other=mt want=$w16 then=$w32
  "${C[@]}" serve --model "$TMP/$first" --port "$PORT" --dtype bf16 >"$TMP/serve.log" 2>&1 &
  spid=$!
  for _ in $(seq 100); do curl -sf "localhost:$PORT/health" >/dev/null 2>&1 && break; sleep 0.1; done
  got=$(greedy_lp)
  [ "$got" = "$want" ] && ok || bad "serve --dtype bf16 of $first: '$got', generate '$want'"
  if [ $first = mt16 ] && grep -q "serve: the weights held as bf16 GEMM panels" "$TMP/serve.log"; then
    grep -q "the embedding held in bf16 as the tied head's panels alone" "$TMP/serve.log" && ok ||
      bad "serve --dtype bf16: a bf16 checkpoint's tied table not held: $(grep serve: "$TMP/serve.log")"
  fi
  code=$(post /update_weights --data-binary "@$TMP/$other/model.safetensors")
  got=$(greedy_lp)
  [ "$code" = 200 ] && [ "$got" = "$then" ] && ok ||
    bad "serve --dtype bf16 of $first, $other posted over it: HTTP $code, '$got', generate from $other '$then'"
  kill -INT $spid
  wait $spid && ok || bad "serve --dtype bf16 of $first did not stop cleanly"
done

# Slowloris: partial requests are closed after --timeout-s (they were held forever), and a body
# trickled in faster than that is cut at the upload deadline.
start --timeout-s 1 --drain-s 1
closed_within() { # SECONDS DESCRIPTION: fd 3's connection is closed by the server within SECONDS
  local t0 t1
  t0=$(date +%s%N)
  timeout 8 cat <&3 >/dev/null
  t1=$(date +%s%N)
  exec 3<&-
  [ $(((t1 - t0) / 1000000)) -lt $(($1 * 1000)) ] && ok || bad "$2: open for $(((t1 - t0) / 1000000)) ms"
}
exec 3<>"/dev/tcp/127.0.0.1/$PORT"
printf 'POST /generate HTTP/1.1\r\nHost: x\r\nContent-Le' >&3
closed_within 4 "partial headers"
exec 3<>"/dev/tcp/127.0.0.1/$PORT"
printf 'POST /generate HTTP/1.1\r\n' >&3
(for _ in $(seq 20); do printf 'X' >&3 || break; sleep 0.3; done) 2>/dev/null & # headers trickled in
trickle=$!
closed_within 5 "headers trickled in"
kill $trickle 2>/dev/null
wait $trickle 2>/dev/null
exec 3<>"/dev/tcp/127.0.0.1/$PORT"
printf 'POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"pro' >&3
closed_within 4 "partial body"
exec 3<>"/dev/tcp/127.0.0.1/$PORT"
printf 'POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n' >&3
(for _ in $(seq 20); do printf ' ' >&3 || break; sleep 0.3; done) 2>/dev/null &
trickle=$!
closed_within 5 "a body trickled in"
kill $trickle 2>/dev/null
wait $trickle 2>/dev/null
code=$(post /generate -d '{"prompts": ["x"], "max_tokens": 2}')
[ "$code" = 200 ] && ok || bad "serving after the slow clients: $code"

# One request of many sequences (more than a step's 256 slots) does not hold up a small one sent
# after it: the small one gets its share of every step and is answered first (it waited for all of
# them before).
(curl -s -X POST "localhost:$PORT/generate" -d '{"prompts": ["a", "b"], "n": 512, "max_tokens": 64}' >"$TMP/big"
  date +%s%N >"$TMP/big_end") &
bpid=$!
for _ in $(seq 200); do curl -s "localhost:$PORT/health" | grep -q '"generations":2' && break; sleep 0.02; done
curl -s -X POST "localhost:$PORT/generate" -d '{"prompts": ["hi"], "max_tokens": 8}' >"$TMP/small"
date +%s%N >"$TMP/small_end"
wait $bpid
grep -q completion_ids "$TMP/small" && grep -q completion_ids "$TMP/big" &&
  [ "$(cat "$TMP/small_end")" -lt "$(cat "$TMP/big_end")" ] && ok ||
  bad "a small request behind 1024 sequences: done at $(cat "$TMP/small_end"), the big one at $(cat "$TMP/big_end")"

# The drain lets work in flight finish, tokenization included: a 10 MB prompt still being tokenized
# when SIGTERM arrives is tokenized to the end and answered (here: too long for the context)
# rather than cut off by the signal.
kill -TERM $spid
wait $spid || bad "serve did not stop cleanly"
start --max-body-kb 16384
{ printf '{"prompts": ["'; yes ab | head -c 10000000 | tr '\n' ' '; printf '"], "max_tokens": 1}'; } >"$TMP/huge.json"
curl -s -o "$TMP/huge.out" -w "%{http_code}" -X POST "localhost:$PORT/generate" --data-binary "@$TMP/huge.json" >"$TMP/huge.code" &
cpid=$!
sleep 0.8
kill -TERM $spid
wait $cpid
wait $spid && [ "$(cat "$TMP/huge.code")" = 400 ] && grep -q "prompt tokens + max_tokens 1 exceed" "$TMP/huge.out" && ok ||
  bad "tokenizing during the drain: HTTP $(cat "$TMP/huge.code") $(cat "$TMP/huge.out")"
start --timeout-s 1 --drain-s 1

# The drain is bounded: SIGTERM during a generation longer than --drain-s answers it 503 and exits 0.
curl -s -o "$TMP/long.json" -w "%{http_code}" -X POST "localhost:$PORT/generate" \
  -d '{"prompts": ["x"], "n": 64, "max_tokens": 4000, "temperature": 1}' >"$TMP/long.code" &
cpid=$!
for _ in $(seq 100); do curl -s "localhost:$PORT/health" | grep -q '"generations":1' && break; sleep 0.05; done
t0=$(date +%s%N)
kill -TERM $spid
sleep 0.2 # draining: /health answers 503 (it hung before), new generations are refused
hcode=$(curl -s -o "$TMP/h.json" -w "%{http_code}" --max-time 2 "localhost:$PORT/health")
[ "$hcode" = 503 ] && grep -q '"status":"draining"' "$TMP/h.json" && ok || bad "/health while draining: $hcode"
code=$(curl -s -o "$TMP/out" -w "%{http_code}" --max-time 2 -X POST "localhost:$PORT/v1/completions" -d '{"prompt": "x"}')
[ "$code" = 503 ] && grep -q "draining" "$TMP/out" && ok || bad "a new request while draining: $code $(cat "$TMP/out")"
wait $spid
rc=$?
t1=$(date +%s%N)
wait $cpid
[ "$rc" = 0 ] && [ $(((t1 - t0) / 1000000)) -lt 6000 ] && [ "$(cat "$TMP/long.code")" = 503 ] &&
  grep -q "shutting down" "$TMP/long.json" && ok ||
  bad "bounded drain: exit $rc after $(((t1 - t0) / 1000000)) ms, HTTP $(cat "$TMP/long.code") $(cat "$TMP/long.json")"
finish
