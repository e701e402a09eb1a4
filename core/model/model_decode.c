/* Incremental decoding over a paged KV cache (see model.h): the new tokens of several sequences run
 * through the layers as one flat batch; each layer appends their K/V to the cache and attends over
 * the cache through the sequence's block table (causal, GQA, optional sliding window) — the CPU
 * path of paged attention; the head gives the logits of each sequence's last new token. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "model/model_internal.h"

/* out[t] = softmax over the cached keys visible from position pos of (q . k) * scale, applied to v. */
static void paged_attention(const ctrl_model *m, const ctrl_kv_cache *c, int layer, const ctrl_kv_seq *s,
                            int pos, const float *q, float *out, float *scores) {
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

ctrl_status ctrl_model_decode(ctrl_model *m, ctrl_kv_cache *c, ctrl_kv_seq *const *seqs,
                              const int32_t *tokens, const int *n_new, int n_seq, float *logits) {
    const ctrl_model_config *cfg = &m->cfg;
    const int C = cfg->hidden_size, I = cfg->intermediate_size, H = cfg->n_heads, HK = cfg->n_kv_heads,
              D = cfg->head_dim, V = cfg->vocab_size;
    const float eps = cfg->rms_norm_eps, *P = m->params;
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
    for (int s = 0; s < n_seq && st == CTRL_OK; s++)
        st = ctrl_kv_seq_reserve(c, seqs[s], seqs[s]->len + n_new[s]);
    if (st != CTRL_OK) return st;
    const size_t QD = (size_t)H * D, KD = (size_t)HK * D, wide = I > (int)QD ? (size_t)I : QD;
    float *x = malloc(sizeof(float) * T * C), *h = malloc(sizeof(float) * T * C),
          *rstd = malloc(sizeof(float) * T * H);
    float *q = malloc(sizeof(float) * T * QD), *k = malloc(sizeof(float) * T * KD),
          *v = malloc(sizeof(float) * T * KD);
    float *att = malloc(sizeof(float) * T * QD), *g = malloc(sizeof(float) * T * wide),
          *u = malloc(sizeof(float) * T * wide), *scores = malloc(sizeof(float) * (size_t)max_pos);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    if (!x || !h || !rstd || !q || !k || !v || !att || !g || !u || !scores || !pos) {
        st = ctrl_error_set(CTRL_ERR_NOMEM, "decode: scratch for %d tokens", T);
        goto done;
    }
    for (int s = 0, t = 0; s < n_seq; s++)
        for (int i = 0; i < n_new[s]; i++) pos[t++] = seqs[s]->len + i;
    ctrl_cpu_embedding_forward(x, tokens, P + m->off_embed, T, C);
    for (int l = 0; l < cfg->n_layers; l++) {
        const layer_offsets *o = &m->layers[l];
        ctrl_cpu_rmsnorm_forward(h, rstd, x, P + o->ln1, T, C, eps);
        ctrl_cpu_linear_forward(att, h, P + o->wq, o->bq >= 0 ? P + o->bq : NULL, T, C, H * D);
        ctrl_cpu_linear_forward(g, h, P + o->wk, o->bk >= 0 ? P + o->bk : NULL, T, C, HK * D);
        ctrl_cpu_linear_forward(v, h, P + o->wv, o->bv >= 0 ? P + o->bv : NULL, T, C, HK * D);
        if (cfg->qk_norm) { /* per-head RMSNorm before RoPE (Qwen3) */
            ctrl_cpu_rmsnorm_forward(att, rstd, att, P + o->q_norm, T * H, D, eps);
            ctrl_cpu_rmsnorm_forward(g, rstd, g, P + o->k_norm, T * HK, D, eps);
        }
        ctrl_cpu_rope_forward(q, att, pos, m->cos_tab, m->sin_tab, T, H, D);
        ctrl_cpu_rope_forward(k, g, pos, m->cos_tab, m->sin_tab, T, HK, D);
        for (int s = 0, t = 0; s < n_seq; s++) /* append K/V, then attend (a token sees itself) */
            for (int i = 0; i < n_new[s]; i++, t++) {
                memcpy(ctrl_kv_at(c, 0, l, seqs[s], pos[t]), k + (size_t)t * KD, sizeof(float) * KD);
                memcpy(ctrl_kv_at(c, 1, l, seqs[s], pos[t]), v + (size_t)t * KD, sizeof(float) * KD);
            }
        for (int s = 0, t = 0; s < n_seq; s++)
            for (int i = 0; i < n_new[s]; i++, t++)
                paged_attention(m, c, l, seqs[s], pos[t], q + (size_t)t * QD, att + (size_t)t * QD, scores);
        ctrl_cpu_linear_forward(h, att, P + o->wo, NULL, T, H * D, C);
        ctrl_cpu_residual_forward(x, x, h, (int64_t)T * C);
        ctrl_cpu_rmsnorm_forward(h, rstd, x, P + o->ln2, T, C, eps);
        ctrl_cpu_linear_forward(g, h, P + o->wg, NULL, T, C, I);
        ctrl_cpu_linear_forward(u, h, P + o->wu, NULL, T, C, I);
        ctrl_cpu_swiglu_forward(g, g, u, (int64_t)T * I);
        ctrl_cpu_linear_forward(h, g, P + o->wd, NULL, T, I, C);
        ctrl_cpu_residual_forward(x, x, h, (int64_t)T * C);
    }
    for (int s = 0, t = 0; s < n_seq; s++) { /* each sequence's last new token through the head */
        t += n_new[s];
        memcpy(h + (size_t)s * C, x + (size_t)(t - 1) * C, sizeof(float) * (size_t)C);
        seqs[s]->len += n_new[s];
    }
    ctrl_cpu_rmsnorm_forward(x, rstd, h, P + m->off_norm, n_seq, C, eps);
    ctrl_cpu_linear_forward(logits, x, P + m->off_lm_head, NULL, n_seq, C, V);
done:
    free(x), free(h), free(rstd), free(q), free(k), free(v), free(att), free(g), free(u), free(scores),
        free(pos);
    return st;
}
