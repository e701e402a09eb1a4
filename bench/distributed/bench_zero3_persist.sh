#!/usr/bin/env bash
# zero3's persistent parameters ([memory] stage3_param_persistence_threshold, issue 19): 2 ranks of SFT
# (mpirun, 1 thread each) on a Qwen2.5-0.5B-shaped model with its real vocabulary (the Qwen3 tokenizer
# of /work/shared/data/tokenizers or TOKENIZER, 151,936 rows tied) and LAYERS of its 24 layers, at
# threshold 0 (the default), auto (10 x 896 = 8960 elements: the norms and the q/k/v biases whole on every
# rank) and 1e5 (DeepSpeed's own default: the same tensors at this shape; the k/v projections have
# 114,688): each rank's peak resident memory and CPU time (/usr/bin/time, loading included), the run's
# accounting per rank between steps (persistent bytes included: they are resident), what the step
# all-gathered (floats, collectives, tensors) and the final loss.
# usage: bench/distributed/bench_zero3_persist.sh BUILD_DIR [LAYERS STEPS TOKENIZER]
set -euo pipefail
BUILD=$1 LAYERS=${2:-2} STEPS=${3:-3} TOK=${4:-/work/shared/data/tokenizers/qwen3}
source "$(dirname "$0")/common.sh"
[ -f "$TOK/tokenizer.json" ] || { echo "SKIP: no tokenizer in $TOK"; exit 0; }
qwen_vocab_model "$TMP/model" "$LAYERS" "$TOK"
sft_ini "$TMP/run.ini" "$TMP/model" "$STEPS" 1
machine
echo "model: Qwen2.5-0.5B-shaped, $LAYERS layers, vocabulary 151936 tied; 2 ranks x 1 thread, $STEPS steps; load average $(load)"
echo "| threshold | kept whole | peak RSS per rank | CPU s per step per rank | wall s | per rank between steps (of unsharded) | the step's all-gathers | final loss |"
echo "|---|---|---|---|---|---|---|---|"
for t in 0 auto 1e5; do
  rank_env
  t0=$(date +%s.%N)
  timed "$TMP/$t.log" "${MPI[@]}" "${ENV[@]}" "${C[@]}" train "$TMP/run.ini" --set run.output_dir="$TMP/$t" \
    --set memory.strategies=zero3 --set memory.stage3_param_persistence_threshold=$t || { tail -20 "$TMP/$t.log"; exit 1; }
  wall=$(seconds_since "$t0")
  rss=$(ranks_rss "$TMP/$t.log")
  cpu=$(ranks_cpu "$TMP/$t.log" "$STEPS")
  acct=$(grep -o "per rank between steps at most [0-9]* bytes of parameters, gradients and optimizer state .* against [0-9]* unsharded: [0-9.]* of it" "$TMP/$t.log" |
    sed 's/.*at most \([0-9]*\) bytes.* against \([0-9]*\) unsharded: \([0-9.]*\) of it/\1 of \2 B (\3)/')
  kept=$(grep -o "elements: [0-9]* tensors, [0-9]* bytes" "$TMP/$t.log" | sed 's/elements: //')
  gath=$(grep -o "the step all-gathered [0-9]* parameter floats in [0-9]* collectives, [0-9]* tensors" "$TMP/$t.log" |
    sed 's/the step all-gathered \([0-9]*\) parameter floats in \([0-9]*\) collectives, \([0-9]*\) tensors/\1 floats, \2 collectives, \3 tensors/')
  printf '| %s | %s | %s | %s | %.0f | %s | %s | %s |\n' "$t" "$kept" "$rss" "$cpu" "$wall" "$acct" "$gath" "$(last "$TMP/$t" loss)"
  grep -o "zero3: parameters resident.*" "$TMP/$t.log" || true
  rm -f "$TMP/$t"/model*.safetensors
done
echo "load average after: $(load)"
