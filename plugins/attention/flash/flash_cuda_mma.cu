// The flash plugin's tensor-core path: FlashAttention-2's forward and backward fused into three
// kernels on mma.sync.m16n8k16 (bf16 products, fp32 accumulation; flash_cuda_ptx.cuh), for bf16
// tensors, or fp32 tensors whose caller computes in bf16 (ctrl_attention_args.compute_bf16), at
// head_dim 64 or 128; causal and sliding-window masks, GQA, variable-length flat batches
// (cu_seqlens), Gemma 2's logit soft-capping (each tile's raw scores through tanh before the mask;
// dS times 1 - tanh^2). Never materialises T x T.
//
// Every kernel: 4 warps; each warp owns 16 rows of the block's tile (queries in the forward and
// dQ kernels, keys in the dK/dV kernel) and streams the other operand's tiles through shared
// memory: two buffers, the next tile copied by cp.async while the current one is used (fp32
// tensors are converted through registers instead); rows padded by 16 bytes so that ldmatrix's
// eight row addresses hit distinct banks.
// Tiles that no row of the block can see are skipped (the mask rule's ranges, attention_mask.h);
// the per-element mask runs only on tiles that straddle a boundary.
//  - forward: Q tile (64 rows) in registers as A fragments; per K/V tile of 64 keys S = Q K^T,
//    online softmax in fp32 (base 2, the scale folded into one FMA before ex2), P rounded to bf16 as the A
//    fragment of O += P V straight from the accumulators; the log-sum-exp per (head, token) saved.
//  - backward, deterministic (no atomics): Di = dO . O per row (flash_cuda_rows.cuh); dK/dV per
//    key tile of 64 (looping over the GQA group's query heads and the visible query tiles,
//    recomputing S^T and dP^T, then dV += P^T dO and dK += dS^T Q); dQ per query tile of 64
//    (recomputing S and dP, dQ += dS K). The recomputation costs 2 of the 7 products.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "../attention_cuda_common.cuh"
#include "flash_cuda_ptx.cuh"
#include "flash_cuda_rows.cuh"

extern "C" {
#include "flash_cuda.h"
}

namespace {

constexpr int kThreads = 128; // 4 warps
constexpr int kRows = 64;     // the block's own rows: queries (forward, dQ), keys (dK/dV)
constexpr float kLog2e = 1.4426950408889634f;
constexpr unsigned kFull = 0xffffffffu;

template <int D> struct Tile {
    static constexpr int kFwdKeys = 64;                     // forward: keys per streamed tile
    static constexpr int kDkdvQueries = D == 128 ? 32 : 64; // dK/dV: queries per streamed tile
    static constexpr int kDqKeys = D == 128 ? 32 : 64;      // dQ: keys per streamed tile
};

// 8 elements into shared memory as bf16: bf16 through cp.async (landed by ptx_cp_async_wait),
// fp32 converted through registers.
__device__ __forceinline__ void copy8(__nv_bfloat16 *dst, const __nv_bfloat16 *src) {
    ptx_cp_async_16(dst, src);
}
__device__ __forceinline__ void copy8(__nv_bfloat16 *dst, const float *src) {
    const float4 a = reinterpret_cast<const float4 *>(src)[0], b = reinterpret_cast<const float4 *>(src)[1];
    *reinterpret_cast<uint4 *>(dst) = make_uint4(ptx_pack_bf16x2(a.x, a.y), ptx_pack_bf16x2(a.z, a.w),
                                                 ptx_pack_bf16x2(b.x, b.y), ptx_pack_bf16x2(b.z, b.w));
}
__device__ __forceinline__ void store2(__nv_bfloat16 *p, float x, float y) {
    *reinterpret_cast<uint32_t *>(p) = ptx_pack_bf16x2(x, y);
}
__device__ __forceinline__ void store2(float *p, float x, float y) { p[0] = x, p[1] = y; }

// Issues the copy of rows [0, Rows) of a tile into shared memory as bf16: token `tok0 + r` of head
// `hh` of x ([T, heads, D]) for r < valid, zeros after (so that padding rows add nothing, never
// NaN). The rows are there after the caller's ptx_cp_async_wait (for this group) and a barrier.
template <int D, int Rows, typename IO>
__device__ __forceinline__ void stage(__nv_bfloat16 *sh, const IO *x, int tok0, int valid, int heads,
                                      int hh) {
    constexpr int kChunks = D / 8;
    for (int e = threadIdx.x; e < Rows * kChunks; e += kThreads) {
        const int r = e / kChunks, c = e % kChunks * 8;
        __nv_bfloat16 *dst = sh + r * (D + 8) + c;
        if (r < valid)
            copy8(dst, x + ((size_t)(tok0 + r) * heads + hh) * D + c);
        else
            *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
    }
}

// A K/V tile of Rows keys from token tok0 (kv head kvh) into buf ([Rows][D + 8] K, then V), issued
// as one cp.async group (committed) -- the forward's and the dQ kernel's streamed operand.
template <int D, int Rows, typename IO>
__device__ __forceinline__ void stage_kv(__nv_bfloat16 *buf, const IO *K, const IO *V, int tok0, int valid,
                                         int HK, int kvh) {
    stage<D, Rows>(buf, K, tok0, valid, HK, kvh);
    stage<D, Rows>(buf + Rows * (D + 8), V, tok0, valid, HK, kvh);
    ptx_cp_async_commit();
}

// Tile `it` of `tiles` landed for every thread: the next one issued first (issue(it + 1), into the
// other buffer) so that its copy overlaps this tile's work.
template <typename F> __device__ __forceinline__ void land_tile(int it, int tiles, F issue) {
    if (it + 1 < tiles) {
        issue(it + 1);
        ptx_cp_async_wait<1>();
    } else {
        ptx_cp_async_wait<0>();
    }
    __syncthreads();
}

// The A fragment of rows r0..r0+15, columns c0..c0+15 of a row-major shared tile.
template <int S>
__device__ __forceinline__ void frag_a(uint32_t a[4], const __nv_bfloat16 *sh, int r0, int c0) {
    const int l = threadIdx.x % 32;
    ptx_ldmatrix_x4(a, sh + (r0 + l % 16) * S + c0 + 8 * (l / 16));
}
// B fragments of two n-tiles (n0.., n0+8..; b[0..1] and b[2..3]) over k0..k0+15, from a shared tile
// stored [n][k] (B = its transpose: K for S = Q K^T).
template <int S>
__device__ __forceinline__ void frag_b_nk(uint32_t b[4], const __nv_bfloat16 *sh, int n0, int k0) {
    const int l = threadIdx.x % 32;
    ptx_ldmatrix_x4(b, sh + (n0 + l % 8 + 8 * (l / 16)) * S + k0 + 8 * (l / 8 % 2));
}
// The same from a shared tile stored [k][n] (V for O = P V).
template <int S>
__device__ __forceinline__ void frag_b_kn(uint32_t b[4], const __nv_bfloat16 *sh, int k0, int n0) {
    const int l = threadIdx.x % 32;
    ptx_ldmatrix_x4_trans(b, sh + (k0 + l % 8 + 8 * (l / 8 % 2)) * S + n0 + 8 * (l / 16));
}
// The A fragment of k-step kk (columns 16kk..16kk+15) from accumulator n-tiles 2kk and 2kk+1.
__device__ __forceinline__ void acc_to_a(uint32_t a[4], const float lo[4], const float hi[4]) {
    a[0] = ptx_pack_bf16x2(lo[0], lo[1]), a[1] = ptx_pack_bf16x2(lo[2], lo[3]);
    a[2] = ptx_pack_bf16x2(hi[0], hi[1]), a[3] = ptx_pack_bf16x2(hi[2], hi[3]);
}
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    ptx_mma_m16n8k16_bf16(c, a, b, c);
}

// acc += X B for this warp's 16 rows: X the accumulator tiles x[N / 8][4] (rounded to bf16 as A
// fragments), B the shared tile b_sh stored [N][D + 8] (O += P V, dQ += dS K, dV += P^T dO,
// dK += dS^T Q).
template <int D, int N>
__device__ __forceinline__ void acc_times(float (&acc)[D / 8][4], const float (&x)[N / 8][4],
                                          const __nv_bfloat16 *b_sh) {
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++) {
        uint32_t xa[4];
        acc_to_a(xa, x[2 * kk], x[2 * kk + 1]);
#pragma unroll
        for (int d = 0; d < D / 8; d += 2) {
            uint32_t b[4];
            frag_b_kn<D + 8>(b, b_sh, kk * 16, d * 8);
            mma(acc[d], xa, b), mma(acc[d + 1], xa, b + 2);
        }
    }
}

// The backward's two recomputed products for this warp's 16 rows r0.. of the A tiles over the
// head dimension, against N rows of the B tiles (stored [n][d]): s = A1 B1^T and dp = A2 B2^T
// (dK/dV: K Q^T and V dO^T; dQ: Q K^T and dO V^T).
template <int D, int N>
__device__ __forceinline__ void two_products(float s[N / 8][4], float dp[N / 8][4], const __nv_bfloat16 *a1,
                                             const __nv_bfloat16 *a2, const __nv_bfloat16 *b1,
                                             const __nv_bfloat16 *b2, int r0) {
    constexpr int S = D + 8;
#pragma unroll
    for (int n = 0; n < N / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t x[4], y[4];
        frag_a<S>(x, a1, r0, kk * 16);
        frag_a<S>(y, a2, r0, kk * 16);
#pragma unroll
        for (int n = 0; n < N / 8; n += 2) {
            uint32_t b[4];
            frag_b_nk<S>(b, b1, n * 8, kk * 16);
            mma(s[n], x, b), mma(s[n + 1], x, b + 2);
            frag_b_nk<S>(b, b2, n * 8, kk * 16);
            mma(dp[n], y, b), mma(dp[n + 1], y, b + 2);
        }
    }
}

// Whether every (query, key) of the rectangle [i0, i1) x [j0, j1) is visible (no per-element mask).
__device__ __forceinline__ bool all_visible(const ctrl_attention_args &a, int i0, int i1, int j0, int j1) {
    return (!a.causal || j1 - 1 <= i0) && (a.window <= 0 || j0 > i1 - 1 - a.window);
}

// Soft-capping's tanh over a tile of raw scores (before the mask): x becomes tanh(x tsc).
// dS's factor: scale, times 1 - tanh^2 when capped (0 where masked: t = -inf, P = 0 there)
__device__ __forceinline__ float cap_scale(bool cap, float t, float scale) {
    return cap ? fmaxf(1.f - t * t, 0.f) * scale : scale;
}
template <int N> __device__ __forceinline__ void soft_cap(float (&x)[N][4], float tsc) {
#pragma unroll
    for (int n = 0; n < N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) x[n][e] = tanhf(x[n][e] * tsc);
}

// Sets the accumulator elements whose (query, key) is past the sequence's end or not visible to
// -inf (raw scores; a tile that all_visible clears needs none of this). Element (n, e) is row
// r0 + 8 (e / 2), column c0 + 8 n + e % 2; rows are queries, or keys when KeysAreRows.
template <bool KeysAreRows, int N>
__device__ __forceinline__ void mask_tile(float (&x)[N][4], const ctrl_attention_args &a, int L, int r0,
                                          int c0) {
#pragma unroll
    for (int n = 0; n < N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = r0 + e / 2 * 8, c = c0 + n * 8 + e % 2, i = KeysAreRows ? c : r,
                      j = KeysAreRows ? r : c;
            if (i >= L || j >= L || !ctrl_attention_visible(a.causal, a.window, i, j)) x[n][e] = -INFINITY;
        }
}

template <int D, typename IO>
__global__ void __launch_bounds__(kThreads, D == 128 ? 2 : 3) fwd_kernel(ctrl_attention_args a) {
    constexpr int S = D + 8, Bc = Tile<D>::kFwdKeys, NT = Bc / 8, KD = D / 16, ND = D / 8;
    // two K/V buffers [Bc][S] each (K then V); the Q tile passes through the second one first
    extern __shared__ uint4 smem[];
    __nv_bfloat16 *buf = reinterpret_cast<__nv_bfloat16 *>(smem), *qs = buf + 2 * Bc * S;
    const int seq = blockIdx.z, h = blockIdx.y, H = a.n_head, HK = a.n_kv_head, kvh = h / (H / HK);
    const int s0 = a.cu_seqlens[seq], L = a.cu_seqlens[seq + 1] - s0;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows; // the longest causal rows first
    if (q0 >= L) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int q1 = min(q0 + kRows, L), i0 = q0 + warp * 16 + g; // this lane's rows: i0, i0 + 8
    const int lo = ctrl_attention_first_key(a.window, q0), hi = ctrl_attention_key_end(a.causal, q1, L);
    const int first = lo - lo % Bc, tiles = (hi - first + Bc - 1) / Bc;
    const IO *K = (const IO *)a.k, *V = (const IO *)a.v;
    stage<D, kRows>(qs, (const IO *)a.q, s0 + q0, L - q0, H, h);
    ptx_cp_async_commit();
    auto issue = [&](int it) { // key tile `it` into buffer it % 2
        const int k0 = first + it * Bc;
        stage_kv<D, Bc>(buf + (it & 1) * 2 * Bc * S, K, V, s0 + k0, L - k0, HK, kvh);
    };
    issue(0);
    ptx_cp_async_wait<1>(); // the Q tile (the first K/V tile may still be in flight)
    __syncthreads();
    uint32_t qf[KD][4];
#pragma unroll
    for (int kk = 0; kk < KD; kk++) frag_a<S>(qf[kk], qs, warp * 16, kk * 16);
    __syncthreads(); // every warp has its Q fragments: the second buffer is free
    float o[ND][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int d = 0; d < ND; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    // soft-capping (Gemma 2): each raw score x becomes t = tanh(x scale / cap), and the capped score
    // cap t enters the base-2 softmax as t (cap log2 e) -- the same code as the plain x (scale log2 e)
    const bool cap = a.softcap > 0.f;
    const float sl2 = (cap ? a.softcap : a.scale) * kLog2e, tsc = cap ? a.scale / a.softcap : 0.f;
    for (int it = 0; it < tiles; it++) {
        const int k0 = first + it * Bc;
        land_tile(it, tiles, issue);
        const __nv_bfloat16 *ks = buf + (it & 1) * 2 * Bc * S, *vs = ks + Bc * S;
        float s[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KD; kk++)
#pragma unroll
            for (int n = 0; n < NT; n += 2) {
                uint32_t b[4];
                frag_b_nk<S>(b, ks, n * 8, kk * 16);
                mma(s[n], qf[kk], b), mma(s[n + 1], qf[kk], b + 2);
            }
        if (cap) soft_cap(s, tsc);
        if (!(k0 + Bc <= L && all_visible(a, q0, q0 + kRows, k0, k0 + Bc)))
            mask_tile<false>(s, a, L, i0, k0 + 2 * t);
        // online softmax in base 2: m is the running maximum of the scaled scores (scale log2 e,
        // positive, so the raw maximum scales to it)
        float mx[2] = {-INFINITY, -INFINITY}, base[2];
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) mx[e / 2] = fmaxf(mx[e / 2], s[n][e]);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFull, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFull, mx[r], 2));
            const float mn = fmaxf(m[r], mx[r] * sl2);
            base[r] = mn == -INFINITY ? 0.f : mn; // a row that sees nothing yet stays at zero
            const float alpha = ptx_exp2(m[r] - base[r]);
            m[r] = mn, l[r] *= alpha;
#pragma unroll
            for (int d = 0; d < ND; d++) o[d][2 * r] *= alpha, o[d][2 * r + 1] *= alpha;
        }
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = ptx_exp2(fmaf(s[n][e], sl2, -base[e / 2]));
                s[n][e] = p, l[e / 2] += p;
            }
        acc_times<D, Bc>(o, s, vs);
        __syncthreads(); // every warp is done with this buffer before the next tile but one fills it
    }
    IO *O = (IO *)a.out;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(kFull, l[r], 1);
        l[r] += __shfl_xor_sync(kFull, l[r], 2);
        const int i = i0 + 8 * r;
        if (i >= L) continue;
        const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
        IO *row = O + ((size_t)(s0 + i) * H + h) * D + 2 * t;
#pragma unroll
        for (int d = 0; d < ND; d++) store2(row + d * 8, o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
        if (t == 0 && a.lse)
            a.lse[(size_t)h * a.total_tokens + s0 + i] = l[r] > 0.f ? m[r] / kLog2e + logf(l[r]) : -INFINITY;
    }
}

// dK, dV of 64 keys of KV head blockIdx.y: every query head of its GQA group, every query tile
// that sees one of the keys.
template <int D, typename IO>
__global__ void __launch_bounds__(kThreads) bwd_dkdv_kernel(ctrl_attention_args a, const float *Di) {
    constexpr int S = D + 8, Bq = Tile<D>::kDkdvQueries, NQ = Bq / 8, ND = D / 8;
    // K, V [kRows][S]; then two buffers of Q, dO [Bq][S] each; then two of lse, Di [Bq] each
    extern __shared__ uint4 smem[];
    __nv_bfloat16 *ks = reinterpret_cast<__nv_bfloat16 *>(smem), *vs = ks + kRows * S, *qbuf = vs + kRows * S;
    float *stats = reinterpret_cast<float *>(qbuf + 4 * Bq * S);
    const int seq = blockIdx.z, kvh = blockIdx.y, H = a.n_head, HK = a.n_kv_head, group = H / HK;
    const int s0 = a.cu_seqlens[seq], L = a.cu_seqlens[seq + 1] - s0, Tt = a.total_tokens;
    const int k0 = blockIdx.x * kRows; // the first keys see the most queries: scheduled first
    if (k0 >= L) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int k1 = min(k0 + kRows, L), j0 = k0 + warp * 16 + g; // this lane's keys: j0, j0 + 8
    stage<D, kRows>(ks, (const IO *)a.k, s0 + k0, L - k0, HK, kvh);
    stage<D, kRows>(vs, (const IO *)a.v, s0 + k0, L - k0, HK, kvh);
    float dk[ND][4], dv[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.f;
    const bool cap = a.softcap > 0.f; // as in the forward; dS also takes 1 - tanh^2
    const float sl2 = (cap ? a.softcap : a.scale) * kLog2e, tsc = cap ? a.scale / a.softcap : 0.f;
    const int qlo = ctrl_attention_first_query(a.causal, k0), qhi = ctrl_attention_query_end(a.window, k1, L);
    const int first = qlo - qlo % Bq, per_head = (qhi - first + Bq - 1) / Bq, tiles = group * per_head;
    // tile `it` of the (GQA head, query tile) pairs into buffer it % 2: Q and dO by cp.async, the
    // log-sum-exp (base 2; +inf past the end: P = 0 there) and Di by plain stores
    auto issue = [&](int it) {
        const int h = kvh * group + it / per_head, q0 = first + it % per_head * Bq;
        __nv_bfloat16 *qs = qbuf + (it & 1) * 2 * Bq * S;
        stage<D, Bq>(qs, (const IO *)a.q, s0 + q0, L - q0, H, h);
        stage<D, Bq>(qs + Bq * S, (const IO *)a.dout, s0 + q0, L - q0, H, h);
        ptx_cp_async_commit();
        float *st = stats + (it & 1) * 2 * Bq;
        for (int r = threadIdx.x; r < Bq; r += kThreads) {
            const int i = q0 + r;
            st[r] = i < L ? a.lse[(size_t)h * Tt + s0 + i] * kLog2e : INFINITY;
            st[Bq + r] = i < L ? Di[(size_t)h * Tt + s0 + i] : 0.f;
        }
    };
    issue(0); // with K and V in its group
    for (int it = 0; it < tiles; it++) {
        const int q0 = first + it % per_head * Bq;
        land_tile(it, tiles, issue);
        const __nv_bfloat16 *qs = qbuf + (it & 1) * 2 * Bq * S, *dos = qs + Bq * S;
        const float *lses = stats + (it & 1) * 2 * Bq, *dis = lses + Bq;
        float s[NQ][4], dp[NQ][4];
        two_products<D, Bq>(s, dp, ks, vs, qs, dos, warp * 16);
        if (cap) soft_cap(s, tsc);
        if (!(q0 + Bq <= L && k0 + kRows <= L && all_visible(a, q0, q0 + Bq, k0, k0 + kRows)))
            mask_tile<true>(s, a, L, j0, q0 + 2 * t);
#pragma unroll
        for (int n = 0; n < NQ; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = n * 8 + 2 * t + e % 2;
                const float p = ptx_exp2(fmaf(s[n][e], sl2, -lses[r]));
                dp[n][e] = p * (dp[n][e] - dis[r]) * cap_scale(cap, s[n][e], a.scale), s[n][e] = p;
            }
        acc_times<D, Bq>(dv, s, dos);
        acc_times<D, Bq>(dk, dp, qs);
        __syncthreads(); // every warp is done with this buffer before the next tile but one fills it
    }
    IO *dK = (IO *)a.dk, *dV = (IO *)a.dv;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int j = j0 + 8 * r;
        if (j >= L) continue;
        const size_t o = ((size_t)(s0 + j) * HK + kvh) * D + 2 * t;
#pragma unroll
        for (int d = 0; d < ND; d++) {
            store2(dK + o + d * 8, dk[d][2 * r], dk[d][2 * r + 1]);
            store2(dV + o + d * 8, dv[d][2 * r], dv[d][2 * r + 1]);
        }
    }
}

// dQ of 64 queries of head blockIdx.y: every key tile they see.
template <int D, typename IO>
__global__ void __launch_bounds__(kThreads) bwd_dq_kernel(ctrl_attention_args a, const float *Di) {
    constexpr int S = D + 8, Bc = Tile<D>::kDqKeys, NT = Bc / 8, ND = D / 8;
    // Q, dO [kRows][S]; then two buffers of K, V [Bc][S] each
    extern __shared__ uint4 smem[];
    __nv_bfloat16 *qs = reinterpret_cast<__nv_bfloat16 *>(smem), *dos = qs + kRows * S,
                  *kvbuf = dos + kRows * S;
    const int seq = blockIdx.z, h = blockIdx.y, H = a.n_head, HK = a.n_kv_head, kvh = h / (H / HK);
    const int s0 = a.cu_seqlens[seq], L = a.cu_seqlens[seq + 1] - s0, Tt = a.total_tokens;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kRows;
    if (q0 >= L) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int q1 = min(q0 + kRows, L), i0 = q0 + warp * 16 + g;
    const int lo = ctrl_attention_first_key(a.window, q0), hi = ctrl_attention_key_end(a.causal, q1, L);
    const int first = lo - lo % Bc, tiles = (hi - first + Bc - 1) / Bc;
    const IO *K = (const IO *)a.k, *V = (const IO *)a.v;
    auto issue = [&](int it) { // key tile `it` into buffer it % 2
        const int k0 = first + it * Bc;
        stage_kv<D, Bc>(kvbuf + (it & 1) * 2 * Bc * S, K, V, s0 + k0, L - k0, HK, kvh);
    };
    stage<D, kRows>(qs, (const IO *)a.q, s0 + q0, L - q0, H, h);
    stage<D, kRows>(dos, (const IO *)a.dout, s0 + q0, L - q0, H, h);
    issue(0); // with Q and dO in its group
    float lse2[2], di[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = i0 + 8 * r;
        lse2[r] = i < L ? a.lse[(size_t)h * Tt + s0 + i] * kLog2e : INFINITY;
        di[r] = i < L ? Di[(size_t)h * Tt + s0 + i] : 0.f;
    }
    float dq[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.f;
    const bool cap = a.softcap > 0.f; // as in the forward; dS also takes 1 - tanh^2
    const float sl2 = (cap ? a.softcap : a.scale) * kLog2e, tsc = cap ? a.scale / a.softcap : 0.f;
    for (int it = 0; it < tiles; it++) {
        const int k0 = first + it * Bc;
        land_tile(it, tiles, issue);
        const __nv_bfloat16 *ks = kvbuf + (it & 1) * 2 * Bc * S, *vs = ks + Bc * S;
        float s[NT][4], dp[NT][4];
        two_products<D, Bc>(s, dp, qs, dos, ks, vs, warp * 16);
        if (cap) soft_cap(s, tsc);
        if (!(k0 + Bc <= L && all_visible(a, q0, q0 + kRows, k0, k0 + Bc)))
            mask_tile<false>(s, a, L, i0, k0 + 2 * t);
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = ptx_exp2(fmaf(s[n][e], sl2, -lse2[e / 2]));
                dp[n][e] = p * (dp[n][e] - di[e / 2]) * cap_scale(cap, s[n][e], a.scale);
            }
        acc_times<D, Bc>(dq, dp, ks);
        __syncthreads(); // every warp is done with this buffer before the next tile but one fills it
    }
    IO *dQ = (IO *)a.dq;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = i0 + 8 * r;
        if (i >= L) continue;
        IO *row = dQ + ((size_t)(s0 + i) * H + h) * D + 2 * t;
#pragma unroll
        for (int d = 0; d < ND; d++) store2(row + d * 8, dq[d][2 * r], dq[d][2 * r + 1]);
    }
}

constexpr size_t smem_bytes(int rows) { return (size_t)rows * 2; }

template <int D> size_t fwd_smem() { return smem_bytes(4 * Tile<D>::kFwdKeys * (D + 8)); }
template <int D> size_t dkdv_smem() { // K, V; two buffers of Q, dO; two of lse, Di
    return smem_bytes((2 * kRows + 4 * Tile<D>::kDkdvQueries) * (D + 8)) +
           4 * Tile<D>::kDkdvQueries * sizeof(float);
}
template <int D> size_t dq_smem() { return smem_bytes((2 * kRows + 4 * Tile<D>::kDqKeys) * (D + 8)); }

template <int D, typename IO> ctrl_status forward(const ctrl_attention_args *a) {
    const int L = attention_max_len(a);
    if (L == 0) return CTRL_OK;
    const size_t sh = fwd_smem<D>();
    cudaFuncSetAttribute(fwd_kernel<D, IO>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh);
    fwd_kernel<D, IO><<<dim3((L + kRows - 1) / kRows, a->n_head, a->n_seqs), kThreads, sh>>>(*a);
    return attention_launch_error("flash", "forward (mma)");
}

// Device scratch from the core's allocator, released on scope exit.
struct Scratch {
    const ctrl_device_kernels *k;
    void *p = nullptr;
    ~Scratch() {
        if (p) k->free(p);
    }
};

template <int D, typename IO>
ctrl_status backward(const ctrl_attention_args *a, const ctrl_device_kernels *k) {
    const int L = attention_max_len(a), T = a->total_tokens, H = a->n_head;
    if (L == 0) return CTRL_OK;
    Scratch di{k};
    ctrl_status st = k->alloc(&di.p, (size_t)T * H * sizeof(float));
    if (st != CTRL_OK) return st;
    float *Di = (float *)di.p;
    using P = __nv_bfloat16; // Di from dO as the products read it (rounded to bf16)
    flash_rows::dot_rows_kernel<IO, P><<<flash_rows::dot_rows_grid(T, H), flash_rows::kDotRowsThreads>>>(
        Di, (const IO *)a->dout, (const IO *)a->out, T * H, H, D, T);
    if ((st = attention_launch_error("flash", "backward Di (mma)")) != CTRL_OK) return st;
    const size_t sh_kv = dkdv_smem<D>(), sh_q = dq_smem<D>();
    cudaFuncSetAttribute(bwd_dkdv_kernel<D, IO>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh_kv);
    cudaFuncSetAttribute(bwd_dq_kernel<D, IO>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sh_q);
    const dim3 tiles((L + kRows - 1) / kRows);
    bwd_dkdv_kernel<D, IO><<<dim3(tiles.x, a->n_kv_head, a->n_seqs), kThreads, sh_kv>>>(*a, Di);
    if ((st = attention_launch_error("flash", "backward dK/dV (mma)")) != CTRL_OK) return st;
    bwd_dq_kernel<D, IO><<<dim3(tiles.x, a->n_head, a->n_seqs), kThreads, sh_q>>>(*a, Di);
    return attention_launch_error("flash", "backward dQ (mma)");
}

const ctrl_device_kernels *scratch_kernels(const ctrl_attention_args *a) {
    const ctrl_device_kernels *k =
        ctrl_api && ctrl_api->device_kernels ? ctrl_api->device_kernels(a->device) : NULL;
    return k && k->alloc && k->free ? k : NULL;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

} // namespace

extern "C" const char *flash_cuda_mma_unsupported(const ctrl_attention_args *a) {
    const bool bf16_products =
        a->size >= offsetof(ctrl_attention_args, compute_bf16) + sizeof a->compute_bf16 && a->compute_bf16;
    if (a->dtype != CTRL_BF16 && !(a->dtype == CTRL_F32 && bf16_products))
        return "the tensors are neither bf16 nor fp32 with bf16 products (compute_bf16)";
    if (a->head_dim != 64 && a->head_dim != 128) return "head_dim is not 64 or 128";
    if (!(a->scale > 0.f)) return "scale is not positive";
    if (!aligned16(a->q) || !aligned16(a->k) || !aligned16(a->v) || !aligned16(a->out) ||
        (a->dout && !aligned16(a->dout)) || (a->dq && !aligned16(a->dq)) || (a->dk && !aligned16(a->dk)) ||
        (a->dv && !aligned16(a->dv)))
        return "a tensor is not 16-byte aligned";
    if (a->n_seqs > 65535 || a->n_head > 65535) return "more than 65535 sequences or heads";
    if (!scratch_kernels(a)) return "the core lends no device allocator";
    return NULL;
}

extern "C" ctrl_status flash_cuda_mma_forward(const ctrl_attention_args *a) {
    const bool bf16 = a->dtype == CTRL_BF16;
    if (a->head_dim == 64) return bf16 ? forward<64, __nv_bfloat16>(a) : forward<64, float>(a);
    return bf16 ? forward<128, __nv_bfloat16>(a) : forward<128, float>(a);
}

extern "C" ctrl_status flash_cuda_mma_backward(const ctrl_attention_args *a) {
    const ctrl_device_kernels *k = scratch_kernels(a);
    if (!k) return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "attention flash (cuda, mma): no device allocator");
    const bool bf16 = a->dtype == CTRL_BF16;
    if (a->head_dim == 64) return bf16 ? backward<64, __nv_bfloat16>(a, k) : backward<64, float>(a, k);
    return bf16 ? backward<128, __nv_bfloat16>(a, k) : backward<128, float>(a, k);
}
