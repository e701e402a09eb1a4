/* The CUDA backend's C API: device selection, the caching allocator, and the kernels that mirror
 * kernels/cpu/cpu_ops.h (ctrl_cuda_* with device pointers). No CUDA types appear here, so C code
 * and tests use it without the CUDA headers; built without CUDA, every call returns
 * CTRL_ERR_UNSUPPORTED ("built without CUDA") and ctrl_cuda_device_count() is 0. */
#ifndef CTRL_KERNELS_CUDA_OPS_H
#define CTRL_KERNELS_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include <ctrl/status.h>
#include <ctrl/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Devices. */
int ctrl_cuda_built(void);        /* 1 when this libctrl has the CUDA backend */
int ctrl_cuda_device_count(void); /* 0 when built without CUDA or no usable device */
/* Why no device is usable ("built without CUDA", the driver's message, ...). */
const char *ctrl_cuda_unavailable_reason(void);
ctrl_status ctrl_cuda_set_device(int index);
ctrl_status ctrl_cuda_device_name(int index, char *buf, size_t cap);
ctrl_status ctrl_cuda_synchronize(void);

/* The caching allocator: blocks are rounded up to size classes and kept in free lists, so the
 * steady state of a training step never calls cudaMalloc or cudaFree. */
ctrl_status ctrl_cuda_malloc(void **ptr, size_t bytes);
void ctrl_cuda_free(void *ptr);
/* Returns every cached block to the driver. */
void ctrl_cuda_empty_cache(void);
/* Releases library handles and their workspaces, then the cache: for a clean exit (and clean
 * compute-sanitizer leak reports). The backend re-initialises itself on the next call. */
void ctrl_cuda_shutdown(void);
typedef struct ctrl_cuda_mem_stats {
    size_t current;     /* bytes handed out and not yet freed */
    size_t peak;        /* the largest `current` since the last reset */
    size_t reserved;    /* bytes held from the driver (in use + cached) */
    long driver_allocs; /* cudaMalloc calls so far */
} ctrl_cuda_mem_stats;
void ctrl_cuda_mem_stats_get(ctrl_cuda_mem_stats *out);
void ctrl_cuda_mem_stats_reset_peak(void);
/* The current device's free and total memory (cudaMemGetInfo; under the emulator its 4 GiB less
 * what the caching allocator holds). */
ctrl_status ctrl_cuda_memory_info(size_t *free_bytes, size_t *total_bytes);

/* Pinned host memory, for fast and asynchronous copies. */
ctrl_status ctrl_cuda_host_alloc(void **ptr, size_t bytes);
void ctrl_cuda_host_free(void *ptr);

ctrl_status ctrl_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
ctrl_status ctrl_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);
ctrl_status ctrl_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes);
ctrl_status ctrl_cuda_memset(void *dst, int value, size_t bytes);

/* Linear through cuBLASLt, Hugging Face weight layout [OUT, IN]:
 *   out[T, OUT] = x[T, IN] W^T (+ bias), fp32 in and out with fp32 compute (no TF32), so it is
 *   comparable with the CPU reference at 1e-5. */
ctrl_status ctrl_cuda_linear_forward_f32(float *out, const float *x, const float *w, const float *bias, int T,
                                         int IN, int OUT);
/* The bf16 path of mixed precision: bf16 x and W (uint16_t storage), fp32 accumulation, bf16 out. */
ctrl_status ctrl_cuda_linear_forward_bf16(uint16_t *out, const uint16_t *x, const uint16_t *w, int T, int IN,
                                          int OUT);

/* General row-major GEMM through cuBLASLt, fp32 with fp32 compute (no TF32):
 *   C[M, N] = alpha * op(A) op(B) + beta * C, op(X) = X or X^T (trans_a / trans_b = 1),
 *   A is [M, K] (or [K, M] when transposed) with leading dimension lda, likewise B and C. */
ctrl_status ctrl_cuda_gemm_f32(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                               int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* The same GEMM over typed operands: A and B of `ab`, C of `c` (fp32 x fp32 -> fp32, bf16 x bf16
 * -> fp32 or bf16), fp32 accumulation; any other combination is CTRL_ERR_UNSUPPORTED. */
ctrl_status ctrl_cuda_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                           const void *B, int ldb, float beta, void *C, int ldc, ctrl_dtype ab, ctrl_dtype c);
/* How many times the GEMMs asked cuBLASLt's heuristic for an algorithm: once per problem (shape,
 * transposes, types, operand alignment), the answer cached after that. */
long ctrl_cuda_gemm_heuristic_queries(void);
/* Forgets every cached GEMM algorithm (the next call of each problem asks the heuristic again, and
 * tunes where CTRL_CUDA_GEMM_TUNE=1); the library handle stays. */
void ctrl_cuda_gemm_forget_algorithms(void);

/* The kernels of kernels/cpu/cpu_ops.h on device pointers, same arguments and semantics
 * (parameter gradients accumulate, input gradients are written). */
ctrl_status ctrl_cuda_embedding_forward(float *out, const int32_t *tokens, const float *wte, int T, int C);
ctrl_status ctrl_cuda_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int T, int C);
ctrl_status ctrl_cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight, int T,
                                      int C, float eps);
ctrl_status ctrl_cuda_rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x,
                                       const float *weight, const float *rstd, int T, int C);
ctrl_status ctrl_cuda_linear_backward_f32(float *dx, float *dw, float *dbias, const float *dout,
                                          const float *x, const float *w, int T, int IN, int OUT);
ctrl_status ctrl_cuda_rope_forward(float *out, const float *x, const int32_t *pos, const float *cos_tab,
                                   const float *sin_tab, int T, int n_head, int head_dim);
ctrl_status ctrl_cuda_rope_backward(float *dx, const float *dout, const int32_t *pos, const float *cos_tab,
                                    const float *sin_tab, int T, int n_head, int head_dim);
/* The model families' ops (issue 22; cpu_ops.h's namesakes): Gemma's (1 + w) RMSNorm (rmsnorm.cu), GeGLU,
 * partial rotary embeddings and the mixture-of-experts row ops (families.cu). */
ctrl_status ctrl_cuda_rmsnorm_1p_forward(float *out, float *rstd, const float *x, const float *weight, int T,
                                         int C, float eps);
ctrl_status ctrl_cuda_rmsnorm_1p_backward(float *dx, float *dweight, const float *dout, const float *x,
                                          const float *weight, const float *rstd, int T, int C);
ctrl_status ctrl_cuda_geglu_forward(float *out, const float *gate, const float *up, int64_t n);
ctrl_status ctrl_cuda_geglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                                     const float *up, int64_t n);
ctrl_status ctrl_cuda_rope_partial_forward(float *out, const float *x, const int32_t *pos,
                                           const float *cos_tab, const float *sin_tab, int T, int n_head,
                                           int head_dim, int rot_dim);
ctrl_status ctrl_cuda_rope_partial_backward(float *dx, const float *dout, const int32_t *pos,
                                            const float *cos_tab, const float *sin_tab, int T, int n_head,
                                            int head_dim, int rot_dim);
ctrl_status ctrl_cuda_gather_rows(float *out, const float *x, const int32_t *rows, const float *scale, int n,
                                  int C);
ctrl_status ctrl_cuda_scatter_add_rows(float *out, const float *y, const int32_t *rows, const float *scale,
                                       int n, int C);
ctrl_status ctrl_cuda_rows_dot(float *out, const float *x, const int32_t *rows, const float *y, int n, int C);
ctrl_status ctrl_cuda_swiglu_forward(float *out, const float *gate, const float *up, int64_t n);
ctrl_status ctrl_cuda_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                                      const float *up, int64_t n);
ctrl_status ctrl_cuda_residual_forward(float *out, const float *a, const float *b, int64_t n);
ctrl_status ctrl_cuda_residual_backward(float *da, float *db, const float *dout, int64_t n);
/* Sum of squares into *out (host), accumulated in double; scale in place. */
ctrl_status ctrl_cuda_sum_squares(const float *x, int64_t n, double *out);
ctrl_status ctrl_cuda_scale(float *x, float s, int64_t n);

/* The fused head on the device: same arguments as the CPU one (ctrl_head_args from
 * kernels/cpu/cpu_ops.h), device pointers, chunked so that [T, V] logits never exist. */
struct ctrl_head_args;
size_t ctrl_cuda_head_workspace_bytes(const struct ctrl_head_args *a);
ctrl_status ctrl_cuda_head_forward(const struct ctrl_head_args *a, float *logp, float *entropy, float *lse,
                                   int32_t *correct, void *workspace);
ctrl_status ctrl_cuda_head_backward(const struct ctrl_head_args *a, const float *lse, const float *dlogp,
                                    const float *entropy, const float *dentropy, float *dhidden, float *dw,
                                    void *workspace);

/* AdamW over one flat fp32 buffer, torch.optim.AdamW's formula, in one pass; when param_bf16 is
 * not NULL the updated parameters are also written there as bf16 (the compute copy). */
ctrl_status ctrl_cuda_adamw_step(float *param, const float *grad, float *m, float *v, uint16_t *param_bf16,
                                 int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                                 int64_t step);

/* fp32 <-> bf16 conversion on the device (round to nearest even). */
ctrl_status ctrl_cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t n);
ctrl_status ctrl_cuda_bf16_to_f32(float *dst, const uint16_t *src, int64_t n);
/* dst = src rounded to the nearest bf16, kept in fp32 (dst may be src): the model's bf16 copy. */
ctrl_status ctrl_cuda_round_to_bf16(float *dst, const float *src, int64_t n);
/* Mixed precision as torch.autocast runs a linear layer: bf16 operands (uint16_t storage), fp32
 * accumulation and fp32 results, through cuBLASLt's bf16 GEMM (tensor cores on sm_80+). Row-major
 * C = alpha op(A) op(B) + beta C; the linear layer's forward (+ fp32 bias) and backward (dx written,
 * dW and dbias accumulated; dbias from the unrounded fp32 dout). */
ctrl_status ctrl_cuda_gemm_bf16_f32(int trans_a, int trans_b, int M, int N, int K, float alpha,
                                    const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
                                    float *C, int ldc);
ctrl_status ctrl_cuda_linear_forward_bf16_f32(float *out, const uint16_t *x, const uint16_t *w,
                                              const float *bias, int T, int IN, int OUT);
ctrl_status ctrl_cuda_linear_backward_bf16_f32(float *dx, float *dw, float *dbias, const uint16_t *dout16,
                                               const float *dout, const uint16_t *x, const uint16_t *w, int T,
                                               int IN, int OUT);

/* Decoding's K/V append (kv_append.cu): row t of k and of v ([T, D] fp32) written as row slots[t]
 * of one layer's k_cache and v_cache pools, fp32 as they are or bf16 (round to nearest even) as
 * cache_dtype says; slots on the device. */
ctrl_status ctrl_cuda_kv_append(void *k_cache, void *v_cache, const float *k, const float *v,
                                const int32_t *slots, int T, int D, ctrl_dtype cache_dtype);
/* QLoRA: n values held in NF4 into out (device pointers; see backend.h's nf4_dequantize). */
ctrl_status ctrl_cuda_nf4_dequantize(float *out, const uint8_t *packed, const uint8_t *qabsmax,
                                     const float *absmax2, float offset, const float *code,
                                     const float *dynamic, int64_t n);
/* Sampling on the device (sampling.cu): each row of b (core/device/sample_batch.h: host memory,
 * its pointers on the device) processed and drawn from as core/generate/sampling.c does, the
 * results in b->out (device memory). */
struct ctrl_sample_batch;
ctrl_status ctrl_cuda_sample(const struct ctrl_sample_batch *b);
/* QLoRA's products with W [OUT, IN] in NF4 (the same parts, device pointers; W's values are those at
 * [first, first + OUT IN) of the quantized tensor: ctrl_nf4_ref's first), W dequantized a tile at
 * a time in shared memory inside the GEMM: backward = 0: out[T, OUT] = in W^T + bias (bias may be
 * NULL); 1: out = dX [T, IN] = in[T, OUT] W. bf16: in and W's values rounded to bf16 (fp32
 * accumulation), as linear_forward_bf16. */
ctrl_status ctrl_cuda_nf4_linear(float *out, const float *in, const uint8_t *packed, const uint8_t *qabsmax,
                                 const float *absmax2, float offset, const float *code, const float *dynamic,
                                 int64_t first, const float *bias, int T, int IN, int OUT, int backward,
                                 int bf16);

/* LoRA's dropout drawn on the device (device pointers; backend.h's lora_dropout: the host's mask). */
ctrl_status ctrl_cuda_lora_dropout(float *dst, const float *src, int64_t n, uint64_t key, float p,
                                   float keep);

/* DoRA's per-row ops (device pointers; cpu_ops.h's ctrl_cpu_dora_norm, dora_combine, dora_backward). */
ctrl_status ctrl_cuda_dora_norm(float *norm, float *g, const float *W, const float *B, const float *WA,
                                const float *BG, const float *mag, float s, int OUT, int IN, int r);
ctrl_status ctrl_cuda_dora_combine(float *out, const float *yl, const float *yb, const float *bias,
                                   const float *g, int T, int OUT);
ctrl_status ctrl_cuda_dora_backward(float *dmag, float *yl, float *yb, const float *dout, const float *norm,
                                    const float *g, int T, int OUT);

#ifdef __cplusplus
}
#endif
#endif
