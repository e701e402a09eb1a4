/* config.json → ctrl_model_config, with the defaults transformers applies for each model_type. */
#include "model/model_config.h"

#include "file_text.h"

#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int get_int(const cJSON *o, const char *key, int fallback) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? (int)v->valuedouble : fallback;
}
static double get_num(const cJSON *o, const char *key, double fallback) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : fallback;
}
static int get_bool(const cJSON *o, const char *key, int fallback) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : fallback;
}
/* eos_token_id may be a number or a list (first one used here). */
static int get_token(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(v)) return (int)v->valuedouble;
    if (cJSON_IsArray(v) && cJSON_IsNumber(v->child)) return (int)v->child->valuedouble;
    return -1;
}

static ctrl_status parse_rope(const cJSON *root, const char *path, ctrl_model_config *c) {
    ctrl_rope_params *r = &c->rope;
    memset(r, 0, sizeof *r);
    r->kind = CTRL_ROPE_DEFAULT;
    r->theta = get_num(root, "rope_theta", 10000.0);
    r->factor = 1.0;
    r->partial_rotary_factor = 1.0;
    r->original_max_position = c->max_position_embeddings;
    /* transformers 4.x: rope_scaling; 5.x: rope_parameters (which also carries rope_theta). */
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (!cJSON_IsObject(s)) s = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    if (!cJSON_IsObject(s)) return CTRL_OK;
    r->theta = get_num(s, "rope_theta", r->theta);
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
                              path, t);
    r->factor = get_num(s, "factor", 1.0);
    r->low_freq_factor = get_num(s, "low_freq_factor", 1.0);
    r->high_freq_factor = get_num(s, "high_freq_factor", 4.0);
    r->original_max_position = get_int(s, "original_max_position_embeddings", c->max_position_embeddings);
    r->beta_fast = get_num(s, "beta_fast", 32);
    r->beta_slow = get_num(s, "beta_slow", 1);
    r->attention_factor = get_num(s, "attention_factor", 0);
    return CTRL_OK;
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
    else {
        cJSON_Delete(root);
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "%s: model_type '%s' is not supported (llama, qwen2, qwen3, mistral)", file,
                              c.model_type);
    }
    static const char *const required[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads", "vocab_size"};
    for (int i = 0; i < 5; i++)
        if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(root, required[i]))) {
            cJSON_Delete(root);
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: missing or non-numeric '%s'", file, required[i]);
        }
    c.hidden_size = get_int(root, "hidden_size", 0);
    c.intermediate_size = get_int(root, "intermediate_size", 0);
    c.n_layers = get_int(root, "num_hidden_layers", 0);
    c.n_heads = get_int(root, "num_attention_heads", 0);
    c.n_kv_heads = get_int(root, "num_key_value_heads", c.n_heads);
    c.vocab_size = get_int(root, "vocab_size", 0);
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    c.head_dim = cJSON_IsNumber(hd) ? (int)hd->valuedouble : (c.n_heads ? c.hidden_size / c.n_heads : 0);
    c.max_position_embeddings = get_int(root, "max_position_embeddings", 2048);
    c.rms_norm_eps = (float)get_num(root, "rms_norm_eps", 1e-6);
    /* transformers' default is untied for all four (configs of tied models say so). */
    c.tie_word_embeddings = get_bool(root, "tie_word_embeddings", 0);
    c.qkv_bias = c.arch == CTRL_ARCH_QWEN2 ? 1 : get_bool(root, "attention_bias", 0);
    c.qk_norm = c.arch == CTRL_ARCH_QWEN3;
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    int use_sw = c.arch == CTRL_ARCH_MISTRAL ? 1 : get_bool(root, "use_sliding_window", 0);
    c.sliding_window = (use_sw && cJSON_IsNumber(sw)) ? (int)sw->valuedouble : 0;
    c.bos_token_id = get_token(root, "bos_token_id");
    c.eos_token_id = get_token(root, "eos_token_id");
    st = parse_rope(root, file, &c);
    cJSON_Delete(root);
    if (st != CTRL_OK) return st;
    if (c.hidden_size <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 ||
        c.n_heads % c.n_kv_heads || c.head_dim <= 0 || c.head_dim % 2 || c.vocab_size <= 0 ||
        c.intermediate_size <= 0)
        return ctrl_error_set(
            CTRL_ERR_FORMAT,
            "%s: inconsistent shape (hidden %d, layers %d, heads %d/%d, head_dim %d, vocab %d)", file,
            c.hidden_size, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size);
    *out = c;
    return CTRL_OK;
}
