#!/usr/bin/env python3
"""Writes tests/fixtures/save/: small random models saved by transformers' own save_pretrained with a
max_shard_size small enough to shard them -- each loaded with from_pretrained first, as a trainer
(TRL) holds the model it saves --, for tests/model/test_save.c, which loads each with ctrl,
saves it with ctrl and compares the directory with transformers' (index, shard layout, tensor
bytes, config.json, generation_config.json), and checks ctrl's log-probs on the sharded weights.

  llama_fp32/   LlamaForCausalLM, float32, max_shard_size="5KB" (6 shards, each layer across two);
                config.json with an eos_token_id list and a key ctrl does not read,
                generation_config.json with sampling defaults
  llama_bf16/   the same weights .to(torch.bfloat16), max_shard_size="5KB" (3 shards)
  qwen2_tied/   Qwen2ForCausalLM (q/k/v biases, tied embeddings), bfloat16, max_shard_size="3KB"
                (7 shards: the 4096-byte embedding, larger than the limit, in a shard of its own)
  qwen3_moe/    Qwen3MoeForCausalLM (4 experts), bfloat16, max_shard_size="2KB": transformers 5 holds each
                layer's experts fused and saves them as views of one tensor, which the split keeps in
                one shard (all experts' down_proj, then gate_proj, then up_proj, then the router)
  logp.json     the tokens and, per model, transformers' log-probs of each next token (float32
                forward; the bf16 models' weights upcast, as ctrl holds them)
  f16.safetensors  x (float32 values around every rounding case of half precision) and h = x.half()

Run from the repository root: /work/venv/bin/python tests/reference/make_save_fixtures.py
"""
import json
import os
import shutil
import tempfile

import torch
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "save")


def llama():
    cfg = LlamaConfig(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=8, vocab_size=64, max_position_embeddings=128,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=[2, 3], initializer_range=0.5,
                      rms_norm_eps=1e-6)
    cfg.ctrl_fixture_note = "a key ctrl does not read: carried over as is"
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).eval()
    m.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=[2, 3], do_sample=True,
                                           temperature=0.7, top_p=0.9)
    return m


def qwen2():
    cfg = Qwen2Config(hidden_size=32, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=64, max_position_embeddings=128,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, initializer_range=0.5)
    torch.manual_seed(1)
    return Qwen2ForCausalLM(cfg).eval()


def qwen3_moe():
    cfg = Qwen3MoeConfig(hidden_size=16, intermediate_size=32, moe_intermediate_size=8, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, vocab_size=64, num_experts=4,
                         num_experts_per_tok=2, max_position_embeddings=128, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2, initializer_range=0.5)
    torch.manual_seed(3)
    return Qwen3MoeForCausalLM(cfg).eval()


def trained(directory, dtype):
    """The model as a trainer holds it: loaded with from_pretrained. Its save_pretrained orders the
    state_dict by dot_natural_key (revert_weight_conversion), where a model built in Python keeps
    its modules' order: a trained model's shards are the former's."""
    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)


def logp(directory, ids):
    """The saved directory loaded in float32 (bf16 weights upcast, RoPE tables computed in float32:
    a model .to(bfloat16) rounds its inv_freq buffer too), as ctrl loads it."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    lp = torch.log_softmax(logits[:-1].double(), -1)
    return [lp[t, ids[t + 1]].item() for t in range(len(ids) - 1)]


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    ids = [1, 17, 42, 5, 63, 8, 30, 2, 11, 54]
    out = {"tokens": ids}
    with tempfile.TemporaryDirectory() as tmp:
        llama().save_pretrained(os.path.join(tmp, "llama"))
        qwen2().save_pretrained(os.path.join(tmp, "qwen2"))
        qwen3_moe().save_pretrained(os.path.join(tmp, "qwen3_moe"))
        trained(os.path.join(tmp, "llama"), torch.float32).save_pretrained(os.path.join(OUT, "llama_fp32"),
                                                                           max_shard_size="5KB")
        trained(os.path.join(tmp, "llama"), torch.bfloat16).save_pretrained(os.path.join(OUT, "llama_bf16"),
                                                                            max_shard_size="5KB")
        trained(os.path.join(tmp, "qwen2"), torch.bfloat16).save_pretrained(os.path.join(OUT, "qwen2_tied"),
                                                                            max_shard_size="3KB")
        trained(os.path.join(tmp, "qwen3_moe"), torch.bfloat16).save_pretrained(os.path.join(OUT, "qwen3_moe"),
                                                                                max_shard_size="2KB")
    for name in ("llama_fp32", "llama_bf16", "qwen2_tied", "qwen3_moe"):
        out[name] = logp(os.path.join(OUT, name), ids)
    with open(os.path.join(OUT, "logp.json"), "w") as f:
        json.dump(out, f)
    e = [0.0, -0.0, 1.0, -1.0, 1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-11 + 2**-20, 65504.0, 65519.99, 65520.0,
         -65520.0, 1e6, float("inf"), float("-inf"), float("nan"), 2**-24, 2**-25, 1.5 * 2**-25, 2**-26,
         2**-14, 2**-14 * (1 - 2**-11), 3 * 2**-25, 5 * 2**-25, 2**-15 + 2**-25, 6.1e-5, 1e-8, -3e-7]
    torch.manual_seed(2)
    x = torch.cat([torch.tensor(e, dtype=torch.float32),
                   torch.randn(200) * torch.pow(10.0, torch.randint(-9, 6, (200,)).float())])
    save_file({"x": x, "h": x.half()}, os.path.join(OUT, "f16.safetensors"))
    for d in sorted(os.listdir(OUT)):
        p = os.path.join(OUT, d)
        print(d, sorted(os.listdir(p)) if os.path.isdir(p) else os.path.getsize(p))


if __name__ == "__main__":
    main()
