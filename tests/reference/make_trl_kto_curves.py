#!/usr/bin/env python3
"""TRL's KTOTrainer loss curves on a tiny model, for tests/e2e/test_trl_kto_parity.c.

Uses the model and tokenizer of tests/fixtures/trl_sft/ (make_trl_sft_curves.py) and writes
tests/fixtures/trl_kto/: unpaired arithmetic rows as prompt / completion / label JSONL (the right sum
labelled desirable, a wrong one undesirable, mixed at random); then, for each case, runs TRL (CPU,
fp32, dropout off, rows in file order) for 20 optimizer steps and writes <case>.ini (the same run as
a ctrl config, with @DIR@ for this folder, @SFT@ for the trl_sft folder and @OUT@ for the output
directory) and <case>.trl.jsonl (per-step loss, grad_norm, learning_rate and every KTO metric as TRL
logs them at logging_steps = 1).
Run by hand: python3 tests/reference/make_trl_kto_curves.py [CASE...]
"""
import json
import os
import random
import sys
import tempfile

from datasets import Dataset
from transformers import AutoTokenizer, Qwen2ForCausalLM
from trl import KTOConfig, KTOTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_trl_dpo_curves import COMMON, FIX, SFT, STEPS, TOK  # noqa: E402
from fixture_io import run_curve_cases, write_curve_ini, write_jsonl  # noqa: E402
from make_trl_sft_curves import Record, sequential  # noqa: E402

OUT = os.path.join(FIX, "trl_kto")

# case: (KTOConfig overrides, ctrl [train] lines, ctrl [kto] lines)
CASES = {
    "kto": (dict(per_device_train_batch_size=4), {}, {}),
    "kto_weights_precompute_ga": (dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, beta=0.5,
                                       desirable_weight=1.33, undesirable_weight=0.7, precompute_ref_log_probs=True),
                                  {"per_device_train_batch_size": "2", "gradient_accumulation_steps": "2"},
                                  {"beta": "0.5", "desirable_weight": "1.33", "undesirable_weight": "0.7",
                                   "precompute_ref_log_probs": "true"}),
    "apo_zero_unpaired": (dict(per_device_train_batch_size=4, loss_type="apo_zero_unpaired", beta=0.5),
                          {}, {"loss_type": "apo_zero_unpaired", "beta": "0.5"}),
}
KEYS = ("loss", "grad_norm", "learning_rate", "entropy", "num_tokens", "kl", "rewards/chosen", "rewards/rejected",
        "rewards/margins", "logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected")


def make_data():
    """120 unpaired training rows from one seeded stream."""
    rng = random.Random(6)
    with open(os.path.join(OUT, "rows.jsonl"), "w") as f:
        for _ in range(120):
            a, b = rng.randrange(100), rng.randrange(100)
            good = rng.random() < 0.5
            wrong = a + b + rng.choice([-11, -10, -2, -1, 1, 2, 10, 11])
            f.write(json.dumps({"prompt": f"{a}+{b}=", "completion": str(a + b) if good else str(max(wrong, 0)),
                                "label": good}) + "\n")


Sequential = sequential(KTOTrainer)


def run_case(name, overrides):
    tok = AutoTokenizer.from_pretrained(TOK)
    model = Qwen2ForCausalLM.from_pretrained(os.path.join(SFT, "model"), attn_implementation="eager")
    ref = None if overrides.get("precompute_ref_log_probs") else \
        Qwen2ForCausalLM.from_pretrained(os.path.join(SFT, "model"), attn_implementation="eager")
    rows = [json.loads(l) for l in open(os.path.join(OUT, "rows.jsonl"))]
    rec = Record(KEYS)
    with tempfile.TemporaryDirectory() as tmp:
        args = KTOConfig(output_dir=tmp, report_to=[], use_cpu=True, max_steps=STEPS, logging_steps=1,
                         save_strategy="no", optim="adamw_torch", dataloader_drop_last=False, bf16=False,
                         gradient_checkpointing=False, **dict(COMMON, **overrides))
        trainer = Sequential(model=model, ref_model=ref, args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tok, callbacks=[rec])
        trainer.train()
    write_jsonl(os.path.join(OUT, name + ".trl.jsonl"), rec.rows)
    return rec.rows


def write_ini(name, train_opts, kto_opts):
    write_curve_ini(os.path.join(OUT, name + ".ini"), "kto", COMMON, STEPS, "@SFT@/model", "@DIR@/rows.jsonl",
                    train_opts, kto_opts)


def main(names):
    run_curve_cases(names, OUT, CASES, make_data, lambda name, case: run_case(name, case[0]),
                    lambda name, case: write_ini(name, *case[1:]))


if __name__ == "__main__":
    main(sys.argv[1:])
