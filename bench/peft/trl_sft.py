#!/usr/bin/env python3
"""TRL's side of bench/peft/memory.sh: SFTTrainer on the same model and data, 3 steps of 8 rows,
fp32 (or bf16=True: autocast, with DTYPE bf16), AdamW, with (1) or without (0) PEFT's
LoraConfig(all-linear, r 16, alpha 32, dropout 0). Prints one markdown row: peak RSS (ru_maxrss),
wall time, tokens/s (TRL's num_tokens over train_runtime), the process's CPU seconds per step after
the first (time.process_time() at each step's end: steps 2..N), last loss.
usage: trl_sft.py MODEL_DIR TRAIN_JSONL 0|1 [STEPS (3)] [DTYPE (fp32|bf16)]"""
import resource
import sys
import tempfile
import time

import torch
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import SFTConfig, SFTTrainer


class StepClock(TrainerCallback):
    """The process's CPU time at the end of each step."""

    def __init__(self):
        self.at = []

    def on_step_end(self, args, state, control, **kwargs):
        self.at.append(time.process_time())


def main():
    model_dir, data, use_peft = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    bf16 = len(sys.argv) > 5 and sys.argv[5] == "bf16"
    t0 = time.time()
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    ds = load_dataset("json", data_files=data, split="train")
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=8, learning_rate=1e-4,
                         logging_steps=1, save_strategy="no", report_to=[], bf16=bf16, use_cpu=True,
                         dataloader_num_workers=0)
        peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear",
                                 task_type="CAUSAL_LM") if use_peft else None
        clock = StepClock()
        trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok,
                             peft_config=peft_config, callbacks=[clock])
        result = trainer.train()
        cpu_step = (clock.at[-1] - clock.at[0]) / (len(clock.at) - 1) if len(clock.at) > 1 else float("nan")
        loss = [h["loss"] for h in trainer.state.log_history if "loss" in h][-1]
        tokens = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h][-1]
        tps = tokens / result.metrics["train_runtime"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print("| TRL %s%s | %d | — | %.1f | %.1f | %.2f | %.6f |" % (
        "+ PEFT LoRA" if use_peft else "full fine-tune", " (bf16 autocast)" if bf16 else "", peak,
        time.time() - t0, tps, cpu_step, loss))


if __name__ == "__main__":
    main()
