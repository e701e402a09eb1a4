/* The CUDA backend ops table (see device/backend.h): the model's ops on device pointers, through
 * the kernels of kernels/cuda/cuda_ops.h, memory from the caching allocator. Most entries are the
 * kernels themselves (their signatures are the table's); this file holds only what needs adapting.
 * Nothing here includes a CUDA header: an emulation build that compiles the kernels/cuda .cu files for the
 * host (issue 20) links this same table and runs the model through it. Not yet here: a one-pass
 * fused head (the model runs the head's forward, then its backward), and the head in bf16 (it is
 * fp32, as on the CPU backend). */
#include "cuda/cuda_ops.h"
#include "device/cuda_backend.h"
#include "device/cuda_side_stream.h"
#include "device/cuda_upload_stream.h"
#include "device/cuda_vm.h"

#ifdef CTRL_HAVE_CUDA

static ctrl_status fill_zero(void *dst, size_t bytes) { return ctrl_cuda_memset(dst, 0, bytes); }

/* bf16 compute (backend.h): each GEMM operand converted to bf16 into scratch from the caching
 * allocator (exact for w, which the model's rounded copy already holds at bf16 values), cuBLASLt's
 * bf16 GEMM with fp32 accumulation and fp32 results. */
static ctrl_status bf16_copy(uint16_t **dst, const float *src, int64_t n) {
    ctrl_status st = ctrl_cuda_malloc((void **)dst, (size_t)n * sizeof(uint16_t));
    return st == CTRL_OK ? ctrl_cuda_f32_to_bf16(*dst, src, n) : st;
}

static ctrl_status linear_forward_bf16(float *out, const float *x, const float *w, const float *bias, int T,
                                       int IN, int OUT, int w_rounded) {
    (void)w_rounded; /* rounding a bf16 value again changes nothing */
    uint16_t *xb = NULL, *wb = NULL;
    ctrl_status st = bf16_copy(&xb, x, (int64_t)T * IN);
    if (st == CTRL_OK) st = bf16_copy(&wb, w, (int64_t)OUT * IN);
    if (st == CTRL_OK) st = ctrl_cuda_linear_forward_bf16_f32(out, xb, wb, bias, T, IN, OUT);
    ctrl_cuda_free(xb), ctrl_cuda_free(wb);
    return st;
}

/* QLoRA's products: kernels/cuda/nf4.cu's tile-dequantizing GEMM */
static ctrl_status nf4_linear_forward(float *out, const float *x, const ctrl_nf4_ref *w, const float *bias,
                                      int T, int IN, int OUT, int bf16) {
    return ctrl_cuda_nf4_linear(out, x, w->packed, w->qabsmax, w->absmax2, w->offset, w->code, w->dynamic,
                                w->first, bias, T, IN, OUT, 0, bf16);
}
static ctrl_status nf4_linear_backward(float *dx, const float *dout, const ctrl_nf4_ref *w, int T, int IN,
                                       int OUT, int bf16) {
    return ctrl_cuda_nf4_linear(dx, dout, w->packed, w->qabsmax, w->absmax2, w->offset, w->code, w->dynamic,
                                w->first, NULL, T, IN, OUT, 1, bf16);
}

static ctrl_status linear_backward_bf16(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                                        const float *w, int T, int IN, int OUT, int w_rounded) {
    (void)w_rounded;
    uint16_t *db = NULL, *xb = NULL, *wb = NULL;
    ctrl_status st = bf16_copy(&db, dout, (int64_t)T * OUT);
    if (st == CTRL_OK && dw) st = bf16_copy(&xb, x, (int64_t)T * IN);
    if (st == CTRL_OK && dx) st = bf16_copy(&wb, w, (int64_t)OUT * IN);
    if (st == CTRL_OK) st = ctrl_cuda_linear_backward_bf16_f32(dx, dw, dbias, db, dout, xb, wb, T, IN, OUT);
    ctrl_cuda_free(db), ctrl_cuda_free(xb), ctrl_cuda_free(wb);
    return st;
}

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
        .linear_forward_bf16 = linear_forward_bf16,
        .linear_backward_bf16 = linear_backward_bf16,
        .round_to_bf16 = ctrl_cuda_round_to_bf16,
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
        .gemm = ctrl_cuda_gemm,
        /* the model families' ops (issue 22: kernels/cuda/families.cu, rmsnorm.cu, head.cu) */
        .rmsnorm_1p_forward = ctrl_cuda_rmsnorm_1p_forward,
        .rmsnorm_1p_backward = ctrl_cuda_rmsnorm_1p_backward,
        .geglu_forward = ctrl_cuda_geglu_forward,
        .geglu_backward = ctrl_cuda_geglu_backward,
        .rope_partial_forward = ctrl_cuda_rope_partial_forward,
        .rope_partial_backward = ctrl_cuda_rope_partial_backward,
        .gather_rows = ctrl_cuda_gather_rows,
        .scatter_add_rows = ctrl_cuda_scatter_add_rows,
        .rows_dot = ctrl_cuda_rows_dot,
        .head_softcap = 1,
        .kv_append = ctrl_cuda_kv_append,
        .release_cached = ctrl_cuda_empty_cache,
        .memory_info = ctrl_cuda_memory_info,
        .nf4_dequantize = ctrl_cuda_nf4_dequantize, /* QLoRA (kernels/cuda/nf4.cu) */
        .sample = ctrl_cuda_sample,                 /* the engine's draws (kernels/cuda/sampling.cu) */
        .nf4_linear_forward = nf4_linear_forward,
        .nf4_linear_backward = nf4_linear_backward,
        .dora_norm = ctrl_cuda_dora_norm, /* DoRA (kernels/cuda/dora.cu) */
        .dora_combine = ctrl_cuda_dora_combine,
        .dora_backward = ctrl_cuda_dora_backward,
        .lora_dropout = ctrl_cuda_lora_dropout, /* LoRA's dropout masks (kernels/cuda/lora.cu) */
        /* activation offloading: pinned host memory, copies on a side stream (cuda_side_stream.c) */
        .host_alloc = ctrl_cuda_host_alloc,
        .host_free = ctrl_cuda_host_free,
        .side_copy = ctrl_cuda_side_copy,
        .side_wait = ctrl_cuda_side_wait,
        /* ZeRO-3's sliced parameters and gradients: virtual memory management (cuda_vm.c) */
        .vm_reserve = ctrl_cuda_vm_reserve,
        .vm_map = ctrl_cuda_vm_map,
        .vm_unmap = ctrl_cuda_vm_unmap,
        .vm_unreserve = ctrl_cuda_vm_unreserve,
        /* fp32 <-> bf16 (kernels/cuda/convert.cu): ZeRO-3's bf16 slices and gathers, the model's bf16
         * operands (model_dtype.c: converted once, not in every product) */
        .to_bf16 = ctrl_cuda_f32_to_bf16,
        .from_bf16 = ctrl_cuda_bf16_to_f32,
        .linear_forward_b16 = ctrl_cuda_linear_forward_bf16_f32,
        .linear_backward_b16 = ctrl_cuda_linear_backward_bf16_f32,
        /* offload_optimizer's overlapped host step: uploads on a stream of their own */
        .upload_copy = ctrl_cuda_upload_copy,
        .upload_wait = ctrl_cuda_upload_wait,
        .host_register = ctrl_cuda_host_register,
        .host_unregister = ctrl_cuda_host_unregister,
    };
    return &ops;
}

#else /* built without CUDA: no device, no ops */

const ctrl_backend_ops *ctrl_cuda_backend_ops(void) { return NULL; }

#endif
