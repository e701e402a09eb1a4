#!/usr/bin/env bash
# The peak RSS of `ctrl serve` after one request: the server started on MODEL with the given flags
# (e.g. --dtype bf16), one /generate of 8 prompts x 32 greedy tokens, then its VmHWM, the request's wall
# seconds, the server's start-up lines and an md5 of the completion ids (to compare builds).
# usage: bench/scale/serve_rss.sh BUILD_DIR MODEL_DIR PORT [SERVE FLAGS...]
set -euo pipefail
B=$1 M=$2 P=$3
shift 3
LOG=$(mktemp)
OMP_WAIT_POLICY=PASSIVE "$B/ctrl" --plugin-dir "$B/plugins" serve --model "$M" --port "$P" "$@" >"$LOG" 2>&1 &
pid=$!
for _ in $(seq 600); do curl -sf "localhost:$P/health" >/dev/null 2>&1 && break; sleep 0.2; done
t0=$(date +%s.%N)
out=$(curl -s -X POST "localhost:$P/generate" -d '{"prompts": ["every step the training the on and falls",
  "learns size the learns a model its", "the while every from the moves each", "a b c d e f",
  "one two three four", "the model learns", "gradient descent moves", "loss falls each step"],
  "max_tokens": 32, "temperature": 0}')
t1=$(date +%s.%N)
grep VmHWM "/proc/$pid/status"
echo "request: $(echo "$t1 - $t0" | bc) s; completion ids md5 $(echo "$out" | grep -o '"completion_ids":[^}]*' | md5sum | cut -c1-32)"
grep 'serve:' "$LOG" | head -3 | cut -c1-300 || true
kill -INT "$pid"
wait "$pid" || true
rm -f "$LOG"
