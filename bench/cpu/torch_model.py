#!/usr/bin/env python3
"""The PyTorch side of bench/cpu/run.sh: creates the random Qwen2-shaped model (saved for ctrl),
or times forward + backward of the same model on the same kind of batch, fp32 on the CPU
(MEMORY = checkpointing: with transformers' gradient checkpointing, non-reentrant as TRL sets it;
DTYPE = bf16: under torch.autocast(bfloat16), as TRL's bf16 = True).
usage: torch_model.py create DIR | torch_model.py time DIR SEQS SEQ_LEN STEPS THREADS [MEMORY] [DTYPE]"""
import contextlib
import resource
import sys
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config


def create(d):
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=256, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=16384, max_position_embeddings=2048,
                      tie_word_embeddings=True, rope_theta=1000000.0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(d)


def timed(d, B, L, steps, threads, memory="none", dtype="fp32"):
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    if memory == "checkpointing":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(0, model.config.vocab_size, (B, L))
    total, best = 0.0, 1e30
    for i in range(steps + 1):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext():
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        model.zero_grad(set_to_none=True)
        if i > 0:
            dt = time.perf_counter() - t0
            total, best = total + dt, min(best, dt)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("torch  %s threads=%d tokens/step %d %s memory %s: %.0f tokens/s (mean of %d steps; best step %.0f), peak RSS %.0f MiB"
          % (torch.__version__, threads, B * L, dtype, memory, B * L * steps / total, steps, B * L / best, rss))


if __name__ == "__main__":
    if sys.argv[1] == "create":
        create(sys.argv[2])
    else:
        timed(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]),
              sys.argv[7] if len(sys.argv) > 7 else "none", sys.argv[8] if len(sys.argv) > 8 else "fp32")
