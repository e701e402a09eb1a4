#!/usr/bin/env python3
"""GEMM rates at the shapes of a Qwen2.5-0.5B-shaped model's linear layers, in one process, rounds
interleaved (ctrl, torch, OpenBLAS, ctrl, ...) so that a shared machine's load falls on all three alike:
  ctrl bf16    ctrl_cpu_gemm_bf16 from build/libctrl.so (fp32 inputs rounded to bf16 as they are
               packed, fp32 accumulation: the work of one bf16 linear layer's product)
  torch bf16   torch.matmul on bf16 tensors (oneDNN), the inputs already bf16
  sgemm fp32   cblas_sgemm from the OpenBLAS ctrl links
For T tokens and each projection (q/o: 896 -> 896, k/v: 896 -> 128, gate/up: 896 -> 4864, down:
4864 -> 896): forward out = x W^T [T, OUT, IN], dX = dout W [T, IN, OUT], dW = dout^T x [OUT, IN, T].
Reported: the median GFLOP/s of --rounds rounds per shape, and ctrl / torch. With one thread the
clock is the thread's CPU time (time.thread_time: all three run on the calling thread), so that time
spent waiting for a shared machine's cores is not counted; --clock wall counts it.
usage: bench/scale/bench_gemm.py [--tokens 1024] [--rounds 5] [--threads 1] [--clock cpu|wall]
       [--only SUBSTRING]   (after scripts/build.sh)"""
import argparse
import ctypes
import ctypes.util
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402

BUILD = os.environ.get("BUILD", os.path.join(bu.ROOT, "build"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    p.add_argument("--only", default="")
    args = p.parse_args()
    if args.threads > 1:
        args.clock = "wall"
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[k] = str(args.threads)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch  # after the thread variables

    torch.set_num_threads(args.threads)
    ctrl = ctypes.CDLL(os.path.join(BUILD, "libctrl.so"))
    ctrl.ctrl_cpu_has_avx512bf16.restype = ctypes.c_int
    blas = ctypes.CDLL("libopenblas.so.0")
    fp = ctypes.POINTER(ctypes.c_float)
    ctrl.ctrl_cpu_gemm_bf16.argtypes = [ctypes.c_int] * 5 + [fp, ctypes.c_int, fp, ctypes.c_int, fp, ctypes.c_int,
                                                             ctypes.c_int]
    blas.cblas_sgemm.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, fp, ctypes.c_int, fp, ctypes.c_int,
                                                      ctypes.c_float, fp, ctypes.c_int]
    ptr = lambda t: ctypes.cast(t.data_ptr(), fp)
    T = args.tokens
    proj = [("q/o", 896, 896), ("k/v", 896, 128), ("gate/up", 896, 4864), ("down", 4864, 896)]
    shapes = []  # (name, M, N, K, trans_a, trans_b)
    for name, IN, OUT in proj:
        shapes += [(f"{name} forward", T, OUT, IN, 0, 1), (f"{name} dX", T, IN, OUT, 0, 0),
                   (f"{name} dW", OUT, IN, T, 1, 0)]
    print(f"machine: {bu.cpu_model()}, {os.cpu_count()} cores; {args.threads} thread(s); AVX-512 BF16 path: "
          f"{'on' if ctrl.ctrl_cpu_has_avx512bf16() else 'off'}; torch {torch.__version__}; "
          f"load average {bu.load_average()}")
    print(f"{'shape':18s} {'M':>5s} {'N':>5s} {'K':>5s} {'ctrl bf16':>10s} {'torch bf16':>11s} {'sgemm':>8s} "
          f"{'ctrl/torch':>10s}   GFLOP/s, median of {args.rounds}, {args.clock} clock")
    ratios = []
    g = torch.Generator().manual_seed(0)
    for name, M, N, K, ta, tb in shapes:
        if args.only not in name:
            continue
        A = torch.randn(*((K, M) if ta else (M, K)), generator=g)
        B = torch.randn(*((N, K) if tb else (K, N)), generator=g)
        C = torch.empty(M, N)
        A16, B16 = A.bfloat16(), B.bfloat16()
        opA = (lambda x: x.t()) if ta else (lambda x: x)
        opB = (lambda x: x.t()) if tb else (lambda x: x)
        lda, ldb = A.shape[1], B.shape[1]

        def run_ctrl():
            rc = ctrl.ctrl_cpu_gemm_bf16(ta, tb, M, N, K, ptr(A), lda, ptr(B), ldb, ptr(C), N, 0)
            if rc != 0:
                raise SystemExit("ctrl_cpu_gemm_bf16 refused (no AVX-512 BF16 on this CPU, or turned off)")

        def run_torch():
            torch.matmul(opA(A16), opB(B16))

        def run_sgemm():  # CblasRowMajor 101, NoTrans 111, Trans 112
            blas.cblas_sgemm(101, 112 if ta else 111, 112 if tb else 111, M, N, K, 1.0, ptr(A), lda, ptr(B), ldb,
                             0.0, ptr(C), N)

        fns = [run_ctrl, run_torch, run_sgemm]
        for f in fns:
            f()  # warm up: first-touch, oneDNN's kernel generation
        times = [[], [], []]
        for _ in range(args.rounds):
            for i, f in enumerate(fns):
                t = clock()
                f()
                times[i].append(clock() - t)
        rate = [2.0 * M * N * K / statistics.median(t) / 1e9 for t in times]
        ratios.append(rate[0] / rate[1])
        print(f"{name:18s} {M:5d} {N:5d} {K:5d} {rate[0]:10.1f} {rate[1]:11.1f} {rate[2]:8.1f} {rate[0] / rate[1]:9.2f}x",
              flush=True)
    print(f"ctrl / torch bf16: min {min(ratios):.2f}x, geometric mean "
          f"{statistics.geometric_mean(ratios):.2f}x; load average {bu.load_average()}")


if __name__ == "__main__":
    main()
