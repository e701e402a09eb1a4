// The flash plugin's CUDA path: FlashAttention-2's algorithm on variable-length flat batches,
// fp32 or bf16 in and out, fp32 accumulation, never materialising T x T. Three implementations,
// chosen per call (flash_path below): the fused tensor-core kernels (flash_cuda_mma.cu: bf16, or
// fp32 with bf16 products, head_dim 64/128), the GEMM path (flash_cuda_gemm.cu: cuBLASLt products
// with row kernels between them, whenever the core lends a device GEMM), and this file's tiled
// SIMT baseline (one thread per query row in the forward and the dQ pass, one per key row in the
// dK/dV pass; K/V and Q/dO tiles staged in shared memory), which runs everything else.
//
// Gemma 2's logit soft-capping (a.softcap > 0) on every path: each scaled score becomes
// cap tanh(s / cap) before the mask and the softmax (the log-sum-exp is of the capped scores), and
// the backward multiplies dS by 1 - tanh^2, as the CPU's eager and flash attention do.
//
// Grid: (query or key tiles of the longest sequence, heads, sequences); tiles past a sequence's
// end exit. Forward saves the log-sum-exp of the scaled scores per (head, token). Backward is two
// kernels with no atomics, so it is deterministic: dK/dV per key tile (looping over the GQA
// group's query heads and the visible query tiles), then dQ per query tile.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../attention_cuda_common.cuh"

extern "C" {
#include "flash_cuda.h"
}

namespace {

constexpr int kMaxD = 128; // head_dim up to this
constexpr int kBr = 64;    // query rows per block (forward, dQ)
constexpr int kBc = 32;    // key rows per staged tile (forward, dQ)
constexpr int kBk = 64;    // key rows per block (dK/dV)
constexpr int kBq = 32;    // query rows per staged tile (dK/dV)

__device__ __forceinline__ float load(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16(v); }

// Key j is visible from query i (positions within their sequence; attention_mask.h).
__device__ __forceinline__ bool visible(const ctrl_attention_args &a, int i, int j) {
    return ctrl_attention_visible(a.causal, a.window, i, j);
}

// The keys any query of [q0, q1) can see: [lo, hi].
__device__ __forceinline__ void key_range(const ctrl_attention_args &a, int q0, int q1, int L, int *lo,
                                          int *hi) {
    *lo = ctrl_attention_first_key(a.window, q0);
    *hi = ctrl_attention_key_end(a.causal, q1, L) - 1;
}

// Stages rows [r0, r0 + n) of head `hh` of x ([T, heads, D]) as fp32 into sh[n][D].
template <typename T>
__device__ void stage(float *sh, const T *x, int s0, int r0, int n, int L, int heads, int hh, int D) {
    for (int e = threadIdx.x; e < n * D; e += blockDim.x) {
        const int r = e / D, d = e % D;
        sh[e] = r0 + r < L ? load(x, ((size_t)(s0 + r0 + r) * heads + hh) * D + d) : 0.f;
    }
}

// The next K and V tile of kBc rows, between barriers (the previous tile is no longer read).
template <typename T>
__device__ void stage_kv(float *ks, float *vs, const T *K, const T *V, int s0, int k0, int L, int HK, int kvh,
                         int D) {
    __syncthreads();
    stage(ks, K, s0, k0, kBc, L, HK, kvh, D);
    stage(vs, V, s0, k0, kBc, L, HK, kvh, D);
    __syncthreads();
}

template <typename T> __global__ void fwd_kernel(ctrl_attention_args a) {
    __shared__ float ks[kBc * kMaxD], vs[kBc * kMaxD];
    const int seq = blockIdx.z, h = blockIdx.y, D = a.head_dim, H = a.n_head, HK = a.n_kv_head;
    const int kvh = h / (H / HK), s0 = a.cu_seqlens[seq], L = a.cu_seqlens[seq + 1] - s0;
    const int q0 = blockIdx.x * kBr, i = q0 + threadIdx.x;
    if (q0 >= L) return;
    const bool row = i < L;
    const T *Q = (const T *)a.q, *K = (const T *)a.k, *V = (const T *)a.v;
    float q[kMaxD], acc[kMaxD];
    for (int d = 0; d < D; d++)
        q[d] = row ? load(Q, ((size_t)(s0 + i) * H + h) * D + d) * a.scale : 0.f, acc[d] = 0.f;
    float m = -INFINITY, l = 0.f;
    int lo, hi;
    key_range(a, q0, min(q0 + kBr, L), L, &lo, &hi);
    for (int k0 = lo - lo % kBc; k0 <= hi; k0 += kBc) {
        stage_kv(ks, vs, K, V, s0, k0, L, HK, kvh, D);
        if (!row) continue;
        float s[kBc], mt = -INFINITY;
        for (int jj = 0; jj < kBc; jj++) {
            const int j = k0 + jj;
            s[jj] = -INFINITY;
            if (j >= L || !visible(a, i, j)) continue;
            float dot = 0.f, unused;
            for (int d = 0; d < D; d++) dot += q[d] * ks[jj * D + d];
            dot = attention_softcap(dot, a.softcap, &unused);
            s[jj] = dot, mt = fmaxf(mt, dot);
        }
        if (mt == -INFINITY) continue;
        const float mn = fmaxf(m, mt), f = expf(m - mn); // online softmax: rescale once per tile
        l *= f;
        for (int d = 0; d < D; d++) acc[d] *= f;
        for (int jj = 0; jj < kBc; jj++) {
            if (s[jj] == -INFINITY) continue;
            const float p = expf(s[jj] - mn);
            l += p;
            for (int d = 0; d < D; d++) acc[d] += p * vs[jj * D + d];
        }
        m = mn;
    }
    if (!row) return;
    T *O = (T *)a.out;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (int d = 0; d < D; d++) store(O, ((size_t)(s0 + i) * H + h) * D + d, acc[d] * inv);
    if (a.lse) a.lse[(size_t)h * a.total_tokens + s0 + i] = l > 0.f ? m + logf(l) : -INFINITY;
}

// dK, dV for kBk keys of kv head `kvh`: every query head of its GQA group, every visible query.
template <typename T> __global__ void bwd_dkdv_kernel(ctrl_attention_args a) {
    extern __shared__ float sh[]; // Q tile, dO tile [kBq][D], lse and Di [kBq]
    float *qs = sh, *dos = qs + kBq * a.head_dim, *lses = dos + kBq * a.head_dim, *dis = lses + kBq;
    const int seq = blockIdx.z, kvh = blockIdx.y, D = a.head_dim, H = a.n_head, HK = a.n_kv_head;
    const int group = H / HK, s0 = a.cu_seqlens[seq], L = a.cu_seqlens[seq + 1] - s0;
    const int k0 = blockIdx.x * kBk, j = k0 + threadIdx.x;
    if (k0 >= L) return;
    const bool row = j < L;
    const T *Q = (const T *)a.q, *K = (const T *)a.k, *V = (const T *)a.v, *O = (const T *)a.out,
            *dO = (const T *)a.dout;
    float k[kMaxD], v[kMaxD], dk[kMaxD], dv[kMaxD];
    for (int d = 0; d < D; d++) {
        const size_t o = ((size_t)(s0 + j) * HK + kvh) * D + d;
        k[d] = row ? load(K, o) : 0.f, v[d] = row ? load(V, o) : 0.f, dk[d] = 0.f, dv[d] = 0.f;
    }
    // queries that can see some key of [k0, k0 + kBk)
    const int qlo = ctrl_attention_first_query(a.causal, k0);
    const int qhi = ctrl_attention_query_end(a.window, min(k0 + kBk, L), L) - 1;
    for (int g = 0; g < group; g++) {
        const int h = kvh * group + g;
        for (int q0 = qlo - qlo % kBq; q0 <= qhi; q0 += kBq) {
            __syncthreads();
            stage(qs, Q, s0, q0, kBq, L, H, h, D);
            stage(dos, dO, s0, q0, kBq, L, H, h, D);
            for (int r = threadIdx.x; r < kBq; r += blockDim.x) { // Di = dO_i . O_i
                float di = 0.f;
                const int i = q0 + r;
                for (int d = 0; i < L && d < D; d++) {
                    const size_t o = ((size_t)(s0 + i) * H + h) * D + d;
                    di += load(dO, o) * load(O, o);
                }
                dis[r] = di;
                lses[r] = i < L ? a.lse[(size_t)h * a.total_tokens + s0 + i] : 0.f;
            }
            __syncthreads();
            if (!row) continue;
            for (int r = 0; r < kBq; r++) {
                const int i = q0 + r;
                if (i >= L || !visible(a, i, j)) continue;
                const float *qi = qs + r * D, *doi = dos + r * D;
                float s = 0.f, dp = 0.f;
                for (int d = 0; d < D; d++) s += qi[d] * k[d], dp += doi[d] * v[d];
                float cap_grad;
                const float c = attention_softcap(s * a.scale, a.softcap, &cap_grad);
                const float p = expf(c - lses[r]), ds = p * (dp - dis[r]) * cap_grad * a.scale;
                for (int d = 0; d < D; d++) dv[d] += p * doi[d], dk[d] += ds * qi[d];
            }
        }
    }
    if (!row) return;
    T *dK = (T *)a.dk, *dV = (T *)a.dv;
    for (int d = 0; d < D; d++) {
        const size_t o = ((size_t)(s0 + j) * HK + kvh) * D + d;
        store(dK, o, dk[d]), store(dV, o, dv[d]);
    }
}

// dQ for kBr queries of head h: every visible key.
template <typename T> __global__ void bwd_dq_kernel(ctrl_attention_args a) {
    __shared__ float ks[kBc * kMaxD], vs[kBc * kMaxD];
    const int seq = blockIdx.z, h = blockIdx.y, D = a.head_dim, H = a.n_head, HK = a.n_kv_head;
    const int kvh = h / (H / HK), s0 = a.cu_seqlens[seq], L = a.cu_seqlens[seq + 1] - s0;
    const int q0 = blockIdx.x * kBr, i = q0 + threadIdx.x;
    if (q0 >= L) return;
    const bool row = i < L;
    const T *Q = (const T *)a.q, *K = (const T *)a.k, *V = (const T *)a.v, *O = (const T *)a.out,
            *dO = (const T *)a.dout;
    float q[kMaxD], g[kMaxD], dq[kMaxD], di = 0.f;
    for (int d = 0; d < D; d++) {
        const size_t o = ((size_t)(s0 + i) * H + h) * D + d;
        q[d] = row ? load(Q, o) : 0.f, g[d] = row ? load(dO, o) : 0.f, dq[d] = 0.f;
        di += row ? g[d] * load(O, o) : 0.f;
    }
    const float lse = row ? a.lse[(size_t)h * a.total_tokens + s0 + i] : 0.f;
    int lo, hi;
    key_range(a, q0, min(q0 + kBr, L), L, &lo, &hi);
    for (int k0 = lo - lo % kBc; k0 <= hi; k0 += kBc) {
        stage_kv(ks, vs, K, V, s0, k0, L, HK, kvh, D);
        if (!row) continue;
        for (int jj = 0; jj < kBc; jj++) {
            const int j = k0 + jj;
            if (j >= L || !visible(a, i, j)) continue;
            float s = 0.f, dp = 0.f;
            for (int d = 0; d < D; d++) s += q[d] * ks[jj * D + d], dp += g[d] * vs[jj * D + d];
            float cap_grad;
            const float c = attention_softcap(s * a.scale, a.softcap, &cap_grad);
            const float ds = expf(c - lse) * (dp - di) * cap_grad * a.scale;
            for (int d = 0; d < D; d++) dq[d] += ds * ks[jj * D + d];
        }
    }
    if (!row) return;
    T *dQ = (T *)a.dq;
    for (int d = 0; d < D; d++) store(dQ, ((size_t)(s0 + i) * H + h) * D + d, dq[d]);
}

template <typename T> ctrl_status forward(const ctrl_attention_args *a) {
    const int L = attention_max_len(a);
    if (L == 0) return CTRL_OK;
    fwd_kernel<T><<<dim3((L + kBr - 1) / kBr, a->n_head, a->n_seqs), kBr>>>(*a);
    return attention_launch_error("flash", "forward");
}

template <typename T> ctrl_status backward(const ctrl_attention_args *a) {
    const int L = attention_max_len(a);
    if (L == 0) return CTRL_OK;
    const size_t shmem = sizeof(float) * (2 * (size_t)kBq * a->head_dim + 2 * kBq);
    bwd_dkdv_kernel<T><<<dim3((L + kBk - 1) / kBk, a->n_kv_head, a->n_seqs), kBk, shmem>>>(*a);
    ctrl_status st = attention_launch_error("flash", "backward dK/dV");
    if (st != CTRL_OK) return st;
    bwd_dq_kernel<T><<<dim3((L + kBr - 1) / kBr, a->n_head, a->n_seqs), kBr>>>(*a);
    return attention_launch_error("flash", "backward dQ");
}

} // namespace

extern "C" int flash_cuda_supported(const ctrl_attention_args *a) {
    return a->device.type == CTRL_DEVICE_CUDA && (a->dtype == CTRL_F32 || a->dtype == CTRL_BF16) &&
           a->n_kv_head > 0 && a->n_head > 0 && a->n_head % a->n_kv_head == 0 && a->cu_seqlens_host != NULL &&
           a->cu_seqlens != NULL && a->head_dim > 0 && a->head_dim <= kMaxD;
}

namespace {

enum Path { kTiled, kGemm, kMma };

// The path for these arguments: CTRL_FLASH_PATH = mma | gemm | tiled forces one (refused, naming
// the variable, when it cannot run them), unset or auto picks mma where it can run, else gemm where
// the core lends a GEMM, else tiled. CTRL_FLASH_TILED (set, any value) is the older switch for tiled.
ctrl_status flash_path(const ctrl_attention_args *a, Path *path) {
    const char *want = getenv("CTRL_FLASH_PATH");
    if ((!want || !*want) && getenv("CTRL_FLASH_TILED")) want = "tiled";
    const char *why_not_mma = flash_cuda_mma_unsupported(a);
    const bool gemm = flash_cuda_gemm_available(a);
    if (!want || !*want || !strcmp(want, "auto")) {
        *path = !why_not_mma ? kMma : gemm ? kGemm : kTiled;
        return CTRL_OK;
    }
    if (!strcmp(want, "tiled")) {
        *path = kTiled;
        return CTRL_OK;
    }
    if (!strcmp(want, "gemm")) {
        if (!gemm)
            return ctrl_error_set(
                CTRL_ERR_UNSUPPORTED,
                "attention flash (cuda): CTRL_FLASH_PATH=gemm but the core lends no device GEMM");
        *path = kGemm;
        return CTRL_OK;
    }
    if (!strcmp(want, "mma")) {
        if (why_not_mma)
            return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "attention flash (cuda): CTRL_FLASH_PATH=mma but %s",
                                  why_not_mma);
        *path = kMma;
        return CTRL_OK;
    }
    return ctrl_error_set(CTRL_ERR_CONFIG,
                          "attention flash (cuda): CTRL_FLASH_PATH=%s is not one of auto, mma, gemm, tiled",
                          want);
}

} // namespace

extern "C" ctrl_status flash_cuda_forward(const ctrl_attention_args *a) {
    Path p;
    ctrl_status st = flash_path(a, &p);
    if (st != CTRL_OK) return st;
    if (p == kMma) return flash_cuda_mma_forward(a);
    if (p == kGemm) return flash_cuda_gemm_forward(a);
    return a->dtype == CTRL_BF16 ? forward<__nv_bfloat16>(a) : forward<float>(a);
}

extern "C" ctrl_status flash_cuda_backward(const ctrl_attention_args *a) {
    Path p;
    ctrl_status st = flash_path(a, &p);
    if (st != CTRL_OK) return st;
    if (p == kMma) return flash_cuda_mma_backward(a);
    if (p == kGemm) return flash_cuda_gemm_backward(a);
    return a->dtype == CTRL_BF16 ? backward<__nv_bfloat16>(a) : backward<float>(a);
}
