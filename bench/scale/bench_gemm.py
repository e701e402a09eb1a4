#!/usr/bin/env python3
"""GEMM rates at the shapes of a Qwen2.5-0.5B-shaped model's linear layers, in one process, rounds
interleaved (ctrl, torch, OpenBLAS, ctrl, ...) so that a shared machine's load falls on all three alike:
  ctrl bf16    ctrl_cpu_gemm_bf16 from build/libctrl.so (fp32 inputs rounded to bf16 as they are
               packed, fp32 accumulation: the work of one bf16 linear layer's product) on the path the
               CPU gets (ctrl_cpu_bf16_path, printed first: AMX tiles, else AVX-512 BF16)
  ctrl avx512  on a CPU with AMX also the AVX-512 BF16 kernel (CTRL_NO_AMX set around its calls), so
               that one run compares the two kernels
  torch bf16   torch.matmul on bf16 tensors (oneDNN), the inputs already bf16
  sgemm fp32   cblas_sgemm from the OpenBLAS ctrl links
For T tokens and each projection (q/o: 896 -> 896, k/v: 896 -> 128, gate/up: 896 -> 4864, down:
4864 -> 896): forward out = x W^T [T, OUT, IN], dX = dout W [T, IN, OUT], dW = dout^T x [OUT, IN, T].
Reported: the median GFLOP/s of --rounds rounds per shape, and ctrl / torch (ctrl's own path). With one thread the
clock is the thread's CPU time (time.thread_time: all three run on the calling thread), so that time
spent waiting for a shared machine's cores is not counted; --clock wall counts it.
usage: bench/scale/bench_gemm.py [--tokens 1024] [--rounds 5] [--threads 1] [--clock cpu|wall]
       [--only SUBSTRING]   (after scripts/build.sh)"""
import ctypes
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402
import gemm_bench as gb  # noqa: E402


def main():
    args = gb.parse_args(lambda p: p.add_argument("--only", default=""))
    import torch  # after the thread variables

    torch.set_num_threads(args.threads)
    ctrl, path = gb.load_ctrl()
    if os.environ.get("CTRL_AMX_EMULATE", "0") not in ("", "0"):
        print("warning: CTRL_AMX_EMULATE is set: this measures the software emulation of AMX, not a CPU")
    both = bool(ctrl.ctrl_cpu_has_amx()) and "CTRL_NO_AMX" not in os.environ
    blas = ctypes.CDLL("libopenblas.so.0")
    fp = gb.FP
    blas.cblas_sgemm.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, fp, ctypes.c_int, fp, ctypes.c_int,
                                                      ctypes.c_float, fp, ctypes.c_int]
    ptr = lambda t: ctypes.cast(t.data_ptr(), fp)
    T = args.tokens
    shapes = []  # (name, M, N, K, trans_a, trans_b)
    for name, IN, OUT in gb.PROJECTIONS:
        shapes += [(f"{name} forward", T, OUT, IN, 0, 1), (f"{name} dX", T, IN, OUT, 0, 0),
                   (f"{name} dW", OUT, IN, T, 1, 0)]
    print(gb.machine_line(args, path, f"torch {torch.__version__}; "))
    print(f"{'shape':18s} {'M':>5s} {'N':>5s} {'K':>5s} {'ctrl bf16':>10s} "
          + (f"{'ctrl avx512':>12s} " if both else "")
          + f"{'torch bf16':>11s} {'sgemm':>8s} {'ctrl/torch':>10s}   GFLOP/s, median of {args.rounds}, "
          f"{args.clock} clock")
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

        def run_avx512():  # the switch is read at each call
            os.environ["CTRL_NO_AMX"] = "1"
            try:
                run_ctrl()
            finally:
                del os.environ["CTRL_NO_AMX"]

        def run_torch():
            torch.matmul(opA(A16), opB(B16))

        def run_sgemm():  # CblasRowMajor 101, NoTrans 111, Trans 112
            blas.cblas_sgemm(101, 112 if ta else 111, 112 if tb else 111, M, N, K, 1.0, ptr(A), lda, ptr(B), ldb,
                             0.0, ptr(C), N)

        fns = [run_ctrl] + ([run_avx512] if both else []) + [run_torch, run_sgemm]
        # the first call of each warms up: first-touch, oneDNN's kernel generation
        rate = [2.0 * M * N * K / t / 1e9 for t in gb.median_times(fns, args.rounds, args.timer)]
        avx = f"{rate[1]:12.1f} " if both else ""
        torch_rate, sgemm_rate = rate[-2], rate[-1]
        ratios.append(rate[0] / torch_rate)
        print(f"{name:18s} {M:5d} {N:5d} {K:5d} {rate[0]:10.1f} {avx}{torch_rate:11.1f} {sgemm_rate:8.1f} "
              f"{rate[0] / torch_rate:9.2f}x", flush=True)
    print(f"ctrl / torch bf16: min {min(ratios):.2f}x, geometric mean "
          f"{statistics.geometric_mean(ratios):.2f}x; load average {bu.load_average()}")


if __name__ == "__main__":
    main()
