#!/usr/bin/env bash
# The main job on a fresh machine: install dependencies, build, and run configs/quickstart.ini.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
CTRL=(./build/ctrl --plugin-dir build/plugins)
"${CTRL[@]}" plugins
# Data and model the project makes itself: no downloads.
bash scripts/make_quickstart_data.sh runs/quickstart-data
"${CTRL[@]}" model init --arch qwen2 --hidden 128 --layers 2 --heads 4 --kv-heads 2 \
  --tokenizer tests/fixtures/tokenizer/tiny_bpe --out runs/quickstart-model
"${CTRL[@]}" config check configs/quickstart.ini # the config, and the files it names
"${CTRL[@]}" train configs/quickstart.ini
echo "metrics: runs/quickstart/metrics.jsonl (first and last lines below); model: runs/quickstart/"
head -n 1 runs/quickstart/metrics.jsonl
tail -n 2 runs/quickstart/metrics.jsonl
# Then GRPO on the SFT model with the accuracy reward (configs/grpo-quickstart.ini, ~20 s).
"${CTRL[@]}" train configs/grpo-quickstart.ini
echo "GRPO held-out accuracy (sampled), before -> after:" \
  "$(grep -o '"eval_rewards/acc/mean": [0-9.]*' runs/grpo-quickstart/metrics.jsonl | head -n 1 | cut -d' ' -f2)" '->' \
  "$(grep -o '"eval_rewards/acc/mean": [0-9.]*' runs/grpo-quickstart/metrics.jsonl | tail -n 1 | cut -d' ' -f2)"
# PPO on the SFT model with a value model and the accuracy reward (configs/ppo-quickstart.ini, ~2 min).
"${CTRL[@]}" train configs/ppo-quickstart.ini
echo "PPO held-out accuracy (sampled), before -> after:" \
  "$(grep -o '"eval_rewards/acc/mean": [0-9.]*' runs/ppo-quickstart/metrics.jsonl | head -n 1 | cut -d' ' -f2)" '->' \
  "$(grep -o '"eval_rewards/acc/mean": [0-9.]*' runs/ppo-quickstart/metrics.jsonl | tail -n 1 | cut -d' ' -f2)"
# And DPO with the preference pairs, from the SFT run's step-2000 checkpoint (configs/dpo-quickstart.ini, ~20 s).
"${CTRL[@]}" train configs/dpo-quickstart.ini
echo "DPO held-out reward accuracy and exact match, before -> after:" \
  "$(grep -o '"eval_rewards/accuracies": [0-9.]*' runs/dpo-quickstart/metrics.jsonl | head -n 1 | cut -d' ' -f2)" '->' \
  "$(grep -o '"eval_rewards/accuracies": [0-9.]*' runs/dpo-quickstart/metrics.jsonl | tail -n 1 | cut -d' ' -f2)," \
  "$(grep -o '"eval_exact_match": [0-9.]*' runs/dpo-quickstart/metrics.jsonl | head -n 1 | cut -d' ' -f2)" '->' \
  "$(grep -o '"eval_exact_match": [0-9.]*' runs/dpo-quickstart/metrics.jsonl | tail -n 1 | cut -d' ' -f2)"
# And KTO on the SFT model with the same pairs unpaired (configs/kto-quickstart.ini, ~15 s).
"${CTRL[@]}" train configs/kto-quickstart.ini
echo "KTO held-out reward margin, before -> after:" \
  "$(grep -o '"eval_rewards/margins": [-0-9.e]*' runs/kto-quickstart/metrics.jsonl | head -n 1 | cut -d' ' -f2)" '->' \
  "$(grep -o '"eval_rewards/margins": [-0-9.e]*' runs/kto-quickstart/metrics.jsonl | tail -n 1 | cut -d' ' -f2)"
