// Decoding's K/V append (see cuda_ops.h): the new tokens' K and V rows scattered into one layer's
// paged pools at the rows the block tables give them (slots computed on the host), converted to the
// cache's dtype on the way. One grid-stride loop over T x D elements, both pools per element.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/cuda_ops.h"
#include "cuda/launch.h"
#include "device/cuda_check.h"

namespace {

template <typename C> __device__ __forceinline__ C to_cache(float x);
template <> __device__ __forceinline__ float to_cache<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 to_cache<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

template <typename C>
__global__ void kv_append_kernel(C *kc, C *vc, const float *k, const float *v, const int32_t *slots, int T,
                                 int D) {
    const int64_t n = (int64_t)T * D;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / D, d = i % D, at = (int64_t)slots[t] * D + d;
        kc[at] = to_cache<C>(k[i]);
        vc[at] = to_cache<C>(v[i]);
    }
}

} // namespace

extern "C" ctrl_status ctrl_cuda_kv_append(void *k_cache, void *v_cache, const float *k, const float *v,
                                           const int32_t *slots, int T, int D, ctrl_dtype cache_dtype) {
    if (T <= 0) return CTRL_OK;
    const int64_t n = (int64_t)T * D;
    if (cache_dtype == CTRL_BF16)
        kv_append_kernel<__nv_bfloat16><<<ctrl_grid_for(n, 256), 256>>>(
            static_cast<__nv_bfloat16 *>(k_cache), static_cast<__nv_bfloat16 *>(v_cache), k, v, slots, T, D);
    else if (cache_dtype == CTRL_F32)
        kv_append_kernel<float><<<ctrl_grid_for(n, 256), 256>>>(
            static_cast<float *>(k_cache), static_cast<float *>(v_cache), k, v, slots, T, D);
    else
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "cuda kv_append: cache dtype %s (fp32 or bf16)",
                              ctrl_dtype_name(cache_dtype));
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}
