/* A decoder's shape, read from a Hugging Face config.json (Llama, Qwen2/2.5, Qwen3, Mistral, Gemma 2,
 * Gemma 3's text model, Phi-3/4, Qwen3-MoE, Mixtral). */
#ifndef CTRL_CORE_MODEL_CONFIG_H
#define CTRL_CORE_MODEL_CONFIG_H

#include <stdint.h>

#include <ctrl/status.h>

#include "cpu/cpu_ops.h"

/* What config.json may ask for (checked where read, each named in the error). The largest public
 * decoders stay well inside: Llama-3.1-405B has hidden 16384, intermediate 53248, 126 layers, 128
 * heads; vocabularies reach 256k. */
#define CTRL_MODEL_MAX_HIDDEN 65536
#define CTRL_MODEL_MAX_INTERMEDIATE 1048576
#define CTRL_MODEL_MAX_LAYERS 1024
#define CTRL_MODEL_MAX_HEADS 1024
#define CTRL_MODEL_MAX_HEAD_DIM 1024      /* the RoPE tables keep head_dim / 2 frequencies on the stack */
#define CTRL_MODEL_MAX_ATTN_WIDTH 1048576 /* num_attention_heads × head_dim */
#define CTRL_MODEL_MAX_VOCAB 16777216
#define CTRL_MODEL_MAX_POSITIONS 16777216
#define CTRL_MODEL_MAX_LABELS 65536
#define CTRL_MODEL_MAX_EXPERTS 1024
#define CTRL_MODEL_MAX_PARAMS (1ull << 40) /* a shape bound; the memory check comes at allocation */

typedef enum ctrl_arch {
    CTRL_ARCH_LLAMA = 0,
    CTRL_ARCH_QWEN2,
    CTRL_ARCH_QWEN3,
    CTRL_ARCH_MISTRAL,
    CTRL_ARCH_GEMMA2,
    CTRL_ARCH_GEMMA3, /* the text model (gemma3_text, Gemma3ForCausalLM) */
    CTRL_ARCH_PHI3,   /* Phi-3 and Phi-4 (phi3, Phi3ForCausalLM) */
    CTRL_ARCH_QWEN3_MOE,
    CTRL_ARCH_MIXTRAL,
    CTRL_ARCH_OLMOE,
    CTRL_ARCH_COUNT
} ctrl_arch;

/* The MLP's gate activation: SwiGLU (silu) or GeGLU (torch's tanh-approximated GELU, Gemma). */
typedef enum ctrl_mlp_act { CTRL_ACT_SILU = 0, CTRL_ACT_GELU_TANH } ctrl_mlp_act;

typedef struct ctrl_model_config {
    ctrl_arch arch;
    char model_type[32];
    int hidden_size, intermediate_size, n_layers, n_heads, n_kv_heads, head_dim, vocab_size;
    int max_position_embeddings;
    float rms_norm_eps;
    int tie_word_embeddings;
    int qkv_bias; /* q/k/v projections have biases (Qwen2; Llama's attention_bias) */
    int qk_norm; /* RMSNorm of q and k before RoPE: 1 per head (Qwen3), 2 over the whole projection (OLMoE) */
    int sliding_window; /* 0 = none */
    ctrl_rope_params rope;
    int bos_token_id, eos_token_id;
    /* Sequence classification (*ForSequenceClassification, model_score.c): num_labels > 0 means the
     * model ends in `score` [num_labels, hidden] read at each sequence's last non-pad token and has
     * no LM head; 0 is a causal LM. pad_token_id (-1: none) is the token transformers' rule skips. */
    int num_labels;
    int pad_token_id;
    float initializer_range; /* transformers' init std (0.02 when config.json has none) */
    /* Gemma 2 (model_config_gemma.c; zero for the other families, which is their behaviour): */
    int norm_plus_one; /* every RMSNorm scales by (1 + weight) (GemmaRMSNorm); weights init to 0 */
    int sandwich_norm; /* post_attention_layernorm on the attention output and pre_/post_feedforward_layernorm
                          around the MLP (Gemma 2), instead of Llama's one post_attention_layernorm before it
                        */
    ctrl_mlp_act mlp_act;        /* hidden_activation */
    float embed_scale;           /* embeddings times this (sqrt(hidden_size) in fp32); 0: none */
    float query_pre_attn_scalar; /* as config.json gives it (0: none) */
    float attn_scale;            /* query scaling (query_pre_attn_scalar^-1/2); 0: 1/sqrt(head_dim) */
    float attn_softcap;          /* attn_logit_softcapping: scores = cap tanh(scores / cap); 0: none */
    float final_softcap;         /* final_logit_softcapping on the LM head's logits; 0: none */
    /* layer_types: when set, sliding_window applies only to the layers marked sliding here (the
     * others attend to the full causal context); unset, it applies to every layer */
    int has_layer_types;
    uint8_t sliding_layer[CTRL_MODEL_MAX_LAYERS];
    /* Gemma 3: the sliding layers rotate with rope_local (rope_parameters.sliding_attention), the
     * full ones with rope (full_attention) */
    int local_rope;
    ctrl_rope_params rope_local;
    /* Phi-3/4: q/k/v in one qkv_proj [(H + 2 HK) D, C] and gate/up in one gate_up_proj [2 I, C] in the
     * checkpoint; the model lays them out as those tensors and reads q/k/v and gate/up as their row
     * blocks (the split is free: contiguous rows), so loading and saving keep the fused names */
    int fused_qkv, fused_gate_up;
    int original_max_position_embeddings; /* Phi-3's top-level key (longrope's trained context); 0: none */
    int rope_dim; /* dimensions per head RoPE rotates: head_dim x partial_rotary_factor; 0: head_dim */
    /* Mixture of experts (Qwen3-MoE; n_experts 0: dense). A layer with moe_layer[l] has a router
     * mlp.gate [n_experts, hidden] and n_experts SwiGLU experts of moe_intermediate_size
     * (mlp.experts.E.{gate,up,down}_proj, as the checkpoints name them); each token goes to its top
     * n_experts_per_tok by softmax probability, weighted by those probabilities (renormalised to sum 1
     * with norm_topk_prob). The other layers keep the dense MLP of intermediate_size. Mixtral: every
     * layer sparse, block_sparse_moe.gate and experts.E.w1/w3/w2 (gate/up/down) of intermediate_size,
     * always renormalised. */
    int n_experts, n_experts_per_tok, moe_intermediate_size, norm_topk_prob;
    uint8_t moe_layer[CTRL_MODEL_MAX_LAYERS];
    float router_aux_loss_coef; /* the config's; the trainers add the load-balancing loss with it
                                   (train/moe_aux.h) */
    int output_router_logits;
} ctrl_model_config;

/* The dimensions RoPE rotates in each head (the first ones; the rest pass through). */
static inline int ctrl_model_rope_dim(const ctrl_model_config *c) {
    return c->rope_dim > 0 ? c->rope_dim : c->head_dim;
}

/* The sliding window layer l attends with (0: the full causal context). */
static inline int ctrl_model_layer_window(const ctrl_model_config *c, int l) {
    return c->has_layer_types && !c->sliding_layer[l] ? 0 : c->sliding_window;
}

/* Reads DIR/config.json (or a config.json path). Unknown architectures and missing required
 * fields are errors naming the file and the field. */
ctrl_status ctrl_model_config_load(const char *path, ctrl_model_config *out);
/* The family's own fields (Gemma 2/3's norms, activation, scales, soft-capping, window, alternating
 * layers and RoPEs; Phi-3's fused projections) at transformers' config defaults, from c->arch,
 * hidden_size and n_layers; nothing for the Llama-shaped families. For configs made in code (`ctrl model
 * init`); loading applies it before reading config.json's keys. */
void ctrl_model_config_family_defaults(ctrl_model_config *c);
/* The number of parameters the shape lays out (64-bit: a checked config stays below 2^40). */
uint64_t ctrl_model_config_param_count(const ctrl_model_config *c);

#endif
