#!/usr/bin/env python3
"""One GRPO step at a real model's size on the CPU (or a GPU, --device cuda): ctrl against TRL's
GRPOTrainer, in one run.

The model is a random-init Qwen2.5-0.5B-shaped Qwen2 (hidden 896, 14 heads, 2 KV heads, intermediate
4864, tied embeddings; 24 layers unless --layers says fewer) made by `ctrl model init` with the real
Qwen3 tokenizer (151,669 tokens). The quickstart's arithmetic prompts, the length reward (TRL's
reward_len, target 20 characters; ctrl's `length` plugin), --batch completions per step
(--batch / --generations prompts x --generations each), at most --max-completion-length new
tokens, temperature 1.0, no reference model (beta = 0), activation checkpointing on both (TRL's
default), a constant learning rate of 1e-6. Runs, each in its own process:
  ctrl-bf16   [train] dtype = bf16 (ctrl's default: bf16 GEMMs, decoding on weights packed once)
  ctrl-fp32   [train] dtype = fp32
  trl-bf16    bf16 = True (autocast)
  trl-fp32    fp32
Reported per step, the first step a warm-up and not counted: wall seconds (ctrl's step_time; TRL's
step time from a callback) with the generation's share, and CPU seconds (the steadier measure on a
shared machine), counted the same way on both sides: user + system time of every thread (system
time holds the futex waits of OMP_WAIT_POLICY=PASSIVE's sleeping threads and page clearing), and
the user part alone; ctrl's is its own timing/step_cpu_s (CPU seconds inside each step; the user
part: the run's less that of a one-step run, over the steps between), TRL's is measured around its
counted steps by a callback; the generation's CPU seconds (user + system:
ctrl's timing/generation_cpu_s, TRL's measured around its _generate). Also peak RSS and mean
completion length.
--lora R: both sides train a LoRA adapter instead of the whole model (PEFT's LoraConfig: r R, lora_alpha
2R, dropout 0, target_modules all-linear, its default init; ctrl's [peft] with the same values): ctrl
decodes with the adapters applied live on the frozen base, TRL generates with the PeftModel.
--device cuda: ctrl with `[run] device = cuda` (generation from the device's KV cache), TRL's trainer
on the GPU with transformers' generate (use_vllm = False: TRL's recommended vLLM colocation needs vLLM,
which this bench does not install); CPU seconds then count only the host's share.
usage: bench/scale/bench_grpo_scale.py [--layers N] [--steps N] [--batch N] [--generations N]
       [--max-completion-length N] [--threads N] [--device cpu|cuda]
       [--lora R] [--only ctrl-bf16,ctrl-fp32,trl-bf16,trl-fp32] [--ctrl-set SECTION.KEY=VALUE ...]"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402

TOK = bu.qwen3_tokenizer()
CTRL, PLUGINS = bu.build_paths("BUILD")


def ctrl_once(d, args, dtype, steps):
    out = os.path.join(d, f"ctrl_{dtype}_{steps}")
    sections = {
        "run": dict(bu.cpu_run(out, trainer="grpo", seed=42), device=args.device), "model": {"path": f"{d}/model"},
        "data": {"train_file": f"{d}/data/train_prompts.jsonl"},
        "train": bu.train_section("1e-6", steps, args.batch, 1, dtype=dtype, lr_scheduler_type="constant"),
        "generation": {"kv_cache_bytes": 4000000000 if args.device == "cuda" else 512000000, "temperature": 1.0},
        "grpo": {"num_generations": args.generations, "max_completion_length": args.max_completion_length},
        "reward.len": {"plugin": "length", "target_length": 20}}
    if args.lora:
        sections["peft"] = {"enabled": "true", "r": args.lora, "lora_alpha": 2 * args.lora, "lora_dropout": 0,
                            "target_modules": "all-linear"}
    for kv in args.ctrl_set:  # --ctrl-set SECTION.KEY=VALUE: ctrl's config only (e.g. an A/B of a setting)
        key, value = kv.split("=", 1)
        section, name = key.rsplit(".", 1)
        sections.setdefault(section, {})[name] = value
    ini = bu.write_ini(os.path.join(d, f"ctrl_{dtype}_{steps}.ini"), sections)
    run = bu.ctrl_train(CTRL, PLUGINS, ini, bu.thread_env(args.threads, OPENBLAS_NUM_THREADS=str(args.threads)))
    return run, bu.metrics(out)


def run_ctrl(d, args, dtype):
    run, rows = ctrl_once(d, args, dtype, args.steps)
    one, _ = ctrl_once(d, args, dtype, 1)
    rows = rows[1:]  # after a warm-up step
    mean = bu.mean_of(rows)
    return {"step_s": mean("step_time"), "generation_s": mean("timing/generation_s"),
            "generation_cpu_s": mean("timing/generation_cpu_s"),
            "cpu_step_s": mean("timing/step_cpu_s"),
            "user_step_s": (run.user_s - one.user_s) / (args.steps - 1), "rss_mib": run.rss_mib,
            "mean_length": mean("completions/mean_length")}


def run_trl(d, args, dtype):
    r, run = bu.child_json(bu.child_cmd(__file__, "--trl-child", d, args,
                                        ("threads", "steps", "batch", "generations", "max_completion_length",
                                         "device", "lora"),
                                        "--dtype", dtype))
    r["rss_mib"] = run.rss_mib
    return r


def cpu_times():
    """This process's (user + system, user) CPU seconds, every thread (what ctrl's side counts: its
    child's ru_utime + ru_stime, and ru_utime)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_utime


def trl_child(d, args):
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    tok = bu.tokenizer_with_pad(os.path.join(d, "model"))
    ds = load_dataset("json", data_files=os.path.join(d, "data", "train_prompts.jsonl"), split="train")
    cfg = GRPOConfig(**bu.trl_args(output_dir=os.path.join(d, "trl-out"), per_device_train_batch_size=args.batch,
                                   num_generations=args.generations, max_completion_length=args.max_completion_length,
                                   temperature=1.0, learning_rate=1e-6, lr_scheduler_type="constant",
                                   max_steps=args.steps, logging_steps=1, seed=42, bf16=args.dtype == "bf16",
                                   use_cpu=args.device == "cpu"))
    m = AutoModelForCausalLM.from_pretrained(os.path.join(d, "model"), dtype=torch.float32)
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=args.lora, lora_alpha=2 * args.lora, lora_dropout=0.0, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
    tr = GRPOTrainer(model=m, reward_funcs=[bu.reward_len], args=cfg, train_dataset=ds, processing_class=tok,
                     peft_config=peft_config)
    times = {"generation_s": 0.0, "generation_cpu_s": 0.0}
    bu.timed(tr, "_generate", times, "generation_s")
    generate = tr._generate

    def generate_cpu(*a, **k):  # the generation's CPU seconds (user + system), as ctrl's timing/generation_cpu_s
        c0 = cpu_times()[0]
        try:
            return generate(*a, **k)
        finally:
            times["generation_cpu_s"] += cpu_times()[0] - c0

    tr._generate = generate_cpu
    clock = {"wall": [], "cpu": [], "user": []}

    class Clock(TrainerCallback):  # wall and CPU seconds of each step; the first is a warm-up
        def on_step_begin(self, a, s, c, **k):
            cpu, user = cpu_times()
            clock["wall"].append(time.perf_counter()), clock["cpu"].append(cpu), clock["user"].append(user)
            if len(clock["wall"]) == 2:
                times["generation_s"] = times["generation_cpu_s"] = 0.0

        def on_step_end(self, a, s, c, **k):
            clock["wall"][-1] = time.perf_counter() - clock["wall"][-1]
            cpu, user = cpu_times()
            clock["cpu"][-1], clock["user"][-1] = cpu - clock["cpu"][-1], user - clock["user"][-1]

    tr.add_callback(Clock())
    tr.train()
    logs = [h for h in tr.state.log_history if "reward" in h][1:]
    n = len(clock["wall"]) - 1
    print(json.dumps({"step_s": sum(clock["wall"][1:]) / n, "generation_s": times["generation_s"] / n,
                      "generation_cpu_s": times["generation_cpu_s"] / n,
                      "cpu_step_s": sum(clock["cpu"][1:]) / n, "user_step_s": sum(clock["user"][1:]) / n,
                      "mean_length": sum(h["completions/mean_length"] for h in logs) / len(logs),
                      "versions": f"torch {torch.__version__}, trl {__import__('trl').__version__}"}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--max-completion-length", type=int, default=32)
    p.add_argument("--only", default="ctrl-bf16,ctrl-fp32,trl-bf16,trl-fp32")
    p.add_argument("--model", help="an existing model folder to use instead of making one")
    p.add_argument("--trl-child")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--lora", type=int, default=0, metavar="R", help="train a LoRA adapter of rank R on both sides")
    p.add_argument("--ctrl-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a setting of ctrl's runs (repeatable), e.g. generation.decode_threads=2")
    args = p.parse_args()
    if args.trl_child:
        return trl_child(args.trl_child, args)
    if args.steps < 2:
        raise SystemExit("bench_grpo_scale: --steps must be >= 2 (the first is a warm-up)")
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["bash", os.path.join(bu.ROOT, "scripts", "make_quickstart_data.sh"), os.path.join(d, "data")],
                       check=True, stdout=subprocess.DEVNULL)
        if args.model:
            os.symlink(os.path.abspath(args.model), os.path.join(d, "model"))
        else:
            bu.model_init(CTRL, PLUGINS, os.path.join(d, "model"),
                          bu.model_shape(896, args.layers, 14, 2, 4864, tie=True), TOK, seed=1)
        print(f"machine: {bu.machine()}")
        print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {bu.load_average()} at start; "
              f"Qwen2.5-0.5B shape with {args.layers} of 24 layers, vocab 151,669; GRPO, {args.batch} completions "
              f"per step ({args.batch // args.generations} prompts x {args.generations}), <= "
              f"{args.max_completion_length} new tokens, {args.steps} steps (the first a warm-up), "
              f"{args.threads} thread(s), device {args.device}"
              + (f", LoRA all-linear r {args.lora} alpha {2 * args.lora}" if args.lora else ""))
        print(f"{'run':10s}{'step s':>9s}{'gen s':>8s}{'CPU s/step':>12s}{'user s':>8s}{'gen CPU':>8s}{'RSS MiB':>9s}"
              f"{'mean len':>10s}  load   (CPU: user + system)")
        table = {}
        for name in args.only.split(","):
            side, dtype = name.split("-")
            r = run_ctrl(d, args, dtype) if side == "ctrl" else run_trl(d, args, dtype)
            table[name] = r
            print(f"{name:10s}{r['step_s']:9.2f}{r['generation_s']:8.2f}{r['cpu_step_s']:12.2f}{r['user_step_s']:8.2f}"
                  f"{r['generation_cpu_s']:8.2f}"
                  f"{r['rss_mib']:9.0f}"
                  f"{r['mean_length']:10.1f}  {bu.load_average()}" + (f"  ({r['versions']})" if "versions" in r else ""),
                  flush=True)
        for c in ("ctrl-bf16", "ctrl-fp32"):
            for t in ("trl-bf16", "trl-fp32"):
                if c in table and t in table:
                    rc, rt = table[c], table[t]
                    print(f"{c} / {t}: {rt['step_s'] / rc['step_s']:.2f}x by wall clock per step, "
                          f"{rt['cpu_step_s'] / rc['cpu_step_s']:.2f}x by CPU time (user + system) per step, "
                          f"{rt['user_step_s'] / rc['user_step_s']:.2f}x by user CPU time (generation "
                          f"{rt['generation_s'] / max(rc['generation_s'], 1e-9):.2f}x by wall clock), "
                          f"{rc['rss_mib'] / rt['rss_mib']:.2f}x peak RSS")
        print(f"load average {bu.load_average()} at end")


if __name__ == "__main__":
    main()
