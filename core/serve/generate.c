/* ctrl serve's generation endpoints: POST /generate (TRL vllm-serve's shape: prompts or token ids
 * -> prompt_ids, completion_ids, logprobs), /v1/completions and /v1/chat/completions (OpenAI's
 * shapes; "stream": true goes to stream.c). The request is validated whole (request.c), then
 * generated through the batcher. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
        cJSON_AddNullToObject(ch, "logprobs");
    }
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    return ch;
}

cJSON *serve_openai_object(ctrl_server *s, int kind, int chunk) {
    cJSON *o = cJSON_CreateObject();
    char id[64];
    snprintf(id, sizeof id, "%s-%ld", kind == SERVE_CHAT ? "chatcmpl" : "cmpl", (long)time(NULL));
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object",
                            kind == SERVE_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                               : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)time(NULL));
    cJSON_AddStringToObject(o, "model", s->opt->model_dir);
    return o;
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

unsigned serve_generation_failed(ctrl_server *s) {
    pthread_mutex_lock(&s->lock);
    const int down = s->shutting_down;
    pthread_mutex_unlock(&s->lock);
    return down ? 503 : 500;
}

/* The whole response once every completion is done. */
static cJSON *response(ctrl_server *s, int kind, const ctrl_gen_request *reqs, int n,
                       const ctrl_gen_output *outs) {
    cJSON *o = kind == SERVE_TRL ? cJSON_CreateObject() : serve_openai_object(s, kind, 0);
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
                char *txt = serve_decoded(s, g);
                cJSON_AddItemToArray(
                    a, serve_openai_choice(kind, i * reqs[i].n + k, txt, g->stopped ? "stop" : "length", 0));
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
    ctrl_gen_output *outs = calloc(n_out, sizeof *outs);
    const ctrl_status st = outs ? ctrl_batcher_generate(s->batch, reqs, in.n, outs, NULL, NULL, NULL)
                                : ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
    const enum MHD_Result ret = st == CTRL_OK
                                    ? serve_reply(c, 200, response(s, kind, reqs, in.n, outs))
                                    : serve_error(c, serve_generation_failed(s), ctrl_error_message());
    for (size_t i = 0; outs && i < n_out; i++) ctrl_gen_output_free(&outs[i]);
    free(reqs), free(outs);
    serve_input_free(&in);
    serve_release(s, (long)n_out);
    return ret;
}
