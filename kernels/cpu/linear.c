/* Linear layers on OpenBLAS, Hugging Face layout W [OUT, IN]:
 *   out = x W^T + b;   dx = dout W;   dW += dout^T x;   db += column sums of dout.
 * A NULL dx, dW or db is not computed (dW: a frozen weight). */
#include <cblas.h>

#include "cpu/cpu_ops.h"

void ctrl_cpu_linear_forward(float *out, const float *x, const float *w, const float *bias, int T, int IN,
                             int OUT) {
    if (T == 1) /* one token (decoding one sequence): sgemv reads w once, 3-5x less CPU than sgemm */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, OUT, IN, 1.0f, w, IN, x, 1, 0.0f, out, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, OUT, IN, 1.0f, x, IN, w, IN, 0.0f, out, OUT);
    if (!bias) return;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int o = 0; o < OUT; o++) out[(size_t)t * OUT + o] += bias[o];
}

void ctrl_cpu_linear_backward(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                              const float *w, int T, int IN, int OUT) {
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, IN, OUT, 1.0f, dout, OUT, w, IN, 0.0f, dx,
                    IN);
    if (dw) /* NULL: a frozen weight (LoRA), no gradient */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OUT, IN, T, 1.0f, dout, OUT, x, IN, 1.0f, dw,
                    IN);
    if (!dbias) return;
#pragma omp parallel for schedule(static)
    for (int o = 0; o < OUT; o++) {
        double s = 0;
        for (int t = 0; t < T; t++) s += dout[(size_t)t * OUT + o];
        dbias[o] += (float)s;
    }
}
