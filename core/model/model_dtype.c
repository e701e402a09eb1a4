/* The model's compute dtype (see model.h): fp32, or bf16 as torch.autocast runs it — the linear
 * projections multiply bf16-rounded inputs by bf16-rounded weights with fp32 accumulation. Where
 * the products do not round the weights themselves at no cost (a CPU without AVX-512 BF16, CUDA),
 * the rounded weights are a copy kept beside the fp32 master weights and rebuilt only after they
 * change (ctrl_model_weights_changed), not in every projection: decoding runs the projections on a
 * handful of tokens per step, where rounding the weights each time would cost more than the GEMM.
 * On the CPU a forward of many tokens rounds them per projection instead (no copy: 4 bytes a
 * parameter less; the rounding is ~1/T of each product's work). */
#include "model/model_internal.h"

/* Forwards of at least this many tokens on the CPU round each projection's weights as they run
 * instead of keeping the rounded copy (model_prepare_weights). */
#define MODEL_BF16_COPY_MAX_T 64

ctrl_status ctrl_model_set_compute_dtype(ctrl_model *m, ctrl_dtype dtype) {
    if (dtype != CTRL_F32 && dtype != CTRL_BF16)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "model: compute dtype %s is not supported on %s (fp32 or bf16)",
                              ctrl_dtype_name(dtype), m->be->name);
    if (dtype == CTRL_BF16 &&
        (!ctrl_backend_has(m->be, linear_forward_bf16) || !ctrl_backend_has(m->be, round_to_bf16)))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "model: bf16 compute is not implemented on %s yet",
                              m->be->name);
    m->linear_bf16 = dtype == CTRL_BF16;
    m->rounded_valid = 0;
    return CTRL_OK;
}

ctrl_dtype ctrl_model_compute_dtype(const ctrl_model *m) { return m->linear_bf16 ? CTRL_BF16 : CTRL_F32; }

void ctrl_model_weights_changed(ctrl_model *m) {
    m->rounded_valid = 0;
    m->dec_pack_gen++; /* decoding's packed bf16 weights (model_decode_pack.c) are stale */
    m->dora_valid = 0;
    m->dparams_valid = m->dparams == m->params;
    m->host_stale = 0;
}

ctrl_status ctrl_model_set_round_skip(ctrl_model *m, const size_t *ranges, int n) {
    m->round_skip = n > 0 ? ranges : NULL, m->n_round_skip = n > 0 ? n : 0;
    return CTRL_OK;
}

ctrl_status ctrl_model_params_range_changed(ctrl_model *m, size_t off, size_t n) {
    if (n) m->dec_pack_gen++;
    if (!m->rounded || !m->rounded_valid || !n) return CTRL_OK;
    return m->be->round_to_bf16(m->rounded + off, m->dparams + off, (int64_t)n);
}

float *ctrl_model_bf16_copy(const ctrl_model *m) { return m->rounded; }

ctrl_status model_prepare_weights(ctrl_model *m, int T) {
    const size_t bytes = sizeof(float) * m->n_params;
    if (!m->dparams_valid) {
        ctrl_status st = m->be->to_device(m->dparams, m->params, bytes);
        if (st != CTRL_OK) return ctrl_error_wrap(st, "model: parameters onto %s", m->be->name);
        m->dparams_valid = 1;
        m->nf4_layer = -1; /* QLoRA: the device's slot now holds the host's, not a layer's */
    }
    /* no rounded copy where the backend's bf16 products round w themselves at no cost */
    const int rounds_itself = ctrl_backend_has(m->be, bf16_rounds_weights) && m->be->bf16_rounds_weights();
    /* nor on the CPU for a forward of many tokens (training, scoring, a prefill): each product
     * rounds its weights into a scratch the size of one projection as it runs (kernels/cpu/bf16.c),
     * a cost of about 1/T of the product's, instead of a copy of 4 bytes a parameter; decoding's
     * few-token forwards keep the copy, where rounding in every call would cost as much as the
     * product (a copy made for them is used by any forward while the weights stay as they are) */
    const int per_call = m->be->host_memory && T >= MODEL_BF16_COPY_MAX_T;
    /* nor for a model held in bf16 (model_bf16_store.c): its parameters are bf16 values, or panels;
     * nor for ZeRO-3's sliced device parameters (dbufs_external): a copy would be the whole model's,
     * and the layers gathered in bf16 hold bf16 values already (the products round the rest) */
    if (m->linear_bf16 && !m->rounded_valid && !rounds_itself && !per_call && !m->w16 && !m->base_panels &&
        !m->dbufs_external) {
        if (!m->rounded) {
            ctrl_status st = m->be->alloc((void **)&m->rounded, bytes);
            if (st != CTRL_OK)
                return ctrl_error_wrap(st, "model: the bf16 copy of %zu parameters", m->n_params);
        }
        ctrl_status st = CTRL_OK;
        for (int i = 0; i <= m->n_round_skip && st == CTRL_OK; i++) { /* the gaps between */
            const size_t a = i ? m->round_skip[2 * i - 1] : 0;
            const size_t b = i < m->n_round_skip ? m->round_skip[2 * i] : m->n_params;
            if (b > a) st = m->be->round_to_bf16(m->rounded + a, m->dparams + a, (int64_t)(b - a));
        }
        m->rounded_valid = st == CTRL_OK;
        if (st != CTRL_OK) return st;
    }
    return dora_prepare(m); /* DoRA's weight norms, after the weights changed */
}

/* w (inside the parameters) as the projection multiplies it. */
static const float *as_multiplied(const ctrl_model *m, const float *w) {
    return m->rounded_valid ? m->rounded + (w - m->dparams) : w;
}

ctrl_status model_linear_forward(const ctrl_model *m, float *out, const float *x, const float *w,
                                 const float *bias, int T, int IN, int OUT) {
    if (nf4_holds(m, w)) return nf4_linear_forward(m, out, x, w, bias, T, IN, OUT); /* QLoRA's base */
    if (!m->linear_bf16) return m->be->linear_forward(out, x, w, bias, T, IN, OUT);
    if (m->dec_pack) { /* panels (model_decode_pack.c): decoding's, current ones, a held base */
        int used = 0;
        ctrl_status st = model_pack_linear(m, out, x, w, bias, T, IN, OUT, &used);
        if (st != CTRL_OK || used) return st;
    }
    return m->be->linear_forward_bf16(out, x, as_multiplied(m, w), bias, T, IN, OUT,
                                      m->rounded_valid || model_bf16_holds(m, w));
}

ctrl_status model_linear_backward(const ctrl_model *m, float *dx, float *dw, float *dbias, const float *dout,
                                  const float *x, const float *w, int T, int IN, int OUT) {
    if (nf4_holds(m, w)) return nf4_linear_backward(m, dx, dw, dbias, dout, w, T, IN, OUT);
    if (!m->linear_bf16) return m->be->linear_backward(dx, dw, dbias, dout, x, w, T, IN, OUT);
    if (m->dec_pack) { /* dx on the forward's panels, read transposed (model_decode_pack.c) */
        int used = 0;
        ctrl_status st = model_pack_linear_backward(m, dx, dw, dbias, dout, x, w, T, IN, OUT, &used);
        if (st != CTRL_OK || used) return st;
    }
    return m->be->linear_backward_bf16(dx, dw, dbias, dout, x, as_multiplied(m, w), T, IN, OUT,
                                       m->rounded_valid || model_bf16_holds(m, w));
}
