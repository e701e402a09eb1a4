// LoRA's dropout on the device (core/model/lora.c; backend.h's lora_dropout): the mask drawn where
// the values are, from the counter-based hash the host draws it with, u_i = ((mix64(key + i *
// 0x9E3779B97F4A7C15) >> 11) + 0.5) / 2^53 (splitmix64's finalizer: integer operations, then one
// exact conversion and an exact division by a power of two), so every element's draw is the host's
// bit for bit and the kept value src * keep one rounded product as there.
#include <cuda_runtime.h>

#include "cuda/cuda_ops.h"
#include "cuda/launch.h"
#include "device/cuda_check.h"

namespace {

__device__ inline unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__global__ void lora_dropout(float *dst, const float *src, int64_t n, unsigned long long key, float p,
                             float keep) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const double u = ((double)(mix64(key + (unsigned long long)i * 0x9E3779B97F4A7C15ull) >> 11) + 0.5) /
                         9007199254740992.0;
        dst[i] = u < (double)p ? 0.0f : src[i] * keep;
    }
}

} // namespace

extern "C" ctrl_status ctrl_cuda_lora_dropout(float *dst, const float *src, int64_t n, uint64_t key, float p,
                                              float keep) {
    if (n <= 0) return CTRL_OK;
    lora_dropout<<<ctrl_grid_for(n, 256), 256>>>(dst, src, n, (unsigned long long)key, p, keep);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}
