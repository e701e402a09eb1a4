#!/usr/bin/env python3
"""SFT on one GPU, ctrl against a plain PyTorch + transformers training loop, in one run: the same
random-init Qwen2-shaped model (made by `ctrl model init`), the same fixed-length text rows
(every row exactly --seq tokens, so neither side pads), the same batch, steps, learning rate and
AdamW. ctrl runs `ctrl train` with [run] device = cuda, once per --dtypes entry; the peer runs
AdamW(fused=True, no weight decay, linear decay: ctrl's defaults) with bf16 autocast (for bf16) or in fp32 with TF32 off (for fp32), SDPA attention,
loss over every token. Reported: training tokens/s of the steady state (steps after the first two,
from ctrl's per-step metrics and the peer's CUDA-synchronised step times), peak GPU memory used by
the process (nvidia-smi, sampled every 50 ms, minus the idle value), final loss, and the ratios.
usage: bench/cuda/bench_sft_cuda.py --build build-gpu [--tokenizer DIR] [--hidden 896 --layers 24
       --heads 14 --kv-heads 2 --intermediate 4864] [--batch 8 --seq 512 --steps 12]
       [--ctrl-env ';CTRL_NO_BF16_OPERANDS=1;CTRL_CUDA_GEMM_TUNE=1' (ctrl once per variant)]"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402

ROOT = bu.ROOT


class GpuMemory:
    """Peak of nvidia-smi's used memory while the block runs, minus the value before it."""

    def __enter__(self):
        self.base = self.read()
        self.peak = self.base
        self.stop = False
        self.t = threading.Thread(target=self.poll, daemon=True)
        self.t.start()
        return self

    def read(self):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True).stdout
        except OSError:  # no nvidia-smi (the emulation build): no memory reading
            return 0.0
        return float(out.split()[0]) if out.strip() else 0.0

    def poll(self):
        while not self.stop:
            self.peak = max(self.peak, self.read())
            time.sleep(0.05)

    def __exit__(self, *exc):
        self.stop = True
        self.t.join()
        self.mib = self.peak - self.base


def make_data(path, tokenizer_dir, n_rows, seq, seed=0):
    """Rows of random words cut to exactly `seq` tokens by the model's own tokenizer (no BOS/EOS
    added by either side: the text is re-decoded from its first `seq` ids)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    rng = random.Random(seed)
    words = ("alpha beta gamma delta tensor kernel gradient batch token model layer cache vector matrix "
             "the of and to in is that for it with as was on be by this are from").split()
    ids_rows = []
    with open(path, "w") as f:
        while len(ids_rows) < n_rows:
            text = " ".join(rng.choices(words, k=seq * 2))
            ids = tok(text, add_special_tokens=False)["input_ids"][:seq]
            back = tok.decode(ids)
            again = tok(back, add_special_tokens=False)["input_ids"]
            if again != ids:
                continue
            ids_rows.append(ids)
            f.write(json.dumps({"text": back}) + "\n")
    return ids_rows


def ctrl_env():
    """ctrl's environment: CTRL_LIBS (bench/gpu.sh: the carried libraries) as its library path, which
    this Python process runs without."""
    env = dict(os.environ)
    if os.environ.get("CTRL_LIBS"):
        env["LD_LIBRARY_PATH"] = os.environ["CTRL_LIBS"]
    return env


def run_ctrl(args, d, dtype, variant=""):
    """variant: comma-separated KEY=VAL added to ctrl's environment and --set=section.key=value passed
    to `ctrl train` ("": none)."""
    tag = f"{dtype}_{abs(hash(variant)) % 10**8}" if variant else dtype
    out = os.path.join(d, f"ctrl_{tag}")
    ini = os.path.join(d, f"ctrl_{tag}.ini")
    with open(ini, "w") as f:
        f.write(f"""[run]
output_dir = {out}
device = cuda
[model]
path = {d}/model
attention = {args.attention}
[data]
train_file = {d}/train.jsonl
max_length = {args.seq}
shuffle = false
[train]
dtype = {dtype}
learning_rate = 1e-4
max_steps = {args.steps}
per_device_train_batch_size = {args.batch}
logging_steps = 1
save_strategy = no
""")
    ctrl = os.path.join(args.build, "ctrl")
    env = ctrl_env()
    items = [kv for kv in variant.split(",") if "=" in kv]
    env.update(kv.split("=", 1) for kv in items if not kv.startswith("--set="))
    sets = [kv for kv in items if kv.startswith("--set=")]
    with GpuMemory() as mem:
        r = subprocess.run([ctrl, "--plugin-dir", os.path.join(args.build, "plugins"), "train", ini] + sets,
                           capture_output=True, text=True, timeout=args.timeout, env=env)
    if r.returncode != 0:
        print(f"ctrl {dtype}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        return None
    rows = [r for r in bu.metrics(out) if "step" in r]
    steady = rows[2:] if len(rows) > 3 else rows
    tps = sum(r["tokens_per_second"] for r in steady) / len(steady)
    return {"tokens_per_second": tps, "gpu_mib": mem.mib, "loss": rows[-1]["loss"]}


def torch_child(args, d, dtype, ids_rows):
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(os.path.join(d, "model"), dtype=torch.float32,
                                                 attn_implementation="sdpa").cuda()
    model.train()
    # ctrl's (and TRL's) defaults: no weight decay, the learning rate decaying linearly to 0
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / args.steps)
    times, loss = [], None
    for step in range(args.steps):
        batch = ids_rows[step * args.batch:(step + 1) * args.batch]
        x = torch.tensor(batch, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=(dtype == "bf16")):
            logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        del logits
    steady = times[2:] if len(times) > 3 else times
    tokens = args.batch * (args.seq - 1)
    print(json.dumps({"tokens_per_second": tokens / (sum(steady) / len(steady)), "loss": loss.item(),
                      "torch_peak_mib": torch.cuda.max_memory_allocated() / 2**20,
                      "versions": f"torch {torch.__version__}"}))


def run_torch(args, d, dtype):
    cmd = bu.child_cmd(__file__, "--torch-child", d, args, ("build", "tokenizer", "batch", "seq", "steps"), "--dtype",
                       dtype)
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    with GpuMemory() as mem:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if r.returncode != 0:
        print(f"torch {dtype}: exit {r.returncode}\n{r.stderr[-3000:]}")
        return None
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["gpu_mib"] = mem.mib
    return res


def n_params(a):
    """Parameters that do matrix work per token: every layer's projections and the LM head."""
    kv = a.hidden // a.heads * a.kv_heads
    layer = a.hidden * a.hidden * 2 + a.hidden * kv * 2 + 3 * a.hidden * a.intermediate
    vocab = json.load(open(os.path.join(a.model_dir, "config.json")))["vocab_size"]
    return a.layers * layer + vocab * a.hidden


def flops_per_token(a):
    """Training FLOPs per token: 6 per parameter (forward + backward) and causal attention's
    QK^T and PV, 6·L·h·s (half of the 12·L·h·s of full attention)."""
    return 6 * n_params(a) + 6 * a.layers * a.hidden * a.seq


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build-gpu"))
    p.add_argument("--tokenizer", default=os.path.join(ROOT, "tests", "fixtures", "tokenizer", "tiny_bpe"))
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=4864)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--attention", default="flash")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--ctrl-env", default="",
                   help="ctrl run once per variant, variants separated by ';', each a comma-separated list of "
                        "KEY=VAL added to ctrl's environment and --set=section.key=value passed to ctrl train ('' = "
                        "as it is), e.g. ';CTRL_NO_BF16_OPERANDS=1;CTRL_CUDA_GEMM_TUNE=1;--set=memory.strategies=' "
                        "(the last: no checkpointing, every activation kept); each compared with the one PyTorch run")
    p.add_argument("--timeout", type=int, default=240)
    p.add_argument("--torch-child")
    p.add_argument("--dtype")
    args = p.parse_args()
    if args.torch_child:
        rows = [json.loads(l)["ids"] for l in open(os.path.join(args.torch_child, "ids.jsonl"))]
        return torch_child(args, args.torch_child, args.dtype, rows)
    with tempfile.TemporaryDirectory() as d:
        args.model_dir = os.path.join(d, "model")
        bu.model_init(os.path.join(args.build, "ctrl"), os.path.join(args.build, "plugins"), args.model_dir,
                      bu.model_shape(args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate, tie=True),
                      args.tokenizer, env=ctrl_env())
        ids_rows = make_data(os.path.join(d, "train.jsonl"), os.path.join(d, "model"),
                             args.batch * args.steps, args.seq)
        with open(os.path.join(d, "ids.jsonl"), "w") as f:
            for ids in ids_rows:
                f.write(json.dumps({"ids": ids}) + "\n")
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True).stdout.strip()
        except OSError:
            gpu = "no GPU (nvidia-smi missing)"
        print(f"sft on {gpu}: qwen2 hidden {args.hidden} x {args.layers} layers, heads {args.heads}/{args.kv_heads}, "
              f"intermediate {args.intermediate}, tokenizer {os.path.basename(args.tokenizer.rstrip('/'))}; "
              f"batch {args.batch} x {args.seq} tokens, {args.steps} steps (steady state: steps 3+)")
        for dtype in args.dtypes.split(","):
            variants = args.ctrl_env.split(";")
            cs_all = [(v, run_ctrl(args, d, dtype, v)) for v in variants]
            t = run_torch(args, d, dtype)
            ts = (f"{t['tokens_per_second']:9.0f} tok/s {t['gpu_mib']:7.0f} MiB loss {t['loss']:.4f} "
                  f"({t['versions']}, allocator peak {t['torch_peak_mib']:.0f} MiB)") if t else "failed"
            for v, c in cs_all:
                label = f"ctrl[{v}]" if v else "ctrl"
                cs = f"{c['tokens_per_second']:9.0f} tok/s {c['gpu_mib']:7.0f} MiB loss {c['loss']:.4f}" if c else "failed"
                print(f"  {dtype}: {label} {cs} | torch {ts}")
                for name, r in ((label, c), ("torch", t)):
                    if r and (name != "torch" or v == variants[-1]):
                        print(f"  {dtype}: {name} {r['tokens_per_second'] * flops_per_token(args) / 1e12:.1f} model "
                              f"TFLOP/s (6N + 6·L·h·s per token, N = {n_params(args) / 1e6:.0f} M with the head)")
                if c and t:
                    print(f"  {dtype}: {label} ratio {c['tokens_per_second'] / t['tokens_per_second']:.2f}x torch's "
                          f"tokens/s at {c['gpu_mib'] / max(t['gpu_mib'], 1):.2f}x its GPU memory")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
