/* DoRA's per-row ops (core/model/dora.c; PEFT's tuners/lora/dora.py), the CPU reference of
 * kernels/cuda/dora.cu: the weight norm of each output row of W + s B A from the low-rank products,
 * the magnitude's scaling of each row's output, and the magnitude's gradient. Sums in double. */
#include <math.h>

#include "cpu/cpu_ops.h"

void ctrl_cpu_dora_norm(float *norm, float *g, const float *W, const float *B, const float *WA,
                        const float *BG, const float *mag, float s, int OUT, int IN, int r) {
#pragma omp parallel for schedule(static)
    for (int j = 0; j < OUT; j++) {
        if (W) { /* n_j^2 = ||W_j||^2 + sum_k B_jk (2 s (W A^T)_jk + s^2 (B A A^T)_jk) */
            double n2 = 0;
            for (int i = 0; i < IN; i++) n2 += (double)W[(size_t)j * IN + i] * W[(size_t)j * IN + i];
            for (int k = 0; k < r; k++) {
                const size_t jk = (size_t)j * r + k;
                n2 += (double)B[jk] * (2 * (double)s * WA[jk] + (double)s * s * BG[jk]);
            }
            norm[j] = (float)sqrt(n2 > 0 ? n2 : 0);
        }
        if (g) g[j] = mag[j] / norm[j];
    }
}

void ctrl_cpu_dora_combine(float *out, const float *yl, const float *yb, const float *bias, const float *g,
                           int T, int OUT) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *o = out + (size_t)t * OUT;
        const float *L = yl + (size_t)t * OUT, *Y = yb ? yb + (size_t)t * OUT : NULL;
        for (int j = 0; j < OUT; j++) {
            const float base = Y ? Y[j] : bias ? o[j] - bias[j] : o[j];
            o[j] = o[j] + ((g[j] - 1.0f) * base + g[j] * L[j]);
        }
    }
}

void ctrl_cpu_dora_backward(float *dmag, float *yl, float *yb, const float *dout, const float *norm,
                            const float *g, int T, int OUT) {
#pragma omp parallel for schedule(static)
    for (int j = 0; j < OUT; j++) {
        double acc = 0;
        for (int t = 0; t < T; t++) {
            const size_t k = (size_t)t * OUT + j;
            acc += (double)dout[k] * ((double)yb[k] + yl[k]);
            yl[k] = g[j] * dout[k], yb[k] = (g[j] - 1.0f) * dout[k];
        }
        dmag[j] += (float)(acc / norm[j]);
    }
}
