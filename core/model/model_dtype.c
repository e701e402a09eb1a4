/* The model's compute dtype (see model.h): fp32, or bf16 as torch.autocast runs it — the linear
 * projections multiply bf16-rounded inputs by bf16-rounded weights with fp32 accumulation. The
 * rounded weights are a copy kept beside the fp32 master weights and rebuilt only after they
 * change (ctrl_model_weights_changed), not in every projection: decoding runs the projections on a
 * handful of tokens per step, where rounding the weights each time would cost more than the GEMM. */
#include <stdlib.h>

#include "cpu/cpu_ops.h"
#include "model/model_internal.h"

ctrl_status ctrl_model_set_compute_dtype(ctrl_model *m, ctrl_dtype dtype) {
    if (dtype != CTRL_F32 && dtype != CTRL_BF16)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "model: compute dtype %s is not supported on the CPU (fp32 or bf16)",
                              ctrl_dtype_name(dtype));
    m->linear_bf16 = dtype == CTRL_BF16;
    m->rounded_valid = 0;
    return CTRL_OK;
}

ctrl_dtype ctrl_model_compute_dtype(const ctrl_model *m) { return m->linear_bf16 ? CTRL_BF16 : CTRL_F32; }

void ctrl_model_weights_changed(ctrl_model *m) { m->rounded_valid = 0; }

ctrl_status model_prepare_weights(ctrl_model *m) {
    if (!m->linear_bf16 || m->rounded_valid) return CTRL_OK;
    if (!m->rounded && !(m->rounded = malloc(sizeof(float) * m->n_params)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: the bf16 copy of %zu parameters", m->n_params);
    ctrl_cpu_round_to_bf16(m->rounded, m->params, (int64_t)m->n_params);
    m->rounded_valid = 1;
    return CTRL_OK;
}

/* w (inside the parameters) as the projection multiplies it. */
static const float *as_multiplied(const ctrl_model *m, const float *w) {
    return m->rounded_valid ? m->rounded + (w - m->params) : w;
}

ctrl_status model_linear_forward(const ctrl_model *m, float *out, const float *x, const float *w,
                                 const float *bias, int T, int IN, int OUT) {
    if (!m->linear_bf16) {
        ctrl_cpu_linear_forward(out, x, w, bias, T, IN, OUT);
        return CTRL_OK;
    }
    return ctrl_cpu_linear_forward_bf16(out, x, as_multiplied(m, w), bias, T, IN, OUT, m->rounded_valid) == 0
               ? CTRL_OK
               : ctrl_error_set(CTRL_ERR_NOMEM, "model: bf16 scratch for a %d x %d linear over %d tokens",
                                OUT, IN, T);
}

ctrl_status model_linear_backward(const ctrl_model *m, float *dx, float *dw, float *dbias, const float *dout,
                                  const float *x, const float *w, int T, int IN, int OUT) {
    if (!m->linear_bf16) {
        ctrl_cpu_linear_backward(dx, dw, dbias, dout, x, w, T, IN, OUT);
        return CTRL_OK;
    }
    return ctrl_cpu_linear_backward_bf16(dx, dw, dbias, dout, x, as_multiplied(m, w), T, IN, OUT,
                                         m->rounded_valid) == 0
               ? CTRL_OK
               : ctrl_error_set(CTRL_ERR_NOMEM, "model: bf16 scratch for a %d x %d linear over %d tokens",
                                OUT, IN, T);
}
