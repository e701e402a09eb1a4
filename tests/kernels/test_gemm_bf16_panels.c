/* The bf16 GEMM on pre-packed panels (kernels/cpu/gemm_bf16.c, ctrl_cpu_gemm_bf16_pack and the
 * products on its panels), against the unpacked GEMM, ctrl_cpu_gemm_bf16, bit for bit: the forward
 * x W^T (_packed) and the backward's dX = dY W read from the forward's panels transposed
 * (_packed_t; where ctrl_cpu_gemm_bf16 takes its 1-4 row path, x W^T with W [N,K], its sums run
 * in another order: within 1e-5), for B packed from [N,K] and [K,N] storage, on shapes past every block edge
 * (K odd, K past the 1024-deep blocks, N and K past the 8160 / 8192 column blocks, M past the 192 / 256
 * row blocks, N and K off the 16-value groups and the 48 / 32-column panels); panels packed under one kernel
 * multiplied under the other (the AMX kernel emulated, CTRL_AMX_EMULATE, against AVX-512 BF16: another panel
 * width, depth block and padding); _unpack gives back the rounded values. ctest runs it as is, on the
 * emulated AMX kernel and with CTRL_NO_AVX512BF16=1, where no panels can be made and the products refuse. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "random_floats.h"
#include "test.h"

/* a and b equal bit for bit, or (few: ctrl_cpu_gemm_bf16 took its 1-4 row path, whose sums run in
 * another order) within 1e-5 */
static int same(const float *a, const float *b, size_t n, int few) {
    return few ? test_rel_error_f32(a, b, (long)n) <= 1e-5 : !memcmp(a, b, sizeof(float) * n);
}

/* p packed from B (trans_b: stored [N,K], else [K,N]); forward C[M,N] = A[M,K] op(B) and transposed
 * C[M,K] = A'[M,N] op(B)^T against ctrl_cpu_gemm_bf16 on the same B, accumulate off and on. */
static int check(int M, int N, int K, int trans_b, const ctrl_cpu_bf16_packed *p, const float *B,
                 unsigned *seed, const char *what) {
    const int ldb = trans_b ? K : N;
    float *A = rnd((size_t)M * K, seed), *At = rnd((size_t)M * N, seed);
    float *c1 = rnd((size_t)M * N, seed), *c2 = malloc(sizeof(float) * (size_t)M * N);
    float *d1 = rnd((size_t)M * K, seed), *d2 = malloc(sizeof(float) * (size_t)M * K);
    for (int acc = 0; acc < 2; acc++) {
        memcpy(c2, c1, sizeof(float) * (size_t)M * N), memcpy(d2, d1, sizeof(float) * (size_t)M * K);
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed(0, M, A, K, p, c1, N, acc), 0);
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16(0, trans_b, M, N, K, A, K, B, ldb, c2, N, acc), 0);
        CHECK_MSG(same(c1, c2, (size_t)M * N, M <= 4 && trans_b), "%s %dx%dx%d tb %d acc %d: forward differs",
                  what, M, N, K, trans_b, acc);
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed_t(0, M, At, N, p, d1, K, acc), 0);
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16(0, !trans_b, M, K, N, At, N, B, ldb, d2, K, acc), 0);
        CHECK_MSG(same(d1, d2, (size_t)M * K, M <= 4 && !trans_b),
                  "%s %dx%dx%d tb %d acc %d: transposed differs (rel %.3g)", what, M, N, K, trans_b, acc,
                  test_rel_error_f32(d1, d2, (long)M * K));
    }
    free(A), free(At), free(c1), free(c2), free(d1), free(d2);
    return !test_current_failed;
}

static int amx_emulate(int on) {
    if (on) return setenv("CTRL_AMX_EMULATE", "1", 1);
    return unsetenv("CTRL_AMX_EMULATE");
}

TEST(panels_forward_and_transposed_match_the_unpacked_gemm) {
    const int fast = ctrl_cpu_bf16_kind_now() != CTRL_CPU_BF16_FP32;
    static const int shapes[][3] = {{7, 65, 33},   {13, 130, 257}, {200, 70, 515},  {37, 17, 1},
                                    {5, 50, 2},    {9, 160, 401},  {300, 33, 1030}, {3, 8200, 40},
                                    {6, 24, 8230}, {260, 96, 64}};
    unsigned seed = 11;
    int n_ok = 0, n = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tb = 0; tb < 2; tb++) {
            const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            float *B = rnd((size_t)N * K, &seed);
            ctrl_cpu_bf16_packed *p = ctrl_cpu_gemm_bf16_pack(tb, N, K, B, tb ? K : N);
            if (!fast) { /* the fp32 path: nothing to pack, products refused, C untouched */
                CHECK(p == NULL && ctrl_cpu_gemm_bf16_pack_bytes(N, K) == 0);
                float c = 7;
                CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed_t(0, 1, B, N, NULL, &c, 1, 0), -1);
                CHECK(c == 7);
                free(B);
                continue;
            }
            CHECK(p != NULL && ctrl_cpu_gemm_bf16_packed_bytes(p) == ctrl_cpu_gemm_bf16_pack_bytes(N, K));
            n++, n_ok += p && check(M, N, K, tb, p, B, &seed, "same kernel");
            /* the values back: B rounded, in B's storage */
            float *u = calloc((size_t)N * K, sizeof(float)), *r = malloc(sizeof(float) * (size_t)N * K);
            ctrl_cpu_round_to_bf16(r, B, (int64_t)N * K);
            CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed_unpack(p, u, tb ? K : N), 0);
            CHECK_MSG(!memcmp(u, r, sizeof(float) * (size_t)N * K), "%dx%d tb %d: unpacked values differ", N,
                      K, tb);
            free(u), free(r);
            ctrl_cpu_gemm_bf16_packed_free(p);
            free(B);
        }
    if (fast) printf("  %d of %d products bit for bit (%s)\n", n_ok, n, ctrl_cpu_bf16_path(&(int){0}));
}

/* Panels packed under AVX-512 BF16 read by the emulated AMX kernel and the other way round: the
 * products equal the reading kernel's own unpacked GEMM bit for bit. */
TEST(panels_of_another_kernel_layout) {
    if (getenv("CTRL_AMX_EMULATE") || getenv("CTRL_NO_AVX512BF16") ||
        ctrl_cpu_bf16_kind_now() != CTRL_CPU_BF16_AVX512) {
        printf("  not run here: needs AVX-512 BF16 (the emulated AMX kernel runs on it) and no switch set\n");
        return;
    }
    static const int shapes[][3] = {{7, 65, 33}, {40, 100, 530}, {33, 8200, 20}, {5, 30, 8250}};
    unsigned seed = 5;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int way = 0; way < 2; way++) {
            const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            float *B = rnd((size_t)N * K, &seed);
            amx_emulate(way == 0); /* packed under one kernel ... */
            ctrl_cpu_bf16_packed *p = ctrl_cpu_gemm_bf16_pack(1, N, K, B, K);
            amx_emulate(way == 1); /* ... read by the other */
            CHECK(p != NULL);
            if (p) check(M, N, K, 1, p, B, &seed, way ? "avx512 panels on amx" : "amx panels on avx512");
            amx_emulate(0);
            ctrl_cpu_gemm_bf16_packed_free(p);
            free(B);
        }
}

/* Panels of W [N, K] read in parts (the LM head's chunks of the vocabulary on panels that are W's only
 * copy): each whole column block's product equals the whole product's columns bit for bit, its
 * transposed product (dX over that chunk of W's rows) the unpacked GEMM on those rows alone; ranges
 * that do not start at a block, or end inside one short of N, are refused; rows come back as W's
 * rounded rows. */
TEST(panels_read_by_column_blocks_and_rows) {
    if (ctrl_cpu_bf16_kind_now() == CTRL_CPU_BF16_FP32) {
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed_block(NULL), 0);
        printf("  not run here: no bf16 kernel (no panels)\n");
        return;
    }
    static const int shapes[][2] = {{16420, 40}, {8197, 1030}, {100, 33}};
    unsigned seed = 17;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int N = shapes[s][0], K = shapes[s][1], M = 7;
        float *W = rnd((size_t)N * K, &seed), *A = rnd((size_t)M * K, &seed);
        ctrl_cpu_bf16_packed *p = ctrl_cpu_gemm_bf16_pack(1, N, K, W, K);
        const int block = ctrl_cpu_gemm_bf16_packed_block(p);
        CHECK(p != NULL && block > 0);
        if (!p || block <= 0) return;
        float *full = malloc(sizeof(float) * (size_t)M * N), *part = malloc(sizeof(float) * (size_t)M * N);
        float *d1 = malloc(sizeof(float) * (size_t)M * K), *d2 = malloc(sizeof(float) * (size_t)M * K);
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed(0, M, A, K, p, full, N, 0), 0);
        int chunks = 0;
        for (int n0 = 0; n0 < N; n0 += block, chunks++) {
            const int n = N - n0 < block ? N - n0 : block;
            CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed_cols(0, M, A, K, p, n0, n, part + n0, N, 0), 0);
            float *dy = rnd((size_t)M * n, &seed);
            CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed_cols(1, M, dy, n, p, n0, n, d1, K, 0), 0);
            CHECK_EQ_INT(ctrl_cpu_gemm_bf16(0, 0, M, K, n, dy, n, W + (size_t)n0 * K, K, d2, K, 0), 0);
            CHECK_MSG(!memcmp(d1, d2, sizeof(float) * (size_t)M * K),
                      "%dx%d rows [%d, %d): transposed differs (rel %.3g)", N, K, n0, n0 + n,
                      test_rel_error_f32(d1, d2, (long)M * K));
            free(dy);
        }
        CHECK_MSG(!memcmp(full, part, sizeof(float) * (size_t)M * N), "%dx%d: the blocks' columns differ", N,
                  K);
        CHECK(chunks == (N + block - 1) / block);
        float c = 7;
        if (N > block) {
            CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed_cols(0, 1, A, K, p, 16, block, &c, block, 0), -1);
            CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed_cols(0, 1, A, K, p, 0, block + 16, &c, block + 16, 0), -1);
        }
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed_cols(0, 1, A, K, p, 0, N + 1, &c, N + 1, 0), -1);
        CHECK(c == 7);
        const int32_t rows[4] = {0, N - 1, N / 2, 3 % N};
        float *got = malloc(sizeof(float) * 4 * (size_t)K), *want = malloc(sizeof(float) * 4 * (size_t)K);
        for (int i = 0; i < 4; i++) ctrl_cpu_round_to_bf16(want + (size_t)i * K, W + (size_t)rows[i] * K, K);
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed_rows(p, rows, 4, got, K), 0);
        CHECK_MSG(!memcmp(got, want, sizeof(float) * 4 * (size_t)K), "%dx%d: rows differ", N, K);
        const int32_t bad = N;
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed_rows(p, &bad, 1, got, K), -1);
        ctrl_cpu_bf16_packed *pt = ctrl_cpu_gemm_bf16_pack(0, K, N, W, K); /* op(B) = W itself: not a W^T */
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed_block(pt), 0);
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed_rows(pt, rows, 1, got, K), -1);
        ctrl_cpu_gemm_bf16_packed_free(pt);
        printf("  %dx%d: %d column blocks of %d\n", N, K, chunks, block);
        free(got), free(want), free(full), free(part), free(d1), free(d2), free(W), free(A);
        ctrl_cpu_gemm_bf16_packed_free(p);
    }
}
