/* ctrl serve's generation endpoints: POST /generate (ctrl's own shape: prompts or token ids ->
 * prompt_ids, completion_ids, logprobs), /v1/completions and /v1/chat/completions (OpenAI's
 * shapes with vLLM's extensions: return_token_ids, prompt_logprobs; "stream": true goes to
 * stream.c). The request is validated whole (request.c), prompts are scored when asked
 * (prompt_logprobs, echo with logprobs), then generated through the batcher; a client that
 * disconnects meanwhile cancels its generation. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "serve/serve_internal.h"

cJSON *serve_openai_choice(int kind, int index, const char *text, const char *finish, int delta) {
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", index);
    if (kind == SERVE_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(ch, delta ? "delta" : "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
    } else {
        cJSON_AddStringToObject(ch, "text", text);
    }
    cJSON_AddNullToObject(ch, "logprobs");
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    return ch;
}

cJSON *serve_openai_object(ctrl_server *s, const serve_input *in, int kind, int chunk) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", in->id);
    cJSON_AddStringToObject(o, "object",
                            kind == SERVE_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                               : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)time(NULL));
    const char *adapter = in->base.adapter ? serve_lora_name(s, in->base.adapter) : NULL;
    cJSON_AddStringToObject(o, "model", adapter ? adapter : s->opt->model_dir);
    return o;
}

cJSON *serve_usage(const serve_input *in, const ctrl_gen_output *outs) {
    long prompt = 0, completion = 0;
    for (int i = 0; i < in->n; i++) {
        prompt += in->lens[i];
        for (int k = 0; k < in->base.n; k++) completion += outs[(size_t)i * in->base.n + k].len;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    return u;
}

char *serve_decoded(ctrl_server *s, const ctrl_gen_output *g) {
    char *txt = NULL;
    size_t tl;
    if (ctrl_tokenizer_decode(s->tok, g->ids, (size_t)g->len, 1, &txt, &tl) != CTRL_OK) return strdup("");
    return txt;
}

int serve_admit(ctrl_server *s, long n) {
    pthread_mutex_lock(&s->lock);
    const int ok = s->seqs + n <= s->opt->max_queued;
    if (ok) s->seqs += n;
    pthread_mutex_unlock(&s->lock);
    return ok;
}

void serve_release(ctrl_server *s, long n) {
    pthread_mutex_lock(&s->lock);
    s->seqs -= n;
    pthread_mutex_unlock(&s->lock);
}

void serve_set_asleep(ctrl_server *s, int asleep) {
    pthread_mutex_lock(&s->lock);
    s->asleep = asleep;
    pthread_mutex_unlock(&s->lock);
}

/* A generation that failed while the server was shutting down or asleep is the server being
 * unavailable (503: the client may retry), otherwise an internal error (500). */
unsigned serve_generation_failed(ctrl_server *s) {
    pthread_mutex_lock(&s->lock);
    const int unavailable = s->shutting_down || s->asleep;
    pthread_mutex_unlock(&s->lock);
    return unavailable ? 503 : 500;
}

int serve_draining(ctrl_server *s) {
    pthread_mutex_lock(&s->lock);
    const int d = s->draining;
    pthread_mutex_unlock(&s->lock);
    return d;
}

/* ctrl's /generate: ids and each token's log-probability. */
static cJSON *response_trl(const serve_input *in, const ctrl_gen_output *outs) {
    cJSON *o = cJSON_CreateObject(), *pids = cJSON_AddArrayToObject(o, "prompt_ids"),
          *cids = cJSON_AddArrayToObject(o, "completion_ids"), *lps = cJSON_AddArrayToObject(o, "logprobs");
    for (int i = 0; i < in->n; i++) {
        cJSON_AddItemToArray(pids, cJSON_CreateIntArray(in->ids[i], in->lens[i]));
        for (int k = 0; k < in->base.n; k++) {
            const ctrl_gen_output *g = &outs[(size_t)i * in->base.n + k];
            cJSON_AddItemToArray(cids, cJSON_CreateIntArray(g->ids, g->len));
            cJSON_AddItemToArray(lps, cJSON_CreateFloatArray(g->logprobs, g->len));
        }
    }
    return o;
}

/* One OpenAI choice with everything the request asked for. */
static cJSON *choice(ctrl_server *s, const serve_input *in, int kind, int i, int index,
                     const ctrl_gen_output *g, const serve_scored *sc) {
    int by_string = 0;
    char *txt = serve_completion_text(s, in, g, 1, &by_string);
    char *prompt = NULL;
    if (in->echo) { /* completions: the prompt's text first */
        size_t pl = 0;
        if (ctrl_tokenizer_decode(s->tok, in->ids[i], (size_t)in->lens[i], in->skip_special, &prompt, &pl) !=
            CTRL_OK)
            prompt = NULL;
    }
    char *both = malloc(strlen(txt ? txt : "") + (prompt ? strlen(prompt) : 0) + 1);
    if (both) sprintf(both, "%s%s", prompt ? prompt : "", txt ? txt : "");
    cJSON *ch =
        serve_openai_choice(kind, index, both ? both : "", g->stopped || by_string ? "stop" : "length", 0);
    free(txt), free(prompt), free(both);
    if (in->logprobs >= 0) {
        long offset = 0;
        cJSON *lp = serve_logprobs(s, in, kind, g, 0, g->len, &offset);
        if (in->echo && sc) serve_logprobs_prepend_prompt(s, in, lp, in->ids[i], in->lens[i], sc);
        cJSON_ReplaceItemInObjectCaseSensitive(ch, "logprobs", lp);
    }
    if (in->token_ids) {
        if (kind != SERVE_CHAT)
            cJSON_AddItemToObject(ch, "prompt_token_ids", cJSON_CreateIntArray(in->ids[i], in->lens[i]));
        cJSON_AddItemToObject(ch, "token_ids", cJSON_CreateIntArray(g->ids, g->len));
    }
    if (in->prompt_logprobs >= 0 && sc && kind != SERVE_CHAT)
        cJSON_AddItemToObject(ch, "prompt_logprobs",
                              serve_prompt_logprobs(s, in, in->ids[i], in->lens[i], sc));
    return ch;
}

static cJSON *response(ctrl_server *s, int kind, const serve_input *in, const ctrl_gen_output *outs,
                       const serve_scored *sc) {
    if (kind == SERVE_TRL) return response_trl(in, outs);
    cJSON *o = serve_openai_object(s, in, kind, 0), *a = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < in->n; i++)
        for (int k = 0; k < in->base.n; k++) {
            cJSON_AddItemToArray(a, choice(s, in, kind, i, i * in->base.n + k,
                                           &outs[(size_t)i * in->base.n + k], sc ? &sc[i] : NULL));
        }
    if (kind == SERVE_CHAT && in->token_ids)
        cJSON_AddItemToObject(o, "prompt_token_ids", cJSON_CreateIntArray(in->ids[0], in->lens[0]));
    if (kind == SERVE_CHAT && in->prompt_logprobs >= 0 && sc)
        cJSON_AddItemToObject(o, "prompt_logprobs",
                              serve_prompt_logprobs(s, in, in->ids[0], in->lens[0], sc));
    cJSON_AddItemToObject(o, "usage", serve_usage(in, outs));
    return o;
}

/* A whole (non-streamed) response's watch on its client: after every engine step, whether the
 * connection was closed (the client gave up); then the generation is cancelled. */
typedef struct watch {
    int fd;
    atomic_int cancel;
} watch;

static void client_gone(const ctrl_gen_output *live, void *ctx) {
    (void)live;
    watch *w = ctx;
    if (w->fd < 0 || atomic_load(&w->cancel)) return;
    struct pollfd p = {.fd = w->fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return;
    char b;
    if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR)) ||
        ((p.revents & POLLIN) && recv(w->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0))
        atomic_store(&w->cancel, 1);
}

enum MHD_Result serve_generate(ctrl_server *s, struct MHD_Connection *c, const cJSON *body, int kind) {
    serve_input in;
    char msg[512];
    const unsigned bad = serve_input_parse(s, body, kind, &in, msg, sizeof msg);
    ctrl_gen_request *reqs = bad ? NULL : serve_input_requests(s, &in);
    if (bad || !reqs) {
        serve_input_free(&in);
        return serve_error(c, bad ? bad : 500, bad ? msg : "out of memory");
    }
    const size_t n_out = (size_t)in.n * (size_t)in.base.n;
    if (!serve_admit(s, (long)n_out)) {
        snprintf(msg, sizeof msg,
                 "the server is busy: %zu more sequences would exceed the %d queued or running "
                 "(--max-queued-seqs); retry later",
                 n_out, s->opt->max_queued);
        free(reqs), serve_input_free(&in);
        return serve_error(c, 503, msg);
    }
    if (in.stream && kind != SERVE_TRL) return serve_stream(s, c, kind, reqs, &in); /* it owns them now */
    serve_scored *sc = NULL;
    unsigned failed = 0;
    const int k = in.prompt_logprobs >= 0 ? in.prompt_logprobs : in.logprobs;
    if (in.prompt_logprobs >= 0 || (in.echo && in.logprobs >= 0)) {
        sc = calloc((size_t)in.n, sizeof *sc);
        failed = sc ? serve_score_prompts(s, &in, k > 0 ? k : 0, sc, msg, sizeof msg) : 500;
        if (!sc) snprintf(msg, sizeof msg, "out of memory");
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    watch w = {.fd = ci ? ci->connect_fd : -1};
    ctrl_gen_output *outs = failed ? NULL : calloc(n_out, sizeof *outs);
    const ctrl_status st = failed ? CTRL_ERR_RUNTIME
                           : outs
                               ? ctrl_batcher_generate(s->batch, reqs, in.n, outs, client_gone, &w, &w.cancel)
                               : ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
    const enum MHD_Result ret =
        failed          ? serve_error(c, failed, msg)
        : st == CTRL_OK ? serve_reply(c, 200, response(s, kind, &in, outs, sc))
        : atomic_load(&w.cancel)
            ? serve_error(c, 499, "the client closed the connection: generation cancelled")
            : serve_error(c, serve_generation_failed(s), ctrl_error_message());
    for (size_t i = 0; outs && i < n_out; i++) ctrl_gen_output_free(&outs[i]);
    serve_scored_free(sc, in.n);
    free(sc), free(reqs), free(outs);
    serve_input_free(&in);
    serve_release(s, (long)n_out);
    return ret;
}
