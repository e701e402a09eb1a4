// The eager attention plugin's CUDA path (fp32): the reference the faster CUDA kernels are
// checked against, simple rather than fast. One block per (query token, head): scores of the
// visible keys in shared memory, softmax, P V. Backward recomputes P from lse; dK and dV gather
// contributions from many queries through atomicAdd (so not bit-deterministic). Logit soft-capping
// (a.softcap > 0, Gemma 2): scores cap tanh(s scale / cap), their gradient times 1 - tanh^2, as the CPU's.
#include <cuda_runtime.h>
#include <math.h>

#include "../attention_cuda_common.cuh"

extern "C" {
#include "eager_cpu.h"
}

namespace {

constexpr int kThreads = 128;

__device__ int seq_of(const int32_t *cu, int n_seqs, int t) {
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cu[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

__device__ float block_reduce(float v, float *scratch, bool is_max) {
    for (int off = 16; off > 0; off /= 2) {
        float o = __shfl_xor_sync(0xffffffffu, v, off);
        v = is_max ? fmaxf(v, o) : v + o;
    }
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float r = scratch[0];
        for (int w = 1; w < kThreads / 32; w++) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
        scratch[kThreads / 32] = r;
    }
    __syncthreads();
    float r = scratch[kThreads / 32];
    __syncthreads();
    return r;
}

struct Span {
    int s0, kmin, kmax; // keys s0+kmin .. s0+kmax are visible from the query
};

__device__ Span span_of(const ctrl_attention_args &a, int t) {
    int b = seq_of(a.cu_seqlens, a.n_seqs, t);
    int s0 = a.cu_seqlens[b], L = a.cu_seqlens[b + 1] - s0, i = t - s0;
    int kmax = ctrl_attention_key_end(a.causal, i + 1, L) - 1;
    int kmin = ctrl_attention_first_key(a.window, i);
    return Span{s0, kmin, kmax};
}

__global__ void fwd_kernel(ctrl_attention_args a) {
    extern __shared__ float sh[];
    __shared__ float scratch[kThreads / 32 + 1];
    const int t = blockIdx.x, h = blockIdx.y, D = a.head_dim, H = a.n_head, HK = a.n_kv_head;
    const int kvh = h / (H / HK);
    const Span sp = span_of(a, t);
    const float *q = (const float *)a.q + ((size_t)t * H + h) * D;
    const float *k = (const float *)a.k, *v = (const float *)a.v;
    float m = -INFINITY;
    for (int j = sp.kmin + threadIdx.x; j <= sp.kmax; j += kThreads) {
        const float *kj = k + ((size_t)(sp.s0 + j) * HK + kvh) * D;
        float s = 0;
        for (int d = 0; d < D; d++) s += q[d] * kj[d];
        s *= a.scale;
        if (a.softcap > 0) s = a.softcap * tanhf(s / a.softcap);
        sh[j - sp.kmin] = s;
        m = fmaxf(m, s);
    }
    m = block_reduce(m, scratch, true);
    float sum = 0;
    for (int j = sp.kmin + threadIdx.x; j <= sp.kmax; j += kThreads) {
        float p = expf(sh[j - sp.kmin] - m);
        sh[j - sp.kmin] = p;
        sum += p;
    }
    sum = block_reduce(sum, scratch, false);
    float *out = (float *)a.out + ((size_t)t * H + h) * D;
    for (int d = threadIdx.x; d < D; d += kThreads) {
        float acc = 0;
        for (int j = sp.kmin; j <= sp.kmax; j++) acc += sh[j - sp.kmin] * v[((size_t)(sp.s0 + j) * HK + kvh) * D + d];
        out[d] = acc / sum;
    }
    if (threadIdx.x == 0 && a.lse) a.lse[(size_t)h * a.total_tokens + t] = m + logf(sum);
}

__global__ void bwd_kernel(ctrl_attention_args a) {
    extern __shared__ float sh[]; // p, then ds
    __shared__ float scratch[kThreads / 32 + 1];
    const int t = blockIdx.x, h = blockIdx.y, D = a.head_dim, H = a.n_head, HK = a.n_kv_head;
    const int kvh = h / (H / HK);
    const Span sp = span_of(a, t);
    const int n = sp.kmax - sp.kmin + 1;
    float *p = sh, *ds = sh + n;
    const size_t qo = ((size_t)t * H + h) * D;
    const float *q = (const float *)a.q + qo, *o = (const float *)a.out + qo, *dout = (const float *)a.dout + qo;
    const float *k = (const float *)a.k, *v = (const float *)a.v;
    float *dk = (float *)a.dk, *dv = (float *)a.dv, *dq = (float *)a.dq + qo;
    const float lse = a.lse[(size_t)h * a.total_tokens + t];
    float di = 0;
    for (int d = threadIdx.x; d < D; d += kThreads) di += dout[d] * o[d];
    di = block_reduce(di, scratch, false);
    for (int j = sp.kmin + threadIdx.x; j <= sp.kmax; j += kThreads) {
        const size_t ko = ((size_t)(sp.s0 + j) * HK + kvh) * D;
        float s = 0, dp = 0;
        for (int d = 0; d < D; d++) s += q[d] * k[ko + d], dp += dout[d] * v[ko + d];
        float c = s * a.scale, cap_grad = 1.0f;
        if (a.softcap > 0) c = a.softcap * tanhf(c / a.softcap), cap_grad = 1.0f - (c / a.softcap) * (c / a.softcap);
        float pj = expf(c - lse);
        p[j - sp.kmin] = pj;
        ds[j - sp.kmin] = pj * (dp - di) * cap_grad * a.scale;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < D; d += kThreads) {
        float acc = 0;
        for (int j = sp.kmin; j <= sp.kmax; j++) acc += ds[j - sp.kmin] * k[((size_t)(sp.s0 + j) * HK + kvh) * D + d];
        dq[d] = acc;
    }
    for (int e = threadIdx.x; e < n * D; e += kThreads) {
        const int j = e / D, d = e % D;
        const size_t ko = ((size_t)(sp.s0 + sp.kmin + j) * HK + kvh) * D + d;
        atomicAdd(&dv[ko], p[j] * dout[d]);
        atomicAdd(&dk[ko], ds[j] * q[d]);
    }
}

} // namespace

extern "C" ctrl_status eager_cuda_forward(const ctrl_attention_args *a) {
    const size_t shmem = sizeof(float) * (size_t)attention_max_len(a);
    if (shmem > 200 * 1024)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "attention eager (cuda): sequences of %d tokens exceed "
                                     "its shared-memory score row; use flash", attention_max_len(a));
    cudaFuncSetAttribute(fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
    fwd_kernel<<<dim3(a->total_tokens, a->n_head), kThreads, shmem>>>(*a);
    return attention_launch_error("eager", "forward");
}

extern "C" ctrl_status eager_cuda_backward(const ctrl_attention_args *a) {
    const size_t shmem = 2 * sizeof(float) * (size_t)attention_max_len(a);
    if (shmem > 200 * 1024)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "attention eager (cuda): sequences of %d tokens are too long",
                                     attention_max_len(a));
    cudaMemset(a->dk, 0, sizeof(float) * (size_t)a->total_tokens * a->n_kv_head * a->head_dim);
    cudaMemset(a->dv, 0, sizeof(float) * (size_t)a->total_tokens * a->n_kv_head * a->head_dim);
    cudaFuncSetAttribute(bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
    bwd_kernel<<<dim3(a->total_tokens, a->n_head), kThreads, shmem>>>(*a);
    return attention_launch_error("eager", "backward");
}
