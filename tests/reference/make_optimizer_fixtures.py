#!/usr/bin/env python3
"""Writes tests/fixtures/optimizer/optimizers.txt: torch.optim.AdamW / SGD trajectories.

Each case: two parameter groups (one with weight decay, one without, as the HF Trainer splits
norms and biases), random initial parameters, random gradients per step, a learning rate that
changes every step, and the parameters torch computes after each step. Run by hand:
    python3 tests/reference/make_optimizer_fixtures.py
"""
import os

import torch

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "optimizer", "optimizers.txt")
STEPS = 6

CASES = [
    ("adamw_default", "adamw", dict(adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8), 0.01),
    ("adamw_custom", "adamw", dict(adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6), 0.1),
    ("sgd_plain", "sgd", dict(momentum=0.0, dampening=0.0, nesterov=0), 0.0),
    ("sgd_momentum", "sgd", dict(momentum=0.9, dampening=0.1, nesterov=0), 0.05),
    ("sgd_nesterov", "sgd", dict(momentum=0.9, dampening=0.0, nesterov=1), 0.01),
]


def fmt(t):
    return " ".join("%.9g" % x for x in t.detach().flatten().tolist())


def main():
    torch.manual_seed(1234)
    lines = []
    for name, kind, hp, wd in CASES:
        sizes = (37, 11)
        params = [torch.randn(n, dtype=torch.float32, requires_grad=True) for n in sizes]
        init = [p.detach().clone() for p in params]
        groups = [dict(params=[params[0]], weight_decay=wd), dict(params=[params[1]], weight_decay=0.0)]
        if kind == "adamw":
            opt = torch.optim.AdamW(groups, lr=1e-2, betas=(hp["adam_beta1"], hp["adam_beta2"]),
                                    eps=hp["adam_epsilon"], foreach=False)
        else:
            opt = torch.optim.SGD(groups, lr=1e-2, momentum=hp["momentum"], dampening=hp["dampening"],
                                  nesterov=bool(hp["nesterov"]), foreach=False)
        lines.append("case %s %s %d" % (name, kind, STEPS))
        lines.append("hparams " + " ".join("%s=%.9g" % kv for kv in hp.items()))
        for n, w, p in zip(sizes, (wd, 0.0), init):
            lines.append("group %d %.9g %s" % (n, w, fmt(p)))
        for t in range(1, STEPS + 1):
            lr = 1e-2 * (1.0 - 0.1 * t)
            for g in opt.param_groups:
                g["lr"] = lr
            grads = [torch.randn(n, dtype=torch.float32) for n in sizes]
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
            lines.append("step %d %.9g" % (t, lr))
            for g in grads:
                lines.append("grad " + fmt(g))
            for p in params:
                lines.append("param " + fmt(p))
        lines.append("end")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write("# torch %s: torch.optim.AdamW / SGD trajectories (tests/reference/make_optimizer_fixtures.py)\n"
                % torch.__version__)
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
