/* Loading Hugging Face model directories: config.json plus model.safetensors or the shards listed
 * in model.safetensors.index.json; any float storage (f32/bf16/f16) is converted to the fp32
 * master weights. config.json and generation_config.json are kept with the model, to be carried
 * over when it is saved (model_save.c). */
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_text.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "model/safetensors.h"

#define MAX_SHARDS 256

/* Every tensor of every shard, sorted by name: a name may be in one shard only (which copy would
 * count?), and the loader finds each by binary search. */
typedef struct tensor_ref {
    const char *name;
    int shard;
    const ctrl_st_tensor *t;
} tensor_ref;

typedef struct shard_set {
    ctrl_safetensors *files[MAX_SHARDS];
    char names[MAX_SHARDS][256];
    int n;
    tensor_ref *refs;
    int n_refs;
} shard_set;

static void shards_close(shard_set *s) {
    for (int i = 0; i < s->n; i++) ctrl_safetensors_close(s->files[i]);
    free(s->refs);
    s->refs = NULL, s->n = s->n_refs = 0;
}

static int cmp_ref(const void *a, const void *b) {
    return strcmp(((const tensor_ref *)a)->name, ((const tensor_ref *)b)->name);
}

static const tensor_ref *find_ref(const shard_set *s, const char *name) {
    const tensor_ref key = {.name = name};
    return bsearch(&key, s->refs, (size_t)s->n_refs, sizeof key, cmp_ref);
}

/* The name table, refusing a tensor in two shards; with an index, each weight_map entry must name
 * the shard that holds the tensor. */
static ctrl_status index_tensors(const char *dir, shard_set *s, const cJSON *map, const char *index_path) {
    size_t total = 0;
    for (int i = 0; i < s->n; i++) total += (size_t)ctrl_safetensors_count(s->files[i]);
    s->refs = malloc(sizeof *s->refs * (total ? total : 1));
    if (!s->refs) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: cannot index %zu tensors", dir, total);
    for (int i = 0; i < s->n; i++)
        for (int k = 0; k < ctrl_safetensors_count(s->files[i]); k++) {
            const ctrl_st_tensor *t = ctrl_safetensors_at(s->files[i], k);
            s->refs[s->n_refs++] = (tensor_ref){t->name, i, t};
        }
    qsort(s->refs, (size_t)s->n_refs, sizeof *s->refs, cmp_ref);
    for (int i = 1; i < s->n_refs; i++)
        if (!strcmp(s->refs[i].name, s->refs[i - 1].name))
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: tensor '%s' is in both %s and %s", dir,
                                  s->refs[i].name, s->names[s->refs[i - 1].shard],
                                  s->names[s->refs[i].shard]);
    for (const cJSON *e = map ? map->child : NULL; e; e = e->next) {
        const tensor_ref *r = find_ref(s, e->string);
        if (!r || strcmp(s->names[r->shard], e->valuestring) != 0)
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: weight_map puts '%s' in %s, which has no such tensor",
                                  index_path, e->string, e->valuestring);
    }
    return CTRL_OK;
}

static ctrl_status shards_open(const char *dir, shard_set *s) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        ctrl_status st = ctrl_safetensors_open(path, &s->files[0]);
        if (st != CTRL_OK) return st;
        s->n = 1;
        snprintf(s->names[0], sizeof s->names[0], "model.safetensors");
        if ((st = index_tensors(dir, s, NULL, NULL)) != CTRL_OK) shards_close(s);
        return st;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (stat(path, &sb) != 0)
        return ctrl_error_set(CTRL_ERR_IO, "%s: neither model.safetensors nor model.safetensors.index.json",
                              dir);
    ctrl_status rst;
    char *text = ctrl_read_text_file(path, 64u << 20, &rst);
    if (!text) return rst;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: no weight_map object", path);
    }
    /* Open each distinct shard once: a plain file name in the model directory. */
    ctrl_status st = CTRL_OK;
    for (const cJSON *e = map->child; e && st == CTRL_OK; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || strlen(e->valuestring) >= 256 ||
            !strcmp(e->valuestring, ".") || !strcmp(e->valuestring, "..") || !e->valuestring[0]) {
            st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: bad shard name for '%s'", path, e->string);
            break;
        }
        int known = 0;
        for (int i = 0; i < s->n && !known; i++) known = !strcmp(s->names[i], e->valuestring);
        if (known) continue;
        if (s->n == MAX_SHARDS) {
            st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: more than %d shards", path, MAX_SHARDS);
            break;
        }
        snprintf(s->names[s->n], 256, "%s", e->valuestring);
        char shard[4400];
        snprintf(shard, sizeof shard, "%s/%s", dir, e->valuestring);
        st = ctrl_safetensors_open(shard, &s->files[s->n]);
        if (st == CTRL_OK) s->n++;
    }
    if (st == CTRL_OK) st = index_tensors(dir, s, map, path);
    cJSON_Delete(root);
    if (st != CTRL_OK) shards_close(s);
    return st;
}

/* What load_into reads: the whole model (parts NULL), or the ranges of parameters parts gives. */
typedef struct load_parts {
    ctrl_model_parts_fn fn;
    ctrl_model_nf4_parts_fn nf4; /* QLoRA: each NF4 weight's piece kept (NULL: whole) */
    void *ctx;
} load_parts;
static ctrl_status load_into(const char *dir, const ctrl_model_config *cfg, const ctrl_attention_ops *attn,
                             const char *optional, const ctrl_lora_config *lora, const load_parts *parts,
                             int frozen_bf16, ctrl_model **out);

/* DIR's config.json and generation_config.json, kept to be carried over when the model is saved
 * (a checkpoint resumed from may be gone by then). */
static ctrl_status keep_source_files(ctrl_model *m, const char *dir) {
    static const char *const names[2] = {"config.json", "generation_config.json"};
    char **slots[2] = {&m->source_config, &m->source_generation};
    for (int i = 0; i < 2; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat sb;
        if (stat(path, &sb) != 0) continue; /* none: generated at save time */
        ctrl_status st;
        if (!(*slots[i] = ctrl_read_text_file(path, 16u << 20, &st))) return st;
    }
    return CTRL_OK;
}

/* A dtype name of config.json ("float32", "bfloat16", "float16"; torch's spelling "torch.bfloat16"
 * too); 0 when it is none of them. */
static int dtype_from_name(const char *name, ctrl_dtype *out) {
    if (!strncmp(name, "torch.", 6)) name += 6;
    if (!strcmp(name, "float32"))
        *out = CTRL_F32;
    else if (!strcmp(name, "bfloat16"))
        *out = CTRL_BF16;
    else if (!strcmp(name, "float16"))
        *out = CTRL_F16;
    else
        return 0;
    return 1;
}

ctrl_status ctrl_model_dir_dtype(const char *dir, ctrl_dtype *out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 16u << 20, &st);
    if (!text) return st;
    cJSON *root = cJSON_Parse(text);
    free(text);
    int found = 0;
    static const char *const keys[2] = {"dtype", "torch_dtype"};
    for (int k = 0; k < 2 && !found; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[k]);
        found = cJSON_IsString(v) && dtype_from_name(v->valuestring, out);
    }
    cJSON_Delete(root);
    if (found) return CTRL_OK;
    *out = CTRL_F32; /* config.json does not say ("auto", or nothing): what the weights are stored in */
    shard_set shards = {0};
    if (shards_open(dir, &shards) != CTRL_OK) {
        ctrl_error_clear();
        return CTRL_OK;
    }
    for (int i = 0; i < shards.n_refs; i++) {
        const ctrl_dtype d = shards.refs[i].t->dtype;
        if (d == CTRL_F32 || d == CTRL_BF16 || d == CTRL_F16) {
            *out = d;
            break;
        }
    }
    shards_close(&shards);
    return CTRL_OK;
}

ctrl_status ctrl_model_load(const char *dir, const ctrl_attention_ops *attn, ctrl_model **out) {
    return ctrl_model_load_lora(dir, attn, NULL, out);
}

ctrl_status ctrl_model_load_lora(const char *dir, const ctrl_attention_ops *attn,
                                 const ctrl_lora_config *lora, ctrl_model **out) {
    ctrl_model_config cfg;
    ctrl_status st = ctrl_model_config_load(dir, &cfg);
    if (st != CTRL_OK) return st;
    return load_into(dir, &cfg, attn, NULL, lora, NULL, 0, out);
}

ctrl_status ctrl_model_load_frozen_bf16(const char *dir, const ctrl_attention_ops *attn, ctrl_model **out) {
    ctrl_model_config cfg;
    ctrl_status st = ctrl_model_config_load(dir, &cfg);
    if (st != CTRL_OK) return st;
    return load_into(dir, &cfg, attn, NULL, NULL, NULL, 1, out);
}

ctrl_status ctrl_model_load_as(const char *dir, const ctrl_model_config *cfg, const ctrl_attention_ops *attn,
                               const char *optional, ctrl_model **out) {
    return load_into(dir, cfg, attn, optional, NULL, NULL, 0, out);
}

ctrl_status ctrl_model_load_as_lora(const char *dir, const ctrl_model_config *cfg,
                                    const ctrl_attention_ops *attn, const char *optional,
                                    const ctrl_lora_config *lora, ctrl_model **out) {
    return load_into(dir, cfg, attn, optional, lora, NULL, 0, out);
}

ctrl_status ctrl_model_load_part_as(const char *dir, const ctrl_model_config *cfg,
                                    const ctrl_attention_ops *attn, const char *optional,
                                    ctrl_model_parts_fn parts, void *ctx, ctrl_model **out) {
    return ctrl_model_load_lora_part_as(dir, cfg, attn, optional, NULL, parts, NULL, ctx, out);
}

ctrl_status ctrl_model_load_lora_part_as(const char *dir, const ctrl_model_config *cfg,
                                         const ctrl_attention_ops *attn, const char *optional,
                                         const ctrl_lora_config *lora, ctrl_model_parts_fn parts,
                                         ctrl_model_nf4_parts_fn nf4_parts, void *ctx, ctrl_model **out) {
    const load_parts p = {parts, nf4_parts, ctx};
    return load_into(dir, cfg, attn, optional, lora, &p, 0, out);
}

ctrl_status ctrl_model_load_part(const char *dir, const ctrl_attention_ops *attn, ctrl_model_parts_fn parts,
                                 void *ctx, ctrl_model **out) {
    return ctrl_model_load_lora_part(dir, attn, NULL, parts, NULL, ctx, out);
}

ctrl_status ctrl_model_load_lora_part(const char *dir, const ctrl_attention_ops *attn,
                                      const ctrl_lora_config *lora, ctrl_model_parts_fn parts,
                                      ctrl_model_nf4_parts_fn nf4_parts, void *ctx, ctrl_model **out) {
    ctrl_model_config cfg;
    ctrl_status st = ctrl_model_config_load(dir, &cfg);
    if (st != CTRL_OK) return st;
    const load_parts p = {parts, nf4_parts, ctx};
    return load_into(dir, &cfg, attn, NULL, lora, &p, 0, out);
}

/* The elements of view v that lie in the ranges (pairs [a, b) of parameters, ascending; *next: the
 * first that may still meet a view), each checked finite and read; the rest of v is not touched. */
static ctrl_status read_parts(const char *dir, const ctrl_safetensors *file, const ctrl_st_tensor *t,
                              const ctrl_param_view *v, float *params, const size_t *ranges, int n_ranges,
                              int *next) {
    const size_t lo = (size_t)v->offset, hi = lo + (size_t)v->numel;
    while (*next < n_ranges && ranges[2 * *next + 1] <= lo) ++*next;
    for (int k = *next; k < n_ranges && ranges[2 * k] < hi; k++) {
        const size_t a = ranges[2 * k] > lo ? ranges[2 * k] : lo,
                     b = ranges[2 * k + 1] < hi ? ranges[2 * k + 1] : hi;
        float bad;
        const int64_t at =
            ctrl_safetensors_find_non_finite_part(file, t, (int64_t)(a - lo), (int64_t)(b - a), &bad);
        if (at >= 0)
            return ctrl_error_set(CTRL_ERR_FORMAT,
                                  "%s: tensor '%s' holds %g at element %lld (weights must be finite)", dir,
                                  v->name, (double)bad, (long long)at);
        ctrl_status st =
            ctrl_safetensors_read_f32_part(file, t, params + a, (int64_t)(a - lo), (int64_t)(b - a));
        if (st != CTRL_OK) return st;
    }
    return CTRL_OK;
}

/* A model of shape *cfg (with adapters: lora) and DIR's weights (ctrl_model_load_as). */
static ctrl_status load_into(const char *dir, const ctrl_model_config *cfg, const ctrl_attention_ops *attn,
                             const char *optional, const ctrl_lora_config *lora, const load_parts *parts,
                             int frozen_bf16, ctrl_model **out) {
    ctrl_model *m;
    ctrl_status st = ctrl_model_create_lora(cfg, attn, lora, &m);
    if (st != CTRL_OK) return st;
    m->w16_at_load = lora && !lora->nf4 ? lora->bf16_base : 0; /* 2: panels only (inference) */
    if (frozen_bf16) { /* inference: no gradients, bf16 compute, each layer held as panels once read */
        if ((st = ctrl_model_freeze(m)) == CTRL_OK) st = ctrl_model_set_compute_dtype(m, CTRL_BF16);
        if (st != CTRL_OK) {
            ctrl_model_free(m);
            return st;
        }
        m->w16_at_load = 2;
    }
    /* 2, 3: where it can (the default); 4 (inference): where its values are bf16 already */
    m->emb16_at_load = frozen_bf16 ? 4 : lora ? lora->bf16_embed : 0;
    shard_set shards = {0};
    size_t *ranges = NULL;
    int n_ranges = 0, next = 0;
    if (parts && (st = parts->fn(m, parts->ctx, &ranges, &n_ranges)) != CTRL_OK) {
        ctrl_model_free(m);
        return st;
    }
    if (parts && lora && (lora->n_tokens > 0 || lora->n_head_tokens > 0)) {
        ctrl_model_free(m);
        free(ranges);
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "LoRA trainable_token_indices with zero3: the trained rows live in the embedding "
            "table, which each rank reads a slice of (not implemented; zero1 / zero2 work)");
    }
    int64_t *spans = NULL; /* QLoRA's pieces: each NF4 weight's values kept */
    if (parts && parts->nf4 && lora && lora->nf4) {
        const size_t n = 2 * (size_t)(cfg->n_layers > 0 ? cfg->n_layers : 1) * LORA_N_TARGETS;
        if (!(spans = calloc(n, sizeof *spans)))
            st = ctrl_error_set(CTRL_ERR_NOMEM, "%s: the NF4 pieces", dir);
        if (st == CTRL_OK) st = parts->nf4(m, parts->ctx, spans);
        if (st != CTRL_OK) {
            free(spans), free(ranges);
            ctrl_model_free(m);
            return st;
        }
    }
    if ((st = shards_open(dir, &shards)) != CTRL_OK) {
        free(ranges);
        ctrl_model_free(m);
        return st;
    }
    float *params = ctrl_model_params(m, NULL);
    for (int i = 0; i < ctrl_model_view_count(m) && st == CTRL_OK; i++) {
        const ctrl_param_view *v = ctrl_model_view(m, i);
        if (v->lora) continue; /* the adapters: initialised, or loaded from an adapter directory */
        const tensor_ref *ref = find_ref(&shards, v->name);
        const ctrl_safetensors *file = ref ? shards.files[ref->shard] : NULL;
        const ctrl_st_tensor *t = ref ? ref->t : NULL;
        if (!t && optional && !strcmp(v->name, optional)) continue; /* left zero for the caller */
        if (!t) {
            st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: the weights have no tensor '%s'", dir, v->name);
            break;
        }
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        int shape_ok =
            t->ndim == v->ndim && t->shape[0] == v->shape[0] && (v->ndim < 2 || t->shape[1] == v->shape[1]);
        if (!shape_ok) {
            st = ctrl_error_set(
                CTRL_ERR_FORMAT, "%s: tensor '%s' has shape [%lld%s%lld], config.json implies [%lld, %lld]",
                dir, v->name, (long long)t->shape[0], t->ndim > 1 ? ", " : "",
                (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)v->shape[0], (long long)v->shape[1]);
            break;
        }
        if (parts && lora_init_from_base_on(lora) && !v->lora) {
            st = ctrl_error_set(
                CTRL_ERR_UNSUPPORTED,
                "LoRA init_lora_weights = %s: each adapter is computed from its whole base weight, "
                "which a rank reading its slices (zero3) does not hold",
                lora->init == CTRL_LORA_INIT_PISSA ? "pissa" : "olora");
            break;
        }
        if (parts && !(spans && v->nf4)) { /* only the parts of it in the ranges (ascending, as the views) */
            st = read_parts(dir, file, t, v, params, ranges, n_ranges, &next);
            continue;
        }
        float bad;
        const int64_t at = ctrl_safetensors_find_non_finite(file, t, &bad);
        if (at >= 0) {
            st = ctrl_error_set(CTRL_ERR_FORMAT,
                                "%s: tensor '%s' holds %g at element %lld (weights must be finite)", dir,
                                v->name, (double)bad, (long long)at);
            break;
        }
        st = ctrl_safetensors_read_f32(file, v->name, params + v->offset, numel);
        if (st == CTRL_OK) st = lora_init_from_base(m, v);          /* pissa / olora: before it is narrowed */
        if (st == CTRL_OK) lora_tokens_capture(m, (long)v->offset); /* trainable_token_indices' rows */
        if (st == CTRL_OK) lora_saved_capture(m, (long)v->offset);  /* modules_to_save's base values */
        if (st == CTRL_OK && v->nf4) /* QLoRA: into NF4 before the next layer's (its piece alone kept) */
            st = spans ? nf4_store_part(m, v, spans[2 * (v->nf4 - 1)], spans[2 * (v->nf4 - 1) + 1])
                       : nf4_store(m, v);
        if (st == CTRL_OK && m->w16_at_load) st = model_bf16_view_loaded(m, v);      /* LoRA: bf16 base */
        if (st == CTRL_OK && m->emb16_at_load) st = model_embed16_view_loaded(m, v); /* and embedding */
    }
    shards_close(&shards);
    free(ranges), free(spans);
    if (st == CTRL_OK && lora_init_from_base_on(lora)) st = lora_init_from_base_check(m);
    /* for inference: the head's panels too */
    if (st == CTRL_OK && (frozen_bf16 || (lora && lora->bf16_base == 2)) && m->base_panels)
        st = model_hold_head(m);
    if (st == CTRL_OK) st = dora_init_magnitudes(m); /* DoRA's magnitudes: the loaded weights' norms */
    if (st == CTRL_OK) st = keep_source_files(m, dir);
    if (st != CTRL_OK) {
        ctrl_model_free(m);
        return st;
    }
    *out = m;
    return CTRL_OK;
}
