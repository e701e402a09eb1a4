/* Incremental decoding over a paged KV cache (see model.h): the new tokens of several sequences run
 * through the same layer code as training (model_layer_forward) as one flat batch; only the
 * attention differs — each layer appends the new K/V to the cache and attends over it through the
 * sequence's block table (causal, GQA, optional sliding window): the CPU path of paged attention.
 * The head gives the logits of each sequence's last new token. Decoding has scratch of its own (one
 * layer's internals), so a training forward's saved activations survive it. */
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

/* Decoding keeps nothing for a backward pass, so one set of layer internals serves every layer
 * and the layer inputs take turns in two buffers: scratch for T tokens, a few layers' worth less
 * than the training activations, which it leaves untouched. */
static ctrl_status decode_scratch(ctrl_model *m, int T) {
    if (T <= m->dec_cap_T) return CTRL_OK;
    const ctrl_model_config *c = &m->cfg;
    const size_t C = c->hidden_size, I = c->intermediate_size, QD = (size_t)c->n_heads * c->head_dim,
                 KD = (size_t)c->n_kv_heads * c->head_dim;
    const size_t internals = 3 * C + 2 + 3 * QD + 4 * KD + 2 * c->n_heads + c->n_kv_heads + 3 * I;
    free(m->dec_mem), free(m->dec_pos);
    m->dec_mem = malloc(sizeof(float) * (size_t)T * (internals + 3 * C));
    m->dec_pos = malloc(sizeof(int32_t) * (size_t)T);
    if (!m->dec_acts) m->dec_acts = calloc((size_t)c->n_layers, sizeof *m->dec_acts);
    if (!m->dec_mem || !m->dec_pos || !m->dec_acts) {
        m->dec_cap_T = 0;
        return ctrl_error_set(CTRL_ERR_NOMEM, "decode: scratch for %d tokens", T);
    }
    float *p = m->dec_mem;
#define TAKE(n) (p += (size_t)T * (n), p - (size_t)T * (n))
    layer_acts w;
    w.ln1 = TAKE(C), w.rstd1 = TAKE(1), w.q_raw = TAKE(QD), w.k_raw = TAKE(KD), w.q_rstd = TAKE(c->n_heads);
    w.k_rstd = TAKE(c->n_kv_heads), w.q = TAKE(QD), w.k = TAKE(KD), w.v = TAKE(KD), w.att = TAKE(QD);
    w.lse = TAKE(c->n_heads), w.x_mid = TAKE(C), w.ln2 = TAKE(C), w.rstd2 = TAKE(1), w.g = TAKE(I);
    w.u = TAKE(I), w.h = TAKE(I);
    float *x[2] = {TAKE(C), TAKE(C)};
    m->dec_out = TAKE(C);
#undef TAKE
    for (int l = 0; l < c->n_layers; l++) m->dec_acts[l] = w, m->dec_acts[l].x_in = x[l % 2];
    m->dec_cap_T = T;
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
    if (st == CTRL_OK) st = decode_scratch(m, T);
    for (int s = 0; s < n_seq && st == CTRL_OK; s++)
        st = ctrl_kv_seq_reserve(c, seqs[s], seqs[s]->len + n_new[s]);
    if (st != CTRL_OK) return st;
    int *seq_of = malloc(sizeof(int) * (size_t)T);
    float *h = malloc(sizeof(float) * (size_t)n_seq * C), *rstd = malloc(sizeof(float) * (size_t)n_seq);
    if (!seq_of || !h || !rstd) {
        free(seq_of), free(h), free(rstd);
        return ctrl_error_set(CTRL_ERR_NOMEM, "decode: scratch for %d tokens", T);
    }
    for (int s = 0, t = 0; s < n_seq; s++)
        for (int i = 0; i < n_new[s]; i++) seq_of[t] = s, m->dec_pos[t++] = seqs[s]->len + i;
    /* the layer code reads m->T, m->batch, m->acts and writes the last layer into m->x_out: point
     * them at the decode scratch for this call, and give the training state back after */
    const int saved_T = m->T;
    const ctrl_batch saved_batch = m->batch;
    layer_acts *saved_acts = m->acts;
    float *saved_out = m->x_out;
    m->T = T, m->acts = m->dec_acts, m->x_out = m->dec_out;
    m->batch = (ctrl_batch){.T = T, .B = n_seq, .tokens = tokens, .positions = m->dec_pos};
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
    m->T = saved_T, m->batch = saved_batch, m->acts = saved_acts, m->x_out = saved_out;
    free(seq_of), free(h), free(rstd);
    return st;
}
