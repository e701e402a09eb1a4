#!/usr/bin/env python3
"""SFT on the CPU, ctrl against TRL, in one run: the same random-init Qwen2-shaped model (made by
`ctrl model init` with the committed tiny tokenizer), the same chat data (multi-turn messages,
assistant turns trained as usual: all tokens), fp32, the same batch size, steps, learning rate
and threads. Each trainer runs in its own process; reported: training tokens/s (tokens seen /
training-loop time, the first step included for both) and peak RSS of the process, and the ratios.
usage: bench/sft/bench_sft.py [--threads N] [--steps N] [--batch N] [--experts N --experts-per-tok K]
(after scripts/build.sh; needs torch, transformers, trl, datasets). With --experts the model is a
Qwen3-MoE of the same shape (every layer sparse: N experts of width intermediate / 4, top K, as
`ctrl model init --arch qwen3_moe` makes it)."""
import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOK = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "tiny_bpe")
CTRL = os.path.join(ROOT, "build", "ctrl")
PLUGINS = os.path.join(ROOT, "build", "plugins")


def make_data(path, n=400, seed=0):
    rng = random.Random(seed)
    words = "alpha beta gamma delta tensor kernel gradient batch token model layer cache vector matrix".split()
    with open(path, "w") as f:
        for _ in range(n):
            msgs = [{"role": "system", "content": "You answer briefly."}]
            for _ in range(rng.randint(2, 4)):
                a, b = rng.randrange(1000), rng.randrange(1000)
                msgs.append({"role": "user", "content": f"What is {a} + {b}? " + " ".join(rng.choices(words, k=12))})
                msgs.append({"role": "assistant", "content": f"{a} + {b} = {a + b}. " + " ".join(rng.choices(words, k=16))})
            f.write(json.dumps({"messages": msgs}) + "\n")


def run_ctrl(d, args):
    ini = os.path.join(d, "ctrl.ini")
    with open(ini, "w") as f:
        f.write(f"""[run]
output_dir = {d}/ctrl_out
device = cpu
[model]
path = {d}/model
attention = flash
[data]
train_file = {d}/train.jsonl
max_length = 1024
shuffle = false
[train]
dtype = fp32
learning_rate = 1e-4
max_steps = {args.steps}
per_device_train_batch_size = {args.batch}
logging_steps = {args.steps}
""")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS="1")
    subprocess.run([CTRL, "--plugin-dir", PLUGINS, "train", ini], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    last = [json.loads(l) for l in open(f"{d}/ctrl_out/metrics.jsonl") if '"step"' in l][-1]
    return last["tokens_per_second"], rss, last["loss"]


def run_trl(d, args):
    out = subprocess.run([sys.executable, __file__, "--trl-child", d, "--threads", str(args.threads), "--steps",
                          str(args.steps), "--batch", str(args.batch)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def trl_child(d, args):
    import torch
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    class Sequential(SFTTrainer):
        def _get_train_sampler(self, *a, **k):
            return SequentialSampler(self.train_dataset)

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(TOK)  # the tokenizer's own folder: see make_trl_sft_curves.py
    model = AutoModelForCausalLM.from_pretrained(os.path.join(d, "model"), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    rows = [json.loads(l) for l in open(os.path.join(d, "train.jsonl"))]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = SFTConfig(output_dir=tmp, report_to=[], use_cpu=True, bf16=False, max_steps=args.steps,
                        per_device_train_batch_size=args.batch, learning_rate=1e-4, logging_steps=args.steps,
                        save_strategy="no", max_length=1024, dataloader_num_workers=0)
        trainer = Sequential(model=model, args=cfg, train_dataset=Dataset.from_list(rows), processing_class=tok)
        t0 = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - t0
        logs = [h for h in trainer.state.log_history if "num_tokens" in h]
        tokens = logs[-1]["num_tokens"]
        loss = [h["loss"] for h in trainer.state.log_history if "loss" in h][-1]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"tokens_per_second": tokens / seconds, "rss_mib": rss, "loss": loss,
                      "versions": f"torch {torch.__version__}"}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--experts", type=int, default=0, help="a Qwen3-MoE with this many experts")
    p.add_argument("--experts-per-tok", type=int, default=2)
    p.add_argument("--trl-child")
    args = p.parse_args()
    if args.trl_child:
        return trl_child(args.trl_child, args)
    with tempfile.TemporaryDirectory() as d:
        make_data(os.path.join(d, "train.jsonl"))
        moe = ["--arch", "qwen3_moe", "--experts", str(args.experts), "--experts-per-tok",
               str(args.experts_per_tok)] if args.experts else ["--arch", "qwen2"]
        subprocess.run([CTRL, "--plugin-dir", PLUGINS, "model", "init"] + moe + ["--hidden", "256",
                        "--layers", "6", "--heads", "4", "--kv-heads", "2", "--intermediate", "1024",
                        "--tie-embeddings", "--tokenizer", TOK, "--out", os.path.join(d, "model")], check=True,
                       stdout=subprocess.DEVNULL)
        
        cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].split(":", 1)[1].strip()
        print(f"machine: {os.cpu_count()} cores, {cpu}; threads {args.threads}, batch {args.batch}, "
              f"{args.steps} steps, fp32" + (f"; Qwen3-MoE, {args.experts} experts, top {args.experts_per_tok}"
                                             if args.experts else ""))
        tps, rss, loss = run_ctrl(d, args)
        trl = run_trl(d, args)
        print(f"ctrl  {tps:10.0f} tokens/s  peak RSS {rss:7.0f} MiB  final loss {loss:.4f}")
        print(f"TRL   {trl['tokens_per_second']:10.0f} tokens/s  peak RSS {trl['rss_mib']:7.0f} MiB  final loss "
              f"{trl['loss']:.4f}  ({trl['versions']})")
        print(f"ratio: {tps / trl['tokens_per_second']:.2f}x TRL's tokens/s at {rss / trl['rss_mib']:.2f}x its peak RSS")


if __name__ == "__main__":
    main()
