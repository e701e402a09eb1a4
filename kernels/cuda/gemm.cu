// GEMMs through cuBLASLt. cuBLASLt is column-major; ctrl's buffers are row-major. A row-major
// matrix read column-major is its transpose, so row-major C = op(A) op(B) is computed as
// column-major C^T = op(B)^T op(A)^T: the operands swap places and keep their op flags.
// Linear layers (W is [OUT, IN]): out^T = W^T' x^T, i.e. m = OUT, n = T, k = IN with op(W) = T.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
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

// The largest power of two (at most 256) that divides p's address. cuBLASLt's heuristic assumes
// 256-byte aligned operands unless told otherwise, and an algorithm it picks on that assumption
// refuses (CUBLAS_STATUS_NOT_SUPPORTED) a view that starts inside a buffer, such as a row offset
// of a bf16 matrix with an odd number of columns: every call declares what its pointers have.
uint32_t alignment_of(const void *p) {
    const uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a & (al - 1))) al >>= 1;
    return al;
}

// cuBLASLt's heuristic answers, by problem: asking costs tens of microseconds a call, and a
// training step makes the same few hundred GEMMs every step. A direct-mapped table; a slot's
// problem is replaced by the next one that hashes there.
struct AlgoKey {
    int m, n, k, lda, ldb, ldc, ta, tb, bias, type, c_type, compute;
    uint32_t al_a, al_b, al_c;
};
struct AlgoSlot {
    AlgoKey key;
    cublasLtMatmulAlgo_t algo;
    bool valid;
};
constexpr int kAlgoSlots = 1024;
AlgoSlot algo_cache[kAlgoSlots];
pthread_mutex_t algo_lock = PTHREAD_MUTEX_INITIALIZER;
long algo_queries; // heuristic queries made (ctrl_cuda_gemm_heuristic_queries)

int algo_slot(const AlgoKey &key) {
    const unsigned char *p = reinterpret_cast<const unsigned char *>(&key);
    uint32_t h = 2166136261u; // FNV-1a over the key's bytes (all ints: no padding)
    for (size_t i = 0; i < sizeof key; i++) h = (h ^ p[i]) * 16777619u;
    return (int)(h % kAlgoSlots);
}
bool algo_lookup(const AlgoKey &key, cublasLtMatmulAlgo_t *algo) {
    pthread_mutex_lock(&algo_lock);
    const AlgoSlot &s = algo_cache[algo_slot(key)];
    const bool hit = s.valid && !memcmp(&s.key, &key, sizeof key);
    if (hit) *algo = s.algo;
    pthread_mutex_unlock(&algo_lock);
    return hit;
}
void algo_store(const AlgoKey &key, const cublasLtMatmulAlgo_t &algo) {
    pthread_mutex_lock(&algo_lock);
    algo_cache[algo_slot(key)] = AlgoSlot{key, algo, true};
    pthread_mutex_unlock(&algo_lock);
}

// CTRL_CUDA_GEMM_LOG=1: each problem on stderr when the heuristic is first asked for it (once per
// distinct problem), with the algorithm it chose -- what maps a profiler's cuBLAS kernel (an
// sm80-style `Kernel2` among sm90 nvjet kernels) to the product that launches it.
const char *type_name(int t) { return t == CUDA_R_16BF ? "bf16" : t == CUDA_R_32F ? "fp32" : "other"; }
void log_problem(const AlgoKey &k, const cublasLtMatmulAlgo_t &algo) {
    int id = -1, tile = -1, stages = -1, splitk = -1, reduction = -1, swizzle = -1;
#ifndef CTRL_CUDA_EMU
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages,
                                         nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk,
                                         nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction,
                                         sizeof reduction, nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof swizzle,
                                         nullptr);
#else
    (void)algo;
#endif
    fprintf(
        stderr,
        "cuda gemm: column-major m=%d n=%d k=%d op(A)=%c op(B)=%c lda=%d ldb=%d ldc=%d A,B %s C %s bias %d "
        "align %u/%u/%u -> algo %d tile %d stages %d split-k %d reduction %d swizzle %d\n",
        k.m, k.n, k.k, k.ta ? 'T' : 'N', k.tb ? 'T' : 'N', k.lda, k.ldb, k.ldc, type_name(k.type),
        type_name(k.c_type), k.bias, k.al_a, k.al_b, k.al_c, id, tile, stages, splitk, reduction, swizzle);
}

// CTRL_CUDA_GEMM_TUNE=1: the heuristic's first kTuneCandidates answers for a new problem are timed
// on it (a warm-up, then 3 runs between two events, into scratch: C is not touched) and the fastest
// is cached instead of the heuristic's first; the first step pays for it (a few ms a problem). Off by
// default: a different algorithm sums in a different order, so two runs could differ in the last bits.
constexpr int kTuneCandidates = 8;
int tune_pick(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
              cublasLtMatrixLayout_t lc, const cublasLtMatmulHeuristicResult_t *cand, int found,
              const void *A, const void *B, float beta, size_t c_bytes, float *best_ms) {
    void *scratch = nullptr;
    if (ctrl_cuda_malloc(&scratch, c_bytes) != CTRL_OK) return 0;
    cudaMemset(scratch, 0, c_bytes);
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    const float one = 1.0f;
    int best = 0;
    *best_ms = -1;
    for (int i = 0; i < found; i++) {
        auto run = [&] {
            return cublasLtMatmul(lt_handle, desc, &one, A, la, B, lb, &beta, scratch, lc, scratch, lc,
                                  &cand[i].algo, lt_workspace, kWorkspaceBytes, 0);
        };
        if (run() != CUBLAS_STATUS_SUCCESS) continue;
        cudaEventRecord(e0, 0);
        bool ok = true;
        for (int r = 0; r < 3 && ok; r++) ok = run() == CUBLAS_STATUS_SUCCESS;
        cudaEventRecord(e1, 0);
        float ms = 0;
        if (!ok || cudaEventSynchronize(e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
            continue;
        if (*best_ms < 0 || ms / 3 < *best_ms) best = i, *best_ms = ms / 3;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaGetLastError(); // a candidate's failure is not the caller's
    ctrl_cuda_free(scratch);
    return best;
}

// Column-major D = alpha op(A) op(B) + beta C (C = D in place), op(A) m x k, op(B) k x n; A and B
// of `type`, C of `c_type` (bf16 operands with an fp32 result: CUDA_R_16BF, CUDA_R_32F).
ctrl_status lt_matmul(bool ta, bool tb, int m, int n, int k, float alpha, const void *A, int lda,
                      const void *B, int ldb, float beta, void *C, int ldc, const void *bias,
                      cudaDataType_t type, cudaDataType_t c_type, cublasComputeType_t compute) {
    if (m == 0 || n == 0) return CTRL_OK;
    ctrl_status st = ensure_handle();
    if (st != CTRL_OK) return st;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ctrl_status result = CTRL_OK;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    size_t ws = kWorkspaceBytes;
    cublasLtMatmulHeuristicResult_t heur = {};
    int found = 0;
#define LT(call)                                                                                             \
    do {                                                                                                     \
        cublasStatus_t s_ = (call);                                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                   \
            result = ctrl_error_set(CTRL_ERR_DEVICE, "%s:%d: %s: cuBLAS status %d (m=%d n=%d k=%d)",         \
                                    __FILE__, __LINE__, #call, (int)s_, m, n, k);                            \
            goto done;                                                                                       \
        }                                                                                                    \
    } while (0)
    LT(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    if (bias) LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    // Layouts describe the matrices as stored.
    LT(cublasLtMatrixLayoutCreate(&la, type, ta ? k : m, ta ? m : k, lda));
    LT(cublasLtMatrixLayoutCreate(&lb, type, tb ? n : k, tb ? k : n, ldb));
    LT(cublasLtMatrixLayoutCreate(&lc, c_type, m, n, ldc));
    {
        const uint32_t al_a = alignment_of(A), al_b = alignment_of(B), al_c = alignment_of(C);
        const AlgoKey key = {
            m,    n,    k,   lda, ldb, ldc, ta, tb, bias != nullptr, (int)type, (int)c_type, (int)compute,
            al_a, al_b, al_c};
        if (algo_lookup(key, &heur.algo)) goto run;
        LT(cublasLtMatmulPreferenceCreate(&pref));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                sizeof ws));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                sizeof al_a));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                sizeof al_b));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                sizeof al_c));
        LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                                sizeof al_c));
        const bool tune = getenv("CTRL_CUDA_GEMM_TUNE") != nullptr;
        cublasLtMatmulHeuristicResult_t cand[kTuneCandidates] = {};
        LT(cublasLtMatmulAlgoGetHeuristic(lt_handle, desc, la, lb, lc, lc, pref, tune ? kTuneCandidates : 1,
                                          cand, &found));
        if (!found) {
            result = ctrl_error_set(CTRL_ERR_DEVICE, "cuBLASLt: no algorithm for m=%d n=%d k=%d", m, n, k);
            goto done;
        }
        float ms = -1;
        const int pick = tune && found > 1 ? tune_pick(desc, la, lb, lc, cand, found, A, B, beta,
                                                       (size_t)ldc * n * (c_type == CUDA_R_16BF ? 2 : 4), &ms)
                                           : 0;
        heur = cand[pick];
        algo_store(key, heur.algo);
        __atomic_add_fetch(&algo_queries, 1, __ATOMIC_RELAXED);
        if (getenv("CTRL_CUDA_GEMM_LOG")) {
            log_problem(key, heur.algo);
            if (tune)
                fprintf(stderr, "cuda gemm:   tuned: candidate %d of %d, %.3f ms a run\n", pick, found, ms);
        }
    }
run:
    LT(cublasLtMatmul(lt_handle, desc, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &heur.algo, lt_workspace,
                      kWorkspaceBytes, 0));
#undef LT
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return result;
}

// db[o] += sum_t dout[t, o], one thread per column, rows in order (deterministic).
__global__ void column_sums_kernel(float *db, const float *dout, int T, int OUT) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OUT) return;
    float s = 0;
    for (int t = 0; t < T; t++) s += dout[(size_t)t * OUT + o];
    db[o] += s;
}

} // namespace

extern "C" long ctrl_cuda_gemm_heuristic_queries(void) {
    return __atomic_load_n(&algo_queries, __ATOMIC_RELAXED);
}

extern "C" void ctrl_cuda_gemm_forget_algorithms(void) {
    pthread_mutex_lock(&algo_lock);
    for (AlgoSlot &s : algo_cache) s.valid = false;
    pthread_mutex_unlock(&algo_lock);
}

extern "C" void ctrl_cuda_linear_release(void) {
    if (lt_handle) cublasLtDestroy(lt_handle);
    if (lt_workspace) ctrl_cuda_free(lt_workspace);
    lt_handle = nullptr;
    lt_workspace = nullptr;
}

extern "C" ctrl_status ctrl_cuda_gemm_f32(int trans_a, int trans_b, int M, int N, int K, float alpha,
                                          const float *A, int lda, const float *B, int ldb, float beta,
                                          float *C, int ldc) {
    // Row-major C = op(A) op(B)  <=>  column-major C^T = op(B)^T op(A)^T: swap the operands.
    return lt_matmul(trans_b, trans_a, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc, nullptr, CUDA_R_32F,
                     CUDA_R_32F, CUBLAS_COMPUTE_32F);
}

extern "C" ctrl_status ctrl_cuda_linear_forward_f32(float *out, const float *x, const float *w,
                                                    const float *bias, int T, int IN, int OUT) {
    // CUBLAS_COMPUTE_32F is true fp32 (TF32 would be CUBLAS_COMPUTE_32F_FAST_TF32).
    return lt_matmul(true, false, OUT, T, IN, 1.0f, w, IN, x, IN, 0.0f, out, OUT, bias, CUDA_R_32F,
                     CUDA_R_32F, CUBLAS_COMPUTE_32F);
}

extern "C" ctrl_status ctrl_cuda_linear_forward_bf16(uint16_t *out, const uint16_t *x, const uint16_t *w,
                                                     int T, int IN, int OUT) {
    return lt_matmul(true, false, OUT, T, IN, 1.0f, w, IN, x, IN, 0.0f, out, OUT, nullptr, CUDA_R_16BF,
                     CUDA_R_16BF, CUBLAS_COMPUTE_32F);
}

extern "C" ctrl_status ctrl_cuda_linear_backward_f32(float *dx, float *dw, float *dbias, const float *dout,
                                                     const float *x, const float *w, int T, int IN, int OUT) {
    ctrl_status st;
    // dx[T, IN] = dout[T, OUT] W[OUT, IN]
    if (dx && (st = ctrl_cuda_gemm_f32(0, 0, T, IN, OUT, 1.0f, dout, OUT, w, IN, 0.0f, dx, IN)) != CTRL_OK)
        return st;
    // dW[OUT, IN] += dout^T x
    // (none for a frozen weight: dw NULL)
    if (dw && (st = ctrl_cuda_gemm_f32(1, 0, OUT, IN, T, 1.0f, dout, OUT, x, IN, 1.0f, dw, IN)) != CTRL_OK)
        return st;
    if (dbias) {
        column_sums_kernel<<<(OUT + 255) / 256, 256>>>(dbias, dout, T, OUT);
        CTRL_CUDA_CHECK_LAUNCH();
    }
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha,
                                      const void *A, int lda, const void *B, int ldb, float beta, void *C,
                                      int ldc, ctrl_dtype ab, ctrl_dtype c) {
    if ((ab != CTRL_F32 && ab != CTRL_BF16) || (c != CTRL_F32 && c != CTRL_BF16) ||
        (ab == CTRL_F32 && c != CTRL_F32))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "cuda gemm: operands %s with a %s result is not supported",
                              ab == CTRL_BF16 ? "bf16" : "fp32", c == CTRL_BF16 ? "bf16" : "fp32");
    const cudaDataType_t t = ab == CTRL_BF16 ? CUDA_R_16BF : CUDA_R_32F,
                         tc = c == CTRL_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    return lt_matmul(trans_b, trans_a, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc, nullptr, t, tc,
                     CUBLAS_COMPUTE_32F);
}

// Mixed precision as torch.autocast (cuda_ops.h): bf16 operands, fp32 accumulation and results.
extern "C" ctrl_status ctrl_cuda_gemm_bf16_f32(int trans_a, int trans_b, int M, int N, int K, float alpha,
                                               const uint16_t *A, int lda, const uint16_t *B, int ldb,
                                               float beta, float *C, int ldc) {
    return lt_matmul(trans_b, trans_a, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc, nullptr, CUDA_R_16BF,
                     CUDA_R_32F, CUBLAS_COMPUTE_32F);
}

extern "C" ctrl_status ctrl_cuda_linear_forward_bf16_f32(float *out, const uint16_t *x, const uint16_t *w,
                                                         const float *bias, int T, int IN, int OUT) {
    return lt_matmul(true, false, OUT, T, IN, 1.0f, w, IN, x, IN, 0.0f, out, OUT, bias, CUDA_R_16BF,
                     CUDA_R_32F, CUBLAS_COMPUTE_32F);
}

extern "C" ctrl_status ctrl_cuda_linear_backward_bf16_f32(float *dx, float *dw, float *dbias,
                                                          const uint16_t *dout16, const float *dout,
                                                          const uint16_t *x, const uint16_t *w, int T, int IN,
                                                          int OUT) {
    ctrl_status st;
    // dx[T, IN] = dout[T, OUT] W[OUT, IN]
    if (dx &&
        (st = ctrl_cuda_gemm_bf16_f32(0, 0, T, IN, OUT, 1.0f, dout16, OUT, w, IN, 0.0f, dx, IN)) != CTRL_OK)
        return st;
    // dW[OUT, IN] += dout^T x
    if (dw &&
        (st = ctrl_cuda_gemm_bf16_f32(1, 0, OUT, IN, T, 1.0f, dout16, OUT, x, IN, 1.0f, dw, IN)) != CTRL_OK)
        return st;
    if (dbias) { // the unrounded dout, as the CPU path
        column_sums_kernel<<<(OUT + 255) / 256, 256>>>(dbias, dout, T, OUT);
        CTRL_CUDA_CHECK_LAUNCH();
    }
    return CTRL_OK;
}
