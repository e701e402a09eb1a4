/* TRL's SFT tokenization of one row (trl/trainer/sft_trainer.py tokenize_fn and build_labels). */
#include <stdlib.h>
#include <string.h>

#include "config/config_load.h"
#include "file_text.h"
#include "template/chat.h"
#include "train/sft_format.h"

struct ctrl_sft_format {
    const ctrl_tokenizer *tok;
    ctrl_template *tpl; /* compiled on the first conversational row */
    char *template_path;
    const char *text_field, *messages_field, *prompt_field, *completion_field;
    int completion_only; /* -1 auto (on for prompt-completion rows) */
    int assistant_only;
    const char *eos; /* EOS token text, NULL when the tokenizer has none */
};

ctrl_status ctrl_sft_format_create(const ctrl_tokenizer *tok, const ctrl_config *cfg, ctrl_sft_format **out) {
    ctrl_sft_format *f = calloc(1, sizeof *f);
    if (!f) return ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    const char *v;
    f->tok = tok;
    f->text_field = (v = s->data.dataset_text_field) ? v : "text";
    f->messages_field = (v = s->data.messages_field) ? v : "messages";
    f->prompt_field = (v = s->data.prompt_field) ? v : "prompt";
    f->completion_field = (v = s->data.completion_field) ? v : "completion";
    f->completion_only = s->data.completion_only_loss;
    f->assistant_only = s->data.assistant_only_loss;
    v = s->data.chat_template_path;
    f->template_path = v ? strdup(v) : NULL;
    if (v && !f->template_path) {
        free(f);
        return ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
    }
    int32_t eos = ctrl_tokenizer_eos_id(tok);
    f->eos = eos >= 0 ? ctrl_tokenizer_id_to_token(tok, eos) : NULL;
    *out = f;
    return CTRL_OK;
}

void ctrl_sft_format_free(ctrl_sft_format *f) {
    if (!f) return;
    ctrl_template_free(f->tpl);
    free(f->template_path);
    free(f);
}

ctrl_status ctrl_row_chat_template(const ctrl_tokenizer *tok, const char *path, ctrl_template **out) {
    if (!path) return ctrl_chat_template_load(tok, out);
    ctrl_status st;
    char *src = ctrl_read_text_file(path, 1 << 20, &st);
    if (!src) return st;
    st = ctrl_template_compile(src, strlen(src), path, out);
    free(src);
    return st;
}

static ctrl_status chat_template(ctrl_sft_format *f) {
    return f->tpl ? CTRL_OK : ctrl_row_chat_template(f->tok, f->template_path, &f->tpl);
}

/* ShareGPT rows: `conversations` with from/value become `messages` with role/content, as TRL's
 * maybe_convert_to_chatml (keys renamed, values kept). */
static void sharegpt_to_chatml(cJSON *row, const char *messages_field) {
    cJSON *conv = cJSON_GetObjectItemCaseSensitive(row, "conversations");
    if (!cJSON_IsArray(conv) || cJSON_HasObjectItem(row, messages_field)) return;
    cJSON *m;
    cJSON_ArrayForEach(m, conv) {
        for (cJSON *k = m->child; k && cJSON_IsObject(m); k = k->next) {
            const char *to = !strcmp(k->string, "from")    ? "role"
                             : !strcmp(k->string, "value") ? "content"
                                                           : NULL;
            char *renamed = to ? strdup(to) : NULL;
            if (!renamed) continue; /* out of memory: the row keeps from/value and is refused as such */
            free(k->string);
            k->string = renamed;
        }
    }
    cJSON_AddItemReferenceToObject(row, messages_field, conv);
}

/* Template variables for a conversation: messages, tools (a JSON string is parsed, as TRL),
 * the row's chat_template_kwargs, the tokenizer's special tokens. */
cJSON *ctrl_row_chat_vars(const ctrl_tokenizer *tok, const cJSON *row, const cJSON *messages, int add_gen) {
    cJSON *vars = cJSON_CreateObject();
    cJSON_AddItemToObject(vars, "messages", cJSON_Duplicate(messages, 1));
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(row, "tools");
    if (cJSON_IsString(tools))
        cJSON_AddItemToObject(vars, "tools", cJSON_Parse(tools->valuestring));
    else if (tools && !cJSON_IsNull(tools))
        cJSON_AddItemToObject(vars, "tools", cJSON_Duplicate(tools, 1));
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(row, "chat_template_kwargs"), *k;
    if (cJSON_IsObject(kw))
        cJSON_ArrayForEach(k, kw) if (!cJSON_HasObjectItem(vars, k->string))
            cJSON_AddItemToObject(vars, k->string, cJSON_Duplicate(k, 1));
    if (!cJSON_HasObjectItem(vars, "add_generation_prompt"))
        cJSON_AddBoolToObject(vars, "add_generation_prompt", add_gen);
    ctrl_chat_add_special_tokens(tok, vars);
    return vars;
}

int ctrl_row_messages_ok(const cJSON *m) {
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) == 0) return 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, m) if (!cJSON_IsObject(e) ||
                                 !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "role"))) return 0;
    return 1;
}

static ctrl_status encode_text(const ctrl_sft_format *f, const char *a, const char *b, int add_eos,
                               int32_t **ids, size_t *n) {
    size_t la = strlen(a), lb = b ? strlen(b) : 0, le = f->eos ? strlen(f->eos) : 0;
    char *s = malloc(la + lb + le + 1);
    if (!s) return ctrl_error_set(CTRL_ERR_NOMEM, "out of memory for a row of %zu bytes", la + lb);
    memcpy(s, a, la);
    if (b) memcpy(s + la, b, lb);
    size_t len = la + lb;
    /* TRL appends the EOS text to the text / completion unless it already ends with it */
    if (add_eos && f->eos && !(len >= le && memcmp(s + len - le, f->eos, le) == 0))
        memcpy(s + len, f->eos, le), len += le;
    ctrl_status st = ctrl_tokenizer_encode(f->tok, s, len, 1, ids, n);
    free(s);
    return st;
}

size_t ctrl_common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t k = 0;
    while (k < na && k < nb && a[k] == b[k]) k++;
    return k;
}

ctrl_status ctrl_sft_format_row(ctrl_sft_format *f, cJSON *row, int32_t **ids_out, uint8_t **trained_out,
                                int *n_out, const char **why) {
    *why = NULL;
    if (!cJSON_IsObject(row)) return *why = "not a JSON object", CTRL_OK;
    sharegpt_to_chatml(row, f->messages_field);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(row, f->text_field);
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(row, f->messages_field);
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(row, f->prompt_field);
    const cJSON *completion = cJSON_GetObjectItemCaseSensitive(row, f->completion_field);
    const cJSON *input_ids = cJSON_GetObjectItemCaseSensitive(row, "input_ids");
    int32_t *ids = NULL, *p_ids = NULL;
    size_t n = 0, np = 0;
    uint8_t *assistant = NULL;
    long prompt_len = -1; /* >= 0: a prompt-completion row (the completion mask applies) */
    ctrl_status st = CTRL_OK;
    cJSON *vars = NULL;
    if (prompt || completion) {
        int strings = cJSON_IsString(prompt) && cJSON_IsString(completion);
        if (!strings && !(ctrl_row_messages_ok(prompt) && ctrl_row_messages_ok(completion)))
            return *why = "\"prompt\" and \"completion\" must both be strings or both be lists of messages",
                   CTRL_OK;
        if (strings) {
            st = encode_text(f, prompt->valuestring, NULL, 0, &p_ids, &np);
            if (st == CTRL_OK) st = encode_text(f, prompt->valuestring, completion->valuestring, 1, &ids, &n);
        } else if ((st = chat_template(f)) == CTRL_OK) {
            vars = ctrl_row_chat_vars(f->tok, row, prompt, 1);
            st = ctrl_chat_encode(f->tok, f->tpl, vars, &p_ids, &np, NULL);
            cJSON *all = cJSON_GetObjectItemCaseSensitive(vars, "messages");
            const cJSON *m;
            cJSON_ArrayForEach(m, completion) cJSON_AddItemToArray(all, cJSON_Duplicate(m, 1));
            cJSON_ReplaceItemInObjectCaseSensitive(vars, "add_generation_prompt", cJSON_CreateFalse());
            if (st == CTRL_OK)
                st = ctrl_chat_encode(f->tok, f->tpl, vars, &ids, &n, f->assistant_only ? &assistant : NULL);
        }
        if (st == CTRL_OK) prompt_len = (long)ctrl_common_prefix(p_ids, np, ids, n);
    } else if (messages) {
        if (!ctrl_row_messages_ok(messages))
            return *why = "\"messages\" must be a non-empty list of objects with a \"role\"", CTRL_OK;
        if ((st = chat_template(f)) == CTRL_OK) {
            vars = ctrl_row_chat_vars(f->tok, row, messages, 0);
            st = ctrl_chat_encode(f->tok, f->tpl, vars, &ids, &n, f->assistant_only ? &assistant : NULL);
        }
    } else if (cJSON_IsString(text)) {
        st = encode_text(f, text->valuestring, NULL, 1, &ids, &n);
    } else if (cJSON_IsArray(input_ids)) {
        const cJSON *labels = cJSON_GetObjectItemCaseSensitive(row, "labels");
        n = (size_t)cJSON_GetArraySize(input_ids);
        if (labels && (!cJSON_IsArray(labels) || (size_t)cJSON_GetArraySize(labels) != n))
            return *why = "\"labels\" must be a list as long as \"input_ids\"", CTRL_OK;
        ids = malloc(sizeof(int32_t) * (n ? n : 1));
        uint8_t *tr = malloc(n ? n : 1);
        if (!ids || !tr) {
            free(ids), free(tr);
            return ctrl_error_set(CTRL_ERR_NOMEM, "out of memory for a row of %zu tokens", n);
        }
        const cJSON *e = input_ids->child, *l = labels ? labels->child : NULL;
        for (size_t i = 0; i < n; i++, e = e->next, l = l ? l->next : NULL) {
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 ||
                e->valuedouble >= ctrl_tokenizer_vocab_size(f->tok)) {
                free(ids), free(tr);
                return *why = "\"input_ids\" must hold token ids of this tokenizer", CTRL_OK;
            }
            ids[i] = (int32_t)e->valuedouble;
            tr[i] = !l || (cJSON_IsNumber(l) && l->valuedouble != -100);
        }
        *ids_out = ids, *trained_out = tr, *n_out = (int)n;
        return CTRL_OK;
    } else {
        return *why = "expected \"text\", \"messages\", \"conversations\", \"prompt\" + \"completion\" or "
                      "\"input_ids\"",
               CTRL_OK;
    }
    cJSON_Delete(vars);
    free(p_ids);
    if (st != CTRL_OK) {
        free(ids), free(assistant);
        return st;
    }
    if (f->assistant_only) {
        int any = 0;
        for (size_t i = 0; assistant && i < n; i++) any |= assistant[i];
        if (!any) {
            free(ids), free(assistant);
            return ctrl_error_set(
                CTRL_ERR_FORMAT,
                "assistant_only_loss is on but a conversation has no assistant token: the chat "
                "template needs {%% generation %%} blocks around assistant output (set "
                "[data] chat_template_path to a template that has them)");
        }
    }
    /* labels: a token is trained where every applicable mask is 1 (TRL's build_labels) */
    const int use_completion = prompt_len >= 0 && f->completion_only != 0;
    uint8_t *tr = malloc(n ? n : 1);
    if (!tr) {
        free(ids), free(assistant);
        return ctrl_error_set(CTRL_ERR_NOMEM, "out of memory for a row of %zu tokens", n);
    }
    for (size_t i = 0; i < n; i++)
        tr[i] = (!use_completion || (long)i >= prompt_len) && (!assistant || assistant[i]);
    free(assistant);
    *ids_out = ids, *trained_out = tr, *n_out = (int)n;
    return CTRL_OK;
}
