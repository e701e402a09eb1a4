/* Row gather / scatter for mixture-of-experts layers: the tokens routed to each expert gathered into
 * one contiguous block (so each expert runs one GEMM over its tokens), the expert outputs scattered
 * back weighted by the routing weights, and the routing weights' gradient (one dot product a row). */
#include "cpu/cpu_ops.h"

void ctrl_cpu_gather_rows(float *out, const float *x, const int32_t *rows, const float *scale, int n, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float s = scale ? scale[i] : 1.0f, *xr = x + (size_t)rows[i] * C;
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = scale ? s * xr[c] : xr[c];
    }
}

void ctrl_cpu_scatter_add_rows(float *out, const float *y, const int32_t *rows, const float *scale, int n,
                               int C) {
    /* over channels, each walking the rows in order: a repeated row accumulates in the order of i,
     * whatever the thread count */
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++)
        for (int i = 0; i < n; i++)
            out[(size_t)rows[i] * C + c] += scale ? y[(size_t)i * C + c] * scale[i] : y[(size_t)i * C + c];
}

void ctrl_cpu_rows_dot(float *out, const float *x, const int32_t *rows, const float *y, int n, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *xr = x + (size_t)rows[i] * C, *yr = y + (size_t)i * C;
        double s = 0;
        for (int c = 0; c < C; c++) s += (double)xr[c] * yr[c];
        out[i] = (float)s;
    }
}
