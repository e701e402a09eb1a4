/* The fused LM head on the GPU against materialised logits (bench/cuda/torch_head.py): forward +
 * backward time and peak device memory for a Qwen2.5-0.5B-shaped head (C = 896, V = 151936),
 * fp32, T tokens. Peak memory counts everything the step allocates through ctrl's allocator
 * (hidden, weight, its gradient, dhidden, per-token outputs, the chunk workspace).
 * usage: bench_cuda_head [T] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu/cpu_ops.h"
#include "bench_common.h"
#include "cuda/cuda_ops.h"

int main(int argc, char **argv) {
    if (ctrl_cuda_device_count() == 0) {
        printf("bench_cuda_head: skipped: %s\n", ctrl_cuda_unavailable_reason());
        return 0;
    }
    const int T = argc > 1 ? atoi(argv[1]) : 8192, C = 896, V = 151936;
    ctrl_cuda_mem_stats_reset_peak();
    ctrl_cuda_mem_stats s0;
    ctrl_cuda_mem_stats_get(&s0);
    ctrl_head_args a = {.T = T, .C = C, .V = V, .temperature = 1.0f};
    a.hidden = bench_dev_random((size_t)T * C, 2);
    a.w = bench_dev_random((size_t)V * C, 0.1f);
    int32_t *tg = malloc(T * 4);
    for (int t = 0; t < T; t++) tg[t] = (int32_t)((t * 7919u) % V);
    void *d_tg;
    BENCH_CHECK(ctrl_cuda_malloc(&d_tg, T * 4));
    BENCH_CHECK(ctrl_cuda_memcpy_h2d(d_tg, tg, T * 4));
    a.targets = d_tg;
    float *logp, *ent, *lse, *dh, *dw, *dl = bench_dev_random(T, 1);
    BENCH_CHECK(ctrl_cuda_malloc((void **)&logp, T * 4));
    BENCH_CHECK(ctrl_cuda_malloc((void **)&ent, T * 4));
    BENCH_CHECK(ctrl_cuda_malloc((void **)&lse, T * 4));
    BENCH_CHECK(ctrl_cuda_malloc((void **)&dh, (size_t)T * C * 4));
    BENCH_CHECK(ctrl_cuda_malloc((void **)&dw, (size_t)V * C * 4));
    BENCH_CHECK(ctrl_cuda_memset(dw, 0, (size_t)V * C * 4));
    void *ws;
    BENCH_CHECK(ctrl_cuda_malloc(&ws, ctrl_cuda_head_workspace_bytes(&a)));
    double times[10];
    for (int r = -2; r < 10; r++) {
        BENCH_CHECK(ctrl_cuda_synchronize());
        double t0 = bench_now();
        BENCH_CHECK(ctrl_cuda_head_forward(&a, logp, ent, lse, NULL, ws));
        BENCH_CHECK(ctrl_cuda_head_backward(&a, lse, dl, NULL, NULL, dh, dw, ws));
        BENCH_CHECK(ctrl_cuda_synchronize());
        if (r >= 0) times[r] = bench_now() - t0;
    }
    const double median = bench_median(times, 10);
    ctrl_cuda_mem_stats s1;
    ctrl_cuda_mem_stats_get(&s1);
    double ms = median * 1e3;
    /* fwd: one GEMM; bwd: the recomputed GEMM and two gradient GEMMs */
    double tflop = 4.0 * 2.0 * T * (double)C * V / 1e12;
    printf("ctrl   head fp32 T=%d C=%d V=%d: fwd+bwd %.1f ms (%.1f TFLOP/s), peak %.2f GiB (workspace %.0f "
           "MiB)\n",
           T, C, V, ms, tflop / median, (s1.peak - s0.current) / 1073741824.0,
           ctrl_cuda_head_workspace_bytes(&a) / 1048576.0);
    return 0;
}
