#!/usr/bin/env python3
"""The LM head as transformers computes it (materialised logits, log_softmax, gather) on the same
shape as bench_cuda_head: forward + backward time (CUDA events, median of 10) and peak memory
(torch.cuda.max_memory_allocated over the step, inputs and gradients included). fp32.
usage: torch_head.py [T]"""
import statistics
import sys

import torch


def main():
    T = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    C, V = 896, 151936
    torch.backends.cuda.matmul.allow_tf32 = False  # true fp32, as ctrl's fp32 head
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    h = ((torch.rand(T, C, device="cuda") - 0.5) * 2).requires_grad_(True)
    w = ((torch.rand(V, C, device="cuda") - 0.5) * 0.1).requires_grad_(True)
    tg = (torch.arange(T, device="cuda") * 7919) % V
    dl = torch.rand(T, device="cuda") - 0.5
    times = []
    for r in range(12):
        h.grad = None
        w.grad = None
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        logits = h @ w.T
        logp = torch.log_softmax(logits, dim=-1).gather(1, tg[:, None])[:, 0]
        (logp * dl).sum().backward()
        e.record()
        e.synchronize()
        if r >= 2:
            times.append(s.elapsed_time(e))
        del logits, logp
    ms = statistics.median(times)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    print("torch  head fp32 T=%d C=%d V=%d: fwd+bwd %.1f ms (%.1f TFLOP/s at 3 GEMMs), peak %.2f GiB"
          % (T, C, V, ms, 3 * 2 * T * C * V / ms / 1e9, peak))


if __name__ == "__main__":
    main()
