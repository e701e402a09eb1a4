#!/usr/bin/env python3
"""Checks that transformers loads what ctrl saves, sharded, in fp32 and bf16: each model of
tests/fixtures/save/ (written by save_pretrained, make_save_fixtures.py) is saved again by
`ctrl model convert` -- in its own dtype, in bf16 from fp32, in fp32 from bf16 -- with a
max_shard_size that shards it, then loaded by AutoModelForCausalLM; its logits must equal those
of the source loaded the same way, exactly (the same weights: bf16 -> fp32 and fp32 -> bf16 round
as torch does), its config the source's but for dtype. Run by hand after building:
    /work/venv/bin/python tests/reference/check_saved_shards.py build/ctrl
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "save")
CASES = [  # (fixture, --dtype, the dtype the saved model must have)
    ("llama_fp32", "auto", torch.float32),
    ("llama_fp32", "bf16", torch.bfloat16),
    ("llama_bf16", "auto", torch.bfloat16),
    ("llama_bf16", "fp32", torch.float32),
    ("qwen2_tied", "auto", torch.bfloat16),
    ("qwen3_moe", "auto", torch.bfloat16),
    ("qwen3_moe", "fp32", torch.float32),
]


def main():
    ctrl = sys.argv[1] if len(sys.argv) > 1 else "build/ctrl"
    ok = True
    ids = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as tmp:
        for name, dtype, want in CASES:
            src, out = os.path.join(FIX, name), os.path.join(tmp, f"{name}-{dtype}")
            subprocess.run([ctrl, "model", "convert", "--model", src, "--out", out, "--dtype", dtype,
                            "--max-shard-size", "4KB"], check=True, stdout=subprocess.DEVNULL)
            ref = AutoModelForCausalLM.from_pretrained(src, dtype=want).eval()
            ours = AutoModelForCausalLM.from_pretrained(out, dtype="auto").eval()
            with torch.no_grad():
                a, b = ref(input_ids=ids).logits, ours(input_ids=ids).logits
            with open(os.path.join(src, "config.json")) as f:
                cs = json.load(f)
            with open(os.path.join(out, "config.json")) as f:
                co = json.load(f)
            changed = sorted(k for k in set(cs) | set(co) if cs.get(k) != co.get(k))
            shards = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
            same = (ours.dtype == want and torch.equal(a, b) and changed in ([], ["dtype"])
                    and len(shards) > 1 and os.path.exists(os.path.join(out, "model.safetensors.index.json")))
            ok &= same
            print("%-10s --dtype %-4s -> %-14s %d shards, max |logits diff| %g, config keys changed %s: %s"
                  % (name, dtype, str(ours.dtype), len(shards), (a.float() - b.float()).abs().max().item(),
                     changed, "ok" if same else "MISMATCH"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
