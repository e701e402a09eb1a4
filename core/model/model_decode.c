/* Incremental decoding over a paged KV cache (see model.h): the new tokens of several sequences run
 * through the same layer code as training (model_layer_forward) as one flat batch; only the
 * attention differs — each layer appends the new K/V to the cache and attends over it through the
 * sequence's block table (causal, GQA, optional sliding window): the CPU path of paged attention.
 * The head gives the logits of each sequence's last new token. The model's activation buffers are
 * reused, so a training forward must come before the next backward (as it always does). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "model/model_internal.h"

typedef struct decode_ctx {
    ctrl_kv_cache *c;
    ctrl_kv_seq *const *seqs;
    const int *n_new;
    int n_seq;
    float *scores; /* [max position + 1] */
} decode_ctx;

/* out = softmax over the cached keys visible from `pos` of (q . k) * scale, applied to v. */
static void attend_one(const ctrl_model *m, const ctrl_kv_cache *c, int layer, const ctrl_kv_seq *s, int pos,
                       const float *q, float *out, float *scores) {
    const ctrl_model_config *cfg = &m->cfg;
    const int H = cfg->n_heads, HK = cfg->n_kv_heads, D = cfg->head_dim, group = H / HK;
    const float scale = 1.0f / sqrtf((float)D);
    const int lo =
        cfg->sliding_window > 0 && pos - cfg->sliding_window + 1 > 0 ? pos - cfg->sliding_window + 1 : 0;
    for (int h = 0; h < H; h++) {
        const int kvh = h / group;
        const float *qh = q + (size_t)h * D;
        float mx = -INFINITY;
        for (int j = lo; j <= pos; j++) {
            const float *k = ctrl_kv_at(c, 0, layer, s, j) + (size_t)kvh * D;
            float d = 0;
            for (int i = 0; i < D; i++) d += qh[i] * k[i];
            scores[j - lo] = d * scale;
            mx = scores[j - lo] > mx ? scores[j - lo] : mx;
        }
        double sum = 0;
        for (int j = lo; j <= pos; j++) sum += scores[j - lo] = expf(scores[j - lo] - mx);
        float *o = out + (size_t)h * D;
        memset(o, 0, sizeof(float) * (size_t)D);
        for (int j = lo; j <= pos; j++) {
            const float p = (float)(scores[j - lo] / sum),
                        *v = ctrl_kv_at(c, 1, layer, s, j) + (size_t)kvh * D;
            for (int i = 0; i < D; i++) o[i] += p * v[i];
        }
    }
}

/* model_attention_fn for decoding: append K/V (a token sees itself), then attend over the cache. */
static ctrl_status paged_attention(ctrl_model *m, int l, layer_acts *a, void *ctx) {
    const decode_ctx *d = ctx;
    const size_t QD = (size_t)m->cfg.n_heads * m->cfg.head_dim,
                 KD = (size_t)m->cfg.n_kv_heads * m->cfg.head_dim;
    for (int s = 0, t = 0; s < d->n_seq; s++)
        for (int i = 0; i < d->n_new[s]; i++, t++) {
            memcpy(ctrl_kv_at(d->c, 0, l, d->seqs[s], m->batch.positions[t]), a->k + t * KD,
                   sizeof(float) * KD);
            memcpy(ctrl_kv_at(d->c, 1, l, d->seqs[s], m->batch.positions[t]), a->v + t * KD,
                   sizeof(float) * KD);
        }
    for (int s = 0, t = 0; s < d->n_seq; s++)
        for (int i = 0; i < d->n_new[s]; i++, t++)
            attend_one(m, d->c, l, d->seqs[s], m->batch.positions[t], a->q + t * QD, a->att + t * QD,
                       d->scores);
    return CTRL_OK;
}

ctrl_status ctrl_model_decode(ctrl_model *m, ctrl_kv_cache *c, ctrl_kv_seq *const *seqs,
                              const int32_t *tokens, const int *n_new, int n_seq, float *logits) {
    const ctrl_model_config *cfg = &m->cfg;
    const int C = cfg->hidden_size, V = cfg->vocab_size;
    int T = 0, max_pos = 0;
    for (int s = 0; s < n_seq; s++) {
        if (n_new[s] < 1) return ctrl_error_set(CTRL_ERR_RUNTIME, "decode: sequence %d has no new token", s);
        T += n_new[s];
        max_pos = seqs[s]->len + n_new[s] > max_pos ? seqs[s]->len + n_new[s] : max_pos;
    }
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= V)
            return ctrl_error_set(CTRL_ERR_RUNTIME, "decode: token %d is outside the vocabulary (%d)",
                                  tokens[t], V);
    ctrl_status st = model_ensure_rope(m, max_pos);
    if (st == CTRL_OK) st = model_ensure_acts(m, T);
    for (int s = 0; s < n_seq && st == CTRL_OK; s++)
        st = ctrl_kv_seq_reserve(c, seqs[s], seqs[s]->len + n_new[s]);
    if (st != CTRL_OK) return st;
    free(m->batch_mem); /* positions of the new tokens, where the layer code reads them */
    m->batch_mem = malloc(sizeof(int32_t) * (size_t)T);
    float *scores = malloc(sizeof(float) * (size_t)max_pos), *h = malloc(sizeof(float) * (size_t)n_seq * C);
    float *rstd = malloc(sizeof(float) * (size_t)n_seq);
    if (!m->batch_mem || !scores || !h || !rstd) {
        free(scores), free(h), free(rstd);
        return ctrl_error_set(CTRL_ERR_NOMEM, "decode: scratch for %d tokens", T);
    }
    for (int s = 0, t = 0; s < n_seq; s++)
        for (int i = 0; i < n_new[s]; i++) m->batch_mem[t++] = seqs[s]->len + i;
    m->T = T;
    m->batch = (ctrl_batch){.T = T, .B = n_seq, .tokens = tokens, .positions = m->batch_mem};
    decode_ctx d = {c, seqs, n_new, n_seq, scores};
    ctrl_cpu_embedding_forward(m->acts[0].x_in, tokens, m->params + m->off_embed, T, C);
    for (int l = 0; l < cfg->n_layers && st == CTRL_OK; l++)
        st = model_layer_forward(m, l, l + 1 < cfg->n_layers ? m->acts[l + 1].x_in : m->x_out,
                                 paged_attention, &d);
    if (st == CTRL_OK) { /* each sequence's last new token through the head */
        for (int s = 0, t = 0; s < n_seq; s++) {
            t += n_new[s];
            memcpy(h + (size_t)s * C, m->x_out + (size_t)(t - 1) * C, sizeof(float) * (size_t)C);
            seqs[s]->len += n_new[s];
        }
        ctrl_cpu_rmsnorm_forward(h, rstd, h, m->params + m->off_norm, n_seq, C, cfg->rms_norm_eps);
        ctrl_cpu_linear_forward(logits, h, m->params + m->off_lm_head, NULL, n_seq, C, V);
    }
    m->batch.tokens = NULL; /* the caller's buffer: not kept */
    free(scores), free(h), free(rstd);
    return st;
}
