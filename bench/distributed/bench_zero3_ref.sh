#!/usr/bin/env bash
# zero3's sliced reference model (issue 19; core/train/zero_ref.c): 2 ranks of DPO (mpirun, 1 thread
# each) with a live reference on a Qwen2.5-0.5B-shaped model with its real vocabulary -- the Qwen3
# tokenizer of /work/shared/data/tokenizers (or TOKENIZER), 151,936 rows tied to the LM head: 136 M
# parameters, 545 MB in fp32 -- and LAYERS of its 24 layers, the reference sliced as the policy (now)
# against whole on every rank (CTRL_TEST_ZERO3_WHOLE_REF=1, before): each rank's peak resident memory
# and CPU time (/usr/bin/time: maximum RSS, user + system, loading included), the run's own lines on
# the reference's resident bytes, and the final loss (the same both ways).
# usage: bench/distributed/bench_zero3_ref.sh BUILD_DIR [LAYERS STEPS TOKENIZER]
set -euo pipefail
BUILD=$1 LAYERS=${2:-2} STEPS=${3:-2} TOK=${4:-/work/shared/data/tokenizers/qwen3}
source "$(dirname "$0")/common.sh"
[ -f "$TOK/tokenizer.json" ] || { echo "SKIP: no tokenizer in $TOK"; exit 0; }
qwen_vocab_model "$TMP/model" "$LAYERS" "$TOK"
cat >"$TMP/run.ini" <<INI
[run]
trainer = dpo
device = cpu
[model]
path = $TMP/model
[data]
train_file = $SRC/tests/fixtures/trl_dpo/pairs.jsonl
[train]
learning_rate = 1e-5
max_steps = $STEPS
per_device_train_batch_size = 2
logging_steps = 1
save_strategy = no
dtype = fp32
[memory]
strategies = zero3
INI
params=$("${C[@]}" model info "$TMP/model" | sed -n 's/^parameters *\([0-9]*\).*/\1/p')
machine
echo "model: Qwen2.5-0.5B-shaped, $LAYERS layers, vocabulary 151936 tied, $params parameters ($((params * 4 / 1048576)) MiB fp32); DPO, 2 ranks x 1 thread x 2 pairs, $STEPS steps, zero3; load average $(load)"
echo "| reference | peak RSS per rank | CPU s per step per rank | wall s | final loss |"
echo "|---|---|---|---|---|"
for way in whole sliced; do
  if [ $way = whole ]; then rank_env CTRL_TEST_ZERO3_WHOLE_REF=1; else rank_env; fi
  t0=$(date +%s.%N)
  timed "$TMP/$way.log" "${MPI[@]}" "${ENV[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/$way" ||
    { tail -20 "$TMP/$way.log"; exit 1; }
  wall=$(seconds_since "$t0")
  rss=$(ranks_rss "$TMP/$way.log")
  cpu=$(ranks_cpu "$TMP/$way.log" "$STEPS")
  printf '| %s | %s | %s | %.1f | %s |\n' "$way" "$rss" "$cpu" "$wall" "$(last "$TMP/$way" loss)"
  grep -o "the reference model.*\|zero3: process memory.*\|after loading the model.*" "$TMP/$way.log" || true
  rm -f "$TMP/$way"/model*.safetensors
done
echo "load average after: $(load)"
