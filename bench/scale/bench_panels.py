#!/usr/bin/env python3
"""A linear layer's two products on W at a Qwen2.5-0.5B-shaped model's projections, with W packed in
every call against W held as pre-packed bf16 panels (kernels/cpu/gemm_bf16.c), in one process, rounds
interleaved so that a shared machine's load falls on all alike:
  forward x W^T   per call: ctrl_cpu_gemm_bf16 on the fp32 W (rounded and packed in every call)
                  panels:   ctrl_cpu_gemm_bf16_packed on the panels packed once
  dX = dY W       per call: ctrl_cpu_gemm_bf16 on the fp32 W
                  read transposed: ctrl_cpu_gemm_bf16_packed_t on the forward's panels (re-paired
                            16 x 16 as they are read: what ctrl does, no second copy)
                  second layout:   ctrl_cpu_gemm_bf16_packed on W packed a second time for dX (the
                            alternative: +2 bytes a weight)
Reported: the median of --rounds rounds per shape in ms of the calling thread's CPU time (one thread;
--clock wall with more), and the bytes each layout holds. usage: bench/scale/bench_panels.py
[--tokens 1024] [--rounds 5] [--threads 1] [--clock cpu|wall]   (after scripts/build.sh)"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402
import gemm_bench as gb  # noqa: E402


def main():
    args = gb.parse_args()
    import numpy as np  # after the thread variables

    ctrl, path = gb.load_ctrl()
    ptr = lambda a: a.ctypes.data_as(gb.FP)
    T = args.tokens
    print(gb.machine_line(args, path))
    print(f"{'projection':9s} {'IN':>5s} {'OUT':>5s} | {'fwd/call':>8s} {'fwd pan':>8s} | {'dX/call':>8s} "
          f"{'dX t':>8s} {'dX 2nd':>8s} | {'W bf16 MiB':>10s} {'panels':>7s} {'+2nd':>7s}   ms, median of "
          f"{args.rounds}, {args.clock} clock")
    rng = np.random.default_rng(0)
    tot = [0.0] * 5
    for name, IN, OUT in gb.PROJECTIONS:
        W = rng.standard_normal((OUT, IN), dtype=np.float32)
        x = rng.standard_normal((T, IN), dtype=np.float32)
        dy = rng.standard_normal((T, OUT), dtype=np.float32)
        out = np.empty((T, OUT), np.float32)
        dx = np.empty((T, IN), np.float32)
        fwd = ctrl.ctrl_cpu_gemm_bf16_pack(1, OUT, IN, ptr(W), IN)  # op(B) = W^T [IN, OUT]
        bwd = ctrl.ctrl_cpu_gemm_bf16_pack(0, IN, OUT, ptr(W), IN)  # op(B) = W [OUT, IN]
        if not fwd or not bwd:
            raise SystemExit("no bf16 GEMM kernel here (ctrl_cpu_gemm_bf16_pack refused)")
        fns = [lambda: ctrl.ctrl_cpu_gemm_bf16(0, 1, T, OUT, IN, ptr(x), IN, ptr(W), IN, ptr(out), OUT, 0),
               lambda: ctrl.ctrl_cpu_gemm_bf16_packed(0, T, ptr(x), IN, fwd, ptr(out), OUT, 0),
               lambda: ctrl.ctrl_cpu_gemm_bf16(0, 0, T, IN, OUT, ptr(dy), OUT, ptr(W), IN, ptr(dx), IN, 0),
               lambda: ctrl.ctrl_cpu_gemm_bf16_packed_t(0, T, ptr(dy), OUT, fwd, ptr(dx), IN, 0),
               lambda: ctrl.ctrl_cpu_gemm_bf16_packed(0, T, ptr(dy), OUT, bwd, ptr(dx), IN, 0)]
        ms = [1e3 * t for t in gb.median_times(fns, args.rounds, args.timer)]
        tot = [a + b for a, b in zip(tot, ms)]
        mib = lambda b: b / 1048576.0
        print(f"{name:9s} {IN:5d} {OUT:5d} | {ms[0]:8.2f} {ms[1]:8.2f} | {ms[2]:8.2f} {ms[3]:8.2f} {ms[4]:8.2f} | "
              f"{mib(2 * IN * OUT):10.2f} {mib(ctrl.ctrl_cpu_gemm_bf16_packed_bytes(fwd)):7.2f} "
              f"{mib(ctrl.ctrl_cpu_gemm_bf16_packed_bytes(bwd)):7.2f}", flush=True)
        ctrl.ctrl_cpu_gemm_bf16_packed_free(fwd)
        ctrl.ctrl_cpu_gemm_bf16_packed_free(bwd)
    print(f"{'sum':21s} | {tot[0]:8.2f} {tot[1]:8.2f} | {tot[2]:8.2f} {tot[3]:8.2f} {tot[4]:8.2f} |   "
          f"load average {bu.load_average()}")


if __name__ == "__main__":
    main()
