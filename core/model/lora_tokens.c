/* PEFT's trainable_token_indices beside LoRA (huggingface/peft tuners/trainable_tokens: the
 * TrainableTokensLayer a LoraConfig puts on the input embedding): the listed rows of the embedding
 * table are trained as one tensor of their values, [n, C], initialised as the rows themselves
 * ("model.embed_tokens.token_adapter.trainable_tokens_delta" -- PEFT's name, though it holds values,
 * not differences: its forward index_copy's them into the table); the rest of the table stays
 * frozen. With tied embeddings the LM head is the same table, so its rows are the same values.
 *
 * Rather than teach every reader of the table (the lookup, the fused head on each backend, decoding,
 * GKD's divergence) to substitute rows, the model writes the rows it computes with into the table
 * itself before a forward: the trained values while the adapters are on, the base's while they are
 * off (a reference model, TRL's disable_adapter()), as PEFT's merge / unmerge of these rows does.
 * The table is fp32 then (never held in bf16: [peft] embedding_dtype), so the lookup returns the
 * trained values exactly and a bf16 head rounds them as autocast rounds PEFT's. The gradient is the
 * lookup's, scattered by the batch's tokens mapped to rows of the tensor, and, tied, the head's
 * for those rows alone (ctrl_head_args.tt_rows: no [V, C] gradient). */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

ctrl_status ctrl_lora_add_token(ctrl_lora_config *c, long id, const char *where) {
    if (id < 0 || id > 0x7fffffff)
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: token index %ld is not a token id", where, id);
    for (int k = 0; k < c->n_tokens; k++)
        if (c->tokens[k] == id)
            return ctrl_error_set(CTRL_ERR_CONFIG,
                                  "%s: token index %ld is listed twice (PEFT would write its row twice, "
                                  "in no defined order)",
                                  where, id);
    if (c->n_tokens >= CTRL_LORA_MAX_TOKENS)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: more than %d token indices (train the table in full: "
                              "modules_to_save = embed_tokens)",
                              where, CTRL_LORA_MAX_TOKENS);
    c->tokens[c->n_tokens++] = (int32_t)id;
    return CTRL_OK;
}

int lora_tokens_on(const ctrl_model *m) { return m->has_lora && m->lora->n_tokens > 0; }

ctrl_status lora_tokens_layout(ctrl_model *m, size_t *cursor) {
    m->off_tt = -1;
    if (!lora_tokens_on(m)) return CTRL_OK;
    const ctrl_lora_config *c = m->lora;
    const int V = m->cfg.vocab_size, C = m->cfg.hidden_size;
    if (c->save_embed_tokens)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "LoRA: trainable_token_indices with modules_to_save embed_tokens: the table is "
                              "trained in full already (PEFT refuses both)");
    for (int k = 0; k < c->n_tokens; k++)
        if (c->tokens[k] >= V)
            return ctrl_error_set(CTRL_ERR_CONFIG,
                                  "LoRA: trainable_token_indices: token %d is outside this %s model's "
                                  "vocabulary of %d",
                                  c->tokens[k], m->cfg.model_type, V);
    free(m->tt_map), free(m->tt_orig);
    m->tt_map = malloc(sizeof(int32_t) * (size_t)V);
    m->tt_orig = malloc(sizeof(float) * (size_t)c->n_tokens * C);
    if (!m->tt_map || !m->tt_orig)
        return ctrl_error_set(CTRL_ERR_NOMEM, "LoRA: trainable_token_indices' map of %d tokens", V);
    for (int v = 0; v < V; v++) m->tt_map[v] = -1;
    for (int k = 0; k < c->n_tokens; k++) m->tt_map[c->tokens[k]] = k;
    const int at = m->n_views;
    m->off_tt = model_add_view(m, cursor, "model.embed_tokens.token_adapter.trainable_tokens_delta", 2,
                               c->n_tokens, C, 0);
    if (at < m->cap_views) m->views[at].lora = 1; /* an adapter's: not in the base's files */
    m->tt_state = 0, m->tt_valid = 0, m->tt_merged = 0;
    return CTRL_OK;
}

void lora_tokens_capture(ctrl_model *m) {
    if (!lora_tokens_on(m)) return;
    const int n = m->lora->n_tokens, C = m->cfg.hidden_size;
    for (int k = 0; k < n; k++) {
        const float *row = m->params + m->off_embed + (size_t)m->lora->tokens[k] * C;
        memcpy(m->tt_orig + (size_t)k * C, row, sizeof(float) * C);
        memcpy(m->params + m->off_tt + (size_t)k * C, row, sizeof(float) * C); /* PEFT's init: the rows */
    }
    m->tt_state = 1; /* the table holds the base's rows */
    m->tt_valid = 0;
    if (m->tt_orig_dev && m->tt_orig_dev != m->tt_orig) m->be->free(m->tt_orig_dev);
    m->tt_orig_dev = NULL; /* put on the backend again at the next sync */
    m->tt_captured = 1;
}

ctrl_status lora_tokens_sync(ctrl_model *m) {
    if (!lora_tokens_on(m) || m->tt_merged) return CTRL_OK;
    if (!m->tt_captured)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "LoRA: trainable_token_indices' base rows were never read (no weights set)");
    const int want = m->lora_off ? 1 : 2; /* the base's rows, or the trained ones */
    if (m->tt_state == want && (want == 1 || m->tt_valid)) return CTRL_OK;
    const ctrl_backend_ops *be = m->be;
    const int n = m->lora->n_tokens, C = m->cfg.hidden_size;
    const size_t row = sizeof(float) * (size_t)C;
    if (!m->tt_orig_dev) {
        if (be->host_memory)
            m->tt_orig_dev = m->tt_orig;
        else {
            MODEL_TRY(be->alloc((void **)&m->tt_orig_dev, row * (size_t)n));
            MODEL_TRY(be->to_device(m->tt_orig_dev, m->tt_orig, row * (size_t)n));
        }
    }
    const float *src = want == 1 ? m->tt_orig_dev : m->dparams + m->off_tt;
    for (int k = 0; k < n; k++) {
        const size_t at = (size_t)m->off_embed + (size_t)m->lora->tokens[k] * C;
        MODEL_TRY(be->copy(m->dparams + at, src + (size_t)k * C, row));
        /* the host's table too where it is a copy of its own and current (a stale one is fetched whole) */
        if (m->dparams != m->params && !m->host_stale)
            memcpy(m->params + at, (want == 1 ? m->tt_orig : m->params + m->off_tt) + (size_t)k * C, row);
        MODEL_TRY(ctrl_model_params_range_changed(m, at, (size_t)C)); /* bf16 copies, decoding's panels */
    }
    m->tt_state = want, m->tt_valid = 1;
    return CTRL_OK;
}

void lora_tokens_batch(const ctrl_model *m, const int32_t *tokens, int T, int32_t *tt) {
    for (int t = 0; t < T; t++) /* the padding_idx's row has no gradient (nn.Embedding's, F.embedding's) */
        tt[t] = tokens[t] == m->embed_pad || tokens[t] < 0 || tokens[t] >= m->cfg.vocab_size
                    ? -1
                    : m->tt_map[tokens[t]];
}

ctrl_status lora_tokens_backward(ctrl_model *m, const float *dx) {
    float *g = lora_tokens_on(m) && !m->lora_off ? model_grad(m, m->off_tt) : NULL;
    if (!g || !m->tt_tokens) return CTRL_OK;
    return m->be->embedding_backward(g, dx, m->tt_tokens, m->T, m->cfg.hidden_size);
}

ctrl_status lora_tokens_head_grad(ctrl_model *m, const float *dz, const float *h, int n) {
    float *g =
        lora_tokens_on(m) && !m->lora_off && m->off_lm_head == m->off_embed ? model_grad(m, m->off_tt) : NULL;
    const int C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    for (int k = 0; g && k < m->lora->n_tokens; k++) /* g[k] += dz[:, token k]^T h */
        MODEL_TRY(m->be->gemm(1, 0, 1, C, n, 1.0f, dz + m->lora->tokens[k], V, h, C, 1.0f, g + (size_t)k * C,
                              C, CTRL_F32, CTRL_F32));
    return CTRL_OK;
}

void lora_tokens_merge(ctrl_model *m) {
    if (!lora_tokens_on(m)) return;
    const int C = m->cfg.hidden_size;
    for (int k = 0; k < m->lora->n_tokens; k++)
        memcpy(m->params + m->off_embed + (size_t)m->lora->tokens[k] * C,
               m->params + m->off_tt + (size_t)k * C, sizeof(float) * (size_t)C);
    m->tt_merged = 1;
}

void lora_tokens_release(ctrl_model *m) {
    if (m->tt_orig_dev && m->tt_orig_dev != m->tt_orig && m->be) m->be->free(m->tt_orig_dev);
    m->tt_orig_dev = NULL;
    m->tt_state = 0; /* a new backend's table: written again at the next forward */
}
