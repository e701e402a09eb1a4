/* The sequence-classification head (see model.h): transformers' *ForSequenceClassification, which
 * reward models are. The trunk runs as for the LM (model_trunk_forward), then the score
 * [num_labels, C] multiplies every final hidden state -- one linear op of T x C x num_labels, nothing
 * next to the trunk -- and each sequence keeps the row at its score index. The backward scatters
 * dL/dscores into those rows, the same linear op's backward gives dL/d(final hidden states) and the
 * score's gradient, and the trunk's backward takes it from there (ctrl_model_backward(m, NULL), as
 * after a fused LM head). Every op goes through the backend ops table, so a model on a device
 * scores there. */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

int ctrl_model_score_index(const ctrl_model *m, const int32_t *tokens, int len) {
    const int pad = m->cfg.pad_token_id;
    if (pad < 0) return len - 1;
    for (int i = len - 1; i > 0; i--)
        if (tokens[i] != pad) return i;
    return 0; /* argmax over all-zero (all pad): the first */
}

void ctrl_model_set_pad_token_id(ctrl_model *m, int pad_token_id) { m->cfg.pad_token_id = pad_token_id; }

static ctrl_status need_score(const ctrl_model *m) {
    if (m->off_score < 0)
        return ctrl_error_set(
            CTRL_ERR_RUNTIME,
            "model: a causal LM has no score head (load it with ctrl_model_load_classifier)");
    return CTRL_OK;
}

/* Each sequence's read position in the flat batch (ctrl_model_score_index); NULL when out of memory. */
static int32_t *read_positions(const ctrl_model *m, const ctrl_batch *b) {
    int32_t *at = malloc(sizeof(int32_t) * (size_t)(b->B > 0 ? b->B : 1));
    for (int s = 0; at && s < b->B; s++)
        at[s] = b->cu_seqlens[s] + ctrl_model_score_index(m, b->tokens + b->cu_seqlens[s],
                                                          b->cu_seqlens[s + 1] - b->cu_seqlens[s]);
    return at;
}

ctrl_status ctrl_model_score_forward(ctrl_model *m, const ctrl_batch *b, float *scores) {
    int32_t *at = read_positions(m, b);
    ctrl_status st = at ? ctrl_model_score_forward_at(m, b, b->B, at, scores)
                        : ctrl_error_set(CTRL_ERR_NOMEM, "model: a batch of %d sequences", b->B);
    free(at);
    return st;
}

ctrl_status ctrl_model_score_backward(ctrl_model *m, const float *dscores) {
    int32_t *at = m->T > 0 ? read_positions(m, &m->batch) : NULL;
    ctrl_status st = at ? ctrl_model_score_backward_at(m, m->batch.B, at, dscores)
                        : ctrl_error_set(CTRL_ERR_RUNTIME, "model: score backward without a score forward");
    free(at);
    return st;
}

ctrl_status ctrl_model_score_forward_at(ctrl_model *m, const ctrl_batch *b, int n, const int32_t *at,
                                        float *scores) {
    MODEL_TRY(need_score(m));
    const int L = m->cfg.num_labels, C = m->cfg.hidden_size;
    for (int s = 0; s < n; s++)
        if (at[s] < 0 || at[s] >= b->T)
            return ctrl_error_set(CTRL_ERR_RUNTIME, "model: score position %d outside the batch's %d tokens",
                                  at[s], b->T);
    ctrl_batch kb = *b;
    int32_t *none = NULL; /* the trunk keeps the batch's targets: a row of -1 when it has none */
    if (!b->targets) {
        if (b->T > 0 && !(none = malloc(sizeof(int32_t) * (size_t)b->T)))
            return ctrl_error_set(CTRL_ERR_NOMEM, "model: a batch of %d tokens", b->T);
        for (int i = 0; i < b->T; i++) none[i] = -1;
        kb.targets = none;
    }
    ctrl_status st = model_trunk_forward(m, &kb);
    free(none);
    if (st != CTRL_OK) return st;
    const size_t all_n = (size_t)m->T * (size_t)L;
    MODEL_TRY(model_grow(m, (void **)&m->stage, &m->stage_bytes, sizeof(float) * all_n));
    MODEL_TRY(model_linear_forward(m, m->stage, m->lnf, m->dparams + m->off_score, NULL, m->T, C, L));
    float *all = m->be->host_memory ? m->stage : malloc(sizeof(float) * all_n);
    if (!all) return ctrl_error_set(CTRL_ERR_NOMEM, "model: scores of %d tokens", m->T);
    st = m->be->host_memory ? CTRL_OK : m->be->to_host(all, m->stage, sizeof(float) * all_n);
    for (int s = 0; s < n && st == CTRL_OK; s++)
        memcpy(scores + (size_t)s * L, all + (size_t)at[s] * L, sizeof(float) * (size_t)L);
    if (all != m->stage) free(all);
    return st;
}

ctrl_status ctrl_model_score_backward_at(ctrl_model *m, int n, const int32_t *at, const float *dscores) {
    MODEL_TRY(need_score(m));
    if (m->T <= 0) return ctrl_error_set(CTRL_ERR_RUNTIME, "model: score backward without a forward");
    const int L = m->cfg.num_labels, C = m->cfg.hidden_size, T = m->T;
    const size_t all_n = (size_t)T * (size_t)L;
    float *dout = calloc(all_n, sizeof(float)); /* dL/d(every token's score): nonzero at the read rows */
    if (!dout) return ctrl_error_set(CTRL_ERR_NOMEM, "model: score gradients of %d tokens", T);
    for (int s = 0; s < n; s++)
        for (int k = 0; k < L && at[s] >= 0 && at[s] < T; k++)
            dout[(size_t)at[s] * L + k] += dscores[(size_t)s * L + k];
    ctrl_status st = model_grow(m, (void **)&m->stage, &m->stage_bytes, sizeof(float) * all_n);
    if (st == CTRL_OK)
        st = model_grow(m, (void **)&m->head_dh, &m->head_dh_bytes, sizeof(float) * (size_t)T * C);
    if (st == CTRL_OK) st = m->be->to_device(m->stage, dout, sizeof(float) * all_n);
    free(dout);
    if (st != CTRL_OK) return st;
    MODEL_TRY(model_linear_backward(m, m->head_dh, model_grad(m, m->off_score), NULL, m->stage, m->lnf,
                                    m->dparams + m->off_score, T, C, L));
    m->head_dh_ready = 1; /* the trunk's backward starts from dL/d(final norm output) in head_dh */
    return ctrl_model_backward(m, NULL);
}

ctrl_status ctrl_model_load_classifier(const char *dir, const ctrl_attention_ops *attn, int num_labels,
                                       uint64_t seed, ctrl_model **out) {
    return ctrl_model_load_classifier_lora(dir, attn, num_labels, seed, NULL, out);
}

static ctrl_status load_classifier(const char *dir, const ctrl_attention_ops *attn, int num_labels,
                                   uint64_t seed, const ctrl_lora_config *lora, ctrl_model_parts_fn parts,
                                   ctrl_model_nf4_parts_fn nf4_parts, void *ctx, ctrl_model **out);

ctrl_status ctrl_model_load_classifier_lora(const char *dir, const ctrl_attention_ops *attn, int num_labels,
                                            uint64_t seed, const ctrl_lora_config *lora, ctrl_model **out) {
    return load_classifier(dir, attn, num_labels, seed, lora, NULL, NULL, NULL, out);
}

ctrl_status ctrl_model_load_classifier_part(const char *dir, const ctrl_attention_ops *attn, int num_labels,
                                            uint64_t seed, ctrl_model_parts_fn parts, void *ctx,
                                            ctrl_model **out) {
    return load_classifier(dir, attn, num_labels, seed, NULL, parts, NULL, ctx, out);
}

ctrl_status ctrl_model_load_classifier_lora_part(const char *dir, const ctrl_attention_ops *attn,
                                                 int num_labels, uint64_t seed, const ctrl_lora_config *lora,
                                                 ctrl_model_parts_fn parts, ctrl_model_nf4_parts_fn nf4_parts,
                                                 void *ctx, ctrl_model **out) {
    return load_classifier(dir, attn, num_labels, seed, lora, parts, nf4_parts, ctx, out);
}

static ctrl_status load_classifier(const char *dir, const ctrl_attention_ops *attn, int num_labels,
                                   uint64_t seed, const ctrl_lora_config *lora, ctrl_model_parts_fn parts,
                                   ctrl_model_nf4_parts_fn nf4_parts, void *ctx, ctrl_model **out) {
    *out = NULL;
    ctrl_model_config cfg;
    MODEL_TRY(ctrl_model_config_load(dir, &cfg));
    if (num_labels < 1 || num_labels > CTRL_MODEL_MAX_LABELS)
        return ctrl_error_set(CTRL_ERR_CONFIG, "model: %d labels (1 to %d)", num_labels,
                              CTRL_MODEL_MAX_LABELS);
    if (cfg.num_labels > 0 && cfg.num_labels != num_labels)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: a sequence classifier of %d labels, %d asked for", dir,
                              cfg.num_labels, num_labels);
    const int fresh = cfg.num_labels == 0;
    cfg.num_labels = num_labels;
    ctrl_model *m;
    if (parts)
        MODEL_TRY(ctrl_model_load_lora_part_as(dir, &cfg, attn, fresh ? "score.weight" : NULL, lora, parts,
                                               nf4_parts, ctx, &m));
    else
        MODEL_TRY(ctrl_model_load_as_lora(dir, &cfg, attn, fresh ? "score.weight" : NULL, lora, &m));
    if (fresh)
        for (int i = 0; i < ctrl_model_view_count(m); i++)
            if (!strcmp(ctrl_model_view(m, i)->name, "score.weight"))
                ctrl_model_init_view(m, i, seed, cfg.initializer_range);
    *out = m;
    return CTRL_OK;
}
