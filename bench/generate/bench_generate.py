"""Generation throughput: ctrl generate against transformers' model.generate on the same model,
prompts and settings, in the same run; and ctrl with prefix sharing on and off.

A random-initialized Qwen2-shaped model (`ctrl model init`, hidden 256, 4 layers, 8 heads over 2
KV heads, vocabulary 1024, the project's tiny BPE tokenizer), 64 prompts of 40-60 tokens, 8
samples each (n / num_return_sequences = 8), 128 new tokens at most, temperature 1.0, 2 threads.
Output tokens per second counts the tokens actually generated (a sample may stop at EOS).
Prefix sharing off: the same 512 sequences sent as 512 requests of n = 1 (no fork of the prompt's
KV blocks); the KV blocks the prompts take are counted from the block size.

    python3 bench/generate/bench_generate.py [--ctrl build/ctrl] [--threads 2]
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOK = os.path.join(ROOT, "tests/fixtures/tokenizer/tiny_bpe")


def ctrl_generate(args, model, prompts_file, n, out):
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    plugins = os.path.join(os.path.dirname(os.path.abspath(args.ctrl)), "plugins")
    r = subprocess.run([args.ctrl, "--plugin-dir", plugins, "generate", "--model", model, "--prompts", prompts_file, "--n", str(n),
                        "--max-tokens", str(args.max_tokens), "--temperature", "1.0", "--seed", "1",
                        "--kv-cache-mb", "512", "--out", out], env=env, capture_output=True, text=True, check=True)
    line = [l for l in r.stderr.splitlines() if "tokens/s" in l and "prompts x" in l][-1]
    m = re.search(r"(\d+) tokens in ([\d.]+) s .* (\d+) shared prompt blocks", line)
    return {"tokens": int(m.group(1)), "seconds": float(m.group(2)), "shared_blocks": int(m.group(3))}


def transformers_generate(args, model, prompts, n):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(TOK)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    enc = tok(prompts, return_tensors="pt", padding=True)
    torch.manual_seed(1)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = m.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.max_tokens,
                         num_return_sequences=n, pad_token_id=tok.pad_token_id)
    dt = time.perf_counter() - t0
    new = out[:, enc["input_ids"].shape[1]:]
    eos = tok.eos_token_id
    tokens = 0
    for row in new.tolist():  # up to and including the first EOS, as ctrl counts
        tokens += next((i + 1 for i, t in enumerate(row) if t == eos), len(row))
    return {"tokens": tokens, "seconds": dt}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctrl", default=os.path.join(ROOT, "build/ctrl"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ctrl-bench-gen-")
    model = os.path.join(work, "model")
    subprocess.run([args.ctrl, "model", "init", "--arch", "qwen2", "--hidden", "256", "--layers", "4", "--heads",
                    "8", "--kv-heads", "2", "--intermediate", "1024", "--tokenizer", TOK, "--out", model], check=True,
                   stdout=subprocess.DEVNULL)
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(os.path.join(TOK, "tokenizer.json"))
    rows = [json.loads(l) for l in open(os.path.join(ROOT, "tests/fixtures/tokenizer/corpus.jsonl"))]
    corpus = [r["text"] for r in rows if "text" in r]
    rng = random.Random(7)
    prompts = []
    while len(prompts) < 64:  # 40-60 tokens each
        ids = tk.encode(" ".join(rng.sample(corpus, 6))).ids
        if len(ids) >= 40:
            prompts.append(tk.decode(ids[: rng.randint(40, 60)]))
    shared = os.path.join(work, "prompts.jsonl")
    with open(shared, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}) + "\n")
    separate = os.path.join(work, "prompts_x8.jsonl")
    with open(separate, "w") as f:
        for p in prompts:
            for _ in range(8):
                f.write(json.dumps({"prompt": p}) + "\n")
    on = ctrl_generate(args, model, shared, 8, os.path.join(work, "on.jsonl"))
    off = ctrl_generate(args, model, separate, 1, os.path.join(work, "off.jsonl"))
    hf = transformers_generate(args, model, prompts, 8)
    prompt_tokens = [len(tk.encode(p).ids) for p in prompts]
    blocks_off = sum(8 * ((p + 15) // 16) for p in prompt_tokens)
    print(f"64 prompts x 8 samples, <= {args.max_tokens} new tokens, {args.threads} threads")
    rate = lambda r: r["tokens"] / r["seconds"]
    print(f"{'':34}{'tokens':>8}{'seconds':>9}{'tokens/s':>10}{'vs HF':>8}")
    for name, r in [("ctrl, prefix sharing on", on), ("ctrl, prefix sharing off", off),
                    ("transformers generate", hf)]:
        print(f"{name:34}{r['tokens']:8d}{r['seconds']:9.2f}{rate(r):10.0f}{rate(r) / rate(hf):7.1f}x")
    print(f"prompt KV blocks: {blocks_off} without sharing, {blocks_off - on['shared_blocks']} with "
          f"({on['shared_blocks']} shared)")
    print(json.dumps({"ctrl_shared": on, "ctrl_unshared": off, "transformers": hf,
                      "speedup": rate(on) / rate(hf)}))


if __name__ == "__main__":
    sys.exit(main())
