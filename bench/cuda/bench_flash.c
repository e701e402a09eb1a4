/* The flash plugin's CUDA paths: forward and forward+backward TFLOP/s, causal, bf16, one sequence
 * of 1k / 4k / 16k tokens, 16 query heads (GQA 4:1), head_dim 64 and 128, median of 5 after 2
 * warm-up runs, for each path named on the command line (default: mma and gemm; each is forced
 * through CTRL_FLASH_PATH: mma = the fused tensor-core kernels, gemm = cuBLASLt products with row
 * kernels, tiled = the SIMT kernels). FLOPs as FlashAttention counts them: causal forward
 * 2 * 2 * T^2/2 * H * D, backward 2.5 x forward. Compare with bench/cuda/torch_flash.py (SDPA).
 * CTRL_BENCH_FLASH_SHAPE=T:D times that one shape only (e.g. 16384:128, for a profiler).
 * usage: bench_cuda_flash [PLUGIN_DIR [PATH...]] */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/attention.h>

#include "bench_common.h"
#include "device/cuda_backend.h"
#include "flash_args.h" /* tests/cuda: the arguments as the test builds them */
#include "registry/registry.h"

static double time_it(const ctrl_attention_ops *ops, const ctrl_attention_args *a, int backward) {
    double t[5];
    for (int r = -2; r < 5; r++) {
        ctrl_cuda_synchronize();
        const double t0 = bench_now();
        BENCH_CHECK(ops->forward(a, NULL));
        if (backward) BENCH_CHECK(ops->backward(a, NULL));
        BENCH_CHECK(ctrl_cuda_synchronize());
        if (r >= 0) t[r] = bench_now() - t0;
    }
    return bench_median(t, 5);
}

int main(int argc, char **argv) {
    const char *plugin_dir = argc > 1 ? argv[1] : "build-gpu/plugins";
    char so[1024];
    snprintf(so, sizeof so, "%s/flash.so", plugin_dir);
    ctrl_device dev; /* selected as a run selects it: the host lends the plugin the device GEMM */
    const ctrl_cuda_backend *backend;
    BENCH_CHECK(ctrl_device_select("cuda", &dev, &backend));
    ctrl_registry *reg;
    BENCH_CHECK(ctrl_registry_create(&reg));
    BENCH_CHECK(ctrl_registry_load_file(reg, so));
    const ctrl_attention_ops *ops = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash")->plugin->ops;
    static const char *default_paths[] = {"mma", "gemm"};
    const char *const *paths = argc > 2 ? (const char *const *)argv + 2 : default_paths;
    const int n_paths = argc > 2 ? argc - 2 : 2;
    printf("flash (ctrl, CUDA, bf16, causal): TFLOP/s\n%-6s %-8s %-5s %-6s %10s %12s\n", "path", "seq", "D",
           "heads", "forward", "fwd+bwd");
    static const int seqs[] = {1024, 4096, 16384}, dims[] = {64, 128};
    const char *only = getenv("CTRL_BENCH_FLASH_SHAPE");
    int only_t = 0, only_d = 0;
    if (only && sscanf(only, "%d:%d", &only_t, &only_d) != 2) {
        fprintf(stderr, "bench: CTRL_BENCH_FLASH_SHAPE=%s is not T:D (e.g. 16384:128)\n", only);
        return 1;
    }
    for (int pi = 0; pi < n_paths; pi++)
        for (int si = 0; si < 3; si++)
            for (int di = 0; di < 2; di++) {
                const int T = seqs[si], D = dims[di], H = 16, HK = 4;
                if (only && (only_t != T || only_d != D)) continue;
                const size_t nq = (size_t)T * H * D, nk = (size_t)T * HK * D;
                const int32_t cu[2] = {0, T};
                float *fq = bench_dev_random(nq, 2), *fk = bench_dev_random(nk, 2),
                      *fv = bench_dev_random(nk, 2);
                float *fdo = bench_dev_random(nq, 2);
                flash_bufs b;
                BENCH_CHECK(flash_bufs_alloc(&b, cu, 1, H, HK, D, CTRL_BF16));
                ctrl_cuda_f32_to_bf16(b.q, fq, (int64_t)nq), ctrl_cuda_f32_to_bf16(b.k, fk, (int64_t)nk);
                ctrl_cuda_f32_to_bf16(b.v, fv, (int64_t)nk), ctrl_cuda_f32_to_bf16(b.dout, fdo, (int64_t)nq);
                const ctrl_attention_args a = flash_args(&b, cu, 1, H, HK, D, CTRL_BF16, 0);
                const double flops = 2.0 * 2.0 * (double)T * T / 2 * H * D;
                setenv("CTRL_FLASH_PATH", paths[pi], 1);
                const double tf = time_it(ops, &a, 0), tb = time_it(ops, &a, 1);
                printf("%-6s %-8d %-5d %d/%-4d %10.1f %12.1f\n", paths[pi], T, D, H, HK, flops / tf * 1e-12,
                       3.5 * flops / tb * 1e-12);
                fflush(stdout);
                ctrl_cuda_free(fq), ctrl_cuda_free(fk), ctrl_cuda_free(fv), ctrl_cuda_free(fdo);
                flash_bufs_free(&b);
            }
    ctrl_registry_destroy(reg);
    return 0;
}
