/* A generation request's OpenAI and vLLM fields beyond sampling (request.c reads those): what the
 * response carries (logprobs, top_logprobs, prompt_logprobs, echo, return_token_ids,
 * return_tokens_as_token_ids, skip_special_tokens, stream_options), how a completion ends (stop,
 * stop_token_ids, include_stop_str_in_output, ignore_eos, max_completion_tokens) and the fields
 * accepted as metadata (user). Fields ctrl serve cannot honour are refused naming them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

struct serve_stops {
    ctrl_server *s;
    int skip_special;
    int n;
    size_t longest;
    char **str;
};

/* Fields of the OpenAI or vLLM APIs that ctrl serve does not implement: refused by name. */
static const char *const unsupported[] = {"suffix",
                                          "best_of",
                                          "tools",
                                          "tool_choice",
                                          "functions",
                                          "function_call",
                                          "parallel_tool_calls",
                                          "response_format",
                                          "structured_outputs",
                                          "guided_json",
                                          "guided_regex",
                                          "guided_choice",
                                          "guided_grammar",
                                          "chat_template",
                                          "modalities",
                                          "audio",
                                          "prediction",
                                          "reasoning_effort",
                                          "service_tier",
                                          "store",
                                          "metadata",
                                          "continue_final_message",
                                          "documents",
                                          "features",
                                          "truncate_prompt_tokens",
                                          "allowed_token_ids",
                                          "bad_words",
                                          "prompt_embeds",
                                          "web_search_options",
                                          NULL};

static int boolean(const cJSON *f, int *out, char *msg, size_t cap) {
    if (cJSON_IsBool(f)) return *out = cJSON_IsTrue(f), 0;
    return snprintf(msg, cap, "%s: true or false", f->string), -1;
}

static int count(const cJSON *f, int hi, int *out, char *msg, size_t cap) {
    const double v = cJSON_IsNumber(f) ? f->valuedouble : NAN;
    if (isfinite(v) && v == floor(v) && v >= 0 && v <= hi) return *out = (int)v, 0;
    return snprintf(msg, cap, "%s: an integer between 0 and %d", f->string, hi), -1;
}

static int stop_strings(ctrl_server *s, const cJSON *f, serve_input *out, char *msg, size_t cap) {
    const int list = cJSON_IsArray(f), n = list ? cJSON_GetArraySize(f) : 1;
    if (!list && !cJSON_IsString(f)) return snprintf(msg, cap, "stop: a string or a list of strings"), -1;
    serve_stops_free(out->stops); /* a key given twice: the last one counts */
    out->stops = NULL;
    serve_stops *st = calloc(1, sizeof *st);
    if (!st || !(st->str = calloc((size_t)n + 1, sizeof *st->str)))
        return free(st), snprintf(msg, cap, "out of memory"), -1;
    st->s = s;
    out->stops = st;
    int i = 0;
    for (const cJSON *e = list ? f->child : f; e && i < n; e = list ? e->next : NULL, i++) {
        if (!cJSON_IsString(e) || !e->valuestring[0])
            return snprintf(msg, cap, "stop[%d]: a non-empty string", i), -1;
        if (!(st->str[st->n++] = strdup(e->valuestring))) return snprintf(msg, cap, "out of memory"), -1;
        const size_t len = strlen(e->valuestring);
        st->longest = len > st->longest ? len : st->longest;
    }
    return 0;
}

static int stop_token_ids(ctrl_server *s, const cJSON *f, serve_input *out, char *msg, size_t cap) {
    const int V = ctrl_tokenizer_vocab_size(s->tok);
    if (!cJSON_IsArray(f)) return snprintf(msg, cap, "stop_token_ids: a list of token ids"), -1;
    const int n = cJSON_GetArraySize(f);
    int32_t *ids = realloc(out->stop_ids, sizeof(int32_t) * (size_t)(out->n_stop_ids + n + 1));
    if (!ids) return snprintf(msg, cap, "out of memory"), -1;
    out->stop_ids = ids;
    int i = 0;
    for (const cJSON *e = f->child; e; e = e->next, i++) {
        const double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!(v >= 0 && v < V && v == floor(v)))
            return snprintf(msg, cap, "stop_token_ids[%d]: a token id in [0, %d)", i, V), -1;
        out->stop_ids[out->n_stop_ids++] = (int32_t)v;
    }
    return 0;
}

static int stream_options(const cJSON *f, serve_input *out, char *msg, size_t cap) {
    if (!cJSON_IsObject(f)) return snprintf(msg, cap, "stream_options: an object"), -1;
    for (const cJSON *o = f->child; o; o = o->next) {
        if (cJSON_IsNull(o)) continue;
        if (strcmp(o->string, "include_usage"))
            return snprintf(msg, cap, "stream_options.%s: not supported (include_usage is)", o->string), -1;
        if (!cJSON_IsBool(o)) return snprintf(msg, cap, "stream_options.include_usage: true or false"), -1;
        out->include_usage = cJSON_IsTrue(o);
    }
    return 0;
}

/* A value of an unsupported field that asks for nothing (what clients send by default): an empty
 * string, list or object, false, 0 or 1 (best_of), "none" (tool_choice), {"type": "text"}
 * (response_format). */
static int neutral(const cJSON *f) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(f, "type");
    return cJSON_IsFalse(f) ||
           (cJSON_IsString(f) && (!f->valuestring[0] || !strcmp(f->valuestring, "none"))) ||
           ((cJSON_IsArray(f) || cJSON_IsObject(f)) && !f->child) ||
           (cJSON_IsNumber(f) && (f->valuedouble == 0 || f->valuedouble == 1)) ||
           (!strcmp(f->string, "response_format") && cJSON_GetArraySize(f) == 1 && cJSON_IsString(type) &&
            !strcmp(type->valuestring, "text"));
}

/* OpenAI's logit_bias: {"token id": bias in [-100, 100]}. */
static int logit_bias(ctrl_server *s, const cJSON *f, serve_input *out, char *msg, size_t cap) {
    const int V = ctrl_tokenizer_vocab_size(s->tok), n = cJSON_GetArraySize(f);
    if (!cJSON_IsObject(f)) return snprintf(msg, cap, "logit_bias: an object {\"token id\": bias}"), -1;
    free(out->bias_ids), free(out->bias); /* a key given twice: the last one counts */
    out->n_bias = 0;
    out->bias_ids = malloc(sizeof(int32_t) * (size_t)(n + 1)),
    out->bias = malloc(sizeof(float) * (size_t)(n + 1));
    if (!out->bias_ids || !out->bias) return snprintf(msg, cap, "out of memory"), -1;
    for (const cJSON *e = f->child; e; e = e->next) {
        char *end = NULL;
        const long id = strtol(e->string, &end, 10);
        if (!e->string[0] || *end || id < 0 || id >= V)
            return snprintf(msg, cap, "logit_bias: '%.40s' is not a token id in [0, %d)", e->string, V), -1;
        const double b = cJSON_IsNumber(e) ? e->valuedouble : NAN;
        if (!(b >= -100 && b <= 100))
            return snprintf(msg, cap, "logit_bias: a bias between -100 and 100"), -1;
        out->bias_ids[out->n_bias] = (int32_t)id, out->bias[out->n_bias++] = (float)b;
    }
    return 0;
}

int serve_option_field(ctrl_server *s, int kind, const cJSON *f, serve_input *out, int *ignore_eos, char *msg,
                       size_t cap) {
    const char *k = f->string;
    const int V = ctrl_tokenizer_vocab_size(s->tok), openai = kind != SERVE_TRL;
    int v = 0;
    for (int i = 0; unsupported[i]; i++)
        if (!strcmp(k, unsupported[i]))
            return neutral(f) ? 0 : (snprintf(msg, cap, "%s: not supported by ctrl serve", k), -1);
    if (!strcmp(k, "logit_bias")) return logit_bias(s, f, out, msg, cap);
    if (!strcmp(k, "min_tokens")) return count(f, s->context, &out->min_tokens, msg, cap);
    if (openai && !strcmp(k, "stop")) return stop_strings(s, f, out, msg, cap);
    if (!strcmp(k, "stop_token_ids")) return stop_token_ids(s, f, out, msg, cap);
    if (openai && !strcmp(k, "stream_options")) return stream_options(f, out, msg, cap);
    if (openai && !strcmp(k, "user"))
        return cJSON_IsString(f) ? 0 : (snprintf(msg, cap, "user: a string"), -1);
    if (!strcmp(k, "ignore_eos")) return boolean(f, ignore_eos, msg, cap);
    if (!strcmp(k, "skip_special_tokens")) return boolean(f, &out->skip_special, msg, cap);
    if (openai && !strcmp(k, "include_stop_str_in_output")) return boolean(f, &out->include_stop, msg, cap);
    if (openai && !strcmp(k, "return_token_ids")) return boolean(f, &out->token_ids, msg, cap);
    if (openai && !strcmp(k, "return_tokens_as_token_ids")) return boolean(f, &out->tokens_as_ids, msg, cap);
    if (kind == SERVE_COMPLETIONS && !strcmp(k, "echo")) return boolean(f, &out->echo, msg, cap);
    if (kind == SERVE_COMPLETIONS && !strcmp(k, "logprobs")) {
        if (count(f, V, &v, msg, cap)) return -1;
        return out->logprobs = v, 0;
    }
    if (kind == SERVE_CHAT && !strcmp(k, "logprobs")) return boolean(f, &out->chat_logprobs, msg, cap);
    if (kind == SERVE_CHAT && !strcmp(k, "top_logprobs")) return count(f, V, &out->chat_top, msg, cap);
    if (openai && !strcmp(k, "prompt_logprobs")) {
        if (count(f, V, &v, msg, cap)) return -1;
        return out->prompt_logprobs = v, 0;
    }
    return 1;
}

int serve_input_finish_options(serve_input *in, char *msg, size_t cap) {
    if (in->min_tokens > in->base.max_tokens)
        return snprintf(msg, cap, "min_tokens: %d is more than max_tokens %d", in->min_tokens,
                        in->base.max_tokens),
               -1;
    if (in->chat_top > 0 && in->chat_logprobs != 1) /* as OpenAI: top_logprobs wants logprobs */
        return snprintf(msg, cap, "top_logprobs: needs \"logprobs\": true"), -1;
    if (in->chat_logprobs == 1) in->logprobs = in->chat_top > 0 ? in->chat_top : 0;
    if (in->stops) in->stops->skip_special = in->skip_special;
    return 0;
}

/* Whether a stop string appears in the text of the completion's last tokens (the engine calls it
 * after every drawn token; a match must end in the newest token, so a window of tokens as long as
 * the longest stop string in bytes, and a few more, holds it). */
static int stop_check(void *ctx, const int32_t *ids, int len) {
    serve_stops *st = ctx;
    const int w = (int)st->longest + 4, from = len > w ? len - w : 0;
    char *txt = NULL;
    size_t n = 0;
    if (ctrl_tokenizer_decode(st->s->tok, ids + from, (size_t)(len - from), st->skip_special, &txt, &n) !=
        CTRL_OK)
        return 0;
    int hit = 0;
    for (int i = 0; i < st->n && !hit; i++) hit = strstr(txt, st->str[i]) != NULL;
    free(txt);
    return hit;
}

void serve_stops_attach(const serve_input *in, ctrl_gen_request *r) {
    if (!in->stops || in->stops->n == 0) return;
    r->stop_check = stop_check, r->stop_ctx = in->stops;
}

size_t serve_stops_longest(const serve_input *in) { return in->stops ? in->stops->longest : 0; }

void serve_stops_free(serve_stops *st) {
    for (int i = 0; st && i < st->n; i++) free(st->str[i]);
    if (st) free(st->str);
    free(st);
}

char *serve_completion_text(ctrl_server *s, const serve_input *in, const ctrl_gen_output *g, int final,
                            int *by_string) {
    char *txt = NULL;
    size_t tl = 0;
    *by_string = 0;
    if (ctrl_tokenizer_decode(s->tok, g->ids, (size_t)g->len, in->skip_special, &txt, &tl) != CTRL_OK)
        return strdup("");
    char *cut = NULL;
    size_t cut_len = 0;
    for (int i = 0; in->stops && i < in->stops->n; i++) {
        char *at = strstr(txt, in->stops->str[i]);
        if (at && (!cut || at < cut)) cut = at, cut_len = strlen(in->stops->str[i]);
    }
    if (cut) {
        cut[in->include_stop ? cut_len : 0] = '\0';
        *by_string = 1;
    } else if (!final && in->stops) { /* a stop string may be starting: hold its length back */
        const size_t hold = in->stops->longest - 1;
        txt[tl > hold ? tl - hold : 0] = '\0';
    }
    return txt;
}
