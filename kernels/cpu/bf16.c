/* bf16 on the CPU: conversions (round to nearest even, as torch's .to(torch.bfloat16)) and the
 * GEMM that bf16 linear layers need, C[M,N] (+)= A[M,K] B[N,K]^T with bf16 inputs and fp32
 * accumulation. Where the CPU has AVX-512 BF16 (checked at run time) B is packed in (k, k+1) pairs
 * of 16 columns and a 6 x 32 register tile broadcasts pairs of A into vdpbf16ps; elsewhere (or
 * when the packing buffer cannot be had) a portable loop computes the same sums in fp32. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"

static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu))
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7FFFu + ((u >> 16) & 1u);         /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void ctrl_cpu_f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
#pragma omp parallel for schedule(                                                                           \
    static) if (n >= 16384) /* a parallel region costs more than a few thousand conversions */
    for (int64_t i = 0; i < n; i++) dst[i] = to_bf16(src[i]);
}

void ctrl_cpu_bf16_to_f32(float *dst, const uint16_t *src, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= 16384)
    for (int64_t i = 0; i < n; i++) dst[i] = from_bf16(src[i]);
}

static void gemm_nt_portable(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K,
                             int accumulate) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            const uint16_t *a = A + (size_t)i * K, *b = B + (size_t)j * K;
            for (int k = 0; k < K; k++) s += from_bf16(a[k]) * from_bf16(b[k]);
            C[(size_t)i * N + j] = accumulate ? C[(size_t)i * N + j] + s : s;
        }
}

#if defined(__GNUC__) && !defined(__clang__) && (__GNUC__ >= 11)
#define CTRL_HAVE_AVX512BF16_CODE 1
/* B[N, K] packed for the micro-kernel: for each group of 16 columns, K/2 vectors of 16 (k, k+1)
 * pairs (zero padded), so that one 512-bit load feeds 16 outputs. */
static uint16_t *pack_b(const uint16_t *B, int N, int K) {
    const int K2 = (K + 1) / 2, NG = (N + 15) / 16;
    uint16_t *p = calloc((size_t)NG * K2 * 32, sizeof(uint16_t));
    if (!p) return NULL;
#pragma omp parallel for schedule(static)
    for (int g = 0; g < NG; g++)
        for (int k2 = 0; k2 < K2; k2++)
            for (int c = 0; c < 16 && g * 16 + c < N; c++)
                for (int h = 0; h < 2 && 2 * k2 + h < K; h++)
                    p[(((size_t)g * K2 + k2) * 16 + c) * 2 + h] = B[(size_t)(g * 16 + c) * K + 2 * k2 + h];
    return p;
}

/* Rows [i0, i0 + mi) (mi <= 6) x column groups [g0, g0 + ng) (ng <= 2) of C: each (k, k+1) pair of a
 * row of A is broadcast and multiplied into 16 packed columns at once. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void micro(float *C, const uint16_t *A,
                                                                         const uint16_t *Bp, int N, int K,
                                                                         int i0, int mi, int g0, int ng,
                                                                         int accumulate) {
    const int K2 = (K + 1) / 2;
    __m512 acc[6][2];
    for (int i = 0; i < 6; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int k2 = 0; k2 < K2; k2++) {
        __m512i b0 = _mm512_loadu_si512(Bp + (((size_t)g0 * K2 + k2) * 16) * 2);
        __m512i b1 = ng > 1 ? _mm512_loadu_si512(Bp + (((size_t)(g0 + 1) * K2 + k2) * 16) * 2) : b0;
        for (int i = 0; i < mi; i++) {
            const uint16_t *a = A + (size_t)(i0 + i) * K + 2 * k2;
            uint32_t pair = a[0] | (2 * k2 + 1 < K ? (uint32_t)a[1] << 16 : 0u);
            const __m512i av = _mm512_set1_epi32((int)pair);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)av, (__m512bh)b0);
            if (ng > 1) acc[i][1] = _mm512_dpbf16_ps(acc[i][1], (__m512bh)av, (__m512bh)b1);
        }
    }
    for (int i = 0; i < mi; i++)
        for (int g = 0; g < ng; g++) {
            const int j0 = (g0 + g) * 16, nj = N - j0 < 16 ? N - j0 : 16;
            const __mmask16 m = (__mmask16)((1u << nj) - 1u);
            float *c = C + (size_t)(i0 + i) * N + j0;
            __m512 v = acc[i][g];
            if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, c));
            _mm512_mask_storeu_ps(c, m, v);
        }
}

static int gemm_nt_avx512bf16(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K,
                              int accumulate) {
    uint16_t *Bp = pack_b(B, N, K);
    if (!Bp) return -1;
    const int NG = (N + 15) / 16, MB = (M + 5) / 6;
#pragma omp parallel for collapse(2) schedule(static)
    for (int gb = 0; gb < NG; gb += 2)
        for (int ib = 0; ib < MB; ib++) {
            const int i0 = ib * 6;
            micro(C, A, Bp, N, K, i0, M - i0 < 6 ? M - i0 : 6, gb, NG - gb < 2 ? NG - gb : 2, accumulate);
        }
    free(Bp);
    return 0;
}
#endif

int ctrl_cpu_has_avx512bf16(void) {
#ifdef CTRL_HAVE_AVX512BF16_CODE
    static int cached = -1;
    if (cached < 0) cached = __builtin_cpu_supports("avx512bf16") && !getenv("CTRL_NO_AVX512BF16");
    return cached;
#else
    return 0;
#endif
}

void ctrl_cpu_gemm_bf16_nt(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K,
                           int accumulate) {
#ifdef CTRL_HAVE_AVX512BF16_CODE
    if (ctrl_cpu_has_avx512bf16() && gemm_nt_avx512bf16(C, A, B, M, N, K, accumulate) == 0) return;
#endif
    gemm_nt_portable(C, A, B, M, N, K, accumulate);
}

/* bf16 copy of src[R, Cc] transposed to [Cc, R]. */
static uint16_t *transposed_bf16(const float *src, int R, int Cc) {
    uint16_t *t = malloc(sizeof(uint16_t) * (size_t)R * Cc);
    if (!t) return NULL;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < Cc; c++)
        for (int r = 0; r < R; r++) t[(size_t)c * R + r] = to_bf16(src[(size_t)r * Cc + c]);
    return t;
}

void ctrl_cpu_round_to_bf16(float *dst, const float *src, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) dst[i] = from_bf16(to_bf16(src[i]));
}

/* fp32 copy of src[n] rounded to bf16 values: where the CPU has no bf16 dot products, bf16
 * inputs times bf16 inputs are exact in fp32, so SGEMM on rounded copies gives the same products
 * with fp32 accumulation at SGEMM's speed. */
static float *rounded_f32(const float *src, int64_t n) {
    float *r = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (r) ctrl_cpu_round_to_bf16(r, src, n);
    return r;
}

int ctrl_cpu_linear_forward_bf16(float *out, const float *x, const float *w, const float *bias, int T, int IN,
                                 int OUT, int w_rounded) {
    if (!ctrl_cpu_has_avx512bf16()) {
        float *xr = rounded_f32(x, (int64_t)T * IN),
              *wr = w_rounded ? NULL : rounded_f32(w, (int64_t)OUT * IN);
        const int rc = xr && (wr || w_rounded) ? 0 : -1;
        if (rc == 0) ctrl_cpu_linear_forward(out, xr, wr ? wr : w, bias, T, IN, OUT);
        free(xr), free(wr);
        return rc;
    }
    uint16_t *xb = malloc(sizeof(uint16_t) * (size_t)T * IN),
             *wb = malloc(sizeof(uint16_t) * (size_t)OUT * IN);
    if (!xb || !wb) return free(xb), free(wb), -1;
    ctrl_cpu_f32_to_bf16(xb, x, (int64_t)T * IN);
    ctrl_cpu_f32_to_bf16(wb, w, (int64_t)OUT * IN);
    ctrl_cpu_gemm_bf16_nt(out, xb, wb, T, OUT, IN, 0);
    if (bias)
#pragma omp parallel for schedule(static)
        for (int t = 0; t < T; t++)
            for (int o = 0; o < OUT; o++) out[(size_t)t * OUT + o] += bias[o];
    free(xb), free(wb);
    return 0;
}

int ctrl_cpu_linear_backward_bf16(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                                  const float *w, int T, int IN, int OUT, int w_rounded) {
    if (!ctrl_cpu_has_avx512bf16()) {
        float *dr = rounded_f32(dout, (int64_t)T * OUT), *xr = rounded_f32(x, (int64_t)T * IN),
              *wr = dx && !w_rounded ? rounded_f32(w, (int64_t)OUT * IN) : NULL;
        const int rc = dr && xr && (wr || !dx || w_rounded) ? 0 : -1;
        /* the bias gradient sums the unrounded dout, as the AVX-512 path does */
        if (rc == 0) ctrl_cpu_linear_backward(dx, dw, NULL, dr, xr, wr ? wr : w, T, IN, OUT);
        if (rc == 0 && dbias)
            for (int t = 0; t < T; t++)
                for (int o = 0; o < OUT; o++) dbias[o] += dout[(size_t)t * OUT + o];
        free(dr), free(xr), free(wr);
        return rc;
    }
    int rc = 0;
    if (dx) { /* dx[T, IN] = dout[T, OUT] W[OUT, IN]: B = W^T as [IN, OUT] rows */
        uint16_t *db = malloc(sizeof(uint16_t) * (size_t)T * OUT), *wt = transposed_bf16(w, OUT, IN);
        if (db && wt) {
            ctrl_cpu_f32_to_bf16(db, dout, (int64_t)T * OUT);
            ctrl_cpu_gemm_bf16_nt(dx, db, wt, T, IN, OUT, 0);
        } else {
            rc = -1;
        }
        free(db), free(wt);
    }
    if (dw && rc == 0) { /* dW[OUT, IN] += dout^T x: A = dout^T [OUT, T], B = x^T [IN, T] */
        uint16_t *dt = transposed_bf16(dout, T, OUT), *xt = transposed_bf16(x, T, IN);
        if (dt && xt)
            ctrl_cpu_gemm_bf16_nt(dw, dt, xt, OUT, IN, T, 1);
        else
            rc = -1;
        free(dt), free(xt);
    }
    if (dbias && rc == 0)
        for (int t = 0; t < T; t++)
            for (int o = 0; o < OUT; o++) dbias[o] += dout[(size_t)t * OUT + o];
    return rc;
}
