/* Loading and saving Hugging Face model directories: config.json plus model.safetensors or the
 * shards listed in model.safetensors.index.json; any float storage (f32/bf16/f16) is converted to
 * the fp32 master weights. Saving writes config.json, model.safetensors and
 * generation_config.json, each atomically. */
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_text.h"
#include "model/model.h"
#include "model/safetensors.h"

#define MAX_SHARDS 256

typedef struct shard_set {
    ctrl_safetensors *files[MAX_SHARDS];
    int n;
} shard_set;

static void shards_close(shard_set *s) {
    for (int i = 0; i < s->n; i++) ctrl_safetensors_close(s->files[i]);
    s->n = 0;
}

static ctrl_status shards_open(const char *dir, shard_set *s) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        s->n = 1;
        return ctrl_safetensors_open(path, &s->files[0]);
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
    /* Open each distinct shard once. */
    char names[MAX_SHARDS][256];
    ctrl_status st = CTRL_OK;
    for (const cJSON *e = map->child; e && st == CTRL_OK; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || strlen(e->valuestring) >= 256) {
            st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: bad shard name for '%s'", path, e->string);
            break;
        }
        int known = 0;
        for (int i = 0; i < s->n; i++) known |= !strcmp(names[i], e->valuestring);
        if (known) continue;
        if (s->n == MAX_SHARDS) {
            st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: more than %d shards", path, MAX_SHARDS);
            break;
        }
        snprintf(names[s->n], 256, "%s", e->valuestring);
        char shard[4400];
        snprintf(shard, sizeof shard, "%s/%s", dir, e->valuestring);
        st = ctrl_safetensors_open(shard, &s->files[s->n]);
        if (st == CTRL_OK) s->n++;
    }
    cJSON_Delete(root);
    if (st != CTRL_OK) shards_close(s);
    return st;
}

ctrl_status ctrl_model_load(const char *dir, const ctrl_attention_ops *attn, ctrl_model **out) {
    ctrl_model_config cfg;
    ctrl_status st = ctrl_model_config_load(dir, &cfg);
    if (st != CTRL_OK) return st;
    ctrl_model *m;
    if ((st = ctrl_model_create(&cfg, attn, &m)) != CTRL_OK) return st;
    shard_set shards = {0};
    if ((st = shards_open(dir, &shards)) != CTRL_OK) {
        ctrl_model_free(m);
        return st;
    }
    float *params = ctrl_model_params(m, NULL);
    for (int i = 0; i < ctrl_model_view_count(m) && st == CTRL_OK; i++) {
        const ctrl_param_view *v = ctrl_model_view(m, i);
        const ctrl_safetensors *file = NULL;
        const ctrl_st_tensor *t = NULL;
        for (int s = 0; s < shards.n && !t; s++)
            if ((t = ctrl_safetensors_find(shards.files[s], v->name))) file = shards.files[s];
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
        st = ctrl_safetensors_read_f32(file, v->name, params + v->offset, numel);
    }
    shards_close(&shards);
    if (st != CTRL_OK) {
        ctrl_model_free(m);
        return st;
    }
    *out = m;
    return CTRL_OK;
}
