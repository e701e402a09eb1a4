#!/usr/bin/env python3
"""Greedy generation by transformers (model.generate, do_sample=False, no EOS) on the tiny fixture
models (tests/fixtures/models/{llama,qwen2,qwen3,mistral}), for tests/unit/test_generation.c: for two
prompts of random ids per model, the 12 generated ids and the logits after the prompt. Writes
tests/fixtures/generation/<arch>.json. Run by hand."""
import json
import os

import torch
from transformers import AutoModelForCausalLM

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")


def main():
    g = torch.Generator().manual_seed(17)
    for arch in ("llama", "qwen2", "qwen3", "mistral"):
        model = AutoModelForCausalLM.from_pretrained(os.path.join(FIX, "models", arch), dtype=torch.float32,
                                                     attn_implementation="eager").eval()
        cases = []
        for n in (5, 23):
            prompt = torch.randint(0, model.config.vocab_size, (1, n), generator=g)
            with torch.no_grad():
                logits = model(prompt).logits[0, -1]
                out = model.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0,
                                     min_new_tokens=12)
            cases.append({"prompt": prompt[0].tolist(), "generated": out[0, n:].tolist(),
                          "first_logits": logits.tolist()})
        with open(os.path.join(FIX, "generation", arch + ".json"), "w") as f:
            json.dump(cases, f)
        print(arch, [c["generated"] for c in cases])


if __name__ == "__main__":
    main()
