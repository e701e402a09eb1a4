// AdamW over a flat fp32 buffer in one pass (torch.optim.AdamW's formula), optionally writing the
// bf16 compute copy of the updated parameters in the same pass.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#include "cuda/cuda_ops.h"
#include "cuda/launch.h"
#include "device/cuda_check.h"

namespace {

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, __nv_bfloat16 *p16, int64_t n, float lr,
                             float b1, float b2, float eps, float decay, float step_size, float bc2_sqrt) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float gi = g[i], pi = p[i] * decay;
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        pi -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
        if (p16) p16[i] = __float2bfloat16_rn(pi);
    }
    (void)lr;
}

} // namespace

extern "C" ctrl_status ctrl_cuda_adamw_step(float *param, const float *grad, float *m, float *v, uint16_t *param_bf16,
                                            int64_t n, float lr, float beta1, float beta2, float eps,
                                            float weight_decay, int64_t step) {
    if (step < 1) return ctrl_error_set(CTRL_ERR_RUNTIME, "adamw: step must count from 1 (got %lld)", (long long)step);
    const double bc1 = 1.0 - pow((double)beta1, (double)step);
    const float step_size = (float)(lr / bc1);
    const float bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, (double)step));
    const float decay = (float)(1.0 - (double)lr * weight_decay);
    adamw_kernel<<<ctrl_grid_for(n, 256), 256>>>(param, grad, m, v, reinterpret_cast<__nv_bfloat16 *>(param_bf16), n,
                                                 lr, beta1, beta2, eps, decay, step_size, bc2_sqrt);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}
