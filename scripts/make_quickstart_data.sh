#!/usr/bin/env bash
# Synthetic SFT data for the quickstart: "a+b=" -> "c" for a, b in 0..49, prompt-completion
# JSONL, a seeded shuffle, 10% of the pairs held out for evaluation (never seen in training);
# and the same split as prompt-only rows with a `solution` column for the GRPO quickstart, and as
# preference pairs {prompt, chosen, rejected} for the reward-model and DPO quickstarts.
# usage: scripts/make_quickstart_data.sh OUT_DIR [SEED]
set -euo pipefail
OUT=${1:?usage: make_quickstart_data.sh OUT_DIR [SEED]}
SEED=${2:-42}
mkdir -p "$OUT"
awk -v seed="$SEED" -v out="$OUT" 'BEGIN {
  srand(seed); n = 0
  for (a = 0; a < 50; a++) for (b = 0; b < 50; b++) { key[n] = rand(); A[n] = a; B[n] = b; n++ }
  # order by the random key (insertion sort on indices is fine for 2500 rows)
  for (i = 0; i < n; i++) idx[i] = i
  for (i = 1; i < n; i++) { j = i; while (j > 0 && key[idx[j-1]] > key[idx[j]]) { t = idx[j]; idx[j] = idx[j-1]; idx[j-1] = t; j-- } }
  held = int(n / 10)
  for (i = 0; i < n; i++) {
    k = idx[i]
    line = sprintf("{\"prompt\": \"%d+%d=\", \"completion\": \"%d\"}", A[k], B[k], A[k] + B[k])
    if (i < held) print line > (out "/eval.jsonl"); else print line > (out "/train.jsonl")
    # the same split as prompt-only rows with the answer in a column, for the GRPO quickstart
    pline = sprintf("{\"prompt\": \"%d+%d=\", \"solution\": \"%d\"}", A[k], B[k], A[k] + B[k])
    if (i < held) print pline > (out "/eval_prompts.jsonl"); else print pline > (out "/train_prompts.jsonl")
    # and as preference pairs (reward model, DPO): chosen the right sum, rejected a wrong one
    # (off by 1, 2 or 10 either way, never negative)
    d = split("1 2 10", off, " "); w = A[k] + B[k] + (rand() < 0.5 ? -1 : 1) * off[1 + int(rand() * 3)]
    if (w < 0) w = A[k] + B[k] + 1
    rline = sprintf("{\"prompt\": \"%d+%d=\", \"chosen\": \"%d\", \"rejected\": \"%d\"}", A[k], B[k], A[k] + B[k], w)
    if (i < held) print rline > (out "/eval_pairs.jsonl"); else print rline > (out "/train_pairs.jsonl")
  }
}'
echo "$OUT: $(wc -l < "$OUT/train.jsonl") training rows, $(wc -l < "$OUT/eval.jsonl") held-out rows"
