#!/usr/bin/env bash
# zero3's sliced embeddings (issue 19): 2 ranks of SFT (mpirun, 1 thread each) on a
# Qwen2.5-0.5B-shaped model with its real vocabulary -- the Qwen3 tokenizer of
# /work/shared/data/tokenizers (or TOKENIZER), 151,936 rows tied to the LM head as Qwen2.5-0.5B's:
# 136 M parameters, 545 MB in fp32 -- and LAYERS of its 24 layers, with zero3 slicing the embeddings
# (now) against keeping them whole on every rank (CTRL_TEST_ZERO3_WHOLE_EMBED=1, before): each rank's
# peak resident memory and CPU time (/usr/bin/time: maximum RSS, user + system, loading included), the
# run's own accounting of parameters + gradients + optimizer state per rank between steps, zero3's
# resident parameters, and the final loss (the same both ways).
# usage: bench/distributed/bench_zero3_embed.sh BUILD_DIR [LAYERS STEPS TOKENIZER]
set -euo pipefail
BUILD=$1 LAYERS=${2:-2} STEPS=${3:-3} TOK=${4:-/work/shared/data/tokenizers/qwen3}
source "$(dirname "$0")/common.sh"
[ -f "$TOK/tokenizer.json" ] || { echo "SKIP: no tokenizer in $TOK"; exit 0; }
qwen_vocab_model "$TMP/model" "$LAYERS" "$TOK"
sft_ini "$TMP/run.ini" "$TMP/model" "$STEPS" 1
params=$("${C[@]}" model info "$TMP/model" | sed -n 's/^parameters *\([0-9]*\).*/\1/p')
machine
echo "model: Qwen2.5-0.5B-shaped, $LAYERS layers, vocabulary 151936 tied, $params parameters ($((params * 4 / 1048576)) MiB fp32); 2 ranks x 1 thread, $STEPS steps; load average $(load)"
echo "| zero3 embeddings | peak RSS per rank | CPU s per step per rank | parameters + gradients + optimizer state per rank between steps | final loss |"
echo "|---|---|---|---|---|"
for way in whole sliced; do
  if [ $way = whole ]; then rank_env CTRL_TEST_ZERO3_WHOLE_EMBED=1; else rank_env; fi
  timed "$TMP/$way.log" "${MPI[@]}" "${ENV[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/$way" \
    --set memory.strategies=zero3 || { tail -20 "$TMP/$way.log"; exit 1; }
  rss=$(ranks_rss "$TMP/$way.log")
  cpu=$(ranks_cpu "$TMP/$way.log" "$STEPS")
  acct=$(grep -o "per rank between steps at most [0-9]* bytes of parameters, gradients and optimizer state .* against [0-9]* unsharded: [0-9.]* of it" "$TMP/$way.log" |
    sed 's/.*at most \([0-9]*\) bytes.* against \([0-9]*\) unsharded: \([0-9.]*\) of it/\1 of \2 B (\3)/')
  echo "| $way | $rss | $cpu | $acct | $(last "$TMP/$way" loss) |"
  grep -o "zero3: parameters resident.*\|zero3: process memory.*\|after loading the model.*" "$TMP/$way.log" || true
  rm -f "$TMP/$way"/model*.safetensors
done
echo "load average after: $(load)"
