#!/usr/bin/env python3
"""Model parity fixtures: tiny random Llama, Qwen2, Qwen3 and Mistral models from transformers
(float32, eager attention), saved as HF directories under tests/fixtures/models/<arch>/, with a
packed batch of three sequences and what transformers computes for it: per-token log-probs of
the next tokens, the mean loss, and the gradient of that loss for every parameter
(grads.safetensors, under the parameter names). Each sequence is run on its own, which is what a
packed, padding-free batch must reproduce. Run by hand:
    python3 tests/reference/make_model_fixtures.py
"""
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from fixture_io import randomize_params
from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, AutoModelForCausalLM

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "models")
COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=512,
              rms_norm_eps=1e-6, rope_theta=10000.0, attn_implementation="eager")
ARCHS = {
    "llama": (LlamaConfig, dict(tie_word_embeddings=False)),
    "qwen2": (Qwen2Config, dict(tie_word_embeddings=True)),
    "qwen3": (Qwen3Config, dict(tie_word_embeddings=False)),
    "mistral": (MistralConfig, dict(tie_word_embeddings=False, sliding_window=4)),
}
LENGTHS = [7, 12, 5]


def main():
    for arch, (Cfg, extra) in ARCHS.items():
        torch.manual_seed(1000 + len(arch))
        kw = dict(COMMON)
        kw.update(extra)
        rope_theta = kw.pop("rope_theta")
        cfg = Cfg(**kw)
        try:
            cfg.rope_theta = rope_theta
        except Exception:
            pass
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.config._attn_implementation = "eager"
        randomize_params(model, torch)
        model.eval()
        d = os.path.join(OUT, arch)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        tokens, positions, targets, logps, cu = [], [], [], [], [0]
        total = sum(L - 1 for L in LENGTHS)
        loss_sum = 0.0
        for L in LENGTHS:
            seq = torch.randint(0, cfg.vocab_size, (L,))
            logits = model(input_ids=seq[None]).logits[0]
            lp = torch.log_softmax(logits.float(), dim=-1)
            tgt = torch.cat([seq[1:], torch.tensor([-100])])
            gathered = lp[:-1].gather(1, seq[1:, None])[:, 0]
            loss_sum = loss_sum + (-gathered.sum())
            tokens += seq.tolist()
            positions += list(range(L))
            targets += tgt.tolist()
            logps += gathered.tolist() + [0.0]
            cu.append(cu[-1] + L)
        loss = loss_sum / total
        loss.backward()
        grads = {n: p.grad.detach().contiguous() for n, p in model.named_parameters()}
        if cfg.tie_word_embeddings:
            grads.pop("lm_head.weight", None)
        save_file(grads, os.path.join(d, "grads.safetensors"))
        with open(os.path.join(d, "batch.json"), "w") as f:
            json.dump({"tokens": tokens, "positions": positions, "targets": targets, "cu_seqlens": cu,
                       "logp": logps, "loss": loss.item(),
                       "note": "torch %s, transformers %s (make_model_fixtures.py)" % (torch.__version__,
                                                                                        transformers.__version__)}, f)
        print(arch, "loss %.6f" % loss.item(), "params", sum(p.numel() for p in model.parameters()))


if __name__ == "__main__":
    main()
