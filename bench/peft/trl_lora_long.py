#!/usr/bin/env python3
"""TRL + PEFT's side of bench/peft/lora_sft_long.sh: SFTTrainer with PEFT's LoraConfig(all-linear,
r 16, alpha 32, dropout 0) on the same model and text rows, AdamW, lr 1e-4, bf16=True, one thread
(OMP_NUM_THREADS). MODE autocast: the base loaded in fp32 under torch.autocast(bfloat16), as ctrl's
[train] dtype = bf16 computes; MODE bf16: the base loaded with dtype=torch.bfloat16 (the common
practice; PEFT keeps the adapters in fp32); MODE fp32: the base in fp32 and bf16=False (what a CPU
without AVX-512 gets at a usable speed: torch's bf16 matmul there is ATen's slow fallback); a suffix
+keep (autocast+keep, bf16+keep, fp32+keep): SFTConfig's gradient_checkpointing = False (its default
True recomputes each layer in backward). Prints one
markdown row: peak RSS (ru_maxrss), wall time of the whole process, CPU seconds of trainer.train()
(process time), CPU seconds per step after the first (process time at each step's end), tokens/s by
wall (TRL's num_tokens over train_runtime) and by CPU time, last loss.
With TOKENS (comma-separated token ids) the LoraConfig has trainable_token_indices=TOKENS.
usage: trl_lora_long.py MODEL_DIR TRAIN_JSONL autocast|bf16|fp32[+keep] STEPS BATCH [TOKENS]"""
import resource
import sys
import tempfile
import time

import torch
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer


class StepCPU(TrainerCallback):
    """process_time() at each step's end."""

    def __init__(self):
        self.at = []

    def on_step_end(self, args, state, control, **kwargs):
        self.at.append(time.process_time())


def main():
    model_dir, data, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    keep = mode.endswith("+keep")
    mode = mode[: -len("+keep")] if keep else mode
    if mode not in ("autocast", "bf16", "fp32"):
        raise SystemExit(f"trl_lora_long.py: mode {mode!r}: one of autocast, bf16, fp32 (each may end in +keep)")
    steps, batch = int(sys.argv[4]), int(sys.argv[5])
    t0 = time.time()
    torch.manual_seed(1)
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    tok = AutoTokenizer.from_pretrained(model_dir)
    ds = load_dataset("json", data_files=data, split="train")
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=batch, learning_rate=1e-4,
                         logging_steps=1, save_strategy="no", report_to=[], bf16=mode != "fp32", use_cpu=True,
                         dataloader_num_workers=0, max_length=1024,
                         gradient_checkpointing=not keep)
        tokens = [int(t) for t in sys.argv[6].split(",")] if len(sys.argv) > 6 and sys.argv[6] else None
        peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                 task_type="CAUSAL_LM", trainable_token_indices=tokens)
        step_cpu = StepCPU()
        trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok,
                             peft_config=peft_config, callbacks=[step_cpu])
        c0 = time.process_time()
        result = trainer.train()
        cpu = time.process_time() - c0
        loss = [h["loss"] for h in trainer.state.log_history if "loss" in h][-1]
        tokens = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h][-1]
        tps = tokens / result.metrics["train_runtime"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    name = {"autocast": "TRL + PEFT, fp32 base, autocast bf16", "bf16": "TRL + PEFT, base loaded in bf16",
            "fp32": "TRL + PEFT, fp32 (no autocast)"}[mode]
    name += ", no gradient checkpointing" if keep else ""
    at = step_cpu.at
    cps = "%.2f" % ((at[-1] - at[0]) / (len(at) - 1)) if len(at) > 1 else "-"
    print("| %s | %d | %.1f | %.1f | %s | %.1f | %.1f | %.0f | %.6f |" % (name, peak, time.time() - t0, cpu, cps,
                                                                      tps, tokens / cpu, tokens, loss))


if __name__ == "__main__":
    main()
