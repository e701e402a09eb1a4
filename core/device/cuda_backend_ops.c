/* The CUDA backend ops table (see device/backend.h): the model's ops on device pointers, through
 * the kernels of kernels/cuda/cuda_ops.h, memory from the caching allocator. Most entries are the
 * kernels themselves (their signatures are the table's); this file holds only what needs adapting.
 * Nothing here includes a CUDA header: an emulation build that compiles the kernels/cuda .cu files for the
 * host (issue 20) links this same table and runs the model through it. Not yet here: bf16 compute
 * (linear_*_bf16, round_to_bf16: the model refuses `dtype = bf16` on this backend) and a one-pass
 * fused head (the model runs the head's forward, then its backward). */
#include "cuda/cuda_ops.h"
#include "device/cuda_backend.h"

#ifdef CTRL_HAVE_CUDA

static ctrl_status fill_zero(void *dst, size_t bytes) { return ctrl_cuda_memset(dst, 0, bytes); }

static ctrl_status adamw_step(float *param, const float *grad, float *m, float *v, int64_t n, float lr,
                              float beta1, float beta2, float eps, float weight_decay, int64_t step) {
    return ctrl_cuda_adamw_step(param, grad, m, v, NULL, n, lr, beta1, beta2, eps, weight_decay, step);
}

const ctrl_backend_ops *ctrl_cuda_backend_ops(void) {
    static const ctrl_backend_ops ops = {
        .size = sizeof(ctrl_backend_ops),
        .name = "cuda",
        .device_type = CTRL_DEVICE_CUDA,
        .host_memory = 0,
        .alloc = ctrl_cuda_malloc,
        .free = ctrl_cuda_free,
        .to_device = ctrl_cuda_memcpy_h2d,
        .to_host = ctrl_cuda_memcpy_d2h,
        .copy = ctrl_cuda_memcpy_d2d,
        .fill_zero = fill_zero,
        .synchronize = ctrl_cuda_synchronize,
        .embedding_forward = ctrl_cuda_embedding_forward,
        .embedding_backward = ctrl_cuda_embedding_backward,
        .rmsnorm_forward = ctrl_cuda_rmsnorm_forward,
        .rmsnorm_backward = ctrl_cuda_rmsnorm_backward,
        .linear_forward = ctrl_cuda_linear_forward_f32,
        .linear_backward = ctrl_cuda_linear_backward_f32,
        .rope_forward = ctrl_cuda_rope_forward,
        .rope_backward = ctrl_cuda_rope_backward,
        .swiglu_forward = ctrl_cuda_swiglu_forward,
        .swiglu_backward = ctrl_cuda_swiglu_backward,
        .residual_forward = ctrl_cuda_residual_forward,
        .residual_backward = ctrl_cuda_residual_backward,
        .head_workspace_bytes = ctrl_cuda_head_workspace_bytes,
        .head_forward = ctrl_cuda_head_forward,
        .head_backward = ctrl_cuda_head_backward,
        .sum_squares = ctrl_cuda_sum_squares,
        .scale = ctrl_cuda_scale,
        .adamw_step = adamw_step,
    };
    return &ops;
}

#else /* built without CUDA: no device, no ops */

const ctrl_backend_ops *ctrl_cuda_backend_ops(void) { return NULL; }

#endif
