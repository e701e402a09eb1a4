#!/usr/bin/env python3
"""TRL's RewardTrainer loss curves on a tiny classifier, for tests/e2e/test_trl_reward_parity.c.

The Qwen2ForSequenceClassification of tests/fixtures/score/qwen2 (make_score_fixtures.py) with the
committed tiny_bpe tokenizer, arithmetic preference pairs with a `margin` column (chosen the right
sum, rejected a wrong one, margin 0 to 1); for each case TRL (CPU, fp32, rows in file order) runs
20 optimizer steps and writes tests/fixtures/trl_reward/<case>.ini (the same run as a ctrl config:
@DIR@ this folder, @MODEL@ the classifier with its tokenizer, @OUT@ the output directory) and
<case>.trl.jsonl (per step: loss, grad_norm, learning_rate, num_tokens and TRL's reward metrics).
Run by hand: /work/venv/bin/python tests/reference/make_trl_reward_curves.py
"""
import json
import os
import random
import sys
import tempfile

import torch
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from trl import RewardConfig, RewardTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_io import write_curve_ini, write_jsonl  # noqa: E402
from make_trl_sft_curves import Record, sequential  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
MODEL = os.path.join(FIX, "score", "qwen2")
TOK = os.path.join(FIX, "tokenizer", "tiny_bpe")
OUT = os.path.join(FIX, "trl_reward")
STEPS = 20
COMMON = dict(learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=2, weight_decay=0.01, max_grad_norm=1.0,
              adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, seed=42)
# case: (RewardConfig overrides, ctrl [train] lines, ctrl [reward] lines)
CASES = {
    "margin_center": (dict(per_device_train_batch_size=4, center_rewards_coefficient=0.01), {},
                      {"center_rewards_coefficient": "0.01"}),
    "grad_accum": (dict(per_device_train_batch_size=2, gradient_accumulation_steps=2), 
                   {"per_device_train_batch_size": "2", "gradient_accumulation_steps": "2"}, {}),
}
KEYS = ("loss", "grad_norm", "learning_rate", "num_tokens", "min_reward", "mean_reward", "max_reward", "accuracy",
        "margin")


def make_data():
    rng = random.Random(7)
    with open(os.path.join(OUT, "pairs.jsonl"), "w") as f:
        for _ in range(80):
            a, b = rng.randrange(100), rng.randrange(100)
            wrong = max(a + b + rng.choice([-10, -1, 1, 10, 23]), 0)
            f.write(json.dumps({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(wrong),
                                "margin": round(rng.random(), 3)}) + "\n")


def run_case(name, overrides):
    tok = AutoTokenizer.from_pretrained(TOK)
    model = AutoModelForSequenceClassification.from_pretrained(MODEL, attn_implementation="eager",
                                                               dtype=torch.float32)
    rows = [json.loads(l) for l in open(os.path.join(OUT, "pairs.jsonl"))]
    rec = Record(KEYS)
    with tempfile.TemporaryDirectory() as tmp:
        args = RewardConfig(output_dir=tmp, report_to=[], use_cpu=True, max_steps=STEPS, logging_steps=1,
                            save_strategy="no", optim="adamw_torch", dataloader_drop_last=False, bf16=False,
                            gradient_checkpointing=False, max_length=None, **dict(COMMON, **overrides))
        trainer = sequential(RewardTrainer)(model=model, args=args, train_dataset=Dataset.from_list(rows),
                                            processing_class=tok, callbacks=[rec])
        trainer.train()
    write_jsonl(os.path.join(OUT, name + ".trl.jsonl"), rec.rows)
    return rec.rows


def write_ini(name, train_opts, reward_opts):
    write_curve_ini(os.path.join(OUT, name + ".ini"), "reward", COMMON, STEPS, "@MODEL@", "@DIR@/pairs.jsonl",
                    train_opts, reward_opts)


def main():
    os.makedirs(OUT, exist_ok=True)
    make_data()
    for name, (overrides, train_opts, reward_opts) in CASES.items():
        torch.manual_seed(0)
        rows = run_case(name, overrides)
        write_ini(name, train_opts, reward_opts)
        print(name, " ".join("%.5f" % r["loss"] for r in rows[:6]), "...", "%.5f" % rows[-1]["loss"])


if __name__ == "__main__":
    main()
