#!/usr/bin/env python3
"""TRL's GRPOTrainer (use_vllm=True, vllm_mode="server") generating through `ctrl serve`.

TRL's VLLMClient syncs weights over vLLM's NCCL weight-transfer engine, which ctrl serve does not
have; ctrl serve takes weights as one safetensors body on POST /update_weights instead
(docs/serve.md). `use_ctrl_serve()` swaps TRL's client for a subclass that does that (everything
else — generate, logprobs, reset_prefix_cache — is TRL's own client unchanged) and lets TRL start
without vLLM installed. Works on the CPU.

usage: ctrl serve --model MODEL_DIR --port 8000 &
       python grpo_with_ctrl_serve.py MODEL_DIR [http://127.0.0.1:8000] [MAX_STEPS]
"""
import sys

import torch
from safetensors.torch import save

import trl.generation.vllm_client as vllm_client
import trl.generation.vllm_generation as vllm_generation


class CtrlServeClient(vllm_client.VLLMClient):
    """TRL's VLLMClient with the weight sync over ctrl serve's HTTP endpoint."""

    def init_communicator(self, device=0):
        self.communicator = None  # no NCCL group: weights go over HTTP

    def update_named_params(self, metadata, named_params):
        body = save({name: t.detach().to(torch.float32).cpu().contiguous() for name, t in named_params})
        r = self.session.post(f"{self.base_url}/update_weights", data=body,
                              headers={"Content-Type": "application/octet-stream"})
        if r.status_code != 200:
            raise RuntimeError(f"ctrl serve /update_weights: {r.status_code} {r.text}")

    def close_communicator(self):
        pass


def use_ctrl_serve():
    always = lambda *a, **k: True  # noqa: E731 - vLLM itself is needed only for NCCL
    vllm_client.is_vllm_available = vllm_generation.is_vllm_available = always
    vllm_generation.VLLMClient = CtrlServeClient


def train(model_dir, url, steps):
    """A few GRPO steps on a toy reward (shorter completions are better); the trainer."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    use_ctrl_serve()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    data = Dataset.from_dict({"prompt": ["1+2=", "Hello", "The sky is", "3*3="] * 4})

    def shorter_is_better(completions, **kwargs):
        return [-float(len(c)) for c in completions]

    args = GRPOConfig(output_dir="/tmp/grpo-ctrl-serve", use_vllm=True, vllm_mode="server", vllm_server_base_url=url,
                      per_device_train_batch_size=4, num_generations=4, max_completion_length=8, max_steps=steps,
                      learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True, bf16=False, save_strategy="no")
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=shorter_is_better, args=args,
                          train_dataset=data)
    trainer.train()
    return trainer


def main():
    url = sys.argv[2] if len(sys.argv) > 2 else "http://127.0.0.1:8000"
    trainer = train(sys.argv[1], url, int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    for log in trainer.state.log_history:
        print(log)


if __name__ == "__main__":
    main()
