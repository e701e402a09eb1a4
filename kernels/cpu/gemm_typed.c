/* The backend's typed GEMM on the CPU (ctrl_backend_ops.gemm): row-major C = alpha op(A) op(B) +
 * beta C over fp32 or bf16 operands, as the CUDA backend's cuBLASLt call computes it -- bf16 values
 * widened to fp32 exactly, fp32 accumulation, a bf16 result rounded to nearest even. The bf16
 * operands are widened into scratch first (this path is for completeness and tests, not speed). */
#include <cblas.h>
#include <stdlib.h>

#include "cpu/cpu_ops.h"

/* rows x cols of a bf16 matrix with leading dimension ld, widened to a dense fp32 copy (ld = cols). */
static float *widen(const uint16_t *src, int rows, int cols, int ld) {
    float *dst = malloc((size_t)(rows > 0 ? rows : 1) * (size_t)(cols > 0 ? cols : 1) * sizeof *dst);
    if (!dst) return NULL;
    for (int r = 0; r < rows; r++) ctrl_cpu_bf16_to_f32(dst + (size_t)r * cols, src + (size_t)r * ld, cols);
    return dst;
}

int ctrl_cpu_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                  const void *B, int ldb, float beta, void *C, int ldc, ctrl_dtype ab, ctrl_dtype c) {
    if ((ab != CTRL_F32 && ab != CTRL_BF16) || (c != CTRL_F32 && c != CTRL_BF16) ||
        (ab == CTRL_F32 && c != CTRL_F32))
        return -2;
    if (M == 0 || N == 0) return 0;
    const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
    if (ab == CTRL_F32) {
        cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return 0;
    }
    const int ar = trans_a ? K : M, ac = trans_a ? M : K, br = trans_b ? N : K, bc = trans_b ? K : N;
    float *a32 = widen(A, ar, ac, lda), *b32 = widen(B, br, bc, ldb);
    float *c32 = c == CTRL_BF16 ? widen(C, M, N, ldc) : (float *)C;
    int rc = -1;
    if (a32 && b32 && c32) {
        cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, a32, ac, b32, bc, beta, c32,
                    c == CTRL_BF16 ? N : ldc);
        if (c == CTRL_BF16)
            for (int r = 0; r < M; r++)
                ctrl_cpu_f32_to_bf16((uint16_t *)C + (size_t)r * ldc, c32 + (size_t)r * N, N);
        rc = 0;
    }
    free(a32), free(b32);
    if (c == CTRL_BF16) free(c32);
    return rc;
}
