/* The distillation head (see model.h): the generalized Jensen-Shannon divergence between the
 * student's and the teacher's next-token distributions, as TRL's GKD computes it
 * (generalized_jsd_loss: beta 0 = KL(teacher || student), 1 = KL(student || teacher), between: the
 * JSD with the mixture (1 - beta) p_s + beta p_t), with its gradient into the student.
 *
 * Only the tokens with a target are projected, a chunk of them at a time: their final hidden
 * states are gathered, both heads give the chunk's logits over the whole vocabulary (two
 * [chunk x vocabulary] buffers, never one for the batch), the divergence and dL/dlogits are formed
 * row by row, and the student head's backward gives dL/dhidden of the chunk and accumulates the LM
 * head's gradient. dL/dhidden lands in head_dh, as a fused forward leaves it, so that
 * ctrl_model_backward(student, NULL) runs the rest of the backward. Each head multiplies in its
 * model's compute dtype, as the fused LM head does: with bf16 compute the hidden rows and the head's
 * weights are rounded to bf16 and the products summed in fp32 (torch.autocast's lm_head), the
 * divergence itself and its softmaxes stay fp32.
 *
 * With p = softmax(z / tau), a = log p_s, b = log p_t and m = log((1 - beta) e^a + beta e^b):
 *   jsd = beta sum_v p_t (b - m) + (1 - beta) sum_v p_s (a - m),  dL/da_v = (1 - beta) p_s,v (a_v - m_v)
 *   beta = 0: jsd = sum_v p_t (b - a),                               dL/da_v = -p_t,v
 *   beta = 1: jsd = sum_v p_s (a - b),                               dL/da_v = p_s,v (a_v - b_v + 1)
 * and through the log-softmax dL/dz_v = (dL/da_v - p_s,v sum_u dL/da_u) / tau. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

/* Rows of logits held at once: 8 Mi floats (32 MiB) per buffer, at least one row. */
#define JSD_CHUNK_FLOATS ((size_t)8 << 20)

ctrl_status ctrl_model_hidden_forward(ctrl_model *m, const ctrl_batch *b) {
    if (m->off_lm_head < 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "model: a sequence classifier has no LM head to distil from");
    return model_trunk_forward(m, b);
}

ctrl_status ctrl_model_freeze(ctrl_model *m) {
    if (m->dgrads != m->grads || m->has_lora)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "model: freeze a model without adapters, on the CPU");
    float *g = calloc(1, sizeof(float));
    if (!g) return ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory");
    free(m->grads);
    m->grads = m->dgrads = g;
    m->train_off = m->n_params, m->n_train = 0;
    return CTRL_OK;
}

ctrl_status ctrl_model_place_like(ctrl_model *m, const ctrl_model *like) {
    if (m->be == like->be && m->device.type == like->device.type && m->device.index == like->device.index)
        return CTRL_OK;
    return ctrl_model_to_device(m, like->be, like->device);
}

/* log_softmax(z / tau) of one row into `out` (may be z). */
static void log_softmax_row(float *out, const float *z, int V, double inv_t) {
    float mx = -INFINITY;
    for (int v = 0; v < V; v++) mx = z[v] > mx ? z[v] : mx;
    double s = 0;
    for (int v = 0; v < V; v++) s += exp((z[v] - mx) * inv_t);
    const double lse = mx * inv_t + log(s);
    for (int v = 0; v < V; v++) out[v] = (float)(z[v] * inv_t - lse);
}

/* One row: zs and zt are the logits in, zs becomes dL/dz_s scaled by `w`; returns the row's jsd. */
static double jsd_row(float *zs, float *zt, int V, double beta, double inv_t, double w) {
    log_softmax_row(zs, zs, V, inv_t); /* a */
    log_softmax_row(zt, zt, V, inv_t); /* b */
    const double l1b = log1p(-beta), lb = log(beta);
    double jsd = 0, gsum = 0;
    for (int v = 0; v < V; v++) {
        const double a = zs[v], b = zt[v], ps = exp(a), pt = exp(b);
        double g;
        if (beta == 0) {
            jsd += pt * (b - a), g = -pt;
        } else if (beta == 1) {
            jsd += ps * (a - b), g = ps * (a - b + 1);
        } else {
            const double x = a + l1b, y = b + lb, hi = x > y ? x : y;
            const double mlog = hi + log(exp(x - hi) + exp(y - hi));
            jsd += beta * pt * (b - mlog) + (1 - beta) * ps * (a - mlog);
            g = (1 - beta) * ps * (a - mlog);
        }
        zt[v] = (float)g; /* b is not needed past this point */
        gsum += g;
    }
    const double scale = w * inv_t;
    for (int v = 0; v < V; v++) zs[v] = (float)(scale * (zt[v] - exp((double)zs[v]) * gsum));
    return jsd;
}

typedef struct jsd_bufs {
    float *hs, *ht, *zs, *zt, *dh; /* backend: gathered hidden rows, logits, dL/dhidden of a chunk */
    float *hzs, *hzt;              /* host copies of the logits (NULL with host memory) */
} jsd_bufs;

static void bufs_free(const ctrl_backend_ops *be, jsd_bufs *b) {
    be->free(b->hs), be->free(b->ht), be->free(b->zs), be->free(b->zt), be->free(b->dh);
    free(b->hzs), free(b->hzt);
}

static ctrl_status check_pair(const ctrl_model *s, const ctrl_model *t, const ctrl_batch *b) {
    if (t->off_lm_head < 0 || s->off_lm_head < 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "model: distillation needs two causal LMs (an LM head each)");
    if (t->cfg.vocab_size != s->cfg.vocab_size)
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "model: the teacher's vocabulary (%d) is not the student's (%d): the divergence "
            "compares their next-token distributions token by token",
            t->cfg.vocab_size, s->cfg.vocab_size);
    if (t->be != s->be || t->T != b->T)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "model: the teacher has not run this batch "
                                                "(ctrl_model_hidden_forward on the student's backend first)");
    return CTRL_OK;
}

/* The chunk's rows rows[0..n) of the divergence: forward both heads, jsd into out[], dL/dhidden
 * into head_dh, the LM head's gradient accumulated. */
static ctrl_status jsd_chunk(ctrl_model *s, ctrl_model *t, const int *rows, int n, const ctrl_jsd_args *a,
                             jsd_bufs *bf, float *out) {
    const ctrl_backend_ops *be = s->be;
    const int Cs = s->cfg.hidden_size, Ct = t->cfg.hidden_size, V = s->cfg.vocab_size;
    for (int i = 0; i < n; i++) {
        MODEL_TRY(be->copy(bf->hs + (size_t)i * Cs, s->lnf + (size_t)rows[i] * Cs, sizeof(float) * Cs));
        MODEL_TRY(be->copy(bf->ht + (size_t)i * Ct, t->lnf + (size_t)rows[i] * Ct, sizeof(float) * Ct));
    }
    /* each head in its model's compute dtype, as the fused LM head: bf16 inputs and weights, fp32 sums */
    MODEL_TRY(model_linear_forward(s, bf->zs, bf->hs, s->dparams + s->off_lm_head, NULL, n, Cs, V));
    MODEL_TRY(model_linear_forward(t, bf->zt, bf->ht, t->dparams + t->off_lm_head, NULL, n, Ct, V));
    float *zs = bf->zs, *zt = bf->zt;
    const size_t bytes = sizeof(float) * (size_t)n * V;
    if (!be->host_memory) {
        zs = bf->hzs, zt = bf->hzt;
        MODEL_TRY(be->to_host(zs, bf->zs, bytes));
        MODEL_TRY(be->to_host(zt, bf->zt, bytes));
    }
    const double inv_t = 1.0 / a->temperature;
    for (int i = 0; i < n; i++) {
        const double w = a->weight ? a->weight[rows[i]] : 0.0;
        out[rows[i]] = (float)jsd_row(zs + (size_t)i * V, zt + (size_t)i * V, V, a->beta, inv_t, w);
    }
    if (!be->host_memory) MODEL_TRY(be->to_device(bf->zs, zs, bytes));
    MODEL_TRY(model_linear_backward(s, bf->dh, model_grad(s, s->off_lm_head), NULL, bf->zs, bf->hs,
                                    s->dparams + s->off_lm_head, n, Cs, V));
    MODEL_TRY(lora_tokens_head_grad(s, bf->zs, bf->hs, n)); /* trainable_token_indices' rows, tied */
    for (int i = 0; i < n; i++)
        MODEL_TRY(be->copy(s->head_dh + (size_t)rows[i] * Cs, bf->dh + (size_t)i * Cs, sizeof(float) * Cs));
    return CTRL_OK;
}

ctrl_status ctrl_model_jsd_forward(ctrl_model *s, const ctrl_batch *b, ctrl_model *t, const ctrl_jsd_args *a,
                                   float *jsd) {
    if (!a || !(a->beta >= 0 && a->beta <= 1) || !(a->temperature > 0))
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "model: the divergence needs 0 <= beta <= 1 and temperature > 0");
    MODEL_TRY(check_pair(s, t, b));
    MODEL_TRY(model_trunk_forward(s, b));
    const ctrl_backend_ops *be = s->be;
    const int T = b->T, Cs = s->cfg.hidden_size, Ct = t->cfg.hidden_size, V = s->cfg.vocab_size;
    MODEL_TRY(model_grow(s, (void **)&s->head_dh, &s->head_dh_bytes, sizeof(float) * (size_t)T * Cs));
    MODEL_TRY(be->fill_zero(s->head_dh, sizeof(float) * (size_t)T * Cs));
    int *rows = malloc(sizeof(int) * (size_t)(T > 0 ? T : 1)), n_rows = 0;
    if (!rows) return ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory for %d rows", T);
    for (int i = 0; i < T; i++) {
        jsd[i] = 0;
        if (b->targets[i] >= 0) rows[n_rows++] = i;
    }
    size_t chunk = a->chunk_tokens > 0 ? (size_t)a->chunk_tokens : JSD_CHUNK_FLOATS / (size_t)V;
    chunk = chunk < 1 ? 1 : chunk > (size_t)n_rows ? (size_t)(n_rows > 0 ? n_rows : 1) : chunk;
    const size_t zf = chunk * (size_t)V;
    jsd_bufs bf = {0};
    ctrl_status st = be->alloc((void **)&bf.hs, sizeof(float) * chunk * Cs);
    if (st == CTRL_OK) st = be->alloc((void **)&bf.ht, sizeof(float) * chunk * Ct);
    if (st == CTRL_OK) st = be->alloc((void **)&bf.dh, sizeof(float) * chunk * Cs);
    if (st == CTRL_OK) st = be->alloc((void **)&bf.zs, sizeof(float) * zf);
    if (st == CTRL_OK) st = be->alloc((void **)&bf.zt, sizeof(float) * zf);
    if (st == CTRL_OK && !be->host_memory) {
        bf.hzs = malloc(sizeof(float) * zf), bf.hzt = malloc(sizeof(float) * zf);
        if (!bf.hzs || !bf.hzt)
            st = ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory for the logits chunk");
    }
    /* ZeRO-3: both heads gathered (the student's for its forward and backward, one gather as the
     * fused head's; a sliced teacher's too), released after the chunks */
    if (st == CTRL_OK) st = model_outer_hooks(s, 1, 1, 1);
    if (st == CTRL_OK) st = model_outer_hooks(t, 1, 0, 1);
    for (int r0 = 0; st == CTRL_OK && r0 < n_rows; r0 += (int)chunk) {
        const int n = r0 + (int)chunk <= n_rows ? (int)chunk : n_rows - r0;
        st = jsd_chunk(s, t, rows + r0, n, a, &bf, jsd);
    }
    const ctrl_status rt = model_outer_hooks(t, 1, 0, 0), rs = model_outer_hooks(s, 1, 0, 0);
    if (st == CTRL_OK) st = rt != CTRL_OK ? rt : rs;
    bufs_free(be, &bf);
    free(rows);
    s->head_dh_ready = st == CTRL_OK;
    return st;
}
