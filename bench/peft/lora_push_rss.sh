#!/usr/bin/env bash
# What server mode's weight push costs the trainer in memory with LoRA (issue 18): GRPO with [peft]
# through `ctrl serve` on a random Qwen2-shaped model, STEPS steps (STEPS + 1 pushes: the start and one
# a step, each the base with the adapters folded in, ctrl_peft_save_merged_weights), the trainer's peak
# RSS (/usr/bin/time -v, loading included) against the same run in colocate mode (no push), so the
# difference is what the pushes hold at their peak. One thread. Run it with two builds to compare.
# usage: bench/peft/lora_push_rss.sh BUILD_DIR HIDDEN LAYERS HEADS KV_HEADS INTERMEDIATE [--tokenizer DIR]
#        [--vocab N] [--tie-embeddings] [--steps N (1)] [--dtype bf16|fp32 (bf16)] [--full (no [peft]: a full
#        fine-tune's push, the model's own weights)] [--qlora ([peft] quantization = nf4: the base held in
#        NF4, each push dequantizing it)] [--zero3 (2 ranks, mpirun, [memory] strategies = zero3: each
#        rank's peak RSS by its own /usr/bin/time -v, over its whole life; CTRL_TEST_ZERO_SAVE_WHOLE=1 in
#        the environment makes each push gather the whole model on every rank, the way before it streamed)]
# Qwen2.5-0.5B's shape with 8 layers:
#   bench/peft/lora_push_rss.sh build 896 8 14 2 4864 --tokenizer /work/shared/data/tokenizers/qwen3 \
#     --vocab 151936 --tie-embeddings
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "$1" && pwd)
shift
STEPS=1 DTYPE=bf16 TOK=$SRC/tests/fixtures/tokenizer/tiny_bpe PEFT=true Z3= QLORA=
ARGS=() INIT=()
while [ $# -gt 0 ]; do
  case $1 in
    --tokenizer) TOK=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --dtype) DTYPE=$2; shift ;;
    --full) PEFT=false ;;
    --qlora) QLORA=1 ;;
    --zero3) Z3=1 ;;
    --vocab) INIT+=(--vocab "$2"); shift ;;
    --tie-embeddings) INIT+=(--tie-embeddings) ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
TMP=$(mktemp -d)
SERVER=
trap '[ -n "$SERVER" ] && kill $SERVER 2>/dev/null; rm -rf "$TMP"' EXIT
C=("$BUILD/ctrl" --plugin-dir "$BUILD/plugins")
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
"${C[@]}" model init --arch qwen2 --hidden "${ARGS[0]}" --layers "${ARGS[1]}" --heads "${ARGS[2]}" \
  --kv-heads "${ARGS[3]}" --intermediate "${ARGS[4]}" "${INIT[@]}" --tokenizer "$TOK" --out "$TMP/model" >/dev/null
for i in $(seq 16); do echo "{\"prompt\": \"$i+$((i * 7 % 13))=\"}"; done >"$TMP/prompts.jsonl"
cat >"$TMP/grpo.ini" <<INI
[run]
trainer = grpo
output_dir = $TMP/out
device = cpu
[model]
path = $TMP/model
[data]
train_file = $TMP/prompts.jsonl
[train]
dtype = $DTYPE
max_steps = $STEPS
per_device_train_batch_size = 4
logging_steps = 1
save_strategy = no
[generation]
kv_cache_bytes = 64000000
[reward.len]
plugin = length
target_length = 4
[grpo]
num_generations = 2
max_completion_length = 4
INI
[ "$PEFT" = true ] && printf '[peft]\nenabled = true\ntarget_modules = all-linear\n' >>"$TMP/grpo.ini"
[ "$PEFT" = true ] && [ -n "$QLORA" ] && echo "quantization = nf4" >>"$TMP/grpo.ini"
LAUNCH=() RANKT=()
if [ -n "$Z3" ]; then
  # each rank under its own /usr/bin/time (the launcher's own peak is mpirun's), into rank-time.R
  RANKT=(bash -c 'exec /usr/bin/time -v -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$TMP/rank-time")
  printf '[memory]\nstrategies = zero3\n' >>"$TMP/grpo.ini"
  LAUNCH=(mpirun -np 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
  [ -n "${CTRL_TEST_ZERO_SAVE_WHOLE:-}" ] && LAUNCH+=(-x CTRL_TEST_ZERO_SAVE_WHOLE)
  [ "$(id -u)" = 0 ] && LAUNCH+=(--allow-run-as-root)
fi
PORT=$(/work/venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
  echo 18631)
"${C[@]}" serve --model "$TMP/model" --port "$PORT" >"$TMP/serve.log" 2>&1 &
SERVER=$!
for _ in $(seq 600); do curl -sf "localhost:$PORT/health" >/dev/null 2>&1 && break; sleep 0.2; done
run() { # name, extra --set ...
  local name=$1
  shift
  /usr/bin/time -v "${LAUNCH[@]}" "${RANKT[@]}" "${C[@]}" train "$TMP/grpo.ini" "$@" >"$TMP/log" 2>"$TMP/time" || {
    echo "$name: failed"
    tail -5 "$TMP/log" "$TMP/time"
    exit 1
  }
  local rss cpu
  rss=$(awk '/Maximum resident/ { printf "%.0f", $NF / 1024 }' "$TMP/time")
  # zero3: each rank's (rank 0 / rank 1)
  [ -n "$Z3" ] && rss=$(for r in 0 1; do awk '/Maximum resident/ { printf "%.0f\n", $NF / 1024 }' "$TMP/rank-time.$r"; done |
    paste -sd/ | sed 's|/| / |')
  cpu=$(awk '/User time/ { u = $NF } /System time/ { s = $NF } END { printf "%.1f", u + s }' "$TMP/time")
  printf '| %s | %s | %s |\n' "$name" "$rss" "$cpu"
}
echo "| run ($DTYPE, [peft] enabled = $PEFT${QLORA:+, nf4}, $STEPS step(s)${Z3:+, zero3 on 2 ranks}${CTRL_TEST_ZERO_SAVE_WHOLE:+, pushes gathered whole}) | trainer peak RSS (MiB${Z3:+, per rank}) | CPU s |"
echo "|---|---|---|"
run "colocate (no push)"
run "server mode ($((STEPS + 1)) pushes)" --set generation.mode=server --set generation.server_url="http://127.0.0.1:$PORT"
echo "server /health: $(curl -s "localhost:$PORT/health")"
