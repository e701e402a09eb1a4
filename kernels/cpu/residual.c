/* Residual adds; the backward passes the gradient to both branches (accumulating). */
#include "cpu/cpu_ops.h"
#include "cpu/par_min.h"

void ctrl_cpu_residual_forward(float *out, const float *a, const float *b, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= CTRL_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void ctrl_cpu_residual_backward(float *da, float *db, const float *dout, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= CTRL_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}
