/* PEFT's trainable_token_indices beside LoRA (huggingface/peft tuners/trainable_tokens: the
 * TrainableTokensLayer a LoraConfig puts on the input embedding): the listed rows of the embedding
 * table are trained as one tensor of their values, [n, C], initialised as the rows themselves
 * ("model.embed_tokens.token_adapter.trainable_tokens_delta" -- PEFT's name, though it holds values,
 * not differences: its forward index_copy's them into the table); the rest of the table stays
 * frozen. With tied embeddings the LM head is the same table, so its rows are the same values; an
 * untied head's rows train so too where PEFT's dictionary names lm_head (a second set: its own view,
 * "lm_head.token_adapter.trainable_tokens_delta").
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

static ctrl_status add(int32_t *ids, int *n, long id, const char *where) {
    if (id < 0 || id > 0x7fffffff)
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: token index %ld is not a token id", where, id);
    for (int k = 0; k < *n; k++)
        if (ids[k] == id)
            return ctrl_error_set(CTRL_ERR_CONFIG,
                                  "%s: token index %ld is listed twice (PEFT would write its row twice, "
                                  "in no defined order)",
                                  where, id);
    if (*n >= CTRL_LORA_MAX_TOKENS)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: more than %d token indices (train the table in full: modules_to_save)",
                              where, CTRL_LORA_MAX_TOKENS);
    ids[(*n)++] = (int32_t)id;
    return CTRL_OK;
}

ctrl_status ctrl_lora_add_token(ctrl_lora_config *c, long id, const char *where) {
    return add(c->tokens, &c->n_tokens, id, where);
}

ctrl_status ctrl_lora_add_head_token(ctrl_lora_config *c, long id, const char *where) {
    return add(c->head_tokens, &c->n_head_tokens, id, where);
}

int lora_tokens_on(const ctrl_model *m) { return m->has_lora && (m->tt[0].n > 0 || m->tt[1].n > 0); }

int lora_tokens_in(const ctrl_model *m, long table) {
    return m->has_lora && table >= 0 &&
           ((m->tt[0].n && m->tt[0].table == table) || (m->tt[1].n && m->tt[1].table == table));
}

/* Set k's view after the adapters: [n, C] under PEFT's name, its base rows' room. */
static ctrl_status set_layout(ctrl_model *m, size_t *cursor, int k, long table, const int32_t *ids, int n) {
    struct lora_token_set *t = &m->tt[k];
    const int V = m->cfg.vocab_size, C = m->cfg.hidden_size;
    for (int i = 0; i < n; i++)
        if (ids[i] >= V)
            return ctrl_error_set(CTRL_ERR_CONFIG,
                                  "LoRA: trainable_token_indices%s: token %d is outside this %s model's "
                                  "vocabulary of %d",
                                  k ? " (lm_head)" : "", ids[i], m->cfg.model_type, V);
    free(t->orig);
    if (!(t->orig = malloc(sizeof(float) * (size_t)n * C)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "LoRA: trainable_token_indices' %d base rows", n);
    const int at = m->n_views;
    t->view = model_add_view(m, cursor,
                             k ? "lm_head.token_adapter.trainable_tokens_delta"
                               : "model.embed_tokens.token_adapter.trainable_tokens_delta",
                             2, n, C, 0);
    if (at < m->cap_views) m->views[at].lora = 1; /* an adapter's: not in the base's files */
    t->table = table, t->ids = ids, t->n = n, t->captured = 0;
    return CTRL_OK;
}

ctrl_status lora_tokens_layout(ctrl_model *m, size_t *cursor) {
    memset(m->tt, 0, sizeof m->tt);
    m->tt[0].view = m->tt[1].view = -1;
    m->tt_state = 0, m->tt_valid = 0;
    if (!m->has_lora) return CTRL_OK;
    const ctrl_lora_config *c = m->lora;
    const int tied = m->off_lm_head >= 0 && m->off_lm_head == m->off_embed;
    int head = c->n_head_tokens;
    if (head && tied) { /* PEFT: the same list for both is the tied rows once; another is no tying at all */
        if (head != c->n_tokens || memcmp(c->head_tokens, c->tokens, sizeof(int32_t) * (size_t)head))
            return ctrl_error_set(
                CTRL_ERR_UNSUPPORTED,
                "LoRA: trainable_token_indices for lm_head differ from embed_tokens' on a model "
                "whose head is the embedding (tie_word_embeddings): one table cannot hold two "
                "sets of rows (list them once, under embed_tokens)");
        head = 0;
    }
    if (head && m->off_lm_head < 0)
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "LoRA: trainable_token_indices for lm_head on a sequence classifier (no LM head)");
    const int embed_saved = (size_t)m->off_embed >= m->train_off, /* modules_to_save: trained whole */
        head_saved = m->off_lm_head >= 0 && (size_t)m->off_lm_head >= m->train_off;
    if ((c->n_tokens && embed_saved) || (head && head_saved))
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "LoRA: trainable_token_indices with modules_to_save %s: the table is trained in "
            "full already (PEFT refuses both)",
            c->n_tokens && embed_saved ? "embed_tokens" : "lm_head");
    if (c->n_tokens) {
        free(m->tt_map);
        if (!(m->tt_map = malloc(sizeof(int32_t) * (size_t)m->cfg.vocab_size)))
            return ctrl_error_set(CTRL_ERR_NOMEM, "LoRA: trainable_token_indices' map");
        for (int v = 0; v < m->cfg.vocab_size; v++) m->tt_map[v] = -1;
        MODEL_TRY(set_layout(m, cursor, 0, m->off_embed, c->tokens, c->n_tokens));
        for (int k = 0; k < c->n_tokens; k++) m->tt_map[c->tokens[k]] = k;
    }
    if (head) MODEL_TRY(set_layout(m, cursor, 1, m->off_lm_head, c->head_tokens, head));
    return CTRL_OK;
}

void lora_tokens_capture(ctrl_model *m, long table) {
    const int C = m->cfg.hidden_size;
    for (int s = 0; m->has_lora && s < 2; s++) {
        struct lora_token_set *t = &m->tt[s];
        if (!t->n || (table >= 0 && table != t->table)) continue;
        for (int k = 0; k < t->n; k++) {
            const float *row = m->params + t->table + (size_t)t->ids[k] * C;
            memcpy(t->orig + (size_t)k * C, row, sizeof(float) * C);
            memcpy(m->params + t->view + (size_t)k * C, row, sizeof(float) * C); /* PEFT's init: the rows */
        }
        if (t->orig_dev && t->orig_dev != t->orig) m->be->free(t->orig_dev);
        t->orig_dev = NULL; /* put on the backend again at the next sync */
        t->captured = 1;
        m->tt_state = 1, m->tt_valid = 0; /* the table holds the base's rows */
    }
}

ctrl_status lora_tokens_sync(ctrl_model *m) {
    if (!lora_tokens_on(m) || m->lora_merged) return CTRL_OK;
    const int want = m->lora_off ? 1 : 2; /* the base's rows, or the trained ones */
    if (m->tt_state == want && (want == 1 || m->tt_valid)) return CTRL_OK;
    const ctrl_backend_ops *be = m->be;
    const int C = m->cfg.hidden_size;
    const size_t row = sizeof(float) * (size_t)C;
    for (int s = 0; s < 2; s++) {
        struct lora_token_set *t = &m->tt[s];
        if (!t->n) continue;
        if (!t->captured)
            return ctrl_error_set(
                CTRL_ERR_RUNTIME,
                "LoRA: trainable_token_indices' base rows were never read (no weights set)");
        if (!t->orig_dev && be->host_memory) t->orig_dev = t->orig;
        if (!t->orig_dev) {
            MODEL_TRY(be->alloc((void **)&t->orig_dev, row * (size_t)t->n));
            MODEL_TRY(be->to_device(t->orig_dev, t->orig, row * (size_t)t->n));
        }
        const float *src = want == 1 ? t->orig_dev : m->dparams + t->view;
        for (int k = 0; k < t->n; k++) {
            const size_t at = (size_t)t->table + (size_t)t->ids[k] * C;
            MODEL_TRY(be->copy(m->dparams + at, src + (size_t)k * C, row));
            /* the host's table too where it is a copy of its own and current (a stale one is fetched whole)
             */
            if (m->dparams != m->params && !m->host_stale)
                memcpy(m->params + at, (want == 1 ? t->orig : m->params + t->view) + (size_t)k * C, row);
            MODEL_TRY(ctrl_model_params_range_changed(m, at, (size_t)C)); /* bf16 copies, decoding's panels */
        }
    }
    m->tt_state = want, m->tt_valid = 1;
    return CTRL_OK;
}

void lora_tokens_batch(const ctrl_model *m, const int32_t *tokens, int T, int32_t *tt) {
    for (int t = 0; t < T; t++) /* the padding_idx's row has no gradient (nn.Embedding's, F.embedding's) */
        tt[t] = !m->tt_map || tokens[t] == m->embed_pad || tokens[t] < 0 || tokens[t] >= m->cfg.vocab_size
                    ? -1
                    : m->tt_map[tokens[t]];
}

ctrl_status lora_tokens_backward(ctrl_model *m, const float *dx) {
    float *g = m->has_lora && m->tt[0].n && !m->lora_off ? model_grad(m, m->tt[0].view) : NULL;
    if (!g || !m->tt_tokens) return CTRL_OK;
    return m->be->embedding_backward(g, dx, m->tt_tokens, m->T, m->cfg.hidden_size);
}

void lora_tokens_head(const ctrl_model *m, const int32_t **ids, int *n, float **dw) {
    *ids = NULL, *n = 0, *dw = NULL;
    if (!m->has_lora || m->lora_off || m->off_lm_head < 0) return;
    /* the embedding's rows where the head is the embedding, else the head's own */
    const struct lora_token_set *t = &m->tt[m->off_lm_head == m->off_embed ? 0 : 1];
    if (t->n) *ids = t->ids, *n = t->n, *dw = model_grad(m, t->view);
}

ctrl_status lora_tokens_head_grad(ctrl_model *m, const float *dz, const float *h, int n) {
    const int32_t *ids;
    int rows;
    float *g;
    lora_tokens_head(m, &ids, &rows, &g);
    const int C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    for (int k = 0; g && k < rows; k++) /* g[k] += dz[:, token k]^T h */
        MODEL_TRY(m->be->gemm(1, 0, 1, C, n, 1.0f, dz + ids[k], V, h, C, 1.0f, g + (size_t)k * C, C, CTRL_F32,
                              CTRL_F32));
    return CTRL_OK;
}

void lora_tokens_changed(ctrl_model *m, size_t off, size_t n) {
    for (int s = 0; m->has_lora && s < 2; s++) {
        const struct lora_token_set *t = &m->tt[s];
        if (t->n && off < (size_t)t->view + (size_t)t->n * m->cfg.hidden_size && off + n > (size_t)t->view)
            m->tt_valid = 0;
    }
}

void lora_tokens_merge(ctrl_model *m) {
    const int C = m->cfg.hidden_size;
    for (int s = 0; m->has_lora && s < 2; s++)
        for (int k = 0; k < m->tt[s].n; k++)
            memcpy(m->params + m->tt[s].table + (size_t)m->tt[s].ids[k] * C,
                   m->params + m->tt[s].view + (size_t)k * C, sizeof(float) * (size_t)C);
}

void lora_tokens_release(ctrl_model *m) {
    for (int s = 0; s < 2; s++) {
        struct lora_token_set *t = &m->tt[s];
        if (t->orig_dev && t->orig_dev != t->orig && m->be) m->be->free(t->orig_dev);
        t->orig_dev = NULL;
    }
    m->tt_state = 0; /* a new backend's table: written again at the next forward */
}

void lora_tokens_free(ctrl_model *m) {
    free(m->tt[0].orig), free(m->tt[1].orig), free(m->tt_map);
    m->tt[0].orig = m->tt[1].orig = NULL, m->tt_map = NULL;
}
