// DoRA's per-row ops on the GPU (core/model/dora.c; cpu_ops.h's ctrl_cpu_dora_*, which they match):
// the weight norm of each output row of W + s B A, the magnitude's scaling of each row's output and the
// magnitude's gradient, so that a DoRA layer on CUDA never stages its [T, OUT] operands through the host.
// Sums in double as the CPU's.
#include <cuda_runtime.h>

#include "cuda/cuda_ops.h"
#include "cuda/launch.h"
#include "device/cuda_check.h"

namespace {

// One warp a row: ||W_j||^2 + sum_k B_jk (2 s WA_jk + s^2 BG_jk), its square root; g_j = mag_j / norm_j.
__global__ void dora_norm_kernel(float *norm, float *g, const float *W, const float *B, const float *WA,
                                 const float *BG, const float *mag, float s, int OUT, int IN, int r) {
    const int j = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (j >= OUT) return;
    if (W) {
        double n2 = 0;
        const float *w = W + (int64_t)j * IN;
        for (int i = lane; i < IN; i += 32) n2 += (double)w[i] * w[i];
        for (int k = lane; k < r; k += 32) {
            const int64_t jk = (int64_t)j * r + k;
            n2 += (double)B[jk] * (2 * (double)s * WA[jk] + (double)s * s * BG[jk]);
        }
        for (int off = 16; off > 0; off /= 2) n2 += __shfl_xor_sync(0xffffffffu, n2, off);
        if (lane == 0) norm[j] = (float)sqrt(n2 > 0 ? n2 : 0);
    }
    if (g && lane == 0) g[j] = mag[j] / norm[j];
}

__global__ void dora_combine_kernel(float *out, const float *yl, const float *yb, const float *bias,
                                    const float *g, int64_t n, int OUT) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int j = (int)(i % OUT);
        const float o = out[i], base = yb ? yb[i] : bias ? o - bias[j] : o;
        out[i] = o + ((g[j] - 1.0f) * base + g[j] * yl[i]);
    }
}

// One thread a column j, over the T rows in order (as the CPU's sum).
__global__ void dora_backward_kernel(float *dmag, float *yl, float *yb, const float *dout, const float *norm,
                                     const float *g, int T, int OUT) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= OUT) return;
    double acc = 0;
    for (int t = 0; t < T; t++) {
        const int64_t k = (int64_t)t * OUT + j;
        acc += (double)dout[k] * ((double)yb[k] + yl[k]);
        yl[k] = g[j] * dout[k], yb[k] = (g[j] - 1.0f) * dout[k];
    }
    dmag[j] += (float)(acc / norm[j]);
}

} // namespace

extern "C" ctrl_status ctrl_cuda_dora_norm(float *norm, float *g, const float *W, const float *B, const float *WA,
                                           const float *BG, const float *mag, float s, int OUT, int IN, int r) {
    if (OUT > 0) dora_norm_kernel<<<(OUT + 7) / 8, 256>>>(norm, g, W, B, WA, BG, mag, s, OUT, IN, r);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_dora_combine(float *out, const float *yl, const float *yb, const float *bias,
                                              const float *g, int T, int OUT) {
    const int64_t n = (int64_t)T * OUT;
    if (n > 0) dora_combine_kernel<<<ctrl_grid_for(n, 256), 256>>>(out, yl, yb, bias, g, n, OUT);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_dora_backward(float *dmag, float *yl, float *yb, const float *dout,
                                               const float *norm, const float *g, int T, int OUT) {
    if (OUT > 0) dora_backward_kernel<<<(OUT + 127) / 128, 128>>>(dmag, yl, yb, dout, norm, g, T, OUT);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}
