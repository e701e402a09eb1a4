#!/usr/bin/env python3
"""Checks that PEFT loads the reward-model adapter ctrl trains (task_type SEQ_CLS, the score among
the modules_to_save): test_trl_reward_parity's lora_margin run, kept with CTRL_LORA_EXPORT_DIR, is
loaded with PeftModel.from_pretrained over tests/fixtures/score/qwen2; every tensor of ctrl's file
must land in the PEFT model (the LoRA weights and score.modules_to_save.default.weight equal to the
file's), and the scores of score/qwen2/batch.json's rows must equal those of the adapter PEFT saved
after TRL's own 20 steps (trl_reward/lora_final_scores.json) within 1e-4 relative. Run by hand:
    mkdir -p /tmp/ctrl-reward && CTRL_LORA_EXPORT_DIR=/tmp/ctrl-reward build/test_trl_reward_parity
    /work/venv/bin/python tests/reference/check_peft_reward_adapter.py /tmp/ctrl-reward/reward_lora_margin
"""
import json
import os
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")


def main():
    adapter = sys.argv[1]
    base = AutoModelForSequenceClassification.from_pretrained(os.path.join(FIX, "score", "qwen2"),
                                                              dtype=torch.float32, attn_implementation="eager")
    pm = PeftModel.from_pretrained(base, adapter).eval()
    print("PEFT task_type %s, modules_to_save %s" % (pm.peft_config["default"].task_type,
                                                     pm.peft_config["default"].modules_to_save))
    params = dict(pm.named_parameters())
    ok = True
    for name, t in load_file(os.path.join(adapter, "adapter_model.safetensors")).items():
        n = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")
        if n.endswith("score.weight"):
            n = n.replace("score.weight", "score.modules_to_save.default.weight")
        p = params.get(n)
        same = p is not None and torch.equal(p.detach(), t)
        ok &= same
        if not same:
            print("FAIL: %s is not %s in the PEFT model" % (name, n))
    with open(os.path.join(FIX, "trl_reward", "lora_final_scores.json")) as f:
        want = json.load(f)
    with torch.no_grad():
        got = [pm(input_ids=torch.tensor([r])).logits[0, 0].item() for r in want["rows"]]
    a, b = torch.tensor(got, dtype=torch.float64), torch.tensor(want["scores"], dtype=torch.float64)
    rel = ((a - b).norm() / b.norm()).item()
    ok &= rel <= 1e-4
    print("scores under ctrl's adapter %s\nscores under TRL+PEFT's      %s\nrelative L2 %.2e %s" % (
        ["%.6f" % x for x in got], ["%.6f" % x for x in want["scores"]], rel, "ok" if rel <= 1e-4 else "FAIL"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
