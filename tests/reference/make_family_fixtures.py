#!/usr/bin/env python3
"""Parity fixtures for the model families beyond Llama/Qwen/Mistral (issue 22): tiny random models
made and run by transformers itself (float32, eager attention), saved as HF directories under
tests/fixtures/families/<name>/ with
  batch.json         a packed batch of three sequences (each run on its own by transformers, which
                     a padding-free packed batch must reproduce): per-token log-probs of the next
                     tokens and the mean loss
  grads.safetensors  the gradient of that loss for every parameter, under the parameter names
  generation.json    greedy model.generate (12 new tokens, no EOS) from two prompts, and the logits
                     after each prompt
Shapes cover GQA, head_dim != hidden / heads, tied and untied embeddings, alternating sliding and
full layers (windows shorter than the sequences), soft-capping small enough to bend the logits, and
token 0 (Gemma's pad_token_id: nn.Embedding's padding_idx, whose row gets no embedding gradient) in
the batch. Also gemma2_sft/ and qwen3_moe_sft/: TRL's SFTTrainer curves on tiny models (make_sft_curve);
qwen3_moe_{dpo,kto}_aux/: TRL's DPO and KTO with the MoE load-balancing loss (make_pref_curve);
batch_bf16.json and grads_bf16.safetensors of BF16_FAMILIES: the batch under torch.autocast(bfloat16)
(make_bf16); phi3_mha/generation_long.json: greedy generate across the trained context (make_long_generation).
Run by hand:
    /work/venv/bin/python tests/reference/make_family_fixtures.py [NAME...]
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from fixture_io import randomize_params, write_bf16_batch
from transformers import (AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, LlamaConfig, MixtralConfig,
                          OlmoeConfig, Phi3Config, Qwen3MoeConfig)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "families")
LENGTHS = [7, 12, 5]

FAMILIES = {
    # GQA 4/2, head_dim 12 != 32/4, tied, layers sliding/full/sliding (the default pattern), window 4
    "gemma2_gqa": (Gemma2Config, dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=12, vocab_size=96,
                                      max_position_embeddings=256, query_pre_attn_scalar=20, sliding_window=4,
                                      attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                                      tie_word_embeddings=True)),
    # MHA 2/2, head_dim 16 != 24/2, untied, explicit layer_types (full, sliding), window 6, no attention cap
    "gemma2_mha": (Gemma2Config, dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, head_dim=16, vocab_size=80,
                                      max_position_embeddings=256, query_pre_attn_scalar=16, sliding_window=6,
                                      layer_types=["full_attention", "sliding_attention"],
                                      attn_logit_softcapping=None, final_logit_softcapping=5.0,
                                      tie_word_embeddings=False, rope_theta=500.0)),
    # Gemma 3's text model: q/k norms, two RoPEs (the full layers' linearly scaled), GQA, head_dim 12,
    # tied, layers sliding/sliding/full, window 4, no soft-capping (its default)
    "gemma3_gqa": (Gemma3TextConfig, dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=12, vocab_size=96,
                                          max_position_embeddings=256, query_pre_attn_scalar=16, sliding_window=4,
                                          layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                          rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                              "rope_theta": 1000000.0},
                                                           "sliding_attention": {"rope_type": "default",
                                                                                 "rope_theta": 100.0}},
                                          tie_word_embeddings=True)),
    # MHA, head_dim 16, untied, sliding_window_pattern 2 (sliding, full), both soft-cappings set
    "gemma3_mha": (Gemma3TextConfig, dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=2, head_dim=16, vocab_size=80,
                                          max_position_embeddings=256, query_pre_attn_scalar=20, sliding_window=6,
                                          sliding_window_pattern=2, attn_logit_softcapping=3.0,
                                          final_logit_softcapping=4.0, tie_word_embeddings=False,
                                          rope_parameters={"full_attention": {"rope_type": "default",
                                                                              "rope_theta": 500.0},
                                                           "sliding_attention": {"rope_type": "default",
                                                                                 "rope_theta": 50.0}})),
    # Phi-3/4: fused qkv_proj and gate_up_proj, GQA 2/1, partial rotary (8 of 16 dims), longrope with a
    # trained context of 4, so that every sequence here runs on the long factors (and attention_factor
    # sqrt(1 + ln 16 / ln 4)), tied
    "phi3_gqa": (Phi3Config, dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, vocab_size=96, max_position_embeddings=64,
                                  original_max_position_embeddings=4, tie_word_embeddings=True, pad_token_id=0,
                                  bos_token_id=1, eos_token_id=2,
                                  rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                   "partial_rotary_factor": 0.5,
                                                   "short_factor": [1.0, 1.25, 1.5, 2.0],
                                                   "long_factor": [1.5, 3.0, 6.0, 12.0]})),
    # MHA, whole-head rotary, longrope over a trained context of 32: everything here on the short factors
    # (generation past the trained context differs: transformers then recomputes the whole cache with the
    # long factors, Phi3ForCausalLM.prepare_inputs_for_generation; ctrl's engine does not); window 8; untied
    "phi3_mha": (Phi3Config, dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=2, vocab_size=80, max_position_embeddings=128,
                                  original_max_position_embeddings=32, tie_word_embeddings=False,
                                  sliding_window=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                  rope_parameters={"rope_type": "longrope", "rope_theta": 500.0,
                                                   "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5],
                                                   "long_factor": [2.0, 3.0, 5.0, 8.0, 13.0, 21.0]})),
    # Llama 3.1/3.2: llama3 rope scaling (a trained context of 16 here, factor 4: the low frequencies
    # divided, the middle ones blended), tied embeddings (3.2 1B/3B), GQA 4/1, head_dim 12 != 32/4
    "llama32": (LlamaConfig, dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=1, head_dim=12, vocab_size=96, max_position_embeddings=64,
                                  tie_word_embeddings=True, rms_norm_eps=1e-5,
                                  rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 4.0,
                                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 16})),
    # Qwen3-MoE: 4 experts, top 2 renormalised (norm_topk_prob), every layer sparse, GQA, head_dim 12
    "qwen3_moe_a": (Qwen3MoeConfig, dict(hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         head_dim=12, vocab_size=96, max_position_embeddings=64, num_experts=4,
                                         num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=False)),
    # 8 experts, top 3 not renormalised, the middle layer dense (mlp_only_layers), tied
    "qwen3_moe_b": (Qwen3MoeConfig, dict(hidden_size=24, intermediate_size=40, moe_intermediate_size=12,
                                         num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                                         head_dim=16, vocab_size=80, max_position_embeddings=64, num_experts=8,
                                         num_experts_per_tok=3, norm_topk_prob=False, mlp_only_layers=[1],
                                         tie_word_embeddings=True)),
    # Mixtral: 4 experts of intermediate_size, top 2 (always renormalised), window 6, GQA
    "mixtral": (MixtralConfig, dict(hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=96, max_position_embeddings=64,
                                    num_local_experts=4, num_experts_per_tok=2, sliding_window=6,
                                    tie_word_embeddings=False)),
    # OLMoE: q_norm / k_norm over the whole projections, 8 experts of intermediate_size, top 3 not renormalised
    "olmoe": (OlmoeConfig, dict(hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, vocab_size=96, max_position_embeddings=64, num_experts=8,
                                num_experts_per_tok=3, norm_topk_prob=False, pad_token_id=0, eos_token_id=2,
                                tie_word_embeddings=False)),
}


def checkpoint_names(grads, mixtral=False):
    """transformers 5 keeps an MoE layer's experts as two 3D parameters (experts.gate_up_proj [E, 2 I, C],
    experts.down_proj [E, C, I]) and saves them per expert (experts.E.gate_proj.weight, ...; Mixtral's as
    block_sparse_moe.experts.E.w1/w3/w2 and block_sparse_moe.gate): the gradients under the saved names."""
    out = {}
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for n, g in grads.items():
        base = n.replace("mlp.", "block_sparse_moe.") if mixtral else n
        if n.endswith("mlp.experts.gate_up_proj"):
            half = g.shape[1] // 2
            for e in range(g.shape[0]):
                out[base[:-len("gate_up_proj")] + "%d.%s.weight" % (e, gate)] = g[e, :half].contiguous()
                out[base[:-len("gate_up_proj")] + "%d.%s.weight" % (e, up)] = g[e, half:].contiguous()
        elif n.endswith("mlp.experts.down_proj"):
            for e in range(g.shape[0]):
                out[base[:-len("down_proj")] + "%d.%s.weight" % (e, down)] = g[e].contiguous()
        else:
            out[base] = g
    return out


def make(name, Cfg, kw, seed):
    torch.manual_seed(seed)
    kw = dict(kw)
    rope_theta = kw.pop("rope_theta", None)
    cfg = Cfg(**kw)
    if rope_theta is not None:
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": rope_theta}
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    randomize_params(model, torch)
    model.eval()
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    tokens, positions, targets, logps, cu = [], [], [], [], [0]
    total = sum(L - 1 for L in LENGTHS)
    loss_sum = 0.0
    for i, L in enumerate(LENGTHS):
        seq = torch.randint(1, cfg.vocab_size, (L,))
        if i == 1:
            seq[3] = 0  # the pad token inside a sequence: its embedding row gets no gradient from it
        logits = model(input_ids=seq[None]).logits[0]
        lp = torch.log_softmax(logits.float(), dim=-1)
        gathered = lp[:-1].gather(1, seq[1:, None])[:, 0]
        loss_sum = loss_sum + (-gathered.sum())
        tokens += seq.tolist()
        positions += list(range(L))
        targets += seq[1:].tolist() + [-100]
        logps += gathered.tolist() + [0.0]
        cu.append(cu[-1] + L)
    loss = loss_sum / total
    loss.backward()
    grads = {n: p.grad.detach().contiguous() for n, p in model.named_parameters()}
    if cfg.tie_word_embeddings:
        grads.pop("lm_head.weight", None)
    save_file(checkpoint_names(grads, cfg.model_type == "mixtral"), os.path.join(d, "grads.safetensors"))
    note = "torch %s, transformers %s (make_family_fixtures.py)" % (torch.__version__, transformers.__version__)
    with open(os.path.join(d, "batch.json"), "w") as f:
        json.dump({"tokens": tokens, "positions": positions, "targets": targets, "cu_seqlens": cu,
                   "logp": logps, "loss": loss.item(), "note": note}, f)
    g = torch.Generator().manual_seed(seed + 1)
    cases = []
    for n in (5, 11):
        prompt = torch.randint(1, cfg.vocab_size, (1, n), generator=g)
        with torch.no_grad():
            first = model(prompt).logits[0, -1]
            out = model.generate(prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)
        cases.append({"prompt": prompt[0].tolist(), "generated": out[0, n:].tolist(),
                      "first_logits": first.tolist()})
    with open(os.path.join(d, "generation.json"), "w") as f:
        json.dump(cases, f)
    print(name, "loss %.6f" % loss.item(), "params", sum(p.numel() for p in model.parameters()),
          "generated", [c["generated"] for c in cases])


# -- TRL's SFT curves (tests/e2e/test_families_sft.c) --
def sft_models(tok):
    """name -> (config, randomize): a Gemma 2 (GQA, head_dim 16 != 32/4, window 8 on alternating layers,
    final-logit soft-capping 3, tied) and a Qwen3-MoE (8 experts, top 2 renormalised, q/k norms;
    router_aux_loss_coef 0, and 0.01: TRL's load-balancing loss on), in the committed tiny tokenizer's
    vocabulary."""
    common = dict(vocab_size=len(tok), max_position_embeddings=256, bos_token_id=None,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return {
        "gemma2_sft": Gemma2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                                   attn_logit_softcapping=50.0, final_logit_softcapping=3.0,
                                   tie_word_embeddings=True, **common),
        "qwen3_moe_sft": Qwen3MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        head_dim=8, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                        router_aux_loss_coef=0.0, tie_word_embeddings=True, **common),
        # the same with TRL's load-balancing loss on (the config's coefficient, 0.01 here)
        "qwen3_moe_sft_aux": Qwen3MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=8, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                            router_aux_loss_coef=0.01, tie_word_embeddings=True, **common),
    }


def make_sft_curve(name):
    """TRL's SFTTrainer for 20 steps on a tiny random model of sft_models over tests/fixtures/trl_sft's
    arithmetic rows, padded batches of 4, as make_trl_sft_curves.py runs its Qwen2:
    <name>/{model, padded.ini, padded.trl.jsonl}."""
    import shutil
    import tempfile

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig
    from make_trl_sft_curves import COMMON, FIX, STEPS, TOK, Record, Sequential

    tok = AutoTokenizer.from_pretrained(TOK)
    torch.manual_seed(5)
    cfg = sft_models(tok)[name]
    model = AutoModelForCausalLM.from_config(cfg)
    randomize_params(model, torch)
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(os.path.join(d, "model"), safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOK, f), os.path.join(d, "model", f))
    model = AutoModelForCausalLM.from_pretrained(os.path.join(d, "model"), attn_implementation="eager")
    rows = [json.loads(l) for l in open(os.path.join(FIX, "trl_sft", "prompt_completion.jsonl"))]
    rec = Record(("loss", "grad_norm", "learning_rate", "entropy", "mean_token_accuracy", "num_tokens", "aux_loss"))
    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(output_dir=tmp, report_to=[], use_cpu=True, max_steps=STEPS, logging_steps=1,
                         save_strategy="no", optim="adamw_torch", dataloader_drop_last=False, bf16=False,
                         per_device_train_batch_size=4, **COMMON)
        trainer = Sequential(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                             callbacks=[rec])
        trainer.train()
    with open(os.path.join(d, "padded.trl.jsonl"), "w") as f:
        for r in rec.rows:
            f.write(json.dumps(r) + "\n")
    lines = ["[run]", "output_dir = @OUT@", "device = cpu", "seed = 42", "", "[model]", "path = @DIR@/model",
             "attention = eager", "", "[data]", "train_file = @TRL@/prompt_completion.jsonl",
             "max_length = %d" % COMMON["max_length"], "shuffle = false", "padding_free = false", "", "[train]",
             "dtype = fp32", "learning_rate = %g" % COMMON["learning_rate"], "lr_scheduler_type = linear",
             "warmup_steps = %d" % COMMON["warmup_steps"], "weight_decay = %g" % COMMON["weight_decay"],
             "max_grad_norm = 1.0", "max_steps = %d" % STEPS, "logging_steps = 1", "per_device_train_batch_size = 4",
             "optimizer = adamw", "", "[adamw]", "adam_beta1 = 0.9", "adam_beta2 = 0.999", "adam_epsilon = 1e-8", ""]
    with open(os.path.join(d, "padded.ini"), "w") as f:
        f.write("\n".join(lines))
    print(name, " ".join("%.5f" % r["loss"] for r in rec.rows[:6]), "...")


# -- TRL's preference trainers on a tiny Qwen3-MoE with the load-balancing loss (tests/e2e/test_families_sft.c) --
# case: (trainer, data, TRL overrides, ctrl [train] lines, ctrl [TRAINER] lines, eval data)
PREF_CASES = {
    # DPO with the config's coefficient (0.01), 2 x 2 accumulated, TRL's evaluate() after the steps
    "qwen3_moe_dpo_aux": ("dpo", "trl_dpo/pairs.jsonl", dict(per_device_train_batch_size=2,
                                                             gradient_accumulation_steps=2,
                                                             per_device_eval_batch_size=8),
                          {"per_device_train_batch_size": "2", "gradient_accumulation_steps": "2",
                           "per_device_eval_batch_size": "8"}, {}, "trl_dpo/eval_pairs.jsonl"),
    # KTO (KL sequences out of the aux's mask) with the coefficient overridden to 0.05 in [train]
    "qwen3_moe_kto_aux": ("kto", "trl_kto/rows.jsonl", dict(per_device_train_batch_size=4, router_aux_loss_coef=0.05),
                          {"router_aux_loss_coef": "0.05"}, {}, None),
}
PREF_STEPS = 10


def make_pref_curve(name):
    """TRL's DPOTrainer / KTOTrainer for PREF_STEPS steps on qwen3_moe_sft_aux's model (router_aux_loss_coef
    0.01 in its config) over the committed arithmetic preference rows: <name>/{case.ini, case.trl.jsonl} and,
    with an eval set, case.trl_eval.json. @DIR@: this folder, @FIX@: tests/fixtures, @OUT@: the output."""
    import tempfile

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer
    from fixture_io import write_curve_ini
    from make_trl_dpo_curves import COMMON
    from make_trl_sft_curves import Record, sequential

    trainer_name, data, overrides, train_opts, trainer_opts, eval_data = PREF_CASES[name]
    Config, Trainer = (DPOConfig, DPOTrainer) if trainer_name == "dpo" else (KTOConfig, KTOTrainer)
    fix = os.path.join(OUT, "..")
    mdir = os.path.join(OUT, "qwen3_moe_sft_aux", "model")
    tok = AutoTokenizer.from_pretrained(mdir)
    rows = [json.loads(l) for l in open(os.path.join(fix, data))]
    evals = [json.loads(l) for l in open(os.path.join(fix, eval_data))] if eval_data else None
    keys = ("loss", "grad_norm", "learning_rate", "aux_loss", "num_tokens", "rewards/chosen", "rewards/rejected",
            "rewards/margins", "logps/chosen", "logps/rejected", "kl")
    rec = Record(keys)
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = AutoModelForCausalLM.from_pretrained(mdir, attn_implementation="eager")
        ref = AutoModelForCausalLM.from_pretrained(mdir, attn_implementation="eager")
        args = Config(output_dir=tmp, report_to=[], use_cpu=True, max_steps=PREF_STEPS, logging_steps=1,
                      save_strategy="no", optim="adamw_torch", dataloader_drop_last=False, bf16=False,
                      gradient_checkpointing=False, **dict(COMMON, **overrides))
        trainer = sequential(Trainer)(model=model, ref_model=ref, args=args, train_dataset=Dataset.from_list(rows),
                                      eval_dataset=Dataset.from_list(evals) if evals else None,
                                      processing_class=tok, callbacks=[rec])
        trainer.train()
        if evals:
            with open(os.path.join(d, "case.trl_eval.json"), "w") as f:
                json.dump({k: v for k, v in trainer.evaluate().items() if k.startswith("eval_")}, f)
    with open(os.path.join(d, "case.trl.jsonl"), "w") as f:
        for r in rec.rows:
            f.write(json.dumps(r) + "\n")
    write_curve_ini(os.path.join(d, "case.ini"), trainer_name, COMMON, PREF_STEPS, "@FIX@/families/qwen3_moe_sft_aux/model",
                    "@FIX@/" + data, train_opts, trainer_opts, "@FIX@/" + eval_data if eval_data else None)
    print(name, " ".join("%.5f/%.5f" % (r["loss"], r.get("aux_loss", float("nan"))) for r in rec.rows[:4]), "...")


# -- bf16: the same batch under torch.autocast(bfloat16), fp32 weights (TRL's bf16 = True) --
BF16_FAMILIES = ("gemma2_gqa", "gemma3_mha", "phi3_gqa", "qwen3_moe_a")


def make_bf16(name):
    """<name>/batch_bf16.json and grads_bf16.safetensors of the fixture model, as
    make_bf16_model_fixtures.py makes the base models' (fixture_io.write_bf16_batch)."""
    loss, fp32 = write_bf16_batch(os.path.join(OUT, name), "make_family_fixtures.py make_bf16",
                                  lambda g, m: checkpoint_names(g, mixtral=m.config.model_type == "mixtral"))
    print(name, "bf16 loss %.6f (fp32 %.6f)" % (loss, fp32))


def make_long_generation(name="phi3_mha", prompt_len=26, new=14):
    """<name>/generation_long.json: greedy model.generate from a prompt of prompt_len tokens for `new`
    tokens, crossing the trained context (original_max_position_embeddings 32) on the way, where
    Phi3ForCausalLM drops its cache and computes the whole sequence again on longrope's long factors;
    and `kept_cache`: the tokens a decode that keeps the short-factor cache instead gives (they differ:
    the seed is the first whose two continuations do)."""
    d = os.path.join(OUT, name)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    orig = model.config.original_max_position_embeddings
    assert prompt_len <= orig < prompt_len + new
    for seed in range(100):
        prompt = torch.randint(1, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)[0, prompt_len:].tolist()
            # the same greedy decode through the cache, never dropping it
            res = model(prompt, use_cache=True)
            past, kept, nxt = res.past_key_values, [], res.logits[0, -1].argmax().item()
            for i in range(new):
                kept.append(nxt)
                if i + 1 == new:
                    break
                res = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past, nxt = res.past_key_values, res.logits[0, -1].argmax().item()
        if kept != out:
            break
    with open(os.path.join(d, "generation_long.json"), "w") as f:
        json.dump({"prompt": prompt[0].tolist(), "generated": out, "kept_cache": kept,
                   "original_max_position_embeddings": orig, "seed": seed}, f)
    print(name, "long generation (seed %d):" % seed, out, "kept cache:", kept)


def main():
    names = sys.argv[1:]  # some of FAMILIES (or gemma2_sft); all without
    for i, (name, (Cfg, kw)) in enumerate(FAMILIES.items()):
        if not names or name in names:
            make(name, Cfg, kw, 2200 + i)
    for name in ("gemma2_sft", "qwen3_moe_sft", "qwen3_moe_sft_aux"):
        if not names or name in names:
            make_sft_curve(name)
    for name in PREF_CASES:
        if not names or name in names:
            make_pref_curve(name)
    for name in BF16_FAMILIES:
        if not names or name in names or "bf16" in names:
            make_bf16(name)
    if not names or "phi3_long" in names:
        make_long_generation()


if __name__ == "__main__":
    main()
