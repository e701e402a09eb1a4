/* ctrl serve's Server-Sent Events for /v1/completions and /v1/chat/completions with "stream":
 * true: the generation (through the batcher) waits on a thread of its own and queues the new text
 * of every completion after each engine step; the daemon's content reader hands the events out as
 * they come, then the finish reasons and `data: [DONE]`. A client that disconnects cancels its
 * generation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

typedef struct stream {
    ctrl_server *s;
    int kind, n_out;
    ctrl_gen_request *reqs;
    serve_input in;
    ctrl_gen_output *outs;
    size_t *sent;  /* bytes of each completion's text already sent */
    int *sent_ids; /* tokens of each completion whose logprobs / ids were sent */
    long *offsets; /* each completion's text offset (completions' logprobs) */
    pthread_t thread;
    int started;
    atomic_int cancel; /* set when the client has gone: the generation stops */
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
        char *p = realloc(st->buf, (st->len + n + 1) * 2);
        if (p) st->buf = p, st->cap = (st->len + n + 1) * 2;
    }
    if (st->len + n + 1 <= st->cap) {
        memcpy(st->buf + st->len, event, n + 1);
        st->len += n;
    }
    pthread_cond_signal(&st->ready);
    pthread_mutex_unlock(&st->lock);
}

static void push_json(stream *st, cJSON *o) {
    char *j = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    char *ev = j ? malloc(strlen(j) + 16) : NULL;
    if (ev) {
        sprintf(ev, "data: %s\n\n", j);
        push(st, ev);
    }
    free(ev), free(j);
}

/* New text of every completion (`outs`: as they stand) since the last call (text that ends inside
 * a multi-byte character waits for the rest); with `final`, also each one's finish reason. */
static void emit(stream *st, const ctrl_gen_output *outs, int final) {
    for (int i = 0; i < st->n_out; i++) {
        const ctrl_gen_output *g = &outs[i];
        int by_string = 0;
        char *txt = serve_completion_text(st->s, &st->in, g, final, &by_string);
        if (!txt) continue;
        size_t n = strlen(txt);
        if (!final)
            while (n > st->sent[i] &&
                   (((unsigned char)txt[n - 1] & 0xC0) == 0x80 || (unsigned char)txt[n - 1] >= 0xC0))
                n--; /* a character still being completed */
        if (n > st->sent[i] || (final && g->len)) {
            txt[n] = '\0';
            cJSON *o = serve_openai_object(st->s, &st->in, st->kind, 1),
                  *a = cJSON_AddArrayToObject(o, "choices");
            cJSON *ch = serve_openai_choice(st->kind, i, txt + (st->sent[i] < n ? st->sent[i] : n),
                                            final ? (g->stopped || by_string ? "stop" : "length") : NULL, 1);
            if (st->in.logprobs >= 0)
                cJSON_ReplaceItemInObjectCaseSensitive(
                    ch, "logprobs",
                    serve_logprobs(st->s, &st->in, st->kind, g, st->sent_ids[i], g->len, &st->offsets[i]));
            if (st->in.token_ids)
                cJSON_AddItemToObject(
                    ch, "token_ids",
                    cJSON_CreateIntArray(g->ids + st->sent_ids[i], g->len - st->sent_ids[i]));
            cJSON_AddItemToArray(a, ch);
            push_json(st, o);
            st->sent[i] = n, st->sent_ids[i] = g->len;
        }
        free(txt);
    }
}

static void on_step(const ctrl_gen_output *live, void *ctx) { emit(ctx, live, 0); }

static void *run(void *arg) {
    stream *st = arg;
    const ctrl_status rc =
        ctrl_batcher_generate(st->s->batch, st->reqs, st->in.n, st->outs, on_step, st, &st->cancel);
    if (rc == CTRL_OK) {
        emit(st, st->outs, 1);
        if (st->in.include_usage) { /* stream_options.include_usage: a last chunk with no choices */
            cJSON *o = serve_openai_object(st->s, &st->in, st->kind, 1);
            cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToObject(o, "usage", serve_usage(&st->in, st->outs));
            push_json(st, o);
        }
    } else {
        push_json(st, serve_error_object(serve_generation_failed(st->s), ctrl_error_message()));
    }
    push(st, "data: [DONE]\n\n");
    pthread_mutex_lock(&st->lock);
    st->done = 1;
    pthread_cond_signal(&st->ready);
    pthread_mutex_unlock(&st->lock);
    return NULL;
}

static ssize_t read_events(void *cls, uint64_t pos, char *out, size_t max) {
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

/* The response is done with: sent whole, or its client gone (then the generation is cancelled
 * rather than run to the end for nobody). */
static void stream_free(void *cls) {
    stream *st = cls;
    atomic_store(&st->cancel, 1);
    if (st->started) pthread_join(st->thread, NULL);
    for (int i = 0; st->outs && i < st->n_out; i++) ctrl_gen_output_free(&st->outs[i]);
    serve_release(st->s, st->n_out); /* admitted by serve_generate */
    serve_input_free(&st->in);
    free(st->reqs), free(st->outs), free(st->sent), free(st->sent_ids), free(st->offsets), free(st->buf);
    pthread_mutex_destroy(&st->lock), pthread_cond_destroy(&st->ready);
    free(st);
}

enum MHD_Result serve_stream(ctrl_server *s, struct MHD_Connection *c, int kind, ctrl_gen_request *reqs,
                             serve_input *in) {
    stream *st = calloc(1, sizeof *st);
    if (!st) {
        free(reqs), serve_input_free(in);
        return serve_error(c, 500, "out of memory");
    }
    *st = (stream){.s = s, .kind = kind, .n_out = in->n * in->base.n, .reqs = reqs, .in = *in};
    memset(in, 0, sizeof *in);
    pthread_mutex_init(&st->lock, NULL), pthread_cond_init(&st->ready, NULL);
    st->outs = calloc((size_t)st->n_out, sizeof *st->outs),
    st->sent = calloc((size_t)st->n_out, sizeof *st->sent);
    st->sent_ids = calloc((size_t)st->n_out, sizeof *st->sent_ids),
    st->offsets = calloc((size_t)st->n_out, sizeof *st->offsets);
    st->started = st->outs && st->sent && st->sent_ids && st->offsets &&
                  pthread_create(&st->thread, NULL, run, st) == 0;
    struct MHD_Response *r =
        st->started ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, read_events, st, stream_free)
                    : NULL;
    if (!r) {
        stream_free(st);
        return serve_error(c, 500, "cannot start the stream");
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}
