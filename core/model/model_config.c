/* config.json → ctrl_model_config, with the defaults transformers applies for each model_type.
 * config.json comes from strangers: every field is checked where it is read (an integral number
 * within a named limit, a finite float in range), and the shape's products are computed in 64 bits
 * and bounded, so that nothing downstream allocates or indexes from an unchecked size. */
#include "model/model_config.h"

#include "file_text.h"

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

static ctrl_status parse_rope(reader *rd, const cJSON *root, ctrl_model_config *c) {
    ctrl_rope_params *r = &c->rope;
    memset(r, 0, sizeof *r);
    r->kind = CTRL_ROPE_DEFAULT;
    r->theta = get_num(rd, root, "rope_theta", 10000.0, 0, 0);
    r->factor = 1.0;
    r->partial_rotary_factor = 1.0;
    r->original_max_position = c->max_position_embeddings;
    /* transformers 4.x: rope_scaling; 5.x: rope_parameters (which also carries rope_theta). */
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (!cJSON_IsObject(s)) s = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!cJSON_IsObject(s)) return rd->st;
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
    else
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "%s: rope type '%s' is not supported (default, linear, llama3, yarn, dynamic)",
                              rd->file, t);
    r->factor = get_num(rd, s, "factor", 1.0, 0, 0);
    r->low_freq_factor = get_num(rd, s, "low_freq_factor", 1.0, 0, 0);
    r->high_freq_factor = get_num(rd, s, "high_freq_factor", 4.0, 0, 0);
    r->original_max_position = get_int(rd, s, "original_max_position_embeddings", c->max_position_embeddings,
                                       1, CTRL_MODEL_MAX_POSITIONS);
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

uint64_t ctrl_model_config_param_count(const ctrl_model_config *c) {
    const uint64_t C = (uint64_t)c->hidden_size, I = (uint64_t)c->intermediate_size,
                   QD = (uint64_t)c->n_heads * (uint64_t)c->head_dim,
                   KD = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim, D = (uint64_t)c->head_dim;
    const uint64_t layer = 2 * C + QD * C + 2 * KD * C + C * QD + 3 * I * C +
                           (c->qkv_bias ? QD + 2 * KD : 0) + (c->qk_norm ? 2 * D : 0);
    /* a sequence classifier has the score [num_labels, C] where a causal LM has its LM head */
    const uint64_t head = c->num_labels > 0 ? (uint64_t)c->num_labels * C
                                            : (c->tie_word_embeddings ? 0 : (uint64_t)c->vocab_size * C);
    return (uint64_t)c->vocab_size * C + head + C + layer * (uint64_t)c->n_layers;
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

static ctrl_status read_config(reader *rd, const cJSON *root, ctrl_model_config *out) {
    ctrl_model_config c;
    memset(&c, 0, sizeof c);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const char *type = cJSON_IsString(mt) ? mt->valuestring : "";
    snprintf(c.model_type, sizeof c.model_type, "%s", type);
    if (!strcmp(type, "llama"))
        c.arch = CTRL_ARCH_LLAMA;
    else if (!strcmp(type, "qwen2"))
        c.arch = CTRL_ARCH_QWEN2;
    else if (!strcmp(type, "qwen3"))
        c.arch = CTRL_ARCH_QWEN3;
    else if (!strcmp(type, "mistral"))
        c.arch = CTRL_ARCH_MISTRAL;
    else
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "%s: model_type '%s' is not supported (llama, qwen2, qwen3, mistral)", rd->file,
                              c.model_type);
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
    if (!field(root, "head_dim") && c.hidden_size % c.n_heads)
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "%s: hidden_size (%d) is not a multiple of num_attention_heads (%d) and no "
                              "head_dim is given",
                              rd->file, c.hidden_size, c.n_heads);
    c.head_dim = get_int(rd, root, "head_dim", c.hidden_size / c.n_heads, 2, CTRL_MODEL_MAX_HEAD_DIM);
    c.max_position_embeddings =
        get_int(rd, root, "max_position_embeddings", 2048, 1, CTRL_MODEL_MAX_POSITIONS);
    const double eps = get_num(rd, root, "rms_norm_eps", 1e-6, 0, 0);
    c.rms_norm_eps = (float)eps;
    if (rd->st == CTRL_OK && !(c.rms_norm_eps > 0 && isfinite(c.rms_norm_eps)))
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: rms_norm_eps = %g is not a positive fp32 number",
                              rd->file, eps);
    /* transformers' default is untied for all four (configs of tied models say so). */
    c.tie_word_embeddings = get_bool(root, "tie_word_embeddings", 0);
    c.qkv_bias = c.arch == CTRL_ARCH_QWEN2 ? 1 : get_bool(root, "attention_bias", 0);
    c.qk_norm = c.arch == CTRL_ARCH_QWEN3;
    int use_sw = c.arch == CTRL_ARCH_MISTRAL ? 1 : get_bool(root, "use_sliding_window", 0);
    c.sliding_window = get_int(rd, root, "sliding_window", 0, 0, CTRL_MODEL_MAX_POSITIONS);
    if (!use_sw) c.sliding_window = 0;
    c.bos_token_id = get_token(rd, root, "bos_token_id", c.vocab_size);
    c.eos_token_id = get_token(rd, root, "eos_token_id", c.vocab_size);
    /* read leniently (causal LMs' configs carry odd values here that nothing uses); a sequence
     * classifier's is checked in read_num_labels */
    const cJSON *pad = field(root, "pad_token_id");
    c.pad_token_id = cJSON_IsNumber(pad) && pad->valuedouble >= 0 && pad->valuedouble < c.vocab_size &&
                             pad->valuedouble == floor(pad->valuedouble)
                         ? (int)pad->valuedouble
                         : -1;
    c.initializer_range = (float)get_num(rd, root, "initializer_range", 0.02, 0, 1);
    if (rd->st != CTRL_OK) return rd->st;
    ctrl_status st = read_num_labels(rd, root, &c);
    if (st != CTRL_OK) return st;
    st = parse_rope(rd, root, &c);
    if (st == CTRL_OK) st = check_shape(rd->file, &c);
    if (st == CTRL_OK) *out = c;
    return st;
}

ctrl_status ctrl_model_config_load(const char *path, ctrl_model_config *out) {
    char file[4096];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(file, sizeof file, "%s/config.json", path);
    else
        snprintf(file, sizeof file, "%s", path);
    ctrl_status st;
    char *text = ctrl_read_text_file(file, 1u << 20, &st);
    if (!text) return st;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: not a JSON object", file);
    }
    reader rd = {file, CTRL_OK};
    st = read_config(&rd, root, out);
    cJSON_Delete(root);
    return st;
}
