#!/usr/bin/env python3
"""DPO on the CPU, ctrl against TRL's DPOTrainer, in one run: the same random-init Qwen2-shaped model
(made by `ctrl model init` with the given tokenizer), the same preference pairs (prompt / chosen /
rejected, plain text), fp32, TRL's default sigmoid loss (beta 0.1), the same batch size, steps,
max_length, learning rate and threads, each trainer's defaults otherwise (both keep a frozen
reference model and recompute activations: TRL's gradient_checkpointing, ctrl's `checkpointing`
strategy). Each trainer runs in its own process; reported: training tokens/s (non-pad tokens of
chosen + rejected seen / training-loop time, the first step included for both) and peak RSS of the
process, and the ratios. Runs once per tokenizer: by default the committed tiny BPE (1027 tokens)
and Qwen3's (151k tokens, /work/shared/data/tokenizers/qwen3 or --tokenizer DIR).
usage: bench/dpo/bench_dpo.py [--threads N] [--steps N] [--batch N] [--tokenizer DIR ...]
(after scripts/build.sh; needs torch, transformers, trl, datasets)"""
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
TINY = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "tiny_bpe")
QWEN3 = "/work/shared/data/tokenizers/qwen3"
BUILD = os.environ.get("CTRL_BUILD", os.path.join(ROOT, "build"))  # the build folder to bench
CTRL = os.path.join(BUILD, "ctrl")
PLUGINS = os.path.join(BUILD, "plugins")
LR, BETA, MAX_LENGTH = 1e-4, 0.1, 512


def make_pairs(path, n=400, seed=0):
    """Additions with some filler text: chosen the right sum, rejected a near miss."""
    rng = random.Random(seed)
    words = "alpha beta gamma delta tensor kernel gradient batch token model layer cache vector matrix".split()
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randrange(1000), rng.randrange(1000)
            wrong = a + b + rng.choice([-10, -2, -1, 1, 2, 10])
            prompt = f"Question: what is {a} + {b}? " + " ".join(rng.choices(words, k=16)) + "\nAnswer:"
            tail = " " + " ".join(rng.choices(words, k=12))
            f.write(json.dumps({"prompt": prompt, "chosen": f" {a} + {b} = {a + b}." + tail,
                                "rejected": f" {a} + {b} = {wrong}." + tail}) + "\n")


def run_ctrl(d, args):
    ini = os.path.join(d, "ctrl.ini")
    with open(ini, "w") as f:
        f.write(f"""[run]
trainer = dpo
output_dir = {d}/ctrl_out
device = cpu
[model]
path = {d}/model
attention = flash
[data]
train_file = {d}/pairs.jsonl
max_length = {MAX_LENGTH}
shuffle = false
[train]
dtype = fp32
learning_rate = {LR}
max_steps = {args.steps}
per_device_train_batch_size = {args.batch}
logging_steps = {args.steps}
save_strategy = no
[dpo]
loss_type = sigmoid
beta = {BETA}
""")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(["/usr/bin/time", "-f", "%M", CTRL, "--plugin-dir", PLUGINS, "train", ini], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"ctrl train failed:\n{out.stderr}")
    rss = int(out.stderr.strip().splitlines()[-1]) / 1024
    last = [json.loads(l) for l in open(f"{d}/ctrl_out/metrics.jsonl") if '"step"' in l][-1]
    return {"tokens_per_second": last["tokens_per_second"], "rss_mib": rss, "loss": last["loss"],
            "num_tokens": last["num_tokens"]}


def trl_child(d, args):
    import torch
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    class Sequential(DPOTrainer):
        def _get_train_sampler(self, *a, **k):
            return SequentialSampler(self.train_dataset)

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.tok)
    model = AutoModelForCausalLM.from_pretrained(os.path.join(d, "model"), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    rows = [json.loads(l) for l in open(os.path.join(d, "pairs.jsonl"))]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = DPOConfig(output_dir=tmp, report_to=[], use_cpu=True, bf16=False, max_steps=args.steps,
                        per_device_train_batch_size=args.batch, learning_rate=LR, logging_steps=args.steps,
                        save_strategy="no", max_length=MAX_LENGTH, beta=BETA, loss_type=["sigmoid"],
                        dataloader_num_workers=0)
        trainer = Sequential(model=model, args=cfg, train_dataset=Dataset.from_list(rows), processing_class=tok)
        t0 = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - t0
        tokens = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h][-1]
        loss = [h["loss"] for h in trainer.state.log_history if "loss" in h][-1]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"tokens_per_second": tokens / seconds, "rss_mib": rss, "loss": loss, "num_tokens": tokens,
                      "versions": f"torch {torch.__version__}"}))


def run_trl(d, args, tok):
    out = subprocess.run([sys.executable, __file__, "--trl-child", d, "--tok", tok, "--threads", str(args.threads),
                          "--steps", str(args.steps), "--batch", str(args.batch)], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench(tok, args):
    with tempfile.TemporaryDirectory() as d:
        make_pairs(os.path.join(d, "pairs.jsonl"))
        subprocess.run([CTRL, "--plugin-dir", PLUGINS, "model", "init", "--arch", "qwen2", "--hidden", "256",
                        "--layers", "6", "--heads", "4", "--kv-heads", "2", "--intermediate", "1024",
                        "--tie-embeddings", "--tokenizer", tok, "--out", os.path.join(d, "model")], check=True,
                       stdout=subprocess.DEVNULL)
        vocab = json.load(open(os.path.join(d, "model", "config.json")))["vocab_size"]
        print(f"tokenizer {tok} (vocabulary {vocab})")
        c = run_ctrl(d, args)
        t = run_trl(d, args, tok)
        for name, r in (("ctrl", c), ("TRL", t)):
            print(f"  {name:4}  {r['tokens_per_second']:8.0f} tokens/s  peak RSS {r['rss_mib']:6.0f} MiB  "
                  f"final loss {r['loss']:.4f}  tokens {r['num_tokens']}")
        print(f"  ratio: {c['tokens_per_second'] / t['tokens_per_second']:.2f}x TRL's tokens/s at "
              f"{c['rss_mib'] / t['rss_mib']:.2f}x its peak RSS  ({t['versions']})", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokenizer", action="append", help="a tokenizer folder (repeatable)")
    p.add_argument("--trl-child")
    p.add_argument("--tok")
    args = p.parse_args()
    if args.trl_child:
        return trl_child(args.trl_child, args)
    cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].split(":", 1)[1].strip()
    print(f"machine: {os.cpu_count()} cores, {cpu}; threads {args.threads}, batch {args.batch} pairs, "
          f"{args.steps} steps, fp32", flush=True)
    for tok in args.tokenizer or [TINY, QWEN3]:
        bench(tok, args)


if __name__ == "__main__":
    main()
