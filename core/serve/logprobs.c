/* Log-probabilities in the OpenAI and vLLM shapes: completions' {tokens, token_logprobs,
 * top_logprobs, text_offset} (top_logprobs: the drawn token and the N most likely, as vLLM),
 * chat's {content: [{token, logprob, bytes, top_logprobs}]}, and vLLM's prompt_logprobs
 * ([null, {"ID": {logprob, rank, decoded_token}}, ...]) from the prompts scored by the engine.
 * Tokens are their text, or "token_id:ID" with return_tokens_as_token_ids. Log-probabilities are
 * floored at -9999 as vLLM's (JSON has no -inf). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

static double floored(float lp) { return isnan(lp) ? -9999.0 : lp < -9999.0f ? -9999.0 : (double)lp; }

/* A token as the response names it (malloc'd). */
static char *token_name(ctrl_server *s, const serve_input *in, int32_t id) {
    if (in->tokens_as_ids || id < 0) {
        char *b = malloc(32);
        if (b) snprintf(b, 32, "token_id:%d", id);
        return b;
    }
    char *txt = NULL;
    size_t n = 0;
    if (ctrl_tokenizer_decode(s->tok, &id, 1, 0, &txt, &n) != CTRL_OK) return strdup("");
    return txt;
}

static cJSON *bytes_of(const char *t) {
    cJSON *a = cJSON_CreateArray();
    for (const unsigned char *p = (const unsigned char *)t; *p; p++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(*p));
    return a;
}

/* Completions: token i's entries appended to the four lists (top: its own and k alternatives). */
static void completion_entry(ctrl_server *s, const serve_input *in, cJSON *lp, int32_t id, float logprob,
                             const int32_t *top_ids, const float *top_lps, int k, int first_prompt,
                             long *offset) {
    char *name = token_name(s, in, id);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "text_offset"),
                         cJSON_CreateNumber((double)*offset));
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp, "tokens"),
                         cJSON_CreateString(name ? name : ""));
    cJSON *tl = cJSON_GetObjectItemCaseSensitive(lp, "token_logprobs"),
          *tops = cJSON_GetObjectItemCaseSensitive(lp, "top_logprobs");
    if (first_prompt) { /* the first prompt token has no log-probability */
        cJSON_AddItemToArray(tl, cJSON_CreateNull()), cJSON_AddItemToArray(tops, cJSON_CreateNull());
    } else {
        cJSON_AddItemToArray(tl, cJSON_CreateNumber(floored(logprob)));
        cJSON *d = cJSON_CreateObject();
        cJSON_AddNumberToObject(d, name ? name : "", floored(logprob));
        for (int j = 0; j < k && top_ids[j] >= 0; j++) {
            char *t = token_name(s, in, top_ids[j]);
            if (t && !cJSON_GetObjectItemCaseSensitive(d, t))
                cJSON_AddNumberToObject(d, t, floored(top_lps[j]));
            free(t);
        }
        cJSON_AddItemToArray(tops, d);
    }
    if (in->tokens_as_ids) { /* the offset still counts the token's text */
        serve_input text_of = *in;
        text_of.tokens_as_ids = 0;
        char *t = token_name(s, &text_of, id);
        *offset += t ? (long)strlen(t) : 0;
        free(t);
    } else if (name) {
        *offset += (long)strlen(name);
    }
    free(name);
}

static cJSON *chat_entry(ctrl_server *s, const serve_input *in, int32_t id, float logprob) {
    char *name = token_name(s, in, id);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "token", name ? name : "");
    cJSON_AddNumberToObject(e, "logprob", floored(logprob));
    cJSON_AddItemToObject(e, "bytes", bytes_of(name ? name : ""));
    free(name);
    return e;
}

cJSON *serve_logprobs(ctrl_server *s, const serve_input *in, int kind, const ctrl_gen_output *g, int from,
                      int to, long *offset) {
    const int k = g->top_k;
    cJSON *lp = cJSON_CreateObject();
    if (kind == SERVE_CHAT) {
        cJSON *content = cJSON_AddArrayToObject(lp, "content");
        for (int i = from; i < to; i++) {
            cJSON *e = chat_entry(s, in, g->ids[i], g->logprobs[i]),
                  *tops = cJSON_AddArrayToObject(e, "top_logprobs");
            for (int j = 0; j < k && g->top_ids[(size_t)i * k + j] >= 0; j++)
                cJSON_AddItemToArray(tops, chat_entry(s, in, g->top_ids[(size_t)i * k + j],
                                                      g->top_logprobs[(size_t)i * k + j]));
            cJSON_AddItemToArray(content, e);
        }
        return lp;
    }
    cJSON_AddArrayToObject(lp, "text_offset"), cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON_AddArrayToObject(lp, "tokens"), cJSON_AddArrayToObject(lp, "top_logprobs");
    for (int i = from; i < to; i++)
        completion_entry(s, in, lp, g->ids[i], g->logprobs[i], k ? g->top_ids + (size_t)i * k : NULL,
                         k ? g->top_logprobs + (size_t)i * k : NULL, k, 0, offset);
    return lp;
}

void serve_logprobs_prepend_prompt(ctrl_server *s, const serve_input *in, cJSON *lp, const int32_t *ids,
                                   int len, const serve_scored *sc) {
    cJSON *rest = cJSON_Duplicate(lp, 1); /* the completion's entries go after the prompt's */
    const char *keys[] = {"text_offset", "token_logprobs", "tokens", "top_logprobs"};
    for (int i = 0; i < 4; i++) cJSON_ReplaceItemInObjectCaseSensitive(lp, keys[i], cJSON_CreateArray());
    long offset = 0;
    for (int p = 0; p < len; p++)
        completion_entry(s, in, lp, ids[p], sc->logprob[p], sc->top_ids + (size_t)p * sc->k,
                         sc->top_lps + (size_t)p * sc->k, sc->k, p == 0, &offset);
    for (int i = 0; i < 4; i++) {
        cJSON *to = cJSON_GetObjectItemCaseSensitive(lp, keys[i]);
        for (cJSON *e = cJSON_GetObjectItemCaseSensitive(rest, keys[i])->child; e; e = e->next) {
            cJSON *c = cJSON_Duplicate(e, 1);
            if (i == 0) cJSON_SetNumberValue(c, c->valuedouble + (double)offset);
            cJSON_AddItemToArray(to, c);
        }
    }
    cJSON_Delete(rest);
}

cJSON *serve_prompt_logprobs(ctrl_server *s, const serve_input *in, const int32_t *ids, int len,
                             const serve_scored *sc) {
    cJSON *a = cJSON_CreateArray();
    cJSON_AddItemToArray(a, cJSON_CreateNull());
    for (int p = 1; p < len; p++) {
        cJSON *d = cJSON_CreateObject();
        char key[16];
        for (int j = -1; j < sc->k; j++) { /* the prompt's own token first, then the top k */
            const int32_t id = j < 0 ? ids[p] : sc->top_ids[(size_t)p * sc->k + j];
            if (id < 0) break;
            snprintf(key, sizeof key, "%d", id);
            if (cJSON_GetObjectItemCaseSensitive(d, key)) continue;
            cJSON *e = cJSON_AddObjectToObject(d, key);
            cJSON_AddNumberToObject(e, "logprob",
                                    floored(j < 0 ? sc->logprob[p] : sc->top_lps[(size_t)p * sc->k + j]));
            cJSON_AddNumberToObject(e, "rank", j < 0 ? sc->rank[p] : j + 1);
            char *name = token_name(s, in, id);
            cJSON_AddStringToObject(e, "decoded_token", name ? name : "");
            free(name);
        }
        cJSON_AddItemToArray(a, d);
    }
    return a;
}

unsigned serve_score_prompts(ctrl_server *s, const serve_input *in, int k, serve_scored *out, char *msg,
                             size_t cap) {
    memset(out, 0, sizeof *out * (size_t)in->n);
    ctrl_status st = CTRL_OK;
    ctrl_batcher_lock_engine(s->batch); /* between generations, never during one */
    for (int i = 0; i < in->n && st == CTRL_OK; i++) {
        const size_t L = (size_t)in->lens[i];
        serve_scored *sc = &out[i];
        sc->k = k;
        sc->logprob = malloc(sizeof(float) * L), sc->rank = malloc(sizeof(int32_t) * L);
        sc->top_ids = malloc(sizeof(int32_t) * L * (size_t)(k ? k : 1));
        sc->top_lps = malloc(sizeof(float) * L * (size_t)(k ? k : 1));
        st = sc->logprob && sc->rank && sc->top_ids && sc->top_lps
                 ? ctrl_engine_score_adapter(s->eng, in->base.adapter, in->ids[i], in->lens[i],
                                             in->base.sampling.temperature, k, sc->logprob, sc->rank,
                                             sc->top_ids, sc->top_lps)
                 : ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
    }
    ctrl_batcher_unlock_engine(s->batch);
    if (st == CTRL_OK) return 0;
    snprintf(msg, cap, "prompt_logprobs: %s", ctrl_error_message());
    return st == CTRL_ERR_NOMEM ? 500 : serve_generation_failed(s);
}

void serve_scored_free(serve_scored *sc, int n) {
    for (int i = 0; sc && i < n; i++)
        free(sc[i].logprob), free(sc[i].rank), free(sc[i].top_ids), free(sc[i].top_lps);
}
