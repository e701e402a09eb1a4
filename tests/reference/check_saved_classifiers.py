#!/usr/bin/env python3
"""Checks that transformers loads the sequence classifiers (reward models) ctrl saves, unchanged:
for the Qwen2 and Llama classifiers of tests/fixtures/score, the directory ctrl saved and the
original are the same class with the same config.pad_token_id and num_labels, and give identical
scores on a right-padded random batch. Run by hand:
    mkdir -p /tmp/ctrl-saved-cls && CTRL_SAVE_TEST_DIR=/tmp/ctrl-saved-cls build/test_score
    /work/venv/bin/python tests/reference/check_saved_classifiers.py /tmp/ctrl-saved-cls
"""
import os
import sys

import torch
from transformers import AutoModelForSequenceClassification

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "score")


def main():
    saved_root = sys.argv[1]
    ok = True
    for arch in ("qwen2", "llama"):
        ref = AutoModelForSequenceClassification.from_pretrained(os.path.join(FIX, arch), dtype=torch.float32,
                                                                 attn_implementation="eager")
        ours = AutoModelForSequenceClassification.from_pretrained(os.path.join(saved_root, arch),
                                                                  dtype=torch.float32, attn_implementation="eager")
        torch.manual_seed(0)
        ids = torch.randint(1, ref.config.vocab_size, (3, 11))
        mask = torch.ones_like(ids)
        ids[1, 7:] = ref.config.pad_token_id
        mask[1, 7:] = 0
        with torch.no_grad():
            a = ref(input_ids=ids, attention_mask=mask).logits
            b = ours(input_ids=ids, attention_mask=mask).logits
        diff = (a - b).abs().max().item()
        same = (type(ref) is type(ours) and diff == 0.0 and ours.config.pad_token_id == ref.config.pad_token_id
                and ours.config.num_labels == 1)
        ok &= same
        print("%-6s %-32s max |score diff| = %g %s" % (arch, type(ours).__name__, diff, "ok" if same else "MISMATCH"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
