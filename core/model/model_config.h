/* A decoder's shape, read from a Hugging Face config.json (Llama, Qwen2/2.5, Qwen3, Mistral). */
#ifndef CTRL_CORE_MODEL_CONFIG_H
#define CTRL_CORE_MODEL_CONFIG_H

#include <stdint.h>

#include <ctrl/status.h>

#include "cpu/cpu_ops.h"

typedef enum ctrl_arch { CTRL_ARCH_LLAMA = 0, CTRL_ARCH_QWEN2, CTRL_ARCH_QWEN3, CTRL_ARCH_MISTRAL } ctrl_arch;

typedef struct ctrl_model_config {
    ctrl_arch arch;
    char model_type[32];
    int hidden_size, intermediate_size, n_layers, n_heads, n_kv_heads, head_dim, vocab_size;
    int max_position_embeddings;
    float rms_norm_eps;
    int tie_word_embeddings;
    int qkv_bias;       /* q/k/v projections have biases (Qwen2; Llama's attention_bias) */
    int qk_norm;        /* per-head RMSNorm of q and k before RoPE (Qwen3) */
    int sliding_window; /* 0 = none */
    ctrl_rope_params rope;
    int bos_token_id, eos_token_id;
    /* Sequence classification (*ForSequenceClassification, model_score.c): num_labels > 0 means the
     * model ends in `score` [num_labels, hidden] read at each sequence's last non-pad token and has
     * no LM head; 0 is a causal LM. pad_token_id (-1: none) is the token transformers' rule skips. */
    int num_labels;
    int pad_token_id;
    float initializer_range; /* transformers' init std (0.02 when config.json has none) */
} ctrl_model_config;

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
#define CTRL_MODEL_MAX_PARAMS (1ull << 40) /* a shape bound; the memory check comes at allocation */

/* Reads DIR/config.json (or a config.json path). Unknown architectures and missing required
 * fields are errors naming the file and the field. */
ctrl_status ctrl_model_config_load(const char *path, ctrl_model_config *out);
/* The number of parameters the shape lays out (64-bit: a checked config stays below 2^40). */
uint64_t ctrl_model_config_param_count(const ctrl_model_config *c);

#endif
