/* bf16 on the CPU: conversions (round to nearest even, as torch's .to(torch.bfloat16)) and the
 * GEMM that bf16 linear layers need, C[M,N] (+)= A[M,K] B[N,K]^T with bf16 inputs and fp32
 * accumulation. Where the CPU has AVX-512 BF16 (checked at run time) the products go through
 * vdpbf16ps on 4 x 4 register tiles; elsewhere a portable loop computes the same sums in fp32. */
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
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) dst[i] = to_bf16(src[i]);
}

void ctrl_cpu_bf16_to_f32(float *dst, const uint16_t *src, int64_t n) {
#pragma omp parallel for schedule(static)
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
/* One 4 x 4 tile (fewer at the edges) of C: rows i0.., columns j0.., over all of K in steps of 32. */
__attribute__((target("avx512f,avx512bw,avx512bf16"))) static void tile_4x4(float *C, const uint16_t *A,
                                                                            const uint16_t *B, int N, int K,
                                                                            int i0, int mi, int j0, int nj,
                                                                            int accumulate) {
    __m512 acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 32) {
        const __mmask32 mask = K - k >= 32 ? 0xFFFFFFFFu : (1u << (K - k)) - 1u;
        __m512i a[4], b[4];
        for (int i = 0; i < mi; i++) a[i] = _mm512_maskz_loadu_epi16(mask, A + (size_t)(i0 + i) * K + k);
        for (int j = 0; j < nj; j++) b[j] = _mm512_maskz_loadu_epi16(mask, B + (size_t)(j0 + j) * K + k);
        for (int i = 0; i < mi; i++)
            for (int j = 0; j < nj; j++)
                acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)a[i], (__m512bh)b[j]);
    }
    for (int i = 0; i < mi; i++)
        for (int j = 0; j < nj; j++) {
            float *c = C + (size_t)(i0 + i) * N + j0 + j;
            const float s = _mm512_reduce_add_ps(acc[i][j]);
            *c = accumulate ? *c + s : s;
        }
}

static void gemm_nt_avx512bf16(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K,
                               int accumulate) {
    enum { JB = 128 }; /* columns per pass: their rows of B stay in L2 */
    for (int jb = 0; jb < N; jb += JB) {
        const int je = jb + JB < N ? jb + JB : N;
#pragma omp parallel for schedule(static)
        for (int i0 = 0; i0 < M; i0 += 4)
            for (int j0 = jb; j0 < je; j0 += 4)
                tile_4x4(C, A, B, N, K, i0, M - i0 < 4 ? M - i0 : 4, j0, je - j0 < 4 ? je - j0 : 4,
                         accumulate);
    }
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
    if (ctrl_cpu_has_avx512bf16()) {
        gemm_nt_avx512bf16(C, A, B, M, N, K, accumulate);
        return;
    }
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

int ctrl_cpu_linear_forward_bf16(float *out, const float *x, const float *w, const float *bias, int T, int IN,
                                 int OUT) {
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
                                  const float *w, int T, int IN, int OUT) {
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
