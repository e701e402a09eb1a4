#!/usr/bin/env python3
"""Writes tests/fixtures/optimizer/adamw8bit_*.bin: bitsandbytes' 8-bit AdamW (bnb.optim.AdamW8bit,
transformers' optim="adamw_bnb_8bit") stepped by bitsandbytes itself on the CPU.

- adamw8bit_maps.bin: bitsandbytes' dynamic quantization maps (create_dynamic_map signed and
  unsigned) and quantize_blockwise of a few vectors at the optimizer's block size (256): zeros, a
  zero block, exact map values, a partial last block.
- adamw8bit_<case>.bin: N steps of AdamW8bit on three tensors (above and below min_8bit_size, with
  and without weight decay); the parameters after every step and the final states (the 8-bit
  moments as their byte values, the per-block absmax, the fp32 moments of the small tensor).
The parameters and gradients are made from integers times powers of two (exact in fp32), so the C
test builds the same inputs without storing them. Needs `pip install bitsandbytes` (0.50.2 here).
Run by hand: python3 tests/reference/make_adamw8bit_fixtures.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from fixture_io import write_fixture  # noqa: E402

import bitsandbytes as bnb  # noqa: E402
import bitsandbytes.functional as F  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "optimizer")
BLOCK = 256  # the blockwise optimizer kernels' block size in bitsandbytes


def lattice(n, salt, step, zero_block=-1):
    """Integers in [-10000, 10000] times 2^-13, scaled per block of 256 by 2^-2 .. 2^2 (exact)."""
    i = torch.arange(n, dtype=torch.int64)
    k = (i * 7919 + step * 104729 + salt * 31) % 20001 - 10000
    e = (i // BLOCK) % 5 - 2
    v = k.to(torch.float32) * (2.0 ** -13) * torch.pow(2.0, e.to(torch.float32))
    if zero_block >= 0:
        v[zero_block * BLOCK:(zero_block + 1) * BLOCK] = 0
    return v


CASES = [
    # name, sizes, weight decays, betas, eps, min_8bit_size, steps
    ("default", (4196, 100), (0.01, 0.0), (0.9, 0.999), 1e-8, 4096, 3),
    ("custom", (700, 255), (0.0, 0.1), (0.8, 0.95), 1e-6, 256, 5),
]


def lr_at(t):
    return 1e-3 * (1.0 - 0.1 * t)


def quant_cases():
    signed = F.create_dynamic_map(signed=True)
    unsigned = F.create_dynamic_map(signed=False)
    arrays = [("map_signed", signed.tolist()), ("map_unsigned", unsigned.tolist())]
    n = 3 * BLOCK + 77
    x = lattice(n, 5, 1)
    x[BLOCK:2 * BLOCK] = 0  # a zero block
    x[2 * BLOCK:2 * BLOCK + 40] = 0  # zeros beside non-zeros
    x[2 * BLOCK + 40:2 * BLOCK + 296 - 40] = signed[:216] * 3.0  # exact map values times the absmax
    x[2 * BLOCK + 40] = -3.0
    for name, code, v in (("signed", signed, x), ("unsigned", unsigned, x.abs())):
        q, absmax = torch.ops.bitsandbytes.quantize_blockwise(v.contiguous(), code, BLOCK)
        arrays += [("q_in_" + name, v.tolist()), ("q_out_" + name, q.float().tolist()),
                   ("q_absmax_" + name, absmax.tolist())]
    write_fixture(os.path.join(OUT, "adamw8bit_maps.bin"), arrays,
                  "bitsandbytes %s dynamic maps and quantize_blockwise (make_adamw8bit_fixtures.py)"
                  % bnb.__version__)


def opt_case(name, sizes, wds, betas, eps, min8, steps):
    params = [torch.nn.Parameter(lattice(n, 11 + j, 0) * 4.0) for j, n in enumerate(sizes)]
    groups = [dict(params=[p], weight_decay=w) for p, w in zip(params, wds)]
    opt = bnb.optim.AdamW8bit(groups, lr=lr_at(1), betas=betas, eps=eps, min_8bit_size=min8)
    arrays = [("hparams", [betas[0], betas[1], eps, min8, steps] + list(wds)), ("sizes", list(sizes))]
    for t in range(1, steps + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(t)
        for j, p in enumerate(params):
            p.grad = lattice(p.numel(), 21 + j, t, zero_block=3 if j == 0 and p.numel() > 4 * BLOCK else -1)
        opt.step()
        arrays.append(("lr%d" % t, [lr_at(t)]))
        for j, p in enumerate(params):
            arrays.append(("param%d_step%d" % (j, t), p.detach().tolist()))
    for j, p in enumerate(params):
        s = opt.state[p]
        if s["state1"].dtype == torch.uint8:
            arrays += [("state1_%d" % j, s["state1"].float().tolist()), ("state2_%d" % j, s["state2"].float().tolist()),
                       ("absmax1_%d" % j, s["absmax1"].tolist()), ("absmax2_%d" % j, s["absmax2"].tolist())]
        else:
            arrays += [("exp_avg_%d" % j, s["state1"].tolist()), ("exp_avg_sq_%d" % j, s["state2"].tolist())]
    write_fixture(os.path.join(OUT, "adamw8bit_%s.bin" % name), arrays,
                  "bitsandbytes %s AdamW8bit on the CPU, case %s (make_adamw8bit_fixtures.py)"
                  % (bnb.__version__, name))


def main():
    os.makedirs(OUT, exist_ok=True)
    quant_cases()
    for c in CASES:
        opt_case(*c)


if __name__ == "__main__":
    main()
