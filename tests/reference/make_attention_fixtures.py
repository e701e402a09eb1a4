#!/usr/bin/env python3
"""Attention fixtures: PyTorch's scaled_dot_product_attention on packed variable-length batches.

For each case: random q, k, v (float32 values), the block-diagonal causal (and sliding-window)
mask built explicitly, GQA through repeat_interleave of the kv heads (as transformers' repeat_kv),
computed in float64: out, lse (log-sum-exp of the scaled scores, [n_head, T]) and the gradients
of sum(out * dout) for a random dout. Window semantics as transformers' sliding-window mask:
query i sees key j when i - window < j <= i. Run by hand:
    python3 tests/reference/make_attention_fixtures.py
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from fixture_io import write_fixture  # noqa: E402

OUT_DIR = os.path.join(os.path.dirname(__file__), "..", "fixtures", "attention")

CASES = [
    # name, seq lengths, n_head, n_kv_head, head_dim, window, scale (None = 1/sqrt(D))
    ("packed_gqa", [5, 17, 1, 30], 4, 2, 64, 0, None),
    ("mqa_window", [24], 4, 1, 128, 8, None),
    ("mha_scale", [13, 9], 2, 2, 64, 0, 0.2),
]


def mask_for(lens, window):
    T = sum(lens)
    m = torch.zeros(T, T, dtype=torch.bool)
    start = 0
    for L in lens:
        for i in range(L):
            for j in range(L):
                if j <= i and (window == 0 or j > i - window):
                    m[start + i, start + j] = True
        start += L
    return m


def main():
    torch.manual_seed(2024)
    os.makedirs(OUT_DIR, exist_ok=True)
    for name, lens, H, HK, D, window, scale in CASES:
        T = sum(lens)
        sc = scale if scale is not None else 1.0 / math.sqrt(D)
        # float32 values, so that the C side sees exactly the reference inputs
        q = torch.randn(T, H, D).float().double().requires_grad_(True)
        k = torch.randn(T, HK, D).float().double().requires_grad_(True)
        v = torch.randn(T, HK, D).float().double().requires_grad_(True)
        dout = torch.randn(T, H, D).float().double()
        m = mask_for(lens, window)
        kr = k.repeat_interleave(H // HK, dim=1)
        vr = v.repeat_interleave(H // HK, dim=1)
        # [H, T, D] for SDPA
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), kr.transpose(0, 1), vr.transpose(0, 1), attn_mask=m, scale=sc
        ).transpose(0, 1)
        scores = torch.einsum("ihd,jhd->hij", q, kr) * sc
        scores = scores.masked_fill(~m, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # [H, T]
        (out * dout).sum().backward()
        cu = [0]
        for L in lens:
            cu.append(cu[-1] + L)
        flat = lambda t: t.detach().float().flatten().tolist()  # noqa: E731
        arrays = [
            ("shape", [len(lens), T, H, HK, D, window, sc]),
            ("cu_seqlens", [float(x) for x in cu]),
            ("q", flat(q)), ("k", flat(k)), ("v", flat(v)), ("dout", flat(dout)),
            ("out", flat(out)), ("lse", flat(lse)), ("dq", flat(q.grad)), ("dk", flat(k.grad)), ("dv", flat(v.grad)),
        ]
        write_fixture(os.path.join(OUT_DIR, name + ".bin"), arrays,
                      "torch %s scaled_dot_product_attention, float64 (make_attention_fixtures.py)" % torch.__version__)
        print(name, T, "tokens")


if __name__ == "__main__":
    main()
