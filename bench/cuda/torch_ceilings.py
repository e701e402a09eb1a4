#!/usr/bin/env python3
"""The same two ceilings through PyTorch, for the ratio: device-to-device copy bandwidth (read +
write bytes) and a bf16 GEMM, random inputs, CUDA events, median of repetitions.
usage: torch_ceilings.py [--quick]"""
import statistics
import sys

import torch


def timed(fn, reps, inner=1):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(inner):
            fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3 / inner)
    return statistics.median(times)


def main():
    quick = "--quick" in sys.argv
    reps = 5 if quick else 20
    nbytes = (512 if quick else 2048) << 20
    a = torch.rand(nbytes // 4, device="cuda")
    b = torch.empty_like(a)
    t = timed(lambda: b.copy_(a), reps)
    print("torch  copy_bandwidth_GBps %.0f" % (2 * nbytes / t / 1e9))
    n = 4096 if quick else 8192
    x = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) - 0.5
    w = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) - 0.5
    t = timed(lambda: torch.nn.functional.linear(x, w), reps, inner=5)
    print("torch  bf16_gemm_%d_TFLOPs %.1f" % (n, 2 * n**3 / t / 1e12))


if __name__ == "__main__":
    main()
