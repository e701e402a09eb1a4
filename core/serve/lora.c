/* The LoRA adapters ctrl serve serves over its base (see serve_internal.h): those of --lora, loaded
 * at start, and -- with --allow-runtime-lora-updating, vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING --
 * those POST /v1/load_lora_adapter {lora_name, lora_path} adds and /v1/unload_lora_adapter
 * {lora_name} removes while the server runs, answered as vLLM answers them: 200 with a plain-text
 * "Success: ..." line; 400 for a missing field, a name already loaded or an adapter that does not
 * load (its reason); 404 for a path with no adapter ("No adapter found") and an unknown name on
 * unload. An adapter is added to the model between generations (the engine held); an unload
 * takes its name away at once (new requests naming it get 404) while the requests already running
 * under it finish under it, as in vLLM, and its weights are freed after the last of them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <ctrl/log.h>

#include "serve/serve_internal.h"

/* The live adapter called `name` (under s->lock); NULL when none. */
static serve_adapter *live(ctrl_server *s, const char *name) {
    for (int i = 0; i < s->n_adapters; i++)
        if (!s->adapters[i].retired && !strcmp(s->adapters[i].name, name)) return &s->adapters[i];
    return NULL;
}

/* Adds DIR to the model (between generations) and the table as NAME. */
static ctrl_status add(ctrl_server *s, const char *name, const char *dir) {
    int id = 0;
    if (s->batch) ctrl_batcher_lock_engine(s->batch);
    ctrl_status st = ctrl_model_add_adapter(s->model, dir, &id);
    if (s->batch) ctrl_batcher_unlock_engine(s->batch);
    if (st != CTRL_OK) return st;
    char *n = strdup(name), *d = strdup(dir);
    pthread_mutex_lock(&s->lock);
    const int room = s->n_adapters < CTRL_SERVE_MAX_LORA;
    if (n && d && room) s->adapters[s->n_adapters++] = (serve_adapter){.name = n, .dir = d, .id = id};
    pthread_mutex_unlock(&s->lock);
    if (n && d && room) return CTRL_OK;
    free(n), free(d);
    if (s->batch) ctrl_batcher_lock_engine(s->batch);
    ctrl_model_remove_adapter(s->model, id);
    if (s->batch) ctrl_batcher_unlock_engine(s->batch);
    return room ? ctrl_error_set(CTRL_ERR_NOMEM, "out of memory")
                : ctrl_error_set(CTRL_ERR_RUNTIME, "at most %d LoRA adapters at once (unload one first)",
                                 CTRL_SERVE_MAX_LORA);
}

/* Frees the weights of the retired adapters nothing runs under any more, and their entries. */
static void sweep(ctrl_server *s) {
    int ids[CTRL_SERVE_MAX_LORA], n = 0;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->n_adapters;) {
        serve_adapter *a = &s->adapters[i];
        if (!a->retired || a->refs > 0) {
            i++;
            continue;
        }
        ids[n++] = a->id;
        free(a->name), free(a->dir);
        memmove(a, a + 1, sizeof *a * (size_t)(s->n_adapters - i - 1));
        s->n_adapters--;
    }
    pthread_mutex_unlock(&s->lock);
    if (!n) return;
    if (s->batch) ctrl_batcher_lock_engine(s->batch);
    for (int i = 0; i < n; i++) ctrl_model_remove_adapter(s->model, ids[i]);
    if (s->batch) ctrl_batcher_unlock_engine(s->batch);
}

ctrl_status serve_lora_start(ctrl_server *s) {
    ctrl_status st = CTRL_OK;
    for (int i = 0; i < s->opt->n_lora && st == CTRL_OK; i++) { /* ids 1, 2, ...: the request's adapter */
        st = add(s, s->opt->lora_name[i], s->opt->lora_dir[i]);
        if (st == CTRL_OK)
            CTRL_INFO("serve: LoRA adapter '%s' from %s", s->opt->lora_name[i], s->opt->lora_dir[i]);
    }
    return st;
}

void serve_lora_stop(ctrl_server *s) {
    for (int i = 0; i < s->n_adapters; i++) free(s->adapters[i].name), free(s->adapters[i].dir);
    s->n_adapters = 0;
}

int serve_lora_acquire(ctrl_server *s, const char *name) {
    pthread_mutex_lock(&s->lock);
    serve_adapter *a = live(s, name);
    const int id = a ? a->id : 0;
    if (a) a->refs++;
    pthread_mutex_unlock(&s->lock);
    return id;
}

void serve_lora_release(ctrl_server *s, int id) {
    int swept = 0;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->n_adapters; i++)
        if (s->adapters[i].id == id && s->adapters[i].refs > 0)
            swept = --s->adapters[i].refs == 0 && s->adapters[i].retired;
    pthread_mutex_unlock(&s->lock);
    if (swept) sweep(s); /* the last request under an unloaded adapter: its weights go now */
}

const char *serve_lora_name(ctrl_server *s, int id) {
    const char *name = NULL;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->n_adapters && !name; i++)
        if (s->adapters[i].id == id) name = s->adapters[i].name;
    pthread_mutex_unlock(&s->lock);
    return name;
}

int serve_lora_checks_model(ctrl_server *s) {
    pthread_mutex_lock(&s->lock);
    int any = s->opt->runtime_lora;
    for (int i = 0; i < s->n_adapters && !any; i++) any = !s->adapters[i].retired;
    pthread_mutex_unlock(&s->lock);
    return any;
}

void serve_lora_list(ctrl_server *s, cJSON *data) {
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->n_adapters; i++) { /* as vLLM lists its LoRA modules */
        const serve_adapter *ad = &s->adapters[i];
        if (ad->retired) continue;
        cJSON *a = cJSON_CreateObject();
        cJSON_AddStringToObject(a, "id", ad->name);
        cJSON_AddStringToObject(a, "object", "model");
        cJSON_AddStringToObject(a, "owned_by", "ctrl");
        cJSON_AddStringToObject(a, "root", ad->dir);
        cJSON_AddStringToObject(a, "parent", s->opt->model_dir);
        cJSON_AddNumberToObject(a, "max_model_len", s->context);
        cJSON_AddItemToArray(data, a);
    }
    pthread_mutex_unlock(&s->lock);
}

/* vLLM answers a load or an unload with a line of plain text. */
static enum MHD_Result reply_text(struct MHD_Connection *c, const char *text) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
    const enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* 404 while runtime updating is off, as vLLM, which has no such route then; else NULL. */
static const char *disabled(const ctrl_server *s) {
    return s->opt->runtime_lora ? NULL
                                : "runtime LoRA updating is off: start ctrl serve with "
                                  "--allow-runtime-lora-updating (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING)";
}

/* A non-empty string field; NULL otherwise. */
static const char *text_field(const cJSON *in, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(in, key);
    return cJSON_IsString(v) && v->valuestring[0] ? v->valuestring : NULL;
}

enum MHD_Result serve_lora_load(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                                size_t n) {
    (void)b, (void)n;
    if (disabled(s)) return serve_error(c, 404, disabled(s));
    const char *name = text_field(in, "lora_name"), *dir = text_field(in, "lora_path");
    if (!name || !dir) return serve_error(c, 400, "Both 'lora_name' and 'lora_path' must be provided.");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(in, "load_inplace")))
        return serve_error(c, 400,
                           "load_inplace: replacing a loaded adapter in place is not implemented; unload "
                           "it first (POST /v1/unload_lora_adapter)");
    char msg[4600], path[4200];
    if (!strcmp(name, s->opt->model_dir)) {
        snprintf(msg, sizeof msg, "lora_name: '%.200s' is the served model's own name", name);
        return serve_error(c, 400, msg);
    }
    struct stat sb;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (stat(path, &sb) != 0) { /* vLLM's 404 for a path that holds no adapter */
        snprintf(msg, sizeof msg, "No adapter found for %.4000s (no adapter_config.json there)", dir);
        return serve_error(c, 404, msg);
    }
    pthread_mutex_lock(&s->lora_lock); /* one load or unload at a time: the name check holds */
    pthread_mutex_lock(&s->lock);
    const int dup = live(s, name) != NULL;
    pthread_mutex_unlock(&s->lock);
    ctrl_status st = CTRL_OK;
    if (dup)
        snprintf(msg, sizeof msg, "The lora adapter '%.200s' has already been loaded.", name);
    else if ((st = add(s, name, dir)) != CTRL_OK)
        snprintf(msg, sizeof msg, "Failed to load LoRA adapter '%.200s': %s", name, ctrl_error_message());
    pthread_mutex_unlock(&s->lora_lock);
    if (dup || st != CTRL_OK) return serve_error(c, 400, msg);
    CTRL_INFO("serve: loaded LoRA adapter '%s' from %s", name, dir);
    snprintf(msg, sizeof msg, "Success: LoRA adapter '%.200s' added successfully.", name);
    return reply_text(c, msg);
}

enum MHD_Result serve_lora_unload(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                                  size_t n) {
    (void)b, (void)n;
    if (disabled(s)) return serve_error(c, 404, disabled(s));
    const char *name = text_field(in, "lora_name");
    if (!name) return serve_error(c, 400, "lora_name: needs to be provided to unload a LoRA adapter.");
    char msg[512];
    pthread_mutex_lock(&s->lora_lock);
    pthread_mutex_lock(&s->lock);
    serve_adapter *a = live(s, name);
    const int running = a ? a->refs : 0;
    if (a) a->retired = 1; /* gone for new requests; the running ones keep it */
    pthread_mutex_unlock(&s->lock);
    if (a) sweep(s);
    pthread_mutex_unlock(&s->lora_lock);
    if (!a) {
        snprintf(msg, sizeof msg, "The lora adapter '%.200s' cannot be found.", name);
        return serve_error(c, 404, msg);
    }
    CTRL_INFO("serve: unloaded LoRA adapter '%s'%s", name,
              running ? " (its weights go when the requests running under it finish)" : "");
    snprintf(msg, sizeof msg, "Success: LoRA adapter '%.200s' removed successfully.", name);
    return reply_text(c, msg);
}
