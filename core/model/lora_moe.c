/* LoRA on a mixture-of-experts layer's experts (PEFT's target_parameters, lora.ParamWrapper over
 * transformers 5's stacked expert weights gate_up_proj [E, 2 Im, C] and down_proj [E, C, Im]): expert
 * e's weight W_e [out, in] becomes W_e + s B_e A_e with A_e [r, in] = rows e r ... of lora_A [E r, in]
 * and B_e [out, r] = columns e, E + e, ... of lora_B [out, E r] (PEFT's reshape(out, r, E)). ctrl holds
 * B expert after expert ([E][out, r]) so that each expert's GEMMs read a contiguous block; the
 * adapter files are permuted on the way in and out (peft_io.c). gate_up_proj's output is gate's
 * Im rows then up's (Qwen3MoeExperts' chunk(2)): one A_e and the two row blocks of B_e, as Phi-3's
 * fused projections (lora.c). Over expert e's n routed rows:
 *   forward   xa = s xs A_e^T [n, r];  g += xa B_e[:Im]^T;  u += xa B_e[Im:]^T;  y += s (h Ad_e^T) Bd_e^T
 *   backward  dB_e += d^T xa;  dxa = s (dg B_gate + du B_up);  dA_e += dxa^T xs;  dxs += dxa A_e
 * (xa recomputed from the kept inputs: nothing more is stored than without adapters). PEFT refuses
 * lora_dropout and DoRA on these wrappers; so does ctrl (lora.c's layout). */
#include <cblas.h>
#include <stdio.h>

#include "model/model_internal.h"

static long *slot(const ctrl_model *m, int l, int k) { return &m->moe_lora[l * 4 + k]; }

int lora_moe_layout(ctrl_model *m, size_t *cursor, int l) {
    const ctrl_model_config *c = &m->cfg;
    const int E = c->n_experts, r = m->lora->r, C = c->hidden_size, Im = c->moe_intermediate_size;
    for (int k = 0; k < 4; k++) *slot(m, l, k) = -1;
    if (m->layers[l].router < 0) return 0;
    const int gu = ctrl_lora_targets_param(m->lora, l, LORA_MOE_GATE_UP),
              dn = ctrl_lora_targets_param(m->lora, l, LORA_MOE_DOWN);
    for (int w = 0; w < LORA_MOE_N; w++) {
        if (!(w ? dn : gu)) continue;
        const int in = w ? Im : C, out = w ? C : 2 * Im;
        /* PEFT nests a module's wrappers in its parameters' order: gate_up_proj's is the inner one */
        const char *nest = !w && dn ? ".base_layer" : "";
        for (int ab = 0; ab < 2; ab++) {
            char n[160];
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts%s.lora_%c.weight", l, nest, ab ? 'B' : 'A');
            const int at = m->n_views;
            *slot(m, l, 2 * w + ab) =
                model_add_view(m, cursor, n, 2, ab ? out : (int64_t)E * r, ab ? (int64_t)E * r : in, 0);
            if (at < m->cap_views) m->views[at].lora = 1;
        }
    }
    return gu + dn;
}

/* Backend scratch: xa, dxa, dxb [n, r] and w1 [n, max(Im, C)]. */
static ctrl_status scratch(ctrl_model *m, int n, float **xa, float **dxa, float **dxb, float **w1) {
    const size_t r = (size_t)m->lora->r, wide = (size_t)(m->cfg.hidden_size > m->cfg.moe_intermediate_size
                                                             ? m->cfg.hidden_size
                                                             : m->cfg.moe_intermediate_size);
    MODEL_TRY(model_grow(m, (void **)&m->moe_lora_ws, &m->moe_lora_ws_bytes,
                         sizeof(float) * (size_t)n * (3 * r + wide)));
    *xa = m->moe_lora_ws, *dxa = *xa + (size_t)n * r, *dxb = *dxa + (size_t)n * r, *w1 = *dxb + (size_t)n * r;
    return CTRL_OK;
}

/* xa = s x A_e^T [n, r] of layer l's adapter w (0 gate_up, 1 down); A_e = rows e r ... of lora_A. */
static ctrl_status adapter_a(ctrl_model *m, int l, int w, int e, const float *x, int n, int in, float *xa) {
    const int r = m->lora->r;
    MODEL_TRY(
        model_linear_forward(m, xa, x, m->dparams + *slot(m, l, 2 * w) + (size_t)e * r * in, NULL, n, in, r));
    return m->be->scale(xa, m->lora_scale, (int64_t)n * r);
}

/* out [n, OUT] += xa B_blk^T, B_blk = rows row0 ... of expert e's B [out, r] (adapter w). */
static ctrl_status add_b(ctrl_model *m, int l, int w, int e, int out, int row0, const float *xa, int n,
                         int OUT, float *dst, float *tmp) {
    const int r = m->lora->r;
    const float *B = m->dparams + *slot(m, l, 2 * w + 1) + ((size_t)e * out + (size_t)row0) * r;
    MODEL_TRY(model_linear_forward(m, tmp, xa, B, NULL, n, r, OUT));
    return m->be->residual_forward(dst, dst, tmp, (int64_t)n * OUT);
}

/* Whether layer l's adapter w (0 gate_up, 1 down) is on: then the scratch (ws: xa, dxa, dxb, w1)
 * with xa = s x A_e^T of expert e's n rows x [n, in]. */
static ctrl_status begin(ctrl_model *m, int l, int w, int e, const float *x, int n, int in, float **ws,
                         int *on) {
    *on = m->moe_lora && !m->lora_off && *slot(m, l, 2 * w) >= 0;
    if (!*on) return CTRL_OK;
    MODEL_TRY(scratch(m, n, &ws[0], &ws[1], &ws[2], &ws[3]));
    return adapter_a(m, l, w, e, x, n, in, ws[0]);
}

ctrl_status lora_moe_gate_up(ctrl_model *m, int l, int e, const float *xs, int n, float *g, float *u) {
    if (m->dec_adapters) return lora_bank_moe(m, l, LORA_MOE_GATE_UP, e, xs, n, g, u); /* serving */
    const int C = m->cfg.hidden_size, Im = m->cfg.moe_intermediate_size;
    float *ws[4];
    int on;
    MODEL_TRY(begin(m, l, 0, e, xs, n, C, ws, &on));
    if (!on) return CTRL_OK;
    MODEL_TRY(add_b(m, l, 0, e, 2 * Im, 0, ws[0], n, Im, g, ws[3]));
    return add_b(m, l, 0, e, 2 * Im, Im, ws[0], n, Im, u, ws[3]);
}

ctrl_status lora_moe_down(ctrl_model *m, int l, int e, const float *h, int n, float *y) {
    if (m->dec_adapters) return lora_bank_moe(m, l, LORA_MOE_DOWN, e, h, n, y, NULL); /* serving */
    const int C = m->cfg.hidden_size, Im = m->cfg.moe_intermediate_size;
    float *ws[4];
    int on;
    MODEL_TRY(begin(m, l, 1, e, h, n, Im, ws, &on));
    return on ? add_b(m, l, 1, e, C, 0, ws[0], n, C, y, ws[3]) : CTRL_OK;
}

/* dB_blk += d^T xa and tmp = d B_blk [n, r] for rows row0 ... OUT of expert e's B (adapter w). */
static ctrl_status back_b(ctrl_model *m, int l, int w, int e, int out, int row0, const float *d,
                          const float *xa, int n, int OUT, float *dxa_part) {
    const int r = m->lora->r;
    const long off = *slot(m, l, 2 * w + 1) + ((long)e * out + row0) * r;
    return model_linear_backward(m, dxa_part, model_grad(m, off), NULL, d, xa, m->dparams + off, n, r, OUT);
}

/* From dxa (unscaled: d xa B^T summed) the rest: dxa *= s, dA_e += dxa^T x, dx += dxa A_e. */
static ctrl_status back_a(ctrl_model *m, int l, int w, int e, const float *x, int n, int in, float *dxa,
                          float *dx, float *tmp) {
    const int r = m->lora->r;
    const long off = *slot(m, l, 2 * w) + (long)e * r * in;
    MODEL_TRY(m->be->scale(dxa, m->lora_scale, (int64_t)n * r));
    MODEL_TRY(model_linear_backward(m, tmp, model_grad(m, off), NULL, dxa, x, m->dparams + off, n, in, r));
    return m->be->residual_forward(dx, dx, tmp, (int64_t)n * in);
}

ctrl_status lora_moe_down_backward(ctrl_model *m, int l, int e, const float *h, const float *dy, int n,
                                   float *dh) {
    const int C = m->cfg.hidden_size, Im = m->cfg.moe_intermediate_size;
    float *ws[4];
    int on;
    MODEL_TRY(begin(m, l, 1, e, h, n, Im, ws, &on));
    if (!on) return CTRL_OK;
    MODEL_TRY(back_b(m, l, 1, e, C, 0, dy, ws[0], n, C, ws[1]));
    return back_a(m, l, 1, e, h, n, Im, ws[1], dh, ws[3]);
}

ctrl_status lora_moe_gate_up_backward(ctrl_model *m, int l, int e, const float *xs, const float *dg,
                                      const float *du, int n, float *dxs) {
    const int C = m->cfg.hidden_size, Im = m->cfg.moe_intermediate_size;
    float *ws[4];
    int on;
    MODEL_TRY(begin(m, l, 0, e, xs, n, C, ws, &on));
    if (!on) return CTRL_OK;
    MODEL_TRY(back_b(m, l, 0, e, 2 * Im, 0, dg, ws[0], n, Im, ws[1]));
    MODEL_TRY(back_b(m, l, 0, e, 2 * Im, Im, du, ws[0], n, Im, ws[2]));
    MODEL_TRY(m->be->residual_forward(ws[1], ws[1], ws[2], (int64_t)n * m->lora->r));
    return back_a(m, l, 0, e, xs, n, C, ws[1], dxs, ws[3]);
}

void lora_moe_merge(ctrl_model *m, int l, float *experts) {
    const ctrl_model_config *c = &m->cfg;
    const int E = c->n_experts, r = m->lora->r, C = c->hidden_size, Im = c->moe_intermediate_size;
    if (!m->moe_lora) return;
    for (int e = 0; e < E; e++) {
        float *W = experts + (size_t)3 * e * Im * C; /* gate, up, down */
        if (*slot(m, l, 0) >= 0) { /* [Im, C] += s B_blk [Im, r] A_e [r, C], gate's rows then up's */
            const float *A = m->params + *slot(m, l, 0) + (size_t)e * r * C,
                        *B = m->params + *slot(m, l, 1) + (size_t)e * 2 * Im * r;
            for (int p = 0; p < 2; p++)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Im, C, r, m->lora_scale,
                            B + (size_t)p * Im * r, r, A, C, 1.0f, W + (size_t)p * Im * C, C);
        }
        if (*slot(m, l, 2) >= 0) /* down [C, Im] += s B_e [C, r] A_e [r, Im] */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, C, Im, r, m->lora_scale,
                        m->params + *slot(m, l, 3) + (size_t)e * C * r, r,
                        m->params + *slot(m, l, 2) + (size_t)e * r * Im, Im, 1.0f, W + (size_t)2 * Im * C,
                        Im);
    }
}
