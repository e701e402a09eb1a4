/* ctrl serve against the clients TRL and OpenAI users run, over HTTP: the requests TRL 1.16's own
 * VLLMClient sends (recorded from the real client by tests/reference/capture_vllm_client.py into
 * tests/fixtures/serve/trl_vllm_client.json) are replayed against a server running in this process,
 * and every response field that client reads must be there with its type; then the OpenAI
 * semantics those clients rely on: log-probabilities consistent between generation, top entries
 * and prompt scoring, stop strings, seeds, errors in OpenAI's shape. (tests/interop/
 * check_vllm_client.py drives the real Python clients by hand; tests/cli/test_serve.sh covers the
 * drain and disconnects with curl.) The server also serves two LoRA adapters (--lora NAME=DIR):
 * chosen by the request's "model", listed in /v1/models, generating what `ctrl generate --adapter`
 * does, alone and side by side; and adapters loaded and unloaded while it serves (vLLM's
 * /v1/load_lora_adapter and /v1/unload_lora_adapter), with vLLM's answers and error codes. */
#include <arpa/inet.h>
#include <cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "model/lora.h"
#include "model/peft.h"
#include "net/http_client.h"
#include "free_port.h"
#include "serve/serve.h"
#include "test.h"
#include "test_registry.h"

static volatile int stop_now;
static int should_stop(void) { return stop_now; }
static char base[64];
static ctrl_serve_options opt;
static ctrl_registry *reg;
static pthread_t server_thread;
static char model_dir[512], lora_dir[2][600];
static const char *const lora_names[2] = {"alpha", "beta"};

/* Two random LoRA adapters (all-linear, r 4, both A and B non-zero) over the served model. */
static int make_adapters(void) {
    for (int i = 0; i < 2; i++) {
        static ctrl_lora_config lc;
        memset(&lc, 0, sizeof lc);
        lc.r = 4, lc.lora_alpha = 8, lc.init = CTRL_LORA_INIT_NONE, lc.seed = 100 + (uint64_t)i;
        ctrl_model *m = NULL;
        if (ctrl_lora_add_target(&lc, "all-linear", "test") != CTRL_OK ||
            ctrl_model_load_lora(model_dir, NULL, &lc, &m) != CTRL_OK)
            return 0;
        snprintf(lora_dir[i], sizeof lora_dir[i], "%s/lora_%s", test_tmp_dir(), lora_names[i]);
        const ctrl_status st = ctrl_peft_save(m, lora_dir[i], model_dir);
        ctrl_model_free(m);
        if (st != CTRL_OK) return 0;
        opt.lora_name[i] = lora_names[i], opt.lora_dir[i] = lora_dir[i];
    }
    opt.n_lora = 2;
    return 1;
}

static void *serve_main(void *arg) {
    (void)arg;
    ctrl_serve_run(&opt, reg, should_stop);
    return NULL;
}

/* The server (once per process): a tiny random qwen3 model with the tiny_bpe tokenizer (ChatML). */
static int server_up(void) {
    if (base[0]) return 1;
    snprintf(model_dir, sizeof model_dir, "%s/m", test_tmp_dir());
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s/ctrl model init --arch qwen3 --hidden 64 --layers 2 --heads 4 --kv-heads 2 --tokenizer "
             "%s/tokenizer/tiny_bpe --out %s >/dev/null",
             CTRL_BINARY_DIR, CTRL_FIXTURE_DIR, model_dir);
    if (system(cmd) != 0) {
        test_fail_at(__FILE__, __LINE__, "%s failed", cmd);
        return 0;
    }
    reg = test_plugin_registry();
    ctrl_serve_options_default(&opt);
    opt.model_dir = model_dir, opt.port = free_port(), opt.kv_cache_bytes = (size_t)32 << 20;
    opt.runtime_lora = 1; /* /v1/load_lora_adapter and /v1/unload_lora_adapter answer */
    if (!make_adapters()) {
        test_fail_at(__FILE__, __LINE__, "LoRA adapters for the server: %s", ctrl_error_message());
        return 0;
    }
    snprintf(base, sizeof base, "http://127.0.0.1:%d", opt.port);
    pthread_create(&server_thread, NULL, serve_main, NULL);
    for (int i = 0; i < 200; i++) {
        ctrl_http_response r = {0};
        const int up = ctrl_http_get(base, "/health", 2, &r) == CTRL_OK && r.status == 200;
        ctrl_http_response_free(&r);
        if (up) return 1;
        usleep(50 * 1000);
    }
    {
        test_fail_at(__FILE__, __LINE__, "ctrl serve did not start");
        return 0;
    }
}

__attribute__((destructor)) static void server_down(void) {
    if (!base[0]) return;
    stop_now = 1;
    pthread_join(server_thread, NULL);
}

/* POST (body not NULL) or GET; the parsed response (NULL when not JSON), its status in *status. */
static cJSON *call(const char *method, const char *path, const char *body, int *status) {
    ctrl_http_response r = {0};
    const ctrl_status st = strcmp(method, "POST")
                               ? ctrl_http_get(base, path, 30, &r)
                               : ctrl_http_post(base, path, "application/json", body ? body : "",
                                                body ? strlen(body) : 0, NULL, 30, &r);
    CHECK_MSG(st == CTRL_OK, "%s %s: %s", method, path, ctrl_error_message());
    *status = r.status;
    cJSON *o = r.body ? cJSON_Parse(r.body) : NULL;
    if (!o && r.status == 200) CHECK_MSG(0, "%s %s: not JSON: %.200s", method, path, r.body ? r.body : "");
    ctrl_http_response_free(&r);
    return o;
}

static cJSON *post_ok(const char *path, const char *body) {
    int status = 0;
    cJSON *o = call("POST", path, body, &status);
    char *txt = o ? cJSON_PrintUnformatted(o) : NULL;
    CHECK_MSG(status == 200, "POST %s %s: HTTP %d %.300s", path, body, status, txt ? txt : "");
    free(txt);
    return o;
}

static int has_type(const cJSON *v, const char *type) {
    if (!strcmp(type, "ints")) {
        if (!cJSON_IsArray(v)) return 0;
        for (const cJSON *e = v->child; e; e = e->next)
            if (!cJSON_IsNumber(e)) return 0;
        return 1;
    }
    return !strcmp(type, "string")   ? cJSON_IsString(v)
           : !strcmp(type, "number") ? cJSON_IsNumber(v)
           : !strcmp(type, "object") ? cJSON_IsObject(v)
           : !strcmp(type, "array")  ? cJSON_IsArray(v)
           : !strcmp(type, "bool")   ? cJSON_IsBool(v)
           : !strcmp(type, "null")   ? cJSON_IsNull(v)
                                     : 0;
}

/* Checks `path` (a.b, a[] every element, a[3] one) of v ends in `type`; how many values it reached. */
static int walk(const cJSON *v, const char *path, const char *type, const char *where) {
    if (!*path) {
        CHECK_MSG(has_type(v, type), "%s: not %s", where, type);
        return 1;
    }
    char key[64];
    size_t n = strcspn(path, ".[");
    snprintf(key, sizeof key, "%.*s", (int)n, path);
    const cJSON *x = n ? cJSON_GetObjectItemCaseSensitive(v, key) : v;
    if (!x) {
        test_fail_at(__FILE__, __LINE__, "%s: no '%s'", where, key);
        return 0;
    }
    const char *rest = path + n;
    if (*rest == '[') {
        const char *close = strchr(rest, ']');
        if (!close || !cJSON_IsArray(x)) {
            test_fail_at(__FILE__, __LINE__, "%s: '%s' is not a list", where, key);
            return 0;
        }
        const char *after = close[1] == '.' ? close + 2 : close + 1;
        if (close == rest + 1) { /* every element */
            int reached = 0;
            for (const cJSON *e = x->child; e; e = e->next) reached += walk(e, after, type, where);
            return reached;
        }
        const cJSON *e = cJSON_GetArrayItem(x, atoi(rest + 1));
        if (!e) {
            test_fail_at(__FILE__, __LINE__, "%s: '%s' has no element %d", where, key, atoi(rest + 1));
            return 0;
        }
        return walk(e, after, type, where);
    }
    return walk(x, *rest == '.' ? rest + 1 : rest, type, where);
}

static cJSON *load_fixture(void) {
    FILE *f = fopen(CTRL_FIXTURE_DIR "/serve/trl_vllm_client.json", "rb");
    CHECK(f != NULL);
    if (!f) return NULL;
    static char buf[1 << 16];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return cJSON_Parse(buf);
}

/* A completions response to a TRL generate(): prompt-major choices, n per prompt, each token's
 * logprob entries naming that token, with at most logprobs + 1 entries. */
static void check_generate(const cJSON *req, const cJSON *resp) {
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(req, "prompt"),
                *n = cJSON_GetObjectItemCaseSensitive(req, "n"),
                *lp = cJSON_GetObjectItemCaseSensitive(req, "logprobs");
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(resp, "choices");
    CHECK_EQ_INT(cJSON_GetArraySize(choices), cJSON_GetArraySize(prompt) * (n ? n->valueint : 1));
    int i = 0;
    for (const cJSON *c = choices->child; c; c = c->next, i++) {
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(c, "token_ids"),
                    *pids = cJSON_GetObjectItemCaseSensitive(c, "prompt_token_ids");
        const cJSON *p = cJSON_GetArrayItem(prompt, i / (n ? n->valueint : 1));
        if (cJSON_IsArray(p)) CHECK_EQ_INT(cJSON_Compare(p, pids, 1), 1); /* token-id prompts come back */
        if (!cJSON_IsNumber(lp)) continue;
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(c, "logprobs");
        const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(l, "tokens"),
                    *tops = cJSON_GetObjectItemCaseSensitive(l, "top_logprobs");
        CHECK_EQ_INT(cJSON_GetArraySize(tokens), cJSON_GetArraySize(ids));
        int t = 0;
        for (const cJSON *id = ids->child; id; id = id->next, t++) {
            char want[32];
            snprintf(want, sizeof want, "token_id:%d", id->valueint);
            CHECK_STR(cJSON_GetArrayItem(tokens, t)->valuestring, want);
            const cJSON *top = cJSON_GetArrayItem(tops, t);
            CHECK(cJSON_GetObjectItemCaseSensitive(top, want) != NULL);
            CHECK(cJSON_GetArraySize(top) >= 1 && cJSON_GetArraySize(top) <= lp->valueint + 1);
        }
    }
}

TEST(trl_vllm_client_requests_get_what_the_client_reads) {
    if (!server_up()) return;
    cJSON *fx = load_fixture();
    int replayed = 0;
    for (const cJSON *q = cJSON_GetObjectItemCaseSensitive(fx, "requests")->child; q; q = q->next) {
        const char *method = cJSON_GetObjectItemCaseSensitive(q, "method")->valuestring,
                   *path = cJSON_GetObjectItemCaseSensitive(q, "path")->valuestring,
                   *name = cJSON_GetObjectItemCaseSensitive(q, "call")->valuestring;
        const cJSON *body = cJSON_GetObjectItemCaseSensitive(q, "body");
        char *b = cJSON_IsNull(body) ? NULL : cJSON_PrintUnformatted(body);
        int status = 0;
        cJSON *r = call(method, path, b ? b : (strcmp(method, "POST") ? NULL : ""), &status);
        CHECK_MSG(status == 200, "%s: %s %s -> HTTP %d", name, method, path, status);
        for (const cJSON *rd = cJSON_GetObjectItemCaseSensitive(q, "reads")->child; rd && r; rd = rd->next) {
            char p[256], where[320];
            snprintf(p, sizeof p, "%s", rd->valuestring);
            char *type = strrchr(p, ':');
            *type++ = '\0';
            snprintf(where, sizeof where, "%s %s", name, rd->valuestring);
            CHECK_MSG(walk(r, p, type, where) > 0, "%s: reached nothing", where);
        }
        if (!strcmp(name, "generate")) check_generate(body, r);
        cJSON_Delete(r);
        free(b);
        replayed++;
    }
    CHECK(replayed >= 12);
    cJSON_Delete(fx);
}

/* TRL's get_sequence_logprobs scores sequences through prompt_logprobs: the scores must be the
 * model's own log-probabilities, i.e. those the generation reports for the tokens it drew (a
 * sample at temperature 1, no filter: the raw softmax), and ranks and top entries must agree. */
TEST(prompt_logprobs_agree_with_generation_and_ranks) {
    if (!server_up()) return;
    cJSON *g = post_ok("/v1/completions",
                       "{\"prompt\": [[5, 6, 7, 8]], \"max_tokens\": 6, \"seed\": 4, "
                       "\"logprobs\": 0, \"return_token_ids\": true, \"return_tokens_as_token_ids\": true}");
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(g, "choices"), 0);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(c0, "token_ids"),
                *lps = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c0, "logprobs"),
                                                        "token_logprobs");
    if (!ids || !lps) return (void)cJSON_Delete(g);
    char body[512];
    int at = snprintf(body, sizeof body, "{\"prompt\": [[5, 6, 7, 8");
    for (const cJSON *e = ids->child; e; e = e->next)
        at += snprintf(body + at, sizeof body - at, ", %d", e->valueint);
    snprintf(body + at, sizeof body - at,
             "]], \"max_tokens\": 1, \"temperature\": 1, \"prompt_logprobs\": 3}");
    cJSON *s = post_ok("/v1/completions", body);
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(s, "choices"), 0), "prompt_logprobs");
    CHECK_EQ_INT(cJSON_GetArraySize(pl), 4 + cJSON_GetArraySize(ids));
    CHECK(cJSON_IsNull(cJSON_GetArrayItem(pl, 0)));
    for (int t = 0; t < cJSON_GetArraySize(ids); t++) {
        char key[16];
        snprintf(key, sizeof key, "%d", cJSON_GetArrayItem(ids, t)->valueint);
        const cJSON *pos = cJSON_GetArrayItem(pl, 4 + t), *e = cJSON_GetObjectItemCaseSensitive(pos, key);
        CHECK_MSG(e != NULL, "position %d: no entry for token %s", 4 + t, key);
        if (!e) continue;
        CHECK_NEAR(cJSON_GetObjectItemCaseSensitive(e, "logprob")->valuedouble,
                   cJSON_GetArrayItem(lps, t)->valuedouble, 2e-4);
        double best = -INFINITY, rank1 = NAN;
        int ranks = 0;
        for (const cJSON *x = pos->child; x; x = x->next) {
            const double lp = cJSON_GetObjectItemCaseSensitive(x, "logprob")->valuedouble;
            const int r = cJSON_GetObjectItemCaseSensitive(x, "rank")->valueint;
            best = fmax(best, lp);
            if (r == 1) rank1 = lp;
            ranks += r <= 3;
        }
        CHECK_EQ_INT(ranks, 3);
        CHECK_NEAR(rank1, best, 0);
    }
    cJSON_Delete(g), cJSON_Delete(s);
}

static char *text_of(cJSON *o) {
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "text");
    return cJSON_IsString(t) ? strdup(t->valuestring) : strdup("");
}

TEST(stop_strings_cut_the_text_and_seeds_decide_randomness) {
    if (!server_up()) return;
    cJSON *free_run =
        post_ok("/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": 12, \"temperature\": 0}");
    char *all = text_of(free_run);
    CHECK(strlen(all) >= 4);
    char stop[3] = {all[2], all[3], 0}, body[256];
    cJSON *js = cJSON_CreateString(stop);
    char *stop_json = cJSON_PrintUnformatted(js);
    snprintf(body, sizeof body,
             "{\"prompt\": \"a\", \"max_tokens\": 12, \"temperature\": 0, \"stop\": [%s, \"\\u0001\"]}",
             stop_json);
    cJSON *cut = post_ok("/v1/completions", body);
    char *txt = text_of(cut);
    const char *first = strstr(all, stop);
    CHECK_EQ_INT((long)strlen(txt), (long)(first - all));
    CHECK_EQ_INT(strncmp(txt, all, strlen(txt)), 0);
    CHECK_STR(cJSON_GetObjectItemCaseSensitive(
                  cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(cut, "choices"), 0), "finish_reason")
                  ->valuestring,
              "stop");
    /* no seed: a fresh sample each time; a seed: the same one; ids unique */
    char *a[4];
    int distinct = 0;
    char *id0 = NULL;
    for (int i = 0; i < 4; i++) {
        cJSON *r = post_ok("/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 8}");
        a[i] = text_of(r);
        for (int j = 0; j < i; j++) distinct += !strcmp(a[i], a[j]);
        const char *id = cJSON_GetObjectItemCaseSensitive(r, "id")->valuestring;
        if (id0) CHECK(strcmp(id, id0) != 0);
        if (!id0) id0 = strdup(id);
        cJSON_Delete(r);
    }
    CHECK_MSG(distinct < 6, "4 unseeded requests gave the same text"); /* 6 equal pairs: all the same */
    cJSON *s1 = post_ok("/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 8, \"seed\": 9}"),
          *s2 = post_ok("/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 8, \"seed\": 9}");
    char *t1 = text_of(s1), *t2 = text_of(s2);
    CHECK_STR(t1, t2);
    for (int i = 0; i < 4; i++) free(a[i]);
    free(all), free(txt), free(stop_json), free(id0), free(t1), free(t2);
    cJSON_Delete(js), cJSON_Delete(free_run), cJSON_Delete(cut), cJSON_Delete(s1), cJSON_Delete(s2);
}

/* Errors as the openai client reads them: {"error": {message, type, param, code}}, a 4xx naming
 * the field; fields ctrl serve cannot honour refused by name. */
TEST(errors_are_openai_shaped_4xx_naming_the_field) {
    if (!server_up()) return;
    static const struct {
        const char *path, *body, *param;
        int status;
    } cases[] = {
        {"/v1/completions", "{\"prompt\": \"x\", \"temperature\": -1}", "temperature", 400},
        {"/v1/completions", "{\"prompt\": \"x\", \"presence_penalty\": 2.5}", "presence_penalty", 400},
        {"/v1/completions", "{\"prompt\": \"x\", \"frequency_penalty\": \"a\"}", "frequency_penalty", 400},
        {"/v1/completions", "{\"prompt\": \"x\", \"logprobs\": -1}", "logprobs", 400},
        {"/v1/completions", "{\"prompt\": \"x\", \"stop\": [\"\"]}", "stop", 400},
        {"/v1/completions", "{\"prompt\": \"x\", \"stream_options\": {\"include_usage\": true}}",
         "stream_options", 400},
        {"/v1/completions", "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}}",
         "response_format", 400},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 101}}", "logit_bias", 400},
        {"/v1/completions", "{\"prompt\": \"x\", \"logit_bias\": {\"x\": 1}}", "logit_bias", 400},
        {"/v1/completions", "{\"prompt\": \"x\", \"min_tokens\": 9, \"max_tokens\": 4}", "min_tokens", 400},
        {"/v1/completions", "{\"prompt\": \"x\", \"bogus\": 1}", "bogus", 400},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", "messages", 400},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2, "
         "\"logprobs\": false}",
         "top_logprobs", 400},
        {"/v1/chat/completions",
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\"}]}",
         "tools", 400},
        {"/init_weight_transfer_engine", "{}", NULL, 501},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int status = 0;
        cJSON *r = call("POST", cases[i].path, cases[i].body, &status);
        CHECK_MSG(status == cases[i].status, "%s: HTTP %d", cases[i].body, status);
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(r, "error");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message"),
                    *param = cJSON_GetObjectItemCaseSensitive(e, "param"),
                    *code = cJSON_GetObjectItemCaseSensitive(e, "code");
        CHECK_MSG(cJSON_IsString(msg) && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "type")) &&
                      cJSON_IsNumber(code) && code->valueint == cases[i].status,
                  "%s: not OpenAI's error shape", cases[i].body);
        if (cases[i].param) {
            CHECK_MSG(cJSON_IsString(param) && !strcmp(param->valuestring, cases[i].param), "%s: param %s",
                      cases[i].body, cJSON_IsString(param) ? param->valuestring : "null");
            CHECK_CONTAINS(msg->valuestring, cases[i].param);
        } else {
            CHECK_CONTAINS(msg->valuestring, "/update_weights");
        }
        cJSON_Delete(r);
    }
}

/* logit_bias moves the logits before anything else (+100: that token always); min_tokens keeps the
 * stop ids out of a completion until it is that long (vLLM's); neutral values of fields ctrl serve
 * does not implement (what clients send by default) are accepted. */
TEST(logit_bias_min_tokens_and_neutral_fields) {
    if (!server_up()) return;
    cJSON *b = post_ok("/v1/completions", "{\"prompt\": [[5, 6]], \"max_tokens\": 5, \"temperature\": 0, "
                                          "\"logit_bias\": {\"7\": 100}, \"return_token_ids\": true}");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(b, "choices"), 0), "token_ids");
    CHECK_EQ_INT(cJSON_GetArraySize(ids), 5);
    for (const cJSON *t = ids ? ids->child : NULL; t; t = t->next) CHECK_EQ_INT(t->valueint, 7);
    cJSON *g = post_ok("/v1/completions", "{\"prompt\": [[5, 6]], \"max_tokens\": 5, \"temperature\": 0, "
                                          "\"return_token_ids\": true}");
    const int first =
        cJSON_GetArrayItem(
            cJSON_GetObjectItemCaseSensitive(
                cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(g, "choices"), 0), "token_ids"),
            0)
            ->valueint;
    char body[256];
    for (int min = 0; min <= 3; min += 3) {
        snprintf(body, sizeof body,
                 "{\"prompt\": [[5, 6]], \"max_tokens\": 5, \"temperature\": 0, \"stop_token_ids\": [%d], "
                 "\"min_tokens\": %d, \"return_token_ids\": true}",
                 first, min);
        cJSON *r = post_ok("/v1/completions", body);
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "choices"), 0);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "token_ids");
        if (min == 0) { /* the first greedy token is the stop id */
            CHECK_EQ_INT(cJSON_GetArraySize(t), 1);
            CHECK_STR(cJSON_GetObjectItemCaseSensitive(c, "finish_reason")->valuestring, "stop");
        } else {
            CHECK(cJSON_GetArraySize(t) >= 3);
            for (int i = 0; i < 3; i++) CHECK(cJSON_GetArrayItem(t, i)->valueint != first);
        }
        cJSON_Delete(r);
    }
    cJSON *n = post_ok("/v1/chat/completions",
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                       "\"max_tokens\": 2, \"tools\": [], \"response_format\": {\"type\": "
                       "\"text\"}, \"logit_bias\": {}, \"best_of\": 1, \"tool_choice\": \"none\"}");
    cJSON_Delete(n), cJSON_Delete(b), cJSON_Delete(g);
}

/* The greedy token ids `ctrl generate` gives for `prompt` (under --adapter DIR when not NULL). */
static void cli_generate(const char *adapter, const char *prompt, char *ids, size_t cap) {
    char in[700], out[700], cmd[3000];
    snprintf(in, sizeof in, "%s/lora_prompt.jsonl", test_tmp_dir());
    snprintf(out, sizeof out, "%s/lora_out.jsonl", test_tmp_dir());
    FILE *f = fopen(in, "w");
    if (f) fprintf(f, "{\"prompt\": \"%s\"}\n", prompt), fclose(f);
    snprintf(cmd, sizeof cmd,
             "%s/ctrl --plugin-dir %s generate --model %s %s%s --prompts %s --out %s --temperature 0 "
             "--max-tokens 8 >/dev/null 2>&1",
             CTRL_BINARY_DIR, CTRL_PLUGIN_DIR, model_dir, adapter ? "--adapter " : "", adapter ? adapter : "",
             in, out);
    ids[0] = 0;
    CHECK_MSG(system(cmd) == 0, "%s failed", cmd);
    f = fopen(out, "r");
    char line[8192] = "";
    if (f && fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "completions"), 0);
        char *t = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "token_ids"));
        snprintf(ids, cap, "%s", t ? t : "");
        free(t), cJSON_Delete(o);
    }
    if (f) fclose(f);
}

typedef struct lora_call {
    const char *model, *prompt;
    int max_tokens; /* 0: 8; more: with ignore_eos */
    int status;
    char ids[16384];
} lora_call;

/* POST /v1/completions greedy for call->model; its token ids (JSON) into call->ids. */
static void *lora_complete(void *arg) {
    lora_call *c = arg;
    char body[600];
    snprintf(body, sizeof body,
             "{\"model\": \"%s\", \"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0, "
             "\"return_token_ids\": true%s}",
             c->model, c->prompt, c->max_tokens ? c->max_tokens : 8,
             c->max_tokens > 8 ? ", \"ignore_eos\": true" : "");
    ctrl_http_response r = {0};
    c->ids[0] = 0, c->status = 0;
    if (ctrl_http_post(base, "/v1/completions", "application/json", body, strlen(body), NULL, 150, &r) ==
            CTRL_OK &&
        (c->status = r.status) == 200) {
        cJSON *o = cJSON_Parse(r.body),
              *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
        char *t = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(ch, "token_ids"));
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "model");
        const int named =
            cJSON_IsString(m) && (!strcmp(m->valuestring, c->model) || strcmp(c->model, "m") == 0);
        if (t && named) snprintf(c->ids, sizeof c->ids, "%s", t); /* the response names the adapter */
        free(t), cJSON_Delete(o);
    }
    ctrl_http_response_free(&r);
    return NULL;
}

TEST(lora_adapters_chosen_by_model_equal_ctrl_generate_adapter) {
    if (!server_up()) return;
    int status = 0;
    cJSON *models = call("GET", "/v1/models", NULL, &status);
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(models, "data");
    CHECK_EQ_INT(cJSON_GetArraySize(data), 3);
    for (int i = 0; i < 2; i++) {
        const cJSON *m = cJSON_GetArrayItem(data, i + 1);
        CHECK_STR(cJSON_GetObjectItemCaseSensitive(m, "id")->valuestring, lora_names[i]);
        CHECK_STR(cJSON_GetObjectItemCaseSensitive(m, "parent")->valuestring, model_dir);
    }
    cJSON_Delete(models);
    static const char *const prompts[] = {"hello world", "the cat sat"};
    /* each model alone: the base (by its directory's name), alpha, beta */
    lora_call alone[3][2];
    const char *names[3] = {"m", "alpha", "beta"};
    for (int k = 0; k < 3; k++)
        for (int p = 0; p < 2; p++) {
            alone[k][p] = (lora_call){.model = names[k], .prompt = prompts[p]};
            lora_complete(&alone[k][p]);
            char want[4096];
            cli_generate(k ? lora_dir[k - 1] : NULL, prompts[p], want, sizeof want);
            CHECK_MSG(want[0] && !strcmp(alone[k][p].ids, want), "%s '%s': served %s, ctrl generate%s %s",
                      names[k], prompts[p], alone[k][p].ids, k ? " --adapter" : "", want);
        }
    CHECK(strcmp(alone[0][0].ids, alone[1][0].ids) || strcmp(alone[0][0].ids, alone[2][0].ids));
    /* all six at once, from six connections: the engine batches them across adapters */
    lora_call together[6];
    pthread_t th[6];
    for (int i = 0; i < 6; i++) {
        together[i] = (lora_call){.model = names[i % 3], .prompt = prompts[i / 3]};
        pthread_create(&th[i], NULL, lora_complete, &together[i]);
    }
    for (int i = 0; i < 6; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 6; i++)
        CHECK_MSG(!strcmp(together[i].ids, alone[i % 3][i / 3].ids), "%s '%s' concurrently: %s, alone %s",
                  names[i % 3], prompts[i / 3], together[i].ids, alone[i % 3][i / 3].ids);
    /* a name that is neither the model nor an adapter: vLLM's 404, naming the field */
    cJSON *e = call("POST", "/v1/completions", "{\"model\": \"gamma\", \"prompt\": \"hi\"}", &status);
    CHECK_EQ_INT(status, 404);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(e, "error");
    CHECK_STR(cJSON_GetObjectItemCaseSensitive(err, "param")->valuestring, "model");
    cJSON_Delete(e);
}

/* POST path with body; the status, the raw body into text (vLLM answers a load in plain text). */
static int post_raw(const char *path, const char *body, char *text, size_t cap) {
    ctrl_http_response r = {0};
    const ctrl_status st = ctrl_http_post(base, path, "application/json", body, strlen(body), NULL, 30, &r);
    CHECK_MSG(st == CTRL_OK, "POST %s: %s", path, ctrl_error_message());
    snprintf(text, cap, "%s", r.body ? r.body : "");
    const int status = r.status;
    ctrl_http_response_free(&r);
    return status;
}

/* requests_in_flight of /health. */
static int in_flight(void) {
    int status = 0;
    cJSON *h = call("GET", "/health", NULL, &status);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, "requests_in_flight");
    const int n = cJSON_IsNumber(v) ? v->valueint : -1;
    cJSON_Delete(h);
    return n;
}

/* vLLM's runtime LoRA updating: an adapter loaded by POST /v1/load_lora_adapter is listed in
 * /v1/models and serves what the same adapter given with --lora does; a name already loaded, a
 * missing field, an adapter that does not load are 400s, a path with no adapter a 404; an unload of
 * an unknown name a 404; an unload while a request runs under the adapter succeeds at once (new
 * requests naming it get 404) and the running request finishes under the adapter. */
TEST(lora_adapters_load_and_unload_at_run_time) {
    if (!server_up()) return;
    char text[4096], body[2048];
    snprintf(body, sizeof body, "{\"lora_name\": \"gamma\", \"lora_path\": \"%s\"}", lora_dir[0]);
    CHECK_EQ_INT(post_raw("/v1/load_lora_adapter", body, text, sizeof text), 200);
    CHECK_STR(text, "Success: LoRA adapter 'gamma' added successfully.");
    int status = 0;
    cJSON *models = call("GET", "/v1/models", NULL, &status);
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(models, "data"), *g = cJSON_GetArrayItem(data, 3);
    CHECK_EQ_INT(cJSON_GetArraySize(data), 4);
    CHECK(g && !strcmp(cJSON_GetObjectItemCaseSensitive(g, "id")->valuestring, "gamma") &&
          !strcmp(cJSON_GetObjectItemCaseSensitive(g, "root")->valuestring, lora_dir[0]));
    cJSON_Delete(models);
    lora_call a = {.model = "alpha", .prompt = "hello world"},
              c = {.model = "gamma", .prompt = "hello world"};
    lora_complete(&a), lora_complete(&c);
    CHECK_MSG(a.ids[0] && !strcmp(a.ids, c.ids), "gamma (alpha's directory) %s, alpha %s", c.ids, a.ids);
    /* vLLM's errors */
    CHECK_EQ_INT(post_raw("/v1/load_lora_adapter", body, text, sizeof text), 400);
    CHECK_CONTAINS(text, "has already been loaded");
    CHECK_EQ_INT(post_raw("/v1/load_lora_adapter", "{\"lora_name\": \"delta\"}", text, sizeof text), 400);
    CHECK_CONTAINS(text, "Both 'lora_name' and 'lora_path' must be provided.");
    snprintf(body, sizeof body, "{\"lora_name\": \"delta\", \"lora_path\": \"%s/nowhere\"}", test_tmp_dir());
    CHECK_EQ_INT(post_raw("/v1/load_lora_adapter", body, text, sizeof text), 404);
    CHECK_CONTAINS(text, "No adapter found");
    char bad_dir[700], path[800];
    snprintf(bad_dir, sizeof bad_dir, "%s/lora_bad", test_tmp_dir());
    CHECK_EQ_INT(system((snprintf(path, sizeof path, "mkdir -p %s", bad_dir), path)), 0);
    snprintf(path, sizeof path, "%s/adapter_config.json", bad_dir);
    FILE *f = fopen(path, "w");
    if (f) fputs("{\"peft_type\": \"IA3\"}", f), fclose(f);
    snprintf(body, sizeof body, "{\"lora_name\": \"delta\", \"lora_path\": \"%s\"}", bad_dir);
    CHECK_EQ_INT(post_raw("/v1/load_lora_adapter", body, text, sizeof text), 400);
    CHECK_CONTAINS(text, "peft_type");
    CHECK_EQ_INT(post_raw("/v1/unload_lora_adapter", "{\"lora_name\": \"delta\"}", text, sizeof text), 404);
    CHECK_CONTAINS(text, "The lora adapter 'delta' cannot be found.");
    CHECK_EQ_INT(post_raw("/v1/unload_lora_adapter", "{}", text, sizeof text), 400);
    /* unloaded while a request runs under it: the request finishes under the adapter (long enough to
     * still run after the unload: a second or more natively; under AddressSanitizer, several times
     * slower, a fifth of it, which took 30-60 s on a loaded 2-core AVX2 machine) */
    const int long_tokens = TEST_UNDER_ASAN ? 300 : 1500;
    lora_call ref = {.model = "alpha", .prompt = "the cat", .max_tokens = long_tokens},
              run = {.model = "gamma", .prompt = "the cat", .max_tokens = long_tokens};
    lora_complete(&ref);
    CHECK_EQ_INT(ref.status, 200);
    pthread_t th;
    pthread_create(&th, NULL, lora_complete, &run);
    int seen = 0;
    for (int i = 0; i < 400 && !seen; i++) seen = in_flight() >= 1 || (usleep(5000), 0);
    usleep(20 * 1000); /* its body read and its "model" resolved */
    CHECK_EQ_INT(post_raw("/v1/unload_lora_adapter", "{\"lora_name\": \"gamma\"}", text, sizeof text), 200);
    CHECK_STR(text, "Success: LoRA adapter 'gamma' removed successfully.");
    const int still = in_flight(); /* the unload came while it ran */
    CHECK_MSG(still >= 1, "the long request had finished before the unload: nothing tested");
    pthread_join(th, NULL);
    CHECK_EQ_INT(run.status, 200);
    CHECK_MSG(run.ids[0] && !strcmp(run.ids, ref.ids),
              "the request running under gamma changed when it was unloaded");
    printf("  unload while %d request(s) ran: it finished under the adapter (%zu bytes of token ids)\n",
           still, strlen(run.ids));
    cJSON *e = call("POST", "/v1/completions", "{\"model\": \"gamma\", \"prompt\": \"hi\"}", &status);
    CHECK_EQ_INT(status, 404);
    cJSON_Delete(e);
    models = call("GET", "/v1/models", NULL, &status);
    CHECK_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(models, "data")), 3);
    cJSON_Delete(models);
    /* the name can be loaded again (a new id) */
    snprintf(body, sizeof body, "{\"lora_name\": \"gamma\", \"lora_path\": \"%s\"}", lora_dir[1]);
    CHECK_EQ_INT(post_raw("/v1/load_lora_adapter", body, text, sizeof text), 200);
    lora_call b = {.model = "beta", .prompt = "the cat sat"},
              c2 = {.model = "gamma", .prompt = "the cat sat"};
    lora_complete(&b), lora_complete(&c2);
    CHECK_MSG(b.ids[0] && !strcmp(b.ids, c2.ids), "gamma (beta's directory) %s, beta %s", c2.ids, b.ids);
    CHECK_EQ_INT(post_raw("/v1/unload_lora_adapter", "{\"lora_name\": \"gamma\"}", text, sizeof text), 200);
}
