#!/usr/bin/env bash
# Preference pairs for the reward-model quickstart (configs/reward-quickstart.ini), from the
# quickstart's SFT split (scripts/make_quickstart_data.sh): for each "a+b=" row, chosen the right
# sum and rejected a different number drawn uniformly from 0..98 (seeded), the held-out rows kept
# held out. usage: scripts/make_reward_pairs.sh DATA_DIR [SEED]  (writes DATA_DIR/{train,eval}_rm_pairs.jsonl)
set -euo pipefail
DIR=${1:?usage: make_reward_pairs.sh DATA_DIR [SEED]}
SEED=${2:-42}
pairs() {
  awk -v seed="$2" 'BEGIN { srand(seed) }
    { match($0, /"prompt": "[^"]*"/); p = substr($0, RSTART, RLENGTH)
      match($0, /"completion": "[0-9]+"/); c = substr($0, RSTART + 15, RLENGTH - 16) + 0
      do { w = int(rand() * 99) } while (w == c)
      printf "{%s, \"chosen\": \"%d\", \"rejected\": \"%d\"}\n", p, c, w }' "$1"
}
pairs "$DIR/train.jsonl" "$SEED" >"$DIR/train_rm_pairs.jsonl"
pairs "$DIR/eval.jsonl" "$((SEED + 1))" >"$DIR/eval_rm_pairs.jsonl"
echo "$DIR: $(wc -l < "$DIR/train_rm_pairs.jsonl") training pairs, $(wc -l < "$DIR/eval_rm_pairs.jsonl") held-out pairs"
