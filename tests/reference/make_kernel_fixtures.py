#!/usr/bin/env python3
"""Kernel fixtures from PyTorch / transformers (float32, as the CPU kernels compute):
LlamaRMSNorm, F.linear, SwiGLU (F.silu(g) * u), the rotary embedding of each rope type through
transformers' own LlamaRotaryEmbedding + apply_rotary_pos_emb, and the LM head's log-probs,
entropy and their gradients. Outputs and gradients of sum(out * dout). Run by hand:
    python3 tests/reference/make_kernel_fixtures.py
"""
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

sys.path.insert(0, os.path.dirname(__file__))
from fixture_io import write_fixture  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "kernels")
NOTE = "torch %s, transformers %s (make_kernel_fixtures.py)" % (torch.__version__, transformers.__version__)


def flat(t):
    return t.detach().float().flatten().tolist()


def rmsnorm():
    T, C = 7, 64
    x = torch.randn(T, C, requires_grad=True)
    norm = LlamaRMSNorm(C, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(C))
    out = norm(x)
    dout = torch.randn(T, C)
    (out * dout).sum().backward()
    write_fixture(os.path.join(OUT, "rmsnorm.bin"), [("shape", [T, C, 1e-6]), ("x", flat(x)), ("weight", flat(norm.weight)),
                  ("dout", flat(dout)), ("out", flat(out)), ("dx", flat(x.grad)), ("dweight", flat(norm.weight.grad))], NOTE)


def linear():
    T, IN, OUT_ = 9, 48, 40
    x = torch.randn(T, IN, requires_grad=True)
    w = torch.randn(OUT_, IN, requires_grad=True)
    b = torch.randn(OUT_, requires_grad=True)
    out = F.linear(x, w, b)
    dout = torch.randn(T, OUT_)
    (out * dout).sum().backward()
    write_fixture(os.path.join(OUT, "linear.bin"), [("shape", [T, IN, OUT_]), ("x", flat(x)), ("w", flat(w)), ("b", flat(b)),
                  ("dout", flat(dout)), ("out", flat(out)), ("dx", flat(x.grad)), ("dw", flat(w.grad)), ("db", flat(b.grad))], NOTE)


def swiglu():
    n = 257
    g = (torch.randn(n) * 3).requires_grad_(True)
    u = torch.randn(n, requires_grad=True)
    out = F.silu(g) * u
    dout = torch.randn(n)
    (out * dout).sum().backward()
    write_fixture(os.path.join(OUT, "swiglu.bin"), [("shape", [n]), ("gate", flat(g)), ("up", flat(u)), ("dout", flat(dout)),
                  ("out", flat(out)), ("dgate", flat(g.grad)), ("dup", flat(u.grad))], NOTE)


ROPES = [
    # name, kind id (ctrl_rope_kind), rope_parameters, max_position_embeddings
    ("default", 0, {"rope_type": "default", "rope_theta": 1000000.0}, 4096),
    ("linear", 1, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, 4096),
    ("llama3", 2, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, 131072),
    ("yarn", 3, {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 32768},
     131072),
    ("dynamic", 4, {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, 2048),
]


def rope():
    H, D = 2, 64
    positions = [0, 1, 2, 3, 17, 100, 511, 1000, 2047, 0, 5]
    T = len(positions)
    for name, kind, params, max_pos in ROPES:
        cfg = LlamaConfig(hidden_size=H * D, num_attention_heads=H, num_key_value_heads=H, head_dim=D,
                          max_position_embeddings=max_pos, rope_parameters=dict(params))
        emb = LlamaRotaryEmbedding(cfg)
        x = torch.randn(1, H, T, D, requires_grad=True)
        pos = torch.tensor([positions])
        cos, sin = emb(x, pos)  # [1, T, D]
        out, _ = apply_rotary_pos_emb(x, x, cos, sin)
        dout = torch.randn_like(out)
        (out * dout).sum().backward()
        f = params.get
        write_fixture(os.path.join(OUT, "rope_%s.bin" % name), [
            ("shape", [T, H, D, kind, f("rope_theta"), f("factor", 1.0) or 1.0, f("low_freq_factor", 0.0),
                       f("high_freq_factor", 0.0), f("original_max_position_embeddings", max_pos)]),
            ("positions", [float(p) for p in positions]),
            ("cos", flat(cos[0, :, : D // 2])), ("sin", flat(sin[0, :, : D // 2])),
            # x and out as [T, H, D], the layout of the kernels
            ("x", flat(x[0].transpose(0, 1))), ("dout", flat(dout[0].transpose(0, 1))),
            ("out", flat(out[0].transpose(0, 1))), ("dx", flat(x.grad[0].transpose(0, 1)))], NOTE)


def head():
    T, C, V, temp = 13, 32, 500, 0.8
    h = torch.randn(T, C, requires_grad=True)
    w = (torch.randn(V, C) * 0.5).requires_grad_(True)
    targets = torch.randint(0, V, (T,))
    targets[3] = -100
    logits = (h @ w.T) / temp
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(1, targets.clamp(min=0)[:, None])[:, 0]
    mask = (targets >= 0).float()
    logp = logp * mask
    entropy = -(logp_all.exp() * logp_all).sum(-1) * mask
    lse = torch.logsumexp(logits, dim=-1)
    dlogp, dent = torch.randn(T), torch.randn(T)
    ((logp * dlogp).sum() + (entropy * dent).sum()).backward()
    correct = (logits.argmax(-1) == targets).float()
    write_fixture(os.path.join(OUT, "head.bin"), [("shape", [T, C, V, temp]), ("hidden", flat(h)), ("w", flat(w)),
                  ("targets", [float(t) for t in targets]), ("dlogp", flat(dlogp)), ("dentropy", flat(dent)),
                  ("logp", flat(logp)), ("entropy", flat(entropy)), ("lse", flat(lse)), ("correct", flat(correct)),
                  ("dhidden", flat(h.grad)), ("dw", flat(w.grad))], NOTE)


if __name__ == "__main__":
    torch.manual_seed(31337)
    os.makedirs(OUT, exist_ok=True)
    rmsnorm()
    linear()
    swiglu()
    rope()
    head()
    print("fixtures written to", OUT)
