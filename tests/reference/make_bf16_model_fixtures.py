#!/usr/bin/env python3
"""bf16 model parity fixtures: the models and packed batch of make_model_fixtures.py run under
torch.autocast("cpu", dtype=torch.bfloat16) with fp32 weights — what TRL's bf16 = True does — each
sequence on its own. Writes, next to each fixture model (tests/fixtures/models/<arch>/),
batch_bf16.json (per-token log-probs of the next tokens, mean loss) and grads_bf16.safetensors (the
gradient of that loss for every parameter). Run by hand after make_model_fixtures.py:
    python3 tests/reference/make_bf16_model_fixtures.py
"""
import os

from fixture_io import write_bf16_batch

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "models")


def main():
    for arch in ("llama", "qwen2", "qwen3", "mistral"):
        loss, fp32 = write_bf16_batch(os.path.join(DIR, arch), "make_bf16_model_fixtures.py")
        print(arch, "loss %.6f (fp32 %.6f)" % (loss, fp32))


if __name__ == "__main__":
    main()
