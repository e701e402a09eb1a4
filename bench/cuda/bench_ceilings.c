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

#include "bench_common.h"
#include "cuda/cuda_ops.h"

int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    if (ctrl_cuda_device_count() == 0) {
        printf("bench_cuda_ceilings: skipped: %s\n", ctrl_cuda_unavailable_reason());
        return 0;
    }
    char name[256];
    BENCH_CHECK(ctrl_cuda_device_name(0, name, sizeof name));
    printf("device: %s\n", name);
    const int reps = quick ? 5 : 20;
    double times[64];

    /* Copy bandwidth: 2 GiB copied device to device (4 GiB of traffic). */
    size_t bytes = (size_t)(quick ? 512 : 2048) << 20;
    float *a = bench_dev_random(bytes / 4, 1.0f), *b = bench_dev_random(bytes / 4, 1.0f);
    for (int i = 0; i < 3; i++) BENCH_CHECK(ctrl_cuda_memcpy_d2d(b, a, bytes));
    BENCH_CHECK(ctrl_cuda_synchronize());
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        BENCH_CHECK(ctrl_cuda_memcpy_d2d(b, a, bytes));
        BENCH_CHECK(ctrl_cuda_synchronize());
        times[r] = bench_now() - t0;
    }
    double copy_gbs = 2.0 * bytes / bench_median(times, reps) / 1e9;
    ctrl_cuda_free(a);
    ctrl_cuda_free(b);

    /* bf16 GEMM, M = N = K = 8192 (4096 with --quick). */
    const int n = quick ? 4096 : 8192;
    size_t elems = (size_t)n * n;
    float *f = bench_dev_random(elems, 1.0f);
    uint16_t *x, *w, *o;
    BENCH_CHECK(ctrl_cuda_malloc((void **)&x, elems * 2));
    BENCH_CHECK(ctrl_cuda_malloc((void **)&w, elems * 2));
    BENCH_CHECK(ctrl_cuda_malloc((void **)&o, elems * 2));
    BENCH_CHECK(ctrl_cuda_f32_to_bf16(x, f, (int64_t)elems));
    ctrl_cuda_free(f);
    f = bench_dev_random(elems + 1, 1.0f); /* other values for W */
    BENCH_CHECK(ctrl_cuda_f32_to_bf16(w, f, (int64_t)elems));
    for (int i = 0; i < 3; i++) BENCH_CHECK(ctrl_cuda_linear_forward_bf16(o, x, w, n, n, n));
    BENCH_CHECK(ctrl_cuda_synchronize());
    const int inner = 5; /* several GEMMs per timing, so launch and sync gaps are amortised */
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        for (int i = 0; i < inner; i++) BENCH_CHECK(ctrl_cuda_linear_forward_bf16(o, x, w, n, n, n));
        BENCH_CHECK(ctrl_cuda_synchronize());
        times[r] = (bench_now() - t0) / inner;
    }
    double tflops = 2.0 * n * (double)n * n / bench_median(times, reps) / 1e12;
    ctrl_cuda_free(f), ctrl_cuda_free(x), ctrl_cuda_free(w), ctrl_cuda_free(o);

    ctrl_cuda_mem_stats st;
    ctrl_cuda_mem_stats_get(&st);
    printf("ctrl   copy_bandwidth_GBps %.0f\n", copy_gbs);
    printf("ctrl   bf16_gemm_%d_TFLOPs %.1f\n", n, tflops);
    printf("ctrl   allocator: %ld driver allocations, peak %.2f GiB\n", st.driver_allocs,
           st.peak / 1073741824.0);
    return 0;
}
