// RMSNorm on the GPU: one warp per row (C up to any size, strided), rstd saved for backward.
// Backward: dx per row in one warp; dweight per channel over all rows (deterministic order).
// Gemma's (the _1p entry points) scales by (1 + w): offset 1, the product (x r)(1 + w) in the CPU's order.
#include <cuda_runtime.h>

#include "cuda/cuda_ops.h"
#include "device/cuda_check.h"

namespace {

__device__ float warp_sum(float v) {
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__global__ void rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int T, int C, float eps,
                            float offset) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= T) return;
    const float *xr = x + (size_t)row * C;
    float ss = 0;
    for (int c = lane; c < C; c += 32) ss += xr[c] * xr[c];
    ss = warp_sum(ss);
    float r = rsqrtf(ss / C + eps);
    float *o = out + (size_t)row * C;
    if (offset == 0.0f)
        for (int c = lane; c < C; c += 32) o[c] = w[c] * (xr[c] * r);
    else
        for (int c = lane; c < C; c += 32) o[c] = (xr[c] * r) * (offset + w[c]);
    if (lane == 0) rstd[row] = r;
}

__global__ void rmsnorm_bwd_dx(float *dx, const float *dout, const float *x, const float *w,
                               const float *rstd, int T, int C, float offset) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= T) return;
    const float *xr = x + (size_t)row * C, *dy = dout + (size_t)row * C;
    float dot = 0;
    for (int c = lane; c < C; c += 32) dot += (offset + w[c]) * dy[c] * xr[c];
    dot = warp_sum(dot);
    const float r = rstd[row], k = dot / C * r * r * r;
    float *d = dx + (size_t)row * C;
    for (int c = lane; c < C; c += 32) d[c] = r * (offset + w[c]) * dy[c] - k * xr[c];
}

// dweight in two deterministic passes: partial sums over slices of kRowsPerSlice rows (enough
// blocks to fill the GPU even when C is small), then a fixed-order sum of the slices.
constexpr int kRowsPerSlice = 128;

__global__ void rmsnorm_bwd_dw_partial(float *partial, const float *dout, const float *x, const float *rstd,
                                       int T, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, slice = blockIdx.y;
    if (c >= C) return;
    int t0 = slice * kRowsPerSlice, t1 = min(T, t0 + kRowsPerSlice);
    float s = 0;
    for (int t = t0; t < t1; t++) s += dout[(size_t)t * C + c] * x[(size_t)t * C + c] * rstd[t];
    partial[(size_t)slice * C + c] = s;
}

__global__ void rmsnorm_bwd_dw_sum(float *dw, const float *partial, int slices, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0;
    for (int i = 0; i < slices; i++) s += partial[(size_t)i * C + c];
    dw[c] += s;
}

} // namespace

static ctrl_status rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight, int T, int C,
                                   float eps, float offset) {
    rmsnorm_fwd<<<(T + 7) / 8, 256>>>(out, rstd, x, weight, T, C, eps, offset);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

static ctrl_status rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x,
                                    const float *weight, const float *rstd, int T, int C, float offset) {
    rmsnorm_bwd_dx<<<(T + 7) / 8, 256>>>(dx, dout, x, weight, rstd, T, C, offset);
    CTRL_CUDA_CHECK_LAUNCH();
    if (!dweight) return CTRL_OK; /* a frozen weight (LoRA) */
    const int slices = (T + kRowsPerSlice - 1) / kRowsPerSlice;
    float *partial = nullptr;
    ctrl_status st = ctrl_cuda_malloc((void **)&partial, sizeof(float) * (size_t)slices * C);
    if (st != CTRL_OK) return st;
    rmsnorm_bwd_dw_partial<<<dim3((C + 127) / 128, slices), 128>>>(partial, dout, x, rstd, T, C);
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) {
        rmsnorm_bwd_dw_sum<<<(C + 127) / 128, 128>>>(dweight, partial, slices, C);
        err = cudaGetLastError();
    }
    ctrl_cuda_free(partial); /* back to the cache; stream order keeps it valid for the kernels */
    if (err != cudaSuccess)
        return ctrl_error_set(CTRL_ERR_DEVICE, "%s:%d: rmsnorm backward: %s", __FILE__, __LINE__,
                              cudaGetErrorString(err));
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight,
                                                 int T, int C, float eps) {
    return rmsnorm_forward(out, rstd, x, weight, T, C, eps, 0.0f);
}

extern "C" ctrl_status ctrl_cuda_rmsnorm_backward(float *dx, float *dweight, const float *dout,
                                                  const float *x, const float *weight, const float *rstd,
                                                  int T, int C) {
    return rmsnorm_backward(dx, dweight, dout, x, weight, rstd, T, C, 0.0f);
}

extern "C" ctrl_status ctrl_cuda_rmsnorm_1p_forward(float *out, float *rstd, const float *x,
                                                    const float *weight, int T, int C, float eps) {
    return rmsnorm_forward(out, rstd, x, weight, T, C, eps, 1.0f);
}

extern "C" ctrl_status ctrl_cuda_rmsnorm_1p_backward(float *dx, float *dweight, const float *dout,
                                                     const float *x, const float *weight, const float *rstd,
                                                     int T, int C) {
    return rmsnorm_backward(dx, dweight, dout, x, weight, rstd, T, C, 1.0f);
}
