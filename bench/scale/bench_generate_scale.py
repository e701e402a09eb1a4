#!/usr/bin/env python3
"""Generation at a real model's size on the CPU: `ctrl generate` (paged KV cache, continuous batching)
against transformers' `generate`, greedy, at 1, 8 and 64 concurrent sequences, in one run.

The model is a random-init Qwen2.5-0.5B-shaped Qwen2 (hidden 896, 14 heads, 2 KV heads, intermediate
4864, tied embeddings; 24 layers unless --layers says fewer) made by `ctrl model init` with the real
Qwen3 tokenizer (151,669 tokens) from ../shared/data/tokenizers/qwen3. Each concurrency level N runs
N prompts of --prompt-len tokens (one-token words, so every prompt has the same length and
transformers needs no padding), --max-tokens new tokens each, temperature 0. Each run is its own
process (its peak RSS is its own):
  ctrl-bf16   ctrl generate --dtype bf16 (bf16 GEMMs, bf16 KV cache)
  ctrl-fp32   ctrl generate --dtype fp32
  hf-fp32     transformers generate, the model in fp32 (what from_pretrained gives)
  hf-bf16     transformers generate, the model loaded in bf16
Reported: new tokens / generation wall time (prefill included; model loading not), the generation's
CPU seconds (ctrl: the log line's process CPU time over the generation; transformers:
time.process_time() around generate), peak RSS of the process, and how many sequences' greedy
tokens equal hf-fp32's (a random model's logits are close together, so bf16 rounding changes some).
The machine is shared: the load average is printed at the start and end of every run.
usage: bench/scale/bench_generate_scale.py [--layers N] [--seqs 1,8,64] [--prompt-len N]
       [--max-tokens N] [--threads N] [--only ctrl-bf16,ctrl-fp32,hf-fp32,hf-bf16] [--ids-out FILE]
       (after scripts/build.sh)"""
import argparse
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402

TOK = bu.qwen3_tokenizer()
CTRL, PLUGINS = bu.build_paths("BUILD")
# words the Qwen3 tokenizer keeps as one token each (with their leading space)
WORDS = ("the model learns a gradient from each token of the batch while the optimizer moves every weight by its "
         "own step size and the loss falls over time as training goes on").split()


def make_prompts(path, n, length, seed):
    import random

    rng = random.Random(seed)
    rows = [" ".join(rng.choices(WORDS, k=length)) for _ in range(n)]
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps({"prompt": r}) + "\n")
    return rows


def run_ctrl(d, args, dtype, n):
    prompts, out = os.path.join(d, f"prompts_{n}.jsonl"), os.path.join(d, f"ctrl_{dtype}_{n}.jsonl")
    cmd = [CTRL, "--plugin-dir", PLUGINS, "generate", "--model", os.path.join(d, "model"), "--prompts", prompts,
           "--max-tokens", str(args.max_tokens), "--temperature", "0", "--dtype", dtype,
           "--kv-cache-mb", str(args.kv_cache_mb), "--out", out]
    run = bu.run_child(cmd, env=bu.thread_env(args.threads, OPENBLAS_NUM_THREADS=str(args.threads)),
                       what="ctrl generate")
    line = [l for l in run.stderr.splitlines() if "tokens/s" in l and "prompts x" in l][-1]
    m = re.search(r"(\d+) tokens in ([\d.]+) s \(\d+ tokens/s, ([\d.]+) CPU s\)", line)
    ids = [c["token_ids"] for r in bu.read_jsonl(out) for c in r["completions"]]
    return {"tokens": int(m.group(1)), "seconds": float(m.group(2)), "cpu_s": float(m.group(3)),
            "rss_mib": run.rss_mib, "ids": ids}


def run_hf(d, args, dtype, n):
    r, run = bu.child_json(bu.child_cmd(__file__, "--hf-child", d, args, ("threads", "max_tokens"), "--dtype",
                                        dtype, "--n", str(n)), what="transformers generate")
    r["rss_mib"] = run.rss_mib
    return r


def hf_child(d, args):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(os.path.join(d, "model"))
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(os.path.join(d, "model"), dtype=dt).eval()
    prompts = [r["prompt"] for r in bu.read_jsonl(os.path.join(d, f"prompts_{args.n}.jsonl"))]
    tok.padding_side = "left"  # the prompts are all --prompt-len one-token words: no padding in fact
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    enc = tok(prompts, return_tensors="pt", padding=True)
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=args.max_tokens,
                             pad_token_id=tok.pad_token_id)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ids = []
    for row in out[:, enc["input_ids"].shape[1]:].tolist():  # up to and including the first EOS, as ctrl
        k = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        ids.append(row[:k])
    print(json.dumps({"tokens": sum(map(len, ids)), "seconds": wall, "cpu_s": cpu, "ids": ids,
                      "versions": f"torch {torch.__version__}, transformers {__import__('transformers').__version__}"}))


def agree(a, b):
    """How many sequences of a equal b's, and the mean fraction of positions equal before the first
    difference."""
    same = sum(x == y for x, y in zip(a, b))
    prefix = [next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y))) / max(len(y), 1)
              for x, y in zip(a, b)]
    return same, sum(prefix) / max(len(prefix), 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--seqs", default="1,8,64")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--kv-cache-mb", type=int, default=512)
    p.add_argument("--only", default="ctrl-bf16,ctrl-fp32,hf-fp32,hf-bf16")
    p.add_argument("--model", help="an existing model folder to use instead of making one")
    p.add_argument("--ids-out", help="write every row's greedy token ids here (JSON: {\"run/seqs\": ids}), "
                   "to compare rows measured in separate runs")
    p.add_argument("--hf-child")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--n", type=int, default=1)
    args = p.parse_args()
    if args.hf_child:
        return hf_child(args.hf_child, args)
    if not os.path.isdir(TOK):
        raise SystemExit(f"bench_generate_scale: no tokenizer at {TOK}")
    with tempfile.TemporaryDirectory() as d:
        if args.model:
            os.symlink(os.path.abspath(args.model), os.path.join(d, "model"))
        else:
            bu.model_init(CTRL, PLUGINS, os.path.join(d, "model"),
                          bu.model_shape(896, args.layers, 14, 2, 4864, tie=True), TOK, seed=1)
        seqs = [int(s) for s in args.seqs.split(",")]
        for n in seqs:
            make_prompts(os.path.join(d, f"prompts_{n}.jsonl"), n, args.prompt_len, seed=n)
        print(f"machine: {bu.machine()}")
        print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {bu.load_average()} at start; "
              f"Qwen2.5-0.5B shape with {args.layers} of 24 layers, vocab 151,669; prompts of {args.prompt_len} "
              f"tokens, {args.max_tokens} new tokens each, greedy, {args.threads} thread(s)")
        print(f"{'run':10s}{'seqs':>5s}{'tokens':>8s}{'wall s':>9s}{'tokens/s':>10s}{'CPU s':>9s}{'tok/CPU-s':>10s}"
              f"{'RSS MiB':>9s}  load")
        table = {}
        for n in seqs:
            for name in args.only.split(","):
                side, dtype = name.split("-")
                r = run_ctrl(d, args, dtype, n) if side == "ctrl" else run_hf(d, args, dtype, n)
                table[(name, n)] = r
                print(f"{name:10s}{n:5d}{r['tokens']:8d}{r['seconds']:9.2f}{r['tokens'] / r['seconds']:10.1f}"
                      f"{r['cpu_s']:9.2f}{r['tokens'] / max(r['cpu_s'], 1e-9):10.1f}{r['rss_mib']:9.0f}  "
                      f"{bu.load_average()}", flush=True)
        for n in seqs:  # greedy tokens against transformers fp32's
            ref = table.get(("hf-fp32", n))
            for name in args.only.split(","):
                if ref and name != "hf-fp32" and (name, n) in table:
                    k, frac = agree(table[(name, n)]["ids"], ref["ids"])
                    print(f"{n:3d} seqs {name}: {k}/{n} sequences equal hf-fp32's greedy tokens (on average "
                          f"{frac:.0%} of each before the first difference)")
        for n in seqs:
            for c in ("ctrl-bf16", "ctrl-fp32"):
                for h in ("hf-fp32", "hf-bf16"):
                    if (c, n) in table and (h, n) in table:
                        rc, rh = table[(c, n)], table[(h, n)]
                        print(f"{n:3d} seqs {c} / {h}: {rc['tokens'] / rc['seconds'] / (rh['tokens'] / rh['seconds']):.2f}x"
                              f" by wall clock, {rc['tokens'] / rc['cpu_s'] / (rh['tokens'] / rh['cpu_s']):.2f}x by CPU "
                              f"time, {rc['rss_mib'] / rh['rss_mib']:.2f}x peak RSS")
        if args.ids_out:
            with open(args.ids_out, "w") as f:
                json.dump({f"{name}/{n}": r["ids"] for (name, n), r in table.items()}, f)
        vs = [r.get("versions") for r in table.values() if r.get("versions")]
        print(f"load average {bu.load_average()} at end" + (f"; {vs[0]}" if vs else ""))


if __name__ == "__main__":
    main()
