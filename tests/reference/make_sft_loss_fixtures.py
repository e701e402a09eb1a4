#!/usr/bin/env python3
"""Writes tests/fixtures/trainer/sft_loss.txt: TRL/transformers' SFT loss under gradient accumulation.

Random logits for an accumulated batch of 3 micro-batches with some labels = -100; each
micro-batch's loss is cross_entropy(..., ignore_index=-100, reduction="sum") / num_items_in_batch
(the trained tokens of the whole accumulated batch), as transformers' ForCausalLMLoss does when
num_items_in_batch is given. Stored per micro-batch: logp of the labels, the trained mask, the
loss and d loss / d logp from autograd. Run by hand.
"""
import os

import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "trainer", "sft_loss.txt")


def fmt(t):
    return " ".join("%.9g" % x for x in t.detach().flatten().tolist())


def main():
    torch.manual_seed(7)
    V = 50
    lens = [13, 5, 21]
    labels = [torch.randint(0, V, (n,)) for n in lens]
    for lab in labels:
        lab[torch.rand(lab.shape) < 0.3] = -100
    num_items = sum(int((lab != -100).sum()) for lab in labels)
    lines = ["accumulated %d %d" % (len(lens), num_items)]
    for n, lab in zip(lens, labels):
        logits = torch.randn(n, V, dtype=torch.float64)
        logp_all = F.log_softmax(logits, dim=-1)
        safe = lab.clamp(min=0)
        logp = logp_all.gather(1, safe[:, None])[:, 0].detach().requires_grad_(True)
        # The reference loss from logits, and the same loss as a function of logp (for dL/dlogp).
        ref = F.cross_entropy(logits, lab, ignore_index=-100, reduction="sum") / num_items
        mask = (lab != -100).double()
        loss = -(logp * mask).sum() / num_items
        assert torch.allclose(loss, ref)
        loss.backward()
        lines.append("micro %d %.17g" % (n, ref.item()))
        lines.append("logp " + fmt(logp))
        lines.append("mask " + fmt(mask))
        lines.append("dlogp " + fmt(logp.grad))
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write("# torch %s (tests/reference/make_sft_loss_fixtures.py)\n" % torch.__version__)
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
