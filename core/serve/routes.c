/* ctrl serve's route table: {method, path, auth, handler} looked up once per request (daemon.c),
 * and the endpoints too small for a file of their own: /health (with the batcher's counters),
 * /v1/models, /sleep, /wake_up, /reset_prefix_cache, /update_weights (weights.c does the work). */
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
    cJSON_AddStringToObject(o, "status", "ok");
    cJSON_AddNumberToObject(o, "generations", (double)bs.generations);
    cJSON_AddNumberToObject(o, "max_requests_per_generation", (double)bs.max_jobs);
    cJSON_AddNumberToObject(o, "prefix_cache_hits", (double)ctrl_engine_prefix_hits(s->eng));
    cJSON_AddNumberToObject(o, "joined_requests", (double)bs.joined);
    pthread_mutex_lock(&s->lock);
    cJSON_AddNumberToObject(o, "requests_in_flight", s->in_flight - 1); /* not counting this one */
    pthread_mutex_unlock(&s->lock);
    return serve_reply(c, 200, o);
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
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), m);
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
    ctrl_batcher_unlock_engine(s->batch);
    return ok_or_error(c, st);
}

static enum MHD_Result wake_up(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                               size_t n) {
    (void)in, (void)b, (void)n;
    ctrl_batcher_lock_engine(s->batch);
    const ctrl_status st = ctrl_engine_wake_up(s->eng);
    ctrl_batcher_unlock_engine(s->batch);
    return ok_or_error(c, st);
}

static enum MHD_Result reset_prefix_cache(ctrl_server *s, struct MHD_Connection *c, const cJSON *in,
                                          const char *b, size_t n) {
    (void)in, (void)b, (void)n;
    ctrl_batcher_lock_engine(s->batch);
    ctrl_engine_reset_prefix_cache(s->eng);
    ctrl_batcher_unlock_engine(s->batch);
    return ok_or_error(c, CTRL_OK);
}

static enum MHD_Result update_weights(ctrl_server *s, struct MHD_Connection *c, const cJSON *in,
                                      const char *b, size_t len) {
    (void)in;
    char err[512];
    ctrl_batcher_lock_engine(s->batch); /* between generations, never during one */
    const int n = serve_update_weights(s->model, b ? b : "", len, err, sizeof err);
    if (n > 0) ctrl_engine_reset_prefix_cache(s->eng); /* cached K/V were computed with the old weights */
    ctrl_batcher_unlock_engine(s->batch);
    if (n < 0) return serve_error(c, 400, err);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "updated", n);
    return serve_reply(c, 200, o);
}

static const serve_route routes[] = {
    /* method, path, auth, json, large_body, handler */
    {"GET", "/health", 0, 0, 0, health},
    {"GET", "/v1/models", 1, 0, 0, models},
    {"POST", "/generate", 1, 1, 0, generate_trl},
    {"POST", "/v1/completions", 1, 1, 0, completions},
    {"POST", "/v1/chat/completions", 1, 1, 0, chat},
    {"POST", "/update_weights", 1, 0, 1, update_weights},
    {"POST", "/sleep", 1, 1, 0, sleep_engine},
    {"POST", "/wake_up", 1, 1, 0, wake_up},
    {"POST", "/reset_prefix_cache", 1, 1, 0, reset_prefix_cache},
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
