/* What the model families differ in, behind one call each (model_internal.h): the RMSNorm (Llama's
 * weight, Gemma's 1 + weight), the MLP's gate activation (SwiGLU, Gemma's GeGLU), the sandwich
 * norms' activation buffers, and the check that a backend has what a family needs. */
#include "model/model_internal.h"

ctrl_status model_norm_forward(const ctrl_model *m, float *out, float *rstd, const float *x, const float *w,
                               int T, int C) {
    const float eps = m->cfg.rms_norm_eps;
    return m->cfg.norm_plus_one ? m->be->rmsnorm_1p_forward(out, rstd, x, w, T, C, eps)
                                : m->be->rmsnorm_forward(out, rstd, x, w, T, C, eps);
}

ctrl_status model_norm_backward(const ctrl_model *m, float *dx, float *dw, const float *dout, const float *x,
                                const float *w, const float *rstd, int T, int C) {
    return m->cfg.norm_plus_one ? m->be->rmsnorm_1p_backward(dx, dw, dout, x, w, rstd, T, C)
                                : m->be->rmsnorm_backward(dx, dw, dout, x, w, rstd, T, C);
}

ctrl_status model_act_forward(const ctrl_model *m, float *h, const float *g, const float *u, int64_t n) {
    return m->cfg.mlp_act == CTRL_ACT_GELU_TANH ? m->be->geglu_forward(h, g, u, n)
                                                : m->be->swiglu_forward(h, g, u, n);
}

ctrl_status model_act_backward(const ctrl_model *m, float *dg, float *du, const float *dh, const float *g,
                               const float *u, int64_t n) {
    return m->cfg.mlp_act == CTRL_ACT_GELU_TANH ? m->be->geglu_backward(dg, du, dh, g, u, n)
                                                : m->be->swiglu_backward(dg, du, dh, g, u, n);
}

ctrl_status model_check_backend(const ctrl_model *m, const ctrl_backend_ops *be) {
    const ctrl_model_config *c = &m->cfg;
    const char *missing = NULL;
    if (c->norm_plus_one &&
        !(ctrl_backend_has(be, rmsnorm_1p_forward) && ctrl_backend_has(be, rmsnorm_1p_backward)))
        missing = "the (1 + weight) RMSNorm (rmsnorm_1p)";
    else if (c->mlp_act == CTRL_ACT_GELU_TANH &&
             !(ctrl_backend_has(be, geglu_forward) && ctrl_backend_has(be, geglu_backward)))
        missing = "the GeGLU activation (geglu)";
    else if (ctrl_model_rope_dim(c) < c->head_dim &&
             !(ctrl_backend_has(be, rope_partial_forward) && ctrl_backend_has(be, rope_partial_backward)))
        missing = "partial rotary embeddings (rope_partial)";
    else if (c->n_experts > 0 && !(ctrl_backend_has(be, gather_rows) &&
                                   ctrl_backend_has(be, scatter_add_rows) && ctrl_backend_has(be, rows_dot)))
        missing = "the mixture-of-experts row gather/scatter (gather_rows, scatter_add_rows, rows_dot)";
    else if (c->final_softcap > 0 && !ctrl_backend_flag(be, head_softcap))
        missing = "final-logit soft-capping in the LM head (head_softcap)";
    if (!missing) return CTRL_OK;
    return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "model: the %s backend has no %s, which %s needs", be->name,
                          missing, c->model_type);
}

ctrl_status model_rope(const ctrl_model *m, int l, float *out, const float *x, const int32_t *pos, int T,
                       int n_head, int forward) {
    const int D = m->cfg.head_dim, R = ctrl_model_rope_dim(&m->cfg);
    const size_t at = model_rope_offset(m, l);
    const float *c = m->cos_tab + at, *s = m->sin_tab + at;
    if (R < D)
        return forward ? m->be->rope_partial_forward(out, x, pos, c, s, T, n_head, D, R)
                       : m->be->rope_partial_backward(out, x, pos, c, s, T, n_head, D, R);
    return forward ? m->be->rope_forward(out, x, pos, c, s, T, n_head, D)
                   : m->be->rope_backward(out, x, pos, c, s, T, n_head, D);
}

size_t model_arch_act_floats(const ctrl_model_config *c) {
    return c->sandwich_norm ? 2 * (size_t)c->hidden_size + 2 : 0;
}

void model_arch_take_acts(const ctrl_model_config *c, layer_acts *a, float **p, int T) {
    a->o_raw = a->rstd_pa = a->d_raw = a->rstd_pf = NULL;
    if (!c->sandwich_norm) return;
    const size_t C = (size_t)c->hidden_size;
    a->o_raw = *p, *p += (size_t)T * C;
    a->rstd_pa = *p, *p += T;
    a->d_raw = *p, *p += (size_t)T * C;
    a->rstd_pf = *p, *p += T;
}
