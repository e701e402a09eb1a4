/* A model's adapters in and out of PEFT's files (see peft.h): adapter_model.safetensors under
 * PEFT's names, adapter_config.json with the LoraConfig fields PEFT reads back. */
#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/model_internal.h"
#include "model/peft.h"
#include "model/safetensors.h"

#define PEFT_PREFIX "base_model.model."

/* The views an adapter holds: the LoRA tensors and the modules_to_save (all the trainable ones). */
static int in_adapter(const ctrl_model *m, const ctrl_param_view *v) { return v->offset >= m->train_off; }

/* A tied table trained whole (modules_to_save with ensure_weight_tying): PEFT saves it under the head's
 * name too (TIED_HEAD), the same values. */
#define TIED_HEAD PEFT_PREFIX "lm_head.weight"
static int tied_saved(const ctrl_model *m) {
    return m->off_lm_head >= 0 && m->off_lm_head == m->off_embed && (size_t)m->off_embed >= m->train_off;
}

/* TIED_HEAD in file f: the embedding's values (the model's, as just read), or an error naming path. */
static ctrl_status tied_head_same(const ctrl_model *m, ctrl_safetensors *f, const char *path) {
    const ctrl_param_view *v = ctrl_model_find_view(m, "model.embed_tokens.weight");
    const ctrl_st_tensor *t = ctrl_safetensors_find(f, TIED_HEAD);
    float *x = v && t && t->ndim == 2 && t->shape[0] == v->shape[0] && t->shape[1] == v->shape[1]
                   ? malloc(sizeof(float) * (size_t)v->numel)
                   : NULL;
    ctrl_status st = x ? ctrl_safetensors_read_f32(f, TIED_HEAD, x, v->numel) : CTRL_ERR_FORMAT;
    if (st == CTRL_OK && memcmp(x, m->params + v->offset, sizeof(float) * (size_t)v->numel))
        st = CTRL_ERR_FORMAT;
    free(x);
    return st == CTRL_OK ? CTRL_OK
                         : ctrl_error_set(CTRL_ERR_FORMAT,
                                          "%s: '%s' is not the values of the tied embedding's trained copy "
                                          "(ensure_weight_tying: one table, saved under both names)",
                                          path, TIED_HEAD);
}

/* The number of experts of an expert adapter's lora_B view (0: any other view). */
static int expert_b(const ctrl_model *m, const ctrl_param_view *v) {
    const size_t n = strlen(v->name);
    return m->cfg.n_experts > 0 && strstr(v->name, ".mlp.experts.") && n > 14 &&
                   !strcmp(v->name + n - 14, ".lora_B.weight")
               ? m->cfg.n_experts
               : 0;
}

void ctrl_peft_file_layout(const ctrl_model *m, const ctrl_param_view *v, const float *src, float *dst,
                           int to_file) {
    const int E = expert_b(m, v);
    if (!E) {
        memcpy(dst, src, sizeof(float) * (size_t)v->numel);
        return;
    }
    ctrl_peft_expert_b_layout(E, v->shape[0], v->shape[1] / E, src, dst, to_file);
}

void ctrl_peft_expert_b_layout(int64_t E, int64_t out, int64_t r, const float *src, float *dst, int to_file) {
    for (int64_t e = 0; e < E; e++) /* ctrl [e][o][k] <-> PEFT [o][k E + e] */
        for (int64_t o = 0; o < out; o++)
            for (int64_t k = 0; k < r; k++) {
                const size_t ours = (size_t)((e * out + o) * r + k), peft = (size_t)(o * E * r + k * E + e);
                if (to_file)
                    dst[peft] = src[ours];
                else
                    dst[ours] = src[peft];
            }
}

/* An expert adapter's lora_B read in PEFT's layout, into ctrl's (in place, through a copy). */
static ctrl_status from_file_layout(ctrl_model *m, const ctrl_param_view *v) {
    if (!expert_b(m, v)) return CTRL_OK;
    float *tmp = malloc(sizeof(float) * (size_t)v->numel);
    if (!tmp) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", v->name);
    memcpy(tmp, m->params + v->offset, sizeof(float) * (size_t)v->numel);
    ctrl_peft_file_layout(m, v, tmp, m->params + v->offset, 0);
    free(tmp);
    return CTRL_OK;
}

ctrl_status ctrl_peft_load_weights(ctrl_model *m, const char *dir) {
    if (!m->has_lora)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "%s: the model has no LoRA adapters to load", dir);
    char path[4200], name[CTRL_ST_MAX_NAME];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    ctrl_safetensors *f = NULL;
    MODEL_TRY(ctrl_safetensors_open(path, &f));
    ctrl_status st = CTRL_OK;
    int used = 0;
    for (int i = 0; i < m->n_views && st == CTRL_OK; i++) {
        const ctrl_param_view *v = &m->views[i];
        if (!in_adapter(m, v)) continue;
        snprintf(name, sizeof name, PEFT_PREFIX "%s", v->name);
        const ctrl_st_tensor *t = ctrl_safetensors_find(f, name);
        if (!t) {
            st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: no tensor '%s' (adapter_config.json implies it)", path,
                                name);
            break;
        }
        if (t->ndim != v->ndim || t->shape[0] != v->shape[0] || (v->ndim > 1 && t->shape[1] != v->shape[1])) {
            st = ctrl_error_set(CTRL_ERR_FORMAT,
                                "%s: '%s' has shape [%lld, %lld], the model's is [%lld, %lld]", path, name,
                                (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 1),
                                (long long)v->shape[0], (long long)v->shape[1]);
            break;
        }
        float badv;
        const int64_t at = ctrl_safetensors_find_non_finite(f, t, &badv);
        if (at >= 0)
            st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: '%s' holds %g at element %lld", path, name,
                                (double)badv, (long long)at);
        else
            st = ctrl_safetensors_read_f32(f, name, m->params + v->offset, v->numel);
        if (st == CTRL_OK) st = from_file_layout(m, v);
        used++;
    }
    if (st == CTRL_OK && used != ctrl_safetensors_count(f)) /* a tensor the config does not explain */
        for (int k = 0; k < ctrl_safetensors_count(f) && st == CTRL_OK; k++) {
            const char *n = ctrl_safetensors_at(f, k)->name;
            if (tied_saved(m) && !strcmp(n, TIED_HEAD)) { /* the trained table under the head's name */
                st = tied_head_same(m, f, path);
                continue;
            }
            const ctrl_param_view *v = strncmp(n, PEFT_PREFIX, strlen(PEFT_PREFIX))
                                           ? NULL
                                           : ctrl_model_find_view(m, n + strlen(PEFT_PREFIX));
            if (!v || !in_adapter(m, v))
                st = ctrl_error_set(
                    CTRL_ERR_FORMAT,
                    "%s: tensor '%s' is not one of the adapters adapter_config.json describes", path, n);
        }
    ctrl_safetensors_close(f);
    ctrl_model_weights_changed(m);
    return st;
}

/* A float setting as the decimal it was written as (0.1, not 0.10000000149011612). */
static double decimal(float x) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.7g", (double)x);
    return strtod(buf, NULL);
}

/* adapter_config.json's text for config c over model m (its modules: what all-linear became). */
static char *config_json(const ctrl_model *m, const ctrl_lora_config *c, const char *base) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "peft_type", "LORA");
    cJSON_AddStringToObject(o, "task_type", c->seq_cls ? "SEQ_CLS" : "CAUSAL_LM");
    if (base && base[0])
        cJSON_AddStringToObject(o, "base_model_name_or_path", base);
    else
        cJSON_AddNullToObject(o, "base_model_name_or_path");
    cJSON_AddNumberToObject(o, "r", c->r);
    cJSON_AddNumberToObject(o, "lora_alpha", decimal(c->lora_alpha));
    cJSON_AddNumberToObject(o, "lora_dropout", decimal(c->lora_dropout));
    cJSON_AddBoolToObject(o, "use_rslora", c->use_rslora);
    cJSON_AddBoolToObject(o, "use_dora", c->use_dora);
    cJSON_AddBoolToObject(o, "lora_bias", c->lora_bias);
    cJSON_AddBoolToObject(o, "ensure_weight_tying", c->ensure_weight_tying);
    cJSON_AddStringToObject(o, "bias", "none");
    cJSON_AddBoolToObject(o, "fan_in_fan_out", 0);
    cJSON_AddBoolToObject(o, "inference_mode", 1);
    /* (pissa, olora: the adapter is over the base's residual, which PEFT recomputes when it loads it) */
    if (c->init == CTRL_LORA_INIT_DEFAULT || c->init == CTRL_LORA_INIT_NONE)
        cJSON_AddBoolToObject(o, "init_lora_weights", c->init == CTRL_LORA_INIT_DEFAULT);
    else
        cJSON_AddStringToObject(o, "init_lora_weights", ctrl_lora_init_name(c->init));
    cJSON *t = c->target_regex[0] ? NULL : cJSON_AddArrayToObject(o, "target_modules");
    if (!t) cJSON_AddStringToObject(o, "target_modules", c->target_regex); /* a regular expression */
    for (int k = 0; c->all_linear && k < LORA_N_TARGETS; k++) { /* PEFT saves what all-linear became */
        int row0,
            out; /* a decoder's seven projections, or Phi-3's qkv_proj, o_proj, gate_up_proj, down_proj */
        const int mod = lora_module(m, k, &row0, &out);
        if (!row0) cJSON_AddItemToArray(t, cJSON_CreateString(strchr(ctrl_lora_module_names[mod], '.') + 1));
    }
    for (int k = 0; t && k < c->n_targets; k++) cJSON_AddItemToArray(t, cJSON_CreateString(c->targets[k]));
    if (c->n_params > 0) { /* LoRA on the experts (PEFT's ParamWrapper) */
        cJSON *p = cJSON_AddArrayToObject(o, "target_parameters");
        for (int k = 0; k < c->n_params; k++) cJSON_AddItemToArray(p, cJSON_CreateString(c->params[k]));
    } else
        cJSON_AddNullToObject(o, "target_parameters");
    if (c->save_embed_tokens || c->save_lm_head || c->seq_cls) {
        cJSON *s = cJSON_AddArrayToObject(o, "modules_to_save");
        if (c->seq_cls) { /* PEFT's SEQ_CLS adds both head names (a decoder's is score) */
            cJSON_AddItemToArray(s, cJSON_CreateString("classifier"));
            cJSON_AddItemToArray(s, cJSON_CreateString("score"));
        }
        if (c->save_embed_tokens) cJSON_AddItemToArray(s, cJSON_CreateString("embed_tokens"));
        if (c->save_lm_head) cJSON_AddItemToArray(s, cJSON_CreateString("lm_head"));
    } else
        cJSON_AddNullToObject(o, "modules_to_save");
    cJSON *rp = cJSON_AddObjectToObject(o, "rank_pattern"), *ap = cJSON_AddObjectToObject(o, "alpha_pattern");
    for (int k = 0; k < c->n_rank_pattern; k++)
        cJSON_AddNumberToObject(rp, c->rank_pattern[k].key, c->rank_pattern[k].value);
    for (int k = 0; k < c->n_alpha_pattern; k++)
        cJSON_AddNumberToObject(ap, c->alpha_pattern[k].key, decimal((float)c->alpha_pattern[k].value));
    if (c->exclude_regex[0])
        cJSON_AddStringToObject(o, "exclude_modules", c->exclude_regex);
    else if (c->n_exclude > 0) {
        cJSON *e = cJSON_AddArrayToObject(o, "exclude_modules");
        for (int k = 0; k < c->n_exclude; k++) cJSON_AddItemToArray(e, cJSON_CreateString(c->exclude[k]));
    } else
        cJSON_AddNullToObject(o, "exclude_modules");
    if (c->n_layers > 0) {
        cJSON *l = cJSON_AddArrayToObject(o, "layers_to_transform");
        for (int k = 0; k < c->n_layers; k++) cJSON_AddItemToArray(l, cJSON_CreateNumber(c->layers[k]));
    } else
        cJSON_AddNullToObject(o, "layers_to_transform");
    if (c->n_layers_pattern > 0) {
        cJSON *l = cJSON_AddArrayToObject(o, "layers_pattern");
        for (int k = 0; k < c->n_layers_pattern; k++)
            cJSON_AddItemToArray(l, cJSON_CreateString(c->layers_pattern[k]));
    } else
        cJSON_AddNullToObject(o, "layers_pattern");
    if (c->n_head_tokens > 0) { /* PEFT's dictionary: the embedding's rows and the head's */
        cJSON *d = cJSON_AddObjectToObject(o, "trainable_token_indices");
        cJSON *e = c->n_tokens ? cJSON_AddArrayToObject(d, "embed_tokens") : NULL,
              *h = cJSON_AddArrayToObject(d, "lm_head");
        for (int k = 0; k < c->n_tokens; k++) cJSON_AddItemToArray(e, cJSON_CreateNumber(c->tokens[k]));
        for (int k = 0; k < c->n_head_tokens; k++)
            cJSON_AddItemToArray(h, cJSON_CreateNumber(c->head_tokens[k]));
    } else if (c->n_tokens > 0) { /* PEFT's list form: the input embedding's rows */
        cJSON *tk = cJSON_AddArrayToObject(o, "trainable_token_indices");
        for (int k = 0; k < c->n_tokens; k++) cJSON_AddItemToArray(tk, cJSON_CreateNumber(c->tokens[k]));
    } else
        cJSON_AddNullToObject(o, "trainable_token_indices");
    cJSON_AddNullToObject(o, "revision");
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}

ctrl_status ctrl_peft_save(ctrl_model *m, const char *dir, const char *base) {
    if (!m->has_lora)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "%s: the model has no LoRA adapters to save", dir);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return ctrl_error_set(CTRL_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    char path[4200];
    ctrl_st_write *w = calloc((size_t)m->n_views + 1, sizeof *w);
    char(*names)[CTRL_ST_MAX_NAME] = calloc((size_t)m->n_views + 1, sizeof *names);
    float *moved = malloc(sizeof(float) * (m->n_train ? m->n_train : 1)); /* the adapter in PEFT's layout */
    if (!w || !names || !moved) {
        free(w), free(names), free(moved);
        return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", dir);
    }
    int n = 0;
    const float *params = ctrl_model_params(m, NULL); /* the device's, when an optimizer stepped them there */
    for (int i = 0; i < m->n_views; i++) {
        const ctrl_param_view *v = &m->views[i];
        if (!in_adapter(m, v)) continue;
        snprintf(names[n], sizeof names[n], PEFT_PREFIX "%s", v->name);
        float *data = moved + (v->offset - m->train_off);
        ctrl_peft_file_layout(m, v, params + v->offset, data, 1);
        w[n] = (ctrl_st_write){
            .name = names[n], .data = data, .ndim = v->ndim, .shape = {v->shape[0], v->shape[1]}};
        n++;
        if ((long)v->offset == m->off_embed &&
            tied_saved(m)) /* and under the head's name, as PEFT saves it */
            w[n] = w[n - 1], w[n].name = TIED_HEAD, n++;
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    ctrl_status st = ctrl_safetensors_write(path, w, n, CTRL_F32);
    free(w), free(names), free(moved);
    if (st != CTRL_OK) return st;
    char *text = config_json(m, m->lora, base);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    st = text ? model_write_text_atomic(path, text)
              : ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", path);
    cJSON_free(text);
    return st;
}

/* The converted config: r and lora_alpha (and their patterns) doubled, so that s is the same over twice
 * the rank (with rsLoRA lora_alpha times sqrt 2), init_lora_weights true (PEFT's save_pretrained with
 * path_initial_model_for_weight_conversion). */
static ctrl_status converted_config(const ctrl_lora_config *c, const char *dir, ctrl_lora_config *out) {
    if (c->use_rslora && (c->n_rank_pattern || c->n_alpha_pattern))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "%s: use_rslora with rank_pattern / alpha_pattern: the conversion would change "
                              "the scales (PEFT refuses it too)",
                              dir);
    *out = *c;
    out->init = CTRL_LORA_INIT_DEFAULT, out->r = 2 * c->r;
    out->lora_alpha = c->use_rslora ? c->lora_alpha * sqrtf(2.0f) : 2 * c->lora_alpha;
    for (int k = 0; k < out->n_rank_pattern; k++) out->rank_pattern[k].value *= 2;
    for (int k = 0; k < out->n_alpha_pattern; k++) out->alpha_pattern[k].value *= 2;
    return CTRL_OK;
}

ctrl_status ctrl_peft_convert_to_lora(const char *base_dir, const char *adapter_dir, const char *out_dir) {
    static ctrl_lora_config lc, conv; /* large (the target list): not on the stack */
    char base[4096];
    MODEL_TRY(ctrl_peft_read_config(adapter_dir, &lc, base, sizeof base));
    if (!lora_init_from_base_on(&lc))
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "%s/adapter_config.json: init_lora_weights is not pissa or olora: the adapter applies "
            "to the base as it is already",
            adapter_dir);
    MODEL_TRY(converted_config(&lc, adapter_dir, &conv));
    ctrl_model *m = NULL; /* the original base: its adapters' initial A0, B0 computed as it loads */
    MODEL_TRY(ctrl_model_load_lora(base_dir, NULL, &lc, &m));
    const size_t n = m->n_train;
    float *init = malloc(sizeof(float) * (n ? n : 1)), *buf = NULL;
    ctrl_st_write *w = calloc((size_t)m->n_views, sizeof *w);
    char(*names)[CTRL_ST_MAX_NAME] = calloc((size_t)m->n_views, sizeof *names);
    ctrl_status st =
        init && w && names ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", out_dir);
    if (st == CTRL_OK) memcpy(init, m->params + m->train_off, sizeof(float) * n);
    if (st == CTRL_OK) st = ctrl_peft_load_weights(m, adapter_dir); /* the trained A, B */
    if (st == CTRL_OK && !(buf = malloc(sizeof(float) * 2 * (n ? n : 1))))
        st = ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", out_dir);
    int k = 0;
    size_t at = 0;
    for (int i = 0; st == CTRL_OK && i < m->n_views; i++) { /* A' = [A; A0], B' = [B, -B0]; the rest as is */
        const ctrl_param_view *v = &m->views[i];
        if (!in_adapter(m, v)) continue;
        const float *now = m->params + v->offset, *was = init + (v->offset - m->train_off);
        const int is_a = strstr(v->name, ".lora_A.weight") != NULL,
                  is_b = strstr(v->name, ".lora_B.weight") != NULL;
        float *d = buf + at;
        int64_t d0 = v->shape[0], d1 = v->ndim > 1 ? v->shape[1] : 0;
        if (is_a) { /* [r, IN] twice over */
            memcpy(d, now, sizeof(float) * (size_t)v->numel),
                memcpy(d + v->numel, was, sizeof(float) * (size_t)v->numel);
            d0 *= 2;
        } else if (is_b) { /* [OUT, r]: each row's r, then the negated initial r */
            for (int64_t o = 0; o < d0; o++)
                for (int64_t j = 0; j < d1; j++)
                    d[o * 2 * d1 + j] = now[o * d1 + j], d[o * 2 * d1 + d1 + j] = -was[o * d1 + j];
            d1 *= 2;
        } else
            memcpy(d, now, sizeof(float) * (size_t)v->numel);
        at += (size_t)v->numel * (is_a || is_b ? 2 : 1);
        snprintf(names[k], sizeof names[k], PEFT_PREFIX "%s", v->name);
        w[k] = (ctrl_st_write){.name = names[k], .data = d, .ndim = v->ndim, .shape = {d0, d1}};
        k++;
    }
    char path[4200];
    if (st == CTRL_OK && mkdir(out_dir, 0777) != 0 && errno != EEXIST)
        st = ctrl_error_set(CTRL_ERR_IO, "%s: cannot create directory: %s", out_dir, strerror(errno));
    if (st == CTRL_OK) {
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", out_dir);
        st = ctrl_safetensors_write(path, w, k, CTRL_F32);
    }
    char *text = st == CTRL_OK ? config_json(m, &conv, base) : NULL;
    if (st == CTRL_OK) {
        snprintf(path, sizeof path, "%s/adapter_config.json", out_dir);
        st = text ? model_write_text_atomic(path, text)
                  : ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", path);
    }
    cJSON_free(text);
    free(init), free(buf), free(w), free(names);
    ctrl_model_free(m);
    return st;
}
