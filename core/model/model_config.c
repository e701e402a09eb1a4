/* config.json → ctrl_model_config, with the defaults transformers applies for each model_type.
 * config.json comes from strangers: every field is checked where it is read (an integral number
 * within a named limit, a finite float in range), and the shape's products are computed in 64 bits
 * and bounded, so that nothing downstream allocates or indexes from an unchecked size. */
#include "model/model_config.h"

#include "file_text.h"
#include "hub_cache.h"

#include <ctrl/log.h>

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct reader {
    const char *file;
    ctrl_status st; /* the first error; later reads return their fallback */
} reader;

/* A null counts as absent (configs write "head_dim": null). */
static const cJSON *field(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNull(v) ? NULL : v;
}

static int int_value(reader *r, const cJSON *v, const char *key, int fallback, long lo, long hi) {
    if (r->st != CTRL_OK) return fallback;
    const double d = cJSON_IsNumber(v) ? v->valuedouble : 0;
    if (!cJSON_IsNumber(v))
        r->st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: %s must be an integer", r->file, key);
    else if (d != floor(d))
        r->st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: %s = %.17g is not an integer", r->file, key, d);
    else if (d > (double)hi)
        r->st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: %s = %.17g exceeds the limit %ld", r->file, key, d, hi);
    else if (d < (double)lo)
        r->st =
            ctrl_error_set(CTRL_ERR_FORMAT, "%s: %s = %.17g is below the minimum %ld", r->file, key, d, lo);
    return r->st == CTRL_OK ? (int)d : fallback;
}

/* An integer in [lo, hi]; absent: fallback. */
static int get_int(reader *r, const cJSON *o, const char *key, int fallback, long lo, long hi) {
    const cJSON *v = field(o, key);
    return v ? int_value(r, v, key, fallback, lo, hi) : fallback;
}

/* A finite number > lo (>= lo when `closed`); absent: fallback. */
static double get_num(reader *r, const cJSON *o, const char *key, double fallback, double lo, int closed) {
    const cJSON *v = field(o, key);
    if (!v || r->st != CTRL_OK) return fallback;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        r->st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: %s must be a finite number", r->file, key);
        return fallback;
    }
    const double d = v->valuedouble;
    if (closed ? d < lo : d <= lo) {
        r->st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: %s = %.17g must be %s %g", r->file, key, d,
                               closed ? ">=" : ">", lo);
        return fallback;
    }
    return d;
}

static int get_bool(const cJSON *o, const char *key, int fallback) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : fallback;
}

/* A token id in [0, vocab): a number or a list (the first one is used here); absent: -1. */
static int get_token(reader *r, const cJSON *o, const char *key, int vocab) {
    const cJSON *v = field(o, key);
    if (cJSON_IsArray(v)) v = v->child;
    return v ? int_value(r, v, key, -1, 0, (long)vocab - 1) : -1;
}

/* The defaults, keeping a partial_rotary_factor read from the top of config.json (4.x, Phi-4-mini). */
static void rope_defaults(ctrl_rope_params *r, double theta, const ctrl_model_config *c) {
    const double partial = r->partial_rotary_factor > 0 ? r->partial_rotary_factor : 1.0;
    memset(r, 0, sizeof *r);
    r->kind = CTRL_ROPE_DEFAULT;
    r->theta = theta;
    r->factor = 1.0;
    r->partial_rotary_factor = partial;
    r->original_max_position = c->original_max_position_embeddings > 0 ? c->original_max_position_embeddings
                                                                       : c->max_position_embeddings;
}

/* longrope's short_factor / long_factor: a list of n numbers. */
static ctrl_status rope_factors(reader *rd, const cJSON *s, const char *key, float *out, int n) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: rope %s must be a list of %d numbers (rotated dims / 2)",
                              rd->file, key, n);
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble > 0) || !isfinite(e->valuedouble))
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: rope %s[%d] must be a positive number", rd->file, key,
                                  i);
        out[i] = (float)e->valuedouble;
    }
    return CTRL_OK;
}

/* One rope dict (rope_parameters, rope_scaling, or one layer type's) over the defaults in *r. */
static ctrl_status parse_rope_dict(reader *rd, const cJSON *s, const ctrl_model_config *c,
                                   ctrl_rope_params *r) {
    r->theta = get_num(rd, s, "rope_theta", r->theta, 0, 0);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "rope_type");
    if (!cJSON_IsString(type)) type = cJSON_GetObjectItemCaseSensitive(s, "type");
    const char *t = cJSON_IsString(type) ? type->valuestring : "default";
    if (!strcmp(t, "default"))
        r->kind = CTRL_ROPE_DEFAULT;
    else if (!strcmp(t, "linear"))
        r->kind = CTRL_ROPE_LINEAR;
    else if (!strcmp(t, "llama3"))
        r->kind = CTRL_ROPE_LLAMA3;
    else if (!strcmp(t, "yarn"))
        r->kind = CTRL_ROPE_YARN;
    else if (!strcmp(t, "dynamic"))
        r->kind = CTRL_ROPE_DYNAMIC;
    else if (!strcmp(t, "longrope") || !strcmp(t, "su"))
        r->kind = CTRL_ROPE_LONGROPE;
    else
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "%s: rope type '%s' is not supported (default, linear, llama3, yarn, dynamic, longrope)",
            rd->file, t);
    if (c->arch == CTRL_ARCH_PHI3 &&
        r->kind == CTRL_ROPE_YARN) /* Phi-3's old name, as transformers maps it */
        r->kind = CTRL_ROPE_LONGROPE;
    r->partial_rotary_factor = get_num(rd, s, "partial_rotary_factor", r->partial_rotary_factor, 0, 0);
    if (r->kind == CTRL_ROPE_LONGROPE) {
        /* the rotated dims: partial_rotary_factor may be here or at the top (read_config checks it) */
        const int half = (int)(c->head_dim * r->partial_rotary_factor) / 2;
        if (half < 1 || half > CTRL_ROPE_MAX_FACTORS)
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: longrope over %d rotated dimensions", rd->file,
                                  2 * half);
        r->n_factors = half;
        ctrl_status st = rope_factors(rd, s, "short_factor", r->short_factor, half);
        if (st == CTRL_OK) st = rope_factors(rd, s, "long_factor", r->long_factor, half);
        if (st != CTRL_OK) return st;
    }
    /* longrope without a factor: max_position_embeddings / original_max_position_embeddings, as transformers
     */
    const int orig = get_int(rd, s, "original_max_position_embeddings", r->original_max_position, 1,
                             CTRL_MODEL_MAX_POSITIONS);
    r->factor =
        get_num(rd, s, "factor",
                r->kind == CTRL_ROPE_LONGROPE ? (double)c->max_position_embeddings / orig : 1.0, 0, 0);
    r->low_freq_factor = get_num(rd, s, "low_freq_factor", 1.0, 0, 0);
    r->high_freq_factor = get_num(rd, s, "high_freq_factor", 4.0, 0, 0);
    r->original_max_position = orig;
    r->beta_fast = get_num(rd, s, "beta_fast", 32, 0, 0);
    r->beta_slow = get_num(rd, s, "beta_slow", 1, 0, 0);
    r->attention_factor = get_num(rd, s, "attention_factor", 0, 0, 1);
    if (rd->st != CTRL_OK) return rd->st;
    /* the llama3 ramp divides by their difference; yarn divides by log(theta) */
    if (r->kind == CTRL_ROPE_LLAMA3 && !(r->high_freq_factor > r->low_freq_factor))
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "%s: rope high_freq_factor (%g) must exceed low_freq_factor (%g)", rd->file,
                              r->high_freq_factor, r->low_freq_factor);
    if (r->kind == CTRL_ROPE_YARN && !(r->theta > 1))
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: yarn rope needs rope_theta > 1 (%g)", rd->file, r->theta);
    return CTRL_OK;
}

static ctrl_status parse_rope(reader *rd, const cJSON *root, ctrl_model_config *c) {
    rope_defaults(&c->rope, get_num(rd, root, "rope_theta", 10000.0, 0, 0), c);
    /* transformers 4.x: rope_scaling; 5.x: rope_parameters (which also carries rope_theta). */
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (!cJSON_IsObject(s)) s = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!cJSON_IsObject(s)) return rd->st;
    return parse_rope_dict(rd, s, c, &c->rope);
}

/* Gemma 3's two RoPEs: rope_parameters {full_attention: {...}, sliding_attention: {...}} (transformers
 * 5), or rope_theta / rope_local_base_freq and a rope_scaling of the full layers (4.x); defaults
 * 1e6 and 1e4, as Gemma3TextConfig. */
static ctrl_status parse_gemma3_rope(reader *rd, const cJSON *root, ctrl_model_config *c) {
    c->local_rope = 1;
    rope_defaults(&c->rope, get_num(rd, root, "rope_theta", 1e6, 0, 0), c);
    rope_defaults(&c->rope_local, get_num(rd, root, "rope_local_base_freq", 1e4, 0, 0), c);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters"),
                *full = cJSON_GetObjectItemCaseSensitive(p, "full_attention"),
                *local = cJSON_GetObjectItemCaseSensitive(p, "sliding_attention");
    if (!cJSON_IsObject(full) && !cJSON_IsObject(local)) { /* flat: the full layers' (4.x rope_scaling) */
        full = cJSON_IsObject(p) ? p : cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
        local = NULL;
    }
    ctrl_status st = cJSON_IsObject(full) ? parse_rope_dict(rd, full, c, &c->rope) : rd->st;
    return st == CTRL_OK && cJSON_IsObject(local) ? parse_rope_dict(rd, local, c, &c->rope_local) : st;
}

uint64_t ctrl_model_config_param_count(const ctrl_model_config *c) {
    const uint64_t C = (uint64_t)c->hidden_size, I = (uint64_t)c->intermediate_size,
                   QD = (uint64_t)c->n_heads * (uint64_t)c->head_dim,
                   KD = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim, D = (uint64_t)c->head_dim;
    const uint64_t attn = 2 * C + QD * C + 2 * KD * C + C * QD + (c->qkv_bias ? QD + 2 * KD : 0) +
                          (c->qk_norm == 2 ? QD + KD
                           : c->qk_norm    ? 2 * D
                                           : 0) +
                          (c->sandwich_norm ? 2 * C : 0);
    const uint64_t E = (uint64_t)c->n_experts, Im = (uint64_t)c->moe_intermediate_size;
    uint64_t layers = 0;
    for (int l = 0; l < c->n_layers; l++)
        layers += attn + (E > 0 && c->moe_layer[l] ? E * C + E * 3 * Im * C : 3 * I * C);
    /* a sequence classifier has the score [num_labels, C] where a causal LM has its LM head */
    const uint64_t head = c->num_labels > 0 ? (uint64_t)c->num_labels * C
                                            : (c->tie_word_embeddings ? 0 : (uint64_t)c->vocab_size * C);
    return (uint64_t)c->vocab_size * C + head + C + layers;
}

/* The shape's own consistency, and its products bounded (each below 2^40 and in the limits). */
static ctrl_status check_shape(const char *file, const ctrl_model_config *c) {
    if (c->n_heads % c->n_kv_heads)
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "%s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)",
                              file, c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: head_dim = %d must be even (RoPE rotates pairs)", file,
                              c->head_dim);
    const int64_t qd = (int64_t)c->n_heads * c->head_dim;
    if (qd > CTRL_MODEL_MAX_ATTN_WIDTH)
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "%s: num_attention_heads × head_dim = %d × %d = %lld exceeds the limit %d",
                              file, c->n_heads, c->head_dim, (long long)qd, CTRL_MODEL_MAX_ATTN_WIDTH);
    const uint64_t n = ctrl_model_config_param_count(c);
    if (n > CTRL_MODEL_MAX_PARAMS)
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "%s: the shape makes %llu parameters, more than the limit %llu", file,
                              (unsigned long long)n, (unsigned long long)CTRL_MODEL_MAX_PARAMS);
    return CTRL_OK;
}

/* *ForSequenceClassification (the first of `architectures`): num_labels from id2label, as
 * transformers derives it (else num_labels, else its default of 2); any other class is a causal LM. */
static ctrl_status read_num_labels(reader *rd, const cJSON *root, ctrl_model_config *c) {
    const cJSON *archs = field(root, "architectures");
    const cJSON *first = cJSON_IsArray(archs) ? archs->child : NULL;
    const char *name = cJSON_IsString(first) ? first->valuestring : "";
    const char *suffix = "ForSequenceClassification";
    const size_t n = strlen(name), k = strlen(suffix);
    c->num_labels = 0;
    if (n <= k || strcmp(name + n - k, suffix)) return CTRL_OK;
    const cJSON *id2label = field(root, "id2label");
    if (cJSON_IsObject(id2label))
        c->num_labels = cJSON_GetArraySize(id2label);
    else
        c->num_labels = get_int(rd, root, "num_labels", 2, 1, CTRL_MODEL_MAX_LABELS);
    if (rd->st == CTRL_OK && (c->num_labels < 1 || c->num_labels > CTRL_MODEL_MAX_LABELS))
        rd->st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: %s with %d labels (1 to %d)", rd->file, name,
                                c->num_labels, CTRL_MODEL_MAX_LABELS);
    if (rd->st == CTRL_OK && field(root, "pad_token_id") && c->pad_token_id < 0)
        rd->st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: pad_token_id is not a token id below vocab_size (%d)",
                                rd->file, c->vocab_size);
    return rd->st;
}

/* A number, or null for "none" (0); absent: fallback (transformers' class default). */
static float get_num_or_null(reader *r, const cJSON *o, const char *key, double fallback) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNull(v)) return 0.0f;
    return (float)get_num(r, o, key, fallback, 0, 0);
}

void ctrl_model_config_family_defaults(ctrl_model_config *c) {
    if (c->arch == CTRL_ARCH_PHI3) { /* Phi3Config: fused projections, a trained context of 4096 */
        c->fused_qkv = c->fused_gate_up = 1;
        c->original_max_position_embeddings = 4096;
        return;
    }
    if (c->arch != CTRL_ARCH_GEMMA2 && c->arch != CTRL_ARCH_GEMMA3) return;
    const int g3 = c->arch == CTRL_ARCH_GEMMA3;
    c->norm_plus_one = c->sandwich_norm = 1;
    c->mlp_act = CTRL_ACT_GELU_TANH;
    c->embed_scale = (float)sqrt((double)c->hidden_size); /* fp32, as transformers' buffer */
    c->query_pre_attn_scalar = 256;
    c->attn_scale = (float)pow(256.0, -0.5);
    c->attn_softcap = g3 ? 0 : 50, c->final_softcap = g3 ? 0 : 30; /* Gemma 3: none */
    c->sliding_window = 4096;
    c->qk_norm = g3;        /* Gemma 3's q_norm / k_norm, (1 + w) as its other norms */
    c->has_layer_types = 1; /* Gemma 2: sliding, full, sliding, ...; Gemma 3: five sliding, one full */
    for (int l = 0; l < c->n_layers && l < CTRL_MODEL_MAX_LAYERS; l++)
        c->sliding_layer[l] = (l + 1) % (g3 ? 6 : 2) != 0;
    if (g3) { /* Gemma3TextConfig's RoPEs: 1e6 on the full layers, 1e4 on the sliding ones */
        c->local_rope = 1;
        c->rope_local = c->rope;
        c->rope.theta = 1e6, c->rope_local.theta = 1e4;
    }
}

/* Gemma 2 and 3 (transformers' Gemma2Config / Gemma3TextConfig, their defaults where a key is absent):
 * GemmaRMSNorm, sandwich norms, GeGLU, the embedding scale, query_pre_attn_scalar, soft-capping (null:
 * none) and layer_types (Gemma 3 without them: sliding_window_pattern, 6); Gemma 3's q/k norms and two
 * RoPEs (parse_gemma3_rope). */
static ctrl_status read_gemma(reader *rd, const cJSON *root, ctrl_model_config *c) {
    ctrl_model_config_family_defaults(c);
    if (c->arch == CTRL_ARCH_GEMMA3) {
        const int pattern = get_int(rd, root, "sliding_window_pattern", 6, 1, CTRL_MODEL_MAX_LAYERS);
        for (int l = 0; l < c->n_layers; l++) c->sliding_layer[l] = (l + 1) % pattern != 0;
    }
    const cJSON *act = field(root, "hidden_activation");
    const char *a = cJSON_IsString(act) ? act->valuestring : act ? "" : "gelu_pytorch_tanh";
    if (strcmp(a, "gelu_pytorch_tanh") && strcmp(a, "gelu_tanh"))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "%s: hidden_activation '%s' is not supported for %s (gelu_pytorch_tanh)",
                              rd->file, a, c->model_type);
    if (get_bool(root, "use_bidirectional_attention", 0))
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "%s: use_bidirectional_attention = true is not supported (causal decoders only)", rd->file);
    c->query_pre_attn_scalar = (float)get_num(rd, root, "query_pre_attn_scalar", 256, 0, 0);
    c->attn_scale = (float)pow((double)c->query_pre_attn_scalar, -0.5);
    c->attn_softcap = get_num_or_null(rd, root, "attn_logit_softcapping", c->attn_softcap);
    if (c->arch == CTRL_ARCH_GEMMA3 && c->attn_softcap > 0) {
        /* transformers' Gemma3Attention never hands it to the attention (5.24): neither do we */
        CTRL_WARN("%s: attn_logit_softcapping = %g is not applied to Gemma 3's attention (transformers "
                  "does not apply it either)",
                  rd->file, (double)c->attn_softcap);
        c->attn_softcap = 0;
    }
    c->final_softcap = get_num_or_null(rd, root, "final_logit_softcapping", c->final_softcap);
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    c->sliding_window = cJSON_IsNull(sw) ? 0
                                         : get_int(rd, root, "sliding_window", c->sliding_window, 1,
                                                   CTRL_MODEL_MAX_POSITIONS);
    if (rd->st != CTRL_OK) return rd->st;
    const cJSON *types = field(root, "layer_types");
    if (types && (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != c->n_layers))
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "%s: layer_types must be a list of num_hidden_layers (%d) strings", rd->file,
                              c->n_layers);
    int l = 0, any_sliding = 0;
    for (const cJSON *e = types ? types->child : NULL; e; e = e->next, l++) {
        const char *t = cJSON_IsString(e) ? e->valuestring : "";
        if (strcmp(t, "sliding_attention") && strcmp(t, "full_attention"))
            return ctrl_error_set(CTRL_ERR_FORMAT,
                                  "%s: layer_types[%d] = '%s' (sliding_attention or full_attention)",
                                  rd->file, l, t);
        c->sliding_layer[l] = !strcmp(t, "sliding_attention");
    }
    for (l = 0; l < c->n_layers; l++) any_sliding |= c->sliding_layer[l];
    if (any_sliding && c->sliding_window <= 0)
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "%s: layer_types has sliding layers but sliding_window is null", rd->file);
    return CTRL_OK;
}

/* Phi-3/4 (Phi3Config): fused qkv_proj and gate_up_proj, SiLU, original_max_position_embeddings (4096
 * by default: longrope's trained context); no dropout (resid_pdrop, embd_pdrop > 0 are refused: the
 * model has none). */
static ctrl_status read_phi3(reader *rd, const cJSON *root, ctrl_model_config *c) {
    ctrl_model_config_family_defaults(c);
    const cJSON *act = field(root, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: hidden_act must be \"silu\" for phi3", rd->file);
    static const char *const dropout[] = {"resid_pdrop", "embd_pdrop", "attention_dropout"};
    for (int i = 0; i < 3; i++)
        if (get_num(rd, root, dropout[i], 0, 0, 1) > 0)
            return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: %s > 0: dropout is not implemented", rd->file,
                                  dropout[i]);
    if (c->qkv_bias)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: attention_bias with phi3's fused qkv_proj",
                              rd->file);
    c->original_max_position_embeddings =
        get_int(rd, root, "original_max_position_embeddings", 4096, 1, CTRL_MODEL_MAX_POSITIONS);
    return rd->st;
}

/* Qwen3-MoE (Qwen3MoeConfig's defaults where absent): num_experts, num_experts_per_tok,
 * moe_intermediate_size, norm_topk_prob, and which layers are sparse: (l + 1) % decoder_sparse_step == 0
 * and l not in mlp_only_layers. output_router_logits (the load-balancing loss in the training loss)
 * is refused: not implemented yet. */
static ctrl_status read_moe(reader *rd, const cJSON *root, ctrl_model_config *c) {
    /* the hub's checkpoints say num_experts, transformers 5 saves num_local_experts */
    const int mixtral = c->arch == CTRL_ARCH_MIXTRAL, /* MixtralConfig: 8 experts, top 2 renormalised */
        olmoe = c->arch == CTRL_ARCH_OLMOE;           /* OlmoeConfig: 64 experts, top 8, clip_qkv */
    if (olmoe && field(root, "clip_qkv"))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: clip_qkv (clamping q, k, v) is not implemented",
                              rd->file);
    const char *experts = field(root, "num_experts") ? "num_experts" : "num_local_experts";
    c->n_experts = get_int(rd, root, experts, mixtral ? 8 : olmoe ? 64 : 128, 1, CTRL_MODEL_MAX_EXPERTS);
    c->n_experts_per_tok = get_int(rd, root, "num_experts_per_tok", mixtral ? 2 : 8, 1, c->n_experts);
    c->moe_intermediate_size =
        mixtral || olmoe ? c->intermediate_size
                         : get_int(rd, root, "moe_intermediate_size", 768, 1, CTRL_MODEL_MAX_INTERMEDIATE);
    c->norm_topk_prob = mixtral ? 1 : get_bool(root, "norm_topk_prob", 0);
    if (mixtral && get_num(rd, root, "router_jitter_noise", 0, 0, 1) > 0)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "%s: router_jitter_noise > 0 (training noise on the router) is not implemented",
                              rd->file);
    c->router_aux_loss_coef = (float)get_num(rd, root, "router_aux_loss_coef", 0.001, 0, 1);
    c->output_router_logits = get_bool(root, "output_router_logits", 0);
    const int step =
        mixtral || olmoe ? 1 : get_int(rd, root, "decoder_sparse_step", 1, 1, CTRL_MODEL_MAX_LAYERS);
    if (rd->st != CTRL_OK) return rd->st;
    if (c->output_router_logits)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "%s: output_router_logits = true (the load-balancing auxiliary loss) is not "
                              "implemented yet",
                              rd->file);
    const cJSON *hidden_act = field(root, "hidden_act");
    if (hidden_act && (!cJSON_IsString(hidden_act) || strcmp(hidden_act->valuestring, "silu")))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: hidden_act must be \"silu\" for %s", rd->file,
                              c->model_type);
    for (int l = 0; l < c->n_layers; l++) c->moe_layer[l] = (l + 1) % step == 0;
    const cJSON *dense = mixtral || olmoe ? NULL : field(root, "mlp_only_layers");
    if (dense && !cJSON_IsArray(dense))
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: mlp_only_layers must be a list of layer indices",
                              rd->file);
    int i = 0;
    for (const cJSON *e = dense ? dense->child : NULL; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble >= c->n_layers)
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: mlp_only_layers[%d] is not a layer index below %d",
                                  rd->file, i, c->n_layers);
        c->moe_layer[(int)e->valuedouble] = 0;
    }
    return CTRL_OK;
}

/* The rotated dimensions: int(head_dim x partial_rotary_factor), as transformers, even and > 0. */
static ctrl_status check_rope_dim(reader *rd, ctrl_model_config *c) {
    const double f = c->rope.partial_rotary_factor;
    const int dim = (int)(c->head_dim * f);
    if (!(f > 0 && f <= 1) || dim < 2 || dim % 2)
        return ctrl_error_set(
            CTRL_ERR_FORMAT,
            "%s: partial_rotary_factor = %g gives %d rotated dimensions of head_dim %d (must be "
            "even, >= 2)",
            rd->file, f, dim, c->head_dim);
    c->rope_dim = dim;
    return CTRL_OK;
}

static ctrl_status read_config(reader *rd, const cJSON *root, ctrl_model_config *out) {
    ctrl_model_config c;
    memset(&c, 0, sizeof c);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const char *type = cJSON_IsString(mt) ? mt->valuestring : "";
    snprintf(c.model_type, sizeof c.model_type, "%s", type);
    /* config.json's model_type of each ctrl_arch */
    static const char *const types[CTRL_ARCH_COUNT] = {"llama",   "qwen2",       "qwen3", "mistral",
                                                       "gemma2",  "gemma3_text", "phi3",  "qwen3_moe",
                                                       "mixtral", "olmoe"};
    int arch = -1;
    for (int k = 0; k < CTRL_ARCH_COUNT && arch < 0; k++)
        if (!strcmp(type, types[k])) arch = k;
    if (arch < 0 && !strcmp(type, "gemma3"))
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "%s: model_type 'gemma3' is Gemma 3's image-text model; its text model "
            "(gemma3_text, Gemma3ForCausalLM: the 1B checkpoint, or text_config saved alone) "
            "is supported",
            rd->file);
    if (arch < 0)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "%s: model_type '%s' is not supported (llama, qwen2, qwen3, mistral, gemma2, "
                              "gemma3_text, phi3, qwen3_moe, mixtral, olmoe)",
                              rd->file, c.model_type);
    c.arch = (ctrl_arch)arch;
    const int gemma = c.arch == CTRL_ARCH_GEMMA2 || c.arch == CTRL_ARCH_GEMMA3,
              phi3 = c.arch == CTRL_ARCH_PHI3;
    static const char *const required[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads", "vocab_size"};
    for (int i = 0; i < 5; i++)
        if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(root, required[i])))
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: missing or non-numeric '%s'", rd->file, required[i]);
    c.hidden_size = get_int(rd, root, "hidden_size", 0, 1, CTRL_MODEL_MAX_HIDDEN);
    c.intermediate_size = get_int(rd, root, "intermediate_size", 0, 1, CTRL_MODEL_MAX_INTERMEDIATE);
    c.n_layers = get_int(rd, root, "num_hidden_layers", 0, 1, CTRL_MODEL_MAX_LAYERS);
    c.n_heads = get_int(rd, root, "num_attention_heads", 0, 1, CTRL_MODEL_MAX_HEADS);
    c.n_kv_heads = get_int(rd, root, "num_key_value_heads", c.n_heads, 1, c.n_heads > 0 ? c.n_heads : 1);
    c.vocab_size = get_int(rd, root, "vocab_size", 0, 1, CTRL_MODEL_MAX_VOCAB);
    if (rd->st != CTRL_OK) return rd->st;
    if (!field(root, "head_dim") && !gemma && c.hidden_size % c.n_heads)
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "%s: hidden_size (%d) is not a multiple of num_attention_heads (%d) and no "
                              "head_dim is given",
                              rd->file, c.hidden_size, c.n_heads);
    /* Gemma2Config's defaults where config.json leaves them out */
    c.head_dim =
        get_int(rd, root, "head_dim", gemma ? 256 : c.hidden_size / c.n_heads, 2, CTRL_MODEL_MAX_HEAD_DIM);
    c.max_position_embeddings = get_int(rd, root, "max_position_embeddings",
                                        c.arch == CTRL_ARCH_GEMMA3 ? 131072
                                        : gemma                    ? 8192
                                                                   : 2048,
                                        1, CTRL_MODEL_MAX_POSITIONS);
    /* Phi3Config's and MixtralConfig's default: 1e-5 */
    const double eps =
        get_num(rd, root, "rms_norm_eps",
                phi3 || c.arch == CTRL_ARCH_MIXTRAL || c.arch == CTRL_ARCH_OLMOE ? 1e-5 : 1e-6, 0, 0);
    c.rms_norm_eps = (float)eps;
    if (rd->st == CTRL_OK && !(c.rms_norm_eps > 0 && isfinite(c.rms_norm_eps)))
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: rms_norm_eps = %g is not a positive fp32 number",
                              rd->file, eps);
    /* transformers' default is untied for the first four (configs of tied models say so), tied for Gemma. */
    c.tie_word_embeddings = get_bool(root, "tie_word_embeddings", gemma);
    c.qkv_bias = c.arch == CTRL_ARCH_QWEN2 ? 1 : get_bool(root, "attention_bias", 0);
    c.qk_norm = c.arch == CTRL_ARCH_QWEN3 || c.arch == CTRL_ARCH_QWEN3_MOE ? 1
                : c.arch == CTRL_ARCH_OLMOE                                ? 2
                                                                           : 0;
    /* Mistral and Phi-3 slide wherever sliding_window is set; Qwen2/3 when use_sliding_window says so */
    int use_sw = c.arch == CTRL_ARCH_MISTRAL || c.arch == CTRL_ARCH_MIXTRAL || phi3
                     ? 1
                     : get_bool(root, "use_sliding_window", 0);
    c.sliding_window = get_int(rd, root, "sliding_window", 0, 0, CTRL_MODEL_MAX_POSITIONS);
    if (!use_sw) c.sliding_window = 0;
    c.bos_token_id = get_token(rd, root, "bos_token_id", c.vocab_size);
    c.eos_token_id = get_token(rd, root, "eos_token_id", c.vocab_size);
    if (gemma && !cJSON_GetObjectItemCaseSensitive(root, "bos_token_id") && c.vocab_size > 2)
        c.bos_token_id = 2;
    if (gemma && !cJSON_GetObjectItemCaseSensitive(root, "eos_token_id") && c.vocab_size > 1)
        c.eos_token_id = 1;
    /* read leniently (causal LMs' configs carry odd values here that nothing uses); a sequence
     * classifier's is checked in read_num_labels */
    const cJSON *pad = field(root, "pad_token_id");
    c.pad_token_id = cJSON_IsNumber(pad) && pad->valuedouble >= 0 && pad->valuedouble < c.vocab_size &&
                             pad->valuedouble == floor(pad->valuedouble)
                         ? (int)pad->valuedouble
                         : -1;
    if (gemma && !cJSON_GetObjectItemCaseSensitive(root, "pad_token_id")) c.pad_token_id = 0;
    if (phi3) { /* Phi3Config's defaults: bos 1, eos and pad 32000 (where the vocabulary has them) */
        static const char *const keys[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
        int *ids[3] = {&c.bos_token_id, &c.eos_token_id, &c.pad_token_id}, defaults[3] = {1, 32000, 32000};
        for (int i = 0; i < 3; i++)
            if (!cJSON_GetObjectItemCaseSensitive(root, keys[i]) && defaults[i] < c.vocab_size)
                *ids[i] = defaults[i];
    }
    if (c.arch ==
        CTRL_ARCH_OLMOE) { /* OlmoeConfig's defaults: pad 1, eos 50279 (where the vocabulary has them) */
        if (!cJSON_GetObjectItemCaseSensitive(root, "pad_token_id") && c.vocab_size > 1) c.pad_token_id = 1;
        if (!cJSON_GetObjectItemCaseSensitive(root, "eos_token_id") && c.vocab_size > 50279)
            c.eos_token_id = 50279;
    }
    c.initializer_range = (float)get_num(rd, root, "initializer_range", 0.02, 0, 1);
    if (rd->st != CTRL_OK) return rd->st;
    ctrl_status st = read_num_labels(rd, root, &c);
    if (st == CTRL_OK && gemma) st = read_gemma(rd, root, &c);
    if (st == CTRL_OK && phi3) st = read_phi3(rd, root, &c);
    if (st == CTRL_OK &&
        (c.arch == CTRL_ARCH_QWEN3_MOE || c.arch == CTRL_ARCH_MIXTRAL || c.arch == CTRL_ARCH_OLMOE))
        st = read_moe(rd, root, &c);
    if (st != CTRL_OK) return st;
    /* partial_rotary_factor at the top (4.x, Phi-4-mini); rope_parameters' own wins */
    c.rope.partial_rotary_factor = get_num(rd, root, "partial_rotary_factor", 1.0, 0, 0);
    st = c.arch == CTRL_ARCH_GEMMA3 ? parse_gemma3_rope(rd, root, &c) : parse_rope(rd, root, &c);
    if (st == CTRL_OK) st = check_shape(rd->file, &c); /* head_dim even first, then the rotated dims */
    if (st == CTRL_OK) st = check_rope_dim(rd, &c);
    if (st == CTRL_OK) *out = c;
    return st;
}

ctrl_status ctrl_model_config_load(const char *path, ctrl_model_config *out) {
    char file[4096];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(file, sizeof file, "%s/config.json", path);
    else if (stat(path, &sb) != 0 && ctrl_hub_looks_like_id(path)) /* say where the Hub id was looked for */
        return ctrl_hub_snapshot(path, file, sizeof file) == CTRL_OK
                   ? ctrl_error_set(CTRL_ERR_IO, "%s: resolve it with ctrl_hub_resolve first", path)
                   : ctrl_error_wrap(CTRL_ERR_IO, "%s: no such directory", path);
    else
        snprintf(file, sizeof file, "%s", path);
    ctrl_status st;
    cJSON *root = ctrl_read_json_object(file, 1u << 20, &st);
    if (!root) return st;
    reader rd = {file, CTRL_OK};
    st = read_config(&rd, root, out);
    cJSON_Delete(root);
    return st;
}
