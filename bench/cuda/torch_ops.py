#!/usr/bin/env python3
"""The ops of bench_cuda_ops in PyTorch, same shapes and byte counts: HF's RMSNorm (fp32) forward
and backward, F.silu(g) * u forward and backward, rotate-half RoPE, torch.optim.AdamW(fused=True)
over 494M parameters. CUDA events, median of 7 timings."""
import statistics

import torch
import torch.nn.functional as F

T, C, I, H, D, P = 8192, 896, 4864, 14, 64, 494032768


def timed(fn, inner=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(7):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(inner):
            fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / inner)
    return statistics.median(ts)


def rms(x, w):
    v = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(v + 1e-6))


def report(name, ms, nbytes):
    print("torch  %-12s %8.3f ms  %6.0f GB/s" % (name, ms, nbytes / ms / 1e6))


def main():
    dev = "cuda"
    x = torch.rand(T, C, device=dev, requires_grad=True)
    w = torch.rand(C, device=dev, requires_grad=True)
    dout = torch.rand(T, C, device=dev)
    report("rmsnorm_fwd", timed(lambda: rms(x, w)), 2 * T * C * 4)
    y = rms(x, w)
    report("rmsnorm_bwd", timed(lambda: torch.autograd.grad(y, (x, w), dout, retain_graph=True)), 3 * T * C * 4)
    g = torch.rand(T, I, device=dev, requires_grad=True)
    u = torch.rand(T, I, device=dev, requires_grad=True)
    report("swiglu_fwd", timed(lambda: F.silu(g) * u), 3 * T * I * 4)
    o = F.silu(g) * u
    do = torch.rand(T, I, device=dev)
    report("swiglu_bwd", timed(lambda: torch.autograd.grad(o, (g, u), do, retain_graph=True)), 5 * T * I * 4)
    q = torch.rand(T, H, D, device=dev)
    pos = torch.arange(T, device=dev) % 2048
    inv = 1.0 / (1e6 ** (torch.arange(0, D, 2, device=dev).float() / D))
    ang = pos[:, None].float() * inv[None, :]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]

    def rope():
        x1, x2 = q[..., : D // 2], q[..., D // 2:]
        return q * cos + torch.cat([-x2, x1], -1) * sin

    report("rope_fwd", timed(rope), 2 * T * H * D * 4)
    del x, w, g, u, o, do, q
    p = torch.nn.Parameter(torch.rand(P, device=dev))
    p.grad = torch.rand(P, device=dev)
    opt = torch.optim.AdamW([p], lr=1e-5, weight_decay=0.01, fused=True)
    report("adamw_494M", timed(opt.step, inner=3), 28 * P)


if __name__ == "__main__":
    main()
