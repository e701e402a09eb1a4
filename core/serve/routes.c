/* ctrl serve's route table: {method, path, auth, handler} looked up once per request (daemon.c),
 * and the endpoints too small for a file of their own: /health (with the batcher's counters; 503
 * while draining), /v1/models, /server_info and /get_world_size (what TRL's VLLMClient asks),
 * /sleep, /wake_up, /reset_prefix_cache, /update_weights (weights.c does the work), the LoRA
 * load and unload routes (lora.c) and vLLM's
 * NCCL weight-transfer endpoints (weight_transfer.c, on a CUDA device; see docs/serve.md). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "serve/serve_internal.h"

static enum MHD_Result health(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                              size_t n) {
    (void)in, (void)b, (void)n;
    ctrl_batcher_stats bs;
    ctrl_batcher_stats_get(s->batch, &bs);
    cJSON *o = cJSON_CreateObject();
    const int draining = serve_draining(s);
    cJSON_AddStringToObject(o, "status", draining ? "draining" : "ok");
    cJSON_AddNumberToObject(o, "generations", (double)bs.generations);
    cJSON_AddNumberToObject(o, "max_requests_per_generation", (double)bs.max_jobs);
    cJSON_AddNumberToObject(o, "prefix_cache_hits", (double)ctrl_engine_prefix_hits(s->eng));
    cJSON_AddNumberToObject(o, "joined_requests", (double)bs.joined);
    pthread_mutex_lock(&s->lock);
    cJSON_AddNumberToObject(o, "requests_in_flight", s->in_flight);
    cJSON_AddNumberToObject(o, "weight_updates", (double)s->weight_updates);
    pthread_mutex_unlock(&s->lock);
    return serve_reply(c, draining ? 503 : 200, o);
}

#define WEIGHTS_HOW                                                                                          \
    "ctrl serve takes new weights over HTTP: POST /update_weights with a safetensors body (the "             \
    "parameters under their Hugging Face names, f32/bf16/f16; see docs/serve.md)"

/* What TRL's VLLMClient reads of vLLM's /server_info: the config tree, weight_transfer_config
 * ({"backend": "nccl"} on a CUDA device; null on the CPU, where init_communicator says so before it
 * starts a rendezvous), and how weights are taken over HTTP. */
static enum MHD_Result server_info(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                                   size_t n) {
    (void)in, (void)b, (void)n;
    cJSON *o = cJSON_CreateObject(), *v = cJSON_AddObjectToObject(o, "vllm_config");
    cJSON *mc = cJSON_AddObjectToObject(v, "model_config");
    cJSON_AddStringToObject(mc, "model", s->opt->model_dir);
    cJSON_AddNumberToObject(mc, "max_model_len", s->context);
    cJSON_AddStringToObject(mc, "logprobs_mode", "processed_logprobs"); /* GRPOTrainer checks it */
    cJSON *pc = cJSON_AddObjectToObject(v, "parallel_config");
    cJSON_AddNumberToObject(pc, "tensor_parallel_size", 1);
    cJSON_AddNumberToObject(pc, "data_parallel_size", 1);
    cJSON_AddNumberToObject(pc, "world_size", 1);
    cJSON_AddItemToObject(v, "weight_transfer_config", serve_wt_config(s));
    cJSON_AddStringToObject(o, "server", "ctrl serve");
    cJSON_AddStringToObject(o, "weight_update", WEIGHTS_HOW);
    return serve_reply(c, 200, o);
}

static enum MHD_Result world_size(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                                  size_t n) {
    (void)s, (void)in, (void)b, (void)n;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "world_size", 1);
    return serve_reply(c, 200, o);
}

static enum MHD_Result wt_init(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                               size_t n) {
    (void)b, (void)n;
    return serve_wt_init(s, c, in);
}

static enum MHD_Result wt_start(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                                size_t n) {
    (void)b, (void)n;
    return serve_wt_start(s, c, in);
}

static enum MHD_Result wt_finish(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                                 size_t n) {
    (void)b, (void)n;
    return serve_wt_finish(s, c, in);
}

static enum MHD_Result models(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                              size_t n) {
    (void)in, (void)b, (void)n;
    cJSON *o = cJSON_CreateObject(), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddStringToObject(m, "id", s->opt->model_dir);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddStringToObject(m, "owned_by", "ctrl");
    cJSON_AddNumberToObject(m, "max_model_len", s->context);
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    cJSON_AddItemToArray(data, m);
    serve_lora_list(s, data);
    return serve_reply(c, 200, o);
}

static enum MHD_Result generate_trl(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                                    size_t n) {
    (void)b, (void)n;
    return serve_generate(s, c, in, SERVE_TRL);
}

static enum MHD_Result completions(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                                   size_t n) {
    (void)b, (void)n;
    return serve_generate(s, c, in, SERVE_COMPLETIONS);
}

static enum MHD_Result chat(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                            size_t n) {
    (void)b, (void)n;
    return serve_generate(s, c, in, SERVE_CHAT);
}

static enum MHD_Result ok_or_error(struct MHD_Connection *c, ctrl_status st) {
    if (st != CTRL_OK) return serve_error(c, 400, ctrl_error_message());
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    return serve_reply(c, 200, o);
}

static enum MHD_Result sleep_engine(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                                    size_t n) {
    (void)b, (void)n;
    const cJSON *lv = cJSON_GetObjectItemCaseSensitive(in, "level");
    if (lv && !cJSON_IsNull(lv) && !(cJSON_IsNumber(lv) && (lv->valuedouble == 1 || lv->valuedouble == 2)))
        return serve_error(c, 400, "level: 1 or 2");
    ctrl_batcher_lock_engine(s->batch); /* between generations, never during one */
    const ctrl_status st = ctrl_engine_sleep(s->eng, cJSON_IsNumber(lv) ? lv->valueint : 1);
    if (st == CTRL_OK) serve_set_asleep(s, 1);
    ctrl_batcher_unlock_engine(s->batch);
    return ok_or_error(c, st);
}

static enum MHD_Result wake_up(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                               size_t n) {
    (void)in, (void)b, (void)n;
    ctrl_batcher_lock_engine(s->batch);
    const ctrl_status st = ctrl_engine_wake_up(s->eng);
    if (st == CTRL_OK) serve_set_asleep(s, 0);
    ctrl_batcher_unlock_engine(s->batch);
    return ok_or_error(c, st);
}

static enum MHD_Result reset_prefix_cache(ctrl_server *s, struct MHD_Connection *c, const cJSON *in,
                                          const char *b, size_t n) {
    (void)in, (void)b, (void)n;
    ctrl_batcher_lock_engine(s->batch);
    ctrl_engine_reset_prefix_cache(s->eng);
    ctrl_batcher_unlock_engine(s->batch);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "status", "ok");
    cJSON_AddTrueToObject(o, "success"); /* vLLM 0.26's answer, which TRL's client reads */
    return serve_reply(c, 200, o);
}

static enum MHD_Result update_weights(ctrl_server *s, struct MHD_Connection *c, const cJSON *in,
                                      const char *b, size_t len) {
    (void)in;
    const char *type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (type && !strncmp(type, "application/json", 16)) /* vLLM's {"update_info": ...} over NCCL */
        return serve_wt_update(s, c, b, len);
    char err[512];
    ctrl_batcher_lock_engine(s->batch); /* between generations, never during one */
    const int n = serve_update_weights(s->model, b ? b : "", len, err, sizeof err);
    if (n > 0) ctrl_engine_reset_prefix_cache(s->eng); /* cached K/V were computed with the old weights */
    ctrl_batcher_unlock_engine(s->batch);
    if (n < 0) return serve_error(c, 400, err);
    pthread_mutex_lock(&s->lock);
    s->weight_updates++;
    pthread_mutex_unlock(&s->lock);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "updated", n);
    return serve_reply(c, 200, o);
}

static const serve_route routes[] = {
    /* method, path, auth, json, large_body, handler */
    {"GET", "/health", 0, 0, 0, health},
    {"GET", "/v1/models", 1, 0, 0, models},
    {"GET", "/server_info", 1, 0, 0, server_info},
    {"GET", "/get_world_size", 1, 0, 0, world_size},
    {"POST", "/init_weight_transfer_engine", 1, 1, 0, wt_init},
    {"POST", "/start_weight_update", 1, 1, 0, wt_start},
    {"POST", "/finish_weight_update", 1, 1, 0, wt_finish},
    {"POST", "/generate", 1, 1, 0, generate_trl},
    {"POST", "/v1/completions", 1, 1, 0, completions},
    {"POST", "/v1/chat/completions", 1, 1, 0, chat},
    {"POST", "/update_weights", 1, 0, 1, update_weights},
    {"POST", "/sleep", 1, 1, 0, sleep_engine},
    {"POST", "/wake_up", 1, 1, 0, wake_up},
    {"POST", "/reset_prefix_cache", 1, 1, 0, reset_prefix_cache},
    {"POST", "/v1/load_lora_adapter", 1, 1, 0, serve_lora_load},
    {"POST", "/v1/unload_lora_adapter", 1, 1, 0, serve_lora_unload},
};

const serve_route *serve_route_find(const char *method, const char *path, unsigned *status) {
    *status = 404;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(routes[i].path, path)) continue;
        if (!strcmp(routes[i].method, method)) return &routes[i];
        *status = 405;
    }
    return NULL;
}

void serve_route_list(char *out, size_t cap) {
    size_t at = 0;
    out[0] = '\0';
    for (size_t i = 0; i < sizeof routes / sizeof routes[0] && at < cap; i++)
        at +=
            (size_t)snprintf(out + at, cap - at, "%s%s %s", i ? ", " : "", routes[i].method, routes[i].path);
}
