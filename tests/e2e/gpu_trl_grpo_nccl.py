#!/usr/bin/env python3
"""TRL's GRPOTrainer (use_vllm=True, vllm_mode="server") against `ctrl serve --device cuda` with
TRL 1.16's own VLLMClient, unpatched: generation over /v1/completions and the weight sync over
vLLM's NCCL weight-transfer engine (init_communicator, then update_named_params after every
optimizer step: /init_weight_transfer_engine, /start_weight_update, /update_weights with
update_info and the packed NCCL broadcast, /finish_weight_update). The run must show the synced
weights: TRL's `sampling/sampling_logp_difference/max` (the server's log-probabilities of the
sampled tokens against the trainer's own, recomputed on the weights it just sent) stays within
1e-3 at every step, and after training the server scores a sequence as transformers does on the
trained model (get_sequence_logprobs).

Needs a CUDA GPU, a CUDA build of torch, TRL 1.16 and vLLM installed (TRL's client imports vLLM's
NCCL helpers; vLLM's engine is not used), and a ctrl build with CUDA (build/ctrl,
build/libctrl_cuda.so, build/plugins). Without them it prints why and exits 77 (skipped). Not run
by CI; docs/serve.md "NCCL weight transfer" says what it checks and what was run.

usage: python tests/e2e/gpu_trl_grpo_nccl.py [BUILD_DIR] [STEPS]
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(ROOT, "build")
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
CTRL = os.path.join(BUILD, "ctrl")


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(77)


def requirements():
    try:
        import torch
    except ImportError:
        skip("torch is not installed")
    if not torch.cuda.is_available():
        skip("no CUDA GPU (torch.cuda.is_available() is False)")
    try:
        import vllm  # noqa: F401 - TRL's VLLMClient needs vLLM's NCCL helpers
        import trl
    except ImportError as e:
        skip(f"{e.name} is not installed (pip install trl[vllm])")
    if not trl.__version__.startswith("1.16"):
        print(f"note: TRL {trl.__version__}, this check was written against 1.16")
    if not os.access(CTRL, os.X_OK) or not os.path.exists(os.path.join(BUILD, "libctrl_cuda.so")):
        skip(f"no CUDA build of ctrl in {BUILD} (scripts/build.sh -DCTRL_CUDA=ON)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    requirements()
    import requests
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    work = tempfile.mkdtemp(prefix="ctrl-grpo-nccl-")
    model_dir = os.path.join(work, "model")
    subprocess.run([CTRL, "model", "init", "--arch", "qwen2", "--hidden", "128", "--layers", "2", "--heads", "4",
                    "--kv-heads", "2", "--tokenizer", os.path.join(ROOT, "tests", "fixtures", "tokenizer", "tiny_bpe"),
                    "--out", model_dir], check=True)
    port = free_port()
    log = open(os.path.join(work, "serve.log"), "w")
    server = subprocess.Popen([CTRL, "--plugin-dir", os.path.join(BUILD, "plugins"), "serve", "--model", model_dir,
                               "--port", str(port), "--device", "cuda",
                               "--weight-transfer-config", '{"backend": "nccl"}'],
                              stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if requests.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.1)
        info = requests.get(f"{base}/server_info").json()["vllm_config"]
        assert info["weight_transfer_config"] == {"backend": "nccl"}, info

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda()
        tok = AutoTokenizer.from_pretrained(model_dir)
        data = Dataset.from_dict({"prompt": ["1+2=", "Hello", "The sky is", "3*3="] * 8})

        def shorter_is_better(completions, **kwargs):
            return [-float(len(c)) for c in completions]

        args = GRPOConfig(output_dir=os.path.join(work, "out"), use_vllm=True, vllm_mode="server",
                          vllm_server_base_url=base, per_device_train_batch_size=4, num_generations=4,
                          max_completion_length=8, max_steps=STEPS, learning_rate=1e-3, logging_steps=1, report_to=[],
                          bf16=False, save_strategy="no")
        trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=shorter_is_better, args=args,
                              train_dataset=data)
        trainer.train()
        diffs = [float(l["sampling/sampling_logp_difference/max"]) for l in trainer.state.log_history
                 if "sampling/sampling_logp_difference/max" in l]
        print("sampling_logp_difference/max per step:", ", ".join(f"{d:.2e}" for d in diffs))
        assert trainer.state.global_step == STEPS and len(diffs) == STEPS, trainer.state.log_history
        assert max(diffs) < 1e-3, f"the server's log-probs drift from the trainer's weights: {diffs}"

        # the trained weights are the server's: score one sequence both ways
        from trl.generation.vllm_client import VLLMClient
        client = VLLMClient(base_url=base)
        seq = tok("The sky is blue and the grass is green")["input_ids"]
        served = client.get_sequence_logprobs([seq], [2], top_logprobs=1, temperature=1.0)
        with torch.no_grad():
            logits = trainer.model(torch.tensor([seq], device="cuda")).logits[0].float().cpu()
        # log p(seq[p] | seq[:p]) for p = 2 .. len - 1: logits of position p - 1
        ref = torch.log_softmax(logits[1:-1], -1).gather(1, torch.tensor(seq[2:])[:, None])[:, 0]
        got = torch.tensor([row[0] for row in served["actual_logprobs"][0]])
        worst = (got - ref).abs().max().item()
        print(f"after training: server vs transformers log-probs within {worst:.2e}")
        assert worst < 1e-3, worst
        print("PASS")
    finally:
        server.terminate()
        server.wait(timeout=120)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
