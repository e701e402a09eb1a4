// Elementwise kernels: SwiGLU, residual adds, scaling, and the sum of squares for the global
// gradient norm (per-block partial sums in double, reduced in a second pass: deterministic).
#include <cuda_runtime.h>

#include "cuda/cuda_ops.h"
#include "cuda/launch.h"
#include "device/cuda_check.h"

namespace {

__global__ void swiglu_fwd(float *out, const float *g, const float *u, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float x = g[i];
        out[i] = x / (1.0f + expf(-x)) * u[i];
    }
}

__global__ void swiglu_bwd(float *dg, float *du, const float *dout, const float *g, const float *u, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float x = g[i], s = 1.0f / (1.0f + expf(-x));
        du[i] = dout[i] * x * s;
        dg[i] = dout[i] * u[i] * s * (1.0f + x * (1.0f - s));
    }
}

__global__ void add_fwd(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

__global__ void add_bwd(float *da, float *db, const float *dout, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

__global__ void scale_kernel(float *x, float s, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

// One double per block: the block's sum of squares.
__global__ void sum_squares_partial(const float *x, int64_t n, double *partial) {
    __shared__ double warp_sums[32];
    double s = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        s += (double)x[i] * x[i];
    for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0;
        for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
        if (threadIdx.x == 0) partial[blockIdx.x] = s;
    }
}

} // namespace

extern "C" ctrl_status ctrl_cuda_swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
    swiglu_fwd<<<ctrl_grid_for(n, 256), 256>>>(out, gate, up, n);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                                                 const float *up, int64_t n) {
    swiglu_bwd<<<ctrl_grid_for(n, 256), 256>>>(dgate, dup, dout, gate, up, n);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_residual_forward(float *out, const float *a, const float *b, int64_t n) {
    add_fwd<<<ctrl_grid_for(n, 256), 256>>>(out, a, b, n);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_residual_backward(float *da, float *db, const float *dout, int64_t n) {
    add_bwd<<<ctrl_grid_for(n, 256), 256>>>(da, db, dout, n);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_scale(float *x, float s, int64_t n) {
    scale_kernel<<<ctrl_grid_for(n, 256), 256>>>(x, s, n);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_sum_squares(const float *x, int64_t n, double *out) {
    const int blocks = ctrl_grid_for(n, 256);
    double *partial = nullptr;
    ctrl_status st = ctrl_cuda_malloc((void **)&partial, sizeof(double) * blocks);
    if (st != CTRL_OK) return st;
    sum_squares_partial<<<blocks, 256>>>(x, n, partial);
    cudaError_t err = cudaGetLastError();
    double host[132 * 32];
    if (err == cudaSuccess) err = cudaMemcpy(host, partial, sizeof(double) * blocks, cudaMemcpyDeviceToHost);
    ctrl_cuda_free(partial);
    if (err != cudaSuccess)
        return ctrl_error_set(CTRL_ERR_DEVICE, "%s:%d: sum of squares: %s", __FILE__, __LINE__, cudaGetErrorString(err));
    double s = 0;
    for (int i = 0; i < blocks; i++) s += host[i];
    *out = s;
    return CTRL_OK;
}
