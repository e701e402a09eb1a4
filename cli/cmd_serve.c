/* ctrl serve --model DIR [--host 127.0.0.1] [--port 8000] [--kv-cache-mb N] [--max-body-kb N]
 * HTTP (libmicrohttpd) over the generation engine: GET /health, GET /v1/models, POST /generate
 * (shaped like TRL's vllm-serve), POST /v1/completions (OpenAI, non-streaming), POST /sleep,
 * /wake_up, /reset_prefix_cache, /update_weights (a safetensors body). Requests are served one at a time (the
 * engine batches the prompts and samples of one request). */
#include <arpa/inet.h>
#include <cJSON.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "generate/engine.h"
#include "serve_weights.h"
#include "tokenizer/tokenizer.h"

typedef struct server {
    ctrl_model *model;
    ctrl_tokenizer *tok;
    ctrl_engine *eng;
    const char *name;
    size_t max_body;
    int32_t stops[16];
    int n_stop;
} server;

typedef struct body {
    char *data;
    size_t len;
    int too_big;
} body;

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result error(struct MHD_Connection *c, unsigned code, const char *msg) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", msg);
    return reply(c, code, o);
}

/* Reads the sampling fields both endpoints take; anything else not in `extra` is an error. */
static const char *request_params(const cJSON *in, const char *const *extra, ctrl_gen_request *r) {
    static const char *const known[] = {
        "n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed", NULL};
    *r = (ctrl_gen_request){.n = 1, .max_tokens = 16, .sampling = {1.0f, 0, 1.0f, 0, 1.0f}};
    for (const cJSON *f = in->child; f; f = f->next) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = !strcmp(f->string, known[i]);
        for (int i = 0; extra[i] && !ok; i++) ok = !strcmp(f->string, extra[i]);
        if (!ok) return f->string;
        if (!cJSON_IsNumber(f)) continue;
        const double v = f->valuedouble;
        if (!strcmp(f->string, "n"))
            r->n = (int)v;
        else if (!strcmp(f->string, "temperature"))
            r->sampling.temperature = (float)v;
        else if (!strcmp(f->string, "top_p"))
            r->sampling.top_p = (float)v;
        else if (!strcmp(f->string, "top_k"))
            r->sampling.top_k = v < 0 ? 0 : (int)v; /* vLLM: -1 = off */
        else if (!strcmp(f->string, "min_p"))
            r->sampling.min_p = (float)v;
        else if (!strcmp(f->string, "repetition_penalty"))
            r->sampling.repetition_penalty = (float)v;
        else if (!strcmp(f->string, "max_tokens"))
            r->max_tokens = (int)v;
        else if (!strcmp(f->string, "seed"))
            r->seed = (uint64_t)v;
    }
    return NULL;
}

/* Prompts as ids: a string or list of strings under `key`, or lists of ids under `ids_key`. */
static int prompts_of(server *s, const cJSON *in, const char *key, const char *ids_key, int32_t ***ids,
                      int **lens) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(in, key),
                *q = cJSON_GetObjectItemCaseSensitive(in, ids_key);
    cJSON *one = NULL;
    if (cJSON_IsString(p)) p = one = cJSON_CreateStringArray((const char *const[]){p->valuestring}, 1);
    const cJSON *list = cJSON_IsArray(p) ? p : cJSON_IsArray(q) ? q : NULL;
    const int n = list ? cJSON_GetArraySize(list) : 0;
    *ids = calloc((size_t)(n ? n : 1), sizeof **ids), *lens = calloc((size_t)(n ? n : 1), sizeof **lens);
    int i = 0, ok = n > 0;
    for (const cJSON *e = list ? list->child : NULL; e && ok; e = e->next, i++) {
        size_t len = 0;
        if (cJSON_IsString(e)) {
            ok = ctrl_tokenizer_encode(s->tok, e->valuestring, strlen(e->valuestring), 1, &(*ids)[i], &len) ==
                 CTRL_OK;
        } else if (cJSON_IsArray(e)) {
            (*ids)[i] = malloc(sizeof(int32_t) * (size_t)(cJSON_GetArraySize(e) + 1));
            for (const cJSON *t = e->child; t && ok; t = t->next) {
                ok = cJSON_IsNumber(t) && t->valuedouble >= 0 &&
                     t->valuedouble < ctrl_tokenizer_vocab_size(s->tok);
                (*ids)[i][len++] = (int32_t)t->valuedouble;
            }
        } else {
            ok = 0;
        }
        (*lens)[i] = (int)len;
        ok &= len > 0;
    }
    cJSON_Delete(one);
    return ok ? n : -1;
}

static enum MHD_Result generate(server *s, struct MHD_Connection *c, const cJSON *in, int openai) {
    static const char *const trl_extra[] = {"prompts", "prompt_token_ids", NULL};
    static const char *const oai_extra[] = {"model", "prompt", NULL};
    ctrl_gen_request base;
    const char *unknown = request_params(in, openai ? oai_extra : trl_extra, &base);
    char msg[256];
    if (unknown) {
        snprintf(msg, sizeof msg, "unknown field '%s'", unknown);
        return error(c, 400, msg);
    }
    if (base.n < 1 || base.max_tokens < 1 || base.n > 1024 || base.max_tokens > 1 << 20)
        return error(c, 400, "n and max_tokens must be positive");
    int32_t **ids;
    int *lens;
    const int n = prompts_of(s, in, openai ? "prompt" : "prompts", "prompt_token_ids", &ids, &lens);
    enum MHD_Result ret;
    if (n < 0) {
        ret = error(c, 400, "prompts: a non-empty string, list of strings, or list of token-id lists");
    } else {
        ctrl_gen_request *reqs = calloc((size_t)n, sizeof *reqs);
        ctrl_gen_output *outs = calloc((size_t)n * base.n, sizeof *outs);
        for (int i = 0; i < n; i++) {
            reqs[i] = base;
            reqs[i].prompt = ids[i], reqs[i].prompt_len = lens[i], reqs[i].seed = base.seed + (uint64_t)i;
            reqs[i].stop_ids = s->stops, reqs[i].n_stop = s->n_stop;
        }
        if (ctrl_engine_generate(s->eng, reqs, n, outs, NULL, NULL) != CTRL_OK) {
            ret = error(c, 500, ctrl_error_message());
        } else {
            cJSON *o = cJSON_CreateObject();
            long completion_tokens = 0, prompt_tokens = 0;
            cJSON *a = openai ? cJSON_AddArrayToObject(o, "choices") : NULL;
            cJSON *pids = openai ? NULL : cJSON_AddArrayToObject(o, "prompt_ids");
            cJSON *cids = openai ? NULL : cJSON_AddArrayToObject(o, "completion_ids");
            cJSON *lps = openai ? NULL : cJSON_AddArrayToObject(o, "logprobs");
            for (int i = 0; i < n; i++) {
                prompt_tokens += lens[i];
                if (!openai)
                    cJSON_AddItemToArray(pids, cJSON_CreateIntArray(ids[i], lens[i])); /* once per prompt */
                for (int k = 0; k < base.n; k++) {
                    const ctrl_gen_output *g = &outs[(size_t)i * base.n + k];
                    completion_tokens += g->len;
                    if (openai) {
                        char *txt = NULL;
                        size_t tl;
                        ctrl_tokenizer_decode(s->tok, g->ids, (size_t)g->len, 1, &txt, &tl);
                        cJSON *ch = cJSON_CreateObject();
                        cJSON_AddStringToObject(ch, "text", txt ? txt : "");
                        cJSON_AddNumberToObject(ch, "index", i * base.n + k);
                        cJSON_AddNullToObject(ch, "logprobs");
                        cJSON_AddStringToObject(ch, "finish_reason", g->stopped ? "stop" : "length");
                        cJSON_AddItemToArray(a, ch);
                        free(txt);
                    } else {
                        cJSON_AddItemToArray(cids, cJSON_CreateIntArray(g->ids, g->len));
                        cJSON_AddItemToArray(lps, cJSON_CreateFloatArray(g->logprobs, g->len));
                    }
                }
            }
            if (openai) {
                snprintf(msg, sizeof msg, "cmpl-%ld", (long)time(NULL));
                cJSON_AddStringToObject(o, "id", msg);
                cJSON_AddStringToObject(o, "object", "text_completion");
                cJSON_AddNumberToObject(o, "created", (double)time(NULL));
                cJSON_AddStringToObject(o, "model", s->name);
                cJSON *u = cJSON_AddObjectToObject(o, "usage");
                cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt_tokens);
                cJSON_AddNumberToObject(u, "completion_tokens", (double)completion_tokens);
                cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt_tokens + completion_tokens));
            }
            ret = reply(c, 200, o);
        }
        for (size_t i = 0; i < (size_t)n * base.n; i++) ctrl_gen_output_free(&outs[i]);
        free(reqs), free(outs);
    }
    for (int i = 0; i < (n > 0 ? n : 1); i++) free(ids[i]);
    free(ids), free(lens);
    return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version;
    server *s = cls;
    body *b = *state;
    if (!b) { /* first call: the headers */
        *state = calloc(1, sizeof(body));
        return MHD_YES;
    }
    if (*upload_size) { /* body chunks; a weights update may be as large as the model in f32 */
        size_t n_params = 0;
        ctrl_model_params(s->model, &n_params);
        const size_t limit = !strcmp(url, "/update_weights") ? n_params * 4 + (16u << 20) : s->max_body;
        if (b->len + *upload_size > limit) b->too_big = 1;
        if (!b->too_big) {
            b->data = realloc(b->data, b->len + *upload_size + 1);
            memcpy(b->data + b->len, upload, *upload_size);
            b->len += *upload_size;
            b->data[b->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    const int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (get && !strcmp(url, "/health")) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", "ok");
        return reply(c, 200, o);
    }
    if (get && !strcmp(url, "/v1/models")) {
        cJSON *o = cJSON_CreateObject(), *m = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddStringToObject(m, "id", s->name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddStringToObject(m, "owned_by", "ctrl");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), m);
        return reply(c, 200, o);
    }
    if (!post) return error(c, 404, "no such endpoint");
    if (b->too_big) return error(c, 413, "request body too large");
    if (!strcmp(url, "/update_weights")) {
        char err[512];
        const int n = serve_update_weights(s->model, b->data ? b->data : "", b->len, err, sizeof err);
        if (n < 0) return error(c, 400, err);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "updated", n);
        return reply(c, 200, o);
    }
    cJSON *in = b->len ? cJSON_ParseWithLength(b->data, b->len) : cJSON_CreateObject();
    enum MHD_Result ret;
    if (!cJSON_IsObject(in))
        ret = error(c, 400, "the body is not a JSON object");
    else if (!strcmp(url, "/generate"))
        ret = generate(s, c, in, 0);
    else if (!strcmp(url, "/v1/completions"))
        ret = generate(s, c, in, 1);
    else if (!strcmp(url, "/sleep") || !strcmp(url, "/wake_up") || !strcmp(url, "/reset_prefix_cache")) {
        const cJSON *lv = cJSON_GetObjectItemCaseSensitive(in, "level");
        ctrl_status st = url[1] == 's' ? ctrl_engine_sleep(s->eng, cJSON_IsNumber(lv) ? lv->valueint : 1)
                         : url[1] == 'w'
                             ? ctrl_engine_wake_up(s->eng)
                             : CTRL_OK; /* no prefix cache across requests yet: nothing to reset */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", "ok");
        ret = st == CTRL_OK ? reply(c, 200, o) : (cJSON_Delete(o), error(c, 400, ctrl_error_message()));
    } else {
        ret = error(c, 404, "no such endpoint");
    }
    cJSON_Delete(in);
    return ret;
}

static void finished(void *cls, struct MHD_Connection *c, void **state,
                     enum MHD_RequestTerminationCode code) {
    (void)cls, (void)c, (void)code;
    body *b = *state;
    if (b) free(b->data), free(b);
    *state = NULL;
}

static int run_serve(ctrl_cli *cli, int argc, char **argv) {
    (void)cli;
    const char *dir = NULL, *host = "127.0.0.1";
    long port = 8000, kv_mb = 256, body_kb = 1024;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return cli_usage_error(&cli_cmd_serve, "%s needs a value", k);
        i++;
        if (!strcmp(k, "--model"))
            dir = v;
        else if (!strcmp(k, "--host"))
            host = v;
        else if (!strcmp(k, "--port"))
            port = atol(v);
        else if (!strcmp(k, "--kv-cache-mb"))
            kv_mb = atol(v);
        else if (!strcmp(k, "--max-body-kb"))
            body_kb = atol(v);
        else
            return cli_usage_error(&cli_cmd_serve, "unexpected argument '%s'", k);
    }
    if (!dir) return cli_usage_error(&cli_cmd_serve, "needs --model DIR");
    if (port < 1 || port > 65535 || kv_mb < 1 || body_kb < 1)
        return cli_usage_error(&cli_cmd_serve, "--port 1..65535, --kv-cache-mb and --max-body-kb >= 1");
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
        return cli_usage_error(&cli_cmd_serve, "--host %s: not an IPv4 address", host);
    server s = {.name = dir, .max_body = (size_t)body_kb << 10};
    ctrl_status st = ctrl_model_load(dir, NULL, &s.model);
    if (st == CTRL_OK) st = ctrl_tokenizer_load(dir, &s.tok);
    const ctrl_engine_config ec = {(size_t)kv_mb << 20, 16, 256, 8192};
    if (st == CTRL_OK) st = ctrl_engine_create(s.model, &ec, &s.eng);
    if (st == CTRL_OK) s.n_stop = ctrl_generation_stop_ids(dir, s.tok, s.stops, 16);
    struct MHD_Daemon *d = NULL;
    if (st == CTRL_OK) {
        d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, (uint16_t)port, NULL, NULL,
                             handle, &s, MHD_OPTION_SOCK_ADDR, &addr, MHD_OPTION_NOTIFY_COMPLETED, finished,
                             NULL, MHD_OPTION_END);
        if (!d) st = ctrl_error_set(CTRL_ERR_IO, "serve: cannot listen on %s:%ld", host, port);
    }
    if (st == CTRL_OK) {
        CTRL_INFO(
            "serving %s on http://%s:%ld (GET /health, /v1/models; POST /generate, /v1/completions, /sleep, "
            "/wake_up, /reset_prefix_cache)",
            dir, host, port);
        while (!cli_interrupted()) usleep(100 * 1000);
        MHD_stop_daemon(d);
        CTRL_INFO("serve: stopped");
    }
    ctrl_engine_free(s.eng);
    ctrl_tokenizer_free(s.tok);
    ctrl_model_free(s.model);
    return st == CTRL_OK ? 0 : cli_fail(st);
}

const ctrl_command cli_cmd_serve = {
    .name = "serve",
    .summary = "serve generation over HTTP (TRL vllm-serve /generate, OpenAI /v1/completions)",
    .usage =
        "usage: ctrl serve --model DIR [--host 127.0.0.1] [--port 8000] [--kv-cache-mb N] [--max-body-kb "
        "N]\n\n"
        "GET /health, GET /v1/models; POST /generate {\"prompts\": [...] | \"prompt_token_ids\": [[...]], "
        "n,\n"
        "temperature, top_p, top_k, min_p, repetition_penalty, max_tokens, seed} -> {prompt_ids,\n"
        "completion_ids, logprobs}; POST /v1/completions (non-streaming); POST /sleep {\"level\": 1|2},\n"
        "/wake_up, /reset_prefix_cache. Unknown fields and bad JSON are 400, oversized bodies 413.\n"
        "SIGINT/SIGTERM stop it.\n",
    .run = run_serve,
};
