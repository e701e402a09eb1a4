#!/usr/bin/env python3
"""TRL + PEFT's SFT loss curves with LoRA, for tests/e2e/test_trl_parity.c's lora_padded,
dora_padded and lora_padded_bf16 cases.

On tests/fixtures/trl_sft/ (make_trl_sft_curves.py's tiny Qwen2 model and arithmetic data): PEFT's
get_peft_model with LoraConfig(all-linear, r 8, lora_alpha 16, dropout 0, PEFT's default init:
A Kaiming-uniform, B zero), the initial adapter saved with PEFT's save_pretrained to
trl_sft/lora_init/ (ctrl starts from it: [peft] adapter_path, so that both begin from the same
random A), then TRL's SFTTrainer as the `padded` case (rows in file order, fp32, 20 steps) on the
PEFT model. Writes trl_sft/lora_padded.ini (the same run as a ctrl config) and
trl_sft/lora_padded.trl.jsonl (per-step loss, grad_norm, learning_rate, entropy,
mean_token_accuracy, num_tokens).
dora_padded: the same with use_dora=True (its initial adapter, magnitudes included, in
trl_sft/dora_init/). lora_padded_bf16: lora_padded under TRL's bf16 = True (autocast, fp32 master
weights), from lora_init/.
Run by hand (after make_trl_sft_curves.py; all cases, or the ones named):
    /work/venv/bin/python tests/reference/make_lora_sft_curve.py [CASE ...]
"""
import json
import os
import sys
import tempfile

import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoTokenizer, Qwen2ForCausalLM
from trl import SFTConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_trl_sft_curves as base  # noqa: E402  (the padded case's settings, sampler and recorder)
from fixture_io import save_peft_adapter  # noqa: E402

OUT = base.OUT

# case: (initial adapter directory, use_dora, bf16)
CASES = {"lora_padded": ("lora_init", False, False), "dora_padded": ("dora_init", True, False),
         "lora_padded_bf16": ("lora_init", False, True)}


def run(case, init_name, use_dora, bf16):
    tok = AutoTokenizer.from_pretrained(base.TOK)
    model = Qwen2ForCausalLM.from_pretrained(os.path.join(OUT, "model"), attn_implementation="eager")
    torch.manual_seed(7)
    pm = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                                          task_type="CAUSAL_LM", bias="none", use_dora=use_dora))
    save_peft_adapter(pm, os.path.join(OUT, init_name), "model")
    rows = [json.loads(l) for l in open(os.path.join(OUT, "prompt_completion.jsonl"))]
    rec = base.Record()
    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(output_dir=tmp, report_to=[], use_cpu=True, max_steps=base.STEPS, logging_steps=1,
                         save_strategy="no", optim="adamw_torch", dataloader_drop_last=False,
                         **dict(base.COMMON, bf16=bf16, per_device_train_batch_size=4))
        trainer = base.Sequential(model=pm, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                                  callbacks=[rec])
        trainer.train()
    with open(os.path.join(OUT, case + ".trl.jsonl"), "w") as f:
        for r in rec.rows:
            f.write(json.dumps(r) + "\n")
    opts = {"padding_free": "false"}
    if bf16:
        opts["dtype"] = "bf16"
    base.write_ini(case, "prompt_completion.jsonl", opts)
    with open(os.path.join(OUT, case + ".ini"), "a") as f:
        f.write("[peft]\nenabled = true\nadapter_path = @DIR@/%s\nlora_dropout = 0\n" % init_name)
    print(case, " ".join("%.5f" % r["loss"] for r in rec.rows[:6]), "...")


def main():
    for case, (init_name, use_dora, bf16) in CASES.items():
        if not sys.argv[1:] or case in sys.argv[1:]:
            run(case, init_name, use_dora, bf16)


if __name__ == "__main__":
    main()
