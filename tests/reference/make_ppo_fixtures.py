"""PPO parity fixtures from the last TRL that shipped trl/trainer/ppo_trainer.py (0.25.1), run by hand
in its own environment, never in CI:

    /work/venv-ppo/bin/python tests/reference/make_ppo_fixtures.py  # writes tests/fixtures/ppo/*

The environment (trl 0.25.1 is the last release whose trl/trainer/ppo_trainer.py is the trainer; 0.26
moved it to trl.experimental and TRL 1.x dropped it): `python3 -m venv venv-ppo && venv-ppo/bin/pip
install trl==0.25.1 transformers==4.57.1 accelerate datasets torch` (CPU torch is enough; the
fixtures were made with torch 2.15, accelerate 1.15, datasets 5.0).

TRL's own PPOTrainer.train() runs one update on the tiny Qwen2 fixture model: its generation is patched
to return fixed completions (with the generating policy's logits, plus noise so that the policy has
"moved" and the clipping is exercised), the reward model's get_reward returns fixed scores, and the
value model's rollout values get noise too (the value clipping). Everything else -- truncation after
the stop token, missing_eos_penalty, the per-token KL (k1 / k3), the score at the last token, GAE,
whitening, the clipped policy and value losses, the epochs and mini-batches, the metrics -- is TRL's
code. The rollout tensors are read from train()'s frame (a line tracer), the permutations from
numpy, each micro-batch's new log-probs and values (with their gradients: dL/dlogp, dL/dvalue) from
the wrapped forward, the parameter gradients of the first optimizer step from the optimizer, and
the metrics from Trainer.log.

--updates writes only tests/fixtures/ppo/two_updates.{updates,safetensors}: two whole updates of
train(), the models moving in between (run_updates says what is fixed and what is recorded).
"""
import copy
import math
import os
import sys

os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
import numpy as np
import torch
from datasets import Dataset
from safetensors.torch import save_file
from tokenizers import Tokenizer, models
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, PreTrainedTokenizerFast

sys.path.insert(0, os.path.dirname(__file__))
from fixture_io import write_fixture  # noqa: E402

import trl  # noqa: E402
import trl.trainer.ppo_trainer as ppo_mod  # noqa: E402
from trl import PPOConfig, PPOTrainer  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "fixtures")
MODEL = os.path.join(ROOT, "models", "qwen2")
OUT = os.path.join(ROOT, "ppo")
P = 4  # prompt tokens (all prompts as long: no left padding)
PAD, EOS = 0, 1
TEMPERATURE = 0.7


def tiny_tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, 128)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def make_responses(B, W, seed, stop_after_eos):
    """Completions as HF generate returns them: EOS then pad, or W tokens without one. With
    stop_after_eos False some continue past an EOS (TRL then truncates after its stop token)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(B):
        n = int(torch.randint(2, W + 1, (1,), generator=g))
        ids = torch.randint(2, 128, (W,), generator=g).tolist()
        if i % 4 == 0:
            n = W  # no EOS: the longest
        elif i % 4 == 3 and not stop_after_eos:
            ids[n // 2] = EOS  # an EOS in the middle, tokens after it
            n = W
        else:
            ids[n - 1] = EOS
        rows.append(ids[:n] + [PAD] * (W - n))
    return torch.tensor(rows)


def value_and_reward():
    """The value model (the tiny Qwen2's trunk under a random one-label head: its initial weights
    returned too) and the reward model, from the global generator."""
    value = AutoModelForSequenceClassification.from_pretrained(MODEL, num_labels=1, dtype=torch.float32)
    with torch.no_grad():
        value.score.weight.copy_(0.3 * torch.randn_like(value.score.weight))
    reward = AutoModelForSequenceClassification.from_pretrained(MODEL, num_labels=1, dtype=torch.float32)
    return value, value.score.weight.detach().clone(), reward


def run_case(name, seed, cfg):
    torch.manual_seed(seed)
    np.random.seed(seed)
    bs, ga, nmb = cfg["bs"], cfg["ga"], cfg["nmb"]
    B = bs * ga
    W = cfg["W"]
    tok = tiny_tokenizer()
    policy = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    ref = copy.deepcopy(policy)
    with torch.no_grad():  # a reference that differs from the policy (a KL to measure)
        for p in ref.parameters():
            p.add_(0.02 * torch.randn_like(p))
    value, score_w, reward = value_and_reward()
    g = torch.Generator().manual_seed(seed + 1)
    queries = torch.randint(2, 128, (B, P), generator=g)
    responses = make_responses(B, W, seed + 2, cfg.get("stop_token") is None)
    scores_raw = torch.randn(B, generator=g)
    gen_noise = 0.3 * torch.randn(B, W, generator=g)
    val_noise = 0.3 * torch.randn(B, W, generator=g)
    ds = Dataset.from_list([{"input_ids": q.tolist()} for q in queries] * 2)
    args = PPOConfig(
        output_dir="/tmp/ctrl-ppo-fixture", per_device_train_batch_size=bs, gradient_accumulation_steps=ga,
        num_mini_batches=nmb, num_ppo_epochs=cfg["epochs"], total_episodes=B, response_length=W,
        temperature=TEMPERATURE, stop_token=cfg.get("stop_token"), missing_eos_penalty=cfg.get("missing_eos_penalty"),
        kl_coef=cfg["kl_coef"], kl_estimator=cfg["kl_estimator"], gamma=cfg["gamma"], lam=cfg["lam"],
        whiten_rewards=cfg["whiten_rewards"], cliprange=cfg["cliprange"], cliprange_value=cfg["cliprange_value"],
        vf_coef=cfg["vf_coef"], learning_rate=1e-3, num_sample_generations=0, report_to=[], use_cpu=True,
        bf16=False, gradient_checkpointing=False, logging_steps=1, save_strategy="no", seed=seed,
        local_rollout_forward_batch_size=B)
    tr = PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=ref, reward_model=reward,
                    train_dataset=ds, value_model=value, eval_dataset=ds)

    gen = {}

    def fake_batch_generation(model, q, fwd_bs, pad, gc):
        order = [int(torch.nonzero((queries == row).all(1))[0]) for row in q]  # the dataloader shuffles
        gen["order"] = order
        qr = torch.cat((q, responses[order]), 1)
        with torch.no_grad():
            out = ppo_mod.forward(model, qr, pad)
        logits = out.logits[:, P - 1:-1] / (TEMPERATURE + 1e-7) + gen_noise[order].unsqueeze(-1) * \
            torch.linspace(-1, 1, out.logits.shape[-1])
        gen["logits"] = logits
        return qr, logits
    ppo_mod.batch_generation = fake_batch_generation

    orig_get_reward = ppo_mod.get_reward

    def fake_get_reward(model, qr, pad, ctx):
        if model is reward:
            return None, scores_raw[gen["order"]].clone(), None
        full, s, l = orig_get_reward(model, qr, pad, ctx)
        full = full.clone()
        full[:, ctx - 1:-1, 0] += val_noise[gen["order"]]
        gen["values_raw"] = full[:, ctx - 1:-1, 0].clone()
        return full, s, l
    ppo_mod.get_reward = fake_get_reward

    perms = []
    orig_perm = np.random.permutation

    def rec_perm(n):
        p = orig_perm(n)
        perms.append(p.tolist())
        return p
    ppo_mod.np.random.permutation = rec_perm

    mbs = []
    orig_forward = ppo_mod.forward

    def rec_forward(model, qr, pad):
        out = orig_forward(model, qr, pad)
        if isinstance(out, tuple):  # the PolicyAndValueWrapper in training: keep dL/dlogits, dL/dvalue
            o, v = out
            o.logits.retain_grad()
            v.retain_grad()
            mbs.append((qr, o, v))
        return out
    ppo_mod.forward = rec_forward
    lps = []
    orig_sls = ppo_mod.selective_log_softmax

    def rec_sls(logits, index):
        out = orig_sls(logits, index)
        if out.requires_grad:  # a training micro-batch's new log-probs: keep dL/dlogp
            out.retain_grad()
            lps.append(out)
        return out
    ppo_mod.selective_log_softmax = rec_sls

    rollout = {}

    def tracer(frame, event, arg):
        if frame.f_code.co_name != "train":
            return None

        def line(fr, ev, a):
            if ev == "line" and not rollout and "ppo_epoch_idx" in fr.f_locals:
                for k in ("logprobs", "ref_logprobs", "values", "padding_mask", "padding_mask_p1", "scores",
                          "rewards", "advantages", "returns", "kl", "non_score_reward", "sequence_lengths",
                          "postprocessed_responses", "responses"):
                    rollout[k] = fr.f_locals[k].detach().clone()
            return line
        return line

    grads = {}
    inner = tr.optimizer.optimizer
    orig_step = inner.step

    def rec_step(*a, **k):
        if not grads:
            for n, p in tr.model.named_parameters():
                if p.grad is not None:
                    grads[n] = p.grad.detach().clone()
            grads["_dl"] = [(lp.grad.clone(), m[2].grad.clone()) for lp, m in zip(lps, mbs)]
        return orig_step(*a, **k)
    inner.step = rec_step

    logged = {}
    orig_log = tr.log
    tr.log = lambda m, *a, **k: (logged.update(m), orig_log(m, *a, **k))[1]
    sys.settrace(tracer)
    try:
        tr.train()
    finally:
        sys.settrace(None)
        ppo_mod.np.random.permutation = orig_perm
        ppo_mod.forward, ppo_mod.get_reward = orig_forward, orig_get_reward
        ppo_mod.selective_log_softmax = orig_sls

    order = gen["order"]
    logits = gen["logits"]
    resp = rollout["responses"]
    old_raw = torch.log_softmax(logits, -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
    # the first optimizer step's micro-batches: their rows, new log-probs and values and the
    # loss's gradients with respect to them
    n_first = ga  # accelerate steps the optimizer every `ga` micro-batches, whatever num_mini_batches
    mb_rows, mb_logp, mb_dlogp, mb_vpred, mb_dvpred, mb_ent = [], [], [], [], [], []
    for u in range(n_first):
        qr, o, v = mbs[u]
        rows = perms[0][u * bs:(u + 1) * bs]
        mb_rows += rows
        lg = o.logits[:, P - 1:-1]  # TRL divided this view by the temperature in place
        lp = torch.log_softmax(lg, -1)
        r = qr[:, P:]
        mb_logp.append(lp.gather(-1, r.unsqueeze(-1)).squeeze(-1).detach())
        pr = torch.softmax(lg, -1)
        mb_ent.append((torch.logsumexp(lg, -1) - (pr * lg).sum(-1)).detach())
        dlp, dv = grads["_dl"][u]
        mb_dlogp.append(dlp)
        mb_vpred.append(v[:, P - 1:-1, 0].detach())
        mb_dvpred.append(dv[:, P - 1:-1, 0])
    stats_keys = ["objective/kl", "objective/entropy", "objective/non_score_reward", "objective/rlhf_reward",
                  "objective/scores", "policy/approxkl_avg", "policy/clipfrac_avg", "loss/policy_avg",
                  "loss/value_avg", "val/clipfrac_avg", "policy/entropy_avg", "val/ratio", "val/ratio_var",
                  "val/num_eos_tokens"]
    f = lambda t: t.flatten().float().tolist()  # noqa: E731
    conf = [bs, ga, nmb, cfg["epochs"], EOS if cfg.get("stop_token") else -1,
            cfg["missing_eos_penalty"] if cfg.get("missing_eos_penalty") is not None else float("nan"),
            1.0 if cfg["kl_estimator"] == "k3" else 0.0, cfg["kl_coef"], cfg["gamma"], cfg["lam"],
            float(cfg["whiten_rewards"]), cfg["cliprange"], cfg["cliprange_value"], cfg["vf_coef"], TEMPERATURE,
            PAD, EOS]
    arrays = [("config", conf), ("shape", [B, W, P, n_first]),
              ("queries", f(queries[order])), ("responses", f(resp)),
              ("old_logp_raw", f(old_raw)), ("values_raw", f(gen["values_raw"])),
              ("scores_raw", f(scores_raw[order]))]
    for k in ("logprobs", "ref_logprobs", "values", "padding_mask", "padding_mask_p1", "scores", "rewards",
              "advantages", "returns", "kl", "non_score_reward", "sequence_lengths", "postprocessed_responses"):
        arrays.append(("trl:" + k, f(rollout[k])))
    arrays += [("perm", [x for p in perms for x in p]), ("mb_rows", mb_rows),
               ("mb_logp", f(torch.cat(mb_logp))), ("mb_entropy", f(torch.cat(mb_ent))),
               ("mb_dlogp", f(torch.cat(mb_dlogp))), ("mb_vpred", f(torch.cat(mb_vpred))),
               ("mb_dvpred", f(torch.cat(mb_dvpred)))]
    for k in stats_keys:
        arrays.append(("metric:" + k, [float(logged[k])]))
    write_fixture(os.path.join(OUT, name + ".bin"), arrays, f"trl {trl.__version__} ppo {name}")
    if cfg.get("grads"):
        keep = {}
        for n, gr in grads.items():
            if n == "_dl":
                continue
            if "embed_tokens" in n or "layers.1.self_attn.q_proj" in n or "layers.0.mlp.down_proj" in n or \
                    n.endswith("norm.weight") and "layers" not in n or "score" in n:
                keep[n] = gr.contiguous()
        keep["value_model.score.init"] = score_w.contiguous()
        save_file(keep, os.path.join(OUT, name + ".grads.safetensors"))
    else:
        save_file({"value_model.score.init": score_w.contiguous()}, os.path.join(OUT, name + ".grads.safetensors"))
    print(name, {k: round(float(logged[k]), 5) for k in stats_keys})


CASES = {
    "k1_plain": dict(bs=2, ga=2, nmb=1, epochs=1, W=6, kl_coef=0.05, kl_estimator="k1", gamma=1.0, lam=0.95,
                     whiten_rewards=False, cliprange=0.2, cliprange_value=0.2, vf_coef=0.1, grads=True),
    "k3_whiten_stop": dict(bs=4, ga=2, nmb=1, epochs=1, W=7, kl_coef=0.2, kl_estimator="k3", gamma=0.9, lam=0.8,
                           whiten_rewards=True, cliprange=0.1, cliprange_value=0.05, vf_coef=0.5, stop_token="eos",
                           missing_eos_penalty=1.0),
    "epochs_minibatches": dict(bs=2, ga=2, nmb=2, epochs=2, W=5, kl_coef=0.05, kl_estimator="k1", gamma=1.0,
                               lam=0.95, whiten_rewards=False, cliprange=0.2, cliprange_value=0.2, vf_coef=0.1,
                               stop_token="eos"),
}


def run_updates(name="two_updates", seed=7, updates=2):
    """UPDATES whole PPO updates of TRL's train() on the tiny Qwen2 -- the policy, the value model and
    AdamW (lr 1e-3, constant) moving between them -- from fixed full-width responses (no EOS, no
    stop token: every mask is one) and fixed reward-model scores, the generation and reference being
    the models' own forwards (no noise; the reference is the initial policy). Recorded per update:
    the queries in the order the dataloader gave them, the responses, the scores and TRL's logged
    metrics; the epochs' permutations in order; the value head's initial weights."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    bs, ga, epochs, W = 2, 2, 2, 5
    B = bs * ga
    cfg = dict(kl_coef=0.05, gamma=1.0, lam=0.95, cliprange=0.2, cliprange_value=0.2, vf_coef=0.1)
    tok = tiny_tokenizer()
    policy = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    ref = copy.deepcopy(policy)
    value, score_w, reward = value_and_reward()
    g = torch.Generator().manual_seed(seed + 1)
    # one batch more than the updates take: on the dataloader's last batch accelerate's accumulate()
    # syncs (steps the optimizer) on every micro-batch, whatever gradient_accumulation_steps says
    queries = torch.randint(2, 128, ((updates + 1) * B, P), generator=g)
    responses = torch.randint(2, 128, ((updates + 1) * B, W), generator=g)
    scores_raw = torch.randn((updates + 1) * B, generator=g)
    ds = Dataset.from_list([{"input_ids": q.tolist()} for q in queries])
    args = PPOConfig(
        output_dir="/tmp/ctrl-ppo-fixture", per_device_train_batch_size=bs, gradient_accumulation_steps=ga,
        num_mini_batches=1, num_ppo_epochs=epochs, total_episodes=updates * B, response_length=W,
        temperature=TEMPERATURE, stop_token=None, missing_eos_penalty=None, kl_estimator="k1",
        whiten_rewards=False, learning_rate=1e-3, lr_scheduler_type="constant", num_sample_generations=0,
        report_to=[], use_cpu=True, bf16=False, gradient_checkpointing=False, logging_steps=1, save_strategy="no",
        seed=seed, local_rollout_forward_batch_size=B, **cfg)
    tr = PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=ref, reward_model=reward,
                    train_dataset=ds, value_model=value, eval_dataset=ds)
    orders = []

    def fake_batch_generation(model, q, fwd_bs, pad, gc):
        order = [int(torch.nonzero((queries == row).all(1))[0]) for row in q]
        orders.append(order)
        qr = torch.cat((q, responses[order]), 1)
        with torch.no_grad():
            out = ppo_mod.forward(model, qr, pad)
        return qr, out.logits[:, P - 1:-1] / (TEMPERATURE + 1e-7)
    orig_gen, orig_get_reward, orig_perm = ppo_mod.batch_generation, ppo_mod.get_reward, np.random.permutation
    ppo_mod.batch_generation = fake_batch_generation

    def fake_get_reward(model, qr, pad, ctx):
        if model is reward:
            return None, scores_raw[orders[-1]].clone(), None
        return orig_get_reward(model, qr, pad, ctx)
    ppo_mod.get_reward = fake_get_reward
    perms = []

    def rec_perm(n):
        p = orig_perm(n)
        perms.append(p.tolist())
        return p
    ppo_mod.np.random.permutation = rec_perm
    logs, snap = [], {}
    orig_log = tr.log

    def log_and_snapshot(m, *a, **k):  # after each update's optimizer steps: a few of both models' weights
        logs.append(dict(m))
        if len(logs) == 1:
            for n, p in tr.model.policy.named_parameters():
                if "layers.0.self_attn.q_proj.weight" in n or "embed_tokens" in n:
                    snap["policy." + n] = p.detach().clone().contiguous()
            for n, p in tr.model.value_model.named_parameters():
                if "score" in n or "layers.0.mlp.down_proj" in n:
                    snap["value_model." + n] = p.detach().clone().contiguous()
        return orig_log(m, *a, **k)
    tr.log = log_and_snapshot
    rollouts = []

    def tracer(frame, event, arg):  # each update's rollout, read from train()'s frame
        if frame.f_code.co_name != "train":
            return None

        def line(fr, ev, a):
            loc = fr.f_locals
            if ev == "line" and loc.get("ppo_epoch_idx") == 0 and loc.get("minibatch_idx") == 0 and \
                    len(rollouts) < loc["update"]:  # (the previous update's loop variables linger before)
                rollouts.append({k: loc[k].detach().clone() for k in ("logprobs", "ref_logprobs", "values",
                                                                       "advantages", "returns")})
            return line
        return line
    sys.settrace(tracer)
    try:
        tr.train()
    finally:
        sys.settrace(None)
        ppo_mod.batch_generation, ppo_mod.get_reward = orig_gen, orig_get_reward
        ppo_mod.np.random.permutation = orig_perm
    keys = ["objective/kl", "objective/entropy", "objective/non_score_reward", "objective/rlhf_reward",
            "objective/scores", "policy/approxkl_avg", "policy/clipfrac_avg", "loss/policy_avg", "loss/value_avg",
            "val/clipfrac_avg", "policy/entropy_avg", "val/ratio"]
    f = lambda t: t.flatten().float().tolist()  # noqa: E731
    conf = [bs, ga, 1, epochs, -1, float("nan"), 0.0, cfg["kl_coef"], cfg["gamma"], cfg["lam"], 0.0,
            cfg["cliprange"], cfg["cliprange_value"], cfg["vf_coef"], TEMPERATURE, PAD, EOS]
    arrays = [("config", conf), ("shape", [B, W, P, updates]), ("lr", [args.learning_rate])]
    for u in range(updates):
        o = orders[u]
        arrays += [(f"u{u}_queries", f(queries[o])), (f"u{u}_responses", f(responses[o])),
                   (f"u{u}_scores", f(scores_raw[o]))]
        arrays += [(f"u{u}_trl:{k}", f(v)) for k, v in rollouts[u].items()]
    arrays.append(("perm", [x for p in perms for x in p]))
    for k in keys:
        arrays.append(("metric:" + k, [float(m[k]) for m in logs if k in m]))
    write_fixture(os.path.join(OUT, name + ".updates"), arrays, f"trl {trl.__version__} ppo {name}")
    save_file({"value_model.score.init": score_w.contiguous(), **{"u0." + k: v for k, v in snap.items()}},
              os.path.join(OUT, name + ".safetensors"))
    print(name, {k: [round(float(m[k]), 5) for m in logs if k in m] for k in keys[:2] + keys[7:9]})


def main():
    os.makedirs(OUT, exist_ok=True)
    if "--updates" in sys.argv:
        return run_updates()
    for i, (name, cfg) in enumerate(CASES.items()):
        run_case(name, i, cfg)


if __name__ == "__main__":
    main()
