/* SwiGLU: out = silu(g) * u with silu(g) = g * sigmoid(g).
 * d/dg silu(g) = s * (1 + g * (1 - s)) with s = sigmoid(g). */
#include "cpu/cpu_ops.h"
#include "cpu/par_min.h"
#include <ctrl/exp_approx.h>

void ctrl_cpu_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= CTRL_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = g / (1.0f + ctrl_exp_approx(-g)) * up[i];
    }
}

void ctrl_cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                              int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= CTRL_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i], s = 1.0f / (1.0f + ctrl_exp_approx(-g));
        dup[i] = dout[i] * g * s;
        dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
    }
}
