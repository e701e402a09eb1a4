/* transformers' apply_chat_template around the template interpreter. */
#include <stdlib.h>
#include <string.h>

#include "template/chat.h"
#include "tokenizer/token_offsets.h"

/* transformers fills `reasoning_content` from the older names and adds `thinking` (for gpt-oss
 * templates): {"thinking": r, **message, "reasoning_content": r}. */
static void alias_reasoning(cJSON *messages) {
    static const char *const fields[] = {"reasoning_content", "thinking", "reasoning"};
    cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        if (!cJSON_IsObject(m)) continue;
        const cJSON *r = NULL;
        for (int f = 0; f < 3 && !r; f++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, fields[f]);
            if (v && !cJSON_IsNull(v)) r = v;
        }
        if (!r) continue;
        cJSON *value = cJSON_Duplicate(r, 1);
        if (cJSON_GetObjectItemCaseSensitive(m, "thinking")) {
            cJSON_ReplaceItemInObjectCaseSensitive(m, "thinking", cJSON_Duplicate(value, 1));
        } else { /* first key */
            cJSON *t = cJSON_Duplicate(value, 1);
            cJSON_free(t->string); /* the duplicate keeps the source's key: it leaked here */
            t->string = strdup("thinking");
            t->next = m->child;
            if (m->child) {
                t->prev = m->child->prev;
                m->child->prev = t;
            } else {
                t->prev = t;
            }
            m->child = t;
        }
        if (cJSON_GetObjectItemCaseSensitive(m, "reasoning_content"))
            cJSON_ReplaceItemInObjectCaseSensitive(m, "reasoning_content", value);
        else
            cJSON_AddItemToObject(m, "reasoning_content", value);
    }
}

ctrl_status ctrl_chat_render(const ctrl_template *t, const cJSON *vars, char **text, size_t *len,
                             uint8_t **generation_mask) {
    cJSON *v = cJSON_Duplicate(vars, 1);
    if (!v || !cJSON_IsObject(v)) {
        cJSON_Delete(v);
        return ctrl_error_set(CTRL_ERR_FORMAT, "chat template variables must be a JSON object");
    }
    cJSON *messages = cJSON_GetObjectItemCaseSensitive(v, "messages");
    if (!cJSON_IsArray(messages)) {
        cJSON_Delete(v);
        return ctrl_error_set(CTRL_ERR_FORMAT, "chat: \"messages\" must be a list of messages");
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) if (!cJSON_IsObject(m)) {
        cJSON_Delete(v);
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "chat: each message must be an object with \"role\" and \"content\"");
    }
    alias_reasoning(messages);
    if (!cJSON_HasObjectItem(v, "tools")) cJSON_AddNullToObject(v, "tools");
    if (!cJSON_HasObjectItem(v, "documents")) cJSON_AddNullToObject(v, "documents");
    if (!cJSON_HasObjectItem(v, "add_generation_prompt")) cJSON_AddFalseToObject(v, "add_generation_prompt");
    ctrl_status st = ctrl_template_render(t, v, text, len, generation_mask);
    cJSON_Delete(v);
    return st;
}

void ctrl_chat_add_special_tokens(const ctrl_tokenizer *tok, cJSON *vars) {
    const struct {
        const char *name;
        int32_t id;
    } special[] = {{"bos_token", ctrl_tokenizer_bos_id(tok)},
                   {"eos_token", ctrl_tokenizer_eos_id(tok)},
                   {"pad_token", ctrl_tokenizer_pad_id(tok)}};
    for (int i = 0; i < 3; i++) {
        const char *s = special[i].id >= 0 ? ctrl_tokenizer_id_to_token(tok, special[i].id) : NULL;
        if (s && !cJSON_HasObjectItem(vars, special[i].name))
            cJSON_AddStringToObject(vars, special[i].name, s);
    }
}

ctrl_status ctrl_chat_template_load(const ctrl_tokenizer *tok, ctrl_template **out) {
    const char *src = ctrl_tokenizer_chat_template(tok);
    if (!src)
        return ctrl_error_set(
            CTRL_ERR_FORMAT,
            "the tokenizer has no chat_template (tokenizer_config.json), so it cannot format "
            "conversations");
    return ctrl_template_compile(src, strlen(src), "tokenizer_config.json chat_template", out);
}

/* The token holding normalized byte `at` (binary search over the starts), or -1 past the end. */
static long token_at(const size_t *starts, size_t n, size_t at) {
    if (at >= starts[n]) return -1;
    size_t lo = 0, hi = n;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (starts[mid] <= at)
            lo = mid;
        else
            hi = mid;
    }
    return (long)lo;
}

ctrl_status ctrl_chat_encode(const ctrl_tokenizer *tok, const ctrl_template *t, const cJSON *vars,
                             int32_t **ids, size_t *n_ids, uint8_t **assistant_mask) {
    char *text;
    size_t len;
    uint8_t *gen = NULL;
    *ids = NULL;
    ctrl_status st = ctrl_chat_render(t, vars, &text, &len, assistant_mask ? &gen : NULL);
    if (st != CTRL_OK) return st;
    st = ctrl_tokenizer_encode(tok, text, len, 0, ids, n_ids);
    if (st == CTRL_OK && assistant_mask) {
        size_t n = *n_ids, *starts = malloc(sizeof(size_t) * (n + 1));
        uint8_t *mask = calloc(n ? n : 1, 1);
        st = ctrl_tokenizer_token_starts(tok, *ids, n, starts);
        /* Each generation span [s, e) marks the tokens from the one holding s to the one holding
         * e - 1, as transformers maps them with char_to_token. */
        for (size_t s = 0; st == CTRL_OK && s < len;) {
            if (!gen[s]) {
                s++;
                continue;
            }
            size_t e = s;
            while (e < len && gen[e]) e++;
            long a = token_at(starts, n, ctrl_tokenizer_normalized_offset(tok, text, s));
            long b = token_at(starts, n, ctrl_tokenizer_normalized_offset(tok, text, e - 1));
            if (a < 0) break;
            for (long k = a; k <= (b < 0 ? (long)n - 1 : b); k++) mask[k] = 1;
            s = e;
        }
        free(starts);
        if (st == CTRL_OK)
            *assistant_mask = mask;
        else
            free(mask);
    }
    if (st != CTRL_OK) free(*ids), *ids = NULL;
    free(text);
    free(gen);
    return st;
}
