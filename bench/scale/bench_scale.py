#!/usr/bin/env python3
"""SFT at a real model's size on the CPU: ctrl against TRL, bf16 and fp32, in one run.

The model is a random-init Qwen2.5-0.5B-shaped Qwen2 (hidden 896, 14 heads, 2 KV heads, intermediate
4864, tied embeddings; 24 layers unless --layers says fewer) made by `ctrl model init` with the real
Qwen3 tokenizer (151,669 tokens) from ../shared/data/tokenizers/qwen3. The data are plain-text rows
long enough that every row is truncated to exactly --seq tokens, so both trainers see batches of
--batch x --seq tokens. Four runs, each in its own process (its peak RSS is its own):
  ctrl  [train] dtype = bf16      ctrl  [train] dtype = fp32
  TRL   bf16 = True (autocast)    TRL   fp32
Reported: training tokens/s (tokens / training-loop time, first step included), seconds per step,
CPU seconds per step (on a shared machine the steadier measure: TRL's process CPU time over
trainer.train(); ctrl's user + system CPU of the run less that of a one-step run), peak RSS, the final loss,
and the ratios. ctrl-bf16nofast is ctrl's bf16 with CTRL_NO_AVX512BF16=1 (what a CPU without AVX-512
BF16 runs: with the default [train] bf16_fallback = fp32, fp32's products). ctrl-bf16rounded is ctrl's bf16
with bf16_fallback = rounded (where no bf16 kernel runs: SGEMM on bf16-rounded inputs, bf16's numbers; elsewhere
the same as ctrl-bf16). A dtype ending in avx2 (ctrl-bf16avx2, ctrl-fp32avx2, trl-fp32avx2, trl-bf16avx2) is the stand-in
for an AVX2-only CPU, each side held to AVX2 by its own switches: ctrl runs the binary of an AVX2 build
($BUILD_AVX2, default build-avx2, configured with -DCTRL_CPU_ARCH=haswell; the bench refuses a build without
it) with CTRL_NO_AVX512BF16=1 and OPENBLAS_CORETYPE=Haswell; TRL runs with MKL_ENABLE_INSTRUCTIONS=AVX2,
ONEDNN_MAX_CPU_ISA=AVX2 and ATEN_CPU_CAPABILITY=avx2 (the child refuses to run unless torch then reports
the AVX2 capability). --profile adds `perf record` of ctrl's runs and prints
where each one's step goes (symbols, self time). ctrl's log line on where its memory goes after the first step
(parameters, gradients, optimizer state, activations, scratch, the rest) is printed under its run.
--dir keeps the model, data and outputs in that folder (reused by a later run with the same --layers), so
that the runs can be made one at a time.
The optimizer: AdamW on both sides unless said. --optim NAME gives ctrl's runs that optimizer plugin
(adamw_8bit: bitsandbytes' 8-bit AdamW); a run name may end in one too, e.g. ctrl-bf16-adamw_8bit, and a
TRL run's in a transformers optim name, e.g. trl-bf16-adamw_bnb_8bit (bitsandbytes' own AdamW8bit,
`pip install bitsandbytes`); its ratios are printed against every TRL run.
usage: bench/scale/bench_scale.py [--layers N] [--batch N] [--seq N] [--steps N] [--threads N]
       [--only ctrl-bf16,ctrl-fp32,ctrl-bf16nofast,ctrl-bf16rounded,ctrl-bf16avx2,ctrl-fp32avx2,trl-bf16,trl-fp32,trl-fp32avx2,
       trl-bf16avx2[-OPTIM]] [--optim adamw|adamw_8bit]
       [--profile] [--dir DIR] (after scripts/build.sh); --only none makes the model and data only"""
import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402

TOK = bu.qwen3_tokenizer()
CTRL, PLUGINS = bu.build_paths("BUILD")
# The AVX2-only stand-in's switches (see the docstring): each side's own, so that each takes its AVX2 path.
RUNS = [("ctrl", d) for d in ("bf16", "fp32", "bf16nofast", "bf16rounded", "bf16avx2", "fp32avx2")] + \
    [("trl", d) for d in ("bf16", "fp32", "bf16avx2", "fp32avx2")]
AVX2_CTRL_ENV = {"CTRL_NO_AVX512BF16": "1", "OPENBLAS_CORETYPE": "Haswell"}
AVX2_TORCH_ENV = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
                  "OPENBLAS_CORETYPE": "Haswell"}
WORDS = ("the model learns a gradient from each token of the batch while the optimizer moves every "
         "weight by its own step size and the loss falls over time as training goes on").split()


def make_data(path, rows, words_per_row, seed=0):
    rng = random.Random(seed)
    with open(path + f".{os.getpid()}", "w") as f:
        for _ in range(rows):
            f.write(json.dumps({"text": " ".join(rng.choices(WORDS, k=words_per_row))}) + "\n")
    os.replace(path + f".{os.getpid()}", path)  # atomic: rows run side by side on one --dir (bench/gpu.sh)


def avx2_build():
    """(ctrl binary, plugin folder) of the AVX2 build ($BUILD_AVX2, else ROOT/build-avx2), after checking
    that its CMakeCache names an AVX2-level -march (CTRL_CPU_ARCH), not this machine's."""
    build = os.environ.get("BUILD_AVX2", os.path.join(bu.ROOT, "build-avx2"))
    how = (f"configure one: cmake -S . -B {build} -DCTRL_CPU_ARCH=haswell -DCTRL_CUDA=OFF -DCTRL_BUILD_TESTS=OFF "
           f"&& cmake --build {build} (or set BUILD_AVX2)")
    cache = os.path.join(build, "CMakeCache.txt")
    if not os.path.isfile(cache):
        raise SystemExit(f"bench_scale: no AVX2 build at {build}: {how}")
    arch = [l.split("=", 1)[1].strip() for l in open(cache) if l.startswith("CTRL_CPU_ARCH:")]
    if not arch or arch[0] not in ("haswell", "broadwell", "x86-64-v3", "znver1", "znver2"):
        raise SystemExit(f"bench_scale: {cache}: CTRL_CPU_ARCH is {arch[0] if arch else 'unset'!r}, not an "
                         f"AVX2-only target such as haswell: {how}")
    return os.path.join(build, "ctrl"), os.path.join(build, "plugins"), arch[0]


def run_ctrl(d, args, dtype, optim, profile=False):
    """dtype: bf16, fp32, bf16nofast (bf16 with CTRL_NO_AVX512BF16=1: the path of a CPU without a
    fast bf16 GEMM), bf16rounded (bf16 with [train] bf16_fallback = rounded), or bf16avx2 / fp32avx2 (the AVX2 build with the AVX2 switches, avx2_build). CPU
    seconds per step: the user + system CPU of this run (TRL's process time counts both) less that of a
    one-step run, over the steps between (loading, saving and the first step's setup cancel out)."""
    r = ctrl_once(d, args, dtype, optim, args.steps, profile)
    if args.steps > 1:
        one = ctrl_once(d, args, dtype, optim, 1, False)
        r["cpu_per_step"] = (r["cpu_s"] - one["cpu_s"]) / (args.steps - 1)
    return r


def ctrl_once(d, args, dtype, optim, steps, profile):
    out = os.path.join(d, f"ctrl_{dtype}_{optim}_{steps}")
    ini = os.path.join(d, f"ctrl_{dtype}_{optim}_{steps}.ini")
    bu.write_ini(ini, {"run": bu.cpu_run(out), "model": {"path": f"{d}/model", "attention": "flash"},
                       "data": {"train_file": f"{d}/train.jsonl", "max_length": args.seq, "shuffle": "false"},
                       "train": bu.train_section("1e-5", steps, args.batch, 1, dtype=dtype[:4], optimizer=optim,
                                                 bf16_fallback="rounded" if dtype.endswith("rounded") else None)})
    env = bu.thread_env(args.threads, OPENBLAS_NUM_THREADS="1")
    ctrl, plugins, held = CTRL, PLUGINS, []
    if dtype.endswith("nofast"):
        env["CTRL_NO_AVX512BF16"] = "1"
    elif dtype.endswith("avx2"):
        ctrl, plugins, arch = avx2_build()
        env.update(AVX2_CTRL_ENV)
        held = [f"{ctrl} (built with -march={arch}), " + " ".join(f"{k}={v}" for k, v in AVX2_CTRL_ENV.items())]
    perf = ["perf", "record", "-q", "-F", "199", "-o", os.path.join(d, f"perf-{dtype}.data"), "--"] if profile else []
    run = bu.ctrl_train(ctrl, plugins, ini, env, prefix=perf)
    steps = bu.metrics(out, '"step"')
    notes = [l for l in run.stderr.splitlines()
             if "cpu: bf16" in l or "memory after the first step" in l or "bytes of state" in l]
    return {"tokens_per_second": steps[-1]["tokens_per_second"], "rss_mib": run.rss_mib, "loss": steps[-1]["loss"],
            "cpu_s": run.user_s + run.sys_s, "notes": held + notes}


def run_trl(d, args, dtype, optim):
    r, run = bu.child_json(bu.child_cmd(__file__, "--trl-child", d, args, ("threads", "steps", "batch", "seq"),
                                        "--dtype", dtype, "--trl-optim", optim),
                            env=dict(os.environ, **AVX2_TORCH_ENV) if dtype.endswith("avx2") else None)
    r.update(rss_mib=run.rss_mib, notes=[])
    return r


def trl_child(d, args):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    torch.set_num_threads(args.threads)
    isa = torch.backends.cpu.get_cpu_capability()
    if args.dtype.endswith("avx2") and isa != "AVX2":
        raise SystemExit(f"bench_scale: ATEN_CPU_CAPABILITY=avx2 did not take: torch reports {isa}")
    tok = AutoTokenizer.from_pretrained(os.path.join(d, "model"))
    model = AutoModelForCausalLM.from_pretrained(os.path.join(d, "model"), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    rows = bu.read_jsonl(os.path.join(d, "train.jsonl"))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = SFTConfig(**bu.trl_args(output_dir=tmp, bf16=args.dtype.startswith("bf16"), max_steps=args.steps,
                                      per_device_train_batch_size=args.batch, learning_rate=1e-5, logging_steps=1,
                                      max_length=args.seq, optim=args.trl_optim))
        trainer = bu.sequential(SFTTrainer)(model=model, args=cfg, train_dataset=Dataset.from_list(rows),
                                            processing_class=tok)
        seconds, cpu = bu.train_timed(trainer)
        tokens, loss = bu.last_logged(trainer, "num_tokens"), bu.last_logged(trainer, "loss")
    print(json.dumps({"tokens_per_second": tokens / seconds, "loss": loss, "cpu_per_step": cpu / args.steps,
                      "versions": f"torch {torch.__version__} ({isa}), trl {__import__('trl').__version__}"}))


def cpu_line():
    flags = open("/proc/cpuinfo").read().split("\nflags")[1].split("\n")[0].split(":", 1)[1].split()
    simd = [f for f in flags if f.startswith(("avx", "amx"))]
    return f"{bu.cpu_model()}, {os.cpu_count()} cores; {' '.join(simd)}"


def profile_report(d, name):
    if not shutil.which("perf"):
        print("profile: perf is not installed")
        return
    r = subprocess.run(["perf", "report", "-i", os.path.join(d, f"perf-{name.split('-')[1]}.data"), "--no-children",
                        "--sort", "symbol", "--stdio", "-q", "--percent-limit", "1.5"], capture_output=True, text=True)
    print(f"profile of {name} (perf, self time by symbol, >= 1.5%):")
    for line in r.stdout.splitlines():
        if line.strip():
            print("  " + line.strip())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--only", default="ctrl-bf16,ctrl-fp32,trl-bf16,trl-fp32")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--dir", help="work in this folder (kept; its model and data are reused) instead of a temporary one")
    p.add_argument("--trl-child")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--optim", default="adamw", help="ctrl's optimizer plugin for runs whose name gives none")
    p.add_argument("--trl-optim", default="adamw_torch")
    args = p.parse_args()
    if args.trl_child:
        return trl_child(args.trl_child, args)
    rows = []  # (name, side, dtype, [optim]), all checked before the first run
    for name in [n for n in args.only.split(",") if n not in ("", "none")]:  # none: make the model only
        side, dtype, *opt = name.split("-", 2) + [""]
        if (side, dtype) not in RUNS:
            raise SystemExit(f"bench_scale: --only {name}: not a run name (side-dtype[-optim], side-dtype one of "
                             + ", ".join("-".join(r) for r in RUNS) + ")")
        if side == "ctrl" and dtype.endswith("avx2"):
            avx2_build()
        rows.append((name, side, dtype, [o for o in opt if o]))
    if not os.path.isdir(TOK):
        raise SystemExit(f"bench_scale: no tokenizer at {TOK}")
    with (contextlib.nullcontext(args.dir) if args.dir else tempfile.TemporaryDirectory()) as d:
        os.makedirs(d, exist_ok=True)
        make_data(os.path.join(d, "train.jsonl"), rows=args.batch * args.steps + 8, words_per_row=args.seq * 2)
        config = os.path.join(d, "model", "config.json")
        if not os.path.isfile(config):
            bu.model_init(CTRL, PLUGINS, os.path.join(d, "model"),
                          bu.model_shape(896, args.layers, 14, 2, 4864, tie=True), TOK)
        elif json.load(open(config))["num_hidden_layers"] != args.layers:
            raise SystemExit(f"bench_scale: {config} is not a {args.layers}-layer model: use another --dir")
        print(f"machine: {cpu_line()}")
        print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {bu.load_average()} at start; "
              f"Qwen2.5-0.5B shape with {args.layers} of 24 layers, vocab 151,669, batch {args.batch} x "
              f"{args.seq} tokens, {args.steps} steps, {args.threads} thread(s)")
        tokens = args.batch * args.seq
        results = {}
        for name, side, dtype, opt in rows:
            if side == "ctrl":
                r = run_ctrl(d, args, dtype, opt[0] if opt else args.optim, args.profile)
            else:
                r = run_trl(d, args, dtype, opt[0] if opt else "adamw_torch")
            results[name] = r
            cps = r.get("cpu_per_step")
            print(f"{name:15s} {r['tokens_per_second']:8.1f} tokens/s  {tokens / r['tokens_per_second']:7.2f} s/step  "
                  + (f"CPU {cps:6.2f} s/step ({tokens / cps:6.1f} tokens/CPU-s)  " if cps else "")
                  + f"peak RSS {r['rss_mib']:7.0f} MiB  loss {r['loss']:.4f}"
                  + (f"  ({r['versions']})" if "versions" in r else ""), flush=True)
            for n in r["notes"]:
                print(f"           log: {n}")
        for c in [n for n in results if n.startswith("ctrl-")]:
            for t in [n for n in results if n.startswith("trl-")]:
                rc, rt = results[c], results[t]
                cpu = (f", {rt['cpu_per_step'] / rc['cpu_per_step']:.2f}x by CPU time per step"
                       if rc.get("cpu_per_step") and rt.get("cpu_per_step") else "")
                print(f"{c} / {t}: {rc['tokens_per_second'] / rt['tokens_per_second']:.2f}x tokens/s{cpu}, "
                      f"at {rc['rss_mib'] / rt['rss_mib']:.2f}x peak RSS")
        print(f"load average {bu.load_average()} at end")
        if args.profile:
            for name in [n for n in results if n.startswith("ctrl-")]:
                profile_report(d, name)


if __name__ == "__main__":
    main()
