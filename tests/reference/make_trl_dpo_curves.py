#!/usr/bin/env python3
"""TRL's DPOTrainer loss curves on a tiny model, for tests/e2e/test_trl_dpo_parity.c.

Uses the model and tokenizer of tests/fixtures/trl_sft/ (make_trl_sft_curves.py) and writes
tests/fixtures/trl_dpo/: arithmetic preference pairs as prompt / chosen / rejected JSONL (chosen the
right sum, rejected a wrong one); then, for each case, runs TRL (CPU, fp32, dropout off, rows in file
order) for 20 optimizer steps and writes <case>.ini (the same run as a ctrl config, with @DIR@ for
this folder, @SFT@ for the trl_sft folder and @OUT@ for the output directory) and <case>.trl.jsonl
(per-step loss, grad_norm, learning_rate and every DPO metric as TRL logs them at logging_steps = 1),
and for the *_eval cases <case>.trl_eval.json (TRL's evaluate() on eval_pairs.jsonl after the steps).
Run by hand: python3 tests/reference/make_trl_dpo_curves.py [CASE...]
"""
import json
import os
import random
import sys
import tempfile

from datasets import Dataset
from transformers import AutoTokenizer, Qwen2ForCausalLM, TrainerCallback
from trl import DPOConfig, DPOTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_io import run_curve_cases, write_curve_ini, write_jsonl  # noqa: E402
from make_trl_sft_curves import Record, sequential  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
SFT = os.path.join(FIX, "trl_sft")
OUT = os.path.join(FIX, "trl_dpo")
TOK = os.path.join(FIX, "tokenizer", "tiny_bpe")
STEPS = 20

COMMON = dict(learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=2, weight_decay=0.01, max_grad_norm=1.0,
              adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, seed=42)

# case: (DPOConfig overrides, ctrl [train] lines, ctrl [dpo] lines)
CASES = {
    "sigmoid": (dict(per_device_train_batch_size=4), {}, {}),
    "sigmoid_sft_precompute_ga": (dict(per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                       loss_type=["sigmoid", "sft"], loss_weights=[1.0, 0.2], beta=0.5,
                                       precompute_ref_log_probs=True),
                                  {"per_device_train_batch_size": "2", "gradient_accumulation_steps": "2"},
                                  {"loss_type": "sigmoid,sft", "loss_weights": "1.0,0.2", "beta": "0.5",
                                   "precompute_ref_log_probs": "true"}),
    # TR-DPO: the reference mixed with the policy every 3 steps (TRL's SyncRefModelCallback)
    "sigmoid_tr_dpo": (dict(per_device_train_batch_size=4, sync_ref_model=True, ref_model_sync_steps=3,
                            ref_model_mixup_alpha=0.5),
                       {}, {"sync_ref_model": "true", "ref_model_sync_steps": "3", "ref_model_mixup_alpha": "0.5"}),
    # TR-DPO interrupted after step 10 (checkpoint) and resumed with resume_from_checkpoint: the
    # reference is the initial model again (TRL keeps no reference in checkpoints) and the syncs stay
    # at global steps 12, 15, 18 (state.global_step % ref_model_sync_steps)
    "sigmoid_tr_dpo_resumed": (dict(per_device_train_batch_size=4, sync_ref_model=True, ref_model_sync_steps=3,
                                    ref_model_mixup_alpha=0.5),
                               {}, {"sync_ref_model": "true", "ref_model_sync_steps": "3",
                                    "ref_model_mixup_alpha": "0.5"}),
    # with an eval set: TRL's evaluate() after the 20 steps (its eval_* metrics)
    "sigmoid_eval": (dict(per_device_train_batch_size=4, per_device_eval_batch_size=8),
                     {"per_device_eval_batch_size": "8"}, {}),
    "ipo_wpo_ld": (dict(per_device_train_batch_size=4, loss_type=["ipo"], use_weighting=True, ld_alpha=0.5),
                   {}, {"loss_type": "ipo", "use_weighting": "true", "ld_alpha": "0.5"}),
}
KEYS = ("loss", "grad_norm", "learning_rate", "entropy", "mean_token_accuracy", "num_tokens", "rewards/chosen",
        "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected",
        "logits/chosen", "logits/rejected")


def make_data():
    """120 training pairs, then 20 held-out ones, from one seeded stream."""
    rng = random.Random(5)
    for name, n in (("pairs.jsonl", 120), ("eval_pairs.jsonl", 20)):
        with open(os.path.join(OUT, name), "w") as f:
            for _ in range(n):
                a, b = rng.randrange(100), rng.randrange(100)
                wrong = a + b + rng.choice([-11, -10, -2, -1, 1, 2, 10, 11])
                f.write(json.dumps({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(max(wrong, 0))}) + "\n")


Sequential = sequential(DPOTrainer)


class StopAfter(TrainerCallback):
    """Stops training after `step` (the checkpoint saved there is what the resumed run loads)."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def run_case(name, overrides):
    tok = AutoTokenizer.from_pretrained(TOK)
    rows = [json.loads(l) for l in open(os.path.join(OUT, "pairs.jsonl"))]
    evals = [json.loads(l) for l in open(os.path.join(OUT, "eval_pairs.jsonl"))] if name.endswith("_eval") else None
    rec = Record(KEYS)
    resumed = name.endswith("_resumed")
    with tempfile.TemporaryDirectory() as tmp:
        for part in (("first", "second") if resumed else ("whole",)):
            model = Qwen2ForCausalLM.from_pretrained(os.path.join(SFT, "model"), attn_implementation="eager")
            ref = None if overrides.get("precompute_ref_log_probs") else \
                Qwen2ForCausalLM.from_pretrained(os.path.join(SFT, "model"), attn_implementation="eager")
            save = dict(save_strategy="steps", save_steps=10) if resumed else dict(save_strategy="no")
            args = DPOConfig(output_dir=tmp, report_to=[], use_cpu=True, max_steps=STEPS, logging_steps=1,
                             optim="adamw_torch", dataloader_drop_last=False, bf16=False,
                             gradient_checkpointing=False, **save, **dict(COMMON, **overrides))
            trainer = Sequential(model=model, ref_model=ref, args=args, train_dataset=Dataset.from_list(rows),
                                 eval_dataset=Dataset.from_list(evals) if evals else None, processing_class=tok,
                                 callbacks=[rec] + ([StopAfter(10)] if part == "first" else []))
            trainer.train(resume_from_checkpoint=os.path.join(tmp, "checkpoint-10") if part == "second" else None)
        if evals:
            with open(os.path.join(OUT, name + ".trl_eval.json"), "w") as f:
                json.dump({k: v for k, v in trainer.evaluate().items() if k.startswith("eval_")}, f)
    if resumed:  # TRL restarts num_tokens on resume (its token count is not in the checkpoint); ctrl's
        for r in rec.rows:  # goes on from the checkpoint, as the uninterrupted run's: not compared there
            if r["step"] > 10:
                r.pop("num_tokens", None)
    write_jsonl(os.path.join(OUT, name + ".trl.jsonl"), rec.rows)
    return rec.rows


def write_ini(name, train_opts, dpo_opts):
    write_curve_ini(os.path.join(OUT, name + ".ini"), "dpo", COMMON, STEPS, "@SFT@/model", "@DIR@/pairs.jsonl",
                    train_opts, dpo_opts, "@DIR@/eval_pairs.jsonl" if name.endswith("_eval") else None)


def main(names):
    run_curve_cases(names, OUT, CASES, make_data, lambda name, case: run_case(name, case[0]),
                    lambda name, case: write_ini(name, *case[1:]))


if __name__ == "__main__":
    main(sys.argv[1:])
