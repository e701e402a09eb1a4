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
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402

CTRL, PLUGINS = bu.build_paths("CTRL_BUILD")  # the build folder to bench
LR, BETA, MAX_LENGTH = 1e-4, 0.1, 512


def make_pairs(path, n=400, seed=0):
    """Additions with some filler text: chosen the right sum, rejected a near miss."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randrange(1000), rng.randrange(1000)
            wrong = a + b + rng.choice([-10, -2, -1, 1, 2, 10])
            prompt = bu.arith_prompt(rng, a, b, 16)
            tail = " " + bu.filler(rng, 12)
            f.write(json.dumps({"prompt": prompt, "chosen": f" {a} + {b} = {a + b}." + tail,
                                "rejected": f" {a} + {b} = {wrong}." + tail}) + "\n")


def run_ctrl(d, args):
    ini = os.path.join(d, "ctrl.ini")
    bu.write_ini(ini, {"run": bu.cpu_run(f"{d}/ctrl_out", trainer="dpo"),
                       "model": {"path": f"{d}/model", "attention": "flash"},
                       "data": {"train_file": f"{d}/pairs.jsonl", "max_length": MAX_LENGTH, "shuffle": "false"},
                       "train": bu.train_section(LR, args.steps, args.batch, args.steps),
                       "dpo": {"loss_type": "sigmoid", "beta": BETA}})
    run = bu.ctrl_train(CTRL, PLUGINS, ini, bu.thread_env(args.threads, OPENBLAS_NUM_THREADS="1"))
    last = bu.metrics(f"{d}/ctrl_out", '"step"')[-1]
    return {"tokens_per_second": last["tokens_per_second"], "rss_mib": run.rss_mib, "loss": last["loss"],
            "num_tokens": last["num_tokens"]}


def trl_child(d, args):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.tok)
    model = AutoModelForCausalLM.from_pretrained(os.path.join(d, "model"), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    rows = bu.read_jsonl(os.path.join(d, "pairs.jsonl"))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = DPOConfig(**bu.trl_args(output_dir=tmp, max_steps=args.steps, per_device_train_batch_size=args.batch,
                                      learning_rate=LR, logging_steps=args.steps, max_length=MAX_LENGTH, beta=BETA,
                                      loss_type=["sigmoid"]))
        trainer = bu.sequential(DPOTrainer)(model=model, args=cfg, train_dataset=Dataset.from_list(rows),
                                            processing_class=tok)
        seconds, _ = bu.train_timed(trainer)
        tokens, loss = bu.last_logged(trainer, "num_tokens"), bu.last_logged(trainer, "loss")
    print(json.dumps({"tokens_per_second": tokens / seconds, "rss_mib": bu.peak_rss_self(), "loss": loss,
                      "num_tokens": tokens, "versions": bu.torch_version()}))


def run_trl(d, args, tok):
    return bu.child_json(bu.child_cmd(__file__, "--trl-child", d, args, ("threads", "steps", "batch"), "--tok", tok))[0]


def bench(tok, args):
    with tempfile.TemporaryDirectory() as d:
        make_pairs(os.path.join(d, "pairs.jsonl"))
        bu.model_init(CTRL, PLUGINS, os.path.join(d, "model"), bu.model_shape(256, 6, 4, 2, 1024, tie=True), tok)
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
    def options(p):
        p.add_argument("--tokenizer", action="append", help="a tokenizer folder (repeatable)")
        p.add_argument("--tok")  # the TRL child's tokenizer

    args = bu.parse_bench_args(20, 8, options)
    if args.trl_child:
        return trl_child(args.trl_child, args)
    print(f"machine: {bu.machine()}; threads {args.threads}, batch {args.batch} pairs, "
          f"{args.steps} steps, fp32", flush=True)
    for tok in args.tokenizer or [bu.TINY_TOKENIZER, bu.qwen3_tokenizer()]:
        bench(tok, args)


if __name__ == "__main__":
    main()
