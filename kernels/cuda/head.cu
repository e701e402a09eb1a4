// The fused LM head on the GPU (see kernels/cpu/head.c for the math): per token chunk and vocab
// chunk, logits come from a cuBLASLt GEMM into a [Tc, Vc] buffer, a warp per row folds them into
// running (max, sum exp, sum exp*z, argmax, target logit); backward recomputes the chunk, turns
// it into dlogits in place, and two GEMMs give dhidden and dW. [T, V] never exists. With
// ctrl_head_args.bf16 (the model computing in bf16, as autocast runs lm_head) every GEMM reads its
// operands rounded to bf16 -- the hidden chunk, the weight chunk, the dlogits -- with fp32
// accumulation and results, as the CPU head does (kernels/cpu/head.c). Final-logit soft-capping
// (ctrl_head_args.softcap = c > 0, Gemma 2): z = c tanh(h W^T / c) / temperature, and the backward's
// dlogits times the cap's 1 - tanh^2, as the CPU head. ctrl_head_args.w16 (the model's bf16 copy of its
// weights): the weight chunks are read from it, never rounded here.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "device/cuda_check.h"

namespace {

constexpr int kDefaultChunkTokens = 1024;
constexpr int kDefaultChunkVocab = 32768;
constexpr int kRowsPerBlock = 8; // one warp per row, 256 threads

int chunk_t(const ctrl_head_args *a) {
    int c = a->chunk_tokens > 0 ? a->chunk_tokens : kDefaultChunkTokens;
    return c < a->T ? c : (a->T > 0 ? a->T : 1);
}
int chunk_v(const ctrl_head_args *a) {
    int c = a->chunk_vocab > 0 ? a->chunk_vocab : kDefaultChunkVocab;
    return c < a->V ? c : a->V;
}

// Per-token running statistics of one token chunk.
struct Stats {
    float *m, *s, *acc, *zt, *best;
    int *arg;
};

Stats stats_of(void *workspace, int TC, int VC) {
    float *f = (float *)workspace + (size_t)TC * VC;
    return Stats{f, f + TC, f + 2 * TC, f + 3 * TC, f + 4 * TC, (int *)(f + 5 * TC)};
}

// The bf16 copies of a chunk's operands (only with a->bf16), after the fp32 part of the workspace:
// hidden [TC, C], weights [VC, C], dlogits [TC, VC].
struct Bf16Chunk {
    uint16_t *h, *w, *z;
};
size_t fp32_part(int TC, int VC) {
    return (sizeof(float) * ((size_t)TC * VC + 6 * (size_t)TC) + 255) / 256 * 256;
}
Bf16Chunk bf16_of(void *workspace, int TC, int VC, int C) {
    uint16_t *b = (uint16_t *)((char *)workspace + fp32_part(TC, VC));
    return Bf16Chunk{b, b + (size_t)TC * C, b + (size_t)TC * C + (size_t)VC * C};
}

__global__ void softcap_kernel(float *z, int64_t n, float cap, float temp) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        z[i] = cap * tanhf(z[i] / cap) / temp;
}

// z[tc, vc] = h W^T / temperature for the chunk (soft-capped first), in fp32 or on bf16 copies (hb
// holds the hidden chunk already; the weight chunk is a->w16's rows where the model holds its weights
// in bf16, else rounded here into b.w). *wb: the bf16 weight chunk multiplied (bf16 only).
ctrl_status chunk_logits(const ctrl_head_args *a, float *z, const Bf16Chunk &b, int t0, int tc, int v0,
                         int vc, const uint16_t **wb) {
    const float *h = a->hidden + (size_t)t0 * a->C, *w = a->w + (size_t)v0 * a->C;
    const float alpha = a->softcap > 0 ? 1.0f : 1.0f / a->temperature;
    ctrl_status s = CTRL_OK;
    if (!a->bf16) {
        s = ctrl_cuda_gemm_f32(0, 1, tc, vc, a->C, alpha, h, a->C, w, a->C, 0.0f, z, vc);
    } else {
        *wb = a->w16 ? a->w16 + (size_t)v0 * a->C : b.w;
        if (!a->w16) s = ctrl_cuda_f32_to_bf16(b.w, w, (int64_t)vc * a->C);
        if (s == CTRL_OK)
            s = ctrl_cuda_gemm(0, 1, tc, vc, a->C, alpha, b.h, a->C, *wb, a->C, 0.0f, z, vc, CTRL_BF16,
                               CTRL_F32);
    }
    if (s != CTRL_OK || !(a->softcap > 0)) return s;
    const int64_t n = (int64_t)tc * vc;
    softcap_kernel<<<(int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096), 256>>>(z, n, a->softcap,
                                                                                    a->temperature);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

__global__ void stats_init(Stats st, int tc) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tc) return;
    st.m[i] = -INFINITY, st.s[i] = 0, st.acc[i] = 0, st.zt[i] = 0, st.best[i] = -INFINITY, st.arg[i] = -1;
}

__global__ void stats_update(Stats st, const float *z, const int32_t *targets, int tc, int vc, int v0) {
    int i = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (i >= tc) return;
    const float *row = z + (size_t)i * vc;
    float cm = -INFINITY;
    int ci = 0x7fffffff;
    for (int j = lane; j < vc; j += 32)
        if (row[j] > cm) cm = row[j], ci = j;
    for (int off = 16; off > 0; off /= 2) {
        float om = __shfl_xor_sync(0xffffffffu, cm, off);
        int oi = __shfl_xor_sync(0xffffffffu, ci, off);
        if (om > cm || (om == cm && oi < ci)) cm = om, ci = oi; // ties: the first index, as argmax
    }
    const float old_m = st.m[i], nm = fmaxf(cm, old_m);
    float se = 0, sez = 0;
    for (int j = lane; j < vc; j += 32) {
        float e = expf(row[j] - nm);
        se += e;
        sez += e * row[j];
    }
    for (int off = 16; off > 0; off /= 2) {
        se += __shfl_xor_sync(0xffffffffu, se, off);
        sez += __shfl_xor_sync(0xffffffffu, sez, off);
    }
    if (lane == 0) {
        const float rescale = old_m == -INFINITY ? 0.0f : expf(old_m - nm);
        st.s[i] = st.s[i] * rescale + se;
        st.acc[i] = st.acc[i] * rescale + sez;
        st.m[i] = nm;
        if (cm > st.best[i]) st.best[i] = cm, st.arg[i] = v0 + ci;
        const int32_t tg = targets[i];
        if (tg >= v0 && tg < v0 + vc) st.zt[i] = row[tg - v0];
    }
}

__global__ void stats_finish(Stats st, const int32_t *targets, int tc, int V, float *logp, float *entropy,
                             float *lse, int32_t *correct) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tc) return;
    const float l = st.m[i] + logf(st.s[i]);
    const int32_t tg = targets[i];
    const bool has = tg >= 0 && tg < V;
    lse[i] = l;
    logp[i] = has ? st.zt[i] - l : 0.0f;
    if (entropy) entropy[i] = has ? l - st.acc[i] / st.s[i] : 0.0f;
    if (correct) correct[i] = has && st.arg[i] == tg;
}

// dlogits in place of the recomputed scaled logits; with z16 (bf16 products) rounded to bf16 into
// z16 instead (what the two GEMMs read: no fp32 dlogits written, no conversion pass).
__global__ void dlogits_kernel(float *z, __nv_bfloat16 *z16, const int32_t *targets, const float *lse,
                               const float *dlogp, const float *entropy, const float *dentropy, int tc,
                               int vc, int v0, int V, float inv_temp, float cap_u) {
    int i = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (i >= tc) return;
    float *row = z + (size_t)i * vc;
    __nv_bfloat16 *row16 = z16 ? z16 + (size_t)i * vc : nullptr;
    const int32_t tg = targets[i];
    if (tg < 0 || tg >= V) {
        for (int j = lane; j < vc; j += 32)
            if (row16)
                row16[j] = __float2bfloat16_rn(0.0f);
            else
                row[j] = 0.0f;
        return;
    }
    const float l = lse[i], g = dlogp[i];
    const float ge = dentropy ? dentropy[i] : 0.0f, H = (entropy && dentropy) ? entropy[i] : 0.0f;
    for (int j = lane; j < vc; j += 32) {
        const float p = expf(row[j] - l);
        float dz = -g * p;
        if (ge != 0.0f) dz -= ge * p * (row[j] - l + H);
        if (v0 + j == tg) dz += g;
        const float th = row[j] * cap_u; // soft-capped: tanh of the raw logit (cap_u = temperature / cap)
        const float d = cap_u != 0.0f ? dz * inv_temp * (1.0f - th * th) : dz * inv_temp;
        if (row16)
            row16[j] = __float2bfloat16_rn(d);
        else
            row[j] = d;
    }
}

} // namespace

extern "C" size_t ctrl_cuda_head_workspace_bytes(const ctrl_head_args *a) {
    const int TC = chunk_t(a), VC = chunk_v(a);
    const size_t bf16 =
        a->bf16 ? sizeof(uint16_t) * ((size_t)TC * a->C + (size_t)VC * a->C + (size_t)TC * VC) : 0;
    return fp32_part(TC, VC) + bf16;
}

extern "C" ctrl_status ctrl_cuda_head_forward(const ctrl_head_args *a, float *logp, float *entropy,
                                              float *lse, int32_t *correct, void *workspace) {
    const int TC = chunk_t(a), VC = chunk_v(a);
    float *z = (float *)workspace;
    Stats st = stats_of(workspace, TC, VC);
    const Bf16Chunk b = bf16_of(workspace, TC, VC, a->C);
    for (int t0 = 0; t0 < a->T; t0 += TC) {
        const int tc = t0 + TC <= a->T ? TC : a->T - t0;
        stats_init<<<(tc + 255) / 256, 256>>>(st, tc);
        CTRL_CUDA_CHECK_LAUNCH();
        if (a->bf16) {
            ctrl_status s = ctrl_cuda_f32_to_bf16(b.h, a->hidden + (size_t)t0 * a->C, (int64_t)tc * a->C);
            if (s != CTRL_OK) return s;
        }
        for (int v0 = 0; v0 < a->V; v0 += VC) {
            const int vc = v0 + VC <= a->V ? VC : a->V - v0;
            const uint16_t *wb = nullptr;
            ctrl_status s = chunk_logits(a, z, b, t0, tc, v0, vc, &wb);
            if (s != CTRL_OK) return s;
            stats_update<<<(tc + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock>>>(
                st, z, a->targets + t0, tc, vc, v0);
            CTRL_CUDA_CHECK_LAUNCH();
        }
        stats_finish<<<(tc + 255) / 256, 256>>>(st, a->targets + t0, tc, a->V, logp + t0,
                                                entropy ? entropy + t0 : nullptr, lse + t0,
                                                correct ? correct + t0 : nullptr);
        CTRL_CUDA_CHECK_LAUNCH();
    }
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_head_backward(const ctrl_head_args *a, const float *lse, const float *dlogp,
                                               const float *entropy, const float *dentropy, float *dhidden,
                                               float *dw, void *workspace) {
    const int TC = chunk_t(a), VC = chunk_v(a);
    float *z = (float *)workspace;
    const Bf16Chunk b = bf16_of(workspace, TC, VC, a->C);
    for (int t0 = 0; t0 < a->T; t0 += TC) {
        const int tc = t0 + TC <= a->T ? TC : a->T - t0;
        const float *h = a->hidden + (size_t)t0 * a->C;
        if (a->bf16) {
            ctrl_status s = ctrl_cuda_f32_to_bf16(b.h, h, (int64_t)tc * a->C);
            if (s != CTRL_OK) return s;
        }
        for (int v0 = 0; v0 < a->V; v0 += VC) {
            const int vc = v0 + VC <= a->V ? VC : a->V - v0;
            const uint16_t *wb = nullptr;
            ctrl_status s = chunk_logits(a, z, b, t0, tc, v0, vc, &wb);
            if (s != CTRL_OK) return s;
            dlogits_kernel<<<(tc + kRowsPerBlock - 1) / kRowsPerBlock, 32 * kRowsPerBlock>>>(
                z, a->bf16 ? reinterpret_cast<__nv_bfloat16 *>(b.z) : nullptr, a->targets + t0, lse + t0,
                dlogp + t0, entropy ? entropy + t0 : nullptr, dentropy ? dentropy + t0 : nullptr, tc, vc, v0,
                a->V, 1.0f / a->temperature, a->softcap > 0 ? a->temperature / a->softcap : 0.0f);
            CTRL_CUDA_CHECK_LAUNCH();
            // dhidden[t0 : t0+tc] (+)= dlogits W[v0 : v0+vc];  dW[v0 : v0+vc] += dlogits^T h
            const float beta = v0 == 0 ? 0.0f : 1.0f;
            float *dh = dhidden + (size_t)t0 * a->C, *dwc = dw ? dw + (size_t)v0 * a->C : nullptr;
            if (a->bf16) { /* wb: the weight chunk chunk_logits multiplied; b.z: the bf16 dlogits */
                s = ctrl_cuda_gemm(0, 0, tc, a->C, vc, 1.0f, b.z, vc, wb, a->C, beta, dh, a->C, CTRL_BF16,
                                   CTRL_F32);
                if (s == CTRL_OK && dwc) /* none for a frozen head (LoRA) */
                    s = ctrl_cuda_gemm(1, 0, vc, a->C, tc, 1.0f, b.z, vc, b.h, a->C, 1.0f, dwc, a->C,
                                       CTRL_BF16, CTRL_F32);
            } else {
                s = ctrl_cuda_gemm_f32(0, 0, tc, a->C, vc, 1.0f, z, vc, a->w + (size_t)v0 * a->C, a->C, beta,
                                       dh, a->C);
                if (s == CTRL_OK && dwc)
                    s = ctrl_cuda_gemm_f32(1, 0, vc, a->C, tc, 1.0f, z, vc, h, a->C, 1.0f, dwc, a->C);
            }
            // trainable_token_indices on a tied head: the gradient of its rows alone, as dW's rows
            for (int k = 0; s == CTRL_OK && k < a->tt_n; k++) {
                const int v = a->tt_rows[k];
                if (v < v0 || v >= v0 + vc) continue;
                float *dr = a->tt_dw + (size_t)k * a->C;
                s = a->bf16 ? ctrl_cuda_gemm(1, 0, 1, a->C, tc, 1.0f, (const uint16_t *)b.z + (v - v0), vc,
                                             b.h, a->C, 1.0f, dr, a->C, CTRL_BF16, CTRL_F32)
                            : ctrl_cuda_gemm_f32(1, 0, 1, a->C, tc, 1.0f, z + (v - v0), vc, h, a->C, 1.0f, dr,
                                                 a->C);
            }
            if (s != CTRL_OK) return s;
        }
    }
    return CTRL_OK;
}
