"""KTO parity fixtures from TRL's own KTOTrainer code (run by hand, never in CI).

The tiny Qwen2 fixture model is the policy and tests/fixtures/dpo/ref_model (make_dpo_fixtures.py)
the reference. Two micro-batches of four fixed unpaired rows (token ids; labels mixed in the first,
all desirable in the second) with their KL estimate's mismatched sequences (prompt i + completion
i-1 of the micro-batch, as TRL's rotation gives) are fed, padded as TRL's collator pads them,
through KTOTrainer._compute_loss -- TRL's own loss code -- with the reference live or precomputed
(TRL's compute_ref_log_probs over the same batch handed in as ref_logps / ref_KL_logps). The HF
Trainer divides each micro-batch's loss by the gradient accumulation steps, so each loss here is
TRL's / 2. Captured per case, in the layout of make_dpo_fixtures.py (rows [0, B) the completions,
[B, 2B) the KL sequences, right-padded to one width): the loss of each micro-batch, the per-token
log-probs of the policy and the reference, dL/dlogp (the fused head's output retains its grad; 0
on the KL sequences, which TRL computes under no_grad), the fused head's other outputs, the
labels, and TRL's metrics averaged as its log() does.

    python tests/reference/make_kto_fixtures.py   # writes tests/fixtures/kto/
"""
import os
import shutil
import sys

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, os.path.dirname(__file__))
from fixture_io import write_trl_case  # noqa: E402

from trl import KTOConfig, KTOTrainer  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "fixtures")
MODEL = os.path.join(ROOT, "models", "qwen2")
REF = os.path.join(ROOT, "dpo", "ref_model")
OUT = os.path.join(ROOT, "kto")
B = 4  # rows per micro-batch; two micro-batches make one optimizer step
LOSS_TYPES = ["kto", "apo_zero_unpaired"]
LABELS = [[1, 0, 1, 0], [1, 1, 1, 1]]


def tiny_tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, 128)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def make_rows():
    g = torch.Generator().manual_seed(13)
    lens = [(3, 4), (2, 1), (5, 3), (4, 6), (2, 2), (3, 5), (1, 3), (4, 2)]
    r = lambda n: torch.randint(2, 128, (n,), generator=g).tolist()  # noqa: E731
    return [(r(lp), r(lc)) for lp, lc in lens]


def pad_rows(seqs, comp, L):
    ids = torch.tensor([s + [0] * (L - len(s)) for s in seqs])
    att = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in seqs])
    cm = torch.tensor([c + [0] * (L - len(c)) for c in comp])
    return ids, att, cm


def micro_batch(rows, labels):
    """TRL's collator: completions and KL sequences (prompt i + completion i-1), each right-padded."""
    out = {}
    kl = [(rows[i][0], rows[(i - 1) % len(rows)][1]) for i in range(len(rows))]
    for prefix, rs in (("", rows), ("KL_", kl)):
        seqs = [p + c for p, c in rs]
        comp = [[0] * len(p) + [1] * len(c) for p, c in rs]
        ids, att, cm = pad_rows(seqs, comp, max(len(s) for s in seqs))
        out[prefix + "input_ids"], out[prefix + "attention_mask"], out[prefix + "completion_mask"] = ids, att, cm
    out["label"] = torch.tensor(labels, dtype=torch.bool)
    return out


def build(cfg):
    args = KTOConfig(output_dir="/tmp/ctrl-kto-fixture", per_device_train_batch_size=B,
                     gradient_accumulation_steps=2, bf16=False, use_cpu=True, report_to=[], logging_steps=1,
                     gradient_checkpointing=False, precompute_ref_log_probs=False, **cfg)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation="eager")
    ref = AutoModelForCausalLM.from_pretrained(REF, dtype=torch.float32, attn_implementation="eager")
    ds = Dataset.from_list([{"prompt": "t2", "completion": "t3", "label": i % 2 == 0} for i in range(8)])
    return KTOTrainer(model=model, ref_model=ref, args=args, train_dataset=ds, processing_class=tiny_tokenizer())


def widen(x, L):
    return torch.nn.functional.pad(x, (0, L - x.shape[1]))


def run_case(cfg, precompute):
    torch.manual_seed(0)
    tr = build(cfg)
    tr.precompute_ref_logps = precompute
    rows = make_rows()
    calls = []
    for m in (tr.model, tr.ref_model):
        orig = m.forward

        def capture(*a, _orig=orig, _m=m, **k):
            out = _orig(*a, **k)
            if out.log_probs.requires_grad:
                out.log_probs.retain_grad()
            calls.append((_m, k["input_ids"], out))
            return out
        m.forward = capture
    tr.model.train()
    tr.model.zero_grad()
    arrays, losses = [], []
    for mb in range(2):
        inp = micro_batch(rows[B * mb:B * (mb + 1)], LABELS[mb])
        calls.clear()
        if precompute:
            with torch.no_grad():
                rl, rkl = tr.compute_ref_log_probs(tr.ref_model, inp)
            inp["ref_logps"] = rl
            if rkl is not None:
                inp["ref_KL_logps"] = rkl
            arrays.append((f"mb{mb}_ref_sum", torch.cat([rl, rkl if rkl is not None else torch.zeros(B)]).tolist()))
        loss = tr._compute_loss(tr.model, inp, False) / 2  # the HF Trainer's scaling over 2 accumulation steps
        loss.backward()
        losses.append(loss.item())
        L = max(inp["input_ids"].shape[1], inp["KL_input_ids"].shape[1])

        def out_of(model, key):
            hits = [o for m, ids, o in calls if m is model and ids is inp[key]]
            return hits[-1] if hits else None
        pol, pol_kl = out_of(tr.model, "input_ids"), out_of(tr.model, "KL_input_ids")
        ref, ref_kl = out_of(tr.ref_model, "input_ids"), out_of(tr.ref_model, "KL_input_ids")
        if pol_kl is None:  # apo_zero_unpaired computes no KL sequence: run the policy on them for the layout
            with torch.no_grad():
                pol_kl = tr.model(input_ids=inp["KL_input_ids"],
                                                    attention_mask=inp["KL_attention_mask"],
                                                    labels=inp["KL_input_ids"], fused_lm_head=True)
        if ref is None:
            with torch.no_grad():
                lab = inp["input_ids"].masked_fill(inp["completion_mask"] == 0, -100)
                ref = tr.ref_model(input_ids=inp["input_ids"],
                                                     attention_mask=inp["attention_mask"], labels=lab,
                                                     fused_lm_head=True)
        if ref_kl is None:
            with torch.no_grad():
                lab = inp["KL_input_ids"].masked_fill(inp["KL_completion_mask"] == 0, -100)
                ref_kl = tr.ref_model(input_ids=inp["KL_input_ids"],
                                                        attention_mask=inp["KL_attention_mask"], labels=lab,
                                                        fused_lm_head=True)

        def both(a, b):
            a = torch.zeros_like(pol.log_probs) if a is None else a
            b = torch.zeros_like(pol_kl.log_probs) if b is None else b
            return torch.cat([widen(a.detach().float(), L - 1), widen(b.detach().float(), L - 1)]).flatten().tolist()
        arrays += [
            (f"mb{mb}_ids", torch.cat([widen(inp["input_ids"], L), widen(inp["KL_input_ids"], L)]).flatten().tolist()),
            (f"mb{mb}_completion_mask", torch.cat([widen(inp["completion_mask"], L),
                                                   widen(inp["KL_completion_mask"], L)]).flatten().tolist()),
            (f"mb{mb}_attention_mask", torch.cat([widen(inp["attention_mask"], L),
                                                  widen(inp["KL_attention_mask"], L)]).flatten().tolist()),
            (f"mb{mb}_shape", [2 * B, L]),
            (f"mb{mb}_label", [float(x) for x in LABELS[mb]]),
            (f"mb{mb}_logp", both(pol.log_probs, pol_kl.log_probs)),
            (f"mb{mb}_dlogp", both(pol.log_probs.grad, torch.zeros_like(pol_kl.log_probs))),
            (f"mb{mb}_ref_logp", both(ref.log_probs, ref_kl.log_probs)),
            (f"mb{mb}_entropy", both(pol.entropy, pol_kl.entropy)),
            (f"mb{mb}_mean_logit", both(pol.mean_logits, pol_kl.mean_logits)),
            (f"mb{mb}_is_top1", both(pol.is_top1, pol_kl.is_top1)),
        ]
    arrays.append(("loss", losses))
    metrics = {k: sum(v) / len(v) for k, v in tr._metrics["train"].items() if v and k != "num_tokens"}
    for k, v in sorted(metrics.items()):
        arrays.append(("metric:" + k, [float(v)]))
    return arrays


def cases():
    for lt in LOSS_TYPES:
        for beta in (0.1, 0.5):
            for dw, uw in ((1.0, 1.0), (1.33, 0.7)):
                yield f"{lt}_b{int(beta * 100):02d}_w{int(dw * 100)}_{int(uw * 100)}_live", \
                    dict(loss_type=lt, beta=beta, desirable_weight=dw, undesirable_weight=uw), False
    yield "kto_b10_w100_100_pre", dict(loss_type="kto", beta=0.1), True
    yield "apo_zero_unpaired_b50_w100_100_pre", dict(loss_type="apo_zero_unpaired", beta=0.5), True


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    n = 0
    for name, cfg, pre in cases():
        arrays = run_case(cfg, pre)
        # config: loss_type, beta, desirable_weight, undesirable_weight, precomputed reference
        arrays.insert(0, ("config", [LOSS_TYPES.index(cfg["loss_type"]), cfg["beta"],
                                     cfg.get("desirable_weight", 1.0), cfg.get("undesirable_weight", 1.0),
                                     float(pre)]))
        write_trl_case(OUT, name, arrays)
        n += 1
    print("wrote", n, "cases to", OUT)


if __name__ == "__main__":
    main()
