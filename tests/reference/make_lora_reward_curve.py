#!/usr/bin/env python3
"""TRL's RewardTrainer with a PEFT LoRA adapter (task_type SEQ_CLS), for
tests/e2e/test_trl_reward_parity.c's lora_margin case.

On tests/fixtures/trl_reward/ (make_trl_reward_curves.py's pairs and the tiny
Qwen2ForSequenceClassification of tests/fixtures/score/qwen2): PEFT's get_peft_model with
LoraConfig(task_type SEQ_CLS, all-linear, r 8, lora_alpha 16, dropout 0, PEFT's default init), which
puts the score head among the modules_to_save (trained in full, saved as
base_model.model.score.weight). The initial adapter is saved with save_pretrained to
trl_reward/lora_init/ (ctrl starts from it, [peft] adapter_path: the same random A), then TRL's
RewardTrainer runs the margin_center case (batches of 4, center_rewards_coefficient 0.01, rows in
file order, fp32, 20 steps) on the PEFT model. Writes trl_reward/lora_margin.ini (the same run as a
ctrl config), trl_reward/lora_margin.trl.jsonl (per step: loss, grad_norm, learning_rate,
num_tokens, the reward metrics), trl_reward/lora_final/ (the adapter after the 20 steps, as PEFT
saves it: the test compares ctrl's saved adapter with it tensor by tensor) and
trl_reward/lora_final_scores.json (PeftModel.from_pretrained(score/qwen2, lora_final)'s scores of
the rows of score/qwen2/batch.json, each row alone: ctrl loads the same adapter and scores them).
Run by hand: /work/venv/bin/python tests/reference/make_lora_reward_curve.py
"""
import json
import os
import sys
import tempfile

import torch
from datasets import Dataset
from peft import LoraConfig, TaskType, get_peft_model
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from trl import RewardConfig, RewardTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_trl_reward_curves as base  # noqa: E402  (the reward cases' model, data, settings, recorder)
from fixture_io import save_peft_adapter  # noqa: E402

CASE = "lora_margin"


def save_adapter(pm, name):
    save_peft_adapter(pm, os.path.join(base.OUT, name), "score/qwen2")


def write_scores():
    from peft import PeftModel
    model = AutoModelForSequenceClassification.from_pretrained(base.MODEL, attn_implementation="eager",
                                                               dtype=torch.float32)
    pm = PeftModel.from_pretrained(model, os.path.join(base.OUT, "lora_final")).eval()
    with open(os.path.join(base.MODEL, "batch.json")) as f:
        rows = json.load(f)["rows"]
    with torch.no_grad():
        scores = [pm(input_ids=torch.tensor([r])).logits[0, 0].item() for r in rows]
    with open(os.path.join(base.OUT, "lora_final_scores.json"), "w") as f:
        json.dump({"rows": rows, "scores": scores, "note": "torch %s, peft %s (make_lora_reward_curve.py)" % (
            torch.__version__, __import__("peft").__version__)}, f)
    return scores


def main():
    if sys.argv[1:] == ["--scores"]:  # only lora_final_scores.json, from the committed lora_final/
        print(write_scores())
        return
    tok = AutoTokenizer.from_pretrained(base.TOK)
    model = AutoModelForSequenceClassification.from_pretrained(base.MODEL, attn_implementation="eager",
                                                               dtype=torch.float32)
    torch.manual_seed(7)
    pm = get_peft_model(model, LoraConfig(task_type=TaskType.SEQ_CLS, r=8, lora_alpha=16, lora_dropout=0.0,
                                          target_modules="all-linear", bias="none"))
    save_adapter(pm, "lora_init")
    rows = [json.loads(l) for l in open(os.path.join(base.OUT, "pairs.jsonl"))]
    rec = base.Record(base.KEYS)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        args = RewardConfig(output_dir=tmp, report_to=[], use_cpu=True, max_steps=base.STEPS, logging_steps=1,
                            save_strategy="no", optim="adamw_torch", dataloader_drop_last=False, bf16=False,
                            gradient_checkpointing=False, max_length=None, per_device_train_batch_size=4,
                            center_rewards_coefficient=0.01, **base.COMMON)
        trainer = base.sequential(RewardTrainer)(model=pm, args=args, train_dataset=Dataset.from_list(rows),
                                                 processing_class=tok, callbacks=[rec])
        trainer.train()
    save_adapter(trainer.model, "lora_final")
    write_scores()
    with open(os.path.join(base.OUT, CASE + ".trl.jsonl"), "w") as f:
        for r in rec.rows:
            f.write(json.dumps(r) + "\n")
    base.write_ini(CASE, {}, {"center_rewards_coefficient": "0.01"})
    with open(os.path.join(base.OUT, CASE + ".ini"), "a") as f:
        f.write("\n[peft]\nenabled = true\nadapter_path = @DIR@/lora_init\nlora_dropout = 0\n")
    print(CASE, " ".join("%.5f" % r["loss"] for r in rec.rows[:6]), "...", "%.5f" % rec.rows[-1]["loss"])


if __name__ == "__main__":
    main()
