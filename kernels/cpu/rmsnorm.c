/* RMSNorm as Llama/Qwen compute it: y = w * x * r with r = 1 / sqrt(mean(x^2) + eps).
 * Backward, with g = w * dy:  dx = r * g - x * r^3 * mean(g * x);  dw += dy * x * r.
 * Gemma's (the _1p twins) scales by (1 + w) instead of w: the same with w + 1 in place of w (the
 * product (x r)(1 + w) in that order, as GemmaRMSNorm computes it), and the same dw. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "cpu/par_min.h"

static inline void rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight, int T, int C,
                                   float eps, float offset) {
#pragma omp parallel for schedule(static) if ((size_t)T * C >= CTRL_CPU_PAR_MIN)
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * C;
        float *ot = out + (size_t)t * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)xt[c] * xt[c];
        float r = 1.0f / sqrtf((float)(ss / C) + eps);
        if (offset == 0.0f)
            for (int c = 0; c < C; c++) ot[c] = weight[c] * (xt[c] * r);
        else
            for (int c = 0; c < C; c++) ot[c] = (xt[c] * r) * (offset + weight[c]);
        rstd[t] = r;
    }
}

static inline void rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x,
                                    const float *weight, const float *rstd, int T, int C, float offset) {
#pragma omp parallel for schedule(static) if ((size_t)T * C >= CTRL_CPU_PAR_MIN)
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * C, *dy = dout + (size_t)t * C;
        float *dxt = dx + (size_t)t * C;
        const float r = rstd[t];
        double dot = 0;
        for (int c = 0; c < C; c++) dot += (double)(offset + weight[c]) * dy[c] * xt[c];
        const float k = (float)(dot / C) * r * r * r;
        for (int c = 0; c < C; c++) dxt[c] = r * (offset + weight[c]) * dy[c] - k * xt[c];
    }
    /* dw over channels, so that the sum over tokens has a fixed order; none for a frozen weight */
    if (!dweight) return;
#pragma omp parallel for schedule(static) if ((size_t)T * C >= CTRL_CPU_PAR_MIN)
    for (int c = 0; c < C; c++) {
        double s = 0;
        for (int t = 0; t < T; t++) s += (double)dout[(size_t)t * C + c] * x[(size_t)t * C + c] * rstd[t];
        dweight[c] += (float)s;
    }
}

void ctrl_cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight, int T, int C,
                              float eps) {
    rmsnorm_forward(out, rstd, x, weight, T, C, eps, 0.0f);
}
void ctrl_cpu_rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x,
                               const float *weight, const float *rstd, int T, int C) {
    rmsnorm_backward(dx, dweight, dout, x, weight, rstd, T, C, 0.0f);
}
void ctrl_cpu_rmsnorm_1p_forward(float *out, float *rstd, const float *x, const float *weight, int T, int C,
                                 float eps) {
    rmsnorm_forward(out, rstd, x, weight, T, C, eps, 1.0f);
}
void ctrl_cpu_rmsnorm_1p_backward(float *dx, float *dweight, const float *dout, const float *x,
                                  const float *weight, const float *rstd, int T, int C) {
    rmsnorm_backward(dx, dweight, dout, x, weight, rstd, T, C, 1.0f);
}
