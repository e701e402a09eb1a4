#!/usr/bin/env python3
"""Greedy generation under a LoRA adapter, computed by PEFT itself: the adapter fixtures of
make_lora_fixtures.py named below, loaded with peft.PeftModel.from_pretrained over their base model
(tests/fixtures/<base>), in eval mode; from two prompts, model.generate greedy (12 new tokens, no
EOS), the log-prob of each generated token (output_scores, log_softmax) and the logits after the
prompt. Written to tests/fixtures/lora/<case>/generation.json; the MoE expert adapters
(target_parameters) are what ctrl serve --lora's adapter bank is checked against
(tests/unit/test_lora_decode.c).
Run by hand:
    /work/venv/bin/python tests/reference/make_lora_generation.py [CASE ...]
"""
import json
import os
import sys

import peft
import torch
import transformers
from peft import PeftModel
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")

CASES = ["qwen3_moe_experts", "mixtral_experts_down"]


def main():
    for case in CASES:
        if sys.argv[1:] and case not in sys.argv[1:]:
            continue
        d = os.path.join(FIX, "lora", case)
        with open(os.path.join(d, "batch.json")) as f:
            base = json.load(f)["base"]
        model = AutoModelForCausalLM.from_pretrained(os.path.join(FIX, base), dtype=torch.float32,
                                                     attn_implementation="eager")
        pm = PeftModel.from_pretrained(model, d)
        pm.eval()
        g = torch.Generator().manual_seed(31 + len(case))
        cases = []
        for n in (5, 3):
            prompt = torch.randint(1, model.config.vocab_size, (1, n), generator=g)
            with torch.no_grad():
                first = pm(input_ids=prompt).logits[0, -1]
                out = pm.generate(input_ids=prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                  eos_token_id=None, pad_token_id=0, output_scores=True,
                                  return_dict_in_generate=True)
            gen = out.sequences[0, n:]
            logps = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, gen.tolist())]
            cases.append({"prompt": prompt[0].tolist(), "generated": gen.tolist(), "logprobs": logps,
                          "first_logits": first.tolist()})
        with open(os.path.join(d, "generation.json"), "w") as f:
            json.dump({"cases": cases, "note": "torch %s, transformers %s, peft %s (make_lora_generation.py)" % (
                torch.__version__, transformers.__version__, peft.__version__)}, f)
        print(case, [c["generated"] for c in cases])


if __name__ == "__main__":
    main()
