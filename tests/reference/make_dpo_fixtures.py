"""DPO parity fixtures from TRL's own DPOTrainer code (run by hand, never in CI).

The tiny Qwen2 fixture model is the policy; a copy with its weights moved by N(0, 0.02) noise is the
reference (written to tests/fixtures/dpo/ref_model/). Two micro-batches of three fixed preference
pairs (token ids; prompt, chosen and rejected of different lengths) are fed, padded as TRL's
collator pads them, through DPOTrainer._compute_loss -- TRL's own loss code for every loss_type --
with the reference live (TRL's forward of ref_model inside _compute_loss) or precomputed (TRL's
compute_ref_log_probs over the same batch, handed in as ref_chosen_logps / ref_rejected_logps, as
precompute_ref_log_probs does). The HF Trainer divides each micro-batch's loss by the gradient
accumulation steps (DPO batches carry no labels), so each loss here is TRL's / 2. Captured per case:
the loss of each micro-batch, the policy's per-token log-probs and their gradient dL/dlogp (the
fused head's output retains its grad), the reference's per-token log-probs, the fused head's other
per-token outputs (entropy, mean logit, log sum p^2, is_top1), TRL's metrics averaged as its log()
does, and for three cases the gradient of every parameter.

    python tests/reference/make_dpo_fixtures.py   # writes tests/fixtures/dpo/
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

from trl import DPOConfig, DPOTrainer  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "fixtures")
MODEL = os.path.join(ROOT, "models", "qwen2")
OUT = os.path.join(ROOT, "dpo")
REF = os.path.join(OUT, "ref_model")
PAIRS = 3  # per micro-batch; two micro-batches make one optimizer step
LOSS_TYPES = ["sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
              "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm"]
F_DIVS = ["reverse_kl", "forward_kl", "js_divergence", "alpha_divergence"]
WITH_GRADS = {"sigmoid_b10_live", "sigmoid+sft_b10_pre", "sigmoid_wpo_ld_b10_live"}


def tiny_tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, 128)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def make_ref_model():
    os.makedirs(REF, exist_ok=True)
    torch.manual_seed(7)
    m = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.02 * torch.randn_like(p))
    m.save_pretrained(REF, safe_serialization=True)


def make_pairs():
    """Six pairs (prompt, chosen, rejected) of token ids, lengths chosen so chosen / rejected differ."""
    g = torch.Generator().manual_seed(11)
    lens = [(3, 4, 2), (2, 1, 5), (5, 3, 3), (4, 6, 2), (2, 2, 4), (3, 5, 1)]
    pairs = []
    for lp, lc, lr in lens:
        r = lambda n: torch.randint(2, 128, (n,), generator=g).tolist()  # noqa: E731
        pairs.append((r(lp), r(lc), r(lr)))
    return pairs


def micro_batch(pairs):
    """TRL's layout: chosen sequences then rejected ones, right-padded with pad id 0."""
    seqs = [p + c for p, c, _ in pairs] + [p + r for p, _, r in pairs]
    comp = [[0] * len(p) + [1] * len(c) for p, c, _ in pairs] + [[0] * len(p) + [1] * len(r) for p, _, r in pairs]
    L = max(len(s) for s in seqs)
    ids = torch.tensor([s + [0] * (L - len(s)) for s in seqs])
    att = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in seqs])
    cm = torch.tensor([c + [0] * (L - len(c)) for c in comp])
    return {"input_ids": ids, "attention_mask": att, "completion_mask": cm}


def build(cfg, precompute):
    args = DPOConfig(output_dir="/tmp/ctrl-dpo-fixture", per_device_train_batch_size=PAIRS,
                     gradient_accumulation_steps=2, bf16=False, use_cpu=True, report_to=[], logging_steps=1,
                     gradient_checkpointing=False, precompute_ref_log_probs=False, **cfg)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation="eager")
    ref = AutoModelForCausalLM.from_pretrained(REF, dtype=torch.float32, attn_implementation="eager")
    ds = Dataset.from_list([{"prompt": "t2", "chosen": "t3", "rejected": "t4"}] * 4)
    tr = DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=ds, processing_class=tiny_tokenizer())
    tr.precompute_ref_logps = precompute  # the inputs then carry ref_chosen_logps / ref_rejected_logps
    return tr


def run_case(name, cfg, precompute):
    torch.manual_seed(0)
    tr = build(cfg, precompute)
    pairs = make_pairs()
    captured = {}
    orig = tr.model.forward

    def capture(*a, **k):
        out = orig(*a, **k)
        if out.log_probs.requires_grad:
            out.log_probs.retain_grad()
            captured["out"] = out
        return out
    tr.model.forward = capture
    ref_orig = tr.ref_model.forward

    def capture_ref(*a, **k):
        out = ref_orig(*a, **k)
        captured["ref"] = out.log_probs.detach()
        return out
    tr.ref_model.forward = capture_ref
    tr.model.train()
    tr.model.zero_grad()
    arrays, losses = [], []
    for mb in range(2):
        inp = micro_batch(pairs[PAIRS * mb:PAIRS * (mb + 1)])
        if precompute:
            with torch.no_grad():
                rc, rr = tr.compute_ref_log_probs(tr.ref_model, inp)
            inp["ref_chosen_logps"], inp["ref_rejected_logps"] = rc, rr
            arrays.append((f"mb{mb}_ref_sum", torch.cat([rc, rr]).tolist()))
        loss = tr._compute_loss(tr.model, inp, False) / 2  # the HF Trainer's scaling (no labels in the batch)
        loss.backward()
        losses.append(loss.item())
        out = captured["out"]
        L = inp["input_ids"].shape[1]
        arrays += [
            (f"mb{mb}_ids", inp["input_ids"].flatten().tolist()),
            (f"mb{mb}_completion_mask", inp["completion_mask"].flatten().tolist()),
            (f"mb{mb}_attention_mask", inp["attention_mask"].flatten().tolist()),
            (f"mb{mb}_shape", [2 * PAIRS, L]),
            (f"mb{mb}_logp", out.log_probs.detach().flatten().tolist()),
            (f"mb{mb}_dlogp", out.log_probs.grad.flatten().tolist()),
            (f"mb{mb}_ref_logp", captured["ref"].flatten().tolist()),
            (f"mb{mb}_entropy", out.entropy.detach().flatten().tolist()),
            (f"mb{mb}_mean_logit", out.mean_logits.flatten().tolist()),
            (f"mb{mb}_is_top1", out.is_top1.float().flatten().tolist()),
        ]
        if out.log_sum_sq_probs is not None:
            arrays.append((f"mb{mb}_log_sum_sq", out.log_sum_sq_probs.flatten().tolist()))
    arrays.append(("loss", losses))
    metrics = {k: sum(v) / len(v) for k, v in tr._metrics["train"].items() if v and k != "num_tokens"}
    for k, v in sorted(metrics.items()):
        arrays.append(("metric:" + k, [float(v)]))
    grads = None
    if name in WITH_GRADS:
        grads = {n: p.grad.detach().clone().contiguous() for n, p in tr.model.named_parameters() if p.grad is not None}
    return arrays, grads


def cases():
    for lt in LOSS_TYPES:
        for beta in (0.1, 0.5):
            for pre in (False, True):
                cfg = dict(loss_type=[lt], beta=beta)
                if lt == "exo_pair":
                    cfg["label_smoothing"] = 1e-3
                if lt in ("robust", "aot", "aot_unpaired"):
                    cfg["label_smoothing"] = 0.1
                if lt == "discopop":
                    cfg["discopop_tau"] = 0.2
                yield f"{lt}_b{int(beta * 100):02d}_{'pre' if pre else 'live'}", cfg, pre
    for pre in (False, True):
        yield f"sigmoid+sft_b10_{'pre' if pre else 'live'}", dict(loss_type=["sigmoid", "sft"],
                                                                   loss_weights=[1.0, 0.5], beta=0.1), pre
        yield f"sigmoid_ld_b10_{'pre' if pre else 'live'}", dict(loss_type=["sigmoid"], ld_alpha=0.5, beta=0.1), pre
    yield "sigmoid_wpo_b10_live", dict(loss_type=["sigmoid"], use_weighting=True, beta=0.1), False
    # sft with use_weighting fails inside TRL 1.16 (an in-place multiply of an expanded tensor): ctrl refuses it
    yield "ipo_wpo_b50_pre", dict(loss_type=["ipo"], use_weighting=True, beta=0.5), True
    yield "sigmoid_wpo_ld_b10_live", dict(loss_type=["sigmoid"], use_weighting=True, ld_alpha=0.3, beta=0.1), False
    for fd in F_DIVS[1:]:
        for lt in ("sigmoid", "hinge"):
            cfg = dict(loss_type=[lt], beta=0.1, f_divergence_type=fd)
            if fd == "alpha_divergence":
                cfg["f_alpha_divergence_coef"] = 0.5
            yield f"{lt}_{fd}_b10_live", cfg, False
    yield "sigmoid_alpha_divergence_coef2_b50_pre", dict(loss_type=["sigmoid"], beta=0.5,
                                                         f_divergence_type="alpha_divergence",
                                                         f_alpha_divergence_coef=2.0), True


# the options each fixture's config array carries, in this order (see tests/trainer/test_dpo.c)
def config_array(cfg, pre):
    lts = cfg["loss_type"]
    w = cfg.get("loss_weights") or [1.0] * len(lts)
    return [LOSS_TYPES.index(lts[0]), LOSS_TYPES.index(lts[1]) if len(lts) > 1 else -1, w[0],
            w[1] if len(w) > 1 else 0.0, cfg["beta"], cfg.get("label_smoothing", 0.0),
            F_DIVS.index(cfg.get("f_divergence_type", "reverse_kl")), cfg.get("f_alpha_divergence_coef", 1.0),
            float(cfg.get("use_weighting", False)), cfg.get("ld_alpha", -1.0), cfg.get("discopop_tau", 0.05),
            float(pre)]


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    make_ref_model()
    n = 0
    for name, cfg, pre in cases():
        arrays, grads = run_case(name, cfg, pre)
        arrays.insert(0, ("config", config_array(cfg, pre)))
        write_trl_case(OUT, name, arrays, grads)
        n += 1
    print("wrote", n, "cases to", OUT)


if __name__ == "__main__":
    main()
