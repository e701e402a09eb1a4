/* LoRA adapters inside the one model code (PEFT's LoraConfig semantics, huggingface/peft
 * tuners/lora): a targeted linear layer y = x W^T + b becomes
 *     y = x W^T + b + s * (dropout(x) A^T) B^T,   A [r, IN], B [OUT, r],
 * s = lora_alpha / r (or lora_alpha / sqrt(r) with use_rslora). The base weights are frozen: the
 * model lays the trainable tensors (modules_to_save, then every lora_A / lora_B) out after the
 * frozen ones and holds gradients for that suffix only, so the optimizer, which is given the
 * trainable views, keeps no state for the base either. CPU and CUDA run the same code (the
 * backend ops table). */
#ifndef CTRL_CORE_MODEL_LORA_H
#define CTRL_CORE_MODEL_LORA_H

#include <stdint.h>

#include <ctrl/status.h>

/* The seven linear layers of a decoder layer, in PEFT's module names. */
enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_N_TARGETS };
extern const char *const ctrl_lora_target_names[LORA_N_TARGETS]; /* "self_attn.q_proj", ... */
/* The modules an adapter can sit on: the seven above, then the fused ones of Phi-3 (fused_qkv,
 * fused_gate_up): self_attn.qkv_proj (q, k, v's rows) and mlp.gate_up_proj (gate's rows, then up's).
 * On a fused module PEFT puts ONE lora_A / lora_B pair over the whole output: the model then runs
 * each of its slots (LORA_Q, LORA_K, LORA_V) with the shared A and that slot's row block of B. */
enum { LORA_QKV = LORA_N_TARGETS, LORA_GATE_UP, LORA_N_MODULES };
extern const char *const ctrl_lora_module_names[LORA_N_MODULES]; /* ..., "self_attn.qkv_proj", ... */

typedef enum {
    CTRL_LORA_INIT_DEFAULT,   /* init_lora_weights = true: A Kaiming-uniform (a = sqrt(5)), B zero */
    CTRL_LORA_INIT_GAUSSIAN,  /* A ~ N(0, 1/r), B zero */
    CTRL_LORA_INIT_NONE,      /* false: nn.Linear's own init on both (A and B Kaiming-uniform) */
    CTRL_LORA_INIT_PISSA,     /* pissa: A, B from the base weight's top-r SVD, the base its residual */
    CTRL_LORA_INIT_OLORA,     /* olora: A, B from the base weight's QR, the base its residual */
    CTRL_LORA_INIT_ORTHOGONAL /* orthogonal: A, B random with B A = 0 (even r: PEFT's orthogonal_init) */
} ctrl_lora_init;

#define CTRL_LORA_MAX_TARGETS 512
#define CTRL_LORA_MAX_PATTERNS 64 /* rank_pattern / alpha_pattern entries, exclude_modules names */
#define CTRL_LORA_MAX_LAYERS 1024 /* layers_to_transform entries */
#define CTRL_LORA_MAX_TOKENS 4096 /* trainable_token_indices entries */

/* A rank_pattern / alpha_pattern entry: PEFT's key (a regular expression matched as
 * re.match(r"(.*\.)?(KEY)$", module name)) and its value. */
typedef struct ctrl_lora_pattern {
    char key[256];
    double value;
} ctrl_lora_pattern;

/* What PEFT's LoraConfig says (adapter_config.json or the [peft] section). target_modules entries
 * match a module as PEFT matches a list: the module's full name equals the entry or ends with
 * "." + entry ("q_proj", "self_attn.q_proj", "model.layers.3.self_attn.q_proj"); all_linear is
 * `all-linear`: every linear layer but the output head. */
typedef struct ctrl_lora_config {
    int r;
    float lora_alpha, lora_dropout;
    int use_rslora;
    ctrl_lora_init init;
    uint64_t seed; /* the initialisation's and dropout's */
    int all_linear;
    int n_targets;
    char targets[CTRL_LORA_MAX_TARGETS][96];
    int save_embed_tokens, save_lm_head; /* modules_to_save */
    /* PEFT's ensure_weight_tying: with tied embeddings, modules_to_save embed_tokens and / or lm_head train
     * one copy of the table that is both (saved under both names); without it PEFT unties them (refused) */
    int ensure_weight_tying;
    int use_dora; /* DoRA (dora.c): a trainable magnitude per output row of every adapted layer */
    /* PEFT's lora_bias: lora_B has a bias b [OUT] (lora_B.bias), the adapter adding s (x A^T B^T + b);
     * zero at init_lora_weights = true, nn.Linear's U(-1/sqrt(r), 1/sqrt(r)) at false */
    int lora_bias;
    int nf4; /* QLoRA (model_nf4.c): the base's linear weights held in NF4, dequantized per layer */
    /* PEFT's task_type SEQ_CLS (a sequence classifier, a reward model): the score head is among the
     * modules_to_save (PEFT adds "classifier" and "score" itself), trained in full and saved in the
     * adapter as base_model.model.score.weight. Set by modules_to_save "score"/"classifier", by an
     * adapter_config.json of task_type SEQ_CLS, and by every LoRA model with num_labels > 0. */
    int seq_cls;
    /* target_parameters (PEFT's lora.ParamWrapper): LoRA on a mixture-of-experts layer's expert weights,
     * the 3-D parameters transformers 5 holds (mlp.experts.gate_up_proj [E, 2 Im, C], down_proj
     * [E, C, Im]), entries matched as target_modules' against model.layers.N.mlp.experts.<name>. Per
     * expert e: W_e + s B_e A_e, A = lora_A [E r, in] (rows e r ...), B = lora_B [out, E r] (columns
     * k E + e); lora_model_moe.c. */
    int n_params;
    char params[16][96];
    /* The frozen base held in bf16 as it loads (model_bf16_store.c; the caller computes in bf16 on the
     * CPU): each layer's projection weights narrowed to 2 bytes once the layer is read, so the fp32
     * base never is resident whole. */
    int bf16_base; /* (2: as the bf16 GEMM's panels or not at all, for inference: ctrl_peft_load_bf16) */
    /* [peft] embedding_dtype: the frozen input embedding (and the LM head tied to it) held in bf16
     * alone as it loads (model_embed16.c: as the tied head's panels where a bf16 kernel runs, else as
     * values). 1 (bf16): refused where it is trained or off the CPU; 2 (auto, the default under bf16
     * compute): held so where it can, fp32 elsewhere, silently; 3 (auto in a loop that decodes): held
     * only as the head's panels, fp32 elsewhere. */
    int bf16_embed;
    /* PEFT's choice of modules beyond target_modules' list, and per-module rank and alpha (lora_match.c;
     * regular expressions with Python's re semantics, through PCRE2):
     * target_regex: target_modules given as a string other than all-linear (re.fullmatch on the
     * module's name); exclude / exclude_regex: exclude_modules as a list (matched as target_modules'
     * entries) or as a string (re.fullmatch); layers / n_layers: layers_to_transform (the layer
     * index taken from the module's name by layers_pattern's entries, or PEFT's default: the first
     * numbered segment); rank_pattern / alpha_pattern: the first key that matches a module gives its r /
     * lora_alpha instead of r / lora_alpha. */
    char target_regex[1024];
    int n_exclude;
    char exclude[CTRL_LORA_MAX_PATTERNS][96];
    char exclude_regex[1024];
    int n_layers;
    int layers[CTRL_LORA_MAX_LAYERS];
    int n_layers_pattern;
    char layers_pattern[8][96];
    int n_rank_pattern, n_alpha_pattern;
    ctrl_lora_pattern rank_pattern[CTRL_LORA_MAX_PATTERNS], alpha_pattern[CTRL_LORA_MAX_PATTERNS];
    /* trainable_token_indices (PEFT's TrainableTokensLayer beside the adapters, lora_tokens.c): these rows
     * of the input embedding trained as one [n_tokens, C] tensor of their values (initialised as the
     * rows), the rest of the table frozen; on tied embeddings the LM head's rows are the same values.
     * head_tokens: rows of an untied LM head trained so (PEFT's {"lm_head": [...]}). Each list distinct,
     * in the order given (the tensor's row order). */
    int n_tokens, n_head_tokens;
    int32_t tokens[CTRL_LORA_MAX_TOKENS], head_tokens[CTRL_LORA_MAX_TOKENS];
} ctrl_lora_config;

/* LoRA's dropout draw on host memory (lora.c; the CPU backend's lora_dropout op, what a device's
 * computes where its values are): out[i] = 0 where u_i < p, else x[i] * keep, u_i = ((mix64(key + i *
 * 0x9E3779B97F4A7C15) >> 11) + 0.5) / 2^53, mix64 splitmix64's finalizer (out may be x). */
void lora_dropout_host(float *out, const float *x, int64_t n, uint64_t key, float p, float keep);
/* s = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora (the config's own r and lora_alpha). */
float ctrl_lora_scaling(const ctrl_lora_config *c);
/* Whether PEFT would put an adapter on layer `layer`'s module `module` (LORA_Q ... LORA_GATE_UP):
 * exclude_modules, target_modules (list, all-linear or regular expression), layers_to_transform; and
 * if so its rank and scaling (rank_pattern, alpha_pattern; else r, lora_alpha: alpha / r, or / sqrt(r)
 * with use_rslora). CTRL_ERR_CONFIG, naming the expression, where one cannot be matched (too costly:
 * nested quantifiers). */
ctrl_status ctrl_lora_module_choice(const ctrl_lora_config *c, int layer, int module, int *targeted,
                                    int *rank, float *scale);
/* The targeted flag alone: 1, 0, or -1 where ctrl_lora_module_choice fails (the error set). */
int ctrl_lora_targets(const ctrl_lora_config *c, int layer, int module);
/* The largest rank any module can have (r or a rank_pattern value). */
int ctrl_lora_max_rank(const ctrl_lora_config *c);
/* Setters for the fields above, each refusing by `where` what PEFT would refuse or what is not a
 * valid regular expression. */
ctrl_status ctrl_lora_set_target_regex(ctrl_lora_config *c, const char *pattern, const char *where);
ctrl_status ctrl_lora_add_exclude(ctrl_lora_config *c, const char *name, const char *where);
ctrl_status ctrl_lora_set_exclude_regex(ctrl_lora_config *c, const char *pattern, const char *where);
ctrl_status ctrl_lora_add_layer(ctrl_lora_config *c, long layer, const char *where);
ctrl_status ctrl_lora_add_layers_pattern(ctrl_lora_config *c, const char *pattern, const char *where);
ctrl_status ctrl_lora_add_rank_pattern(ctrl_lora_config *c, const char *key, double r, const char *where);
ctrl_status ctrl_lora_add_alpha_pattern(ctrl_lora_config *c, const char *key, double alpha,
                                        const char *where);
/* init_lora_weights' value in [peft] ("true", "false", "gaussian", "pissa", "olora", "orthogonal"; the option
 * table admits no other) as the enum. */
ctrl_lora_init ctrl_lora_init_named(const char *name);
const char *ctrl_lora_init_name(ctrl_lora_init init);
/* dst's target_regex, exclude(_regex), layers, layers_pattern, rank_pattern and alpha_pattern := src's. */
void ctrl_lora_copy_choices(ctrl_lora_config *dst, const ctrl_lora_config *src);
/* The combinations PEFT refuses (layers_to_transform or layers_pattern with target_modules as a
 * string, layers_pattern without layers_to_transform) and the ones not implemented here (these
 * choices with target_parameters), named by `where`. */
ctrl_status ctrl_lora_check_choices(const ctrl_lora_config *c, const char *where);
/* Adds a target_modules entry; CTRL_ERR_CONFIG naming `where` when it names no linear layer of a
 * decoder (PEFT would refuse it too) or there are too many. */
ctrl_status ctrl_lora_add_target(ctrl_lora_config *c, const char *name, const char *where);
/* The expert parameters target_parameters can name (LORA_MOE_GATE_UP: mlp.experts.gate_up_proj). */
enum { LORA_MOE_GATE_UP, LORA_MOE_DOWN, LORA_MOE_N };
/* Whether PEFT would wrap layer `layer`'s expert parameter `which` (LORA_MOE_GATE_UP ...). */
int ctrl_lora_targets_param(const ctrl_lora_config *c, int layer, int which);
/* Adds a target_parameters entry; CTRL_ERR_CONFIG naming `where` unless it names the experts'
 * gate_up_proj or down_proj (the router's gate.weight is not implemented). */
ctrl_status ctrl_lora_add_parameter(ctrl_lora_config *c, const char *name, const char *where);
/* Adds a trainable_token_indices entry; CTRL_ERR_CONFIG naming `where` when it is negative, given twice
 * or one too many (the vocabulary's bound is the model's: checked at layout). */
ctrl_status ctrl_lora_add_token(ctrl_lora_config *c, long id, const char *where);
/* The same for the LM head's rows (head_tokens). */
ctrl_status ctrl_lora_add_head_token(ctrl_lora_config *c, long id, const char *where);
/* Adds a modules_to_save entry (embed_tokens or lm_head, by PEFT's suffix rule; score or classifier:
 * a sequence classifier's head, seq_cls). */
ctrl_status ctrl_lora_add_module_to_save(ctrl_lora_config *c, const char *name, const char *where);

#endif
