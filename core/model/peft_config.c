/* adapter_config.json (PEFT's LoraConfig, as save_pretrained writes it) read into a
 * ctrl_lora_config, refusing by name whatever would make the adapter compute something else. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_text.h"
#include "model/model_internal.h"
#include "model/peft.h"

/* Keys that change what the adapter computes and are not implemented: they must be absent, null,
 * false, {} or []. */
static const char *const unsupported[] = {"use_qalora",        "use_bdlora",      "fan_in_fan_out",
                                          "layer_replication", "megatron_config", "alora_invocation_tokens",
                                          "eva_config",        "corda_config",    "arrow_config",
                                          "kasa_config",       "lora_ga_config",  "monteclora_config",
                                          "loftq_config"};

static int trivial(const cJSON *v) {
    return !v || cJSON_IsNull(v) || cJSON_IsFalse(v) ||
           ((cJSON_IsObject(v) || cJSON_IsArray(v)) && cJSON_GetArraySize(v) == 0);
}

static ctrl_status bad(const char *path, const char *key, const char *why) {
    return ctrl_error_set(CTRL_ERR_FORMAT, "%s: \"%s\": %s", path, key, why);
}

static ctrl_status read_number(const cJSON *root, const char *path, const char *key, double lo, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: \"%s\" must be a number >= %g", path, key, lo);
    *out = v->valuedouble;
    return CTRL_OK;
}

/* A rank_pattern / alpha_pattern object v ({key: number}, in the file's order: PEFT takes the first
 * key that matches); errors name `where`. */
static ctrl_status add_patterns(ctrl_lora_config *c, const cJSON *v, int alpha, const char *where) {
    if (trivial(v)) return CTRL_OK;
    if (!cJSON_IsObject(v))
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: must be an object of pattern: number", where);
    for (const cJSON *e = v->child; e; e = e->next) {
        if (!cJSON_IsNumber(e)) return ctrl_error_set(CTRL_ERR_CONFIG, "%s: values must be numbers", where);
        MODEL_TRY(alpha ? ctrl_lora_add_alpha_pattern(c, e->string, e->valuedouble, where)
                        : ctrl_lora_add_rank_pattern(c, e->string, e->valuedouble, where));
    }
    return CTRL_OK;
}

static ctrl_status read_patterns(const cJSON *root, const char *path, const char *key, ctrl_lora_config *c) {
    char where[4300];
    snprintf(where, sizeof where, "%s: \"%s\"", path, key);
    return add_patterns(c, cJSON_GetObjectItemCaseSensitive(root, key), key[0] == 'a', where);
}

ctrl_status ctrl_peft_patterns_from_json(ctrl_lora_config *c, const char *json, int alpha,
                                         const char *where) {
    cJSON *v = cJSON_Parse(json);
    if (!v)
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: not a JSON object ({\"pattern\": number, ...})", where);
    const ctrl_status st = add_patterns(c, v, alpha, where);
    cJSON_Delete(v);
    return st;
}

/* exclude_modules, layers_to_transform, layers_pattern, rank_pattern and alpha_pattern (lora_match.c). */
static ctrl_status read_choices(const cJSON *root, const char *path, ctrl_lora_config *c) {
    char where[4300];
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "exclude_modules");
    snprintf(where, sizeof where, "%s: \"exclude_modules\"", path);
    if (cJSON_IsString(v)) /* a regular expression (re.fullmatch) */
        MODEL_TRY(ctrl_lora_set_exclude_regex(c, v->valuestring, where));
    else if (!trivial(v) && !cJSON_IsArray(v))
        return bad(path, "exclude_modules", "must be a list of names, a regular expression or null");
    for (const cJSON *e = cJSON_IsArray(v) ? v->child : NULL; e; e = e->next) {
        if (!cJSON_IsString(e)) return bad(path, "exclude_modules", "entries must be strings");
        MODEL_TRY(ctrl_lora_add_exclude(c, e->valuestring, where));
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "layers_to_transform");
    snprintf(where, sizeof where, "%s: \"layers_to_transform\"", path);
    if (!trivial(v) && !cJSON_IsArray(v) && !cJSON_IsNumber(v))
        return bad(path, "layers_to_transform", "must be a layer index, a list of them or null");
    for (const cJSON *e = cJSON_IsArray(v)    ? v->child
                          : cJSON_IsNumber(v) ? v
                                              : NULL;
         e; e = cJSON_IsArray(v) ? e->next : NULL) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble))
            return bad(path, "layers_to_transform", "entries must be whole numbers");
        MODEL_TRY(ctrl_lora_add_layer(c, (long)fmax(-1, fmin(e->valuedouble, 2e9)), where));
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "layers_pattern");
    snprintf(where, sizeof where, "%s: \"layers_pattern\"", path);
    if (!trivial(v) && !cJSON_IsArray(v) && !cJSON_IsString(v))
        return bad(path, "layers_pattern", "must be a name, a list of names or null");
    if (cJSON_IsString(v) && v->valuestring[0])
        MODEL_TRY(ctrl_lora_add_layers_pattern(c, v->valuestring, where));
    for (const cJSON *e = cJSON_IsArray(v) ? v->child : NULL; e; e = e->next) {
        if (!cJSON_IsString(e)) return bad(path, "layers_pattern", "entries must be strings");
        MODEL_TRY(ctrl_lora_add_layers_pattern(c, e->valuestring, where));
    }
    MODEL_TRY(read_patterns(root, path, "rank_pattern", c));
    MODEL_TRY(read_patterns(root, path, "alpha_pattern", c));
    return ctrl_lora_check_choices(c, path);
}

/* Whether module name `name` is `module` or ends in "." + module (PEFT's suffix match). */
static int names(const char *name, const char *module) {
    const size_t n = strlen(name), k = strlen(module);
    return !strcmp(name, module) || (n > k && name[n - k - 1] == '.' && !strcmp(name + n - k, module));
}

/* trainable_token_indices: a list of token ids (the input embedding's rows), or {module: list} naming
 * the input embedding (embed_tokens) and / or the LM head (lm_head); PEFT's other targets are not
 * implemented. */
static ctrl_status read_tokens(const cJSON *root, const char *path, ctrl_lora_config *c) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "trainable_token_indices");
    if (trivial(v)) return CTRL_OK;
    char where[4300];
    snprintf(where, sizeof where, "%s: \"trainable_token_indices\"", path);
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v))
        return bad(path, "trainable_token_indices",
                   "must be a list of token ids, an object of such lists or null");
    for (const cJSON *l = cJSON_IsObject(v) ? v->child : v; l; l = cJSON_IsObject(v) ? l->next : NULL) {
        const int head = cJSON_IsObject(v) && names(l->string, "lm_head");
        if (cJSON_IsObject(v) && !head && !names(l->string, "embed_tokens"))
            return ctrl_error_set(CTRL_ERR_FORMAT,
                                  "%s: \"%s\": trainable tokens of a module other than the input embedding "
                                  "(embed_tokens) and the LM head (lm_head) are not implemented",
                                  where, l->string);
        if (!cJSON_IsArray(l)) return bad(path, "trainable_token_indices", "each module's must be a list");
        for (const cJSON *e = l->child; e; e = e->next) {
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble))
                return bad(path, "trainable_token_indices", "entries must be whole numbers");
            const long id = (long)fmax(-1, fmin(e->valuedouble, 3e9));
            MODEL_TRY(head ? ctrl_lora_add_head_token(c, id, where) : ctrl_lora_add_token(c, id, where));
        }
    }
    return CTRL_OK;
}

static ctrl_status read_fields(const cJSON *root, const char *path, ctrl_lora_config *c, char *base,
                               size_t base_len) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    if (!cJSON_IsString(v) || strcmp(v->valuestring, "LORA") != 0)
        return bad(path, "peft_type", "only LORA adapters are implemented");
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
        if (!trivial(cJSON_GetObjectItemCaseSensitive(root, unsupported[i])))
            return bad(path, unsupported[i],
                       "set, and not implemented in ctrl (it must be null/false/empty)");
    v = cJSON_GetObjectItemCaseSensitive(root, "bias");
    if (v && !(cJSON_IsString(v) && !strcmp(v->valuestring, "none")))
        return bad(path, "bias", "only \"none\" is implemented");
    v = cJSON_GetObjectItemCaseSensitive(root, "task_type");
    if (!trivial(v) &&
        !(cJSON_IsString(v) && (!strcmp(v->valuestring, "CAUSAL_LM") || !strcmp(v->valuestring, "SEQ_CLS"))))
        return bad(path, "task_type", "only CAUSAL_LM and SEQ_CLS adapters are implemented");
    c->seq_cls = cJSON_IsString(v) && !strcmp(v->valuestring, "SEQ_CLS");
    double r = 0, alpha = 0, dropout = 0; /* set by read_number; initialised for -O3 flow analysis */
    MODEL_TRY(read_number(root, path, "r", 1, &r));
    MODEL_TRY(read_number(root, path, "lora_alpha", 0, &alpha));
    if (cJSON_GetObjectItemCaseSensitive(root, "lora_dropout"))
        MODEL_TRY(read_number(root, path, "lora_dropout", 0, &dropout));
    if (r != floor(r) || r > 1e6) return bad(path, "r", "must be a whole number");
    if (dropout >= 1) return bad(path, "lora_dropout", "must be below 1");
    c->r = (int)r, c->lora_alpha = (float)alpha, c->lora_dropout = (float)dropout;
    c->use_rslora = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "use_rslora"));
    c->use_dora = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "use_dora"));
    c->lora_bias = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "lora_bias"));
    c->ensure_weight_tying = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "ensure_weight_tying"));
    v = cJSON_GetObjectItemCaseSensitive(root, "init_lora_weights");
    const int pissa = cJSON_IsString(v) && !strcmp(v->valuestring, "pissa"),
              olora = cJSON_IsString(v) && !strcmp(v->valuestring, "olora");
    const int orth = cJSON_IsString(v) && !strcmp(v->valuestring, "orthogonal");
    if (cJSON_IsString(v) && strcmp(v->valuestring, "gaussian") != 0 && !pissa && !olora && !orth)
        return bad(path, "init_lora_weights",
                   "only true, false, \"gaussian\", \"pissa\", \"olora\" and \"orthogonal\" are implemented "
                   "(pissa_niter_N's "
                   "randomized SVD cannot be recomputed: convert such an adapter to plain LoRA with PEFT's "
                   "path_initial_model_for_weight_conversion)");
    /* the weights are the file's; over pissa's and olora's residual of the base, recomputed as it loads */
    c->init = pissa ? CTRL_LORA_INIT_PISSA : olora ? CTRL_LORA_INIT_OLORA : CTRL_LORA_INIT_NONE;
    char where[4300];
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "target_parameters");
    if (!trivial(tp) && !cJSON_IsArray(tp)) return bad(path, "target_parameters", "must be a list or null");
    snprintf(where, sizeof where, "%s: \"target_parameters\"", path);
    for (const cJSON *e = cJSON_IsArray(tp) ? tp->child : NULL; e; e = e->next) {
        if (!cJSON_IsString(e)) return bad(path, "target_parameters", "entries must be strings");
        MODEL_TRY(ctrl_lora_add_parameter(c, e->valuestring, where));
    }
    snprintf(where, sizeof where, "%s: \"target_modules\"", path);
    v = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    if (c->n_params > 0 && trivial(v)) {
        /* only expert parameters (PEFT allows target_modules [] or null with target_parameters) */
    } else if (cJSON_IsString(v)) { /* all-linear, or a regular expression (re.fullmatch) */
        MODEL_TRY(strcmp(v->valuestring, "all-linear") ? ctrl_lora_set_target_regex(c, v->valuestring, where)
                                                       : ctrl_lora_add_target(c, v->valuestring, where));
    } else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) {
        for (const cJSON *e = v->child; e; e = e->next) {
            if (!cJSON_IsString(e)) return bad(path, "target_modules", "entries must be strings");
            MODEL_TRY(ctrl_lora_add_target(c, e->valuestring, where));
        }
    } else
        return bad(path, "target_modules", "must be a list of module names or \"all-linear\"");
    snprintf(where, sizeof where, "%s: \"modules_to_save\"", path);
    v = cJSON_GetObjectItemCaseSensitive(root, "modules_to_save");
    for (const cJSON *e = cJSON_IsArray(v) ? v->child : NULL; e; e = e->next) {
        if (!cJSON_IsString(e)) return bad(path, "modules_to_save", "entries must be strings");
        MODEL_TRY(ctrl_lora_add_module_to_save(c, e->valuestring, where));
    }
    if (!trivial(v) && !cJSON_IsArray(v)) return bad(path, "modules_to_save", "must be a list or null");
    MODEL_TRY(read_choices(root, path, c));
    MODEL_TRY(read_tokens(root, path, c));
    v = cJSON_GetObjectItemCaseSensitive(root, "base_model_name_or_path");
    if (base) snprintf(base, base_len, "%s", cJSON_IsString(v) ? v->valuestring : "");
    return CTRL_OK;
}

ctrl_status ctrl_peft_read_config(const char *dir, ctrl_lora_config *out, char *base, size_t base_len) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    return ctrl_peft_read_config_file(path, out, base, base_len);
}

ctrl_status ctrl_peft_read_config_file(const char *path, ctrl_lora_config *out, char *base, size_t base_len) {
    memset(out, 0, sizeof *out);
    ctrl_status st;
    cJSON *root = ctrl_read_json_object(path, 16u << 20, &st);
    if (!root) return st;
    st = read_fields(root, path, out, base, base_len);
    cJSON_Delete(root);
    return st;
}
