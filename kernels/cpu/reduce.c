/* Reductions for the global gradient norm and its clipping. */
#include "cpu/cpu_ops.h"

double ctrl_cpu_sum_squares(const float *x, int64_t n) {
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

void ctrl_cpu_scale(float *x, float s, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}
