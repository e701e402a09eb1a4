/* ctrl serve --model DIR [--host 127.0.0.1] [--port 8000] [--kv-cache-mb N] [--max-body-kb N]
 *            [--kv-cache-dtype fp32|bf16]
 *            [--api-key KEY]
 * HTTP (libmicrohttpd, a thread per connection) over the generation engine: GET /health,
 * /v1/models; POST /generate (shaped like TRL's vllm-serve), /v1/completions and
 * /v1/chat/completions (OpenAI, with SSE streaming; serve_generate.c), /update_weights (a
 * safetensors body; serve_weights.c), /sleep, /wake_up, /reset_prefix_cache. Concurrent requests
 * are batched into the same generations, joining one that runs (serve_batch.c); finished prompts stay in a
 * prefix cache, emptied when the weights change. With an API key (or CTRL_API_KEY) every endpoint but /health
 * wants `Authorization: Bearer KEY`. SIGINT/SIGTERM stop accepting connections, let the requests in
 * flight finish, and exit 0. */
#include <arpa/inet.h>
#include <cJSON.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "serve.h"
#include "serve_weights.h"
#include "tokenizer/tokenizer.h"

typedef struct body {
    char *data;
    size_t len;
    int too_big;
} body;

/* Server-wide state the daemon's callbacks share: the API key, and the requests in flight (a
 * drain waits for them). */
typedef struct daemon_state {
    server *s;
    const char *api_key;
    int in_flight;
    pthread_mutex_t lock;
} daemon_state;

static int authorized(const daemon_state *d, struct MHD_Connection *c) {
    if (!d->api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    return h && !strncmp(h, "Bearer ", 7) && !strcmp(h + 7, d->api_key);
}

static enum MHD_Result route(server *s, struct MHD_Connection *c, const char *url, const body *b) {
    if (!strcmp(url, "/update_weights")) {
        char err[512];
        pthread_mutex_lock(&s->engine_lock); /* between generations, never during one */
        const int n = serve_update_weights(s->model, b->data ? b->data : "", b->len, err, sizeof err);
        if (n > 0) ctrl_engine_reset_prefix_cache(s->eng); /* cached K/V were computed with the old weights */
        pthread_mutex_unlock(&s->engine_lock);
        if (n < 0) return serve_error(c, 400, err);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "updated", n);
        return serve_reply(c, 200, o);
    }
    cJSON *in = b->len ? cJSON_ParseWithLength(b->data, b->len) : cJSON_CreateObject();
    enum MHD_Result ret;
    if (!cJSON_IsObject(in))
        ret = serve_error(c, 400, "the body is not a JSON object");
    else if (!strcmp(url, "/generate"))
        ret = serve_generate(s, c, in, SERVE_TRL);
    else if (!strcmp(url, "/v1/completions"))
        ret = serve_generate(s, c, in, SERVE_COMPLETIONS);
    else if (!strcmp(url, "/v1/chat/completions"))
        ret = serve_generate(s, c, in, SERVE_CHAT);
    else if (!strcmp(url, "/sleep") || !strcmp(url, "/wake_up") || !strcmp(url, "/reset_prefix_cache")) {
        const cJSON *lv = cJSON_GetObjectItemCaseSensitive(in, "level");
        pthread_mutex_lock(&s->engine_lock);
        ctrl_status st = url[1] == 's'   ? ctrl_engine_sleep(s->eng, cJSON_IsNumber(lv) ? lv->valueint : 1)
                         : url[1] == 'w' ? ctrl_engine_wake_up(s->eng)
                                         : (ctrl_engine_reset_prefix_cache(s->eng), CTRL_OK);
        pthread_mutex_unlock(&s->engine_lock);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", "ok");
        ret = st == CTRL_OK ? serve_reply(c, 200, o)
                            : (cJSON_Delete(o), serve_error(c, 400, ctrl_error_message()));
    } else {
        ret = serve_error(c, 404, "no such endpoint");
    }
    cJSON_Delete(in);
    return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version;
    daemon_state *d = cls;
    server *s = d->s;
    body *b = *state;
    if (!b) { /* first call: the headers */
        *state = calloc(1, sizeof(body));
        pthread_mutex_lock(&d->lock);
        d->in_flight++;
        pthread_mutex_unlock(&d->lock);
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
    if (get && !strcmp(url, "/health")) { /* with the batcher's counters */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", "ok");
        pthread_mutex_lock(&s->batch.lock);
        cJSON_AddNumberToObject(o, "generations", (double)s->batch.batches);
        cJSON_AddNumberToObject(o, "max_requests_per_generation", (double)s->batch.max_jobs);
        cJSON_AddNumberToObject(o, "prefix_cache_hits", (double)ctrl_engine_prefix_hits(s->eng));
        cJSON_AddNumberToObject(o, "joined_requests", (double)s->batch.joined);
        pthread_mutex_unlock(&s->batch.lock);
        pthread_mutex_lock(&d->lock);
        cJSON_AddNumberToObject(o, "requests_in_flight", d->in_flight - 1); /* not counting this one */
        pthread_mutex_unlock(&d->lock);
        return serve_reply(c, 200, o);
    }
    if (!authorized(d, c)) return serve_error(c, 401, "missing or wrong API key (Authorization: Bearer KEY)");
    if (get && !strcmp(url, "/v1/models")) {
        cJSON *o = cJSON_CreateObject(), *m = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON_AddStringToObject(m, "id", s->name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddStringToObject(m, "owned_by", "ctrl");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "data"), m);
        return serve_reply(c, 200, o);
    }
    if (!post) return serve_error(c, 404, "no such endpoint");
    if (b->too_big) return serve_error(c, 413, "request body too large");
    return route(s, c, url, b);
}

static void finished(void *cls, struct MHD_Connection *c, void **state,
                     enum MHD_RequestTerminationCode code) {
    (void)c, (void)code;
    daemon_state *d = cls;
    body *b = *state;
    if (b) {
        free(b->data), free(b);
        pthread_mutex_lock(&d->lock);
        d->in_flight--;
        pthread_mutex_unlock(&d->lock);
    }
    *state = NULL;
}

static int run_serve(ctrl_cli *cli, int argc, char **argv) {
    const char *dir = NULL, *host = "127.0.0.1", *api_key = getenv("CTRL_API_KEY");
    long port = 8000, kv_mb = 256, body_kb = 1024;
    int kv_bf16 = 0;
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
        else if (!strcmp(k, "--kv-cache-dtype") && (!strcmp(v, "fp32") || !strcmp(v, "bf16")))
            kv_bf16 = !strcmp(v, "bf16");
        else if (!strcmp(k, "--kv-cache-dtype"))
            return cli_usage_error(&cli_cmd_serve, "--kv-cache-dtype %s: fp32 or bf16", v);
        else if (!strcmp(k, "--max-body-kb"))
            body_kb = atol(v);
        else if (!strcmp(k, "--api-key"))
            api_key = v;
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
    pthread_mutex_init(&s.engine_lock, NULL);
    daemon_state ds = {.s = &s, .api_key = api_key && api_key[0] ? api_key : NULL};
    pthread_mutex_init(&ds.lock, NULL);
    ctrl_status st = ctrl_model_load(dir, NULL, &s.model);
    if (st == CTRL_OK) st = ctrl_tokenizer_load(dir, &s.tok);
    if (st == CTRL_OK && ctrl_tokenizer_chat_template(s.tok)) st = ctrl_chat_template_load(s.tok, &s.chat);
    const ctrl_engine_config ec = {.kv_cache_bytes = (size_t)kv_mb << 20,
                                   .block_size = 16,
                                   .max_num_seqs = 256,
                                   .max_num_batched_tokens = 8192,
                                   .prefix_cache = 1,
                                   .kv_cache_dtype = kv_bf16};
    ctrl_registry *reg = NULL;
    if (st == CTRL_OK) st = cli_plugins(cli, &reg);
    if (st == CTRL_OK) st = ctrl_engine_attach_attention(s.model, reg, NULL);
    if (st == CTRL_OK) st = ctrl_engine_create(s.model, &ec, &s.eng);
    if (st == CTRL_OK) s.n_stop = ctrl_generation_stop_ids(dir, s.tok, s.stops, 16);
    const int batching = st == CTRL_OK && (st = serve_batch_start(&s)) == CTRL_OK;
    struct MHD_Daemon *d = NULL;
    if (st == CTRL_OK) { /* a thread per connection: requests wait for the batcher side by side */
        d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                                 MHD_USE_ERROR_LOG,
                             (uint16_t)port, NULL, NULL, handle, &ds, MHD_OPTION_SOCK_ADDR, &addr,
                             MHD_OPTION_NOTIFY_COMPLETED, finished, &ds, MHD_OPTION_END);
        if (!d) st = ctrl_error_set(CTRL_ERR_IO, "serve: cannot listen on %s:%ld", host, port);
    }
    if (st == CTRL_OK) {
        CTRL_INFO("serving %s on http://%s:%ld (GET /health, /v1/models; POST /generate, /v1/completions, "
                  "/v1/chat/completions, /update_weights, /sleep, /wake_up, /reset_prefix_cache)%s",
                  dir, host, port, ds.api_key ? "; API key required" : "");
        while (!cli_interrupted()) usleep(100 * 1000);
        /* drain: no new connections; the requests in flight finish (60 s at most) */
        MHD_quiesce_daemon(d);
        for (int i = 0; i < 600; i++) {
            pthread_mutex_lock(&ds.lock);
            const int busy = ds.in_flight;
            pthread_mutex_unlock(&ds.lock);
            if (!busy) break;
            usleep(100 * 1000);
        }
        MHD_stop_daemon(d);
        CTRL_INFO("serve: stopped");
    }
    if (batching) serve_batch_stop(&s);
    ctrl_engine_free(s.eng);
    ctrl_template_free(s.chat);
    ctrl_tokenizer_free(s.tok);
    ctrl_model_free(s.model);
    return st == CTRL_OK ? 0 : cli_fail(st);
}

const ctrl_command cli_cmd_serve = {
    .name = "serve",
    .summary = "serve generation over HTTP (TRL vllm-serve /generate, OpenAI completions and chat, weights)",
    .usage =
        "usage: ctrl serve --model DIR [--host 127.0.0.1] [--port 8000] [--kv-cache-mb N] [--max-body-kb N]\n"
        "                  [--kv-cache-dtype fp32|bf16] [--api-key KEY]\n\n"
        "GET /health, GET /v1/models; POST /generate {\"prompts\": [...] | \"prompt_token_ids\": [[...]], "
        "n,\n"
        "temperature, top_p, top_k, min_p, repetition_penalty, max_tokens, seed} -> {prompt_ids,\n"
        "completion_ids, logprobs}; POST /v1/completions {prompt, ...} and /v1/chat/completions\n"
        "{messages, ...} (\"stream\": true for Server-Sent Events); POST /update_weights (a safetensors\n"
        "body of some or all parameters); POST /sleep {\"level\": 1|2}, /wake_up, /reset_prefix_cache.\n"
        "Unknown fields and bad JSON are 400, oversized bodies 413, a missing or wrong API key 401\n"
        "(--api-key or CTRL_API_KEY: Authorization: Bearer KEY on everything but /health).\n"
        "Binds to 127.0.0.1 unless --host says otherwise. SIGINT/SIGTERM stop accepting connections, let\n"
        "the requests in flight finish, and exit 0.\n",
    .run = run_serve,
};
