/* Prompt datasets for the online trainers (see online.h). */
#include <stdlib.h>
#include <string.h>

#include "template/chat.h"
#include "train/online.h"
#include "train/row_reader.h"

static int col_index(ctrl_prompt_set *p, const char *name) {
    for (int i = 0; i < p->n_cols; i++)
        if (!strcmp(p->cols[i], name)) return i;
    char **c = realloc(p->cols, sizeof(char *) * (size_t)(p->n_cols + 1));
    if (!c) return -1;
    p->cols = c;
    if (!(p->cols[p->n_cols] = strdup(name))) return -1;
    for (int r = 0; r < p->n; r++) { /* rows read before this column appeared lack it */
        char **v = realloc(p->values[r], sizeof(char *) * (size_t)(p->n_cols + 1));
        if (!v) return -1;
        v[p->n_cols] = NULL, p->values[r] = v;
    }
    return p->n_cols++;
}

static ctrl_status add_row(ctrl_prompt_set *p, const ctrl_tokenizer *tok, const ctrl_template *tpl,
                           cJSON *row, const char *field, const char *where) {
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(row, field);
    int32_t *ids = NULL;
    size_t n = 0;
    char *text = NULL;
    ctrl_status st;
    if (cJSON_IsString(prompt)) {
        text = strdup(prompt->valuestring);
        st = text ? ctrl_tokenizer_encode(tok, text, strlen(text), 1, &ids, &n)
                  : ctrl_error_set(CTRL_ERR_NOMEM, "prompts: out of memory");
    } else if (cJSON_IsArray(prompt)) {
        if (!tpl)
            return ctrl_error_set(CTRL_ERR_FORMAT,
                                  "%s: conversational prompt, but the tokenizer has no chat template", where);
        cJSON *vars = cJSON_CreateObject();
        cJSON_AddItemToObject(vars, "messages", cJSON_Duplicate(prompt, 1));
        cJSON_AddTrueToObject(vars, "add_generation_prompt");
        ctrl_chat_add_special_tokens(tok, vars);
        size_t len;
        st = ctrl_chat_render(tpl, vars, &text, &len, NULL);
        if (st == CTRL_OK) st = ctrl_tokenizer_encode(tok, text, len, 0, &ids, &n);
        cJSON_Delete(vars);
    } else {
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: the row has no \"%s\" (text or a message list)", where,
                              field);
    }
    if (st == CTRL_OK && n == 0) st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: the prompt is empty", where);
    if (st != CTRL_OK) {
        free(ids), free(text);
        return st;
    }
    const int r = p->n;
    int32_t **ids_rows = realloc(p->ids, sizeof(*p->ids) * (size_t)(r + 1));
    if (ids_rows) p->ids = ids_rows;
    int *lens = realloc(p->len, sizeof(*p->len) * (size_t)(r + 1));
    if (lens) p->len = lens;
    char **texts = realloc(p->text, sizeof(*p->text) * (size_t)(r + 1));
    if (texts) p->text = texts;
    char ***values = realloc(p->values, sizeof(*p->values) * (size_t)(r + 1));
    if (values) p->values = values;
    char **messages = realloc(p->messages, sizeof(*p->messages) * (size_t)(r + 1));
    if (messages) p->messages = messages;
    char *message_json = cJSON_IsArray(prompt) ? cJSON_PrintUnformatted(prompt) : NULL;
    char **row_values = calloc((size_t)p->n_cols + 1, sizeof(char *));
    if (!ids_rows || !lens || !texts || !values || !messages || !row_values ||
        (cJSON_IsArray(prompt) && !message_json)) {
        free(ids), free(text), free(row_values), free(message_json);
        return ctrl_error_set(CTRL_ERR_NOMEM, "prompts: out of memory");
    }
    p->ids[r] = ids, p->len[r] = (int)n, p->text[r] = text, p->values[r] = row_values,
    p->messages[r] = message_json;
    p->n++;
    for (const cJSON *c = row->child; c; c = c->next) {
        if (!strcmp(c->string, field)) continue;
        const int k = col_index(p, c->string);
        if (k < 0) return ctrl_error_set(CTRL_ERR_NOMEM, "prompts: out of memory");
        /* A key repeated in one row: the last value counts, as Python's json module reads it. */
        free(p->values[r][k]);
        p->values[r][k] = cJSON_PrintUnformatted(c);
    }
    return CTRL_OK;
}

ctrl_status ctrl_prompt_set_load(const char *path, const ctrl_tokenizer *tok, const ctrl_config *cfg,
                                 ctrl_prompt_set *out) {
    memset(out, 0, sizeof *out);
    const char *field = ctrl_config_settings(cfg)->data.prompt_field;
    if (!field) field = "prompt";
    ctrl_row_reader *rd;
    ctrl_status st = ctrl_row_reader_open_data(path, cfg, &rd);
    if (st != CTRL_OK) return st;
    ctrl_template *tpl = NULL;
    if (ctrl_tokenizer_chat_template(tok)) st = ctrl_chat_template_load(tok, &tpl);
    cJSON *row;
    long line;
    int more;
    while (st == CTRL_OK && (more = ctrl_row_reader_next(rd, &row, &line)) != 0) {
        char where[4200];
        snprintf(where, sizeof where, "%s:%ld", ctrl_row_reader_file(rd), line);
        if (more < 0)
            st = CTRL_ERR_FORMAT;
        else if (!cJSON_IsObject(row))
            st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: not a JSON object", where);
        else
            st = add_row(out, tok, tpl, row, field, where);
        cJSON_Delete(row);
    }
    ctrl_row_reader_close(rd);
    ctrl_template_free(tpl);
    if (st == CTRL_OK && out->n == 0) st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: no prompts", path);
    if (st != CTRL_OK) ctrl_prompt_set_free(out);
    return st;
}

void ctrl_prompt_set_free(ctrl_prompt_set *p) {
    for (int r = 0; r < p->n; r++) {
        free(p->ids[r]), free(p->text[r]), free(p->messages[r]);
        for (int k = 0; k < p->n_cols; k++) free(p->values[r][k]);
        free(p->values[r]);
    }
    for (int k = 0; k < p->n_cols; k++) free(p->cols[k]);
    free(p->ids), free(p->len), free(p->text), free(p->values), free(p->cols), free(p->messages);
    memset(p, 0, sizeof *p);
}
