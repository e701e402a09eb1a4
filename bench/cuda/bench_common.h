/* What the GPU benchmark programs share: a monotonic clock (read after a device synchronize),
 * a median, a fail-fast check, and device buffers of random values (never zeros). */
#ifndef CTRL_BENCH_CUDA_COMMON_H
#define CTRL_BENCH_CUDA_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda/cuda_ops.h"

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define BENCH_CHECK(call)                                                                                    \
    do {                                                                                                     \
        if ((call) != CTRL_OK) {                                                                             \
            fprintf(stderr, "bench: %s failed: %s\n", #call, ctrl_error_message());                          \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

static inline double bench_median(double *x, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && x[j] < x[j - 1]; j--) {
            double t = x[j];
            x[j] = x[j - 1], x[j - 1] = t;
        }
    return x[n / 2];
}

/* n floats uniform in [-scale/2, scale/2) on the device. */
static inline float *bench_dev_random(size_t n, float scale) {
    float *h = malloc(n * 4);
    uint64_t s = 0x9E3779B97F4A7C15ull ^ n;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        h[i] = ((float)((s >> 40) * (1.0 / 16777216.0)) - 0.5f) * scale;
    }
    float *d;
    BENCH_CHECK(ctrl_cuda_malloc((void **)&d, n * 4));
    BENCH_CHECK(ctrl_cuda_memcpy_h2d(d, h, n * 4));
    free(h);
    return d;
}

#endif
