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
    int n_seq, max_pos;
    const int *seq_of; /* [T] the sequence of each new token */
} decode_ctx;

/* For the query heads of kv head `kvh` (a GQA group): out = softmax over the cached keys visible
 * from `pos` of (q . k) * scale, applied to v. The cache is read through the sequence's block
 * table, each K and V row once for the whole group. scores: [group][pos + 1]. */
static void attend_group(const ctrl_model *m, const ctrl_kv_cache *c, int layer, const ctrl_kv_seq *s,
                         int pos, int kvh, const float *q, float *out, float *scores) {
    const ctrl_model_config *cfg = &m->cfg;
    const int HK = cfg->n_kv_heads, D = cfg->head_dim, G = cfg->n_heads / HK, bs = c->block_size;
    const float scale = 1.0f / sqrtf((float)D);
    const int lo =
        cfg->sliding_window > 0 && pos - cfg->sliding_window + 1 > 0 ? pos - cfg->sliding_window + 1 : 0;
    const int n = pos - lo + 1;
    const size_t slot = (size_t)HK * D, layer_off = (size_t)layer * c->n_blocks * bs * slot;
    const float *qg = q + (size_t)kvh * G * D;
    for (int j = lo; j <= pos; j++) {
        const float *k =
            c->k + layer_off + ((size_t)s->blocks[j / bs] * bs + j % bs) * slot + (size_t)kvh * D;
        for (int g = 0; g < G; g++) {
            const float *qh = qg + (size_t)g * D;
            float d = 0;
#pragma omp simd reduction(+ : d)
            for (int i = 0; i < D; i++) d += qh[i] * k[i];
            scores[(size_t)g * n + j - lo] = d * scale;
        }
    }
    float *og = out + (size_t)kvh * G * D;
    memset(og, 0, sizeof(float) * (size_t)G * D);
    for (int g = 0; g < G; g++) { /* softmax of each head's row, normalized up front */
        float *sc = scores + (size_t)g * n, mx = -INFINITY;
        for (int j = 0; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
        double sum = 0;
        for (int j = 0; j < n; j++) sum += sc[j] = expf(sc[j] - mx);
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < n; j++) sc[j] *= inv;
    }
    for (int j = lo; j <= pos; j++) {
        const float *v =
            c->v + layer_off + ((size_t)s->blocks[j / bs] * bs + j % bs) * slot + (size_t)kvh * D;
        for (int g = 0; g < G; g++) {
            const float p = scores[(size_t)g * n + j - lo];
            float *o = og + (size_t)g * D;
#pragma omp simd
            for (int i = 0; i < D; i++) o[i] += p * v[i];
        }
    }
}

/* model_attention_fn for decoding: append K/V (a token sees itself), then attend over the cache,
 * every (new token, kv head) pair in parallel. */
static ctrl_status paged_attention(ctrl_model *m, int l, layer_acts *a, void *ctx) {
    const decode_ctx *d = ctx;
    const int H = m->cfg.n_heads, T = m->T;
    const size_t QD = (size_t)H * m->cfg.head_dim, KD = (size_t)m->cfg.n_kv_heads * m->cfg.head_dim;
    for (int s = 0, t = 0; s < d->n_seq; s++)
        for (int i = 0; i < d->n_new[s]; i++, t++) {
            memcpy(ctrl_kv_at(d->c, 0, l, d->seqs[s], m->batch.positions[t]), a->k + t * KD,
                   sizeof(float) * KD);
            memcpy(ctrl_kv_at(d->c, 1, l, d->seqs[s], m->batch.positions[t]), a->v + t * KD,
                   sizeof(float) * KD);
        }
    const int HK = m->cfg.n_kv_heads;
#pragma omp parallel
    {
        float *scores = malloc(sizeof(float) * (size_t)(H / HK) * (size_t)(d->max_pos + 1));
#pragma omp for schedule(dynamic, 8)
        for (long w = 0; w < (long)T * HK; w++) {
            const int t = (int)(w / HK), kvh = (int)(w % HK);
            if (scores)
                attend_group(m, d->c, l, d->seqs[d->seq_of[t]], m->batch.positions[t], kvh, a->q + t * QD,
                             a->att + t * QD, scores);
        }
        free(scores);
    }
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
    int *seq_of = malloc(sizeof(int) * (size_t)T);
    float *h = malloc(sizeof(float) * (size_t)n_seq * C), *rstd = malloc(sizeof(float) * (size_t)n_seq);
    if (!m->batch_mem || !seq_of || !h || !rstd) {
        free(seq_of), free(h), free(rstd);
        return ctrl_error_set(CTRL_ERR_NOMEM, "decode: scratch for %d tokens", T);
    }
    for (int s = 0, t = 0; s < n_seq; s++)
        for (int i = 0; i < n_new[s]; i++) seq_of[t] = s, m->batch_mem[t++] = seqs[s]->len + i;
    m->T = T;
    m->batch = (ctrl_batch){.T = T, .B = n_seq, .tokens = tokens, .positions = m->batch_mem};
    decode_ctx d = {c, seqs, n_new, n_seq, max_pos, seq_of};
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
    free(seq_of), free(h), free(rstd);
    return st;
}
