/* bf16 on the CPU: rounding equals torch's .to(torch.bfloat16) bit for bit (fixture from
 * tests/reference/make_bf16_fixtures.py); the bf16 GEMM computes exactly the fp32 sums of the
 * rounded inputs (to fp32 rounding), on the AVX-512 BF16 path and the portable one alike; the bf16
 * linear layer, forward and backward, is within the bf16 tolerance (1e-2) of fp32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "file_text.h"
#include "random_floats.h"
#include "test.h"

TEST(rounding_matches_torch) {
    ctrl_status st;
    char *text = ctrl_read_text_file(CTRL_FIXTURE_DIR "/kernels/bf16_round.txt", 1 << 20, &st);
    CHECK(text != NULL);
    if (!text) return;
    static float f[1024];
    static uint16_t want[1024], got[1024];
    int n = 0, bad = 0;
    for (char *line = strtok(text, "\n"); line && n < 1024; line = strtok(NULL, "\n"), n++) {
        unsigned int f32, w;
        sscanf(line, "%x %x", &f32, &w);
        memcpy(&f[n], &f32, 4);
        want[n] = (uint16_t)w;
    }
    ctrl_cpu_f32_to_bf16(got, f, n); /* one call: one parallel region */
    for (int i = 0; i < n; i++) {
        bad += got[i] != want[i];
        if (got[i] != want[i] && bad < 5) printf("  %a -> %04x, torch %04x\n", f[i], got[i], want[i]);
    }
    CHECK(n > 400);
    CHECK_EQ_INT(bad, 0);
    free(text);
}

/* The rounding as first written (a branch on NaN, one value at a time): the vectorised loops of
 * kernels/cpu/bf16.c must give the same bits for every value. */
static uint16_t scalar_bf16(uint32_t u) {
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu)) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Every sign, exponent and top mantissa half (the 65,536 high halves: zeros, subnormals, infinities, both
 * NaN kinds, the largest finite values that round to infinity) with the low halves where rounding turns
 * (ties, one either side, all ones) and a pseudo-random one; an odd count, so that the vector loops'
 * tails run too. Converted (f32 -> bf16 bits) and rounded in place (f32 -> f32): both equal the scalar
 * rounding bit for bit. */
TEST(vectorised_rounding_equals_scalar_on_every_high_half) {
    static const uint32_t lows[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0};
    const int64_t n = 65536 * 8 - 3;
    float *in = malloc(sizeof(float) * (size_t)n), *back = malloc(sizeof(float) * (size_t)n);
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)n);
    CHECK(in && back && h);
    if (in && back && h) {
        unsigned seed = 7;
        for (int64_t i = 0; i < n; i++) {
            const uint32_t low = (i & 7) == 7 ? ((seed = seed * 1103515245u + 12345u) >> 16) : lows[i & 7];
            const uint32_t u = (uint32_t)(i >> 3) << 16 | low;
            memcpy(&in[i], &u, 4);
        }
        ctrl_cpu_f32_to_bf16(h, in, n);
        ctrl_cpu_round_to_bf16(back, in, n);
        int64_t bad_h = 0, bad_r = 0;
        for (int64_t i = 0; i < n; i++) {
            uint32_t u, r;
            memcpy(&u, &in[i], 4), memcpy(&r, &back[i], 4);
            const uint16_t want = scalar_bf16(u);
            bad_h += h[i] != want;
            bad_r += r != (uint32_t)want << 16;
            if ((h[i] != want || r != (uint32_t)want << 16) && bad_h + bad_r < 5)
                printf("  %08x -> %04x / %08x, scalar %04x\n", u, h[i], r, want);
        }
        CHECK(bad_h == 0);
        CHECK(bad_r == 0);
    }
    free(in), free(back), free(h);
}

/* C = A B^T in double from the bf16-rounded inputs (a, b: the bf16 copies). */
static void reference(double *C, const uint16_t *a, const uint16_t *b, int M, int N, int K) {
    float *ra = malloc(sizeof(float) * (size_t)M * K), *rb = malloc(sizeof(float) * (size_t)N * K);
    ctrl_cpu_bf16_to_f32(ra, a, (int64_t)M * K), ctrl_cpu_bf16_to_f32(rb, b, (int64_t)N * K);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)ra[(size_t)i * K + k] * rb[(size_t)j * K + k];
            C[(size_t)i * N + j] = s;
        }
    free(ra), free(rb);
}

TEST(gemm_sums_the_rounded_inputs_on_both_paths) {
    static const int shapes[][3] = {{1, 1, 1}, {5, 7, 33}, {17, 9, 64}, {64, 130, 200}, {3, 4, 1000}};
    unsigned seed = 1;
    printf("  AVX-512 BF16 on this CPU: %s\n",
           ctrl_cpu_has_avx512bf16() ? "yes" : "no (portable path twice)");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * (size_t)N * K);
        float *C = malloc(sizeof(float) * (size_t)M * N), *C2 = malloc(sizeof(float) * (size_t)M * N);
        double *R = malloc(sizeof(double) * (size_t)M * N);
        uint16_t *a = malloc(2 * (size_t)M * K), *b = malloc(2 * (size_t)N * K);
        for (int i = 0; i < M * K; i++) A[i] = frand(&seed);
        for (int i = 0; i < N * K; i++) B[i] = frand(&seed);
        ctrl_cpu_f32_to_bf16(a, A, (int64_t)M * K), ctrl_cpu_f32_to_bf16(b, B, (int64_t)N * K);
        reference(R, a, b, M, N, K);
        ctrl_cpu_gemm_bf16_nt(C, a, b, M, N, K, 0);
        /* the same sums in plain fp32 (the portable path's arithmetic; ctest also runs this file with
         * CTRL_NO_AVX512BF16=1, as test_bf16_portable) */
        float *wa = malloc(sizeof(float) * (size_t)M * K), *wb = malloc(sizeof(float) * (size_t)N * K);
        ctrl_cpu_bf16_to_f32(wa, a, (int64_t)M * K), ctrl_cpu_bf16_to_f32(wb, b, (int64_t)N * K);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float acc = 0;
                for (int k = 0; k < K; k++) acc += wa[(size_t)i * K + k] * wb[(size_t)j * K + k];
                C2[(size_t)i * N + j] = acc;
            }
        free(wa), free(wb);
        double worst = 0;
        for (int i = 0; i < M * N; i++) {
            worst = fmax(worst, fabs(C[i] - R[i]) / (fabs(R[i]) + 1e-3 * sqrt((double)K)));
            worst = fmax(worst, fabs(C2[i] - R[i]) / (fabs(R[i]) + 1e-3 * sqrt((double)K)));
        }
        CHECK_MSG(worst < 1e-4, "%dx%dx%d: %.3g from the exact sums of the rounded inputs", M, N, K, worst);
        /* accumulate adds */
        ctrl_cpu_gemm_bf16_nt(C, a, b, M, N, K, 1);
        for (int i = 0; i < M * N; i++) CHECK_NEAR(C[i], 2 * R[i], 1e-3 * (fabs(R[i]) + 1));
        free(A), free(B), free(C), free(C2), free(R), free(a), free(b);
    }
}

static double rel(const float *a, const float *b, int n) {
    double e = 0, r = 0;
    for (int i = 0; i < n; i++) e += (double)(a[i] - b[i]) * (a[i] - b[i]), r += (double)b[i] * b[i];
    return sqrt(e / r);
}

TEST(linear_within_bf16_tolerance_of_fp32) {
    const int T = 37, IN = 96, OUT = 80;
    unsigned seed = 7;
    float *x = malloc(sizeof(float) * T * IN), *w = malloc(sizeof(float) * OUT * IN),
          *bias = malloc(sizeof(float) * OUT);
    float *dout = malloc(sizeof(float) * T * OUT);
    for (int i = 0; i < T * IN; i++) x[i] = frand(&seed);
    for (int i = 0; i < OUT * IN; i++) w[i] = frand(&seed) * 0.1f;
    for (int i = 0; i < OUT; i++) bias[i] = frand(&seed);
    for (int i = 0; i < T * OUT; i++) dout[i] = frand(&seed);
    float *y32 = malloc(sizeof(float) * T * OUT), *y16 = malloc(sizeof(float) * T * OUT);
    float *dx32 = malloc(sizeof(float) * T * IN), *dx16 = malloc(sizeof(float) * T * IN);
    float *dw32 = calloc((size_t)OUT * IN, sizeof(float)), *dw16 = calloc((size_t)OUT * IN, sizeof(float));
    float *db32 = calloc(OUT, sizeof(float)), *db16 = calloc(OUT, sizeof(float));
    ctrl_cpu_linear_forward(y32, x, w, bias, T, IN, OUT);
    CHECK_EQ_INT(ctrl_cpu_linear_forward_bf16(y16, x, w, bias, T, IN, OUT, 0), 0);
    ctrl_cpu_linear_backward(dx32, dw32, db32, dout, x, w, T, IN, OUT);
    CHECK_EQ_INT(ctrl_cpu_linear_backward_bf16(dx16, dw16, db16, dout, x, w, T, IN, OUT, 0), 0);
    printf("  bf16 vs fp32: out %.2g, dx %.2g, dw %.2g, dbias %.2g\n", rel(y16, y32, T * OUT),
           rel(dx16, dx32, T * IN), rel(dw16, dw32, OUT * IN), rel(db16, db32, OUT));
    CHECK(rel(y16, y32, T * OUT) < 1e-2);
    CHECK(rel(dx16, dx32, T * IN) < 1e-2);
    CHECK(rel(dw16, dw32, OUT * IN) < 1e-2);
    CHECK(rel(db16, db32, OUT) < 1e-6);
    CHECK(rel(y16, y32, T * OUT) > 0); /* it did round */
    /* weights rounded once up front (a model's rounded copy) give the same, bit for bit */
    uint16_t *wb = malloc(sizeof(uint16_t) * OUT * IN);
    float *wr = malloc(sizeof(float) * OUT * IN), *y16r = malloc(sizeof(float) * T * OUT),
          *dx16r = malloc(sizeof(float) * T * IN), *dw16r = calloc((size_t)OUT * IN, sizeof(float)),
          *db16r = calloc(OUT, sizeof(float));
    ctrl_cpu_f32_to_bf16(wb, w, (int64_t)OUT * IN), ctrl_cpu_bf16_to_f32(wr, wb, (int64_t)OUT * IN);
    CHECK_EQ_INT(ctrl_cpu_linear_forward_bf16(y16r, x, wr, bias, T, IN, OUT, 1), 0);
    CHECK_EQ_INT(ctrl_cpu_linear_backward_bf16(dx16r, dw16r, db16r, dout, x, wr, T, IN, OUT, 1), 0);
    CHECK(memcmp(y16r, y16, sizeof(float) * T * OUT) == 0 &&
          memcmp(dx16r, dx16, sizeof(float) * T * IN) == 0 &&
          memcmp(dw16r, dw16, sizeof(float) * OUT * IN) == 0);
    free(wb), free(wr), free(y16r), free(dx16r), free(dw16r), free(db16r);
    free(x), free(w), free(bias), free(dout), free(y32), free(y16), free(dx32), free(dx16), free(dw32),
        free(dw16);
    free(db32), free(db16);
}
