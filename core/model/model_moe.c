/* Mixture-of-experts layers (Qwen3-MoE; see model_internal.h). Forward of one layer over T tokens
 * with E experts, K of them per token, expert width Im, from x = ln2 [T, C]:
 *   logits = x Wr^T; p = softmax(logits) (host); each token's top K of p (host), renormalised to sum 1
 *   with norm_topk_prob; the T K choices grouped by expert (count: where each expert's rows start);
 *   xs = x[rows] (gather); per expert e, over its rows: g = xs Wg_e^T, u = xs Wu_e^T, h = silu(g) u,
 *   y = h Wd_e^T; out[rows[i]] += w[i] y[i] in the grouped order (the experts' in increasing index,
 *   transformers' index_add order).
 * Backward from dout: dw[i] = dout[rows[i]] . y[i] (rows_dot); dy = w dout[rows] (gather); the experts'
 * GEMM backwards per expert; dx = scatter of dxs plus the router's: the routing weights' gradient
 * through the renormalisation and the softmax (host) into dlogits, then dx += dlogits Wr. LoRA on the
 * experts (target_parameters) adds its share after each expert's GEMMs (lora_moe.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

void model_moe_release(ctrl_model *m) {
    if (m->be)
        m->be->free(m->moe_dev), m->be->free(m->moe_rows), m->be->free(m->moe_ws),
            m->be->free(m->moe_lora_ws);
    m->moe_lora_ws = NULL, m->moe_lora_ws_bytes = 0;
    free(m->moe_host), free(m->moe_host_i), free(m->moe), free(m->moe_aux_grad), free(m->moe_aux_mask);
    m->moe_aux_grad = NULL, m->moe_aux_mask = NULL, m->moe_aux_armed = 0;
    m->moe = NULL, m->moe_dev = m->moe_host = m->moe_ws = NULL, m->moe_rows = m->moe_host_i = NULL;
    m->moe_cap_T = 0, m->moe_ws_bytes = 0;
}

ctrl_status model_moe_ensure(ctrl_model *m, int T) {
    const ctrl_model_config *c = &m->cfg;
    if (c->n_experts <= 0 || T <= m->moe_cap_T) return CTRL_OK;
    model_moe_release(m);
    const size_t E = (size_t)c->n_experts, K = (size_t)c->n_experts_per_tok, C = (size_t)c->hidden_size,
                 Im = (size_t)c->moe_intermediate_size, TK = (size_t)T * K;
    int layers = 0;
    for (int l = 0; l < c->n_layers; l++) layers += m->layers[l].router >= 0;
    const size_t dev = (size_t)T * E + TK * (2 * C + 3 * Im + 1), host = (size_t)T * E + TK,
                 host_i = TK + E + 1;
    m->moe = calloc((size_t)c->n_layers, sizeof *m->moe);
    m->moe_host = malloc(sizeof(float) * host * (size_t)layers);
    m->moe_host_i = malloc(sizeof(int32_t) * host_i * (size_t)layers);
    ctrl_status st = m->moe && m->moe_host && m->moe_host_i ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "moe");
    if (st == CTRL_OK) st = m->be->alloc((void **)&m->moe_dev, sizeof(float) * dev * (size_t)layers);
    if (st == CTRL_OK) st = m->be->alloc((void **)&m->moe_rows, sizeof(int32_t) * TK * (size_t)layers);
    if (st != CTRL_OK) {
        model_moe_release(m);
        return ctrl_error_wrap(st, "model: mixture-of-experts activations for %d tokens", T);
    }
    float *d = m->moe_dev, *h = m->moe_host;
    int32_t *r = m->moe_rows, *hi = m->moe_host_i;
#define TAKE(p, n) ((p) += (n), (p) - (n))
    for (int l = 0; l < c->n_layers; l++) {
        if (m->layers[l].router < 0) continue;
        moe_acts *a = &m->moe[l];
        a->logits = TAKE(d, (size_t)T * E), a->xs = TAKE(d, TK * C), a->g = TAKE(d, TK * Im);
        a->u = TAKE(d, TK * Im), a->h = TAKE(d, TK * Im), a->y = TAKE(d, TK * C), a->w = TAKE(d, TK);
        a->rows = TAKE(r, TK);
        a->probs = TAKE(h, (size_t)T * E), a->weight = TAKE(h, TK);
        a->idx = TAKE(hi, TK), a->count = TAKE(hi, E + 1);
    }
#undef TAKE
    m->moe_cap_T = T;
    return CTRL_OK;
}

/* Expert e's weight `which` (0 gate, 1 up, 2 down) in the parameters P. */
static inline size_t expert_at(const ctrl_model *m, int l, int e, int which) {
    const size_t C = (size_t)m->cfg.hidden_size, Im = (size_t)m->cfg.moe_intermediate_size;
    return (size_t)m->layers[l].experts + (3 * (size_t)e + (size_t)which) * Im * C;
}

/* Host routing: softmax (float, max-subtracted), the top K of each row (the larger probability first,
 * the lower index on a tie), renormalised with norm_topk_prob; the choices grouped by expert into
 * rows / w (host staging `rows_h`, `w_h`) and count. */
static void route(const ctrl_model *m, moe_acts *a, int T, int32_t *rows_h, float *w_h) {
    const int E = m->cfg.n_experts, K = m->cfg.n_experts_per_tok;
    for (int t = 0; t < T; t++) {
        float *p = a->probs + (size_t)t * E, mx = -INFINITY, s = 0;
        for (int e = 0; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        for (int e = 0; e < E; e++) s += p[e] = expf(p[e] - mx);
        for (int e = 0; e < E; e++) p[e] /= s;
        int32_t *idx = a->idx + (size_t)t * K;
        float *w = a->weight + (size_t)t * K, sum = 0;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= idx[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            idx[k] = best, w[k] = p[best], sum += p[best];
        }
        if (m->cfg.norm_topk_prob)
            for (int k = 0; k < K; k++) w[k] /= sum;
    }
    memset(a->count, 0, sizeof(int32_t) * (size_t)(E + 1));
    for (int i = 0; i < T * K; i++) a->count[a->idx[i] + 1]++;
    for (int e = 0; e < E; e++) a->count[e + 1] += a->count[e];
    int32_t *fill = malloc(sizeof(int32_t) * (size_t)E);
    if (fill) memcpy(fill, a->count, sizeof(int32_t) * (size_t)E);
    for (int t = 0; fill && t < T; t++) /* tokens in order within each expert */
        for (int k = 0; k < K; k++) {
            const int at = fill[a->idx[(size_t)t * K + k]]++;
            rows_h[at] = t, w_h[at] = a->weight[(size_t)t * K + k];
        }
    free(fill);
}

ctrl_status ctrl_model_moe_aux_loss(ctrl_model *m, const uint8_t *mask, float scale, double *aux) {
    const ctrl_model_config *c = &m->cfg;
    const int T = m->T, E = c->n_experts, K = c->n_experts_per_tok;
    *aux = 0;
    if (E <= 0 || !m->moe || T <= 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "model: an auxiliary loss needs a mixture-of-experts forward first");
    double *cnt = calloc((size_t)E, sizeof(double)), *psum = calloc((size_t)E, sizeof(double));
    free(m->moe_aux_grad), free(m->moe_aux_mask);
    m->moe_aux_grad = malloc(sizeof(float) * (size_t)E), m->moe_aux_mask = malloc((size_t)T);
    if (!cnt || !psum || !m->moe_aux_grad || !m->moe_aux_mask) {
        free(cnt), free(psum);
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: auxiliary loss");
    }
    double rows = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (m->layers[l].router < 0) continue;
        const moe_acts *a = &m->moe[l];
        for (int t = 0; t < T; t++) {
            if (mask && !mask[t]) continue;
            rows++;
            for (int k = 0; k < K; k++) cnt[a->idx[(size_t)t * K + k]]++;
            for (int e = 0; e < E; e++) psum[e] += a->probs[(size_t)t * E + e];
        }
    }
    for (int t = 0; t < T; t++) m->moe_aux_mask[t] = !mask || mask[t];
    double s = 0;
    for (int e = 0; e < E; e++) {
        const double f = rows > 0 ? cnt[e] / rows : 0, p = rows > 0 ? psum[e] / rows : 0;
        s += f * p;
        m->moe_aux_grad[e] = rows > 0 ? (float)(scale * E * f / rows) : 0.0f; /* d(scale aux)/dp of a row */
    }
    *aux = E * s;
    m->moe_aux_armed = rows > 0 && scale != 0;
    free(cnt), free(psum);
    return CTRL_OK;
}

ctrl_status model_moe_forward(ctrl_model *m, int l, const float *x, float *out) {
    const ctrl_backend_ops *be = m->be;
    const ctrl_model_config *c = &m->cfg;
    const int T = m->T, E = c->n_experts, K = c->n_experts_per_tok, C = c->hidden_size,
              Im = c->moe_intermediate_size;
    const float *P = m->dparams;
    moe_acts *a = &m->moe[l];
    MODEL_TRY(model_linear_forward(m, a->logits, x, P + m->layers[l].router, NULL, T, C, E));
    MODEL_TRY(be->to_host(a->probs, a->logits, sizeof(float) * (size_t)T * E));
    int32_t *rows_h = malloc(sizeof(int32_t) * (size_t)T * K);
    float *w_h = malloc(sizeof(float) * (size_t)T * K);
    if (!rows_h || !w_h) {
        free(rows_h), free(w_h);
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: routing %d tokens", T);
    }
    route(m, a, T, rows_h, w_h);
    ctrl_status st = be->to_device(a->rows, rows_h, sizeof(int32_t) * (size_t)T * K);
    if (st == CTRL_OK) st = be->to_device(a->w, w_h, sizeof(float) * (size_t)T * K);
    free(rows_h), free(w_h);
    MODEL_TRY(st);
    MODEL_TRY(be->gather_rows(a->xs, x, a->rows, NULL, T * K, C));
    for (int e = 0; e < E; e++) { /* one GEMM per expert over its rows */
        const int r0 = a->count[e], n = a->count[e + 1] - r0;
        if (n == 0) continue;
        const float *xs = a->xs + (size_t)r0 * C;
        MODEL_TRY(
            model_linear_forward(m, a->g + (size_t)r0 * Im, xs, P + expert_at(m, l, e, 0), NULL, n, C, Im));
        MODEL_TRY(
            model_linear_forward(m, a->u + (size_t)r0 * Im, xs, P + expert_at(m, l, e, 1), NULL, n, C, Im));
        MODEL_TRY(lora_moe_gate_up(m, l, e, xs, n, a->g + (size_t)r0 * Im, a->u + (size_t)r0 * Im));
    }
    MODEL_TRY(be->swiglu_forward(a->h, a->g, a->u, (int64_t)T * K * Im));
    for (int e = 0; e < E; e++) {
        const int r0 = a->count[e], n = a->count[e + 1] - r0;
        if (n == 0) continue;
        MODEL_TRY(model_linear_forward(m, a->y + (size_t)r0 * C, a->h + (size_t)r0 * Im,
                                       P + expert_at(m, l, e, 2), NULL, n, Im, C));
        MODEL_TRY(
            lora_moe_down(m, l, e, a->h + (size_t)r0 * Im, n, a->y + (size_t)r0 * C)); /* target_parameters */
    }
    if (!out) return CTRL_OK;
    MODEL_TRY(be->fill_zero(out, sizeof(float) * (size_t)T * C));
    return be->scatter_add_rows(out, a->y, a->rows, a->w, T * K, C);
}

/* dL/d(router logits) [T, E] on the host from dL/d(routing weights) dw [T, K]. */
static void route_backward(const ctrl_model *m, const moe_acts *a, int T, const float *dw, float *dz) {
    const int E = m->cfg.n_experts, K = m->cfg.n_experts_per_tok;
    for (int t = 0; t < T; t++) {
        const float *p = a->probs + (size_t)t * E, *w = a->weight + (size_t)t * K, *g = dw + (size_t)t * K;
        const int32_t *idx = a->idx + (size_t)t * K;
        float *dp = dz + (size_t)t * E;
        memset(dp, 0, sizeof(float) * (size_t)E);
        if (m->cfg.norm_topk_prob) { /* w_k = p_k / S: dp_j = (dw_j - sum_k dw_k w_k) / S */
            double S = 0, dot = 0;
            for (int k = 0; k < K; k++) S += p[idx[k]], dot += (double)g[k] * w[k];
            for (int k = 0; k < K; k++) dp[idx[k]] = (float)((g[k] - dot) / S);
        } else {
            for (int k = 0; k < K; k++) dp[idx[k]] = g[k];
        }
        if (m->moe_aux_armed && m->moe_aux_mask[t]) /* the auxiliary loss: d/dp_e on every kept row */
            for (int e = 0; e < E; e++) dp[e] += m->moe_aux_grad[e];
        double s = 0; /* softmax: dz = p (dp - sum p dp) */
        for (int e = 0; e < E; e++) s += (double)p[e] * dp[e];
        for (int e = 0; e < E; e++) dp[e] = p[e] * (float)(dp[e] - s);
    }
}

ctrl_status model_moe_backward(ctrl_model *m, int l, const float *x, const float *dout, float *dx) {
    const ctrl_backend_ops *be = m->be;
    const ctrl_model_config *c = &m->cfg;
    const int T = m->T, E = c->n_experts, K = c->n_experts_per_tok, C = c->hidden_size,
              Im = c->moe_intermediate_size, TK = T * K;
    const float *P = m->dparams;
    const moe_acts *a = &m->moe[l];
    /* scratch: dw [TK], dy [TK, C], dxs [TK, C], tmp [TK, C], dh, dg, du [TK, Im], dz [T, E] */
    const size_t floats = (size_t)TK * (1 + 3 * (size_t)C + 3 * (size_t)Im) + (size_t)T * E;
    MODEL_TRY(model_grow(m, (void **)&m->moe_ws, &m->moe_ws_bytes, sizeof(float) * floats));
    float *dw = m->moe_ws, *dy = dw + TK, *dxs = dy + (size_t)TK * C, *tmp = dxs + (size_t)TK * C,
          *dh = tmp + (size_t)TK * C, *dg = dh + (size_t)TK * Im, *du = dg + (size_t)TK * Im,
          *dz = du + (size_t)TK * Im;
    MODEL_TRY(be->rows_dot(dw, dout, a->rows, a->y, TK, C));
    MODEL_TRY(be->gather_rows(dy, dout, a->rows, a->w, TK, C));
    for (int e = 0; e < E; e++) {
        const int r0 = a->count[e], n = a->count[e + 1] - r0;
        if (n == 0) continue;
        MODEL_TRY(model_linear_backward(m, dh + (size_t)r0 * Im, model_grad(m, (long)expert_at(m, l, e, 2)),
                                        NULL, dy + (size_t)r0 * C, a->h + (size_t)r0 * Im,
                                        P + expert_at(m, l, e, 2), n, Im, C));
        MODEL_TRY(lora_moe_down_backward(m, l, e, a->h + (size_t)r0 * Im, dy + (size_t)r0 * C, n,
                                         dh + (size_t)r0 * Im));
    }
    MODEL_TRY(be->swiglu_backward(dg, du, dh, a->g, a->u, (int64_t)TK * Im));
    for (int e = 0; e < E; e++) {
        const int r0 = a->count[e], n = a->count[e + 1] - r0;
        if (n == 0) continue;
        const float *xs = a->xs + (size_t)r0 * C;
        MODEL_TRY(model_linear_backward(m, dxs + (size_t)r0 * C, model_grad(m, (long)expert_at(m, l, e, 0)),
                                        NULL, dg + (size_t)r0 * Im, xs, P + expert_at(m, l, e, 0), n, C, Im));
        MODEL_TRY(model_linear_backward(m, tmp + (size_t)r0 * C, model_grad(m, (long)expert_at(m, l, e, 1)),
                                        NULL, du + (size_t)r0 * Im, xs, P + expert_at(m, l, e, 1), n, C, Im));
        MODEL_TRY(lora_moe_gate_up_backward(m, l, e, xs, dg + (size_t)r0 * Im, du + (size_t)r0 * Im, n,
                                            dxs + (size_t)r0 * C));
    }
    MODEL_TRY(be->residual_forward(dxs, dxs, tmp, (int64_t)TK * C));
    /* the router: the routing weights' gradient through top-k and softmax, on the host */
    float *dw_h = malloc(sizeof(float) * (size_t)TK), *dw_tk = malloc(sizeof(float) * (size_t)TK),
          *dz_h = malloc(sizeof(float) * (size_t)T * E);
    int32_t *rows_h = malloc(sizeof(int32_t) * (size_t)TK);
    ctrl_status st =
        dw_h && dw_tk && dz_h && rows_h ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "moe backward");
    if (st == CTRL_OK) st = be->to_host(dw_h, dw, sizeof(float) * (size_t)TK);
    if (st == CTRL_OK) st = be->to_host(rows_h, a->rows, sizeof(int32_t) * (size_t)TK);
    if (st == CTRL_OK) { /* grouped order back to [T, K]: expert e's rows are its tokens in order */
        int32_t *fill = malloc(sizeof(int32_t) * (size_t)E);
        if (!fill) st = ctrl_error_set(CTRL_ERR_NOMEM, "moe backward");
        for (int e = 0; fill && e < E; e++) fill[e] = a->count[e];
        for (int t = 0; fill && t < T; t++)
            for (int k = 0; k < K; k++) dw_tk[(size_t)t * K + k] = dw_h[fill[a->idx[(size_t)t * K + k]]++];
        free(fill);
    }
    if (st == CTRL_OK) route_backward(m, a, T, dw_tk, dz_h);
    if (st == CTRL_OK) st = be->to_device(dz, dz_h, sizeof(float) * (size_t)T * E);
    free(dw_h), free(dw_tk), free(dz_h), free(rows_h);
    MODEL_TRY(st);
    MODEL_TRY(model_linear_backward(m, dx, model_grad(m, m->layers[l].router), NULL, dz, x,
                                    P + m->layers[l].router, T, C, E));
    return be->scatter_add_rows(dx, dxs, a->rows, NULL, TK, C);
}
