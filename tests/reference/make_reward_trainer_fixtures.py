#!/usr/bin/env python3
"""TRL 1.16's RewardTrainer on a fixed batch, for tests/trainer/test_trainer_reward.c.

The tiny Qwen2ForSequenceClassification of tests/fixtures/score/qwen2 (make_score_fixtures.py) and
the committed tiny_bpe tokenizer; four preference pairs given as text, tokenized as RewardTrainer
tokenizes them (prompt + completion as one string, the eos token appended: _prepare_dataset), one
rejected completion ending in the pad token. For each case, TRL's own compute_loss on the batch its
DataCollatorForPreference builds (chosen rows, then rejected, right-padded) and the backward:
the loss, TRL's logged metrics (min_reward, mean_reward, max_reward, accuracy, margin, num_tokens)
and the gradients of the score, the final norm and the last layer (grads_<case>.safetensors).
Cases: plain, margin (the optional `margin` column), center (center_rewards_coefficient = 0.01),
margin_center. Writes tests/fixtures/reward_trainer/. Run by hand:
    /work/venv/bin/python tests/reference/make_reward_trainer_fixtures.py
"""
import json
import os
import tempfile

import torch
import transformers
import trl
from datasets import Dataset
from safetensors.torch import save_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from trl import RewardConfig, RewardTrainer

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
MODEL = os.path.join(FIX, "score", "qwen2")
TOK = os.path.join(FIX, "tokenizer", "tiny_bpe")
OUT = os.path.join(FIX, "reward_trainer")
PAIRS = [
    ("What is 2+3?", " 5", " 6"),
    ("What is 7+5?", " 12", " twelve-ish, maybe 13"),
    ("Say hi.", " hi there", " no"),
    ("What is 10+11?", " 21", " 20<|endoftext|>"),
]
MARGINS = [0.5, 0.0, 1.25, -0.3]
CASES = {"plain": (False, None), "margin": (True, None), "center": (False, 0.01), "margin_center": (True, 0.01)}
KEPT = ("score.", "model.norm.", "model.layers.1.")


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(TOK)
    rows = []
    for (p, c, r), m in zip(PAIRS, MARGINS):
        rows.append({"prompt": p, "chosen": c, "rejected": r, "margin": m})
    summary = {"pairs": rows, "note": "torch %s, transformers %s, trl %s (make_reward_trainer_fixtures.py)" % (
        torch.__version__, transformers.__version__, trl.__version__), "cases": {}}
    for case, (use_margin, center) in CASES.items():
        model = AutoModelForSequenceClassification.from_pretrained(MODEL, dtype=torch.float32)
        data = [{k: v for k, v in row.items() if k != "margin" or use_margin} for row in rows]
        with tempfile.TemporaryDirectory() as tmp:
            args = RewardConfig(output_dir=tmp, report_to=[], per_device_train_batch_size=4, use_cpu=True,
                                center_rewards_coefficient=center, max_length=None, seed=0)
            trainer = RewardTrainer(model=model, args=args, train_dataset=Dataset.from_list(data),
                                    processing_class=tok)
            ds = trainer.train_dataset
            examples = [ds[i] for i in range(len(ds))]
            batch = trainer.data_collator(examples)
            model.train()
            loss = trainer.compute_loss(model, batch)
            loss.backward()
            metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
        grads = {n: p.grad.detach().contiguous() for n, p in model.named_parameters() if n.startswith(KEPT)}
        save_file(grads, os.path.join(OUT, "grads_%s.safetensors" % case))
        summary["cases"][case] = {"margin": use_margin, "center_rewards_coefficient": center, "loss": loss.item(),
                                  "metrics": metrics}
        summary["chosen_ids"] = [e["chosen_ids"] for e in examples]
        summary["rejected_ids"] = [e["rejected_ids"] for e in examples]
        summary["pad_token_id"] = tok.pad_token_id
        print(case, "loss %.6f" % loss.item(), metrics)
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
