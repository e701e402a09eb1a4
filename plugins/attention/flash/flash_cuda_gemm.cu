// The flash plugin's CUDA GEMM path: the attention of each (sequence, KV head, chunk of queries)
// as two GEMMs forward and five backward through the core's cuBLASLt (ctrl_device_kernels.gemm:
// tensor cores in bf16), with the masked softmax and its gradient in small row kernels between
// them. The scores of a chunk are materialised (chunk x keys, bounded by kMaxChunkElems), never the
// whole T x T of a long sequence; the log-sum-exp per (head, token) is saved as in the tiled path,
// and the backward recomputes the probabilities from it. No atomics: deterministic.
//
// Layout. GQA groups the query heads of one KV head: Q [T, HK, g, D] is copied to [HK, T, g, D],
// so that a KV head's queries over a run of tokens are one matrix of rows (token, head-in-group)
// with leading dimension D; K and V go to [HK, T, D]. Outputs come back the same way.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include "../attention_cuda_common.cuh"
#include "flash_cuda_rows.cuh"

extern "C" {
#include "flash_cuda.h"
}

namespace {

constexpr size_t kMaxChunkElems = (size_t)1 << 25; // scores of one chunk: 128 MiB in fp32
constexpr int kRowThreads = 256;

using flash_rows::from_f32;
using flash_rows::to_f32;

// dst[b][a][i] = src[a][b][i] for a < A, b < B, i < inner (converting the element type).
template <typename S, typename D>
__global__ void swap_outer_kernel(D *dst, const S *src, int A, int B, int inner) {
    const size_t n = (size_t)A * B * inner;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t i = e % inner, ab = e / inner, b = ab % B, a = ab / B;
        dst[(b * A + a) * inner + i] = from_f32<D>(to_f32(src[e]));
    }
}

template <typename S, typename D> void swap_outer(D *dst, const S *src, int A, int B, int inner) {
    const size_t n = (size_t)A * B * inner;
    const int blocks = (int)((n + 255) / 256 < 65535 ? (n + 255) / 256 : 65535);
    if (n) swap_outer_kernel<S, D><<<blocks, 256>>>(dst, src, A, B, inner);
}

// The reduction of one value over the block (kRowThreads threads); every thread gets the result.
template <bool Max> __device__ float block_reduce(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = Max ? fmaxf(v, w) : v + w;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); // sh may still be read by the previous reduction
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = sh[0];
    for (int w = 1; w < kRowThreads / 32; w++) v = Max ? fmaxf(v, sh[w]) : v + sh[w];
    return v;
}

// What a chunk's row kernels need: rows are (token t0 + r / g, head kvh * g + r % g), keys
// klo .. klo + nk - 1, positions within the sequence starting at s0 of the flat batch.
struct Chunk {
    int s0, t0, klo, nk, g, kvh, total, causal, window;
    float softcap; // Gemma 2: scores cap tanh(s / cap); 0: none
};

__device__ __forceinline__ bool chunk_visible(const Chunk &c, int r, int jj) {
    return ctrl_attention_visible(c.causal, c.window, c.t0 + r / c.g, c.klo + jj);
}
__device__ __forceinline__ size_t chunk_stat(const Chunk &c, int r) { // index into lse / Di [H, T]
    return (size_t)(c.kvh * c.g + r % c.g) * c.total + c.s0 + c.t0 + r / c.g;
}

// Forward: P = softmax of the row's visible scaled scores S (fp32; soft-capped first when
// c.softcap > 0), written as T; lse saved.
template <typename T> __global__ void softmax_rows_kernel(T *P, const float *S, float *lse, Chunk c) {
    __shared__ float sh[kRowThreads / 32];
    const int r = blockIdx.x;
    const float *s = S + (size_t)r * c.nk;
    T *p = P + (size_t)r * c.nk;
    float m = -INFINITY, unused;
    for (int j = threadIdx.x; j < c.nk; j += kRowThreads)
        if (chunk_visible(c, r, j)) m = fmaxf(m, attention_softcap(s[j], c.softcap, &unused));
    m = block_reduce<true>(m, sh);
    float l = 0.f;
    if (m != -INFINITY)
        for (int j = threadIdx.x; j < c.nk; j += kRowThreads)
            if (chunk_visible(c, r, j)) l += expf(attention_softcap(s[j], c.softcap, &unused) - m);
    l = block_reduce<false>(l, sh);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (int j = threadIdx.x; j < c.nk; j += kRowThreads)
        p[j] = from_f32<T>(chunk_visible(c, r, j) && l > 0.f
                               ? expf(attention_softcap(s[j], c.softcap, &unused) - m) * inv
                               : 0.f);
    if (threadIdx.x == 0) lse[chunk_stat(c, r)] = l > 0.f ? m + logf(l) : -INFINITY;
}

// Backward: P = exp(S - lse), dS = P (dP - Di) scale (S soft-capped first, dS times 1 - tanh^2,
// when c.softcap > 0); both written as T (in place over S and dP when T is float).
template <typename T>
__global__ void softmax_grad_rows_kernel(T *P, T *dS, const float *S, const float *dP, const float *lse,
                                         const float *Di, float scale, Chunk c) {
    const int r = blockIdx.x;
    const size_t row = (size_t)r * c.nk, st = chunk_stat(c, r);
    const float l = lse[st], di = Di[st];
    for (int j = threadIdx.x; j < c.nk; j += kRowThreads) {
        float cap_grad;
        const float sc = attention_softcap(S[row + j], c.softcap, &cap_grad);
        const float p = chunk_visible(c, r, j) && l != -INFINITY ? expf(sc - l) : 0.f;
        const float ds = p * (dP[row + j] - di) * cap_grad * scale;
        P[row + j] = from_f32<T>(p), dS[row + j] = from_f32<T>(ds);
    }
}

ctrl_dtype dtype_of(float *) { return CTRL_F32; }
ctrl_dtype dtype_of(__nv_bfloat16 *) { return CTRL_BF16; }

// Device scratch from the core's allocator, released on scope exit.
struct Scratch {
    const ctrl_device_kernels *k;
    void *p[12] = {};
    int n = 0;
    ~Scratch() {
        for (int i = 0; i < n; i++) k->free(p[i]);
    }
    template <typename X> ctrl_status get(X **out, size_t count) {
        ctrl_status st = k->alloc(&p[n], (count ? count : 1) * sizeof(X));
        if (st != CTRL_OK) return st;
        *out = (X *)p[n++];
        return CTRL_OK;
    }
};

#define TRY(x)                                                                                               \
    do {                                                                                                     \
        ctrl_status st_ = (x);                                                                               \
        if (st_ != CTRL_OK) return st_;                                                                      \
    } while (0)

// The core's GEMM (ctrl_device_kernels.gemm) or NULL (an older core: the tiled kernels run instead).
const ctrl_device_kernels *gemm_kernels(const ctrl_attention_args *a) {
    const ctrl_device_kernels *k =
        ctrl_api && ctrl_api->device_kernels ? ctrl_api->device_kernels(a->device) : NULL;
    if (!k || k->size < offsetof(ctrl_device_kernels, gemm) + sizeof k->gemm || !k->gemm) return NULL;
    return k;
}

// Queries per chunk so that the chunk's scores stay within kMaxChunkElems.
int chunk_tokens(int L, int g) {
    const size_t per_token = (size_t)g * (size_t)(L > 0 ? L : 1);
    const size_t n = kMaxChunkElems / per_token;
    return n < 1 ? 1 : n > (size_t)L ? L : (int)n;
}

Chunk chunk_of(const ctrl_attention_args *a, int s0, int L, int t0, int t1, int kvh) {
    Chunk c;
    c.s0 = s0, c.t0 = t0, c.g = a->n_head / a->n_kv_head, c.kvh = kvh, c.total = a->total_tokens;
    c.causal = a->causal, c.window = a->window, c.softcap = a->softcap;
    c.klo = ctrl_attention_first_key(a->window, t0);
    c.nk = ctrl_attention_key_end(a->causal, t1, L) - c.klo;
    return c;
}

// IO: the type of the arguments' tensors; T: the type the matrix products read (bf16 where the
// caller computes in bf16, ctrl_attention_args.compute_bf16, as torch.autocast runs attention).
// Calls f(chunk, rows, query offset, key offset) for each (sequence, KV head, chunk of tc queries)
// in order; offsets are elements into the grouped layouts ([HK, T, g, D] and [HK, T, D]).
template <typename F> ctrl_status for_each_chunk(const ctrl_attention_args *a, int tc, F f) {
    const int Tt = a->total_tokens, HK = a->n_kv_head, g = a->n_head / HK, D = a->head_dim;
    for (int s = 0; s < a->n_seqs; s++) {
        const int s0 = a->cu_seqlens_host[s], L = a->cu_seqlens_host[s + 1] - s0;
        for (int kvh = 0; kvh < HK; kvh++)
            for (int t0 = 0; t0 < L; t0 += tc) {
                const int t1 = t0 + tc < L ? t0 + tc : L;
                const Chunk c = chunk_of(a, s0, L, t0, t1, kvh);
                TRY(f(c, (t1 - t0) * g, ((size_t)kvh * Tt + s0 + t0) * g * D,
                      ((size_t)kvh * Tt + s0 + c.klo) * D));
            }
    }
    return CTRL_OK;
}

template <typename IO, typename T>
ctrl_status forward(const ctrl_attention_args *a, const ctrl_device_kernels *k) {
    const int Tt = a->total_tokens, H = a->n_head, HK = a->n_kv_head, D = a->head_dim, g = H / HK;
    const ctrl_dtype ct = dtype_of((T *)nullptr);
    const int Lmax = attention_max_len(a), tc = chunk_tokens(Lmax, g);
    const size_t chunk = (size_t)tc * g * Lmax;
    Scratch sc{k};
    T *Qg, *Kg, *Vg, *P = nullptr;
    float *Og, *S;
    TRY(sc.get(&Qg, (size_t)Tt * H * D));
    TRY(sc.get(&Kg, (size_t)Tt * HK * D));
    TRY(sc.get(&Vg, (size_t)Tt * HK * D));
    TRY(sc.get(&Og, (size_t)Tt * H * D));
    TRY(sc.get(&S, chunk));
    if (ct == CTRL_BF16) TRY(sc.get(&P, chunk));
    swap_outer(Qg, (const IO *)a->q, Tt, HK, g * D);
    swap_outer(Kg, (const IO *)a->k, Tt, HK, D);
    swap_outer(Vg, (const IO *)a->v, Tt, HK, D);
    TRY(attention_launch_error("flash", "forward (layout)"));
    T *Pc = P ? P : (T *)S;
    TRY(for_each_chunk(a, tc, [&](const Chunk &c, int rows, size_t qo, size_t ko) {
        TRY(k->gemm(0, 1, rows, c.nk, D, a->scale, Qg + qo, D, Kg + ko, D, 0.f, S, c.nk, ct, CTRL_F32));
        softmax_rows_kernel<T><<<rows, kRowThreads>>>(Pc, S, a->lse, c);
        TRY(attention_launch_error("flash", "forward softmax"));
        return k->gemm(0, 0, rows, D, c.nk, 1.f, Pc, c.nk, Vg + ko, D, 0.f, Og + qo, D, ct, CTRL_F32);
    }));
    swap_outer((IO *)a->out, (const float *)Og, HK, Tt, g * D);
    return attention_launch_error("flash", "forward (output)");
}

template <typename IO, typename T>
ctrl_status backward(const ctrl_attention_args *a, const ctrl_device_kernels *k) {
    const int Tt = a->total_tokens, H = a->n_head, HK = a->n_kv_head, D = a->head_dim, g = H / HK;
    const ctrl_dtype ct = dtype_of((T *)nullptr);
    const int Lmax = attention_max_len(a), tc = chunk_tokens(Lmax, g);
    const size_t chunk = (size_t)tc * g * Lmax;
    Scratch sc{k};
    T *Qg, *Kg, *Vg, *dOg, *P = nullptr, *dS = nullptr;
    float *dQg, *dKa, *dVa, *S, *dP, *Di;
    TRY(sc.get(&Qg, (size_t)Tt * H * D));
    TRY(sc.get(&dOg, (size_t)Tt * H * D));
    TRY(sc.get(&Kg, (size_t)Tt * HK * D));
    TRY(sc.get(&Vg, (size_t)Tt * HK * D));
    TRY(sc.get(&dQg, (size_t)Tt * H * D));
    TRY(sc.get(&dKa, (size_t)Tt * HK * D));
    TRY(sc.get(&dVa, (size_t)Tt * HK * D));
    TRY(sc.get(&Di, (size_t)Tt * H));
    TRY(sc.get(&S, chunk));
    TRY(sc.get(&dP, chunk));
    if (ct == CTRL_BF16) {
        TRY(sc.get(&P, chunk));
        TRY(sc.get(&dS, chunk));
    }
    swap_outer(Qg, (const IO *)a->q, Tt, HK, g * D);
    swap_outer(dOg, (const IO *)a->dout, Tt, HK, g * D);
    swap_outer(Kg, (const IO *)a->k, Tt, HK, D);
    swap_outer(Vg, (const IO *)a->v, Tt, HK, D);
    if (Tt > 0 && H > 0)
        flash_rows::dot_rows_kernel<IO, T><<<flash_rows::dot_rows_grid(Tt, H), flash_rows::kDotRowsThreads>>>(
            Di, (const IO *)a->dout, (const IO *)a->out, Tt * H, H, D, Tt);
    TRY(attention_launch_error("flash", "backward (layout)"));
    TRY(k->fill_zero(dKa, (size_t)Tt * HK * D * sizeof(float)));
    TRY(k->fill_zero(dVa, (size_t)Tt * HK * D * sizeof(float)));
    T *Pc = P ? P : (T *)S, *dSc = dS ? dS : (T *)dP;
    TRY(for_each_chunk(a, tc, [&](const Chunk &c, int rows, size_t qo, size_t ko) {
        TRY(k->gemm(0, 1, rows, c.nk, D, a->scale, Qg + qo, D, Kg + ko, D, 0.f, S, c.nk, ct, CTRL_F32));
        TRY(k->gemm(0, 1, rows, c.nk, D, 1.f, dOg + qo, D, Vg + ko, D, 0.f, dP, c.nk, ct, CTRL_F32));
        softmax_grad_rows_kernel<T><<<rows, kRowThreads>>>(Pc, dSc, S, dP, a->lse, Di, a->scale, c);
        TRY(attention_launch_error("flash", "backward softmax"));
        TRY(k->gemm(1, 0, c.nk, D, rows, 1.f, Pc, c.nk, dOg + qo, D, 1.f, dVa + ko, D, ct, CTRL_F32));
        TRY(k->gemm(1, 0, c.nk, D, rows, 1.f, dSc, c.nk, Qg + qo, D, 1.f, dKa + ko, D, ct, CTRL_F32));
        return k->gemm(0, 0, rows, D, c.nk, 1.f, dSc, c.nk, Kg + ko, D, 0.f, dQg + qo, D, ct, CTRL_F32);
    }));
    swap_outer((IO *)a->dq, (const float *)dQg, HK, Tt, g * D);
    swap_outer((IO *)a->dk, (const float *)dKa, HK, Tt, D);
    swap_outer((IO *)a->dv, (const float *)dVa, HK, Tt, D);
    return attention_launch_error("flash", "backward (output)");
}

} // namespace

extern "C" int flash_cuda_gemm_available(const ctrl_attention_args *a) { return gemm_kernels(a) != NULL; }

// fp32 tensors with bf16 compute (the caller's autocast) are rounded to bf16 for the products.
static bool bf16_products(const ctrl_attention_args *a) {
    return a->size >= offsetof(ctrl_attention_args, compute_bf16) + sizeof a->compute_bf16 && a->compute_bf16;
}

extern "C" ctrl_status flash_cuda_gemm_forward(const ctrl_attention_args *a) {
    const ctrl_device_kernels *k = gemm_kernels(a);
    if (!k) return CTRL_ERR_UNSUPPORTED;
    if (a->dtype == CTRL_BF16) return forward<__nv_bfloat16, __nv_bfloat16>(a, k);
    return bf16_products(a) ? forward<float, __nv_bfloat16>(a, k) : forward<float, float>(a, k);
}

extern "C" ctrl_status flash_cuda_gemm_backward(const ctrl_attention_args *a) {
    const ctrl_device_kernels *k = gemm_kernels(a);
    if (!k) return CTRL_ERR_UNSUPPORTED;
    if (a->dtype == CTRL_BF16) return backward<__nv_bfloat16, __nv_bfloat16>(a, k);
    return bf16_products(a) ? backward<float, __nv_bfloat16>(a, k) : backward<float, float>(a, k);
}
