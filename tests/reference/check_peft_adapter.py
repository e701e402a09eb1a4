#!/usr/bin/env python3
"""Checks that PEFT loads the adapters ctrl saves: for each case exported by test_lora (ctrl's own
SGD steps on the PEFT fixture adapters, saved with ctrl_peft_save), PeftModel.from_pretrained over
the fixture base model gives ctrl's log-probs of the fixture batch (relative L2 <= 1e-5); and
(QDoRA: over the base in 4-bit NF4, as make_lora_fixtures.py loads it); and
ctrl's merged model (ctrl_peft_merge, `ctrl model merge`), loaded by transformers, gives the logits
of PEFT's merge_and_unload (relative L2 <= 1e-6, or twice PEFT's own merged-vs-unmerged distance
where fp32 merging moves the logits more: large adapters). Run by hand:
    mkdir -p /tmp/ctrl-lora && CTRL_LORA_EXPORT_DIR=/tmp/ctrl-lora build/test_lora
    /work/venv/bin/python tests/reference/check_peft_adapter.py /tmp/ctrl-lora
"""
import json
import os
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from make_lora_fixtures import nf4_quantization

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "models")


def main():
    root = sys.argv[1]
    ok = True
    for case in sorted(os.listdir(root)):
        with open(os.path.join(root, case, "logp.json")) as f:
            want = json.load(f)
        base_dir = os.path.join(FIX, want["base"]) if "/" not in want["base"] else \
            os.path.join(FIX, "..", want["base"])  # models/<arch>, or a folder under tests/fixtures (Phi-3)
        # QLoRA / QDoRA: the base in 4-bit NF4 as make_lora_fixtures.py loads it
        quant = nf4_quantization() if want.get("nf4") else None
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager",
                                                    quantization_config=quant, device_map="cpu" if quant else None)
        pm = PeftModel.from_pretrained(base, os.path.join(root, case))
        pm.train(bool(quant))  # (4-bit in eval mode: bitsandbytes' bf16 CPU inference kernel; no dropout here)
        with open(os.path.join(base_dir, "batch.json")) as f:
            batch = json.load(f)
        cu, toks, got = batch["cu_seqlens"], batch["tokens"], []
        with torch.no_grad():
            for i in range(len(cu) - 1):
                seq = torch.tensor(toks[cu[i]:cu[i + 1]])
                lp = torch.log_softmax(pm(input_ids=seq[None]).logits[0].float(), dim=-1)
                got += lp[:-1].gather(1, seq[1:, None])[:, 0].tolist() + [0.0]
        a, b = torch.tensor(got, dtype=torch.float64), torch.tensor(want["logp"], dtype=torch.float64)
        rel = ((a - b).norm() / b.norm()).item()
        ok &= rel <= 1e-5
        print("%-20s PEFT %s vs ctrl: log-probs relative L2 %.2e %s" % (case, pm.peft_config["default"].peft_type,
                                                                         rel, "ok" if rel <= 1e-5 else "FAIL"))
        merged_dir = os.path.join(root, case, "merged")
        if os.path.isdir(merged_dir):
            ours = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32, attn_implementation="eager")
            ids = torch.tensor(toks)[None]
            with torch.no_grad():
                unmerged = pm(input_ids=ids).logits.double()
                theirs = pm.merge_and_unload()
                a, b = ours(input_ids=ids).logits.double(), theirs(input_ids=ids).logits.double()
            rel = ((a - b).norm() / b.norm()).item()
            own = ((b - unmerged).norm() / unmerged.norm()).item()  # PEFT's own merge vs its adapters
            tol = max(1e-6, 2 * own)
            with open(os.path.join(root, case, "adapter_config.json")) as f:
                if json.load(f).get("init_lora_weights") == "pissa":
                    # PiSSA's residual is each side's own float32 SVD (LAPACK's sgesdd here, torch's there):
                    # both within ~3e-6 of float64's on these small gaps between singular values
                    tol = max(tol, 1e-5)
            ok &= rel <= tol
            print("%-20s ctrl merged vs PEFT merge_and_unload: logits relative L2 %.2e (PEFT merged vs unmerged "
                  "%.2e) %s" % (case, rel, own, "ok" if rel <= tol else "FAIL"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
