/* Operands shared by several bf16 products (kernels/cpu/gemm_bf16.c, ctrl_cpu_gemm_bf16_share): an A
 * packed once and read by products against different B's -- per call fp32 ([N,K] and [K,N]),
 * pre-packed panels (_packed), the same panels read transposed (_packed_t) -- and a B packed once
 * and read by products of different A's (the weight gradients dY^T x of q, k, v), each equal bit for
 * bit to the same product with the slot empty (every operand packed per call), accumulate off and on,
 * on shapes past the depth, row and column blocks and the panel edges; the slot packed once and read
 * by the rest (_share_stats); an A packed under one kernel's layout not read by a kernel of another
 * (the emulated AMX kernel against AVX-512 BF16): that product packs per call, still bit for bit. ctest
 * runs it as is, on the emulated AMX kernel, on it with small blocks (many blocks of each kind) and
 * with CTRL_NO_AVX512BF16=1 (the products refuse; nothing is packed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "random_floats.h"
#include "test.h"

/* The products reading A [M,K] (row-major, lda = K): C1 = A B1^T (B1 [N1,K]), C2 = A B2 (B2 [K,N2]),
 * C3 = A P^T on panels P of [N3,K], C4 = A' op(P)^T with A' = the first N3 columns... of another
 * shape: not A, so it stays per call. Run with A in slot 0 (shared) and with the slot empty. */
typedef struct prods {
    float *c1, *c2, *c3;
} prods;

static prods run_a(int M, int K, int N1, int N2, int N3, const float *A, const float *B1, const float *B2,
                   const ctrl_cpu_bf16_packed *P, const float *init, int acc, int shared) {
    prods r = {malloc(sizeof(float) * (size_t)M * N1), malloc(sizeof(float) * (size_t)M * N2),
               malloc(sizeof(float) * (size_t)M * N3)};
    memcpy(r.c1, init, sizeof(float) * (size_t)M * N1), memcpy(r.c2, init, sizeof(float) * (size_t)M * N2);
    memcpy(r.c3, init, sizeof(float) * (size_t)M * N3);
    CHECK_EQ_INT(ctrl_cpu_gemm_bf16_share(0, 0, 0, M, K, shared ? A : NULL, K), 0);
    CHECK_EQ_INT(ctrl_cpu_gemm_bf16(0, 1, M, N1, K, A, K, B1, K, r.c1, N1, acc), 0);
    CHECK_EQ_INT(ctrl_cpu_gemm_bf16(0, 0, M, N2, K, A, K, B2, N2, r.c2, N2, acc), 0);
    CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed(0, M, A, K, P, r.c3, N3, acc), 0);
    CHECK_EQ_INT(ctrl_cpu_gemm_bf16_share(0, 0, 0, 0, 0, NULL, 0), 0);
    return r;
}

static void free_prods(prods *p) { free(p->c1), free(p->c2), free(p->c3); }

static void check_shared_a(int M, int K, int N1, int N2, int N3, unsigned *seed) {
    float *A = rnd((size_t)M * K, seed), *B1 = rnd((size_t)N1 * K, seed), *B2 = rnd((size_t)K * N2, seed);
    float *B3 = rnd((size_t)N3 * K, seed);
    const int NM = N1 > N2 ? (N1 > N3 ? N1 : N3) : (N2 > N3 ? N2 : N3);
    float *init = rnd((size_t)M * NM, seed);
    ctrl_cpu_bf16_packed *P = ctrl_cpu_gemm_bf16_pack(1, N3, K, B3, K);
    CHECK(P != NULL);
    for (int acc = 0; acc < 2 && P; acc++) {
        size_t p0, r0, p1, r1;
        ctrl_cpu_gemm_bf16_share_stats(&p0, &r0);
        prods s = run_a(M, K, N1, N2, N3, A, B1, B2, P, init, acc, 1);
        ctrl_cpu_gemm_bf16_share_stats(&p1, &r1);
        prods u = run_a(M, K, N1, N2, N3, A, B1, B2, P, init, acc, 0);
        /* packed once, read by the other two products (the few-row path, M <= 4 against [N,K], packs
         * nothing: it reads A as it is) */
        const int few = M <= 4;
        CHECK_MSG(p1 - p0 == 1 && r1 - r0 == (size_t)(few ? 1 : 2), "%dx%d: A packed %zu times, read %zu", M,
                  K, p1 - p0, r1 - r0);
        CHECK_MSG(!memcmp(s.c1, u.c1, sizeof(float) * (size_t)M * N1), "%dx%dx%d acc %d: A B1^T differs", M,
                  N1, K, acc);
        CHECK_MSG(!memcmp(s.c2, u.c2, sizeof(float) * (size_t)M * N2), "%dx%dx%d acc %d: A B2 differs", M, N2,
                  K, acc);
        CHECK_MSG(!memcmp(s.c3, u.c3, sizeof(float) * (size_t)M * N3), "%dx%dx%d acc %d: A on panels differs",
                  M, N3, K, acc);
        free_prods(&s), free_prods(&u);
    }
    /* dX = dY W on W's forward panels read transposed, dY shared with a per-call dY B (LoRA's B [K3,r]) */
    if (P) {
        float *dY = rnd((size_t)M * N3, seed), *Bl = rnd((size_t)N3 * 16, seed);
        float *d1 = malloc(sizeof(float) * (size_t)M * K), *d2 = malloc(sizeof(float) * (size_t)M * K);
        float *x1 = malloc(sizeof(float) * (size_t)M * 16), *x2 = malloc(sizeof(float) * (size_t)M * 16);
        for (int shared = 1; shared >= 0; shared--) {
            float *d = shared ? d1 : d2, *x = shared ? x1 : x2;
            CHECK_EQ_INT(ctrl_cpu_gemm_bf16_share(1, 0, 0, M, N3, shared ? dY : NULL, N3), 0);
            CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed_t(0, M, dY, N3, P, d, K, 0), 0);
            CHECK_EQ_INT(ctrl_cpu_gemm_bf16(0, 0, M, 16, N3, dY, N3, Bl, 16, x, 16, 0), 0);
        }
        ctrl_cpu_gemm_bf16_share(1, 0, 0, 0, 0, NULL, 0);
        CHECK_MSG(!memcmp(d1, d2, sizeof(float) * (size_t)M * K), "%dx%dx%d: dY W on panels differs", M, K,
                  N3);
        CHECK_MSG(!memcmp(x1, x2, sizeof(float) * (size_t)M * 16), "%dx16x%d: dY B differs", M, N3);
        free(dY), free(Bl), free(d1), free(d2), free(x1), free(x2);
    }
    ctrl_cpu_gemm_bf16_packed_free(P);
    free(A), free(B1), free(B2), free(B3), free(init);
}

/* x [T, IN] as the B of three weight gradients dW_i += dY_i^T x (dY_i [T, OUT_i]) */
static void check_shared_b(int T, int IN, const int *outs, unsigned *seed) {
    float *x = rnd((size_t)T * IN, seed), *dy[3], *w[2][3];
    for (int i = 0; i < 3; i++) {
        dy[i] = rnd((size_t)T * outs[i], seed);
        w[0][i] = rnd((size_t)outs[i] * IN, seed);
        w[1][i] = malloc(sizeof(float) * (size_t)outs[i] * IN);
        memcpy(w[1][i], w[0][i], sizeof(float) * (size_t)outs[i] * IN);
    }
    size_t p0, r0, p1, r1;
    ctrl_cpu_gemm_bf16_share_stats(&p0, &r0);
    for (int shared = 1; shared >= 0; shared--) {
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16_share(1, 1, 0, IN, T, shared ? x : NULL, IN), 0);
        for (int i = 0; i < 3; i++)
            CHECK_EQ_INT(
                ctrl_cpu_gemm_bf16(1, 0, outs[i], IN, T, dy[i], outs[i], x, IN, w[shared ? 0 : 1][i], IN, 1),
                0);
        if (shared) ctrl_cpu_gemm_bf16_share_stats(&p1, &r1);
    }
    CHECK_EQ_INT(ctrl_cpu_gemm_bf16_share(1, 0, 0, 0, 0, NULL, 0), 0);
    CHECK_MSG(p1 - p0 == 1 && r1 - r0 == 2, "x as B: packed %zu times, read %zu", p1 - p0, r1 - r0);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(!memcmp(w[0][i], w[1][i], sizeof(float) * (size_t)outs[i] * IN),
                  "dW %d (%dx%d over %d tokens) differs", i, outs[i], IN, T);
        free(dy[i]), free(w[0][i]), free(w[1][i]);
    }
    free(x);
}

TEST(shared_operands_match_products_packing_per_call) {
    if (ctrl_cpu_bf16_kind_now() == CTRL_CPU_BF16_FP32) { /* no blocked GEMM: the products refuse */
        float c = 7, a = 1;
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16(0, 1, 8, 1, 1, &a, 1, &a, 1, &c, 1, 0), -1);
        CHECK(c == 7);
        printf("  no bf16 GEMM kernel here: the products refuse, nothing is packed\n");
        return;
    }
    unsigned seed = 3;
    /* M, K, N1, N2, N3: K odd and past the 1024-deep blocks, M past the 192 / 256 row blocks,
     * N off the 48 / 32-column panels; r = 16 columns (a LoRA adapter); few rows */
    static const int shapes[][5] = {
        {300, 1101, 100, 16, 70}, {37, 130, 50, 16, 33}, {3, 40, 20, 17, 18}, {260, 64, 16, 96, 130}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        check_shared_a(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4], &seed);
    static const int outs[3] = {70, 16, 16};
    check_shared_b(1030, 90, outs, &seed); /* T past a depth block */
    check_shared_b(33, 200, outs, &seed);
    ctrl_cpu_gemm_bf16_share_release();
}

/* A packed under AVX-512 BF16's layout, then a product on the emulated AMX kernel: not read (packed
 * per call), and equal to that kernel's own unshared product. */
TEST(shared_operand_of_another_kernel_layout_is_not_read) {
    if (getenv("CTRL_AMX_EMULATE") || getenv("CTRL_NO_AVX512BF16") ||
        ctrl_cpu_bf16_kind_now() != CTRL_CPU_BF16_AVX512) {
        printf("  not run here: needs AVX-512 BF16 (the emulated AMX kernel runs on it) and no switch set\n");
        return;
    }
    unsigned seed = 9;
    const int M = 40, K = 530, N = 50;
    float *A = rnd((size_t)M * K, &seed), *B = rnd((size_t)N * K, &seed);
    float *c0 = malloc(sizeof(float) * M * N), *c1 = malloc(sizeof(float) * M * N),
          *c2 = malloc(sizeof(float) * M * N);
    CHECK_EQ_INT(ctrl_cpu_gemm_bf16_share(0, 0, 0, M, K, A, K), 0);
    CHECK_EQ_INT(ctrl_cpu_gemm_bf16(0, 1, M, N, K, A, K, B, K, c0, N, 0), 0); /* packs A for AVX-512 */
    setenv("CTRL_AMX_EMULATE", "1", 1);
    size_t p0, r0, p1, r1;
    ctrl_cpu_gemm_bf16_share_stats(&p0, &r0);
    CHECK_EQ_INT(ctrl_cpu_gemm_bf16(0, 1, M, N, K, A, K, B, K, c1, N, 0), 0);
    ctrl_cpu_gemm_bf16_share_stats(&p1, &r1);
    CHECK_EQ_INT(ctrl_cpu_gemm_bf16_share(0, 0, 0, 0, 0, NULL, 0), 0);
    CHECK_EQ_INT(ctrl_cpu_gemm_bf16(0, 1, M, N, K, A, K, B, K, c2, N, 0), 0);
    unsetenv("CTRL_AMX_EMULATE");
    CHECK_MSG(p1 == p0 && r1 == r0, "the AVX-512 layout was read by the AMX kernel");
    CHECK(!memcmp(c1, c2, sizeof(float) * M * N));
    ctrl_cpu_gemm_bf16_share_release();
    free(A), free(B), free(c0), free(c1), free(c2);
}
