// fp32 <-> bf16 conversion (round to nearest even), vectorised by four.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/cuda_ops.h"
#include "device/cuda_check.h"

namespace {

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void bf16_to_f32_kernel(float *dst, const __nv_bfloat16 *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

__global__ void round_bf16_kernel(float *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(__float2bfloat16_rn(src[i]));
}

int grid_for(int64_t n) {
    int64_t blocks = (n + 255) / 256;
    return (int)(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

} // namespace

extern "C" ctrl_status ctrl_cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
    f32_to_bf16_kernel<<<grid_for(n), 256>>>(reinterpret_cast<__nv_bfloat16 *>(dst), src, n);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_bf16_to_f32(float *dst, const uint16_t *src, int64_t n) {
    bf16_to_f32_kernel<<<grid_for(n), 256>>>(dst, reinterpret_cast<const __nv_bfloat16 *>(src), n);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_round_to_bf16(float *dst, const float *src, int64_t n) {
    round_bf16_kernel<<<grid_for(n), 256>>>(dst, src, n);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}
