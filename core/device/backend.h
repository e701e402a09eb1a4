/* The backend ops table: everything the model does to memory and numbers on a device, as function
 * pointers, one table per kind of device (ggml's backend model). core/model is written once against
 * it; the CPU backend (backend_cpu.c, over kernels/cpu/cpu_ops.h) and the CUDA backend
 * (cuda_backend_ops.c in libctrl_cuda.so, over kernels/cuda/cuda_ops.h) implement it. A model is
 * placed on one with ctrl_model_to_device().
 *
 * Every op has the semantics of its kernels/cpu/cpu_ops.h namesake (flat row-major buffers; the
 * gradients of parameters accumulate, those of inputs are written; a NULL parameter gradient -- a
 * frozen weight -- is not computed), on pointers into the backend's
 * memory. Ops run in order on one stream: a later op sees what an earlier one wrote; results reach
 * the host through to_host, which waits for them. A NULL op is one the backend does not have; the
 * model says so when a feature needs it (bf16 compute, the fused head).
 *
 * A backend in another library (CUDA is loaded with dlopen) may be built against an older table:
 * `size` is the sizeof the table it was built with, and fields past it are absent
 * (ctrl_backend_has). New ops go at the end. */
#ifndef CTRL_CORE_DEVICE_BACKEND_H
#define CTRL_CORE_DEVICE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include <ctrl/status.h>
#include <ctrl/tensor.h>

#include "cpu/cpu_ops.h" /* ctrl_head_args */
#include "device/sample_batch.h"

typedef struct ctrl_backend_ops {
    size_t size; /* sizeof(ctrl_backend_ops) as the backend was built */
    const char *name;
    ctrl_device_type device_type; /* what the attention plugin is told the buffers are */
    /* 1: the backend's memory is host memory (the CPU): the model hands the caller's buffers to
     * the ops directly and skips every staging copy. */
    int host_memory;

    /* Memory. alloc gives memory that holds any type (no zeroing); free(NULL) does nothing.
     * to_device/to_host copy between host memory and the backend's; copy stays on the backend. */
    ctrl_status (*alloc)(void **ptr, size_t bytes);
    void (*free)(void *ptr);
    ctrl_status (*to_device)(void *dst, const void *src, size_t bytes);
    ctrl_status (*to_host)(void *dst, const void *src, size_t bytes);
    ctrl_status (*copy)(void *dst, const void *src, size_t bytes);
    ctrl_status (*fill_zero)(void *dst, size_t bytes);
    ctrl_status (*synchronize)(void);

    /* Layers. */
    ctrl_status (*embedding_forward)(float *out, const int32_t *tokens, const float *wte, int T, int C);
    ctrl_status (*embedding_backward)(float *dwte, const float *dout, const int32_t *tokens, int T, int C);
    ctrl_status (*rmsnorm_forward)(float *out, float *rstd, const float *x, const float *weight, int T, int C,
                                   float eps);
    ctrl_status (*rmsnorm_backward)(float *dx, float *dweight, const float *dout, const float *x,
                                    const float *weight, const float *rstd, int T, int C);
    ctrl_status (*linear_forward)(float *out, const float *x, const float *w, const float *bias, int T,
                                  int IN, int OUT);
    ctrl_status (*linear_backward)(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                                   const float *w, int T, int IN, int OUT);
    /* bf16 compute as torch.autocast: inputs rounded to bf16, fp32 accumulation and outputs; w_rounded
     * = 1 when w already holds bf16 values (round_to_bf16's copy). NULL where not implemented. */
    ctrl_status (*linear_forward_bf16)(float *out, const float *x, const float *w, const float *bias, int T,
                                       int IN, int OUT, int w_rounded);
    ctrl_status (*linear_backward_bf16)(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                                        const float *w, int T, int IN, int OUT, int w_rounded);
    ctrl_status (*round_to_bf16)(float *dst, const float *src, int64_t n);
    ctrl_status (*rope_forward)(float *out, const float *x, const int32_t *pos, const float *cos_tab,
                                const float *sin_tab, int T, int n_head, int head_dim);
    ctrl_status (*rope_backward)(float *dx, const float *dout, const int32_t *pos, const float *cos_tab,
                                 const float *sin_tab, int T, int n_head, int head_dim);
    ctrl_status (*swiglu_forward)(float *out, const float *gate, const float *up, int64_t n);
    ctrl_status (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate,
                                   const float *up, int64_t n);
    /* out = a + b (out may be a: the residual stream, and adding up gradients). */
    ctrl_status (*residual_forward)(float *out, const float *a, const float *b, int64_t n);
    ctrl_status (*residual_backward)(float *da, float *db, const float *dout, int64_t n);

    /* The fused head (cpu_ops.h's ctrl_head_args, pointers on the backend). head_forward_backward
     * is the forward with dL/dlogp known up front; a backend without a single-pass version runs
     * the forward and then the backward in it. */
    size_t (*head_workspace_bytes)(const ctrl_head_args *a);
    size_t (*head_fused_workspace_bytes)(const ctrl_head_args *a);
    ctrl_status (*head_forward)(const ctrl_head_args *a, float *logp, float *entropy, float *lse,
                                int32_t *correct, void *workspace);
    ctrl_status (*head_backward)(const ctrl_head_args *a, const float *lse, const float *dlogp,
                                 const float *entropy, const float *dentropy, float *dhidden, float *dw,
                                 void *workspace);
    ctrl_status (*head_forward_backward)(const ctrl_head_args *a, const float *dlogp, float *logp,
                                         float *entropy, float *lse, int32_t *correct, float *dhidden,
                                         float *dw, void *workspace);

    /* Reductions: sum of squares (accumulated in double) into *out on the host; x *= s. */
    ctrl_status (*sum_squares)(const float *x, int64_t n, double *out);
    ctrl_status (*scale)(float *x, float s, int64_t n);

    /* Appended: torch.optim.AdamW's update in one pass (ctrl_device_kernels' adamw_step, lent to
     * optimizer plugins by the host table); NULL where the optimizer steps on the host (the CPU). */
    ctrl_status (*adamw_step)(float *param, const float *grad, float *exp_avg, float *exp_avg_sq, int64_t n,
                              float lr, float beta1, float beta2, float eps, float weight_decay,
                              int64_t step);
    /* Appended: 1 when linear_*_bf16 round w to bf16 themselves as fast as they would read a rounded
     * copy (the CPU with AVX-512 BF16: rounded while packed): the model then keeps no rounded copy. */
    int (*bf16_rounds_weights)(void);

    /* Appended for Gemma 2/3 (cpu_ops.h's namesakes): RMSNorm scaling by (1 + weight), and GeGLU
     * (tanh-GELU gate). NULL where not implemented: the model refuses a Gemma model there. */
    ctrl_status (*rmsnorm_1p_forward)(float *out, float *rstd, const float *x, const float *weight, int T,
                                      int C, float eps);
    ctrl_status (*rmsnorm_1p_backward)(float *dx, float *dweight, const float *dout, const float *x,
                                       const float *weight, const float *rstd, int T, int C);
    ctrl_status (*geglu_forward)(float *out, const float *gate, const float *up, int64_t n);
    ctrl_status (*geglu_backward)(float *dgate, float *dup, const float *dout, const float *gate,
                                  const float *up, int64_t n);
    /* 1: the head ops honour ctrl_head_args.softcap (final-logit soft-capping); 0: they do not, and
     * the model refuses a soft-capped model there (ctrl_backend_flag). */
    int head_softcap;
    /* Appended for Phi-3/4's partial_rotary_factor: RoPE on the first rot_dim dimensions of each head
     * (cpu_ops.h's ctrl_cpu_rope_partial_*); NULL where not implemented (the model refuses such a
     * model there). */
    ctrl_status (*rope_partial_forward)(float *out, const float *x, const int32_t *pos, const float *cos_tab,
                                        const float *sin_tab, int T, int n_head, int head_dim, int rot_dim);
    ctrl_status (*rope_partial_backward)(float *dx, const float *dout, const int32_t *pos,
                                         const float *cos_tab, const float *sin_tab, int T, int n_head,
                                         int head_dim, int rot_dim);
    /* Appended for mixture-of-experts layers (cpu_ops.h's ctrl_cpu_gather_rows, scatter_add_rows,
     * rows_dot; rows on the backend); NULL where not implemented (the model refuses an MoE model). */
    ctrl_status (*gather_rows)(float *out, const float *x, const int32_t *rows, const float *scale, int n,
                               int C);
    ctrl_status (*scatter_add_rows)(float *out, const float *y, const int32_t *rows, const float *scale,
                                    int n, int C);
    ctrl_status (*rows_dot)(float *out, const float *x, const int32_t *rows, const float *y, int n, int C);
    /* Appended: row-major C = alpha op(A) op(B) + beta C (op(X) = X^T where trans_x), A and B of
     * `ab`, C of `c` (fp32 x fp32 -> fp32, bf16 x bf16 -> fp32 or bf16), fp32 accumulation; lent to
     * attention plugins by ctrl_device_kernels.gemm. */
    ctrl_status (*gemm)(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                        const void *B, int ldb, float beta, void *C, int ldc, ctrl_dtype ab, ctrl_dtype c);
    /* Appended for decoding over a paged KV cache (model_decode.c): row t of k and of v ([T, D] fp32)
     * stored as row slots[t] of k_cache and of v_cache (one layer's pools, rows of D values of
     * `cache_dtype`: CTRL_F32 as they are, CTRL_BF16 rounded to nearest even); slots on the backend.
     * NULL where not implemented (the model refuses to decode there). */
    ctrl_status (*kv_append)(void *k_cache, void *v_cache, const float *k, const float *v,
                             const int32_t *slots, int T, int D, ctrl_dtype cache_dtype);
    /* Appended: gives the memory the backend keeps for reuse back to the device (the CUDA caching
     * allocator's free blocks, as torch.cuda.empty_cache); the engine's sleep calls it after freeing
     * the KV pool. Nothing to do on the CPU (malloc keeps nothing for the backend). */
    void (*release_cached)(void);
    /* Appended: the device's free and total memory in bytes (what the generation engine sizes a
     * device's KV pool from: [generation] gpu_memory_utilization); on the CPU the host's. */
    ctrl_status (*memory_info)(size_t *free_bytes, size_t *total_bytes);
    /* Appended for QLoRA on a device ([peft] quantization = nf4; core/model/nf4.h): n values of a
     * weight held in NF4 into out (backend memory): absmax_b = dynamic[qabsmax[b]] * absmax2[b / 256]
     * + offset, out_i = code[nibble_i] * absmax_(i / 64), each operation rounded on its own (the CPU's
     * ctrl_nf4_absmax + ctrl_nf4_dequantize bit for bit; code [16] and dynamic [256] are the code books
     * in backend memory). NULL where not implemented: QLoRA is refused there. */
    ctrl_status (*nf4_dequantize)(float *out, const uint8_t *packed, const uint8_t *qabsmax,
                                  const float *absmax2, float offset, const float *code, const float *dynamic,
                                  int64_t n);
    /* Appended for sampling on the device (device/sample_batch.h; the generation engine's draws
     * when the model is on a device): every row of b processed and drawn from as
     * core/generate/sampling.c does, from logits that stay in the backend's memory; b in host
     * memory, its pointers in the backend's. NULL where not implemented (the engine copies the
     * logits to the host and samples there). */
    ctrl_status (*sample)(const struct ctrl_sample_batch *b);
    /* Appended for QLoRA's products (cpu_ops.h's ctrl_cpu_nf4_linear_*; the ref's pointers in backend
     * memory): out = x W^T + bias and dx = dout W with W [OUT, IN] held in NF4, dequantized a tile at
     * a time inside the GEMM (never the whole weight); bf16: as linear_forward_bf16 (inputs and W's
     * values rounded to bf16). NULL where not implemented: QLoRA is refused there. */
    ctrl_status (*nf4_linear_forward)(float *out, const float *x, const ctrl_nf4_ref *w, const float *bias,
                                      int T, int IN, int OUT, int bf16);
    ctrl_status (*nf4_linear_backward)(float *dx, const float *dout, const ctrl_nf4_ref *w, int T, int IN,
                                       int OUT, int bf16);
    /* Appended for DoRA on a device (core/model/dora.c; cpu_ops.h's ctrl_cpu_dora_norm, dora_combine,
     * dora_backward): the per-output-row norms and magnitude scalings, on the backend's memory, so
     * that a DoRA layer's [T, OUT] operands never leave the device. NULL where not implemented (DoRA
     * is refused there). */
    ctrl_status (*dora_norm)(float *norm, float *g, const float *W, const float *B, const float *WA,
                             const float *BG, const float *mag, float s, int OUT, int IN, int r);
    ctrl_status (*dora_combine)(float *out, const float *yl, const float *yb, const float *bias,
                                const float *g, int T, int OUT);
    ctrl_status (*dora_backward)(float *dmag, float *yl, float *yb, const float *dout, const float *norm,
                                 const float *g, int T, int OUT);
    /* Appended for activation offloading on a device (core/model/model_offload.c); NULL where not
     * implemented (the model then copies with to_host / to_device, pageable and synchronous).
     * host_alloc / host_free: page-locked host memory (what a device copies to and from
     * asynchronously). side_copy: queues a copy of `bytes` (host to device when to_device, else back)
     * on a side stream, after the work queued so far on the compute stream, and records event `ev`
     * (0 to 3) after it; the caller must not touch dst, nor overwrite src, until it waited for the
     * event. side_wait: the compute stream's next work waits for event ev (the host does not wait);
     * ev < 0: the host waits until every side copy is done. */
    ctrl_status (*host_alloc)(void **ptr, size_t bytes);
    void (*host_free)(void *ptr);
    ctrl_status (*side_copy)(void *dst, const void *src, size_t bytes, int to_device, int ev);
    ctrl_status (*side_wait)(int ev);
    /* Appended for LoRA's dropout on a device (core/model/lora.c): dst[i] = 0 where u_i < p, else
     * src[i] * keep (dst may be src), u_i = ((mix64(key + i * 0x9E3779B97F4A7C15) >> 11) + 0.5) / 2^53
     * with splitmix64's finalizer mix64: the host's draw (lora_dropout_host) bit for bit, so a
     * device's masks are the CPU's and never make a host round trip. NULL where not implemented (the
     * model then draws the mask on the host, through a copy). */
    ctrl_status (*lora_dropout)(float *dst, const float *src, int64_t n, uint64_t key, float p, float keep);
    /* Appended for ZeRO-3 on a device (core/train/zero_device.c): device memory mapped piece by piece
     * behind one range of addresses (CUDA's virtual memory management; NULL where not implemented).
     * vm_reserve: a range of at least `bytes` with no memory behind it, *granularity the piece;
     * vm_map: fresh memory (not zeroed) behind [ptr, ptr + bytes), whole pieces of a reserved range
     * not mapped; vm_unmap: that memory handed back (the caller first waits for the work that uses
     * it; pieces not mapped are skipped); vm_unreserve: the range freed, what is mapped in it too. */
    ctrl_status (*vm_reserve)(void **ptr, size_t bytes, size_t *granularity);
    ctrl_status (*vm_map)(void *ptr, size_t bytes);
    ctrl_status (*vm_unmap)(void *ptr, size_t bytes);
    void (*vm_unreserve)(void *ptr, size_t bytes);
    /* Appended: dst = src rounded to bf16 (nearest even) as 2-byte values, and dst = the bf16 values
     * of src widened to fp32 (exact); ZeRO-3 in bf16 (core/train/zero_device.c: the slices sent and
     * the layers gathered as bf16). NULL where not implemented. */
    ctrl_status (*to_bf16)(uint16_t *dst, const float *src, int64_t n);
    ctrl_status (*from_bf16)(float *dst, const uint16_t *src, int64_t n);
    /* Appended for bf16 compute without a conversion in every product (core/model/model_dtype.c):
     * operands held as 2-byte bf16 values (to_bf16's) in the backend's memory. linear_forward_b16:
     * out = x w^T (+ bias), x [T, IN] and w [OUT, IN] bf16, fp32 accumulation and out.
     * linear_backward_b16: dx = dout16 w (dx NULL: none), dw += dout16^T x (dw NULL: none; x may then
     * be NULL), dbias += the column sums of the fp32 dout; dout16 is dout rounded to bf16. The same
     * products as linear_*_bf16 on the same values. NULL where not implemented (the model then
     * converts in linear_*_bf16: the CPU, whose bf16 GEMM rounds as it packs). */
    ctrl_status (*linear_forward_b16)(float *out, const uint16_t *x, const uint16_t *w, const float *bias,
                                      int T, int IN, int OUT);
    ctrl_status (*linear_backward_b16)(float *dx, float *dw, float *dbias, const uint16_t *dout16,
                                       const float *dout, const uint16_t *x, const uint16_t *w, int T, int IN,
                                       int OUT);
    /* Appended for offload_optimizer's overlapped host step (core/train/offload_overlap.c): host to
     * device copies on an upload stream of their own that, unlike side_copy, does NOT wait for the
     * compute stream's queued work (the caller knows none of it reads dst: a layer's parameters that
     * the host stepped while the device ran other layers). upload_copy queues the copy and records
     * event `ev` (0 .. CTRL_UPLOAD_EVENTS - 1) after it; the caller must not read dst nor overwrite
     * src until it waited for the event. upload_wait: the compute stream's next work waits for
     * event ev (the host does not wait); ev < 0: the host waits until every upload is done. NULL
     * where not implemented (no overlap: the core steps and copies the whole model at once). */
    ctrl_status (*upload_copy)(void *dst, const void *src, size_t bytes, int ev);
    ctrl_status (*upload_wait)(int ev);
    /* host_register: page-locks host memory the caller allocated (so that copies from and to it run
     * asynchronously, beside the kernels, at full speed); host_unregister undoes it before the
     * caller frees it. NULL where not implemented. */
    ctrl_status (*host_register)(void *ptr, size_t bytes);
    void (*host_unregister)(void *ptr);
    /* Appended: 1 where linear_*_bf16 run on a bf16 kernel now; 0 where they would emulate bf16 on
     * fp32 GEMMs of rounded inputs (no faster than fp32: a CPU without AVX-512 BF16 or AMX, or with
     * them turned off), and a model whose bf16 fallback is fp32 then multiplies in plain fp32
     * (ctrl_model_set_bf16_fallback). fp32_instead: what the model does then (1 fp32, 0 the
     * emulation), for the one line in the log that says which path the products take. NULL: 1. */
    int (*bf16_kernel)(int fp32_instead);
} ctrl_backend_ops;

#define CTRL_UPLOAD_EVENTS 1024

/* Whether `be` was built with the field at `offset` (offsetof(ctrl_backend_ops, f)) and has it set. */
#define ctrl_backend_has(be, field)                                                                          \
    ((be)->size >= offsetof(ctrl_backend_ops, field) + sizeof((be)->field) && (be)->field != NULL)

/* Whether `be` was built with the int flag `field` and sets it. */
#define ctrl_backend_flag(be, field)                                                                         \
    ((be)->size >= offsetof(ctrl_backend_ops, field) + sizeof((be)->field) && (be)->field != 0)

/* The CPU backend (kernels/cpu), in libctrl. */
const ctrl_backend_ops *ctrl_backend_cpu(void);

#endif
