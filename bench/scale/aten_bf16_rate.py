#!/usr/bin/env python3
"""What TRL's bf16=True step would cost on this CPU, from torch's own bf16 matmul rate at the step's shapes.

On a CPU without AVX-512 (BW/VL/DQ) torch does not hand bf16 matmuls to oneDNN and multiplies them in
ATen's fallback at a few GFLOP/s, so a 24-layer `trl-bf16` row of bench_scale.py would take tens of
minutes a step. This times F.linear under torch.autocast(cpu, bfloat16), forward and backward (dX and
dW), at the Qwen2.5-0.5B projections' shapes (hidden 896, 14 heads of 64, 2 KV heads, intermediate 4864)
and the tied head's (896 -> 151,669, a slice of --head-cols columns, scaled), for --tokens rows, one
thread, by thread CPU time, and prints each shape's GFLOP/s and the step's matmul time that follows:
per layer forward + recompute (TRL's default gradient checkpointing) + dX + dW, for batch x seq tokens;
the head forward + dX + dW. Everything else in TRL's step (attention, norms, AdamW) is left out, so
the estimate is a lower bound.
usage: bench/scale/aten_bf16_rate.py [--tokens 256] [--layers 24] [--batch-tokens 1024] [--head-cols 8192]"""
import argparse
import time

import torch
import torch.nn.functional as F

PROJ = [("q", 896, 896), ("k", 896, 128), ("v", 896, 128), ("o", 896, 896), ("gate", 896, 4864),
        ("up", 896, 4864), ("down", 4864, 896)]


def rate(t, inp, out):
    """(forward GFLOP/s, backward GFLOP/s) of a [t x inp] x [inp x out] bf16 autocast linear, thread CPU time"""
    x = torch.randn(t, inp, requires_grad=True)
    w = torch.randn(out, inp, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = F.linear(x, w)  # warm
    c0 = time.thread_time()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = F.linear(x, w)
    c1 = time.thread_time()
    y.float().sum().backward()
    c2 = time.thread_time()
    flop = 2.0 * t * inp * out
    return flop / (c1 - c0) / 1e9, 2 * flop / (c2 - c1) / 1e9


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--batch-tokens", type=int, default=1024)
    p.add_argument("--head-cols", type=int, default=8192)
    a = p.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, one thread, "
          f"{a.tokens} rows a product")
    n = a.batch_tokens
    layer_s = 0.0
    for name, inp, out in PROJ:
        f, b = rate(a.tokens, inp, out)
        flop = 2.0 * n * inp * out
        layer_s += 2 * flop / (f * 1e9) + 2 * flop / (b * 1e9)  # forward twice (recompute), dX + dW
        print(f"  {name:5s} [{a.tokens} x {inp}] x [{inp} x {out}]: forward {f:6.2f} GFLOP/s, backward {b:6.2f}")
    f, b = rate(a.tokens, 896, a.head_cols)
    flop = 2.0 * n * 896 * 151669
    head_s = flop / (f * 1e9) + 2 * flop / (b * 1e9)
    print(f"  head  [{a.tokens} x 896] x [896 x {a.head_cols}] (of 151,669): forward {f:6.2f} GFLOP/s, "
          f"backward {b:6.2f}")
    print(f"estimate for {n} tokens: {layer_s:.0f} s a layer's projections, {head_s:.0f} s the head: "
          f"{a.layers * layer_s + head_s:.0f} s a step's matmuls at {a.layers} layers (a lower bound for TRL's step)")


if __name__ == "__main__":
    main()
