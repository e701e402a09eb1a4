// fp32 <-> bf16 conversion (round to nearest even), vectorised by four.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/cuda_ops.h"
#include "device/cuda_check.h"

namespace {

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

// Four at a time where src is 16-byte and dst 8-byte aligned: one 16-byte load, one 8-byte store.
struct alignas(8) Bf16x4 {
    __nv_bfloat16 v[4];
};
__global__ void f32_to_bf16_x4_kernel(Bf16x4 *dst, const float4 *src, int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float4 f = src[i];
        Bf16x4 o;
        o.v[0] = __float2bfloat16_rn(f.x), o.v[1] = __float2bfloat16_rn(f.y);
        o.v[2] = __float2bfloat16_rn(f.z), o.v[3] = __float2bfloat16_rn(f.w);
        dst[i] = o;
    }
}

__global__ void bf16_to_f32_kernel(float *dst, const __nv_bfloat16 *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

__global__ void round_bf16_kernel(float *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(__float2bfloat16_rn(src[i]));
}

int grid_for(int64_t n) {
    int64_t blocks = (n + 255) / 256;
    return (int)(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

} // namespace

extern "C" ctrl_status ctrl_cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
    if (n % 4 == 0 && (uintptr_t)src % 16 == 0 && (uintptr_t)dst % 8 == 0) {
        f32_to_bf16_x4_kernel<<<grid_for(n / 4), 256>>>(reinterpret_cast<Bf16x4 *>(dst),
                                                        reinterpret_cast<const float4 *>(src), n / 4);
        CTRL_CUDA_CHECK_LAUNCH();
        return CTRL_OK;
    }
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
