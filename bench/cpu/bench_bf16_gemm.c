#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "cpu/cpu_ops.h"
/* bf16 GEMM (ctrl_cpu_gemm_bf16_nt) against OpenBLAS sgemm on the same shape, 2 rounds of 5 calls.
 * usage: bench_bf16_gemm (OMP_NUM_THREADS sets the threads) */
static double now() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
int main() {
    int M = 2048, N = 1024, K = 256;
    float *A = malloc(4L * M * K), *B = malloc(4L * K * N), *C = malloc(4L * M * N);
    uint16_t *a = malloc(2L * M * K), *b = malloc(2L * K * N);
    for (long i = 0; i < (long)M * K; i++) A[i] = rand() / (float)RAND_MAX;
    for (long i = 0; i < (long)K * N; i++) B[i] = rand() / (float)RAND_MAX;
    ctrl_cpu_f32_to_bf16(a, A, (long)M * K);
    ctrl_cpu_f32_to_bf16(b, B, (long)K * N);
    for (int r = 0; r < 2; r++) {
        double t = now();
        for (int i = 0; i < 5; i++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, A, K, B, K, 0, C, N);
        double ts = now() - t;
        t = now();
        for (int i = 0; i < 5; i++) ctrl_cpu_gemm_bf16_nt(C, a, b, M, N, K, 0);
        double tb = now() - t;
        printf("sgemm %.1f GFLOP/s, bf16 %.1f GFLOP/s\n", 2.0 * M * N * K * 5 / ts / 1e9,
               2.0 * M * N * K * 5 / tb / 1e9);
    }
}
