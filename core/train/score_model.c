/* See score_model.h. */
#include "hub_cache.h"
#include "train/score_model.h"

#include <stdlib.h>
#include <string.h>

#include "config/config_load.h"
#include "model/model.h"
#include "template/chat.h"
#include "tokenizer/tokenizer.h"
#include "train/compute.h"

struct ctrl_score_model {
    ctrl_model *model;
    ctrl_tokenizer *tok;
    ctrl_template *chat; /* the tokenizer's chat template, compiled when first needed */
    train_compute compute;
    char dir[1024];
};

void ctrl_score_model_close(ctrl_score_model *m) {
    if (!m) return;
    ctrl_model_free(m->model);
    ctrl_tokenizer_free(m->tok);
    ctrl_template_free(m->chat);
    train_compute_free(&m->compute);
    free(m);
}

ctrl_status ctrl_score_model_open(const ctrl_config *cfg, const char *dir, const char *tokenizer,
                                  ctrl_score_model **out) {
    *out = NULL;
    const ctrl_run_plugins *plugins = ctrl_config_plugins(cfg);
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    if (!plugins || !plugins->attention || !s)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "reward model %s: the config has no attention plugin", dir);
    ctrl_score_model *m = calloc(1, sizeof *m);
    if (!m) return ctrl_error_set(CTRL_ERR_NOMEM, "reward model: out of memory");
    char resolved[4096]; /* a Hub id: the local cache's snapshot (outlives m for the messages) */
    dir = ctrl_hub_resolve(dir, resolved, sizeof resolved);
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    ctrl_status st = ctrl_model_load(dir, plugins->attention->ops, &m->model);
    if (st == CTRL_OK && ctrl_model_cfg(m->model)->num_labels < 1)
        st = ctrl_error_set(CTRL_ERR_CONFIG,
                            "%s is a causal LM, not a reward model: its config.json names no "
                            "*ForSequenceClassification (train one with trainer = reward)",
                            dir);
    if (st == CTRL_OK) st = ctrl_tokenizer_load(tokenizer ? tokenizer : dir, &m->tok);
    if (st == CTRL_OK) st = train_compute_select(s->run.device, &m->compute);
    if (st == CTRL_OK) st = train_compute_attach(&m->compute, m->model, "fp32", NULL, cfg);
    if (st != CTRL_OK) {
        ctrl_score_model_close(m);
        return ctrl_error_wrap(st, "reward model %s", dir);
    }
    *out = m;
    return CTRL_OK;
}

/* texts[0..n) as one packed batch; an empty text is one pad token (transformers' all-pad row). */
static ctrl_status score_chunk(ctrl_score_model *m, const char *const *texts, int n, float *out) {
    const ctrl_model_config *c = ctrl_model_cfg(m->model);
    int32_t **ids = calloc((size_t)n, sizeof *ids), *cu = malloc(sizeof(int32_t) * (size_t)(n + 1));
    float *scores = malloc(sizeof(float) * (size_t)n * (size_t)c->num_labels);
    size_t total = 0;
    ctrl_status st =
        ids && cu && scores ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "reward model: out of memory");
    int32_t *tokens = NULL, *positions = NULL;
    cu[0] = 0;
    for (int i = 0; i < n && st == CTRL_OK; i++) {
        size_t k = 0;
        st = ctrl_tokenizer_encode(m->tok, texts[i] ? texts[i] : "", texts[i] ? strlen(texts[i]) : 0, 0,
                                   &ids[i], &k);
        if (st == CTRL_OK && k == 0) {
            free(ids[i]);
            if (!(ids[i] = malloc(sizeof(int32_t))))
                st = ctrl_error_set(CTRL_ERR_NOMEM, "reward model: out of memory");
            else
                ids[i][0] = c->pad_token_id >= 0 ? c->pad_token_id : 0, k = 1;
        }
        total += k, cu[i + 1] = (int32_t)total;
    }
    if (st == CTRL_OK &&
        (!(tokens = malloc(sizeof(int32_t) * total)) || !(positions = malloc(sizeof(int32_t) * total))))
        st = ctrl_error_set(CTRL_ERR_NOMEM, "reward model: %zu tokens", total);
    for (int i = 0; i < n && st == CTRL_OK; i++)
        for (int32_t t = cu[i]; t < cu[i + 1]; t++) tokens[t] = ids[i][t - cu[i]], positions[t] = t - cu[i];
    if (st == CTRL_OK) {
        const ctrl_batch b = {
            .T = (int)total, .B = n, .tokens = tokens, .positions = positions, .cu_seqlens = cu};
        st = ctrl_model_score_forward(m->model, &b, scores);
    }
    for (int i = 0; i < n && st == CTRL_OK; i++) out[i] = scores[(size_t)i * (size_t)c->num_labels];
    for (int i = 0; ids && i < n; i++) free(ids[i]);
    free(ids), free(cu), free(scores), free(tokens), free(positions);
    return st;
}

ctrl_status ctrl_score_model_score(ctrl_score_model *m, const char *const *texts, int n, int batch_size,
                                   float *out) {
    if (batch_size < 1) batch_size = n > 0 ? n : 1;
    for (int i = 0; i < n; i += batch_size) {
        ctrl_status st = score_chunk(m, texts + i, n - i < batch_size ? n - i : batch_size, out + i);
        if (st != CTRL_OK) return ctrl_error_wrap(st, "reward model %s", m->dir);
    }
    return CTRL_OK;
}

ctrl_status ctrl_score_model_chat_text(ctrl_score_model *m, const char *messages_json, const char *completion,
                                       char **text) {
    *text = NULL;
    ctrl_status st = m->chat ? CTRL_OK : ctrl_chat_template_load(m->tok, &m->chat);
    if (st != CTRL_OK) return ctrl_error_wrap(st, "reward model %s: a conversational prompt", m->dir);
    cJSON *messages = cJSON_Parse(messages_json), *vars = cJSON_CreateObject(), *turn = cJSON_CreateObject();
    if (!messages || !cJSON_IsArray(messages)) {
        cJSON_Delete(messages), cJSON_Delete(vars), cJSON_Delete(turn);
        return ctrl_error_set(CTRL_ERR_FORMAT, "reward model %s: the prompt's messages are not a JSON list",
                              m->dir);
    }
    if (!vars || !turn || !cJSON_AddStringToObject(turn, "role", "assistant") ||
        !cJSON_AddStringToObject(turn, "content", completion ? completion : "")) {
        cJSON_Delete(messages), cJSON_Delete(vars), cJSON_Delete(turn);
        return ctrl_error_set(CTRL_ERR_NOMEM, "reward model: out of memory");
    }
    cJSON_AddItemToArray(messages, turn);
    cJSON_AddItemToObject(vars, "messages", messages);
    ctrl_chat_add_special_tokens(m->tok, vars);
    size_t len;
    st = ctrl_chat_render(m->chat, vars, text, &len, NULL);
    cJSON_Delete(vars);
    return st == CTRL_OK ? CTRL_OK : ctrl_error_wrap(st, "reward model %s: its chat template", m->dir);
}
