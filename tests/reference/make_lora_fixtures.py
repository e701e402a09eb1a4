#!/usr/bin/env python3
"""LoRA parity fixtures written by PEFT itself: the tiny fixture models of make_model_fixtures.py
(tests/fixtures/models/<arch>; Phi-3's, with fused qkv_proj / gate_up_proj, from families/) wrapped with peft.get_peft_model under several LoraConfigs, each
adapter saved with PEFT's own save_pretrained (adapter_config.json + adapter_model.safetensors)
under tests/fixtures/lora/<case>/, with what PEFT computes on the model fixture's packed batch
(each sequence on its own, in eval mode: dropout off): per-token log-probs of the next tokens, the
mean loss (batch.json), and the gradient of that loss for every trainable tensor -- every lora_A /
lora_B and modules_to_save tensor -- under the names the adapter file uses (grads.safetensors).
The DoRA cases (use_dora=True) also hold each lora_magnitude_vector and its gradient; where the case
says "perturb", the magnitudes PEFT initialised (the weight norms, which make DoRA's output equal
LoRA's) are scaled by random factors in [0.8, 1.2] before saving, so that they change the output.
The QLoRA cases ("nf4"; with use_dora, QDoRA) load the base as transformers does with BitsAndBytesConfig(load_in_4bit=True,
bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=float32)
(bitsandbytes on the CPU; batch.json says "nf4": true) and put the adapters over it.
Run by hand (all cases, or the ones named; the QLoRA cases need bitsandbytes):
    /work/venv/bin/python tests/reference/make_lora_fixtures.py [CASE ...]
"""
import json
import math
import os
import sys

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from peft.utils import get_peft_model_state_dict
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

from fixture_io import packed_logps, save_peft_adapter

HERE = os.path.dirname(__file__)
MODELS = os.path.join(HERE, "..", "fixtures", "models")
OUT = os.path.join(HERE, "..", "fixtures", "lora")

# name: (arch, LoraConfig keywords, B non-zero).  init_lora_weights=False leaves nn.Linear's own
# init on both A and B (non-zero B, so that every path carries signal); the default-init case
# keeps B = 0 (A's gradient is then exactly zero) and checks it.
CASES = {
    "llama_qv": ("llama", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
                               lora_dropout=0.0)),
    "llama_all_rslora": ("llama", dict(r=2, lora_alpha=16, target_modules="all-linear", use_rslora=True,
                                       init_lora_weights=False, lora_dropout=0.1, modules_to_save=["lm_head"])),
    "qwen2_attn_mlp": ("qwen2", dict(r=3, lora_alpha=5, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                        "gate_proj", "up_proj", "down_proj"],
                                     init_lora_weights=False, lora_dropout=0.0)),
    "qwen3_default_init": ("qwen3", dict(r=4, lora_alpha=4, target_modules=["o_proj", "down_proj"],
                                         lora_dropout=0.0, modules_to_save=["embed_tokens"])),
    "llama_dora_qv": ("llama", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False,
                                    lora_dropout=0.0, use_dora=True), "perturb"),
    "qwen2_dora_all_rslora": ("qwen2", dict(r=2, lora_alpha=6, target_modules="all-linear", use_rslora=True,
                                            init_lora_weights=False, lora_dropout=0.05, use_dora=True), "perturb"),
    "qwen3_dora_default_init": ("qwen3", dict(r=4, lora_alpha=4, target_modules=["q_proj", "o_proj", "down_proj"],
                                              lora_dropout=0.0, use_dora=True)),
    # QLoRA: the base loaded by transformers in 4-bit NF4 with double quantization (bitsandbytes on
    # the CPU, compute in fp32), the adapters over it
    "qwen2_qlora_all": ("qwen2", dict(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False,
                                      lora_dropout=0.0), "nf4"),
    "llama_qlora_qv": ("llama", dict(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                                     init_lora_weights=False, lora_dropout=0.0), "nf4"),
    # QLoRA on Phi-3's fused projections: transformers' bitsandbytes integration makes the fused
    # nn.Linear qkv_proj / gate_up_proj a Linear4bit like any other (one NF4 tensor, its blocks of 64
    # over the whole flat weight, one double-quantization offset), PEFT puts one adapter over each
    "phi3_qlora_fused": ("families/phi3_mha", dict(r=4, lora_alpha=8, target_modules="all-linear",
                                                   init_lora_weights=False, lora_dropout=0.0), "nf4"),
    # QLoRA on a mixture-of-experts model: bitsandbytes quantizes the attention projections and the
    # dense middle layer's MLP (nn.Linear) and leaves the experts' 3-D parameters and the router in
    # fp32 (not nn.Linear); the expert adapters (target_parameters) sit over the fp32 experts
    "qwen3_moe_qlora": ("families/qwen3_moe_b", dict(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "o_proj"],
                                                     target_parameters=["experts.gate_up_proj", "experts.down_proj"],
                                                     init_lora_weights=False, lora_dropout=0.0), "nf4"),
    # QDoRA: DoRA over the same 4-bit base (PEFT's Linear4bit with use_dora: the magnitudes and the
    # weight norms from the dequantized NF4 weight, dequantize_module_weight), magnitudes perturbed;
    # Qwen2's biases, all-linear (down_proj's rows of 96 straddle the blocks of 64), rsLoRA
    "qwen2_qdora_all": ("qwen2", dict(r=4, lora_alpha=8, target_modules="all-linear", use_rslora=True,
                                      init_lora_weights=False, lora_dropout=0.0, use_dora=True), "nf4", "perturb"),
    # on Phi-3's fused qkv_proj / gate_up_proj (one NF4 tensor each, one magnitude over its rows)
    "phi3_qdora_fused": ("families/phi3_mha", dict(r=2, lora_alpha=6, target_modules="all-linear",
                                                   init_lora_weights=False, lora_dropout=0.0, use_dora=True),
                         "nf4", "perturb"),
    # Phi-3's fused projections (families/phi3_*: make_family_fixtures.py): PEFT wraps the nn.Linear
    # qkv_proj / gate_up_proj with one lora_A / lora_B pair over the whole fused output; GQA (q, k, v
    # blocks of different widths), tied embeddings, longrope
    "phi3_qkv_gate_up": ("families/phi3_gqa", dict(r=4, lora_alpha=8, target_modules=["qkv_proj", "gate_up_proj"],
                                                   init_lora_weights=False, lora_dropout=0.0)),
    # all-linear on Phi-3 (qkv_proj, o_proj, gate_up_proj, down_proj) with DoRA (a magnitude over the
    # fused output) and rsLoRA, untied with the LM head trained in full
    "phi3_all_dora": ("families/phi3_mha", dict(r=2, lora_alpha=6, target_modules="all-linear", use_rslora=True,
                                                init_lora_weights=False, lora_dropout=0.05, use_dora=True,
                                                modules_to_save=["lm_head"]), "perturb"),
    # LoRA on MoE experts (PEFT's target_parameters, lora.ParamWrapper over transformers 5's 3-D expert
    # parameters [E, out, in]): lora_A [E r, in], lora_B [out, E r] (expert e's B is every E-th column
    # from e); with both parameters targeted the wrappers nest (gate_up_proj's under base_layer.)
    "qwen3_moe_experts": ("families/qwen3_moe_a", dict(r=2, lora_alpha=4, target_modules=["q_proj", "o_proj"],
                                                       target_parameters=["experts.gate_up_proj", "experts.down_proj"],
                                                       init_lora_weights=False, lora_dropout=0.0)),
    # one parameter (no nesting), rsLoRA, no target_modules at all
    "mixtral_experts_down": ("families/mixtral", dict(r=3, lora_alpha=5, target_modules=[], use_rslora=True,
                                                      target_parameters=["experts.down_proj"],
                                                      init_lora_weights=False, lora_dropout=0.0)),
    # the list in the other order (PEFT nests by the module's parameter order, not the list's), 8 experts
    # top 3, q_norm / k_norm over the whole projections. (all-linear, or gate_proj / up_proj / down_proj
    # in target_modules, PEFT 0.21 converts on these families into target_parameters with the router's
    # gate.weight and a doubled rank on gate_up_proj (rank_pattern): ctrl refuses those by key.)
    "olmoe_experts_qkv": ("families/olmoe", dict(r=2, lora_alpha=6, target_modules=["q_proj", "k_proj", "v_proj"],
                                                 target_parameters=["mlp.experts.down_proj", "experts.gate_up_proj"],
                                                 init_lora_weights=False, lora_dropout=0.0)),
    # gate_up_proj alone (no nesting), a dense middle layer (mlp_only_layers) left as it is, tied
    "qwen3_moe_gate_up": ("families/qwen3_moe_b", dict(r=2, lora_alpha=3, target_modules=["o_proj"],
                                                       target_parameters=["experts.gate_up_proj"],
                                                       init_lora_weights=False, lora_dropout=0.0)),
    # PEFT's choice of modules and per-module rank / alpha (lora_match.c): rank_pattern and alpha_pattern
    # (regular expressions matched as re.match(r"(.*\.)?(KEY)$", name), the first key that matches),
    # exclude_modules as a list, over all-linear with Qwen2's biases
    "qwen2_rank_alpha_pattern": ("qwen2", dict(r=4, lora_alpha=8, target_modules="all-linear",
                                               rank_pattern={"q_proj": 2, r"layers\.1\.mlp\.down_proj": 6},
                                               alpha_pattern={"v_proj": 3, r"mlp\.(gate|up)_proj": 12},
                                               exclude_modules=["k_proj"], init_lora_weights=False,
                                               lora_dropout=0.0)),
    # layers_to_transform with layers_pattern, rsLoRA with a rank_pattern (scale alpha / sqrt(its r))
    "llama_layers_rslora": ("llama", dict(r=3, lora_alpha=6, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
                                          layers_to_transform=[1], layers_pattern="layers", use_rslora=True,
                                          rank_pattern={"o_proj": 5}, init_lora_weights=False, lora_dropout=0.1)),
    # target_modules and exclude_modules as regular expressions (re.fullmatch), DoRA with per-module
    # rank and alpha
    "qwen3_regex_dora": ("qwen3", dict(r=2, lora_alpha=4,
                                       target_modules=r".*\.layers\.0\.self_attn\.(q|v)_proj|.*\.mlp\.up_proj",
                                       exclude_modules=r".*\.1\.mlp\.up_proj", rank_pattern={"up_proj": 3},
                                       alpha_pattern={"q_proj": 7}, init_lora_weights=False, lora_dropout=0.0,
                                       use_dora=True), "perturb"),
    # Phi-3's fused projections with their own rank / alpha, one layer (layers_to_transform an int)
    "phi3_fused_rank_pattern": ("families/phi3_gqa", dict(r=2, lora_alpha=4,
                                                          target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
                                                          rank_pattern={"qkv_proj": 3},
                                                          alpha_pattern={"gate_up_proj": 10},
                                                          layers_to_transform=0, init_lora_weights=False,
                                                          lora_dropout=0.0)),
    # PEFT's initialisations from the base weight, which leave its residual as the base (lora_from_base.c):
    # PiSSA (top-r SVD) with a rank_pattern, OLoRA (QR), PiSSA on Phi-3's fused projections with rsLoRA.
    # "perturb_ab": PEFT's initial A and B are kept in init_ab.safetensors, then scaled element by element
    # by random factors in [0.5, 1.5] before saving, so that the log-probs depend on the residual
    "qwen2_pissa": ("qwen2", dict(r=4, lora_alpha=8, target_modules="all-linear", rank_pattern={"down_proj": 2},
                                  init_lora_weights="pissa", lora_dropout=0.0), "perturb_ab"),
    "llama_olora": ("llama", dict(r=3, lora_alpha=6, target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
                                  init_lora_weights="olora", lora_dropout=0.0), "perturb_ab"),
    "phi3_pissa_fused": ("families/phi3_gqa", dict(r=2, lora_alpha=4, target_modules="all-linear", use_rslora=True,
                                                   init_lora_weights="pissa", lora_dropout=0.0), "perturb_ab"),
    # PiSSA with DoRA: the magnitudes the norms of W_res + s B A = W (then perturbed), rsLoRA
    "qwen2_pissa_dora": ("qwen2", dict(r=2, lora_alpha=4, target_modules=["q_proj", "o_proj", "up_proj"],
                                       use_rslora=True, use_dora=True, init_lora_weights="pissa", lora_dropout=0.0),
                         "perturb_ab", "perturb"),
    # lora_bias: lora_B with a bias (nn.Linear(r, out)'s default init at init_lora_weights=False), on layers
    # with and without a base bias (Qwen2's q/k/v have one; o_proj and gate_proj do not: no merge); on q/k/v
    # alone with rsLoRA, which merges (the base's bias += s b)
    "qwen2_lora_bias": ("qwen2", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "gate_proj"],
                                      lora_bias=True, init_lora_weights=False, lora_dropout=0.1)),
    "qwen2_lora_bias_qkv": ("qwen2", dict(r=2, lora_alpha=6, target_modules=["q_proj", "k_proj", "v_proj"],
                                          lora_bias=True, use_rslora=True, init_lora_weights=False,
                                          lora_dropout=0.0)),
    # trainable_token_indices (PEFT's TrainableTokensLayer beside the adapters): the listed rows of the
    # input embedding trained as a [n, C] tensor of their values (initialised as the rows), the rest
    # frozen; on Qwen2's tied embedding the LM head's rows are the same tensor. "perturb_tt": the rows'
    # values moved by N(0, 0.5) noise before saving, so that they change the output. Token 57 is twice in
    # the batch, 100 not at all (its gradient only through the tied head)
    "qwen2_trainable_tokens": ("qwen2", dict(r=2, lora_alpha=4, target_modules=["q_proj", "down_proj"],
                                             trainable_token_indices=[57, 5, 100, 116], init_lora_weights=False,
                                             lora_dropout=0.0), "perturb_tt"),
    # the dictionary form on Llama's untied embedding (the LM head stays the base's), with DoRA
    "llama_trainable_tokens_dict": ("llama", dict(r=2, lora_alpha=6, target_modules=["v_proj", "o_proj"],
                                                  trainable_token_indices={"embed_tokens": [62, 3, 57]},
                                                  use_dora=True, init_lora_weights=False, lora_dropout=0.0),
                                    "perturb_tt", "perturb"),
    # rows of Llama's untied LM head too (PEFT's dictionary with lm_head: a TrainableTokensLayer over the
    # nn.Linear head, its own rows), a token in both lists, one of the head's never in the batch
    "llama_trainable_tokens_head": ("llama", dict(r=2, lora_alpha=4, target_modules=["q_proj", "down_proj"],
                                                  trainable_token_indices={"embed_tokens": [57, 62],
                                                                           "lm_head": [62, 100, 7]},
                                                  init_lora_weights=False, lora_dropout=0.0), "perturb_tt"),
    # modules_to_save on a tied table with ensure_weight_tying: one trained copy that is the embedding and
    # the LM head (PEFT saves it under both names; its config lists the embedding's)
    "qwen2_tied_saved_ewt": ("qwen2", dict(r=2, lora_alpha=4, target_modules=["q_proj", "o_proj"],
                                           modules_to_save=["lm_head"], ensure_weight_tying=True,
                                           init_lora_weights=False, lora_dropout=0.0), "perturb_mts"),
    # modules_to_save with the adapters off (PEFT's disable_adapter(): the original modules): Llama's untied
    # embedding and head trained away from the base ("perturb_mts": scaled by random factors in [0.8, 1.2]);
    # batch.json's off_logp is what PEFT computes under disable_adapter()
    "llama_saved_off": ("llama", dict(r=2, lora_alpha=4, target_modules=["q_proj", "down_proj"],
                                      modules_to_save=["embed_tokens", "lm_head"], init_lora_weights=False,
                                      lora_dropout=0.0), "perturb_mts"),
}


def base_path(arch):
    """The base model's folder relative to tests/fixtures: models/<arch>, or the path given."""
    return arch if "/" in arch else "models/" + arch


def reference_dequantize_4bit(A, quant_state=None, absmax=None, out=None, blocksize=None, quant_type="fp4"):
    """bitsandbytes' dequantize_4bit through its reference kernels (backends/default: flat blocks of
    64, as its CUDA kernels index them). Its native CPU kernel (0.50.2) maps the blocks of a 2-D
    weight whose rows are not a multiple of 64 long row by row (down_proj here: 96), which its own
    quantize_4bit does not: the dequantized weight is then not the quantized one."""
    from bitsandbytes.backends.default import ops as dops
    qs = quant_state
    am = qs.absmax
    if qs.nested:
        am = dops._dequantize_blockwise_compute(qs.absmax.reshape(-1), qs.state2.absmax, qs.state2.code,
                                                qs.state2.blocksize, torch.float32) + qs.offset
    return dops._dequantize_4bit_compute(A.reshape(-1).view(torch.uint8), am, qs.code, qs.blocksize, qs.shape,
                                         qs.dtype)


def nf4_quantization():
    """transformers' 4-bit NF4 load (double quantization, fp32 compute) with Linear4bit's product and
    PEFT's dequantize_module_weight (DoRA's weight) through bitsandbytes' reference kernels."""
    import bitsandbytes

    bitsandbytes.functional.dequantize_4bit = reference_dequantize_4bit
    bitsandbytes.matmul_4bit = lambda A, B, quant_state, out=None, bias=None: torch.nn.functional.linear(
        A, reference_dequantize_4bit(B, quant_state).to(A.dtype), bias)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.float32)


def file_name(param_name):
    """The adapter file's name of a trainable parameter (PEFT drops the adapter name)."""
    n = param_name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")
    n = n.replace(".lora_magnitude_vector.default.weight", ".lora_magnitude_vector")
    n = n.replace(".trainable_tokens_delta.default", ".trainable_tokens_delta")
    return n.replace(".modules_to_save.default.", ".")


def main():
    for case, (arch, kw, *how) in CASES.items():
        if sys.argv[1:] and case not in sys.argv[1:]:
            continue
        torch.manual_seed(2000 + len(case))
        base_dir = os.path.join(MODELS, "..", base_path(arch))
        quant = nf4_quantization() if "nf4" in how else None
        model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager",
                                                     quantization_config=quant, device_map="cpu" if quant else None)
        cfg = LoraConfig(task_type="CAUSAL_LM", bias="none", **kw)
        pm = get_peft_model(model, cfg)
        # eval mode (dropout off); the QLoRA cases stay in train mode with lora_dropout 0 (nothing
        # random): in eval bitsandbytes repacks 4-bit weights for its CPU inference kernel, which
        # multiplies in bf16, where its training path multiplies the dequantized fp32 weight (as on a GPU)
        pm.train("nf4" in how)
        if "perturb_ab" in how:
            d = os.path.join(OUT, case)
            os.makedirs(d, exist_ok=True)
            with torch.no_grad():
                init = {file_name(n): p.detach().clone().contiguous() for n, p in pm.named_parameters()
                        if ".lora_A." in n or ".lora_B." in n}
                save_file(init, os.path.join(d, "init_ab.safetensors"))
                for n, p in pm.named_parameters():
                    if ".lora_A." in n or ".lora_B." in n:
                        p.mul_(0.5 + torch.rand(p.shape))
        if "perturb_tt" in how:
            with torch.no_grad():
                for n, p in pm.named_parameters():
                    if "trainable_tokens_delta" in n:
                        p.add_(0.5 * torch.randn(p.shape))
        if "perturb_mts" in how:
            with torch.no_grad():
                for n, p in pm.named_parameters():
                    if ".modules_to_save." in n:
                        p.mul_(0.8 + 0.4 * torch.rand(p.shape))
        if "perturb" in how:
            with torch.no_grad():
                for n, p in pm.named_parameters():
                    if "lora_magnitude_vector" in n:
                        p.mul_(0.8 + 0.4 * torch.rand(p.shape))
        d = os.path.join(OUT, case)
        os.makedirs(d, exist_ok=True)
        # the base model's path as the C test finds it, relative to the fixtures folder
        save_peft_adapter(pm, d, base_path(arch))
        with open(os.path.join(base_dir, "batch.json")) as f:
            batch = json.load(f)
        off_logps = None
        if "perturb_mts" in how:  # what the reference model of TRL + PEFT computes
            with torch.no_grad(), pm.disable_adapter():
                off_logps, _ = packed_logps(pm, torch, batch["cu_seqlens"], batch["tokens"])
        logps, loss = packed_logps(pm, torch, batch["cu_seqlens"], batch["tokens"])
        loss.backward()
        grads = {file_name(n): p.grad.detach().contiguous() for n, p in pm.named_parameters() if p.requires_grad}
        saved = get_peft_model_state_dict(pm)
        full = set("base_model.model." + k if not k.startswith("base_model") else k for k in saved)
        if kw.get("ensure_weight_tying"):  # the tied copy saved under the head's name too
            full.discard("base_model.model.lm_head.weight")
        assert set(grads) == full or set(grads) == set(saved), (sorted(grads), sorted(saved))
        save_file(grads, os.path.join(d, "grads.safetensors"))
        scale = kw["lora_alpha"] / (math.sqrt(kw["r"]) if kw.get("use_rslora") else kw["r"])
        with open(os.path.join(d, "batch.json"), "w") as f:
            json.dump({"logp": logps, "loss": loss.item(), "scaling": scale, "base": base_path(arch),
                       "nf4": "nf4" in how, **({"off_logp": off_logps} if off_logps else {}),
                       "note": "torch %s, transformers %s, peft %s (make_lora_fixtures.py)" % (
                           torch.__version__, transformers.__version__, peft.__version__)}, f)
        print(case, "loss %.6f" % loss.item(), "trainable", sum(p.numel() for p in grads.values()),
              "tensors", len(grads))


if __name__ == "__main__":
    main()
