// ctrl's CUDA emulator: cuBLASLt's matmul on OpenBLAS (see include/cublasLt.h for the subset).
#include <cblas.h>
#include <cuda_bf16.h>
#include <cublasLt.h>

#include <stdlib.h>
#include <string.h>

#include <new>
#include <vector>

struct ctrl_emu_lt {
    int unused;
};
struct ctrl_emu_lt_desc {
    cublasOperation_t opa = CUBLAS_OP_N, opb = CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr;
};
struct ctrl_emu_lt_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
// min_align: the operands' (A, B, C, D) declared alignment in bytes; cuBLASLt assumes 256 when
// none is declared.
struct ctrl_emu_lt_pref {
    size_t workspace = 0;
    uint32_t min_align[4] = {256, 256, 256, 256};
};

namespace {

float bf16_to_f32(uint16_t h) { return __bfloat162float(__nv_bfloat16{h}); }
uint16_t f32_to_bf16(float f) { return __float2bfloat16_rn(f).bits; }

// A stored matrix as fp32 (a copy when it is bf16), same leading dimension.
const float *as_f32(const void *p, const ctrl_emu_lt_layout *l, std::vector<float> &tmp) {
    if (l->type == CUDA_R_32F) return static_cast<const float *>(p);
    const size_t n = (size_t)l->ld * (l->cols ? l->cols - 1 : 0) + l->rows;
    tmp.resize(n);
    const uint16_t *h = static_cast<const uint16_t *>(p);
    for (uint64_t c = 0; c < l->cols; c++)
        for (uint64_t r = 0; r < l->rows; r++) tmp[c * l->ld + r] = bf16_to_f32(h[c * l->ld + r]);
    return tmp.data();
}

template <class T> cublasStatus_t make(T **out) {
    *out = new (std::nothrow) T{};
    return *out ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) { return make(handle); }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
    // Only true fp32 compute with fp32 scales is emulated; TF32 would need its rounding.
    if (compute != CUBLAS_COMPUTE_32F || scale_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    return make(desc);
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
        if (size != sizeof desc->opa) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&desc->opa, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if (size != sizeof desc->opb) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&desc->opb, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (size != sizeof desc->epilogue) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&desc->epilogue, buf, size);
        return desc->epilogue == CUBLASLT_EPILOGUE_DEFAULT || desc->epilogue == CUBLASLT_EPILOGUE_BIAS
                   ? CUBLAS_STATUS_SUCCESS
                   : CUBLAS_STATUS_NOT_SUPPORTED;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (size != sizeof desc->bias) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&desc->bias, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if ((type != CUDA_R_32F && type != CUDA_R_16BF) || ld < (int64_t)rows || ld < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t s = make(layout);
    if (s == CUBLAS_STATUS_SUCCESS) **layout = ctrl_emu_lt_layout{type, rows, cols, ld};
    return s;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) { return make(pref); }
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size) {
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (size != sizeof pref->workspace) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&pref->workspace, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
        attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&pref->min_align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t *results, int *found) {
    (void)handle, (void)desc, (void)a, (void)b, (void)c, (void)d;
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    // Two answers where two or more are asked for (the same algorithm: one arithmetic here), so that a
    // caller choosing among candidates (gemm.cu's CTRL_CUDA_GEMM_TUNE) runs its choice.
    *found = requested < 2 ? 1 : 2;
    memset(results, 0, sizeof *results * (size_t)*found);
    // As a real GPU's algorithms: vectorised (16-byte) loads and stores wherever the declared
    // alignment allows them; the algorithm then refuses operands that are less aligned.
    for (int r = 0; r < *found; r++)
        for (int i = 0; i < 4; i++)
            results[r].algo.data[i] = pref->min_align[i] < 16 ? pref->min_align[i] : 16;
    return CUBLAS_STATUS_SUCCESS;
}

// ctrl_emu_matmuls: the matmuls run, [0] on bf16 operands, [1] on fp32 ones.
static long g_matmuls[2];
long ctrl_emu_matmuls(int fp32) { return __atomic_load_n(&g_matmuls[fp32 ? 1 : 0], __ATOMIC_RELAXED); }
void ctrl_emu_reset_matmuls(void) {
    __atomic_store_n(&g_matmuls[0], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_matmuls[1], 0, __ATOMIC_RELAXED);
}

// D = alpha op(A) op(B) + beta C (+ bias[row]), column-major; D must be C (the project's only use).
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t la, const void *B,
                              cublasLtMatrixLayout_t lb, const void *beta, const void *C,
                              cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
    (void)handle, (void)workspace, (void)workspace_bytes, (void)stream;
    if (C != D || lc->type != ld->type || lc->ld != ld->ld) return CUBLAS_STATUS_NOT_SUPPORTED;
    const void *operands[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        if (algo->data[i] > 1 && (uintptr_t)operands[i] % algo->data[i] != 0)
            return CUBLAS_STATUS_NOT_SUPPORTED;
    __atomic_add_fetch(&g_matmuls[la->type == CUDA_R_32F], 1, __ATOMIC_RELAXED);
    const bool ta = desc->opa == CUBLAS_OP_T, tb = desc->opb == CUBLAS_OP_T;
    const uint64_t m = lc->rows, n = lc->cols, k = ta ? la->rows : la->cols;
    if ((ta ? la->cols : la->rows) != m || (tb ? lb->rows : lb->cols) != n ||
        (tb ? lb->cols : lb->rows) != k || la->type != lb->type)
        return CUBLAS_STATUS_INVALID_VALUE;
    const float al = *static_cast<const float *>(alpha), be = *static_cast<const float *>(beta);
    std::vector<float> ta_tmp, tb_tmp, c_tmp;
    const float *a = as_f32(A, la, ta_tmp), *b = as_f32(B, lb, tb_tmp);
    float *c = lc->type == CUDA_R_32F ? static_cast<float *>(D) : const_cast<float *>(as_f32(D, lc, c_tmp));
    if (k == 0) {
        // cblas with k = 0 scales C by beta; beta = 0 must not read C (it may hold NaN)
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) c[j * lc->ld + i] = be == 0.0f ? 0.0f : be * c[j * lc->ld + i];
    } else {
        cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m,
                    (int)n, (int)k, al, a, (int)la->ld, b, (int)lb->ld, be, c, (int)lc->ld);
    }
    if (desc->epilogue == CUBLASLT_EPILOGUE_BIAS && desc->bias) {
        if (lc->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
        const float *bias = static_cast<const float *>(desc->bias);
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) c[j * lc->ld + i] += bias[i];
    }
    if (lc->type == CUDA_R_16BF) {
        uint16_t *h = static_cast<uint16_t *>(D);
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) h[j * lc->ld + i] = f32_to_bf16(c[j * lc->ld + i]);
    }
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
