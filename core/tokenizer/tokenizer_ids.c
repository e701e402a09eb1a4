/* Token ids read from tokenizer.json, which is untrusted: every id is checked where it is read,
 * before it indexes anything. Vocabulary ids are integers below TOK_MAX_IDS (the id table costs
 * 8 bytes an id) and name one token each (the library would decode a shared id either way). Added tokens get
 * the ids the `tokenizers` library gives them (it ignores the id written in the file: an existing vocabulary
 * entry keeps its id, a new token takes the next free id), so a file whose id differs from that one is
 * refused rather than read two ways. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_internal.h"

/* An integer id in [0, cap) from a JSON value; -1 otherwise. */
static int64_t json_id(const cJSON *v, int64_t cap) {
    if (!cJSON_IsNumber(v)) return -1;
    const double d = v->valuedouble;
    if (!(d >= 0) || d >= (double)cap || d != floor(d)) return -1;
    return (int64_t)d;
}

static const char *json_number_text(const cJSON *v, char buf[64]) {
    if (cJSON_IsNumber(v))
        snprintf(buf, 64, "%.17g", v->valuedouble);
    else
        snprintf(buf, 64, "%s", cJSON_IsString(v) ? "a string" : "not a number");
    return buf;
}

ctrl_status tok_load_vocab(ctrl_tokenizer *t, const cJSON *vocab, int n_added) {
    const int n = cJSON_GetArraySize(vocab);
    if (tok_map_init(&t->vocab, (size_t)n + 1024) != 0)
        return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: vocabulary");
    int32_t max_id = -1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        const int64_t id = json_id(e, TOK_MAX_IDS);
        char num[64];
        if (id < 0)
            return ctrl_error_set(
                CTRL_ERR_FORMAT, "%s: model.vocab: '%s' has no valid id (%s; an id is an integer in [0, %d))",
                t->path, e->string, json_number_text(e, num), TOK_MAX_IDS);
        if (tok_map_put(&t->vocab, e->string, strlen(e->string), (int32_t)id) != 0)
            return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: vocabulary");
        if (id > max_id) max_id = (int32_t)id;
    }
    /* room for every vocabulary id and for the ids the added tokens can get (one past the largest
     * id before them each) */
    const int64_t cap = (int64_t)max_id + 1 + (n_added > 0 ? n_added : 0) + (int64_t)t->vocab.count;
    if (cap > INT32_MAX)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: model.vocab and added_tokens hold more than %d tokens",
                              t->path, INT32_MAX);
    t->id_to_token = calloc((size_t)cap, sizeof *t->id_to_token);
    if (!t->id_to_token) return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: vocabulary");
    t->id_cap = (int32_t)cap;
    /* A key written twice keeps its last id (as a JSON map does): index the map, not the list. */
    for (size_t i = 0; i < t->vocab.cap; i++) {
        if (!t->vocab.keys[i]) continue;
        const int32_t id = t->vocab.values[i];
        if (t->id_to_token[id])
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: model.vocab: '%s' and '%s' both have id %d", t->path,
                                  t->id_to_token[id], t->vocab.keys[i], id);
        t->id_to_token[id] = t->vocab.keys[i];
    }
    t->n_ids = max_id + 1;
    return CTRL_OK;
}

/* The id the library gives the added token `content` after the ones already read. */
static int32_t library_added_id(const ctrl_tokenizer *t, const char *content) {
    const int32_t in_vocab = tok_map_get(&t->vocab, content, strlen(content));
    if (in_vocab >= 0) return in_vocab;
    const int32_t entries = (int32_t)t->vocab.count;
    int32_t max_added = -1;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id > max_added) max_added = t->added[i].id;
    if (max_added < 0) return entries;
    return max_added >= entries || entries == 0 ? max_added + 1 : entries;
}

ctrl_status tok_load_added(ctrl_tokenizer *t, const cJSON *list) {
    if (!list || cJSON_IsNull(list)) return CTRL_OK;
    if (!cJSON_IsArray(list))
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: added_tokens is not an array", t->path);
    const int n = cJSON_GetArraySize(list);
    t->added = calloc((size_t)(n ? n : 1), sizeof *t->added);
    if (!t->added) return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: added tokens");
    int k = 0;
    for (const cJSON *e = list->child; e; e = e->next, k++) {
        const cJSON *idv = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *cv = cJSON_GetObjectItemCaseSensitive(e, "content");
        const char *content = cJSON_IsString(cv) ? cv->valuestring : NULL;
        if (!cJSON_IsNumber(idv) || !content || !content[0])
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: added_tokens[%d]: an added token lacks id or content",
                                  t->path, k);
        for (int i = 0; i < t->n_added; i++)
            if (!strcmp(t->added[i].content, content))
                return ctrl_error_set(CTRL_ERR_FORMAT, "%s: added_tokens[%d]: '%s' is listed twice", t->path,
                                      k, content);
        const int32_t want = library_added_id(t, content);
        char num[64];
        if (json_id(idv, (int64_t)INT32_MAX + 1) != want)
            return ctrl_error_set(
                CTRL_ERR_FORMAT,
                "%s: added_tokens[%d]: '%s' has id %s, but the tokenizers library gives it id "
                "%d (%s)",
                t->path, k, content, json_number_text(idv, num), want,
                tok_map_get(&t->vocab, content, strlen(content)) >= 0
                    ? "its id in model.vocab"
                    : "the next id after the vocabulary and the added tokens before it");
        /* want < id_cap: at most the vocabulary's entries plus the added tokens before this one */
        if (want >= t->id_cap || (t->id_to_token[want] && strcmp(t->id_to_token[want], content) != 0))
            return ctrl_error_set(
                CTRL_ERR_FORMAT, "%s: added_tokens[%d]: id %d of '%s' is already '%s' in model.vocab",
                t->path, k, want, content, want < t->id_cap ? t->id_to_token[want] : "(beyond the table)");
        tok_added *a = &t->added[t->n_added];
        a->content = strdup(content);
        if (!a->content) return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: added tokens");
        t->n_added++;
        a->len = strlen(content);
        a->id = want;
        a->special = tok_json_bool(e, "special", 0), a->lstrip = tok_json_bool(e, "lstrip", 0);
        a->rstrip = tok_json_bool(e, "rstrip", 0), a->normalized = tok_json_bool(e, "normalized", 0);
        a->single_word = tok_json_bool(e, "single_word", 0);
        if (!t->id_to_token[want]) t->id_to_token[want] = a->content;
        if (want + 1 > t->n_ids) t->n_ids = want + 1;
    }
    return CTRL_OK;
}

/* TemplateProcessing's special tokens: the library emits special_tokens[name].ids, which must be
 * there (it refuses a template naming a missing one); ctrl supports one id per token. */
ctrl_status tok_template_token(const ctrl_tokenizer *t, const cJSON *p, const char *name, int32_t *id) {
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    const cJSON *entry = name ? cJSON_GetObjectItemCaseSensitive(map, name) : NULL;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(entry, "ids");
    if (!cJSON_IsArray(ids))
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "%s: post_processor: special token '%s' has no special_tokens entry with ids",
                              t->path, name ? name : "(none)");
    if (cJSON_GetArraySize(ids) != 1)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "%s: post_processor: special token '%s' has %d ids (one is supported)", t->path,
                              name, cJSON_GetArraySize(ids));
    const int64_t v = json_id(ids->child, t->n_ids);
    char num[64];
    if (v < 0 || !t->id_to_token[v])
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "%s: post_processor: special_tokens['%s'].ids = [%s] names no token (the "
                              "vocabulary has %d ids)",
                              t->path, name, json_number_text(ids->child, num), t->n_ids);
    *id = (int32_t)v;
    return CTRL_OK;
}
