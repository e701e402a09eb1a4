#!/usr/bin/env python3
"""Checks that transformers loads the model directories ctrl saves, unchanged: for each
architecture, the directory saved by ctrl (from tests/fixtures/models/<arch>) and the original
give identical logits on random tokens. Run by hand:
    mkdir -p /tmp/ctrl-saved && CTRL_SAVE_TEST_DIR=/tmp/ctrl-saved build/test_model_parity save_and_reload
    CTRL_SAVE_TEST_DIR=/tmp/ctrl-saved build/test_families gemma_save_and_reload
    python3 tests/reference/check_saved_models.py /tmp/ctrl-saved
(the families of tests/fixtures/families/ too, where the second command saved them)
"""
import os
import sys

import torch
from transformers import AutoModelForCausalLM

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "models")
FAMILIES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "families")


def main():
    saved_root = sys.argv[1]
    ok = True
    archs = [(FIX, a) for a in ("llama", "qwen2", "qwen3", "mistral")]
    archs += [(FAMILIES, a) for a in ("gemma2_gqa", "gemma2_mha", "gemma3_gqa", "gemma3_mha", "phi3_gqa", "phi3_mha", "qwen3_moe_a", "qwen3_moe_b", "mixtral", "olmoe") if os.path.isdir(os.path.join(saved_root, a))]
    for fix, arch in archs:
        ref = AutoModelForCausalLM.from_pretrained(os.path.join(fix, arch), dtype=torch.float32,
                                                   attn_implementation="eager")
        ours = AutoModelForCausalLM.from_pretrained(os.path.join(saved_root, arch), dtype=torch.float32,
                                                    attn_implementation="eager")
        ids = torch.randint(0, ref.config.vocab_size, (2, 19))
        with torch.no_grad():
            a, b = ref(input_ids=ids).logits, ours(input_ids=ids).logits
        diff = (a - b).abs().max().item()
        same = type(ref) is type(ours) and diff == 0.0
        ok &= same
        print("%-10s %-22s max |logits diff| = %g %s" % (arch, type(ours).__name__, diff, "ok" if same else "MISMATCH"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
