/* See remote_engine.h. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collective/collective.h"
#include "generate/remote_engine.h"
#include "model/peft.h"
#include "net/http_client.h"

enum { TIMEOUT_S = 3600 }; /* a generation batch of long completions can take a while */

/* The server's error, or the status, for a non-2xx response. */
static ctrl_status http_failed(const char *url, const char *path, const ctrl_http_response *r) {
    cJSON *o = cJSON_Parse(r->body ? r->body : "");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (cJSON_IsObject(e)) e = cJSON_GetObjectItemCaseSensitive(e, "message"); /* OpenAI's shape */
    ctrl_status st = ctrl_error_set(CTRL_ERR_RUNTIME, "%s%s: HTTP %d: %s", url, path, r->status,
                                    cJSON_IsString(e) ? e->valuestring : "(no error message)");
    cJSON_Delete(o);
    return st;
}

ctrl_status ctrl_remote_wait_ready(const char *url, int wait_s) {
    ctrl_status st = CTRL_OK;
    for (int i = 0; i <= wait_s * 10; i++) {
        ctrl_http_response r;
        st = ctrl_http_get(url, "/health", 5, &r);
        const int ok = st == CTRL_OK && r.status == 200;
        ctrl_http_response_free(&r);
        if (ok) return CTRL_OK;
        usleep(100000);
    }
    return st != CTRL_OK ? st : ctrl_error_set(CTRL_ERR_RUNTIME, "%s/health: the server is not ready", url);
}

/* One POST /generate per distinct sampling setup would be needed in general; the online trainers
 * send one setup per batch, so requests share the first request's parameters (checked). */
static int same_params(const ctrl_gen_request *a, const ctrl_gen_request *b) {
    return a->n == b->n && a->max_tokens == b->max_tokens &&
           !memcmp(&a->sampling, &b->sampling, sizeof a->sampling);
}

static ctrl_status parse_outputs(const char *url, const cJSON *o, const ctrl_gen_request *reqs, int n_req,
                                 ctrl_gen_output *outs) {
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "completion_ids");
    const cJSON *lps = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
    const int want = n_req * reqs[0].n;
    if (!cJSON_IsArray(ids) || !cJSON_IsArray(lps) || cJSON_GetArraySize(ids) != want ||
        cJSON_GetArraySize(lps) != want)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s/generate: expected %d completion_ids and logprobs", url,
                              want);
    const cJSON *c = ids->child, *l = lps->child;
    for (int i = 0; i < want; i++, c = c->next, l = l->next) {
        const ctrl_gen_request *q = &reqs[i / reqs[0].n];
        const int n = cJSON_GetArraySize(c);
        if (!cJSON_IsArray(c) || !cJSON_IsArray(l) || cJSON_GetArraySize(l) != n || n > q->max_tokens)
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s/generate: completion %d is malformed", url, i);
        ctrl_gen_output *g = &outs[i];
        g->ids = malloc(sizeof(int32_t) * (size_t)(n + 1)),
        g->logprobs = malloc(sizeof(float) * (size_t)(n + 1));
        if (!g->ids || !g->logprobs) return ctrl_error_set(CTRL_ERR_NOMEM, "%s/generate: out of memory", url);
        g->len = n;
        int k = 0;
        for (const cJSON *t = c->child, *p = l->child; t && p; t = t->next, p = p->next, k++)
            g->ids[k] = (int32_t)t->valuedouble, g->logprobs[k] = (float)p->valuedouble;
        for (int s = 0; n > 0 && s < q->n_stop; s++) g->stopped |= g->ids[n - 1] == q->stop_ids[s];
    }
    return CTRL_OK;
}

ctrl_status ctrl_remote_generate(const char *url, const char *bearer, const ctrl_gen_request *reqs, int n_req,
                                 ctrl_gen_output *outs) {
    for (int i = 1; i < n_req; i++)
        if (!same_params(&reqs[0], &reqs[i]))
            return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "remote generation: one sampling setup per batch");
    const ctrl_gen_request *q = &reqs[0];
    cJSON *in = cJSON_CreateObject(), *prompts = cJSON_AddArrayToObject(in, "prompt_token_ids");
    for (int i = 0; i < n_req; i++)
        cJSON_AddItemToArray(prompts, cJSON_CreateIntArray(reqs[i].prompt, reqs[i].prompt_len));
    cJSON_AddNumberToObject(in, "n", q->n);
    cJSON_AddNumberToObject(in, "max_tokens", q->max_tokens);
    cJSON_AddNumberToObject(in, "temperature", q->sampling.temperature);
    cJSON_AddNumberToObject(in, "top_p", q->sampling.top_p);
    cJSON_AddNumberToObject(in, "top_k", q->sampling.top_k);
    cJSON_AddNumberToObject(in, "min_p", q->sampling.min_p);
    cJSON_AddNumberToObject(in, "repetition_penalty", q->sampling.repetition_penalty);
    cJSON_AddNumberToObject(in, "seed", (double)(q->seed & ((1ull << 52) - 1))); /* exact in a JSON double */
    char *body = cJSON_PrintUnformatted(in);
    cJSON_Delete(in);
    ctrl_http_response r;
    ctrl_status st =
        ctrl_http_post(url, "/generate", "application/json", body, strlen(body), bearer, TIMEOUT_S, &r);
    free(body);
    if (st != CTRL_OK) return st;
    if (r.status / 100 != 2) {
        st = http_failed(url, "/generate", &r);
    } else {
        cJSON *o = cJSON_Parse(r.body);
        st = o ? parse_outputs(url, o, reqs, n_req, outs)
               : ctrl_error_set(CTRL_ERR_FORMAT, "%s/generate: the response is not JSON", url);
        cJSON_Delete(o);
    }
    ctrl_http_response_free(&r);
    return st;
}

ctrl_status ctrl_remote_push_weights(const char *url, const char *bearer, ctrl_model *m,
                                     const char *scratch_path) {
    ctrl_status st = ctrl_peft_save_merged_weights(m, scratch_path, CTRL_F32); /* adapters folded in */
    if (st != CTRL_OK) return st;
    /* sent from the file a block at a time: no second copy of the weights in memory */
    FILE *f = fopen(scratch_path, "rb");
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (f && n > 0 && fseek(f, 0, SEEK_SET) != 0) n = -1;
    remove(scratch_path); /* the open stream still reads it */
    if (!f || n <= 0) {
        if (f) fclose(f);
        return ctrl_error_set(CTRL_ERR_IO, "%s: cannot read the staged weights back", scratch_path);
    }
    ctrl_http_response r;
    st = ctrl_http_post_file(url, "/update_weights", "application/octet-stream", f, (size_t)n, bearer,
                             TIMEOUT_S, &r);
    fclose(f);
    if (st == CTRL_OK && r.status / 100 != 2) st = http_failed(url, "/update_weights", &r);
    ctrl_http_response_free(&r);
    return st;
}

ctrl_status ctrl_remote_server_init(ctrl_remote_server *r, const char *url, const char *output_dir) {
    const char *key = getenv("CTRL_API_KEY");
    char push[4200];
    snprintf(push, sizeof push, "%s/.weights-push.safetensors", output_dir);
    r->url = strdup(url ? url : "http://127.0.0.1:8000"), r->push_path = strdup(push);
    r->bearer = key && key[0] ? strdup(key) : NULL;
    r->stale = 1;
    if (!r->url || !r->push_path || (key && key[0] && !r->bearer)) {
        ctrl_remote_server_free(r);
        return ctrl_error_set(CTRL_ERR_NOMEM, "[generation] server_url: out of memory");
    }
    return CTRL_OK;
}

ctrl_status ctrl_remote_server_push(ctrl_remote_server *r, ctrl_model *m) {
    if (!r->url) return CTRL_OK;
    /* zero3: the weights readable (streamed to rank 0, the others serving their slices until it has
     * written them; or gathered on every rank), and released before the barrier */
    ctrl_status st = r->whole ? r->whole(r->whole_ctx, 1) : CTRL_OK;
    if (st == CTRL_OK && ctrl_collective_is_root())
        st = ctrl_remote_push_weights(r->url, r->bearer, m, r->push_path);
    const ctrl_status w = r->whole ? r->whole(r->whole_ctx, 0) : CTRL_OK;
    const ctrl_status b = ctrl_collective_barrier(); /* the others wait for rank 0's push */
    if (st == CTRL_OK) r->stale = 0;
    return st != CTRL_OK ? st : w != CTRL_OK ? w : b;
}

ctrl_status ctrl_remote_server_sync(ctrl_remote_server *r, ctrl_model *m) {
    return r->url && r->stale ? ctrl_remote_server_push(r, m) : CTRL_OK;
}

void ctrl_remote_server_free(ctrl_remote_server *r) {
    free(r->url), free(r->bearer), free(r->push_path);
    *r = (ctrl_remote_server){0};
}
