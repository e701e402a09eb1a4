"""Writes the project's binary fixture format (read by tests/fixture.c).

Layout: a text header of lines "name count" ending with a line "end", then the arrays as
little-endian float32 in header order. Integers are stored as floats (exact below 2^24).
"""
import struct


def write_fixture(path, arrays, comment=""):
    with open(path, "wb") as f:
        if comment:
            f.write(("# " + comment.replace("\n", " ") + "\n").encode())
        for name, values in arrays:
            f.write(("%s %d\n" % (name, len(values))).encode())
        f.write(b"end\n")
        for _, values in arrays:
            f.write(struct.pack("<%df" % len(values), *values))


def randomize_params(model, torch):
    """Random weights, not the init's near-zero values, so that every path carries signal: norms
    1 + 0.1 N(0, 1), everything else 0.08 N(0, 1) (torch's global generator)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
