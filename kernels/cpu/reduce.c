/* Reductions for the global gradient norm and its clipping. Both are passes over every trainable
 * parameter's gradient (494M at Qwen2.5-0.5B's size), so `simd`: the sum in 8 double lanes per thread
 * (the order of the additions differs from one lane's, as it already did between thread counts; the
 * squares are exact in double, the sum agrees to ~1e-15 relative), the scaling lane by lane (the
 * same products). */
#include "cpu/cpu_ops.h"

double ctrl_cpu_sum_squares(const float *x, int64_t n) {
    double s = 0;
#pragma omp parallel for simd reduction(+ : s) schedule(static)
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

void ctrl_cpu_scale(float *x, float s, int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}
