/* AVX2 decoding's bf16 product (kernels/cpu/gemm_bf16_avx2.c) against a scalar loop of the sums it
 * promises, bit for bit: each C element is fmaf over k in order of the bf16 values of A and W (the
 * bf16 rounding of kernels/cpu/bf16.c), on shapes off every edge (K odd, K past 16-value blocks, N
 * off the 16-column panels, M off the 4-row / 4-panel tiles, leading dimensions wider than the
 * rows), the many-row (prefill) tile's too (M off its 6-row tiles and its chunks of rows, K across its
 * 256-value blocks), each also with the narrow tiles forced (CTRL_NO_AVX2_WIDE=1), at one thread
 * and two (the same bits); the panels unpack to the rounded values (NaN, Inf,
 * ties, denormals, -0 included) and a repack after W changed equals a fresh pack. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu/cpu_ops.h"
#include "cpu/gemm_bf16_avx2.h"
#include "random_floats.h"
#include "test.h"

/* C[M, N] (row stride ldc) as the kernel promises it: A and W rounded to bf16 values first (as the
 * kernel reads them), then per element fmaf over k in order (a zero pair past an odd K) */
static void reference(int M, int N, int K, const float *A, int lda, const float *W, int ldw, float *C,
                      int ldc) {
    float *a = calloc((size_t)M * (K + 1), sizeof(float)), *w = calloc((size_t)N * (K + 1), sizeof(float));
    for (int i = 0; i < M; i++) ctrl_cpu_round_to_bf16(a + (size_t)i * (K + 1), A + (size_t)i * lda, K);
    for (int n = 0; n < N; n++) ctrl_cpu_round_to_bf16(w + (size_t)n * (K + 1), W + (size_t)n * ldw, K);
    for (int i = 0; i < M; i++)
        for (int n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int k = 0; k < K + K % 2; k++)
                acc = fmaf(a[(size_t)i * (K + 1) + k], w[(size_t)n * (K + 1) + k], acc);
            C[(size_t)i * ldc + n] = acc;
        }
    free(a), free(w);
}

static int check(int M, int N, int K, int pad, unsigned *seed) {
    const int lda = K + pad, ldw = K + pad, ldc = N + pad;
    float *A = rnd((size_t)M * lda, seed), *W = rnd((size_t)N * ldw, seed);
    /* A's rounding (8 values at a time, then a scalar tail): ties to even, values just off a tie,
     * denormals and -0, the largest finite (rounds to Inf) */
    const uint32_t specials[] = {0x3F808000u, 0x3F818000u, 0x3F80FFFFu, 0x3F807FFFu, 0x00000001u,
                                 0x807FFFFFu, 0x80000000u, 0x477FFFFFu, 0x7F7FFFFFu};
    for (size_t i = 0; i < sizeof specials / sizeof *specials && (size_t)M * lda > 1; i++)
        memcpy(&A[(i * 31 + 5) % ((size_t)M * lda)], &specials[i], 4);
    float *C = malloc(sizeof(float) * (size_t)M * ldc), *R = malloc(sizeof(float) * (size_t)M * ldc);
    for (size_t i = 0; i < (size_t)M * ldc; i++) C[i] = R[i] = -7.0f; /* past N: untouched */
    ctrl_cpu_bf16_avx2_panels *p = ctrl_cpu_bf16_avx2_pack(N, K, W, ldw);
    CHECK(p != NULL);
    int ok = 0;
    reference(M, N, K, A, lda, W, ldw, R, ldc);
    /* the kernel's own choice of tile (the widened one past 64 rows), then the narrow tiles forced */
    for (int narrow = 0; narrow < 2; narrow++) {
        if (narrow) setenv("CTRL_NO_AVX2_WIDE", "1", 1);
        ok = p && ctrl_cpu_bf16_avx2_linear(M, A, lda, p, C, ldc) == 0 &&
             !memcmp(C, R, sizeof(float) * (size_t)M * ldc);
        unsetenv("CTRL_NO_AVX2_WIDE");
        CHECK_MSG(ok, "M %d N %d K %d pad %d%s: the product differs from the ordered fmaf sums", M, N, K, pad,
                  narrow ? " (narrow tiles)" : "");
        if (!ok) break;
    }
    ctrl_cpu_bf16_avx2_free(p);
    free(A), free(W), free(C), free(R);
    return ok;
}

TEST(avx2_bf16_product_is_the_ordered_sum_bit_for_bit) {
    if (!ctrl_cpu_bf16_avx2_available()) TEST_SKIP("no AVX2 + FMA here");
    unsigned seed = 11;
    const int Ms[] = {1, 2, 3, 4, 5, 7, 8, 13, 64}, Ns[] = {1, 15, 16, 17, 40, 67, 129},
              Ks[] = {1, 2, 15, 16, 17, 31, 33, 100};
    int bad = 0;
    for (int a = 0; a < 9; a++)
        for (int b = 0; b < 7; b++)
            for (int c = 0; c < 8 && bad < 3; c++)
                bad += !check(Ms[a], Ns[b], Ks[c], (a + b + c) % 3 ? 0 : 5, &seed);
}

/* A prefill's row counts: the widened tile's 6-row blocks, its KC = 256 blocks of k (the sums carried
 * through C between them), its chunks of rows, an edge panel's masked columns */
TEST(avx2_bf16_many_rows_are_the_ordered_sum_bit_for_bit) {
    if (!ctrl_cpu_bf16_avx2_available()) TEST_SKIP("no AVX2 + FMA here");
    unsigned seed = 17;
    const int Ms[] = {65, 66, 71, 100, 255, 256, 257, 400}, Ns[] = {1, 17, 129},
              Ks[] = {1, 255, 256, 257, 513};
    int bad = 0;
    for (int a = 0; a < 8; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 5 && bad < 3; c++)
                bad += !check(Ms[a], Ns[b], Ks[c], (a + b + c) % 3 ? 0 : 3, &seed);
    if (!bad) check(600, 17, 1201, 1, &seed); /* three chunks of rows, the last one short */
}

TEST(avx2_bf16_product_same_bits_at_any_thread_count) {
    if (!ctrl_cpu_bf16_avx2_available()) TEST_SKIP("no AVX2 + FMA here");
    unsigned seed = 5;
    enum { N = 1003, K = 301 };
    float *W = rnd((size_t)N * K, &seed);
    ctrl_cpu_bf16_avx2_panels *p = ctrl_cpu_bf16_avx2_pack(N, K, W, K);
    CHECK(p != NULL);
    const int Ms[] = {1, 5, 9, 40, 200};  /* narrow tiles, then the widened tile */
    for (int mi = 0; p && mi < 5; mi++) { /* past the one-thread threshold: parallel over panels */
        const int M = Ms[mi];
        float *A = rnd((size_t)M * K, &seed), *C1 = malloc(sizeof(float) * M * N),
              *C2 = malloc(sizeof(float) * M * N), *R = malloc(sizeof(float) * M * N);
#ifdef _OPENMP
        const int before = omp_get_max_threads();
        omp_set_num_threads(1);
#endif
        CHECK_EQ_INT(ctrl_cpu_bf16_avx2_linear(M, A, K, p, C1, N), 0);
#ifdef _OPENMP
        omp_set_num_threads(2);
#endif
        CHECK_EQ_INT(ctrl_cpu_bf16_avx2_linear(M, A, K, p, C2, N), 0);
#ifdef _OPENMP
        omp_set_num_threads(before);
#endif
        reference(M, N, K, A, K, W, K, R, N);
        CHECK(!memcmp(C1, C2, sizeof(float) * M * N));
        CHECK(!memcmp(C1, R, sizeof(float) * M * N));
        free(A), free(C1), free(C2), free(R);
    }
    ctrl_cpu_bf16_avx2_free(p);
    free(W);
}

TEST(avx2_bf16_panels_hold_the_rounded_values) {
    if (!ctrl_cpu_bf16_avx2_available()) TEST_SKIP("no AVX2 + FMA here");
    enum { N = 21, K = 37 };
    unsigned seed = 3;
    float *W = rnd((size_t)N * K, &seed), *U = malloc(sizeof(float) * N * K),
          *F = malloc(sizeof(float) * N * K);
    const uint32_t specials[] = {0x7FC00000u, 0x7F800001u, 0xFF812345u, 0x7F800000u, 0xFF800000u,
                                 0x80000000u, 0x00000001u, 0x807FFFFFu, 0x3F808000u, 0x3F818000u,
                                 0x3F80FFFFu, 0x7F7FFFFFu, 0x477FFFFFu, 0x3F807FFFu};
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) /* in the vector part and the tail */
        memcpy(&W[(i * 53) % ((size_t)N * K)], &specials[i], 4);
    ctrl_cpu_bf16_avx2_panels *p = ctrl_cpu_bf16_avx2_pack(N, K, W, K);
    CHECK(p != NULL);
    if (p) {
        int n = 0, k = 0;
        CHECK_EQ_INT(ctrl_cpu_bf16_avx2_shape(p, &n, &k), 0);
        CHECK(n == N && k == K);
        CHECK(ctrl_cpu_bf16_avx2_bytes(p) >= sizeof(uint16_t) * 32 * K);
        CHECK_EQ_INT(ctrl_cpu_bf16_avx2_unpack(p, U, K), 0);
        ctrl_cpu_round_to_bf16(F, W, (int64_t)N * K);
        CHECK(!memcmp(U, F, sizeof(float) * N * K));
        /* W changed, repacked in place: a fresh pack's values */
        for (int i = 0; i < N * K; i++) W[i] = W[i] * -0.5f + 0.25f;
        CHECK_EQ_INT(ctrl_cpu_bf16_avx2_repack(p, W, K), 0);
        CHECK_EQ_INT(ctrl_cpu_bf16_avx2_unpack(p, U, K), 0);
        ctrl_cpu_round_to_bf16(F, W, (int64_t)N * K);
        CHECK(!memcmp(U, F, sizeof(float) * N * K));
    }
    ctrl_cpu_bf16_avx2_free(p);
    free(W), free(U), free(F);
}
