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
weights), from lora_init/. lora_padded_bf16_emb16: lora_padded_bf16 with the frozen (tied) embedding's
values rounded to bf16 before training (kept as fp32 tensors: the lookups return bf16-rounded rows,
autocast's head products round the same table to bf16 anyway) -- exactly what ctrl's [peft]
embedding_dtype = bf16 computes; its ini is lora_padded_bf16.ini with embedding_dtype = bf16 (and
lora_padded_bf16_auto.ini the same without the key: the default).
lora_padded_bf16_loaded (printed, not written: a measurement for docs/config-reference's choice of
the default): the base loaded with dtype=torch.bfloat16 (the embedding, norms and activations bf16,
the adapters fp32 as PEFT keeps them), TRL's bf16 = True.
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

# case: (initial adapter directory, use_dora, bf16, the embedding: None as loaded, "round" its values
# rounded to bf16, "loaded" the whole base loaded in bf16)
CASES = {"lora_padded": ("lora_init", False, False, None), "dora_padded": ("dora_init", True, False, None),
         "lora_padded_bf16": ("lora_init", False, True, None),
         "lora_padded_bf16_emb16": ("lora_init", False, True, "round"),
         "lora_padded_bf16_loaded": ("lora_init", False, True, "loaded")}


def run(case, init_name, use_dora, bf16, embed):
    tok = AutoTokenizer.from_pretrained(base.TOK)
    kw = {"dtype": torch.bfloat16} if embed == "loaded" else {}
    model = Qwen2ForCausalLM.from_pretrained(os.path.join(OUT, "model"), attn_implementation="eager", **kw)
    if embed == "round":
        with torch.no_grad():
            w = model.get_input_embeddings().weight
            w.copy_(w.to(torch.bfloat16).to(torch.float32))
    torch.manual_seed(7)
    pm = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                                          task_type="CAUSAL_LM", bias="none", use_dora=use_dora))
    if embed is None:  # the initial adapter (the same seed: the same A whatever the embedding)
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
    if embed == "loaded":
        ref = [json.loads(l) for l in open(os.path.join(OUT, "lora_padded_bf16.trl.jsonl"))]
        worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(rec.rows, ref))
        print(case, "worst relative loss difference from lora_padded_bf16 (autocast): %.3g" % worst)
        return
    with open(os.path.join(OUT, case + ".trl.jsonl"), "w") as f:
        for r in rec.rows:
            f.write(json.dumps(r) + "\n")
    opts = {"padding_free": "false"}
    if bf16:
        opts["dtype"] = "bf16"
    base.write_ini(case, "prompt_completion.jsonl", opts)
    with open(os.path.join(OUT, case + ".ini"), "a") as f:
        f.write("[peft]\nenabled = true\nadapter_path = @DIR@/%s\nlora_dropout = 0\n" % init_name)
        if bf16:  # the table as the reference held it (the default, auto, holds it in bf16 on the CPU)
            f.write("embedding_dtype = %s\n" % ("bf16" if embed == "round" else "fp32"))
    if bf16 and embed == "round":  # the same run at the default (_auto.ini: no embedding_dtype key)
        ini = open(os.path.join(OUT, case + ".ini")).read().replace("embedding_dtype = bf16\n", "")
        open(os.path.join(OUT, "lora_padded_bf16_auto.ini"), "w").write(ini)
    print(case, " ".join("%.5f" % r["loss"] for r in rec.rows[:6]), "...")


def main():
    for case, (init_name, use_dora, bf16, embed) in CASES.items():
        if not sys.argv[1:] or case in sys.argv[1:]:
            run(case, init_name, use_dora, bf16, embed)


if __name__ == "__main__":
    main()
