"""Online DPO parity fixtures from TRL 1.16's own OnlineDPOTrainer.training_step (run by hand, never in CI).

The tiny Qwen2 fixture model, two prompts per micro-batch, two completions per prompt (fixed token
ids, some ending in EOS and some not) and fixed rewards go through TRL's training_step with its
generation patched to return the fixed completions: TRL itself picks chosen / rejected (after
missing_eos_penalty), computes the sigmoid or ipo loss against a reference model (a perturbed copy
of the policy, so that the log-ratios are not zero), its metrics, and the backward. Two micro-batches
make one optimizer step (gradient_accumulation_steps = 2). The per-token log-probs retain their
gradient, so the fixture holds dL/dlogp per completion token, and for the model cases every
parameter's gradient.

Completions of one micro-batch have the same length (no right padding): TRL's objective/kl and
objective/entropy sum over padded positions too, which ctrl does not (its completions are never
padded).

    python tests/reference/make_online_dpo_fixtures.py   # writes tests/fixtures/online_dpo/*.bin

A curve over several optimizer steps (--curve: writes only online_dpo/curve_sigmoid.curve): STEPS
optimizer steps of GA micro-batches, each with new fixed completions and rewards, through TRL's
training_step on the tiny Qwen2 and the HF Trainer's update after each step -- global-norm
clipping to max_grad_norm 1 (clip_grad_norm_) and torch's AdamW (lr 5e-3, betas 0.9 / 0.999, eps
1e-8, no weight decay, constant rate: the Trainer's adamw_torch). Per step: the completions,
rewards and reference log-probs of each micro-batch, the micro-batch losses, the gradient norm
before clipping and TRL's metrics.
"""
import copy
import os
import sys

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from fixture_io import write_fixture, write_trl_case  # noqa: E402
from make_grpo_fixtures import tiny_tokenizer  # noqa: E402

import trl  # noqa: E402
from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "fixtures")
MODEL = os.path.join(ROOT, "models", "qwen2")
OUT = os.path.join(ROOT, "online_dpo")
BS = 2                 # prompts per micro-batch (TRL's per_device_train_batch_size)
GA = 2                 # micro-batches per optimizer step
LENS = (6, 5)          # completion length of micro-batch 0 and 1
PROMPT_LEN = 4
EOS = 1


def make_data(seed):
    """Per micro-batch: BS prompts, and in ctrl's order (prompt i's two samples at 2i, 2i + 1) the
    completions, whether each ends in EOS, and the rewards."""
    g = torch.Generator().manual_seed(seed)
    mbs = []
    for mb in range(GA):
        C = LENS[mb]
        prompts = [torch.randint(2, 128, (PROMPT_LEN,), generator=g).tolist() for _ in range(BS)]
        comps, eos = [], []
        for i in range(2 * BS):
            ids = torch.randint(2, 128, (C,), generator=g).tolist()
            if (i + mb + seed) % 3 != 0:
                ids[-1] = EOS
            comps.append(ids)
            eos.append(int(ids[-1] == EOS))
        rewards = torch.randn(2 * BS, generator=g).tolist()
        if mb == 1:
            rewards[2] = rewards[3]  # a tie: TRL takes the first sample as chosen
        mbs.append(dict(prompts=prompts, comps=comps, eos=eos, rewards=rewards))
    return mbs


def fixed_step(tr, state, d):
    """TRL's training_step on micro-batch d's fixed completions and rewards: its loss, and the TRL
    rows of ctrl's order. TRL's layout: rows 0..BS-1 are every prompt's first sample, BS..2BS-1 the
    second ones."""
    trl_order = [2 * i for i in range(BS)] + [2 * i + 1 for i in range(BS)]
    comp = torch.tensor([d["comps"][j] for j in trl_order])
    pids = torch.tensor(d["prompts"]).repeat(2, 1)

    def fake_generate(model_, prompts_, images=None):
        return pids, torch.ones_like(pids), comp, torch.ones_like(comp), None
    tr._generate = fake_generate
    state["rewards"] = [d["rewards"][j] for j in trl_order]
    loss = tr.training_step(tr.model, {"prompt": ["t2"] * BS})
    return loss.item(), [trl_order.index(j) for j in range(2 * BS)]


def run_case(loss_type, beta, penalty, seed, with_model_grads):
    torch.manual_seed(0)
    args = OnlineDPOConfig(
        output_dir="/tmp/ctrl-odpo-fixture", per_device_train_batch_size=BS, gradient_accumulation_steps=GA,
        max_new_tokens=max(LENS), beta=beta, loss_type=loss_type, missing_eos_penalty=penalty, bf16=False,
        use_cpu=True, report_to=[], logging_steps=1, gradient_checkpointing=False)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed + 50)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    state = {}

    def fixed_reward(prompts, completions, **kw):
        return list(state["rewards"])

    ds = Dataset.from_list([{"prompt": "t2"}] * 8)
    tr = OnlineDPOTrainer(model=model, ref_model=ref, reward_funcs=[fixed_reward], args=args, train_dataset=ds,
                          processing_class=tiny_tokenizer())
    tr.state.epoch = 0
    orig_forward = tr._forward
    captured = {}

    def capture(m, *a, **k):
        lp = orig_forward(m, *a, **k)
        if lp.requires_grad:
            lp.retain_grad()
            captured["lp"] = lp
        else:
            captured["ref"] = lp
        return lp
    tr._forward = capture
    mbs = make_data(seed)
    tr.model.zero_grad()
    arrays, losses = [], []
    for k, d in enumerate(mbs):
        loss, back = fixed_step(tr, state, d)
        losses.append(loss)
        lp, rf, dl = captured["lp"], captured["ref"], captured["lp"].grad
        arrays += [
            (f"mb{k}_prompts", [t for p in d["prompts"] for t in p]),
            (f"mb{k}_completions", [t for c in d["comps"] for t in c]),
            (f"mb{k}_eos", d["eos"]),
            (f"mb{k}_rewards", d["rewards"]),
            (f"mb{k}_logp", lp.detach()[back].flatten().tolist()),
            (f"mb{k}_ref_logp", rf.detach()[back].flatten().tolist()),
            (f"mb{k}_dlogp", dl[back].flatten().tolist()),
        ]
    metrics = {key: sum(v) / len(v) for key, v in tr.stats.items() if v}
    arrays.append(("loss", losses))
    for key, v in sorted(metrics.items()):
        arrays.append(("metric:" + key, [float(v)]))
    grads = None
    if with_model_grads:
        grads = {n: p.grad.detach().clone().contiguous() for n, p in tr.model.named_parameters() if p.grad is not None}
    return arrays, grads


CURVE_STEPS, CURVE_LR = 5, 5e-3


def run_curve():
    torch.manual_seed(0)
    args = OnlineDPOConfig(
        output_dir="/tmp/ctrl-odpo-fixture", per_device_train_batch_size=BS, gradient_accumulation_steps=GA,
        max_new_tokens=max(LENS), beta=0.1, loss_type="sigmoid", missing_eos_penalty=1.0, bf16=False,
        use_cpu=True, report_to=[], logging_steps=1, gradient_checkpointing=False)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(77)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    state, captured = {}, {}
    ds = Dataset.from_list([{"prompt": "t2"}] * 8)
    tr = OnlineDPOTrainer(model=model, ref_model=ref, reward_funcs=[lambda prompts, completions, **kw:
                                                                    list(state["rewards"])],
                          args=args, train_dataset=ds, processing_class=tiny_tokenizer())
    tr.state.epoch = 0
    orig_forward = tr._forward

    def capture(m, *a, **k):
        lp = orig_forward(m, *a, **k)
        if not lp.requires_grad:
            captured["ref"] = lp
        return lp
    tr._forward = capture
    opt = torch.optim.AdamW(tr.model.parameters(), lr=CURVE_LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    arrays, losses, norms = [], [], []
    metric_rows = {}
    for step in range(CURVE_STEPS):
        tr.model.zero_grad()
        tr.stats = {k: [] for k in tr.stats}
        for k, d in enumerate(make_data(100 + step)):
            loss, back = fixed_step(tr, state, d)
            losses.append(loss)
            arrays += [
                (f"s{step}_mb{k}_prompts", [t for p in d["prompts"] for t in p]),
                (f"s{step}_mb{k}_completions", [t for c in d["comps"] for t in c]),
                (f"s{step}_mb{k}_eos", d["eos"]),
                (f"s{step}_mb{k}_rewards", d["rewards"]),
                (f"s{step}_mb{k}_ref_logp", captured["ref"].detach()[back].flatten().tolist()),
            ]
        norms.append(float(torch.nn.utils.clip_grad_norm_(tr.model.parameters(), 1.0)))
        opt.step()
        for key, v in tr.stats.items():
            if v:
                metric_rows.setdefault(key, []).append(float(sum(v) / len(v)))
    arrays += [("loss", losses), ("grad_norm", norms)]
    for key in ("rewards/margins", "rewards/chosen", "logps/chosen", "objective/kl"):
        arrays.append(("metric:" + key, metric_rows[key]))
    arrays.insert(0, ("config", [0.0, 0.1, 1.0, BS, GA, *LENS, PROMPT_LEN, CURVE_STEPS, CURVE_LR]))
    write_fixture(os.path.join(OUT, "curve_sigmoid.curve"), arrays, f"trl {trl.__version__} online DPO curve")
    print("curve: loss", [round(x, 5) for x in losses], "grad_norm", [round(x, 4) for x in norms])


def main():
    os.makedirs(OUT, exist_ok=True)
    if "--curve" in sys.argv:
        return run_curve()
    n = 0
    for loss_type in ("sigmoid", "ipo"):
        for beta in (0.1, 0.5):
            for penalty in (None, 1.0):
                name = f"odpo_{loss_type}_{int(beta * 10):02d}_{'eos' if penalty else 'noeos'}"
                with_grads = name in ("odpo_sigmoid_01_eos", "odpo_ipo_05_noeos")
                arrays, grads = run_case(loss_type, beta, penalty, seed=n, with_model_grads=with_grads)
                arrays.insert(0, ("config", [float(loss_type == "ipo"), beta, penalty or 0.0, BS, GA, *LENS,
                                             PROMPT_LEN]))
                write_trl_case(OUT, name, arrays, grads)
                n += 1
    print("wrote", n, "cases to", OUT)


if __name__ == "__main__":
    main()
