#!/usr/bin/env bash
# Latency of a small request sent while ctrl serve prefills a long prompt (issue 15: a 30,000-
# token prompt made the next small request wait for its whole prefill). Starts the server twice on
# a tiny random qwen3 (hidden 64, 2 layers, context raised to 40k): with --prefill-chunk 0 (the
# scheduler before chunked prefill: the first waiting prompt takes every step's whole budget) and
# with the default chunk; each time it posts a LONG-token prompt (prompt_token_ids, no tokenizer
# time), waits 0.3 s, posts a 1-token prompt, and prints both requests' latencies.
# usage: [CHUNKS="0 512"] bench/serve/long_prompt_latency.sh [BUILD_DIR] [LONG_TOKENS]
set -euo pipefail
BUILD=${1:-build}
LONG=${2:-30000}
TMP=$(mktemp -d)
trap 'kill $spid 2>/dev/null; rm -rf "$TMP"' EXIT
C=("$BUILD/ctrl" --plugin-dir "$BUILD/plugins")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
"${C[@]}" model init --arch qwen3 --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
  --tokenizer "$SRC/tests/fixtures/tokenizer/tiny_bpe" --out "$TMP/m" >/dev/null
sed -i 's/"max_position_embeddings":[[:space:]]*[0-9]*/"max_position_embeddings": 40000/' "$TMP/m/config.json"
python3 -c "import json,sys; print(json.dumps({'prompt_token_ids': [[(i * 7919) % 900 + 5 for i in range($LONG)]], 'max_tokens': 8, 'temperature': 0}))" >"$TMP/long.json"
PORT=$((30000 + $$ % 10000))
spid=
ms() { echo $((($(date +%s%N) - $1) / 1000000)); }
for chunk in ${CHUNKS:-0 512}; do
  "${C[@]}" serve --model "$TMP/m" --port "$PORT" --prefill-chunk "$chunk" >"$TMP/serve.log" 2>&1 &
  spid=$!
  for _ in $(seq 100); do curl -sf "localhost:$PORT/health" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -s -X POST "localhost:$PORT/generate" -d '{"prompts": ["warm up"], "max_tokens": 8}' >/dev/null
  t0=$(date +%s%N)
  (curl -s -X POST "localhost:$PORT/generate" --data-binary "@$TMP/long.json" >"$TMP/long.out"; ms "$t0" >"$TMP/long.ms") &
  lpid=$!
  sleep 0.3
  t1=$(date +%s%N)
  curl -s -X POST "localhost:$PORT/generate" -d '{"prompts": ["hi"], "max_tokens": 8, "temperature": 0}' >"$TMP/short.out"
  short=$(ms "$t1")
  wait $lpid
  grep -q completion_ids "$TMP/long.out" && grep -q completion_ids "$TMP/short.out" || { echo "a request failed"; cat "$TMP/long.out" "$TMP/short.out"; exit 1; }
  echo "prefill-chunk $chunk: small request $short ms (sent 0.3 s after the $LONG-token prompt), long request $(cat "$TMP/long.ms") ms"
  kill -INT $spid
  wait $spid
done
