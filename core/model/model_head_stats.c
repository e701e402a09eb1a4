/* Per-token statistics of the head's distribution besides the log-prob, from the last forward's
 * final hidden states (see model.h): the mean logit over the vocabulary, one dot product per token
 * with the mean row of the LM head (the logits are linear in it), and log sum_v p_v^2 from a second
 * log-sum-exp at half the temperature (log sum p^2 = lse(2z) - 2 lse(z)). Neither builds a
 * [tokens x vocabulary] tensor; both run on any backend through its ops. */
#include <math.h>
#include <stdlib.h>

#include "cpu/cpu_ops.h"
#include "model/model_internal.h"

/* The LM head's mean row, wbar = (1/V) sum_v W[v], into d [C] (backend memory): on the host from the
 * parameters, summed in double; on a device from its copy of them (after a forward it is current, and
 * an optimizer that steps there leaves the host's stale), as the GEMM (1/V ... 1/V) W of the
 * backend's linear backward. */
static ctrl_status mean_head_row(ctrl_model *m, float *d) {
    const ctrl_backend_ops *be = m->be;
    const int C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    if (!be->host_memory) {
        float *u = malloc(sizeof(float) * (size_t)V), *du = NULL;
        ctrl_status st = u ? be->alloc((void **)&du, sizeof(float) * (size_t)V)
                           : ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory");
        for (int v = 0; u && v < V; v++) u[v] = 1.0f / (float)V;
        if (st == CTRL_OK) st = be->to_device(du, u, sizeof(float) * (size_t)V);
        if (st == CTRL_OK)
            st = be->linear_backward(d, NULL, NULL, du, NULL, m->dparams + m->off_lm_head, 1, C, V);
        if (du) be->free(du);
        free(u);
        return st;
    }
    const float *w = m->params + m->off_lm_head;
    double *acc = calloc((size_t)C, sizeof(double));
    float *row = malloc(sizeof(float) * (size_t)C);
    if (!acc || !row) {
        free(acc), free(row);
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory");
    }
    /* a tied head held in bf16 alone ([peft] embedding_dtype = bf16): its rows widened */
    const int w16 = model_embed16_holds(m, m->dparams + m->off_lm_head);
    ctrl_status st = CTRL_OK;
    for (int32_t v = 0; v < V && st == CTRL_OK; v++) {
        if (w16) st = model_embed16_rows(m, &v, 1, row);
        const float *r = w16 ? row : w + (size_t)v * C;
        for (int c = 0; c < C; c++) acc[c] += r[c];
    }
    free(row);
    for (int c = 0; c < C; c++) d[c] = (float)(acc[c] / V);
    free(acc);
    return st;
}

static ctrl_status mean_logits(ctrl_model *m, float *out) {
    const ctrl_backend_ops *be = m->be;
    const int T = m->T, C = m->cfg.hidden_size;
    float *d = NULL;
    ctrl_status st = be->alloc((void **)&d, sizeof(float) * ((size_t)C + (size_t)T));
    if (st == CTRL_OK) st = mean_head_row(m, d);
    if (st == CTRL_OK) st = be->linear_forward(d + C, m->lnf, d, NULL, T, C, 1);
    if (st == CTRL_OK) st = be->to_host(out, d + C, sizeof(float) * (size_t)T);
    for (int t = 0; st == CTRL_OK && t < T; t++)
        out[t] = m->batch.targets[t] >= 0 ? out[t] / m->temperature : 0.0f;
    if (d) be->free(d);
    return st;
}

/* With final-logit soft-capping the mean is not linear in h: the logits chunk by chunk of the
 * vocabulary (one GEMM each on the backend), capped and summed on the host. */
static ctrl_status mean_capped_logits(ctrl_model *m, float *out) {
    const ctrl_backend_ops *be = m->be;
    /* (a table held as the head's panels: whole column blocks of theirs) */
    const int T = m->T, C = m->cfg.hidden_size, V = m->cfg.vocab_size, block = model_embed16_chunk(m),
              VC = block > 0  ? (V < block ? V : block)
                   : V < 4096 ? V
                              : 4096;
    const float cap = m->cfg.final_softcap;
    float *d = NULL, *z = malloc(sizeof(float) * (size_t)T * VC);
    double *acc = calloc((size_t)T, sizeof(double));
    ctrl_status st = z && acc ? be->alloc((void **)&d, sizeof(float) * (size_t)T * VC)
                              : ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory");
    for (int v0 = 0; st == CTRL_OK && v0 < V; v0 += VC) {
        const int vc = v0 + VC <= V ? VC : V - v0;
        if (model_embed16_holds(m, m->dparams + m->off_lm_head)) /* the tied table in bf16: its values */
            st = model_embed16_forward(m, d, vc, m->lnf, T, v0, vc, 0);
        else
            st = be->linear_forward(d, m->lnf, m->dparams + m->off_lm_head + (size_t)v0 * C, NULL, T, C, vc);
        if (st == CTRL_OK) st = be->to_host(z, d, sizeof(float) * (size_t)T * vc);
        for (int t = 0; st == CTRL_OK && t < T; t++)
            for (int j = 0; j < vc; j++) acc[t] += cap * tanhf(z[(size_t)t * vc + j] / cap);
    }
    for (int t = 0; st == CTRL_OK && t < T; t++)
        out[t] = m->batch.targets[t] >= 0 ? (float)(acc[t] / V) / m->temperature : 0.0f;
    if (d) be->free(d);
    free(z), free(acc);
    return st;
}

static ctrl_status log_sum_sq(ctrl_model *m, float *out) {
    const ctrl_backend_ops *be = m->be;
    const int T = m->T;
    ctrl_head_args ha = model_head_args(m);
    ha.temperature *= 0.5f; /* logits 2z */
    float *d = NULL, *lse = malloc(sizeof(float) * (size_t)T);
    ctrl_status st = lse ? model_grow(m, &m->head_ws, &m->head_ws_bytes, be->head_workspace_bytes(&ha))
                         : ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory");
    if (st == CTRL_OK) st = be->alloc((void **)&d, sizeof(float) * 2 * (size_t)T);
    if (st == CTRL_OK) st = be->head_forward(&ha, d, NULL, d + T, NULL, m->head_ws);
    if (st == CTRL_OK) st = be->to_host(out, d + T, sizeof(float) * (size_t)T);
    if (st == CTRL_OK) st = be->to_host(lse, m->head_lse, sizeof(float) * (size_t)T);
    for (int t = 0; st == CTRL_OK && t < T; t++)
        out[t] = m->batch.targets[t] >= 0 ? out[t] - 2.0f * lse[t] : 0.0f;
    if (d) be->free(d);
    free(lse);
    return st;
}

ctrl_status ctrl_model_head_stats(ctrl_model *m, float *mean_logit, float *log_sum_sq_probs) {
    if (m->T <= 0 || !m->batch.targets)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "model: head statistics need a forward first");
    if (m->off_lm_head < 0)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "model: a sequence classifier has no LM head statistics");
    ctrl_status st = model_outer_hooks(m, 1, 0, 1); /* ZeRO-3: the head gathered for these */
    if (st == CTRL_OK)
        st = !mean_logit                ? CTRL_OK
             : m->cfg.final_softcap > 0 ? mean_capped_logits(m, mean_logit)
                                        : mean_logits(m, mean_logit);
    if (st == CTRL_OK && log_sum_sq_probs) st = log_sum_sq(m, log_sum_sq_probs);
    const ctrl_status sr = model_outer_hooks(m, 1, 0, 0); /* and released */
    return st == CTRL_OK ? sr : st;
}
