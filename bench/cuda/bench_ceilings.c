/* The two ceilings every GPU number is judged against, measured through ctrl's own code:
 * device-to-device copy bandwidth (bytes read + written per second) and bf16 GEMM throughput
 * through the cuBLASLt linear (fp32 accumulation). Random inputs (never zeros), warm-up first,
 * median of the timed repetitions; the host clock is read after a device synchronize.
 * usage: bench_cuda_ceilings [--quick] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_ops.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define CHECK(call)                                                                                          \
    do {                                                                                                     \
        if ((call) != CTRL_OK) {                                                                             \
            fprintf(stderr, "bench: %s failed: %s\n", #call, ctrl_error_message());                          \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

static void fill_random(float *d, size_t n) {
    float *h = malloc(n * 4);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        h[i] = (float)((s >> 40) * (1.0 / 16777216.0)) - 0.5f;
    }
    CHECK(ctrl_cuda_memcpy_h2d(d, h, n * 4));
    free(h);
}

int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    if (ctrl_cuda_device_count() == 0) {
        printf("bench_cuda_ceilings: skipped: %s\n", ctrl_cuda_unavailable_reason());
        return 0;
    }
    char name[256];
    CHECK(ctrl_cuda_device_name(0, name, sizeof name));
    printf("device: %s\n", name);
    const int reps = quick ? 5 : 20;
    double times[64];

    /* Copy bandwidth: 2 GiB copied device to device (4 GiB of traffic). */
    size_t bytes = (size_t)(quick ? 512 : 2048) << 20;
    void *a, *b;
    CHECK(ctrl_cuda_malloc(&a, bytes));
    CHECK(ctrl_cuda_malloc(&b, bytes));
    fill_random(a, bytes / 4);
    for (int i = 0; i < 3; i++) CHECK(ctrl_cuda_memcpy_d2d(b, a, bytes));
    CHECK(ctrl_cuda_synchronize());
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        CHECK(ctrl_cuda_memcpy_d2d(b, a, bytes));
        CHECK(ctrl_cuda_synchronize());
        times[r] = now() - t0;
    }
    qsort(times, reps, sizeof times[0], cmp_double);
    double copy_gbs = 2.0 * bytes / times[reps / 2] / 1e9;
    ctrl_cuda_free(a);
    ctrl_cuda_free(b);

    /* bf16 GEMM, M = N = K = 8192 (4096 with --quick). */
    const int n = quick ? 4096 : 8192;
    size_t elems = (size_t)n * n;
    float *f;
    uint16_t *x, *w, *o;
    CHECK(ctrl_cuda_malloc((void **)&f, elems * 4));
    CHECK(ctrl_cuda_malloc((void **)&x, elems * 2));
    CHECK(ctrl_cuda_malloc((void **)&w, elems * 2));
    CHECK(ctrl_cuda_malloc((void **)&o, elems * 2));
    fill_random(f, elems);
    CHECK(ctrl_cuda_f32_to_bf16(x, f, (int64_t)elems));
    fill_random(f, elems);
    CHECK(ctrl_cuda_f32_to_bf16(w, f, (int64_t)elems));
    for (int i = 0; i < 3; i++) CHECK(ctrl_cuda_linear_forward_bf16(o, x, w, n, n, n));
    CHECK(ctrl_cuda_synchronize());
    const int inner = 5; /* several GEMMs per timing, so launch and sync gaps are amortised */
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int i = 0; i < inner; i++) CHECK(ctrl_cuda_linear_forward_bf16(o, x, w, n, n, n));
        CHECK(ctrl_cuda_synchronize());
        times[r] = (now() - t0) / inner;
    }
    qsort(times, reps, sizeof times[0], cmp_double);
    double tflops = 2.0 * n * (double)n * n / times[reps / 2] / 1e12;
    ctrl_cuda_free(f), ctrl_cuda_free(x), ctrl_cuda_free(w), ctrl_cuda_free(o);

    ctrl_cuda_mem_stats st;
    ctrl_cuda_mem_stats_get(&st);
    printf("ctrl   copy_bandwidth_GBps %.0f\n", copy_gbs);
    printf("ctrl   bf16_gemm_%d_TFLOPs %.1f\n", n, tflops);
    printf("ctrl   allocator: %ld driver allocations, peak %.2f GiB\n", st.driver_allocs,
           st.peak / 1073741824.0);
    return 0;
}
