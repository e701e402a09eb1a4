// QLoRA's NF4 dequantization on the device (core/model/nf4.h: bitsandbytes' nf4, blocks of 64,
// double-quantized absmax): a layer's projection weights are dequantized into the model's fp32
// slot before its forward or backward, as the CPU does (core/model/model_nf4.c). The same
// arithmetic as ctrl_nf4_absmax + ctrl_nf4_dequantize, each operation rounded on its own (no fused
// multiply-add: __fmul_rn / __fadd_rn), so the values are the CPU's bit for bit.
#include <cuda_runtime.h>

#include "cuda/cuda_ops.h"
#include "cuda/launch.h"
#include "device/cuda_check.h"

namespace {

#ifdef CTRL_EMU_CUDA_RUNTIME_H /* the emulator (host C++): a volatile keeps the product rounded */
__device__ inline float mul_rn(float a, float b) {
    volatile float p = a * b;
    return p;
}
__device__ inline float add_rn(float a, float b) {
    volatile float s = a + b;
    return s;
}
#else
__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
#endif

// One thread per byte: its two values (the first in the high nibble), of the same block of 64.
__global__ void nf4_dequant(float *out, const uint8_t *packed, const uint8_t *qabsmax, const float *absmax2,
                            float offset, const float *code, const float *dynamic, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; 2 * i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t v = 2 * i, b = v / 64;
        const float s = add_rn(mul_rn(dynamic[qabsmax[b]], absmax2[b / 256]), offset);
        const uint8_t byte = packed[i];
        out[v] = mul_rn(code[byte >> 4], s);
        if (v + 1 < n) out[v + 1] = mul_rn(code[byte & 0xF], s);
    }
}

} // namespace

extern "C" ctrl_status ctrl_cuda_nf4_dequantize(float *out, const uint8_t *packed, const uint8_t *qabsmax,
                                                const float *absmax2, float offset, const float *code,
                                                const float *dynamic, int64_t n) {
    if (n <= 0) return CTRL_OK;
    const int64_t bytes = (n + 1) / 2;
    nf4_dequant<<<ctrl_grid_for(bytes, 256), 256>>>(out, packed, qabsmax, absmax2, offset, code, dynamic, n);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}
