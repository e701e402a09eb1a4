// Linear layers through cuBLASLt, in the Hugging Face layout (W is [OUT, IN], row-major).
// Row-major out[T, OUT] = x[T, IN] W^T is, read column-major, out^T = W^T' x^T: so cuBLASLt sees
// A = W stored as an IN x OUT column-major matrix with op(A) = A^T, B = x^T (IN x T), C = out^T
// (OUT x T): m = OUT, n = T, k = IN. The bias is added by the epilogue.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "cuda/cuda_ops.h"
#include "device/cuda_check.h"

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;

cublasLtHandle_t lt_handle = nullptr;
void *lt_workspace = nullptr;

ctrl_status ensure_handle() {
    if (!lt_handle) {
        CTRL_CUBLAS_CHECK(cublasLtCreate(&lt_handle));
        ctrl_status st = ctrl_cuda_malloc(&lt_workspace, kWorkspaceBytes);
        if (st != CTRL_OK) return st;
    }
    return CTRL_OK;
}

// One matmul C = op(A) B (+ bias) with the given types; layouts as described above.
ctrl_status lt_linear(void *out, const void *x, const void *w, const void *bias, int T, int IN, int OUT,
                      cudaDataType_t io_type, cublasComputeType_t compute) {
    ctrl_status st = ensure_handle();
    if (st != CTRL_OK) return st;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ctrl_status result = CTRL_OK;
    const float alpha = 1.0f, beta = 0.0f;
    cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    size_t ws = kWorkspaceBytes;
    cublasLtMatmulHeuristicResult_t heur = {};
    int found = 0;
#define LT(call)                                                                                            \
    do {                                                                                                    \
        cublasStatus_t s_ = (call);                                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                  \
            result = ctrl_error_set(CTRL_ERR_DEVICE, "%s:%d: %s: cuBLAS status %d (T=%d IN=%d OUT=%d)",     \
                                    __FILE__, __LINE__, #call, (int)s_, T, IN, OUT);                        \
            goto done;                                                                                      \
        }                                                                                                   \
    } while (0)
    LT(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    if (bias) LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    LT(cublasLtMatrixLayoutCreate(&a, io_type, IN, OUT, IN));
    LT(cublasLtMatrixLayoutCreate(&b, io_type, IN, T, IN));
    LT(cublasLtMatrixLayoutCreate(&c, io_type, OUT, T, OUT));
    LT(cublasLtMatmulPreferenceCreate(&pref));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    LT(cublasLtMatmulAlgoGetHeuristic(lt_handle, desc, a, b, c, c, pref, 1, &heur, &found));
    if (!found) {
        result = ctrl_error_set(CTRL_ERR_DEVICE, "cuBLASLt: no algorithm for linear T=%d IN=%d OUT=%d", T, IN, OUT);
        goto done;
    }
    LT(cublasLtMatmul(lt_handle, desc, &alpha, w, a, x, b, &beta, out, c, out, c, &heur.algo, lt_workspace,
                      kWorkspaceBytes, 0));
#undef LT
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return result;
}

} // namespace

// Called by ctrl_cuda_shutdown().
extern "C" void ctrl_cuda_linear_release(void) {
    if (lt_handle) cublasLtDestroy(lt_handle);
    if (lt_workspace) ctrl_cuda_free(lt_workspace);
    lt_handle = nullptr;
    lt_workspace = nullptr;
}

extern "C" ctrl_status ctrl_cuda_linear_forward_f32(float *out, const float *x, const float *w, const float *bias,
                                                    int T, int IN, int OUT) {
    // CUBLAS_COMPUTE_32F is true fp32 (TF32 would be CUBLAS_COMPUTE_32F_FAST_TF32).
    return lt_linear(out, x, w, bias, T, IN, OUT, CUDA_R_32F, CUBLAS_COMPUTE_32F);
}

extern "C" ctrl_status ctrl_cuda_linear_forward_bf16(uint16_t *out, const uint16_t *x, const uint16_t *w, int T,
                                                     int IN, int OUT) {
    return lt_linear(out, x, w, nullptr, T, IN, OUT, CUDA_R_16BF, CUBLAS_COMPUTE_32F);
}
