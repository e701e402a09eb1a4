"""What the CPU GEMM benches share (bench/scale/bench_gemm.py, bench_panels.py): their command line
(--tokens, --rounds, --threads, --clock) with the thread variables set before numpy / torch load,
build/libctrl.so loaded through ctypes with the bf16 GEMM entry points typed, the projections of a
Qwen2.5-0.5B-shaped model, the machine line, and the interleaved timing rounds (so that a shared
machine's load falls on every contender alike).

A bench finds it with
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
    import gemm_bench as gb"""
import argparse
import ctypes
import os
import statistics
import time

import bench_util as bu

BUILD = os.environ.get("BUILD", os.path.join(bu.ROOT, "build"))
# a Qwen2.5-0.5B-shaped model's linear layers: (name, IN, OUT)
PROJECTIONS = [("q/o", 896, 896), ("k/v", 896, 128), ("gate/up", 896, 4864), ("down", 4864, 896)]
FP = ctypes.POINTER(ctypes.c_float)


def parse_args(add=None):
    """--tokens, --rounds, --threads, --clock and the bench's own options (add(parser)). More than one
    thread: the wall clock. Sets OMP_NUM_THREADS / OPENBLAS_NUM_THREADS to --threads (before numpy or
    torch is imported) and OMP_WAIT_POLICY = PASSIVE unless set; args.timer is the clock's function
    (time.thread_time: the calling thread's CPU time, or time.perf_counter)."""
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    if add:
        add(p)
    args = p.parse_args()
    if args.threads > 1:
        args.clock = "wall"
    args.timer = time.thread_time if args.clock == "cpu" else time.perf_counter
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[k] = str(args.threads)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return args


def load_ctrl():
    """BUILD/libctrl.so with its CPU bf16 GEMM functions typed: (the library, its bf16 path's name)."""
    ctrl = ctypes.CDLL(os.path.join(BUILD, "libctrl.so"))
    vp, i = ctypes.c_void_p, ctypes.c_int
    ctrl.ctrl_cpu_has_avx512bf16.restype = i
    ctrl.ctrl_cpu_has_amx.restype = i
    ctrl.ctrl_cpu_bf16_path.restype = ctypes.c_char_p
    ctrl.ctrl_cpu_bf16_path.argtypes = [ctypes.POINTER(i)]
    ctrl.ctrl_cpu_gemm_bf16.argtypes = [i] * 5 + [FP, i, FP, i, FP, i, i]
    ctrl.ctrl_cpu_gemm_bf16_pack.restype = vp
    ctrl.ctrl_cpu_gemm_bf16_pack.argtypes = [i] * 3 + [FP, i]
    for f in (ctrl.ctrl_cpu_gemm_bf16_packed, ctrl.ctrl_cpu_gemm_bf16_packed_t):
        f.argtypes = [i, i, FP, i, vp, FP, i, i]
    ctrl.ctrl_cpu_gemm_bf16_packed_bytes.restype = ctypes.c_size_t
    ctrl.ctrl_cpu_gemm_bf16_packed_bytes.argtypes = [vp]
    ctrl.ctrl_cpu_gemm_bf16_packed_free.argtypes = [vp]
    ctrl.ctrl_cpu_gemm_bf16_repack.argtypes = [vp, FP, i]
    return ctrl, ctrl.ctrl_cpu_bf16_path(ctypes.byref(i(0))).decode()


def machine_line(args, path, more=""):
    """The benches' first line: the CPU, its cores, the threads, ctrl's bf16 path, more (ending in
    '; '), the load average."""
    return (f"machine: {bu.cpu_model()}, {os.cpu_count()} cores; {args.threads} thread(s); ctrl's bf16 path: "
            f"{path}; {more}load average {bu.load_average()}")


def shapes(T):
    """The products of T tokens through each projection: (name, M, N, K, trans_a, trans_b); forward
    out = x W^T [T, OUT, IN], dX = dout W [T, IN, OUT], dW = dout^T x [OUT, IN, T]."""
    out = []
    for name, IN, OUT in PROJECTIONS:
        out += [(f"{name} forward", T, OUT, IN, 0, 1), (f"{name} dX", T, IN, OUT, 0, 0), (f"{name} dW", OUT, IN, T, 1, 0)]
    return out


def operands(torch, g, M, N, K, ta, tb):
    """Random operands of a product as stored (A, B fp32; C [M, N]; their bf16 copies) and op() of
    each as a function of a tensor (x or x.t())."""
    A = torch.randn(*((K, M) if ta else (M, K)), generator=g)
    B = torch.randn(*((N, K) if tb else (K, N)), generator=g)
    opA = (lambda x: x.t()) if ta else (lambda x: x)
    opB = (lambda x: x.t()) if tb else (lambda x: x)
    return A, B, torch.empty(M, N), A.bfloat16(), B.bfloat16(), opA, opB


def warm_up(fns, seconds):
    """fns called in turn until `seconds` of wall clock have passed (at least once each): True."""
    end = time.perf_counter() + seconds
    while True:
        for f in fns:
            f()
        if time.perf_counter() >= end:
            return True


def median_times(fns, rounds, timer):
    """Each of fns called once (warm-up: first touch, kernel generation), then rounds rounds calling
    each in turn: the median seconds of each, by timer."""
    for f in fns:
        f()
    times = [[] for _ in fns]
    for _ in range(rounds):
        for i, f in enumerate(fns):
            t = timer()
            f()
            times[i].append(timer() - t)
    return [statistics.median(t) for t in times]
