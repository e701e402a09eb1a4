/* The blocked bf16 GEMM (kernels/cpu/gemm_bf16.c) and the bf16 linear layer on it, against an fp64
 * reference computed from the bf16-rounded inputs: all four orientations (the model uses three:
 * x W^T, dout W, dout^T x), odd shapes (edges of the 8 x 48 and the 32 x 32 tiles, K odd, K past
 * the 1024-deep blocks (AVX-512 BF16 and AMX), M past the 192- and 256-row blocks, N past the 8160- and
 * 8192-column blocks), leading dimensions wider than the rows, accumulate on and off; the rounding
 * done while packing equals ctrl_cpu_round_to_bf16 bit for bit (ties, overflow to infinity) in
 * both packing directions; the dispatch follows its switches. ctest runs this file four times: as
 * is (AMX where the CPU has it, else AVX-512 BF16), with CTRL_AMX_EMULATE=1 (test_gemm_bf16_amx:
 * the AMX kernel on the emulated instructions, where AVX-512 BF16 runs), with CTRL_NO_AMX=1
 * (test_gemm_bf16_no_amx) and with CTRL_NO_AVX512BF16=1 (test_gemm_bf16_portable), where
 * ctrl_cpu_gemm_bf16 must refuse (-1, C untouched) and the linear layer must still agree. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "random_floats.h"
#include "test.h"

/* element (i, k) of op(X) stored row-major with leading dimension ld, X^T when trans */
static float at(const float *x, int trans, int ld, int i, int k) {
    return trans ? x[(size_t)k * ld + i] : x[(size_t)i * ld + k];
}

/* R = op(A) op(B) in double on the inputs rounded to bf16; S = the sums of |products| (the error scale) */
static void reference(double *R, double *S, int ta, int tb, int M, int N, int K, const float *A, int lda,
                      const float *B, int ldb) {
    const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb;
    float *a = malloc(sizeof(float) * na), *b = malloc(sizeof(float) * nb);
    ctrl_cpu_round_to_bf16(a, A, (int64_t)na), ctrl_cpu_round_to_bf16(b, B, (int64_t)nb);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double r = 0, s = 0;
            for (int k = 0; k < K; k++) {
                const double p = (double)at(a, ta, lda, i, k) * at(b, !tb, ldb, j, k);
                r += p, s += fabs(p);
            }
            R[(size_t)i * N + j] = r, S[(size_t)i * N + j] = s;
        }
    free(a), free(b);
}

TEST(all_orientations_odd_shapes_against_fp64) {
    static const int shapes[][3] = {{1, 1, 1},      {7, 65, 33},  {6, 64, 2},    {13, 130, 257},
                                    {200, 70, 515}, {5, 129, 31}, {3, 4100, 5},  {37, 17, 1},
                                    {300, 33, 40},  {5, 8200, 3}, {33, 31, 1030}};
    int fast;
    const char *path = ctrl_cpu_bf16_path(&fast);
    fast = ctrl_cpu_bf16_kind_now() != CTRL_CPU_BF16_FP32; /* a bf16 kernel runs (the emulated one too) */
    printf("  path: %s%s\n", path, fast ? "" : " (ctrl_cpu_gemm_bf16 must refuse)");
    unsigned seed = 3;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int o = 0; o < 4; o++) {
            const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ta = o >> 1, tb = o & 1;
            const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
            float *A = malloc(sizeof(float) * (size_t)(ta ? K : M) * lda);
            float *B = malloc(sizeof(float) * (size_t)(tb ? N : K) * ldb);
            float *C = malloc(sizeof(float) * (size_t)M * ldc);
            double *R = malloc(sizeof(double) * (size_t)M * N), *S = malloc(sizeof(double) * (size_t)M * N);
            for (size_t i = 0; i < (size_t)(ta ? K : M) * lda; i++) A[i] = frand(&seed);
            for (size_t i = 0; i < (size_t)(tb ? N : K) * ldb; i++) B[i] = frand(&seed);
            for (size_t i = 0; i < (size_t)M * ldc; i++) C[i] = 0.5f;
            reference(R, S, ta, tb, M, N, K, A, lda, B, ldb);
            for (int acc = 1; acc >= 0; acc--) {
                const int rc = ctrl_cpu_gemm_bf16(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, acc);
                if (!fast) {
                    CHECK_EQ_INT(rc, -1);
                    int touched = 0;
                    for (size_t i = 0; i < (size_t)M * ldc; i++) touched += C[i] != 0.5f;
                    CHECK_EQ_INT(touched, 0);
                    continue;
                }
                CHECK_EQ_INT(rc, 0);
                double worst = 0;
                int pad = 0;
                for (int i = 0; i < M; i++) {
                    for (int j = 0; j < N; j++) {
                        const double want = R[(size_t)i * N + j] + (acc ? 0.5 : 0.0);
                        /* fp32 accumulation: at most K roundings of 2^-24 of the sum of |products| */
                        const double tol = 1e-7 * (K + 2) * (S[(size_t)i * N + j] + 1);
                        worst = fmax(worst, fabs(C[(size_t)i * ldc + j] - want) / tol);
                    }
                    pad += C[(size_t)i * ldc + N] != 0.5f || C[(size_t)i * ldc + N + 1] != 0.5f;
                }
                CHECK_MSG(worst <= 1, "%dx%dx%d ta %d tb %d acc %d: error %.3g of the bound", M, N, K, ta, tb,
                          acc, worst);
                CHECK_MSG(pad == 0, "%dx%dx%d ta %d tb %d: wrote past N in %d rows", M, N, K, ta, tb, pad);
            }
            free(A), free(B), free(C), free(R), free(S);
        }
}

/* C = op(A) I picks out A's values as the packing rounded them: they must be ctrl_cpu_round_to_bf16's
 * (finite values in a K = 40 identity product; infinities, which would make NaNs of the other
 * columns' zeros, one per row with K = 1). */
TEST(packing_rounds_as_round_to_bf16) {
    if (!ctrl_cpu_has_avx512bf16()) TEST_SKIP("AVX-512 BF16 off: nothing is packed");
    enum { M = 9, K = 40, NS = 16 };
    static const float specials[NS] = {1.00390625f,    1.01171875f,    -1.00390625f,   3.3895314e38f,
                                       -3.3895314e38f, 3.40282347e38f, INFINITY,       -INFINITY,
                                       0.0f,           -0.0f,          1e-30f,         65504.0f,
                                       0.1f,           -2.5e-3f,       1.0f + 0x1p-8f, 3.0f + 0x1p-7f};
    float A[M * K], At[K * M], I[K * K], C[M * K], want[M * K];
    unsigned seed = 11;
    for (int i = 0; i < M * K; i++)
        A[i] = i < NS && isfinite(specials[i]) && fabsf(specials[i]) < 3.39e38f ? specials[i]
                                                                                : frand(&seed) * 1000;
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) At[(size_t)k * M + i] = A[(size_t)i * K + k];
    for (int i = 0; i < K * K; i++) I[i] = i % (K + 1) == 0;
    for (int pass = 0; pass < 2; pass++) {
        const int m = pass ? NS : M, k = pass ? 1 : K;
        const float *src = pass ? specials : A, one = 1.0f;
        ctrl_cpu_round_to_bf16(want, src, m * k);
        for (int ta = 0; ta < 2; ta++) {
            const float *a = ta && !pass ? At : src;
            CHECK_EQ_INT(ctrl_cpu_gemm_bf16(ta, 0, m, k, k, a, ta ? m : k, pass ? &one : I, k, C, k, 0), 0);
            int bad = 0;
            for (int i = 0; i < m * k; i++)
                if (memcmp(&C[i], &want[i], 4) && !(C[i] == 0 && want[i] == 0)) {
                    if (bad++ < 4)
                        printf("  ta %d: %a packed as %a, rounding gives %a\n", ta, src[i], C[i], want[i]);
                }
            CHECK_MSG(bad == 0, "K %d, ta %d: %d values rounded differently", k, ta, bad);
        }
    }
}

static double worst_rel(const float *got, const double *want, const double *scale, int n, int K) {
    double w = 0;
    for (int i = 0; i < n; i++) w = fmax(w, fabs(got[i] - want[i]) / (1e-7 * (K + 2) * (scale[i] + 1)));
    return w;
}

/* The linear layer on whichever path runs (forward x W^T, dx = dout W, dW += dout^T x), against fp64
 * on rounded inputs; T = 3 with rounded weights also takes the few-tokens SGEMM path. */
TEST(linear_layer_on_every_path_against_fp64) {
    static const int shapes[][3] = {{3, 33, 17}, {37, 96, 80}, {70, 257, 130}};
    unsigned seed = 5;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int T = shapes[s][0], IN = shapes[s][1], OUT = shapes[s][2];
        float *x = malloc(sizeof(float) * T * IN), *w = malloc(sizeof(float) * OUT * IN),
              *dout = malloc(sizeof(float) * T * OUT), *y = malloc(sizeof(float) * T * OUT),
              *dx = malloc(sizeof(float) * T * IN), *dw = malloc(sizeof(float) * OUT * IN);
        double *R = malloc(sizeof(double) * OUT * IN), *S = malloc(sizeof(double) * OUT * IN);
        for (int i = 0; i < T * IN; i++) x[i] = frand(&seed);
        for (int i = 0; i < OUT * IN; i++) w[i] = frand(&seed) * 0.1f;
        for (int i = 0; i < T * OUT; i++) dout[i] = frand(&seed);
        for (int rounded = 0; rounded < 2; rounded++) {
            if (rounded) ctrl_cpu_round_to_bf16(w, w, (int64_t)OUT * IN);
            for (int i = 0; i < OUT * IN; i++) dw[i] = 1.0f;
            CHECK_EQ_INT(ctrl_cpu_linear_forward_bf16(y, x, w, NULL, T, IN, OUT, rounded), 0);
            CHECK_EQ_INT(ctrl_cpu_linear_backward_bf16(dx, dw, NULL, dout, x, w, T, IN, OUT, rounded), 0);
            reference(R, S, 0, 1, T, OUT, IN, x, IN, w, IN);
            const double ey = worst_rel(y, R, S, T * OUT, IN);
            reference(R, S, 0, 0, T, IN, OUT, dout, OUT, w, IN);
            const double edx = worst_rel(dx, R, S, T * IN, OUT);
            reference(R, S, 1, 0, OUT, IN, T, dout, OUT, x, IN);
            for (int i = 0; i < OUT * IN; i++) R[i] += 1.0;
            const double edw = worst_rel(dw, R, S, OUT * IN, T);
            CHECK_MSG(ey <= 1 && edx <= 1 && edw <= 1,
                      "T %d IN %d OUT %d rounded %d: out %.3g dx %.3g dW %.3g", T, IN, OUT, rounded, ey, edx,
                      edw);
        }
        free(x), free(w), free(dout), free(y), free(dx), free(dw), free(R), free(S);
    }
}

static double rel(const float *a, const float *b, int n) {
    double e = 0, r = 0;
    for (int i = 0; i < n; i++) e += (double)(a[i] - b[i]) * (a[i] - b[i]), r += (double)b[i] * b[i];
    return sqrt(e / (r > 0 ? r : 1));
}

/* The LM head with bf16 products (ctrl_head_args.bf16, the model's dtype = bf16): where the fast
 * path runs, its log-probs are those of the fp32 head on bf16-rounded hidden states and weights (the
 * forward products are the same sums), and its gradients (dlogits rounded too, as autocast's bf16
 * backward) stay within bf16 tolerance of fp32; elsewhere it is the fp32 head, bit for bit. Both the
 * one-pass head (SFT) and the chunked forward + backward, V past one 8160-column block. */
TEST(head_in_bf16) {
    enum { T = 19, C = 40, V = 8200 };
    unsigned seed = 9;
    float *h = malloc(sizeof(float) * T * C), *w = malloc(sizeof(float) * V * C),
          *hr = malloc(sizeof(float) * T * C), *wr = malloc(sizeof(float) * V * C);
    int32_t tg[T];
    float dlogp[T];
    for (int i = 0; i < T * C; i++) h[i] = frand(&seed);
    for (int i = 0; i < V * C; i++) w[i] = frand(&seed) * 0.3f;
    for (int t = 0; t < T; t++) tg[t] = t == 3 ? -100 : (int32_t)((t * 977u) % V), dlogp[t] = frand(&seed);
    ctrl_cpu_round_to_bf16(hr, h, T * C), ctrl_cpu_round_to_bf16(wr, w, (int64_t)V * C);
    float lp[3][T], lse[3][T];
    float *dh[3], *dw[3];
    for (int v = 0; v < 3; v++) { /* 0: fp32, 1: bf16, 2: fp32 on the rounded inputs */
        ctrl_head_args a = {.hidden = v == 2 ? hr : h,
                            .w = v == 2 ? wr : w,
                            .targets = tg,
                            .T = T,
                            .C = C,
                            .V = V,
                            .temperature = 0.7f,
                            .chunk_tokens = 8,
                            .bf16 = v == 1};
        void *ws = malloc(ctrl_cpu_head_fused_workspace_bytes(&a));
        dh[v] = malloc(sizeof(float) * T * C), dw[v] = calloc((size_t)V * C, sizeof(float));
        ctrl_cpu_head_forward_backward(&a, dlogp, lp[v], NULL, lse[v], NULL, dh[v], dw[v], ws);
        free(ws);
        /* the chunked pair gives the same as the one pass */
        ws = malloc(ctrl_cpu_head_workspace_bytes(&a));
        float lp2[T], lse2[T], *dh2 = malloc(sizeof(float) * T * C),
                               *dw2 = calloc((size_t)V * C, sizeof(float));
        ctrl_cpu_head_forward(&a, lp2, NULL, lse2, NULL, ws);
        ctrl_cpu_head_backward(&a, lse2, dlogp, NULL, NULL, dh2, dw2, ws);
        double e = 0;
        for (int t = 0; t < T; t++) e = fmax(e, fabs(lp2[t] - lp[v][t]));
        CHECK_MSG(e < 1e-4, "variant %d: chunked log-probs %.3g from the one-pass head", v, e);
        CHECK_MSG(rel(dh2, dh[v], T * C) < 1e-4 && rel(dw2, dw[v], V * C) < 1e-4, "variant %d: chunked grads",
                  v);
        free(ws), free(dh2), free(dw2);
    }
    double e_r = 0, e_32 = 0;
    for (int t = 0; t < T; t++)
        e_r = fmax(e_r, fabs(lp[1][t] - lp[2][t])), e_32 = fmax(e_32, fabs(lp[1][t] - lp[0][t]));
    printf("  bf16 head: log-probs %.2g from fp32 on rounded inputs, %.2g from fp32; dh %.2g, dW %.2g from "
           "fp32\n",
           e_r, e_32, rel(dh[1], dh[0], T * C), rel(dw[1], dw[0], V * C));
    if (ctrl_cpu_has_avx512bf16()) {
        CHECK(e_r < 1e-4);
        CHECK(e_32 > 0); /* it did round */
        CHECK(rel(dh[1], dh[0], T * C) < 1e-2 && rel(dw[1], dw[0], V * C) < 1e-2);
    } else {
        CHECK(memcmp(lp[1], lp[0], sizeof lp[0]) == 0 && memcmp(dh[1], dh[0], sizeof(float) * T * C) == 0);
    }
    for (int v = 0; v < 3; v++) free(dh[v]), free(dw[v]);
    free(h), free(w), free(hr), free(wr);
}

/* The head on W's panels alone (w and w16 NULL: a frozen embedding tied to the head, held as its panels):
 * the one-pass head and the chunked forward + backward over V past two column blocks, rows without
 * a target skipped, give the log-probs, LSEs and dhidden of the head on the fp32 W under bf16 (within
 * 1e-5: its chunks of 8192 columns sum the softmax in another grouping, and its chunks of up to 4 rows
 * take the few-rows path), whatever bf16 says. */
TEST(head_on_panels_alone) {
    if (ctrl_cpu_bf16_kind_now() == CTRL_CPU_BF16_FP32) TEST_SKIP("no bf16 kernel: no panels");
    enum { T = 19, C = 40, V = 20000 };
    unsigned seed = 21;
    float *h = malloc(sizeof(float) * T * C), *w = malloc(sizeof(float) * V * C);
    int32_t tg[T];
    float dlogp[T];
    for (int i = 0; i < T * C; i++) h[i] = frand(&seed);
    for (int i = 0; i < V * C; i++) w[i] = frand(&seed) * 0.3f;
    for (int t = 0; t < T; t++)
        tg[t] = t % 5 == 3 ? -100 : (int32_t)((t * 7919u) % V), dlogp[t] = frand(&seed);
    ctrl_cpu_bf16_packed *p = ctrl_cpu_gemm_bf16_pack(1, V, C, w, C);
    CHECK(p != NULL && ctrl_cpu_gemm_bf16_packed_block(p) < V / 2);
    float lp[3][2][T], lse[3][2][T], *dh[3][2];
    for (int v = 0; v < 3; v++) { /* 0: the fp32 W; 1: its panels alone; 2: the same, bf16 = 0 */
        const ctrl_head_args a = {.hidden = h,
                                  .w = v == 0 ? w : NULL,
                                  .targets = tg,
                                  .T = T,
                                  .C = C,
                                  .V = V,
                                  .temperature = 0.7f,
                                  .chunk_tokens = 8,
                                  .bf16 = v != 2,
                                  .targets_only = 1,
                                  .w_packed = v == 0 ? NULL : p};
        void *ws = malloc(ctrl_cpu_head_fused_workspace_bytes(&a));
        dh[v][0] = malloc(sizeof(float) * T * C), dh[v][1] = malloc(sizeof(float) * T * C);
        ctrl_cpu_head_forward_backward(&a, dlogp, lp[v][0], NULL, lse[v][0], NULL, dh[v][0], NULL, ws);
        free(ws);
        ws = malloc(ctrl_cpu_head_workspace_bytes(&a));
        ctrl_cpu_head_forward(&a, lp[v][1], NULL, lse[v][1], NULL, ws);
        ctrl_cpu_head_backward(&a, lse[v][1], dlogp, NULL, NULL, dh[v][1], NULL, ws);
        free(ws);
    }
    for (int v = 1; v < 3; v++)
        for (int k = 0; k < 2; k++) {
            double e = 0, el = 0;
            for (int t = 0; t < T; t++)
                e = fmax(e, fabs(lp[v][k][t] - lp[0][k][t])),
                el = fmax(el, fabs(lse[v][k][t] - lse[0][k][t]));
            const double ed = rel(dh[v][k], dh[0][k], T * C);
            printf("  panels alone (bf16 %d), %s: log-probs %.2g, lse %.2g, dhidden %.2g from the fp32 W's\n",
                   v == 1, k ? "chunked" : "one pass", e, el, ed);
            CHECK(e < 1e-5 && el < 1e-5 && ed < 1e-5);
            CHECK(lp[v][k][3] == 0.0f && dh[v][k][3 * C] == 0.0f); /* a row without a target */
        }
    for (int v = 0; v < 3; v++) free(dh[v][0]), free(dh[v][1]);
    ctrl_cpu_gemm_bf16_packed_free(p);
    free(h), free(w);
}

/* Few tokens through x W^T (decoding) take the unpacked path: the same sums as the blocked one. */
TEST(few_rows_match_blocked) {
    if (!ctrl_cpu_has_avx512bf16()) TEST_SKIP("AVX-512 BF16 off");
    enum { K = 77, N = 23 };
    unsigned seed = 13;
    float A[8 * K], B[N * K], C1[8 * N], C2[8 * N];
    for (int i = 0; i < 8 * K; i++) A[i] = frand(&seed);
    for (int i = 0; i < N * K; i++) B[i] = frand(&seed);
    CHECK_EQ_INT(ctrl_cpu_gemm_bf16(0, 1, 8, N, K, A, K, B, K, C1, N, 0), 0); /* 8 rows: blocked */
    for (int M = 1; M <= 4; M++) {
        for (int i = 0; i < M * N; i++) C2[i] = 1.0f;
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16(0, 1, M, N, K, A, K, B, K, C2, N, 1), 0);
        double e = 0;
        for (int i = 0; i < M * N; i++) e = fmax(e, fabs(C2[i] - 1.0f - C1[i]));
        CHECK_MSG(e < 1e-5, "M %d: %.3g from the blocked path", M, e);
    }
}

/* The path follows CTRL_NO_AVX512BF16, CTRL_NO_AMX and CTRL_AMX_EMULATE, read at each call; each
 * kernel that runs here gives the product within the fp32 bound, and the emulated AMX kernel is a
 * different kernel from AVX-512's (another summation order: not bit for bit the same sums). */
static void set_env(const char *k, const char *v) {
    if (v)
        setenv(k, v, 1);
    else
        unsetenv(k);
}

TEST(dispatch_follows_the_switches) {
    static const char *names[3] = {"CTRL_NO_AVX512BF16", "CTRL_NO_AMX", "CTRL_AMX_EMULATE"};
    char *saved[3];
    for (int i = 0; i < 3; i++) saved[i] = getenv(names[i]) ? strdup(getenv(names[i])) : NULL;
    for (int i = 0; i < 3; i++) unsetenv(names[i]);
    const ctrl_cpu_bf16_kind base = ctrl_cpu_bf16_kind_now();
    const int avx = base != CTRL_CPU_BF16_FP32, amx = ctrl_cpu_has_amx();
    int fast;
    printf("  this CPU: %s\n", ctrl_cpu_bf16_path(&fast));
    CHECK_EQ_INT(base, (amx ? CTRL_CPU_BF16_AMX : avx ? CTRL_CPU_BF16_AVX512 : CTRL_CPU_BF16_FP32));
    CHECK_EQ_INT(fast, avx);
    if (avx && !amx) CHECK_CONTAINS(ctrl_cpu_bf16_path(&fast), "no AMX: ");

    enum { M = 32, N = 32, K = 512 };
    unsigned seed = 21;
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * N * K);
    float C[3][M * N];
    double R[M * N], S[M * N];
    for (int i = 0; i < M * K; i++) A[i] = frand(&seed);
    for (int i = 0; i < N * K; i++) B[i] = frand(&seed);
    reference(R, S, 0, 1, M, N, K, A, K, B, K);
    static const struct {
        const char *no_avx, *no_amx, *emulate;
        int kind; /* when the CPU has AVX-512 BF16 (else: fp32) */
    } cases[] = {{NULL, NULL, "1", CTRL_CPU_BF16_AMX_EMULATED},
                 {NULL, NULL, "0", -1}, /* "0": not emulated, the CPU's own path */
                 {NULL, "1", "1", CTRL_CPU_BF16_AVX512},
                 {"1", NULL, "1", CTRL_CPU_BF16_FP32}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        set_env(names[0], cases[c].no_avx), set_env(names[1], cases[c].no_amx),
            set_env(names[2], cases[c].emulate);
        const int want = !avx ? CTRL_CPU_BF16_FP32 : cases[c].kind < 0 ? (int)base : cases[c].kind;
        const int kind = ctrl_cpu_bf16_kind_now();
        const char *path = ctrl_cpu_bf16_path(&fast);
        CHECK_MSG(kind == want, "case %zu: path %d, want %d (%s)", c, kind, want, path);
        CHECK_EQ_INT(fast, (want == CTRL_CPU_BF16_AMX || want == CTRL_CPU_BF16_AVX512)); /* emulated: slow */
        if (want == CTRL_CPU_BF16_AMX_EMULATED) CHECK_CONTAINS(path, "emulated");
        if (want == CTRL_CPU_BF16_AVX512 && amx) CHECK_CONTAINS(path, "CTRL_NO_AMX");
        if (want == CTRL_CPU_BF16_FP32 && avx) CHECK_CONTAINS(path, "CTRL_NO_AVX512BF16");
        const int slot = want == CTRL_CPU_BF16_AMX_EMULATED ? 0 : want == CTRL_CPU_BF16_AVX512 ? 1 : 2;
        const int rc = ctrl_cpu_gemm_bf16(0, 1, M, N, K, A, K, B, K, C[slot], N, 0);
        CHECK_EQ_INT(rc, want == CTRL_CPU_BF16_FP32 ? -1 : 0);
        if (rc == 0) {
            double worst = 0;
            for (int i = 0; i < M * N; i++)
                worst = fmax(worst, fabs(C[slot][i] - R[i]) / (1e-7 * (K + 2) * (S[i] + 1)));
            CHECK_MSG(worst <= 1, "case %zu: error %.3g of the bound", c, worst);
        }
    }
    if (avx)
        CHECK_MSG(memcmp(C[0], C[1], sizeof C[0]) != 0,
                  "the emulated AMX kernel gave AVX-512's sums bit for bit");
    for (int i = 0; i < 3; i++) set_env(names[i], saved[i]), free(saved[i]);
    free(A), free(B);
}

/* B packed once (ctrl_cpu_gemm_bf16_pack) gives ctrl_cpu_gemm_bf16's sums bit for bit, both
 * orientations of B, A or A^T, N past a column block, K past depth blocks; a repack takes B's new
 * values; a change of kernel (AMX emulated <-> AVX-512) since packing is refused until repacked. */
TEST(prepacked_b_gives_the_same_sums) {
    static const int shapes[][3] = {{37, 70, 515}, {70, 33, 1030}, {9, 8200, 2}};
    unsigned seed = 31;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int o = 0; o < 4; o++) {
            const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ta = o >> 1, tb = o & 1;
            if (N > 8192 && ta) continue; /* the wide one (the emulated AMX kernel is slow): A as stored */
            const int lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 3;
            float *A = malloc(sizeof(float) * (size_t)(ta ? K : M) * lda);
            float *B = malloc(sizeof(float) * (size_t)(tb ? N : K) * ldb);
            float *C1 = malloc(sizeof(float) * (size_t)M * N), *C2 = malloc(sizeof(float) * (size_t)M * N);
            for (size_t i = 0; i < (size_t)(ta ? K : M) * lda; i++) A[i] = frand(&seed);
            for (size_t i = 0; i < (size_t)(tb ? N : K) * ldb; i++) B[i] = frand(&seed);
            ctrl_cpu_bf16_packed *p = ctrl_cpu_gemm_bf16_pack(tb, N, K, B, ldb);
            if (ctrl_cpu_bf16_kind_now() == CTRL_CPU_BF16_FP32) {
                CHECK(p == NULL);
                CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed(ta, M, A, lda, p, C2, N, 0), -1);
            } else {
                CHECK(p != NULL && ctrl_cpu_gemm_bf16_packed_bytes(p) >= sizeof(uint16_t) * (size_t)N * K);
                for (int acc = 0; acc < 2; acc++) {
                    for (int i = 0; i < M * N; i++) C1[i] = C2[i] = 0.25f;
                    CHECK_EQ_INT(ctrl_cpu_gemm_bf16(ta, tb, M, N, K, A, lda, B, ldb, C1, N, acc), 0);
                    CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed(ta, M, A, lda, p, C2, N, acc), 0);
                    CHECK_MSG(memcmp(C1, C2, sizeof(float) * (size_t)M * N) == 0,
                              "%dx%dx%d ta %d tb %d acc %d: packed B gave other sums", M, N, K, ta, tb, acc);
                }
                /* B doubled (exact in bf16): after a repack the sums double exactly */
                CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed(ta, M, A, lda, p, C1, N, 0), 0);
                for (size_t i = 0; i < (size_t)(tb ? N : K) * ldb; i++) B[i] *= 2;
                CHECK_EQ_INT(ctrl_cpu_gemm_bf16_repack(p, B, ldb), 0);
                CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed(ta, M, A, lda, p, C2, N, 0), 0);
                int bad = 0;
                for (int i = 0; i < M * N; i++) bad += C2[i] != 2 * C1[i];
                CHECK_MSG(bad == 0, "%dx%dx%d ta %d tb %d: %d sums not doubled after the repack", M, N, K, ta,
                          tb, bad);
            }
            ctrl_cpu_gemm_bf16_packed_free(p);
            free(A), free(B), free(C1), free(C2);
        }
    if (ctrl_cpu_bf16_kind_now() == CTRL_CPU_BF16_FP32) return;
    /* another kernel since packing: it reads the panels into its own layout as it goes (the same
     * sums as its own GEMM), and after a repack they are in its layout */
    enum { M = 20, N = 50, K = 70 };
    float A[M * K], B[N * K], C1[M * N], C2[M * N];
    for (int i = 0; i < M * K; i++) A[i] = frand(&seed);
    for (int i = 0; i < N * K; i++) B[i] = frand(&seed);
    ctrl_cpu_bf16_packed *p = ctrl_cpu_gemm_bf16_pack(1, N, K, B, K);
    char *saved = getenv("CTRL_AMX_EMULATE") ? strdup(getenv("CTRL_AMX_EMULATE")) : NULL;
    const int base = ctrl_cpu_bf16_kind_now();
    set_env("CTRL_AMX_EMULATE", base == CTRL_CPU_BF16_AMX_EMULATED ? "0" : "1");
    const int other = ctrl_cpu_bf16_kind_now(); /* the AVX-512 and AMX layouts differ */
    if ((base == CTRL_CPU_BF16_AVX512 && other == CTRL_CPU_BF16_AMX_EMULATED) ||
        (base == CTRL_CPU_BF16_AMX_EMULATED && other == CTRL_CPU_BF16_AVX512)) {
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16(0, 1, M, N, K, A, K, B, K, C1, N, 0), 0);
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed(0, M, A, K, p, C2, N, 0), 0);
        CHECK(memcmp(C1, C2, sizeof C1) == 0);
        for (int i = 0; i < M * N; i++) C2[i] = 0.5f;
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16_repack(p, B, K), 0);
        CHECK_EQ_INT(ctrl_cpu_gemm_bf16_packed(0, M, A, K, p, C2, N, 0), 0);
        CHECK(memcmp(C1, C2, sizeof C1) == 0);
    }
    set_env("CTRL_AMX_EMULATE", saved);
    free(saved);
    ctrl_cpu_gemm_bf16_packed_free(p);
}
