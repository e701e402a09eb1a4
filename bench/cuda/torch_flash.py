"""PyTorch's scaled_dot_product_attention (flash backend) on the shapes of bench_flash.c: causal,
bf16, one sequence of 1k / 4k / 16k tokens, 16 query heads over 4 KV heads (repeated, as SDPA
needs), head_dim 64 and 128; TFLOP/s of forward and forward+backward with the same FLOP count."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return sorted(ts)[2]


print("SDPA (PyTorch %s, flash backend, bf16, causal): TFLOP/s" % torch.__version__)
print("%-8s %-5s %-6s %10s %12s" % ("seq", "D", "heads", "forward", "fwd+bwd"))
for T in (1024, 4096, 16384):
    for D in (64, 128):
        H = 16
        q = torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16)
        flops = 2 * 2 * T * T / 2 * H * D
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            tf = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            tb = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do))
        print("%-8d %-5d %d/%-4d %10.1f %12.1f" % (T, D, H, 4, flops / tf * 1e-12, 3.5 * flops / tb * 1e-12))
