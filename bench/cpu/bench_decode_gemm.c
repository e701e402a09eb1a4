/* A decoding step's linear products at Qwen2.5-0.5B's shapes (24 layers of q, k, v, o, gate, up,
 * down, then the 151,669 x 896 head), M rows (sequences) each, on the CPU's bf16 paths:
 *   fp32        ctrl_cpu_linear_forward on the fp32 weights (what --dtype fp32 runs)
 *   bf16-copy   ctrl_cpu_linear_forward_bf16 on a rounded fp32 copy of the weights (the fallback for
 *               calls of fewer than 64 rows where no bf16 GEMM runs)
 *   bf16-round  the same rounding the weights in every call (the fallback's calls of 64+ rows)
 *   bf16-avx2   gemm_bf16_avx2.c's panels (decoding on an AVX2-only CPU now: the narrow tiles below
 *               16 rows, the widened 6 x 16 tile from 16 rows)
 *   avx2-narrow the same panels, the narrow tiles at any M (CTRL_NO_AVX2_WIDE=1)
 *   bf16-fast   ctrl_cpu_gemm_bf16_pack'd panels (AVX-512 BF16 / AMX; skipped where absent)
 *   nf4         QLoRA's base: the layers' weights in NF4 (ctrl_cpu_nf4_linear_forward in bf16, each
 *               weight's panels decoded from the nibbles in every call), the head's bf16-fast panels
 * Prints milliseconds (wall) and CPU milliseconds (user + system, all threads) for one step's
 * products, the median of `reps` steps after one warm-up.
 * usage: bench_decode_gemm [--paths NAME,...] [M ...]  (default: every path; M 1 8 64;
 *        OMP_NUM_THREADS / OPENBLAS_NUM_THREADS set the threads)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cpu/cpu_ops.h"
#include "cpu/gemm_bf16_avx2.h"
#include "model/nf4.h"

enum { LAYERS = 24, NPROJ = 8, REPS = 5 };
static const int shapes[NPROJ][2] = {{896, 896},  {128, 896},  {128, 896},  {896, 896},
                                     {4864, 896}, {4864, 896}, {896, 4864}, {151669, 896}}; /* N, K */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double cpu_now(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int Ms[8] = {1, 8, 64}, nM = 3, first = 1;
    const char *paths = NULL;
    if (argc > 2 && !strcmp(argv[1], "--paths")) paths = argv[2], first = 3;
    if (argc > first) {
        nM = 0;
        for (int i = first; i < argc && nM < 8; i++) Ms[nM++] = atoi(argv[i]);
    }
    /* one weight per projection kind (reading the same 24 times would stay in cache for the small
     * ones): the layers' weights are distinct buffers, as in the model */
    float *w[LAYERS][NPROJ], *wr[LAYERS][NPROJ];
    ctrl_cpu_bf16_avx2_panels *pa[LAYERS][NPROJ];
    ctrl_cpu_bf16_packed *pf[LAYERS][NPROJ];
    static ctrl_nf4 q[LAYERS][NPROJ];
    static ctrl_nf4_ref qr[LAYERS][NPROJ];
    unsigned s = 1;
    for (int l = 0; l < LAYERS; l++)
        for (int j = 0; j < NPROJ; j++) {
            if (j == NPROJ - 1 && l > 0) { /* one head */
                w[l][j] = wr[l][j] = NULL, pa[l][j] = NULL, pf[l][j] = NULL;
                continue;
            }
            const size_t n = (size_t)shapes[j][0] * shapes[j][1];
            w[l][j] = malloc(sizeof(float) * n), wr[l][j] = malloc(sizeof(float) * n);
            for (size_t i = 0; i < n; i++)
                w[l][j][i] = (float)((s = s * 1103515245u + 12345u) >> 8 & 0xFFFF) / 65536.0f - 0.5f;
            ctrl_cpu_round_to_bf16(wr[l][j], w[l][j], (int64_t)n);
            pa[l][j] = ctrl_cpu_bf16_avx2_pack(shapes[j][0], shapes[j][1], w[l][j], shapes[j][1]);
            pf[l][j] = ctrl_cpu_gemm_bf16_pack(1, shapes[j][0], shapes[j][1], w[l][j], shapes[j][1]);
            if (j < NPROJ - 1 && (!paths || strstr(paths, "nf4"))) {
                if (ctrl_nf4_quantize(w[l][j], (int64_t)n, &q[l][j]) != CTRL_OK) return 1;
                qr[l][j] =
                    (ctrl_nf4_ref){q[l][j].packed, q[l][j].qabsmax,       q[l][j].absmax2, q[l][j].offset,
                                   ctrl_nf4_code,  ctrl_nf4_dynamic_code, (int64_t)n,      0};
            }
        }
    const char *names[7] = {"fp32",      "bf16-copy",   "bf16-round", "bf16-avx2",
                            "bf16-fast", "avx2-narrow", "nf4"};
    printf("%-11s%5s%12s%12s\n", "path", "M", "step ms", "CPU ms");
    for (int mi = 0; mi < nM; mi++) {
        const int M = Ms[mi];
        float *x = malloc(sizeof(float) * (size_t)M * 4864),
              *out = malloc(sizeof(float) * (size_t)M * 151669);
        for (size_t i = 0; i < (size_t)M * 4864; i++) x[i] = (float)(i % 97) / 97.0f - 0.5f;
        for (int v = 0; v < 7; v++) {
            if (((v == 3 || v == 5) && !pa[0][0]) || ((v == 4 || v == 6) && !pf[0][0])) continue;
            if (v == 6 && !q[0][0].packed) continue;
            if (paths && !strstr(paths, names[v])) continue;
            if (v == 5) setenv("CTRL_NO_AVX2_WIDE", "1", 1);
            double wall[REPS + 1], cpu[REPS + 1];
            for (int r = 0; r <= REPS; r++) {
                const double t0 = now(), c0 = cpu_now();
                for (int l = 0; l < LAYERS; l++)
                    for (int j = 0; j < NPROJ; j++) {
                        if (!w[l][j]) continue;
                        const int N = shapes[j][0], K = shapes[j][1];
                        if (v == 0) ctrl_cpu_linear_forward(out, x, w[l][j], NULL, M, K, N);
                        if (v == 1) ctrl_cpu_linear_forward_bf16(out, x, wr[l][j], NULL, M, K, N, 1);
                        if (v == 2) ctrl_cpu_linear_forward_bf16(out, x, w[l][j], NULL, M, K, N, 0);
                        if (v == 3 || v == 5) ctrl_cpu_bf16_avx2_linear(M, x, K, pa[l][j], out, N);
                        if (v == 4 || (v == 6 && j == NPROJ - 1))
                            ctrl_cpu_gemm_bf16_packed(0, M, x, K, pf[l][j], out, N, 0);
                        else if (v == 6)
                            ctrl_cpu_nf4_linear_forward(out, x, &qr[l][j], NULL, M, K, N, 1);
                    }
                wall[r] = now() - t0, cpu[r] = cpu_now() - c0;
            }
            qsort(wall + 1, REPS, sizeof(double), cmp), qsort(cpu + 1, REPS, sizeof(double), cmp);
            printf("%-11s%5d%12.1f%12.1f\n", names[v], M, 1e3 * wall[1 + REPS / 2], 1e3 * cpu[1 + REPS / 2]);
            unsetenv("CTRL_NO_AVX2_WIDE");
            fflush(stdout);
        }
        free(x), free(out);
    }
    return 0;
}
