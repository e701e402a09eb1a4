/* vLLM's NCCL weight-transfer engine in ctrl serve, under the CUDA emulator (label cuda-emu): a
 * server on the emulated CUDA device (--device cuda, CTRL_CUDA_LIBRARY) joins the group of a C
 * trainer (weight_trainer.c: torch's TCPStore protocol, the unique id pickled as vLLM does, the
 * emulated NCCL that CTRL_NCCL_LIBRARY names) through the HTTP calls TRL's VLLMClient makes, and
 * receives new weights as vLLM's packed and unpacked broadcasts; afterwards its greedy tokens,
 * log-probabilities and prompt log-probabilities equal those of a server started from the new
 * weights. Bad input is an error in OpenAI's shape and never a hang: an update before the group,
 * a bad init_info, an unreachable trainer, a tensor the model cannot take (received and dropped,
 * the group kept), an update_info whose layout cannot be matched (the group closed, the trainer's
 * broadcast fails instead of hanging), a trainer gone mid-transfer, and no data within
 * --weight-transfer-timeout-s; each leaves the model unchanged. */
#include <arpa/inet.h>
#include <cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "model/safetensors.h"
#include "net/http_client.h"
#include "free_port.h"
#include "serve/serve.h"
#include "test.h"
#include "test_registry.h"
#include "weight_trainer.h"

static volatile int stop_now;
static int should_stop(void) { return stop_now; }
static char base[64], dir_a[512], dir_b[600], dir_b16[620];
static ctrl_serve_options opt;
static ctrl_registry *reg;
static pthread_t server_thread;
static int made;

static void *serve_main(void *arg) {
    (void)arg;
    if (ctrl_serve_run(&opt, reg, should_stop) != CTRL_OK)
        fprintf(stderr, "serve: %s\n", ctrl_error_message());
    return NULL;
}

/* Models A (served first) and B (the new weights, B16: B saved in bf16, what the trainer sends). */
static int make_models(void) {
    if (made) return made > 0;
    made = -1;
    snprintf(dir_a, sizeof dir_a, "%s/a", test_tmp_dir());
    snprintf(dir_b, sizeof dir_b, "%s/b", dir_a);
    snprintf(dir_b16, sizeof dir_b16, "%s16", dir_b);
    char cmd[4096];
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd,
                 "%s/ctrl model init --arch qwen3 --hidden 64 --layers 2 --heads 4 --kv-heads 2 --seed %d "
                 "--tokenizer %s/tokenizer/tiny_bpe --out %s >/dev/null",
                 CTRL_BINARY_DIR, i + 1, CTRL_FIXTURE_DIR, i ? dir_b : dir_a);
        if (system(cmd) != 0) return test_fail_at(__FILE__, __LINE__, "%s failed", cmd), 0;
    }
    snprintf(cmd, sizeof cmd, "%s/ctrl model convert --model %s --out %s --dtype bf16 >/dev/null",
             CTRL_BINARY_DIR, dir_b, dir_b16);
    if (system(cmd) != 0) return test_fail_at(__FILE__, __LINE__, "%s failed", cmd), 0;
    made = 1;
    return 1;
}

static void server_stop(void) {
    if (!base[0]) return;
    stop_now = 1;
    pthread_join(server_thread, NULL);
    base[0] = '\0', stop_now = 0;
}

/* A server of `dir` on the emulated CUDA device. */
static int server_start(const char *dir) {
    if (!make_models()) return 0;
    if (!reg) reg = test_plugin_registry();
    ctrl_serve_options_default(&opt);
    opt.model_dir = dir, opt.port = free_port(), opt.kv_cache_bytes = (size_t)8 << 20;
    opt.device = "cuda", opt.weight_transfer_timeout_s = 3;
    snprintf(base, sizeof base, "http://127.0.0.1:%d", opt.port);
    pthread_create(&server_thread, NULL, serve_main, NULL);
    for (int i = 0; i < 400; i++) {
        ctrl_http_response r = {0};
        const int up = ctrl_http_get(base, "/health", 2, &r) == CTRL_OK && r.status == 200;
        ctrl_http_response_free(&r);
        if (up) return 1;
        usleep(50 * 1000);
    }
    test_fail_at(__FILE__, __LINE__, "ctrl serve --device cuda (emulated) did not start");
    server_stop();
    return 0;
}

static int server_up(void) {
    return base[0] || server_start(dir_a[0] ? dir_a : (make_models() ? dir_a : ""));
}

__attribute__((destructor)) static void server_down(void) { server_stop(); }

/* POST (JSON) or GET; the parsed response, its status in *status. */
static cJSON *call(const char *method, const char *path, const char *body, int *status) {
    ctrl_http_response r = {0};
    const ctrl_status st = strcmp(method, "POST") ? ctrl_http_get(base, path, 60, &r)
                                                  : ctrl_http_post(base, path, "application/json", body,
                                                                   strlen(body), NULL, 60, &r);
    CHECK_MSG(st == CTRL_OK, "%s %s: %s", method, path, ctrl_error_message());
    *status = r.status;
    cJSON *o = r.body ? cJSON_Parse(r.body) : NULL;
    ctrl_http_response_free(&r);
    return o;
}

/* The status of POST path body; an error's message into msg (when not NULL). */
static int post(const char *path, const char *body, char *msg, size_t cap) {
    int status = 0;
    cJSON *o = call("POST", path, body, &status);
    const cJSON *e =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "error"), "message");
    if (status != 200)
        CHECK_MSG(cJSON_IsString(e), "POST %s: HTTP %d without an OpenAI-shaped error", path, status);
    if (status == 200) CHECK_MSG(cJSON_GetObjectItemCaseSensitive(o, "message"), "POST %s: no message", path);
    if (msg) snprintf(msg, cap, "%s", cJSON_IsString(e) ? e->valuestring : "");
    cJSON_Delete(o);
    return status;
}

/* A POST in a thread (the trainer broadcasts while the server's handler receives). */
typedef struct {
    pthread_t t;
    char path[64], *body, msg[1024];
    int status;
} async_post;

static void *post_main(void *arg) {
    async_post *a = arg;
    a->status = post(a->path, a->body, a->msg, sizeof a->msg);
    return NULL;
}

static void post_start(async_post *a, const char *path, char *body) {
    snprintf(a->path, sizeof a->path, "%s", path);
    a->body = body, a->status = 0, a->msg[0] = '\0';
    pthread_create(&a->t, NULL, post_main, a);
}

static int post_wait(async_post *a) {
    pthread_join(a->t, NULL);
    free(a->body);
    return a->status;
}

/* What the tests compare: greedy tokens with their log-probs, and the prompt's log-probs. */
typedef struct {
    int n;
    int ids[16];
    double lp[16], plp[16];
    int np;
} outputs;

static outputs generate(void) {
    outputs o = {0};
    int status = 0;
    cJSON *r =
        call("POST", "/v1/completions",
             "{\"prompt\": \"hello world, this is\", \"max_tokens\": 6, \"temperature\": 0, \"logprobs\": 0, "
             "\"prompt_logprobs\": 0, \"return_token_ids\": true}",
             &status);
    CHECK_MSG(status == 200, "completions: HTTP %d", status);
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "choices"), 0);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(ch, "token_ids"),
                *lps = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ch, "logprobs"),
                                                        "token_logprobs"),
                *plp = cJSON_GetObjectItemCaseSensitive(ch, "prompt_logprobs");
    for (const cJSON *i = ids ? ids->child : NULL, *l = lps ? lps->child : NULL; i && l && o.n < 16;
         i = i->next, l = l->next, o.n++)
        o.ids[o.n] = i->valueint, o.lp[o.n] = l->valuedouble;
    for (const cJSON *p = plp ? plp->child : NULL; p && o.np < 16; p = p->next) {
        if (cJSON_IsNull(p)) continue;
        o.plp[o.np++] = cJSON_GetObjectItemCaseSensitive(p->child, "logprob")->valuedouble;
    }
    CHECK_MSG(o.n == 6 && o.np >= 3, "completions: %d tokens, %d prompt log-probs", o.n, o.np);
    cJSON_Delete(r);
    return o;
}

/* The largest difference between two outputs (1e9 when the tokens differ). */
static double differ(const outputs *a, const outputs *b) {
    if (a->n != b->n || a->np != b->np) return 1e9;
    double worst = 0;
    for (int i = 0; i < a->n; i++) {
        if (a->ids[i] != b->ids[i]) return 1e9;
        worst = fmax(worst, fabs(a->lp[i] - b->lp[i]));
    }
    for (int i = 0; i < a->np; i++) worst = fmax(worst, fabs(a->plp[i] - b->plp[i]));
    return worst;
}

/* A group with a fresh trainer: its store, POST /init_weight_transfer_engine, NCCL as rank 0. */
static wt_trainer *group(int packed, long buffer_bytes) {
    int port = 0;
    wt_trainer *t = wt_trainer_start(&port);
    CHECK_MSG(t != NULL, "the trainer's store did not start");
    if (!t) return NULL;
    char *body = malloc(512);
    snprintf(body, 512,
             "{\"init_info\": {\"master_address\": \"127.0.0.1\", \"master_port\": %d, \"rank_offset\": 1, "
             "\"world_size\": 2, \"packed\": %s, \"packed_buffer_size_bytes\": %ld}}",
             port, packed ? "true" : "false", buffer_bytes);
    async_post a;
    post_start(&a, "/init_weight_transfer_engine", body);
    const int joined = wt_trainer_join(t, 2, 30);
    const int status = post_wait(&a);
    CHECK_MSG(joined == 0 && status == 200, "init: trainer %d, HTTP %d %s", joined, status, a.msg);
    return t;
}

/* The tensors of B16 as the trainer holds them: names, values (fp32 holding bf16 values), shapes. */
typedef struct {
    int n;
    char name[64][256];
    float *val[64];
    int64_t numel[64];
    int ndim[64];
    int64_t shape[64][2];
} weights;

static weights *load_b16(void) {
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir_b16);
    ctrl_safetensors *st = NULL;
    CHECK_MSG(ctrl_safetensors_open(path, &st) == CTRL_OK, "%s: %s", path, ctrl_error_message());
    if (!st) return NULL;
    weights *w = calloc(1, sizeof *w);
    for (int i = 0; i < ctrl_safetensors_count(st) && w->n < 64; i++, w->n++) {
        const ctrl_st_tensor *t = ctrl_safetensors_at(st, i);
        snprintf(w->name[w->n], sizeof w->name[0], "%s", t->name);
        w->ndim[w->n] = t->ndim;
        w->numel[w->n] = 1;
        for (int d = 0; d < t->ndim; d++) w->shape[w->n][d] = t->shape[d], w->numel[w->n] *= t->shape[d];
        w->val[w->n] = malloc((size_t)w->numel[w->n] * 4);
        ctrl_safetensors_read_f32(st, t->name, w->val[w->n], w->numel[w->n]);
    }
    ctrl_safetensors_close(st);
    return w;
}

static void weights_free(weights *w) {
    for (int i = 0; w && i < w->n; i++) free(w->val[i]);
    free(w);
}

/* Tensor i as `dtype` bytes (bf16: the top half of each float, exact for B16's values). */
static void *as_bytes(const weights *w, int i, int bf16, size_t *bytes) {
    *bytes = (size_t)w->numel[i] * (bf16 ? 2 : 4);
    unsigned char *b = malloc(*bytes ? *bytes : 1);
    for (int64_t k = 0; k < w->numel[i]; k++) {
        uint32_t u;
        memcpy(&u, &w->val[i][k], 4);
        if (bf16)
            b[2 * k] = (unsigned char)(u >> 16), b[2 * k + 1] = (unsigned char)(u >> 24);
        else
            memcpy(b + 4 * k, &u, 4);
    }
    return b;
}

/* The update_info JSON of tensors idx[n] (bf16 for odd positions), `extra` fields appended. */
static char *update_info(const weights *w, const int *idx, int n, const char *names_override,
                         const char *extra) {
    cJSON *o = cJSON_CreateObject(), *ui = cJSON_AddObjectToObject(o, "update_info");
    cJSON *names = cJSON_AddArrayToObject(ui, "names"), *dts = cJSON_AddArrayToObject(ui, "dtype_names"),
          *shapes = cJSON_AddArrayToObject(ui, "shapes");
    for (int j = 0; j < n; j++) {
        const int i = idx[j];
        cJSON_AddItemToArray(names,
                             cJSON_CreateString(j == 0 && names_override ? names_override : w->name[i]));
        cJSON_AddItemToArray(dts, cJSON_CreateString(j % 2 ? "bfloat16" : "float32"));
        cJSON *sh = cJSON_CreateArray();
        for (int d = 0; d < w->ndim[i]; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)w->shape[i][d]));
        cJSON_AddItemToArray(shapes, sh);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (extra) { /* spliced before the update_info's closing brace */
        char *t = malloc(strlen(s) + strlen(extra) + 4);
        sprintf(t, "%.*s, %s}}", (int)strlen(s) - 2, s, extra);
        free(s);
        s = t;
    }
    return s;
}

/* The trainer's side of an update of idx[n]: packed as vLLM's producer (chunks ending with the
 * tensor that takes them past buffer_bytes) or one broadcast per tensor; stops after `stop_after`
 * broadcasts (-1: none) -- a trainer dying there. The first failing broadcast's result. */
static ncclResult_t broadcast(wt_trainer *t, const weights *w, const int *idx, int n, int packed,
                              long buffer_bytes, int stop_after) {
    ncclResult_t r = ncclSuccess;
    int sent = 0;
    unsigned char *chunk = NULL;
    size_t fill = 0;
    for (int j = 0; j < n && r == ncclSuccess; j++) {
        size_t bytes = 0;
        void *b = as_bytes(w, idx[j], j % 2, &bytes);
        if (!packed) {
            if (sent++ == stop_after) return free(b), ncclSuccess;
            r = ncclBroadcast(b, b, (size_t)w->numel[idx[j]], j % 2 ? ncclBfloat16 : ncclFloat32, 0,
                              wt_trainer_comm(t), NULL);
        } else {
            chunk = realloc(chunk, fill + bytes + 1);
            memcpy(chunk + fill, b, bytes);
            fill += bytes;
            if ((long)fill > buffer_bytes || j == n - 1) {
                if (sent++ == stop_after) return free(b), free(chunk), ncclSuccess;
                r = ncclBroadcast(chunk, chunk, fill, ncclUint8, 0, wt_trainer_comm(t), NULL);
                fill = 0;
            }
        }
        free(b);
    }
    free(chunk);
    return r;
}

static outputs before, after;
static int have_after;

/* A case's start: the server, B16's tensors and a fresh group; 0 (after a failed CHECK) if not. */
static int setup(int packed, long buffer_bytes, weights **w, wt_trainer **t) {
    *w = NULL, *t = NULL;
    if (!server_up() || !(*w = load_b16())) return 0;
    if (!(*t = group(packed, buffer_bytes))) return weights_free(*w), *w = NULL, 0;
    return 1;
}

/* The model still gives `after` (a refused or failed update changed nothing). */
static void unchanged(const char *what) {
    const outputs now = generate();
    CHECK_MSG(!have_after || differ(&after, &now) == 0, "%s changed the model", what);
}

TEST(server_info_names_the_nccl_engine) {
    if (!server_up()) return;
    int status = 0;
    cJSON *o = call("GET", "/server_info", NULL, &status);
    const cJSON *wtc = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "vllm_config"),
                                                        "weight_transfer_config");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(wtc, "backend");
    CHECK_MSG(status == 200 && cJSON_IsString(b) && !strcmp(b->valuestring, "nccl"),
              "server_info: weight_transfer_config is not {\"backend\": \"nccl\"}");
    cJSON_Delete(o);
    o = call("GET", "/get_world_size", NULL, &status);
    CHECK_EQ_INT(cJSON_GetObjectItemCaseSensitive(o, "world_size")->valueint, 1);
    cJSON_Delete(o);
    before = generate();
}

TEST(update_before_init_is_refused) {
    if (!server_up()) return;
    char msg[1024];
    CHECK_EQ_INT(post("/update_weights",
                      "{\"update_info\": {\"names\": [], \"dtype_names\": [], \"shapes\": []}}", msg,
                      sizeof msg),
                 409);
    CHECK_CONTAINS(msg, "POST /init_weight_transfer_engine first");
    CHECK_EQ_INT(post("/start_weight_update", "{}", msg, sizeof msg), 409);
    CHECK_EQ_INT(post("/finish_weight_update", "{}", msg, sizeof msg), 409);
}

TEST(bad_init_info_is_refused) {
    if (!server_up()) return;
    static const struct {
        const char *body, *want;
        int status;
    } cases[] = {
        {"{}", "init_info: missing", 400},
        {"{\"init_info\": {\"master_port\": 5, \"rank_offset\": 1, \"world_size\": 2}}", "master_address",
         400},
        {"{\"init_info\": {\"master_address\": \"127.0.0.1\", \"master_port\": 70000, \"rank_offset\": 1, "
         "\"world_size\": 2}}",
         "master_port", 400},
        {"{\"init_info\": {\"master_address\": \"127.0.0.1\", \"master_port\": 5, \"rank_offset\": 1, "
         "\"world_size\": 3}}",
         "rank_offset + 1", 400},
        {"{\"init_info\": {\"master_address\": \"127.0.0.1\", \"master_port\": 5, \"rank_offset\": 1, "
         "\"world_size\": 2, \"bogus\": 1}}",
         "init_info.bogus: unknown field", 400},
    };
    char msg[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_EQ_INT(post("/init_weight_transfer_engine", cases[i].body, msg, sizeof msg), cases[i].status);
        CHECK_CONTAINS(msg, cases[i].want);
    }
    /* nobody at the trainer's address: an error after --weight-transfer-timeout-s (3 s), not a hang */
    char body[256];
    snprintf(body, sizeof body,
             "{\"init_info\": {\"master_address\": \"127.0.0.1\", \"master_port\": %d, \"rank_offset\": 1, "
             "\"world_size\": 2}}",
             free_port());
    const time_t t0 = time(NULL);
    CHECK_EQ_INT(post("/init_weight_transfer_engine", body, msg, sizeof msg), 500);
    CHECK_CONTAINS(msg, "did not answer within 3 s");
    CHECK(time(NULL) - t0 <= 10);
}

TEST(packed_update_changes_the_model) {
    if (!server_up()) return;
    weights *w = load_b16();
    if (!w) return;
    wt_trainer *t = group(1, 20000); /* 20 kB chunks: several per update */
    if (!t) return weights_free(w);
    int idx[64];
    for (int i = 0; i < w->n; i++) idx[i] = i;
    char msg[1024];
    CHECK_EQ_INT(post("/start_weight_update", "{}", msg, sizeof msg), 200);
    async_post a;
    post_start(&a, "/update_weights", update_info(w, idx, w->n, NULL, NULL));
    CHECK_EQ_INT(broadcast(t, w, idx, w->n, 1, 20000, -1), ncclSuccess);
    CHECK_MSG(post_wait(&a) == 200, "update_weights: HTTP %d %s", a.status, a.msg);
    CHECK_EQ_INT(post("/finish_weight_update", "{}", msg, sizeof msg), 200);
    after = generate();
    have_after = 1;
    CHECK_MSG(differ(&before, &after) > 1e-3, "the update changed nothing");
    /* an unpacked update of two tensors with their current values: nothing changes */
    post_start(&a, "/update_weights", update_info(w, idx, 2, NULL, "\"packed\": false"));
    CHECK_EQ_INT(broadcast(t, w, idx, 2, 0, 0, -1), ncclSuccess);
    CHECK_MSG(post_wait(&a) == 200, "unpacked update_weights: HTTP %d %s", a.status, a.msg);
    outputs again = generate();
    CHECK_MSG(differ(&after, &again) == 0, "the same weights gave other outputs (%g)",
              differ(&after, &again));
    wt_trainer_free(t);
    weights_free(w);
}

/* A tensor the model cannot take: the update is received whole, refused, and the group stays. */
TEST(tensors_the_model_cannot_take_are_drained_and_refused) {
    weights *w;
    wt_trainer *t;
    if (!setup(0, 1 << 30, &w, &t)) return;
    int idx[3] = {0, 1, 2};
    static const struct {
        const char *name, *extra, *want;
    } cases[] = {
        {"model.layers.9.mlp.up_proj.weight", NULL, "is not a parameter of this model"},
        {NULL, "\"shapes\": [[3, 3], [1], [1]]", "does not have the model's shape"}, /* replaced below */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *body = update_info(w, idx, 3, cases[c].name, NULL);
        if (cases[c].extra) { /* the first tensor's shape made wrong */
            cJSON *o = cJSON_Parse(body);
            cJSON *sh = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(
                                               cJSON_GetObjectItemCaseSensitive(o, "update_info"), "shapes"),
                                           0);
            cJSON_ReplaceItemInArray(sh, 0, cJSON_CreateNumber(w->shape[0][0] + 1));
            free(body);
            body = cJSON_PrintUnformatted(o);
            cJSON_Delete(o);
            /* the trainer sends what the update_info says: one row more */
            w->shape[0][0]++, w->numel[0] += w->ndim[0] > 1 ? w->shape[0][1] : 1;
            w->val[0] = realloc(w->val[0], (size_t)w->numel[0] * 4);
            memset(w->val[0] + w->numel[0] - (w->ndim[0] > 1 ? w->shape[0][1] : 1), 0,
                   (size_t)(w->ndim[0] > 1 ? w->shape[0][1] : 1) * 4);
        }
        async_post a;
        post_start(&a, "/update_weights", body);
        CHECK_EQ_INT(broadcast(t, w, idx, 3, 0, 0, -1), ncclSuccess);
        CHECK_EQ_INT(post_wait(&a), 400);
        CHECK_CONTAINS(a.msg, cases[c].want);
        CHECK_CONTAINS(a.msg, "the model is unchanged");
    }
    unchanged("a refused update");
    /* the group still works */
    char msg[1024];
    CHECK_EQ_INT(post("/start_weight_update", "{}", msg, sizeof msg), 200);
    CHECK_EQ_INT(post("/finish_weight_update", "{}", msg, sizeof msg), 200);
    wt_trainer_free(t);
    weights_free(w);
}

/* An update_info whose bytes cannot be matched closes the group; the trainer's broadcast fails. */
TEST(unknown_layout_closes_the_group) {
    weights *w;
    wt_trainer *t;
    if (!setup(0, 1 << 30, &w, &t)) return;
    int idx[2] = {0, 1};
    char *body = update_info(w, idx, 2, NULL, NULL);
    char *f = strstr(body, "\"float32\"");
    memcpy(f, "\"float99\"", 9);
    char msg[1024];
    CHECK_EQ_INT(post("/update_weights", body, msg, sizeof msg), 400);
    free(body);
    CHECK_CONTAINS(msg, "float99");
    CHECK_CONTAINS(msg, "the NCCL group was closed");
    CHECK(broadcast(t, w, idx, 2, 0, 0, -1) != ncclSuccess); /* an error, not a hang */
    CHECK_EQ_INT(post("/start_weight_update", "{}", msg, sizeof msg), 409);
    CHECK_CONTAINS(msg, "the last one was closed");
    wt_trainer_free(t);
    weights_free(w);
}

TEST(trainer_gone_mid_transfer) {
    weights *w;
    wt_trainer *t;
    if (!setup(0, 1 << 30, &w, &t)) return;
    int idx[3] = {0, 1, 2};
    async_post a;
    post_start(&a, "/update_weights", update_info(w, idx, 3, NULL, NULL));
    broadcast(t, w, idx, 3, 0, 0, 1); /* one tensor, then the trainer dies */
    wt_trainer_free(t);
    CHECK_EQ_INT(post_wait(&a), 500);
    CHECK_CONTAINS(a.msg, "gone");
    CHECK_CONTAINS(a.msg, "the model is unchanged");
    unchanged("a failed update");
    weights_free(w);
}

TEST(no_data_times_out) {
    weights *w;
    wt_trainer *t;
    if (!setup(1, 1 << 30, &w, &t)) return;
    int idx[2] = {0, 1};
    const time_t t0 = time(NULL);
    char msg[1024];
    char *body = update_info(w, idx, 2, NULL, NULL);
    CHECK_EQ_INT(post("/update_weights", body, msg, sizeof msg), 504); /* the trainer never broadcasts */
    free(body);
    CHECK_CONTAINS(msg, "no data from the trainer for 3 s");
    CHECK(time(NULL) - t0 <= 12);
    unchanged("a timed-out update");
    wt_trainer_free(t);
    weights_free(w);
}

/* ctrl's own update on the device: A's safetensors bring `before` back, B16's give `after`. */
TEST(safetensors_updates_on_the_device_agree) {
    if (!server_up() || !have_after) TEST_SKIP("the update case did not run");
    const char *dirs[2] = {dir_a, dir_b16};
    const outputs *want[2] = {&before, &after};
    for (int i = 0; i < 2; i++) {
        char path[700];
        snprintf(path, sizeof path, "%s/model.safetensors", dirs[i]);
        FILE *f = fopen(path, "rb");
        CHECK_MSG(f != NULL, "%s", path);
        if (!f) return;
        fseek(f, 0, SEEK_END);
        const long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *body = malloc((size_t)n);
        const size_t got = fread(body, 1, (size_t)n, f);
        fclose(f);
        ctrl_http_response r = {0};
        const ctrl_status st =
            ctrl_http_post(base, "/update_weights", "application/octet-stream", body, got, NULL, 60, &r);
        CHECK_MSG(st == CTRL_OK && r.status == 200, "safetensors /update_weights: HTTP %d %s", r.status,
                  r.body ? r.body : "");
        ctrl_http_response_free(&r);
        free(body);
        const outputs now = generate();
        CHECK_MSG(differ(want[i], &now) == 0, "after %s's safetensors: differs by %g", dirs[i],
                  differ(want[i], &now));
    }
}

/* The CLI's flags: vLLM's --weight-transfer-config is NCCL's only, and needs --device cuda. */
TEST(serve_flags_are_checked) {
    static const struct {
        const char *flags, *want;
    } cases[] = {
        {"--weight-transfer-config '{\"backend\": \"nccl\"}'", "needs --device cuda"},
        {"--device cuda --weight-transfer-config '{\"backend\": \"ipc\"}'", "engine is NCCL's"},
        {"--device cuda --weight-transfer-config nccl", "engine is NCCL's"},
        {"--weight-transfer-timeout-s 0", "--weight-transfer-timeout-s 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[1024], out[700];
        snprintf(out, sizeof out, "%s/flags.txt", test_tmp_dir());
        snprintf(cmd, sizeof cmd, "%s/ctrl serve --model /nonexistent %s >%s 2>&1", CTRL_BINARY_DIR,
                 cases[i].flags, out);
        const int rc = system(cmd);
        CHECK_MSG(rc != 0, "%s: accepted", cases[i].flags);
        FILE *f = fopen(out, "rb");
        char text[2048] = "";
        if (f) text[fread(text, 1, sizeof text - 1, f)] = '\0', fclose(f);
        CHECK_CONTAINS(text, cases[i].want);
    }
}

/* Last: the updated server's outputs against a server started from the new weights. */
TEST(same_outputs_as_a_server_started_from_the_new_weights) {
    if (!have_after) TEST_SKIP("the update case did not run");
    server_stop();
    if (!server_start(dir_b16)) return;
    const outputs fresh = generate();
    const double d = differ(&after, &fresh);
    printf("  updated over NCCL vs started from the new weights: largest log-prob difference %g\n", d);
    CHECK_MSG(d <= 1e-6, "the updated server differs from one started from the new weights by %g", d);
}
