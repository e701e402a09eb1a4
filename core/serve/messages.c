/* A chat request's messages through the model's chat template with the generation prompt: one
 * prompt. Content is a string or a list of content parts; text parts are joined with newlines
 * (vLLM's "string" content format), any other part (images, audio, files) is refused naming it.
 * chat_template_kwargs reach the template as variables (e.g. enable_thinking). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

/* The text of content parts; NULL with a message (400) when a part is not text. */
static char *parts_text(const cJSON *parts, int m, char *msg, size_t cap) {
    size_t len = 0;
    int j = 0;
    for (const cJSON *p = parts->child; p; p = p->next, j++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type"),
                    *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(type))
            return snprintf(msg, cap, "messages[%d].content[%d].type: a string (\"text\")", m, j), NULL;
        if (strcmp(type->valuestring, "text"))
            return snprintf(msg, cap,
                            "messages[%d].content[%d].type: '%s' is not supported (text parts only)", m, j,
                            type->valuestring),
                   NULL;
        if (!cJSON_IsString(text))
            return snprintf(msg, cap, "messages[%d].content[%d].text: a string", m, j), NULL;
        len += strlen(text->valuestring) + 1;
    }
    char *out = malloc(len + 1), *at = out;
    if (!out) return snprintf(msg, cap, "out of memory"), NULL;
    *out = '\0';
    for (const cJSON *p = parts->child; p; p = p->next) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        at += sprintf(at, "%s%s", at == out ? "" : "\n", t);
    }
    return out;
}

/* The messages as the template reads them: content parts joined into strings; NULL with msg. */
static cJSON *template_messages(const cJSON *msgs, char *msg, size_t cap) {
    cJSON *out = cJSON_CreateArray();
    int i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        if (!cJSON_IsObject(m))
            return cJSON_Delete(out), snprintf(msg, cap, "messages[%d]: an object", i), NULL;
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"),
                    *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role))
            return cJSON_Delete(out), snprintf(msg, cap, "messages[%d].role: a string", i), NULL;
        cJSON *copy = cJSON_Duplicate(m, 1);
        cJSON_AddItemToArray(out, copy);
        if (cJSON_IsArray(content)) {
            char *text = parts_text(content, i, msg, cap);
            if (!text) return cJSON_Delete(out), NULL;
            cJSON_ReplaceItemInObjectCaseSensitive(copy, "content", cJSON_CreateString(text));
            free(text);
        } else if (content && !cJSON_IsString(content) && !cJSON_IsNull(content)) {
            cJSON_Delete(out);
            return snprintf(msg, cap, "messages[%d].content: a string or a list of content parts", i), NULL;
        }
    }
    return out;
}

unsigned serve_chat_prompt(ctrl_server *s, const cJSON *in, serve_input *out, char *msg, size_t cap) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(in, "messages"),
                *kw = cJSON_GetObjectItemCaseSensitive(in, "chat_template_kwargs"),
                *gen = cJSON_GetObjectItemCaseSensitive(in, "add_generation_prompt");
    if (!s->chat) return snprintf(msg, cap, "messages: the model's tokenizer has no chat template"), 400;
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return snprintf(msg, cap, "messages: a non-empty list"), 400;
    if (kw && !cJSON_IsNull(kw) && !cJSON_IsObject(kw))
        return snprintf(msg, cap, "chat_template_kwargs: an object"), 400;
    if (gen && !cJSON_IsNull(gen) && !cJSON_IsBool(gen))
        return snprintf(msg, cap, "add_generation_prompt: true or false"), 400;
    cJSON *list = template_messages(msgs, msg, cap);
    if (!list) return 400;
    cJSON *vars = cJSON_CreateObject();
    for (const cJSON *k = cJSON_IsObject(kw) ? kw->child : NULL; k; k = k->next)
        if (strcmp(k->string, "messages")) cJSON_AddItemToObject(vars, k->string, cJSON_Duplicate(k, 1));
    cJSON_AddItemToObject(vars, "messages", list);
    cJSON_DeleteItemFromObjectCaseSensitive(vars, "add_generation_prompt");
    cJSON_AddBoolToObject(vars, "add_generation_prompt", !cJSON_IsFalse(gen));
    ctrl_chat_add_special_tokens(s->tok, vars);
    size_t n = 0;
    const ctrl_status st = ctrl_chat_encode(s->tok, s->chat, vars, &out->ids[0], &n, NULL);
    cJSON_Delete(vars);
    if (st != CTRL_OK || n == 0)
        return snprintf(msg, cap, "messages: the chat template cannot render them: %s", ctrl_error_message()),
               st == CTRL_OK                ? 400
               : st == CTRL_ERR_INTERRUPTED ? 503
               : st == CTRL_ERR_NOMEM       ? 500
                                            : 400;
    out->lens[0] = n > (size_t)s->context ? s->context + 1 : (int)n;
    return 0;
}
