/* ctrl serve's generation endpoints: POST /generate (TRL vllm-serve's shape: prompts or token ids
 * -> prompt_ids, completion_ids, logprobs), /v1/completions and /v1/chat/completions (OpenAI's
 * shapes; messages through the model's chat template with the generation prompt), each
 * completion endpoint also as Server-Sent Events with "stream": true (chunks as each engine step
 * produces text, then `data: [DONE]`). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

enum MHD_Result serve_reply(struct MHD_Connection *c, unsigned code, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result serve_error(struct MHD_Connection *c, unsigned code, const char *msg) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", msg);
    return serve_reply(c, code, o);
}

/* Reads the sampling fields every endpoint takes; the name of any other field not in `extra`. */
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
            r->sampling.top_k = (int)v;
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

/* A chat request's messages through the chat template with the generation prompt: one prompt. */
static int chat_prompt(server *s, const cJSON *in, int32_t ***ids, int **lens, const char **why) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(in, "messages");
    *ids = calloc(1, sizeof **ids), *lens = calloc(1, sizeof **lens);
    if (!s->chat) return *why = "the model's tokenizer has no chat template", -1;
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0) return *why = "messages: a non-empty list", -1;
    cJSON *vars = cJSON_CreateObject();
    cJSON_AddItemToObject(vars, "messages", cJSON_Duplicate(msgs, 1));
    cJSON_AddTrueToObject(vars, "add_generation_prompt");
    ctrl_chat_add_special_tokens(s->tok, vars);
    size_t n = 0;
    const ctrl_status st = ctrl_chat_encode(s->tok, s->chat, vars, &(*ids)[0], &n, NULL);
    cJSON_Delete(vars);
    if (st != CTRL_OK || n == 0) return *why = "messages: the chat template cannot render them", -1;
    (*lens)[0] = (int)n;
    return 1;
}

/* One OpenAI choice: the completion's text ("text", or a message / delta for chat). */
static cJSON *openai_choice(int kind, int index, const char *text, const char *finish, int delta) {
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", index);
    if (kind == SERVE_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(ch, delta ? "delta" : "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
    } else {
        cJSON_AddStringToObject(ch, "text", text);
        cJSON_AddNullToObject(ch, "logprobs");
    }
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    return ch;
}

static cJSON *openai_object(server *s, int kind, int chunk) {
    cJSON *o = cJSON_CreateObject();
    char id[64];
    snprintf(id, sizeof id, "%s-%ld", kind == SERVE_CHAT ? "chatcmpl" : "cmpl", (long)time(NULL));
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object",
                            kind == SERVE_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                               : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)time(NULL));
    cJSON_AddStringToObject(o, "model", s->name);
    return o;
}

static char *decoded(server *s, const ctrl_gen_output *g, int len) {
    char *txt = NULL;
    size_t tl;
    if (ctrl_tokenizer_decode(s->tok, g->ids, (size_t)len, 1, &txt, &tl) != CTRL_OK) return strdup("");
    return txt;
}

/* The whole response once every completion is done. */
static cJSON *response(server *s, int kind, const ctrl_gen_request *reqs, int n,
                       const ctrl_gen_output *outs) {
    cJSON *o = kind == SERVE_TRL ? cJSON_CreateObject() : openai_object(s, kind, 0);
    long completion_tokens = 0, prompt_tokens = 0;
    cJSON *a = kind != SERVE_TRL ? cJSON_AddArrayToObject(o, "choices") : NULL;
    cJSON *pids = kind == SERVE_TRL ? cJSON_AddArrayToObject(o, "prompt_ids") : NULL;
    cJSON *cids = kind == SERVE_TRL ? cJSON_AddArrayToObject(o, "completion_ids") : NULL;
    cJSON *lps = kind == SERVE_TRL ? cJSON_AddArrayToObject(o, "logprobs") : NULL;
    for (int i = 0; i < n; i++) {
        prompt_tokens += reqs[i].prompt_len;
        if (pids) cJSON_AddItemToArray(pids, cJSON_CreateIntArray(reqs[i].prompt, reqs[i].prompt_len));
        for (int k = 0; k < reqs[i].n; k++) {
            const ctrl_gen_output *g = &outs[(size_t)i * reqs[i].n + k];
            completion_tokens += g->len;
            if (kind == SERVE_TRL) {
                cJSON_AddItemToArray(cids, cJSON_CreateIntArray(g->ids, g->len));
                cJSON_AddItemToArray(lps, cJSON_CreateFloatArray(g->logprobs, g->len));
            } else {
                char *txt = decoded(s, g, g->len);
                cJSON_AddItemToArray(
                    a, openai_choice(kind, i * reqs[i].n + k, txt, g->stopped ? "stop" : "length", 0));
                free(txt);
            }
        }
    }
    if (kind != SERVE_TRL) {
        cJSON *u = cJSON_AddObjectToObject(o, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt_tokens);
        cJSON_AddNumberToObject(u, "completion_tokens", (double)completion_tokens);
        cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt_tokens + completion_tokens));
    }
    return o;
}

/* A streamed request: its generation (through the batcher) waits on a thread of its own and queues
 * SSE events after every engine step; the daemon's content reader hands them out as they come. */
typedef struct stream {
    server *s;
    int kind, n_req, n_out;
    ctrl_gen_request *reqs;
    ctrl_gen_output *outs;
    int32_t **ids;
    int *lens;
    size_t *sent; /* bytes of each completion's text already sent */
    pthread_t thread;
    int started;
    pthread_mutex_t lock;
    pthread_cond_t ready;
    char *buf; /* queued events not yet read */
    size_t len, cap, at;
    int done;
} stream;

static void push(stream *st, const char *event) {
    const size_t n = strlen(event);
    pthread_mutex_lock(&st->lock);
    if (st->len + n + 1 > st->cap) {
        st->cap = (st->len + n + 1) * 2;
        st->buf = realloc(st->buf, st->cap);
    }
    memcpy(st->buf + st->len, event, n + 1);
    st->len += n;
    pthread_cond_signal(&st->ready);
    pthread_mutex_unlock(&st->lock);
}

static void push_json(stream *st, cJSON *o) {
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    char *ev = malloc(strlen(j) + 16);
    sprintf(ev, "data: %s\n\n", j);
    push(st, ev);
    free(ev), free(j);
}

/* New text of every completion (`outs`: as they stand) since the last call (text that ends inside
 * a multi-byte character waits for the rest); with `final`, also each one's finish reason. */
static void emit(stream *st, const ctrl_gen_output *outs, int final) {
    for (int i = 0; i < st->n_out; i++) {
        const ctrl_gen_output *g = &outs[i];
        char *txt = decoded(st->s, g, g->len);
        size_t n = strlen(txt);
        if (!final)
            while (n > st->sent[i] &&
                   (((unsigned char)txt[n - 1] & 0xC0) == 0x80 || (unsigned char)txt[n - 1] >= 0xC0))
                n--; /* a character still being completed */
        if (n > st->sent[i] || (final && g->len)) {
            txt[n] = '\0';
            cJSON *o = openai_object(st->s, st->kind, 1), *a = cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToArray(a, openai_choice(st->kind, i, txt + st->sent[i],
                                                  final ? (g->stopped ? "stop" : "length") : NULL, 1));
            push_json(st, o);
            st->sent[i] = n;
        }
        free(txt);
    }
}

static void on_step(const ctrl_gen_output *live, void *ctx) { emit(ctx, live, 0); }

static void *stream_run(void *arg) {
    stream *st = arg;
    const ctrl_status rc = serve_batch_generate(st->s, st->reqs, st->n_req, st->outs, on_step, st);
    if (rc == CTRL_OK) {
        emit(st, st->outs, 1);
    } else {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "error", ctrl_error_message());
        push_json(st, o);
    }
    push(st, "data: [DONE]\n\n");
    pthread_mutex_lock(&st->lock);
    st->done = 1;
    pthread_cond_signal(&st->ready);
    pthread_mutex_unlock(&st->lock);
    return NULL;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    stream *st = cls;
    pthread_mutex_lock(&st->lock);
    while (st->at == st->len && !st->done) pthread_cond_wait(&st->ready, &st->lock);
    ssize_t n;
    if (st->at == st->len) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        n = (ssize_t)(st->len - st->at < max ? st->len - st->at : max);
        memcpy(out, st->buf + st->at, (size_t)n);
        st->at += (size_t)n;
    }
    pthread_mutex_unlock(&st->lock);
    return n;
}

static void stream_free(void *cls) {
    stream *st = cls;
    if (st->started) pthread_join(st->thread, NULL);
    for (int i = 0; i < st->n_out; i++) ctrl_gen_output_free(&st->outs[i]);
    for (int i = 0; i < st->n_req; i++) free(st->ids[i]);
    free(st->ids), free(st->lens), free(st->reqs), free(st->outs), free(st->sent), free(st->buf);
    pthread_mutex_destroy(&st->lock), pthread_cond_destroy(&st->ready);
    free(st);
}

static enum MHD_Result start_stream(server *s, struct MHD_Connection *c, int kind, ctrl_gen_request *reqs,
                                    int n, int32_t **ids, int *lens) {
    stream *st = calloc(1, sizeof *st);
    *st = (stream){
        .s = s, .kind = kind, .n_req = n, .n_out = n * reqs[0].n, .reqs = reqs, .ids = ids, .lens = lens};
    st->outs = calloc((size_t)st->n_out, sizeof *st->outs),
    st->sent = calloc((size_t)st->n_out, sizeof *st->sent);
    pthread_mutex_init(&st->lock, NULL), pthread_cond_init(&st->ready, NULL);
    st->started = pthread_create(&st->thread, NULL, stream_run, st) == 0;
    if (!st->started) {
        stream_free(st);
        return serve_error(c, 500, "cannot start the stream");
    }
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result serve_generate(server *s, struct MHD_Connection *c, const cJSON *in, int kind) {
    static const char *const extra[][4] = {
        [SERVE_TRL] = {"prompts", "prompt_token_ids", NULL},
        [SERVE_COMPLETIONS] = {"model", "prompt", "stream", NULL},
        [SERVE_CHAT] = {"model", "messages", "stream", NULL},
    };
    ctrl_gen_request base;
    const char *unknown = request_params(in, extra[kind], &base);
    char msg[256];
    if (unknown) {
        snprintf(msg, sizeof msg, "unknown field '%s'", unknown);
        return serve_error(c, 400, msg);
    }
    if (base.n < 1 || base.max_tokens < 1 || base.n > 1024 || base.max_tokens > 1 << 20)
        return serve_error(c, 400, "n and max_tokens must be positive");
    int32_t **ids;
    int *lens;
    const char *why = "prompts: a non-empty string, list of strings, or list of token-id lists";
    const int n = kind == SERVE_CHAT ? chat_prompt(s, in, &ids, &lens, &why)
                                     : prompts_of(s, in, kind == SERVE_TRL ? "prompts" : "prompt",
                                                  "prompt_token_ids", &ids, &lens);
    if (n < 0) {
        free(ids[0]), free(ids), free(lens);
        return serve_error(c, 400, why);
    }
    ctrl_gen_request *reqs = calloc((size_t)n, sizeof *reqs);
    for (int i = 0; i < n; i++) {
        reqs[i] = base;
        reqs[i].prompt = ids[i], reqs[i].prompt_len = lens[i], reqs[i].seed = base.seed + (uint64_t)i;
        reqs[i].stop_ids = s->stops, reqs[i].n_stop = s->n_stop;
    }
    if (kind != SERVE_TRL && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(in, "stream")))
        return start_stream(s, c, kind, reqs, n, ids, lens); /* it owns reqs, ids and lens now */
    ctrl_gen_output *outs = calloc((size_t)n * base.n, sizeof *outs);
    const ctrl_status st = serve_batch_generate(s, reqs, n, outs, NULL, NULL);
    const enum MHD_Result ret = st == CTRL_OK ? serve_reply(c, 200, response(s, kind, reqs, n, outs))
                                              : serve_error(c, 500, ctrl_error_message());
    for (size_t i = 0; i < (size_t)n * base.n; i++) ctrl_gen_output_free(&outs[i]);
    for (int i = 0; i < n; i++) free(ids[i]);
    free(reqs), free(outs), free(ids), free(lens);
    return ret;
}
