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
import json
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402

TOK = bu.TINY_TOKENIZER
CTRL = os.path.join(bu.ROOT, "build", "ctrl")
PLUGINS = os.path.join(bu.ROOT, "build", "plugins")


def make_data(path, n=400, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            msgs = [{"role": "system", "content": "You answer briefly."}]
            for _ in range(rng.randint(2, 4)):
                a, b = rng.randrange(1000), rng.randrange(1000)
                msgs.append({"role": "user", "content": f"What is {a} + {b}? " + bu.filler(rng, 12)})
                msgs.append({"role": "assistant", "content": f"{a} + {b} = {a + b}. " + bu.filler(rng, 16)})
            f.write(json.dumps({"messages": msgs}) + "\n")


def run_ctrl(d, args):
    ini = os.path.join(d, "ctrl.ini")
    bu.write_ini(ini, {"run": bu.cpu_run(f"{d}/ctrl_out"), "model": {"path": f"{d}/model", "attention": "flash"},
                       "data": {"train_file": f"{d}/train.jsonl", "max_length": 1024, "shuffle": "false"},
                       "train": bu.train_section("1e-4", args.steps, args.batch, args.steps,
                                                 save_strategy=None)})
    run = bu.ctrl_train(CTRL, PLUGINS, ini, bu.thread_env(args.threads, OPENBLAS_NUM_THREADS="1"))
    last = bu.metrics(f"{d}/ctrl_out", '"step"')[-1]
    return last["tokens_per_second"], run.rss_mib, last["loss"]


def run_trl(d, args):
    return bu.child_json(bu.child_cmd(__file__, "--trl-child", d, args, ("threads", "steps", "batch")))[0]


def trl_child(d, args):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(TOK)  # the tokenizer's own folder: see make_trl_sft_curves.py
    model = AutoModelForCausalLM.from_pretrained(os.path.join(d, "model"), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    rows = bu.read_jsonl(os.path.join(d, "train.jsonl"))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = SFTConfig(**bu.trl_args(output_dir=tmp, max_steps=args.steps, per_device_train_batch_size=args.batch,
                                      learning_rate=1e-4, logging_steps=args.steps, max_length=1024))
        trainer = bu.sequential(SFTTrainer)(model=model, args=cfg, train_dataset=Dataset.from_list(rows),
                                            processing_class=tok)
        seconds, _ = bu.train_timed(trainer)
        tokens, loss = bu.last_logged(trainer, "num_tokens"), bu.last_logged(trainer, "loss")
    print(json.dumps({"tokens_per_second": tokens / seconds, "rss_mib": bu.peak_rss_self(), "loss": loss,
                      "versions": bu.torch_version()}))


def main():
    def options(p):
        p.add_argument("--experts", type=int, default=0, help="a Qwen3-MoE with this many experts")
        p.add_argument("--experts-per-tok", type=int, default=2)

    args = bu.parse_bench_args(20, 8, options)
    if args.trl_child:
        return trl_child(args.trl_child, args)
    with tempfile.TemporaryDirectory() as d:
        make_data(os.path.join(d, "train.jsonl"))
        moe = ["--arch", "qwen3_moe", "--experts", str(args.experts), "--experts-per-tok",
               str(args.experts_per_tok)] if args.experts else ["--arch", "qwen2"]
        bu.model_init(CTRL, PLUGINS, os.path.join(d, "model"), bu.model_shape(256, 6, 4, 2, 1024, tie=True), TOK,
                      arch=moe)
        print(f"machine: {bu.machine()}; threads {args.threads}, batch {args.batch}, "
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
