// Shared by the flash plugin's CUDA GEMM and mma paths (header-only): element conversions and the
// row dot products Di = dO . O that the backward of both needs.
#ifndef CTRL_FLASH_CUDA_ROWS_CUH
#define CTRL_FLASH_CUDA_ROWS_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>

namespace flash_rows {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16(x);
}

// Di[h, t] = dO[t, h, :] . O[t, h, :] (fp32), one warp per (token, head), with dO as the products
// read it (type P: rounded to bf16 for bf16 products), so that Di is the row's sum of P dP.
template <typename IO, typename P>
__global__ void dot_rows_kernel(float *Di, const IO *dO, const IO *O, int TH, int H, int D, int total) {
    const int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (w >= TH) return;
    const size_t o = (size_t)w * D;
    float v = 0.f;
    for (int d = lane; d < D; d += 32) v += to_f32(from_f32<P>(to_f32(dO[o + d]))) * to_f32(O[o + d]);
    for (int k = 16; k > 0; k >>= 1) v += __shfl_xor_sync(0xffffffffu, v, k);
    if (lane == 0) Di[(size_t)(w % H) * total + w / H] = v;
}

// The launch configuration of dot_rows_kernel over T x H rows (the launch itself stays in the
// .cu files: the emulator rewrites launches there only).
inline dim3 dot_rows_grid(int T, int H) { return dim3((unsigned)(((size_t)T * H * 32 + 255) / 256)); }
constexpr int kDotRowsThreads = 256;

} // namespace flash_rows

#endif
