/* Token embedding: a row gather forward, a scatter-add backward; and a frozen table held as bf16
 * values (2 bytes a value: LoRA's [peft] embedding_dtype = bf16), its rows widened as they are
 * gathered, and products with it as the B operand. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"

void ctrl_cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        memcpy(out + (size_t)t * C, wte + (size_t)tokens[t] * C, sizeof(float) * (size_t)C);
}

void ctrl_cpu_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int T, int C) {
    /* Parallel over channels: a token id repeated in the batch accumulates without races, in
     * token order, so the result does not depend on the thread count. */
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++)
        for (int t = 0; t < T; t++) /* a negative id contributes nothing (nn.Embedding's padding_idx) */
            if (tokens[t] >= 0) dwte[(size_t)tokens[t] * C + c] += dout[(size_t)t * C + c];
}

void ctrl_cpu_embedding_forward_bf16(float *out, const int32_t *tokens, const uint16_t *wte16, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) ctrl_cpu_bf16_to_f32(out + (size_t)t * C, wte16 + (size_t)tokens[t] * C, C);
}

/* n bf16 values widened to fp32 (exact), without an OpenMP region of its own (called per row). */
static void widen(float *dst, const uint16_t *src, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) {
        const union {
            uint32_t u;
            float f;
        } v = {.u = (uint32_t)src[i] << 16};
        dst[i] = v.f;
    }
}

/* C[M, N] (ldc apart) *= s. */
static void scale_rows(float *C, float s, int M, int N, int ldc) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] *= s;
}

/* B's stored rows are widened a block at a time into fp32 scratch (about 4 MiB: in cache, reused
 * from the heap) and multiplied there by the GEMM's fast fp32 packing (packing the bf16 values
 * directly, or through ctrl_cpu_gemm_bf16_source's callbacks, ran 3-6x slower at the LM head's
 * shape). Split along N (trans_b) a column's sum is untouched; split along K (bf16), the blocks are
 * whole multiples of the running kernel's depth block (ctrl_cpu_gemm_bf16_depth_block), so the sums
 * run in the order of the unsplit product. */
#define W16_BLOCK_FLOATS (1 << 20)

int ctrl_cpu_gemm_w16(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                      const uint16_t *B, int ldb, float *C, int ldc, int accumulate, int bf16) {
    if (alpha != 1.0f && (accumulate || !trans_b)) return -1; /* not a product the callers form */
    if (M <= 0 || N <= 0) return 0;
    /* B's stored rows (trans_b: the N rows of [N, K]; else the K rows of [K, N]) a block at a time */
    const int rows = trans_b ? N : K, len = trans_b ? K : N;
    if (rows <= 0 || len <= 0) { /* an empty sum */
        for (int i = 0; i < M && !accumulate; i++) memset(C + (size_t)i * ldc, 0, sizeof(float) * (size_t)N);
        return 0;
    }
    int rb = W16_BLOCK_FLOATS / len;
    const int kb = bf16 && !trans_b ? ctrl_cpu_gemm_bf16_depth_block(N, K) : 0;
    if (kb > 0) rb = rb < kb ? kb : rb / kb * kb;
    rb = rb < 1 ? 1 : rb > rows ? rows : rb;
    float *w = malloc(sizeof(float) * (size_t)rb * (size_t)len);
    if (!w) return -1;
    for (int r0 = 0; r0 < rows; r0 += rb) {
        const int n = r0 + rb <= rows ? rb : rows - r0;
#pragma omp parallel for schedule(static)
        for (int r = 0; r < n; r++) widen(w + (size_t)r * len, B + (size_t)(r0 + r) * ldb, len);
        if (trans_b) { /* C[:, r0 : r0 + n] = op(A) W^T: columns of their own */
            float *c = C + r0;
            if (bf16 && ctrl_cpu_gemm_bf16(trans_a, 1, M, n, K, A, lda, w, len, c, ldc, accumulate) == 0) {
                if (alpha != 1.0f) scale_rows(c, alpha, M, n, ldc);
            } else
                cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, CblasTrans, M, n, K, alpha, A,
                            lda, w, len, accumulate ? 1.0f : 0.0f, c, ldc);
        } else { /* C (+)= op(A)[:, r0 : r0 + n] W: a part of the sum */
            const float *a = trans_a ? A + (size_t)r0 * lda : A + r0;
            const int acc = accumulate || r0 > 0;
            if (!(bf16 && ctrl_cpu_gemm_bf16(trans_a, 0, M, N, n, a, lda, w, len, C, ldc, acc) == 0))
                cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, CblasNoTrans, M, N, n, 1.0f,
                            a, lda, w, len, acc ? 1.0f : 0.0f, C, ldc);
        }
    }
    free(w);
    return 0;
}
