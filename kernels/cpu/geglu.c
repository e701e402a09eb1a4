/* GeGLU (Gemma's MLP): out = gelu_tanh(g) * u with torch's tanh approximation
 *   gelu_tanh(g) = g/2 (1 + tanh(k (g + 0.044715 g^3))),  k = sqrt(2 / pi);
 * d/dg gelu_tanh(g) = (1 + t)/2 + g/2 (1 - t^2) k (1 + 3 * 0.044715 g^2), t the tanh above. */
#include <math.h>

#include "cpu/cpu_ops.h"

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

void ctrl_cpu_geglu_forward(float *out, const float *gate, const float *up, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i], t = tanhf(GELU_K * (g + GELU_C * g * g * g));
        out[i] = 0.5f * g * (1.0f + t) * up[i];
    }
}

void ctrl_cpu_geglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                             int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i], t = tanhf(GELU_K * (g + GELU_C * g * g * g));
        const float act = 0.5f * g * (1.0f + t),
                    dact = 0.5f * (1.0f + t) +
                           0.5f * g * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * g * g);
        dup[i] = dout[i] * act;
        dgate[i] = dout[i] * up[i] * dact;
    }
}
