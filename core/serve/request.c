/* A generation request's body, validated before anything runs: every field of the right JSON type
 * and range (null means the default), prompts x n within --max-seqs-per-request, and every prompt
 * with max_tokens inside the context the server can hold. Each refusal is a 400 naming the field.
 * The sampling fields are read here, the OpenAI / vLLM response options in request_options.c,
 * chat messages in messages.c. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

/* A whole number in [lo, hi], or -1 (a message naming `name` in msg). */
static int integer(const cJSON *f, double lo, double hi, double *out, char *msg, size_t cap) {
    const double v = cJSON_IsNumber(f) ? f->valuedouble : NAN;
    if (isfinite(v) && v == floor(v) && v >= lo && v <= hi) return *out = v, 0;
    if (hi >= 1e18)
        snprintf(msg, cap, "%s: an integer >= %.0f", f->string, lo);
    else
        snprintf(msg, cap, "%s: an integer between %.0f and %.0f", f->string, lo, hi);
    return -1;
}

/* A finite number in [lo, hi] (or exactly 0 when zero_ok: temperature's greedy); -1 otherwise. */
static int number(const cJSON *f, double lo, double hi, int zero_ok, float *out, char *msg, size_t cap,
                  const char *range) {
    const double v = cJSON_IsNumber(f) ? f->valuedouble : NAN;
    if ((isfinite(v) && v >= lo && v <= hi) || (zero_ok && v == 0)) return *out = (float)v, 0;
    snprintf(msg, cap, "%s: %s", f->string, range);
    return -1;
}

/* Every field of the body: the sampling fields here, the response options (request_options.c),
 * and `extra` (prompts, messages, model, stream: read by the caller); 400 for any other.
 * *max_tokens_given: whether max_tokens (or max_completion_tokens) was. */
static unsigned fields(ctrl_server *s, const cJSON *in, int kind, const char *const *extra, serve_input *out,
                       int *ignore_eos, int *max_tokens_given, char *msg, size_t cap) {
    ctrl_gen_request *r = &out->base;
    *r = (ctrl_gen_request){.n = 1, .max_tokens = 16, .sampling = {1.0f, 0, 1.0f, 0, 1.0f, 0, 0}};
    int seeded = 0, max_completion = 0;
    for (const cJSON *f = in->child; f; f = f->next) {
        const char *k = f->string;
        double v = 0;
        int bad = 0, known = 1;
        if (cJSON_IsNull(f)) { /* the default */
        } else if (!strcmp(k, "n")) {
            bad = integer(f, 1, s->opt->max_seqs, &v, msg, cap), r->n = (int)v;
        } else if (!strcmp(k, "max_tokens") || (kind == SERVE_CHAT && !strcmp(k, "max_completion_tokens"))) {
            /* chat: max_completion_tokens (OpenAI's newer name) wins over max_tokens, as in vLLM */
            const int completion = !strcmp(k, "max_completion_tokens");
            bad = integer(f, 1, s->context, &v, msg, cap);
            if (!bad && (completion || !max_completion)) r->max_tokens = (int)v;
            max_completion |= completion, *max_tokens_given = 1;
        } else if (!strcmp(k, "seed")) {
            bad = integer(f, 0, 18446744073709549568.0, &v, msg, cap), r->seed = (uint64_t)v, seeded = 1;
        } else if (!strcmp(k, "top_k")) { /* -1 and 0: off (vLLM's and transformers' spellings) */
            bad = integer(f, -1, 2147483647.0, &v, msg, cap), r->sampling.top_k = v < 0 ? 0 : (int)v;
        } else if (!strcmp(k, "temperature")) {
            bad = number(f, 1e-5, 100, 1, &r->sampling.temperature, msg, cap,
                         "0 (greedy) or between 1e-5 and 100");
        } else if (!strcmp(k, "top_p")) {
            bad = number(f, 1e-6, 1, 0, &r->sampling.top_p, msg, cap, "a number in (0, 1] (at least 1e-6)");
        } else if (!strcmp(k, "min_p")) {
            bad = number(f, 0, 1, 0, &r->sampling.min_p, msg, cap, "a number between 0 and 1");
        } else if (!strcmp(k, "repetition_penalty")) {
            bad = number(f, 0.01, 100, 0, &r->sampling.repetition_penalty, msg, cap,
                         "a number between 0.01 and 100");
        } else if (!strcmp(k, "presence_penalty")) {
            bad = number(f, -2, 2, 0, &r->sampling.presence_penalty, msg, cap, "a number between -2 and 2");
        } else if (!strcmp(k, "frequency_penalty")) {
            bad = number(f, -2, 2, 0, &r->sampling.frequency_penalty, msg, cap, "a number between -2 and 2");
        } else {
            const int o = serve_option_field(s, kind, f, out, ignore_eos, msg, cap);
            bad = o < 0, known = o == 0;
            for (int i = 0; extra[i] && !known && !bad; i++) known = !strcmp(k, extra[i]);
            if (!known && !bad) snprintf(msg, cap, "unknown field '%s'", k);
        }
        if (bad || !known) return 400;
    }
    if (!ctrl_sampling_params_valid(&r->sampling)) /* the sampler's own rule; the ranges above are narrower */
        return snprintf(msg, cap, "temperature, top_p, min_p, repetition_penalty: out of range"), 400;
    if (!seeded) r->seed = serve_random(s); /* fresh randomness for every request without a seed */
    return 0;
}

/* The prompt list under `key` (a string: one prompt; a list of strings; a list of token ids: one
 * prompt; a list of token-id lists) or `ids_key` (token-id lists), counted; -1 with a message when
 * its shape is wrong. *flat: key holds one prompt of token ids. */
static int prompt_list(const cJSON *in, const char *key, const char *ids_key, const cJSON **list, int *is_ids,
                       int *flat, char *msg, size_t cap) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(in, key),
                *q = cJSON_GetObjectItemCaseSensitive(in, ids_key);
    if (cJSON_IsNull(p)) p = NULL;
    if (cJSON_IsNull(q)) q = NULL;
    if (p && q) return snprintf(msg, cap, "%s and %s: give one of them", key, ids_key), -1;
    if (!p && !q) return snprintf(msg, cap, "%s: missing (a string or a list of strings)", key), -1;
    *is_ids = q != NULL;
    *list = p ? p : q;
    *flat = 0;
    if (cJSON_IsString(p)) return 1;
    if (!cJSON_IsArray(*list) || cJSON_GetArraySize(*list) == 0)
        return snprintf(msg, cap, "%s: %s", p ? key : ids_key,
                        p ? "a string or a non-empty list of strings" : "a non-empty list of token-id lists"),
               -1;
    if (p && cJSON_IsNumber(p->child)) return *is_ids = 1, *flat = 1, 1; /* [1, 2, 3]: one prompt */
    if (p && cJSON_IsArray(p->child)) *is_ids = 1;
    return cJSON_GetArraySize(*list);
}

/* The status of a failed tokenization: the server is stopping (the drain's deadline interrupts
 * it, server.c), out of memory, or the text itself (400). */
static unsigned encode_failed(ctrl_status st) {
    return st == CTRL_ERR_INTERRUPTED ? 503 : st == CTRL_ERR_NOMEM ? 500 : 400;
}

/* A list of token ids in the vocabulary (at most the context + 1: more is refused after). */
static unsigned id_list(ctrl_server *s, const cJSON *e, const char *what, int i, int flat, int32_t **ids,
                        int *len, char *msg, size_t cap) {
    const int V = ctrl_tokenizer_vocab_size(s->tok), n_all = cJSON_GetArraySize(e);
    if (n_all > s->context) return *len = n_all, 0;
    *ids = malloc(sizeof(int32_t) * (size_t)(n_all + 1));
    if (!*ids) return snprintf(msg, cap, "out of memory"), 500;
    int n = 0;
    for (const cJSON *t = e->child; t; t = t->next, n++) {
        const double v = cJSON_IsNumber(t) ? t->valuedouble : -1;
        if (!(v >= 0 && v < V && v == floor(v))) {
            if (flat) return snprintf(msg, cap, "%s[%d]: a token id in [0, %d)", what, n, V), 400;
            return snprintf(msg, cap, "%s[%d][%d]: a token id in [0, %d)", what, i, n, V), 400;
        }
        (*ids)[n] = (int32_t)v;
    }
    *len = n;
    return 0;
}

/* One prompt's token ids: text through the tokenizer, or a list of ids in the vocabulary; 0 or the
 * HTTP status. */
static unsigned prompt_ids(ctrl_server *s, const cJSON *e, const char *what, int i, int flat, int32_t **ids,
                           int *len, char *msg, size_t cap) {
    unsigned bad = 0;
    if (cJSON_IsString(e)) {
        size_t n = 0;
        const ctrl_status st =
            ctrl_tokenizer_encode(s->tok, e->valuestring, strlen(e->valuestring), 1, ids, &n);
        if (st != CTRL_OK)
            return snprintf(msg, cap, "%s[%d]: %s", what, i, ctrl_error_message()), encode_failed(st);
        if (n > (size_t)s->context) n = (size_t)s->context + 1; /* refused below */
        *len = (int)n;
    } else if (cJSON_IsArray(e)) {
        bad = id_list(s, e, what, i, flat, ids, len, msg, cap);
    } else {
        return snprintf(msg, cap, "%s[%d]: %s", what, i,
                        strcmp(what, "prompt_token_ids") ? "a string or a list of token ids"
                                                         : "a list of token ids"),
               400;
    }
    if (!bad && *len < 1) return snprintf(msg, cap, "%s[%d]: empty", what, i), 400;
    return bad;
}

/* Prompt + max_tokens inside the context (the model's, or the KV pool's when that is smaller),
 * naming both lengths as vLLM does. Without max_tokens a chat completion may fill the context. */
static int within_context(ctrl_server *s, serve_input *in, const char *what, int default_fill, char *msg,
                          size_t cap) {
    for (int i = 0; i < in->n; i++) {
        if (default_fill && in->lens[i] < s->context) in->base.max_tokens = s->context - in->lens[i];
        if ((long)in->lens[i] + in->base.max_tokens > s->context)
            return snprintf(msg, cap, "%s[%d]: %s%d prompt tokens + max_tokens %d exceed the %s of %d tokens",
                            what, i, in->lens[i] > s->context ? "more than " : "",
                            in->lens[i] > s->context ? s->context : in->lens[i], in->base.max_tokens,
                            s->context_from_kv ? "KV cache's capacity (--kv-cache-mb)" : "model's context",
                            s->context),
                   -1;
    }
    return 0;
}

unsigned serve_input_parse(ctrl_server *s, const cJSON *in, int kind, serve_input *out, char *msg,
                           size_t cap) {
    static const char *const extra[][6] = {
        [SERVE_TRL] = {"prompts", "prompt_token_ids", NULL},
        [SERVE_COMPLETIONS] = {"model", "prompt", "stream", NULL},
        [SERVE_CHAT] = {"model", "messages", "stream", "chat_template_kwargs", "add_generation_prompt", NULL},
    };
    memset(out, 0, sizeof *out);
    out->logprobs = out->prompt_logprobs = out->chat_logprobs = -1, out->skip_special = 1;
    int ignore_eos = 0, max_given = 0;
    if (fields(s, in, kind, extra[kind], out, &ignore_eos, &max_given, msg, cap)) return 400;
    if (serve_input_finish_options(out, msg, cap)) return 400;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(in, "model"),
                *stream = cJSON_GetObjectItemCaseSensitive(in, "stream");
    if (model && !cJSON_IsNull(model) && !cJSON_IsString(model))
        return snprintf(msg, cap, "model: a string"), 400;
    if (cJSON_IsString(model) && serve_lora_checks_model(s)) { /* the base, or one of the adapters */
        if ((out->base.adapter = serve_lora_acquire(s, model->valuestring)))
            out->lora_server = s; /* held until serve_input_free: an unload waits for it */
        const char *slash = strrchr(s->opt->model_dir, '/'); /* the directory's name is the model's too */
        if (!out->base.adapter && strcmp(model->valuestring, s->opt->model_dir) &&
            !(slash && slash[1] && !strcmp(model->valuestring, slash + 1)))
            return snprintf(msg, cap,
                            "model: '%.200s' is neither the served model nor one of its LoRA adapters "
                            "(GET /v1/models lists them)",
                            model->valuestring),
                   404;
    }
    if (stream && !cJSON_IsNull(stream) && !cJSON_IsBool(stream))
        return snprintf(msg, cap, "stream: true or false"), 400;
    out->stream = cJSON_IsTrue(stream);
    if (out->include_usage && !out->stream)
        return snprintf(msg, cap, "stream_options: only with \"stream\": true"), 400;
    if (out->stream && out->prompt_logprobs >= 0)
        return snprintf(msg, cap, "prompt_logprobs: not with \"stream\": true"), 400;
    if (out->stream && out->echo) return snprintf(msg, cap, "echo: not with \"stream\": true"), 400;
    /* the ids that end a completion: the model's (unless ignore_eos), then stop_token_ids */
    int32_t *stops = malloc(sizeof(int32_t) * (size_t)(s->n_stop + out->n_stop_ids + 1));
    if (!stops) return snprintf(msg, cap, "out of memory"), 500;
    const int own = ignore_eos ? 0 : s->n_stop;
    memcpy(stops, s->stops, sizeof(int32_t) * (size_t)own);
    if (out->n_stop_ids) memcpy(stops + own, out->stop_ids, sizeof(int32_t) * (size_t)out->n_stop_ids);
    free(out->stop_ids);
    out->stop_ids = stops, out->n_stop_ids += own;
    const char *what = kind == SERVE_TRL ? "prompts" : "prompt";
    const cJSON *list = NULL;
    int is_ids = 0, flat = 0;
    const int n =
        kind == SERVE_CHAT ? 1 : prompt_list(in, what, "prompt_token_ids", &list, &is_ids, &flat, msg, cap);
    if (n < 0) return 400;
    if ((long)n * out->base.n > s->opt->max_seqs)
        return snprintf(msg, cap,
                        "%s x n = %d x %d exceeds the server's limit of %d sequences per request "
                        "(--max-seqs-per-request)",
                        kind == SERVE_TRL && is_ids ? "prompt_token_ids" : what, n, out->base.n,
                        s->opt->max_seqs),
               400;
    out->ids = calloc((size_t)n, sizeof *out->ids), out->lens = calloc((size_t)n, sizeof *out->lens);
    if (!out->ids || !out->lens) return snprintf(msg, cap, "out of memory"), 500;
    out->n = n;
    if (kind == SERVE_TRL && is_ids) what = "prompt_token_ids";
    unsigned bad = 0;
    if (kind == SERVE_CHAT) {
        bad = serve_chat_prompt(s, in, out, msg, cap);
        what = "messages";
    } else if (cJSON_IsString(list) || flat) {
        bad = prompt_ids(s, list, what, 0, flat, &out->ids[0], &out->lens[0], msg, cap);
    } else {
        int i = 0;
        for (const cJSON *e = list->child; e && !bad; e = e->next, i++)
            bad = prompt_ids(s, e, what, i, 0, &out->ids[i], &out->lens[i], msg, cap);
    }
    if (bad) return bad;
    if (out->prompt_logprobs >= 0 || (out->echo && out->logprobs >= 0))
        for (int i = 0; i < n; i++)
            if (out->lens[i] < 1) return snprintf(msg, cap, "%s[%d]: empty", what, i), 400;
    snprintf(out->id, sizeof out->id, "%s-%016llx", kind == SERVE_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)serve_random(s));
    return within_context(s, out, what, kind == SERVE_CHAT && !max_given, msg, cap) ? 400 : 0;
}

void serve_input_free(serve_input *in) {
    if (in->lora_server) serve_lora_release(in->lora_server, in->base.adapter);
    for (int i = 0; i < in->n && in->ids; i++) free(in->ids[i]);
    free(in->ids), free(in->lens), free(in->stop_ids), free(in->bias_ids), free(in->bias);
    serve_stops_free(in->stops);
    memset(in, 0, sizeof *in);
}

ctrl_gen_request *serve_input_requests(ctrl_server *s, const serve_input *in) {
    (void)s;
    ctrl_gen_request *reqs = calloc((size_t)in->n, sizeof *reqs);
    for (int i = 0; reqs && i < in->n; i++) {
        reqs[i] = in->base;
        reqs[i].prompt = in->ids[i], reqs[i].prompt_len = in->lens[i],
        reqs[i].seed = in->base.seed + (uint64_t)i;
        reqs[i].stop_ids = in->stop_ids, reqs[i].n_stop = in->n_stop_ids;
        reqs[i].top_logprobs = in->logprobs > 0 ? in->logprobs : 0;
        reqs[i].bias_ids = in->bias_ids, reqs[i].bias = in->bias, reqs[i].n_bias = in->n_bias;
        reqs[i].min_tokens = in->min_tokens;
        serve_stops_attach(in, &reqs[i]);
    }
    return reqs;
}
