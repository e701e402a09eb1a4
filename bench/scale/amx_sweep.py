#!/usr/bin/env python3
"""A sweep of the AMX bf16 GEMM's configurations (issue 21) in one process, on a CPU with AMX: for
each of the twelve projections of the 0.5B shape (bench_gemm.py's), ctrl's product under every
configuration (a tile variant and a blocking, set through ctrl_cpu_gemm_bf16_amx_tune, the same
values CTRL_AMX_TILE / CTRL_AMX_BLOCKS set) and torch's bf16 matmul (oneDNN) are called in turn,
--rounds rounds (median, one thread, the thread's CPU time), and every configuration's product is
checked against fp64 on the bf16-rounded inputs (64 rows of C; FAIL past 1e-4 of their largest
|value|). Then: per configuration the sum of its twelve medians (the step's GEMM time, the measure
of "best"), the worst and the geometric mean of ctrl / torch and how many shapes reach 0.9x; the
best configuration per shape; and the products as the model runs them on the best configuration
(bench_gemm.py --model). The best configuration (its check passed) is written to --env as one line
of environment assignments, e.g. `CTRL_AMX_BLOCKS=512,256,8192 CTRL_AMX_TILE=1`.
Configurations: "tile:kc,mc,nc" (tile 0-7, gemm_bf16_kernel.h; kc, mc, nc multiples of 32).
usage: bench/scale/amx_sweep.py [--configs "1:512,256,8192 ..."] [--rounds 3] [--tokens 1024]
       [--budget-s 80] [--env build-gpu/amx_best.env]   (bench/scale/amx_sweep.sh runs it)"""
import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gemm  # noqa: E402
import bench_util as bu  # noqa: E402
import gemm_bench as gb  # noqa: E402

DEFAULT = "0:512,256,8192"
TILES_ALL = [f"{t}:512,256,8192" for t in range(8)]
BLOCKINGS = ["1024,256,8192", "1024,128,8192", "1024,64,8192", "768,256,8192", "256,256,8192", "512,128,8192",
             "512,512,8192", "1024,512,8192", "1024,1024,8192", "512,256,1024", "1024,256,1024", "1024,128,512",
             "2432,128,8192", "256,64,2048"]
CONFIGS = TILES_ALL + [f"{t}:{b}" for t in (1, 3, 7) for b in BLOCKINGS]


def parse(c):
    t, _, b = c.partition(":")
    kc, mc, nc = (int(x) for x in b.split(","))
    return int(t), kc, mc, nc


def main():
    def more(p):
        p.add_argument("--configs", default=" ".join(CONFIGS))
        p.add_argument("--budget-s", type=float, default=80.0)
        p.add_argument("--env", default="")

    args = gb.parse_args(more)
    import torch

    torch.set_num_threads(args.threads)
    ctrl, path = gb.load_ctrl()
    ctrl.ctrl_cpu_gemm_bf16_amx_tune.argtypes = [ctypes.c_int] * 4
    configs = args.configs.split()
    for c in configs:
        if ctrl.ctrl_cpu_gemm_bf16_amx_tune(*parse(c)[1:], parse(c)[0]) != 0:
            raise SystemExit(f"configuration {c} refused by ctrl_cpu_gemm_bf16_amx_tune")
    ctrl.ctrl_cpu_gemm_bf16_amx_tune(0, 0, 0, -1)
    print(gb.machine_line(args, path, f"torch {torch.__version__}; {len(configs)} configurations; "))
    if "AMX tiles" not in path:
        print("warning: ctrl's path is not AMX: the configurations change nothing measured here")
    ptr = lambda t: ctypes.cast(t.data_ptr(), gb.FP)
    T = args.tokens
    shapes = gb.shapes(T)
    secs = {c: {} for c in configs}  # config -> shape -> median seconds
    torch_s, errs, start, warmed = {}, {c: {} for c in configs}, time.perf_counter(), False
    g = torch.Generator().manual_seed(0)
    for name, M, N, K, ta, tb in shapes:
        if time.perf_counter() - start > args.budget_s:
            print(f"budget ({args.budget_s:.0f} s) spent: {name} and the shapes after it not measured")
            break
        A, B, C, A16, B16, opA, opB = gb.operands(torch, g, M, N, K, ta, tb)
        lda, ldb = A.shape[1], B.shape[1]

        def run_ctrl_with(c):
            t, kc, mc, nc = parse(c)

            def run():
                ctrl.ctrl_cpu_gemm_bf16_amx_tune(kc, mc, nc, t)
                if ctrl.ctrl_cpu_gemm_bf16(ta, tb, M, N, K, ptr(A), lda, ptr(B), ldb, ptr(C), N, 0) != 0:
                    raise SystemExit("ctrl_cpu_gemm_bf16 refused")
            return run

        fns = [run_ctrl_with(c) for c in configs] + [lambda: torch.matmul(opA(A16), opB(B16))]
        if not warmed:
            warmed = gb.warm_up(fns, 0.5)
        times = gb.median_times(fns, args.rounds, args.timer)
        torch_s[name] = times[-1]
        rows = torch.linspace(0, M - 1, min(64, M)).long()
        ref = opA(A16.double())[rows] @ opB(B16.double())
        scale = ref.abs().max().item() or 1.0
        for c, f, t in zip(configs, fns, times):
            secs[c][name] = t
            f()
            errs[c][name] = (C[rows].double() - ref).abs().max().item() / scale
        best = min(configs, key=lambda c: secs[c][name])
        print(f"{name:16s} {M:5d} {N:5d} {K:5d}  torch {2e-9 * M * N * K / times[-1]:6.1f} GFLOP/s  "
              f"{DEFAULT} {torch_s[name] / secs[DEFAULT][name]:.2f}x  best {best} "
              f"{torch_s[name] / secs[best][name]:.2f}x  ({time.perf_counter() - start:.0f} s)", flush=True)
    measured = list(torch_s)
    if not measured:
        raise SystemExit("nothing measured")
    print(f"\nper configuration over {len(measured)} shapes (ctrl / torch; GEMM seconds summed; best first):")
    summary = []
    for c in configs:
        r = [torch_s[s] / secs[c][s] for s in measured]
        bad = [s for s in measured if not errs[c][s] <= 1e-4]
        summary.append((sum(secs[c][s] for s in measured), c, r, bad))
    summary.sort()
    for total, c, r, bad in summary:
        print(f"{c:16s} {total * 1e3:8.1f} ms  min {min(r):.2f}x  geomean {statistics.geometric_mean(r):.3f}x  "
              f">= 0.9x: {sum(x >= 0.9 for x in r):2d}/{len(r)}  max err "
              f"{max(errs[c][s] for s in measured):.1e}" + (f"  FAIL: {', '.join(bad)}" if bad else ""))
    ok = [x for x in summary if not x[3]]
    print(f"torch over the same shapes: {sum(torch_s.values()) * 1e3:.1f} ms")
    print("\nbest per shape (check passed):")
    for s in measured:
        c = min((c for _, c, _, bad in ok), key=lambda c: secs[c][s]) if ok else None
        if c:
            print(f"  {s:16s} {c:16s} {torch_s[s] / secs[c][s]:.2f}x   (default {torch_s[s] / secs[DEFAULT][s]:.2f}x)")
    failed = [c for _, c, _, bad in summary if bad]
    print(f"check against fp64: {'FAIL: ' + ' '.join(failed) if failed else 'every configuration within 1e-4'}")
    if not ok:
        raise SystemExit(1)
    best = ok[0][1]
    t, kc, mc, nc = parse(best)
    line = f"CTRL_AMX_BLOCKS={kc},{mc},{nc} CTRL_AMX_TILE={t}"
    print(f"\nbest configuration: {best} -> {line}; load average {bu.load_average()}")
    if args.env:
        with open(args.env, "w") as f:
            f.write(line + "\n")
        print(f"written to {args.env}")
    # the products as the model runs them, on the best configuration
    ctrl.ctrl_cpu_gemm_bf16_amx_tune(kc, mc, nc, t)
    print(f"\nas the model runs them ({best}; GFLOP/s, median of {args.rounds}):")
    print(f"{'shape':16s} {'from fp32':>9s} {'as model':>9s} {'torch':>7s} {'model/torch':>11s} {'pack ms':>8s}")
    for name, M, N, K, ta, tb in shapes:
        if name not in torch_s or time.perf_counter() - start > args.budget_s + 20:
            continue
        A, B, C, A16, B16, opA, opB = gb.operands(torch, g, M, N, K, ta, tb)
        model = bench_gemm.model_product(ctrl, name, M, N, K, A, B, C, ptr)

        def plain():
            ctrl.ctrl_cpu_gemm_bf16(ta, tb, M, N, K, ptr(A), A.shape[1], ptr(B), B.shape[1], ptr(C), N, 0)

        times = gb.median_times([plain, model[0], lambda: torch.matmul(opA(A16), opB(B16)), model[1]], args.rounds,
                                args.timer)
        model[2]()
        fl = 2e-9 * M * N * K
        pack = f"{times[3] * 1e3:8.2f}" if model[3] else f"{'-':>8s}"
        print(f"{name:16s} {fl / times[0]:9.1f} {fl / times[1]:9.1f} {fl / times[2]:7.1f} "
              f"{times[2] / times[1]:10.2f}x {pack}", flush=True)
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
