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
Options:
  --model      beside each row, the product as the model runs it (columns "as model" and "pack ms"):
               forward rows on the weight's pre-packed panels (ctrl_cpu_gemm_bf16_packed: a LoRA run's
               held base, an online trainer's weights after decoding), dX rows on the same panels read
               transposed (ctrl_cpu_gemm_bf16_packed_t), dW rows accumulating into the gradient (as the
               backward does); "pack ms" is the median time to pack the weight's panels once
               (ctrl_cpu_gemm_bf16_pack). A full bf16 SFT step's forward, recompute and dX run as the
               first column (the weights packed in every call, from fp32).
  --check      ctrl's product of every shape against fp64 on the bf16-rounded inputs (64 rows of C):
               the max error relative to the largest |value| of those rows, FAIL past 1e-4
  --no-sgemm, --no-avx512   leave those columns out (amx_sweep.sh's configurations)
  --warmup-s S before the first shape's rounds, every contender called in turn for S seconds (0.5): the
               first shape ran at half speed on both sides without it (session #6: q/o forward)
usage: bench/scale/bench_gemm.py [--tokens 1024] [--rounds 5] [--threads 1] [--clock cpu|wall]
       [--only SUBSTRING] [--model] [--check] [--no-sgemm] [--no-avx512]   (after scripts/build.sh)"""
import ctypes
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402
import gemm_bench as gb  # noqa: E402


def main():
    def more(p):
        p.add_argument("--only", default="")
        for flag in ("--model", "--check", "--no-sgemm", "--no-avx512"):
            p.add_argument(flag, action="store_true")
        p.add_argument("--warmup-s", type=float, default=0.5)

    args = gb.parse_args(more)
    import torch  # after the thread variables

    torch.set_num_threads(args.threads)
    ctrl, path = gb.load_ctrl()
    if os.environ.get("CTRL_AMX_EMULATE", "0") not in ("", "0"):
        print("warning: CTRL_AMX_EMULATE is set: this measures the software emulation of AMX, not a CPU")
    both = bool(ctrl.ctrl_cpu_has_amx()) and "CTRL_NO_AMX" not in os.environ and not args.no_avx512
    sgemm = not args.no_sgemm
    blas = ctypes.CDLL("libopenblas.so.0") if sgemm else None
    fp = gb.FP
    if sgemm:
        blas.cblas_sgemm.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, fp, ctypes.c_int, fp, ctypes.c_int,
                                                          ctypes.c_float, fp, ctypes.c_int]
    ptr = lambda t: ctypes.cast(t.data_ptr(), fp)
    T = args.tokens
    shapes = gb.shapes(T)  # (name, M, N, K, trans_a, trans_b)
    print(gb.machine_line(args, path, f"torch {torch.__version__}; "))
    print(f"{'shape':18s} {'M':>5s} {'N':>5s} {'K':>5s} {'ctrl bf16':>10s} "
          + (f"{'ctrl avx512':>12s} " if both else "")
          + f"{'torch bf16':>11s} " + (f"{'sgemm':>8s} " if sgemm else "") + f"{'ctrl/torch':>10s}"
          + (f" {'as model':>9s} {'pack ms':>8s}" if args.model else "") + (f" {'max err':>9s}" if args.check else "")
          + f"   GFLOP/s, median of {args.rounds}, {args.clock} clock")
    ratios, failed, warmed = [], [], False
    g = torch.Generator().manual_seed(0)
    for name, M, N, K, ta, tb in shapes:
        if args.only not in name:
            continue
        A, B, C, A16, B16, opA, opB = gb.operands(torch, g, M, N, K, ta, tb)
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

        fns = [run_ctrl] + ([run_avx512] if both else []) + [run_torch] + ([run_sgemm] if sgemm else [])
        model = model_product(ctrl, name, M, N, K, A, B, C, ptr) if args.model else None
        if model:
            fns += model[:2]
        if not warmed:  # the first shape: the tile unit and the clock up to speed (both sides alike)
            warmed = gb.warm_up(fns, args.warmup_s)
        # the first call of each warms up: first-touch, oneDNN's kernel generation
        times = gb.median_times(fns, args.rounds, args.timer)
        rate = [2.0 * M * N * K / t / 1e9 for t in times]
        avx = f"{rate[1]:12.1f} " if both else ""
        torch_rate = rate[2 if both else 1]
        sg = f"{rate[3 if both else 2]:8.1f} " if sgemm else ""
        ratios.append(rate[0] / torch_rate)
        line = (f"{name:18s} {M:5d} {N:5d} {K:5d} {rate[0]:10.1f} {avx}{torch_rate:11.1f} {sg}"
                f"{rate[0] / torch_rate:9.2f}x")
        if model:
            line += f" {rate[-2]:9.1f} " + (f"{times[-1] * 1e3:8.2f}" if model[3] else f"{'-':>8s}")
            model[2]()
        if args.check:
            run_ctrl()
            err = check(C, A16, B16, opA, opB)
            line += f" {err:9.1e}" + (" FAIL" if not err <= 1e-4 else "")
            if not err <= 1e-4:
                failed.append(name)
        print(line, flush=True)
    print(f"ctrl / torch bf16: min {min(ratios):.2f}x, geometric mean "
          f"{statistics.geometric_mean(ratios):.2f}x; load average {bu.load_average()}")
    if args.check:
        print(f"check against fp64: {'FAIL: ' + ', '.join(failed) if failed else 'all shapes within 1e-4'}")
        if failed:
            sys.exit(1)


def model_product(ctrl, name, M, N, K, A, B, C, ptr):
    """The product of shape `name` as the model runs it: (its call, the weight's packing, a cleanup,
    whether there is a packing)."""
    if name.endswith("dW"):  # dW += dout^T x
        def run():
            ctrl.ctrl_cpu_gemm_bf16(1, 0, M, N, K, ptr(A), M, ptr(B), N, ptr(C), N, 1)
        return run, lambda: None, lambda: None, False
    # forward: B = W [N, K] packed as op(B) = W^T; dX: B = W [K, N], the forward's panels of W (OUT = K)
    fwd = name.endswith("forward")
    out, inp = (N, K) if fwd else (K, N)
    panels = [ctrl.ctrl_cpu_gemm_bf16_pack(1, out, inp, ptr(B), inp)]
    if not panels[0]:
        raise SystemExit("ctrl_cpu_gemm_bf16_pack refused")
    f = ctrl.ctrl_cpu_gemm_bf16_packed if fwd else ctrl.ctrl_cpu_gemm_bf16_packed_t

    def run():
        if f(0, M, ptr(A), K, panels[0], ptr(C), N, 0) != 0:
            raise SystemExit("the product on packed panels refused")

    def pack():
        if ctrl.ctrl_cpu_gemm_bf16_repack(panels[0], ptr(B), inp) != 0:
            raise SystemExit("ctrl_cpu_gemm_bf16_repack refused")

    return run, pack, lambda: ctrl.ctrl_cpu_gemm_bf16_packed_free(panels[0]), True


def check(C, A16, B16, opA, opB):
    """max |C - fp64 product| over 64 rows of C (spread over M), relative to the largest |value| there."""
    import torch
    rows = torch.linspace(0, C.shape[0] - 1, min(64, C.shape[0])).long()
    ref = opA(A16.double())[rows] @ opB(B16.double())
    scale = ref.abs().max().item()
    return (C[rows].double() - ref).abs().max().item() / (scale if scale > 0 else 1.0)


if __name__ == "__main__":
    main()
