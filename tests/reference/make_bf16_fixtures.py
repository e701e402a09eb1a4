#!/usr/bin/env python3
"""float32 -> bfloat16 rounding by torch (.to(torch.bfloat16)), for tests/unit/test_bf16.c: ties to
even, values just above and below ties, subnormals, the largest finite values (some round to inf),
infinities, and random values. Writes tests/fixtures/kernels/bf16_round.txt: "f32_bits bf16_bits"
in hex per line (NaN is left out: torch canonicalises its payload). Run by hand."""
import os
import struct

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "kernels", "bf16_round.txt")


def main():
    bits = []
    for hi in (0x3F80, 0x3F81, 0x4049, 0xC2F7, 0x0001, 0x007F, 0x7F7F, 0xFF7F, 0x8000):
        for lo in (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF):
            bits.append(hi << 16 | lo)
    bits += [0x7F800000, 0xFF800000, 0x00000000, 0x80000000]
    g = torch.Generator().manual_seed(0)
    bits += [int(x) & 0xFFFFFFFF for x in torch.randint(0, 2**31 - 1, (400,), generator=g).tolist()]
    bits = [b for b in bits if not ((b >> 23) & 0xFF == 0xFF and b & 0x7FFFFF)]
    f = torch.tensor([struct.unpack("<f", struct.pack("<I", b))[0] for b in bits], dtype=torch.float32)
    h = f.to(torch.bfloat16).view(torch.int16).tolist()
    with open(OUT, "w") as out:
        for b, x in zip(bits, h):
            out.write("%08x %04x\n" % (b, x & 0xFFFF))
    print(len(bits), "values")


if __name__ == "__main__":
    main()
