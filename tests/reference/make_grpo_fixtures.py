"""GRPO and RLOO parity fixtures from TRL's own trainer code (run by hand, never in CI).

The tiny Qwen2 fixture model, fixed prompts and completions (token ids), fixed rewards (with
None for "does not apply") and fixed old / reference log-probs are fed through TRL's
GRPOTrainer._generate_and_score_completions (generation patched to return the fixed completions,
so TRL computes the advantages and reward metrics itself) and then through its _compute_loss,
whose backward gives dL/dlogp per completion token (per-token log-probs retain their grad) and,
for the model cases, the gradient of every parameter. One case per
loss_type x importance_sampling_level x scale_rewards x beta in {0, 0.04}, plus RLOO cases.

    python tests/reference/make_grpo_fixtures.py   # writes tests/fixtures/online/*.bin
"""
import itertools
import math
import os
import sys

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from tokenizers import Tokenizer, models

sys.path.insert(0, os.path.dirname(__file__))
from fixture_io import write_trl_case  # noqa: E402

from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "fixtures")
MODEL = os.path.join(ROOT, "models", "qwen2")
OUT = os.path.join(ROOT, "online")
G = 4           # num_generations
N_PROMPTS = 2   # one generation batch = 8 completions = 2 micro-batches of 4
MAX_COMPLETION = 7
TEMPERATURE = 0.7


def tiny_tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, 128)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def make_data(seed):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(2, 128, (int(n),), generator=g).tolist() for n in (4, 4)]  # equal: no left padding, whose positions transformers does not shift
    completions = []
    for i in range(N_PROMPTS * G):
        n = int(torch.randint(2, MAX_COMPLETION + 1, (1,), generator=g))
        ids = torch.randint(2, 128, (n,), generator=g).tolist()
        if n < MAX_COMPLETION or i % 3 == 0:
            ids[-1] = 1  # EOS: terminated (others are truncated at MAX_COMPLETION)
        completions.append(ids)
    rewards = torch.randn(N_PROMPTS * G, generator=g).tolist()
    rewards[5] = None            # no reward function applied to this one
    rewards[0] = rewards[1] = rewards[2] = rewards[3] = 0.5 if seed % 2 else rewards[0]  # a zero-std group
    return prompts, completions, rewards


def build(trainer_cls, config_cls, extra):
    args = config_cls(
        output_dir="/tmp/ctrl-grpo-fixture", per_device_train_batch_size=4, gradient_accumulation_steps=2,
        num_generations=G, max_completion_length=MAX_COMPLETION, temperature=TEMPERATURE, bf16=False,
        use_cpu=True, report_to=[], logging_steps=1, gradient_checkpointing=False, **extra)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    ds = Dataset.from_list([{"prompt": "t2"}] * 16)
    state = {"rewards": None}

    def fixed_reward(prompts, completions, **kw):
        return list(state["rewards"])

    tr = trainer_cls(model=model, reward_funcs=[fixed_reward], args=args, train_dataset=ds,
                     processing_class=tiny_tokenizer())
    return tr, state


def run_case(trainer_cls, config_cls, extra, seed, with_model_grads):
    torch.manual_seed(0)
    tr, state = build(trainer_cls, config_cls, extra)
    prompts, completions, rewards = make_data(seed)
    state["rewards"] = rewards
    prompt_ids = [prompts[i // G] for i in range(len(completions))]

    def fake_generate(prompts_in, *a, **k):
        texts = [" ".join(f"t{t}" for t in c) for c in completions]
        if trainer_cls is RLOOTrainer:
            return prompt_ids, completions, texts
        return prompt_ids, completions, None, texts, None, {}, None, None
    tr._generate = fake_generate
    # the current policy's log-probs of the completions, to build "moved" old and reference ones
    B, C = len(completions), max(len(c) for c in completions)
    ids = torch.tensor([p + c + [0] * (C - len(c)) for p, c in zip(prompt_ids, completions)])
    attn = torch.tensor([[1] * len(p) + [1] * len(c) + [0] * (C - len(c)) for p, c in zip(prompt_ids, completions)])
    with torch.no_grad():
        cur, _, _ = tr._get_per_token_logps_and_entropies(tr.model, ids, attn, C)
    g = torch.Generator().manual_seed(seed + 100)
    old = cur + 0.3 * torch.randn(B, C, generator=g)  # the policy has moved since generation
    ref = cur + 0.3 * torch.randn(B, C, generator=g)
    orig = tr._get_per_token_logps_and_entropies
    if trainer_cls is RLOOTrainer:  # its scoring computes old, then reference log-probs: hand it ours
        queue = [old, ref]
        tr._get_per_token_logps_and_entropies = lambda *a, **k: (queue.pop(0), None, None)
    inputs = [{"prompt": "t2"} for _ in completions]
    tr.model.train()
    out = tr._generate_and_score_completions(inputs)
    tr._get_per_token_logps_and_entropies = orig
    mask = out["completion_mask"].float()
    assert tuple(mask.shape) == (B, C)
    arrays = [("rewards", [float("nan") if r is None else r for r in rewards]),
              ("advantages", out["advantages"].tolist())]
    metrics = {k: v[-1] for k, v in tr._metrics["train"].items() if v}
    tr._metrics["train"].clear()
    tr.current_gradient_accumulation_steps = 2
    losses, dlogps, captured = [], [], {}

    def capture(*a, **k):
        lp, ent, aux = orig(*a, **k)
        lp.retain_grad()
        captured["lp"], captured["ent"] = lp, ent
        return lp, ent, aux
    tr._get_per_token_logps_and_entropies = capture
    tr.model.zero_grad()
    for mb in range(2):  # two micro-batches of one optimizer step
        sl = slice(4 * mb, 4 * mb + 4)
        inp = {k: (v[sl] if torch.is_tensor(v) and v.dim() > 0 and v.shape[0] == B else v) for k, v in out.items()}
        if trainer_cls is GRPOTrainer:
            inp["old_per_token_logps"] = old[sl]
            if extra.get("beta", 0) != 0:
                inp["ref_per_token_logps"] = ref[sl]
        else:
            inp["old_logps"] = (old[sl] * mask[sl]).sum(1)
        loss = tr._compute_loss(tr.model, inp)
        if trainer_cls is RLOOTrainer:
            loss = loss / tr.current_gradient_accumulation_steps  # the HF Trainer's scaling of an unscaled loss
        loss.backward()
        losses.append(loss.item())
        dlogps.append(captured["lp"].grad.clone())
        arrays.append((f"mb{mb}_entropy", captured["ent"].detach().flatten().tolist()))
        arrays.append((f"mb{mb}_logp", captured["lp"].detach().flatten().tolist()))
    step_metrics = {k: sum(v) / len(v) for k, v in tr._metrics["train"].items() if v}
    arrays += [
        ("shape", [B, C, len(prompts[0]), len(prompts[1])]),
        ("prompt0", prompts[0]), ("prompt1", prompts[1]),
        ("completion_ids", out["completion_ids"].flatten().tolist()),
        ("completion_mask", mask.flatten().tolist()),
        ("num_items", [float(out.get("num_items_in_batch", mask.sum()))]),
        ("old_logp", old.flatten().tolist()), ("ref_logp", ref.flatten().tolist()),
        ("loss", losses), ("dlogp", torch.cat(dlogps).flatten().tolist()),
    ]
    names = []
    for k, v in sorted({**metrics, **step_metrics}.items()):
        if isinstance(v, float) or isinstance(v, int):
            arrays.append(("metric:" + k, [float(v)]))
            names.append(k)
    grads = None
    if with_model_grads:
        grads = {n: p.grad.detach().clone().contiguous() for n, p in tr.model.named_parameters() if p.grad is not None}
    return arrays, grads


def main():
    os.makedirs(OUT, exist_ok=True)
    n = 0
    for loss_type, level, scale, beta in itertools.product(
            ["grpo", "bnpo", "dr_grpo", "dapo"], ["token", "sequence"], ["group", "batch", "none"], [0.0, 0.04]):
        name = f"grpo_{loss_type}_{level}_{scale}_{int(beta * 100):02d}"
        extra = dict(loss_type=loss_type, importance_sampling_level=level, scale_rewards=scale, beta=beta,
                     epsilon=0.2, epsilon_high=0.28)
        with_grads = name in ("grpo_dapo_token_group_04", "grpo_grpo_sequence_batch_00")
        arrays, grads = run_case(GRPOTrainer, GRPOConfig, extra, seed=n, with_model_grads=with_grads)
        arrays.insert(0, ("config", [["grpo", "bnpo", "dr_grpo", "dapo"].index(loss_type), level == "sequence",
                                     ["group", "batch", "none"].index(scale), beta]))
        write_trl_case(OUT, name, arrays, grads)
        n += 1
    extra_cases = {
        "grpo_dapo_token_group_00_delta_entropy": dict(loss_type="dapo", delta=1.25, top_entropy_quantile=0.5,
                                                       mask_truncated_completions=True, epsilon_high=0.28),
    }
    for name, extra in extra_cases.items():
        arrays, _ = run_case(GRPOTrainer, GRPOConfig, extra, seed=n, with_model_grads=False)
        arrays.insert(0, ("config", [3, 0, 0, 0.0]))
        write_trl_case(OUT, name, arrays)
        n += 1
    for beta, norm, clip in [(0.0, False, None), (0.05, False, None), (0.05, True, None), (0.0, True, (-0.5, 0.5))]:
        name = f"rloo_{int(beta * 100):02d}_{'norm' if norm else 'raw'}{'_clip' if clip else ''}"
        extra = dict(beta=beta, normalize_advantages=norm, reward_clip_range=clip, epsilon=0.2)
        arrays, grads = run_case(RLOOTrainer, RLOOConfig, extra, seed=n, with_model_grads=name == "rloo_05_raw")
        arrays.insert(0, ("config", [beta, float(norm), clip[0] if clip else 0.0, clip[1] if clip else 0.0]))
        write_trl_case(OUT, name, arrays, grads)
        n += 1
    print("wrote", n, "cases to", OUT)


if __name__ == "__main__":
    main()
