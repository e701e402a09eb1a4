// The paged plugin's CUDA path: decoding attention over block pools through int32 block tables
// (the same arguments as the CPU path). SIMT baseline, correctness first: one block per (query
// token, kv head), one warp per query head of the GQA group; a warp walks the visible keys one at
// a time, its lanes splitting head_dim (dot products by warp shuffles), with an online softmax, so
// no score buffer and no limit on the context length. Soft-capping (Gemma 2, a.softcap > 0): each
// scaled score becomes cap tanh(s / cap) before the softmax. The split-K (vLLM v2) and tensor-core
// versions are to be built and tuned on a GPU against it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "../attention_cuda_common.cuh"

extern "C" {
#include "paged_cuda.h"
}

namespace {

constexpr int kMaxD = 128;           // head_dim up to this
constexpr int kPerLane = kMaxD / 32; // head_dim elements per lane

__device__ __forceinline__ float load(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename C> __global__ void decode_kernel(ctrl_paged_attention_args a) {
    const int t = blockIdx.x, kvh = blockIdx.y, g = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int D = a.head_dim, G = a.n_head / a.n_kv_head, h = kvh * G + g;
    if (g >= G) return;
    const int pos = a.positions[t], lo = ctrl_attention_first_key(a.window, pos);
    const int32_t *table = a.block_tables + (size_t)a.seq_of_token[t] * a.max_blocks_per_seq;
    const float *q = (const float *)a.q + ((size_t)t * a.n_head + h) * D;
    const C *kc = (const C *)a.k_cache, *vc = (const C *)a.v_cache;
    const size_t slot = (size_t)a.n_kv_head * D;
    float qr[kPerLane], acc[kPerLane];
    for (int i = 0; i < kPerLane; i++) {
        const int d = lane + 32 * i;
        qr[i] = d < D ? q[d] * a.scale : 0.f;
        acc[i] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int j = lo; j <= pos; j++) {
        const size_t row =
            ((size_t)table[j / a.block_size] * a.block_size + j % a.block_size) * slot + (size_t)kvh * D;
        float s = 0.f;
        for (int i = 0; i < kPerLane; i++) {
            const int d = lane + 32 * i;
            if (d < D) s += qr[i] * load(kc, row + d);
        }
        s = warp_sum(s);
        if (a.softcap > 0) s = a.softcap * tanhf(s / a.softcap); // Gemma 2: cap tanh(s / cap), as the CPU's
        const float mn = fmaxf(m, s), corr = __expf(m - mn), p = __expf(s - mn);
        l = l * corr + p;
        for (int i = 0; i < kPerLane; i++) {
            const int d = lane + 32 * i;
            acc[i] = acc[i] * corr + (d < D ? p * load(vc, row + d) : 0.f);
        }
        m = mn;
    }
    float *out = (float *)a.out + ((size_t)t * a.n_head + h) * D;
    for (int i = 0; i < kPerLane; i++) {
        const int d = lane + 32 * i;
        if (d < D) out[d] = acc[i] / l;
    }
}

} // namespace

extern "C" int paged_cuda_supported(const ctrl_paged_attention_args *a) {
    return a->device.type == CTRL_DEVICE_CUDA && a->dtype == CTRL_F32 &&
           (a->cache_dtype == CTRL_F32 || a->cache_dtype == CTRL_BF16) && a->head_dim <= kMaxD &&
           a->n_head / a->n_kv_head <= 32;
}

extern "C" ctrl_status paged_cuda_forward(const ctrl_paged_attention_args *a) {
    if (a->n_tokens == 0) return CTRL_OK;
    const dim3 grid(a->n_tokens, a->n_kv_head), block(32 * (a->n_head / a->n_kv_head));
    if (a->cache_dtype == CTRL_BF16)
        decode_kernel<__nv_bfloat16><<<grid, block>>>(*a);
    else
        decode_kernel<float><<<grid, block>>>(*a);
    return attention_launch_error("paged", "decode");
}
