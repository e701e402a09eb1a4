#!/usr/bin/env python3
"""bf16 model parity fixtures: the models and packed batch of make_model_fixtures.py run under
torch.autocast("cpu", dtype=torch.bfloat16) with fp32 weights — what TRL's bf16 = True does — each
sequence on its own. Writes, next to each fixture model (tests/fixtures/models/<arch>/),
batch_bf16.json (per-token log-probs of the next tokens, mean loss) and grads_bf16.safetensors (the
gradient of that loss for every parameter). Run by hand after make_model_fixtures.py:
    python3 tests/reference/make_bf16_model_fixtures.py
"""
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "models")


def main():
    for arch in ("llama", "qwen2", "qwen3", "mistral"):
        d = os.path.join(DIR, arch)
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
        model.eval()
        batch = json.load(open(os.path.join(d, "batch.json")))
        cu, tokens = batch["cu_seqlens"], batch["tokens"]
        total = sum(cu[i + 1] - cu[i] - 1 for i in range(len(cu) - 1))
        logps, loss_sum = [], 0.0
        for i in range(len(cu) - 1):
            seq = torch.tensor(tokens[cu[i]:cu[i + 1]])
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(input_ids=seq[None]).logits[0]
            lp = torch.log_softmax(logits.float(), dim=-1)
            gathered = lp[:-1].gather(1, seq[1:, None])[:, 0]
            loss_sum = loss_sum + (-gathered.sum())
            logps += gathered.tolist() + [0.0]
        loss = loss_sum / total
        loss.backward()
        grads = {n: p.grad.detach().float().contiguous() for n, p in model.named_parameters()}
        if model.config.tie_word_embeddings:
            grads.pop("lm_head.weight", None)
        save_file(grads, os.path.join(d, "grads_bf16.safetensors"))
        with open(os.path.join(d, "batch_bf16.json"), "w") as f:
            json.dump({"logp": logps, "loss": loss.item(),
                       "note": "torch %s, transformers %s, autocast bf16 (make_bf16_model_fixtures.py)" % (
                           torch.__version__, transformers.__version__)}, f)
        print(arch, "loss %.6f (fp32 %.6f)" % (loss.item(), batch["loss"]))


if __name__ == "__main__":
    main()
