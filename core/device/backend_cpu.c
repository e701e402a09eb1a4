/* The CPU backend (see backend.h): host memory and the kernels of kernels/cpu/cpu_ops.h. The ops
 * are the kernels themselves behind a status return, so the model costs one indirect call per op
 * over calling them directly, and no copies: the model sees host_memory and hands its buffers over
 * as they are. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctrl/log.h"
#include "device/backend.h"
#include "model/lora.h"
#include "model/nf4.h"

static ctrl_status cpu_alloc(void **ptr, size_t bytes) {
    *ptr = malloc(bytes ? bytes : 1);
    return *ptr ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "cpu: cannot allocate %zu bytes", bytes);
}
static void cpu_free(void *ptr) { free(ptr); }
static ctrl_status cpu_memcpy(void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
    return CTRL_OK;
}
static ctrl_status cpu_fill_zero(void *dst, size_t bytes) {
    if (bytes) memset(dst, 0, bytes);
    return CTRL_OK;
}
static ctrl_status cpu_synchronize(void) { return CTRL_OK; }

static ctrl_status embedding_forward(float *out, const int32_t *tokens, const float *wte, int T, int C) {
    ctrl_cpu_embedding_forward(out, tokens, wte, T, C);
    return CTRL_OK;
}
static ctrl_status embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int T, int C) {
    ctrl_cpu_embedding_backward(dwte, dout, tokens, T, C);
    return CTRL_OK;
}
static ctrl_status rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight, int T, int C,
                                   float eps) {
    ctrl_cpu_rmsnorm_forward(out, rstd, x, weight, T, C, eps);
    return CTRL_OK;
}
static ctrl_status rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x,
                                    const float *weight, const float *rstd, int T, int C) {
    ctrl_cpu_rmsnorm_backward(dx, dweight, dout, x, weight, rstd, T, C);
    return CTRL_OK;
}
static ctrl_status linear_forward(float *out, const float *x, const float *w, const float *bias, int T,
                                  int IN, int OUT) {
    ctrl_cpu_linear_forward(out, x, w, bias, T, IN, OUT);
    return CTRL_OK;
}
static ctrl_status linear_backward(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                                   const float *w, int T, int IN, int OUT) {
    ctrl_cpu_linear_backward(dx, dw, dbias, dout, x, w, T, IN, OUT);
    return CTRL_OK;
}
static ctrl_status bf16_scratch_error(int T, int IN, int OUT) {
    return ctrl_error_set(CTRL_ERR_NOMEM, "cpu: bf16 scratch for a %d x %d linear over %d tokens", OUT, IN,
                          T);
}
/* Once per process (and per fallback): which path bf16 compute's linear products take here. Where no
 * bf16 kernel runs they are fp32's, either plain (fp32_instead: the model's bf16 fallback is fp32) or
 * on bf16-rounded inputs (the fallback "rounded": bf16's numbers, no faster than fp32). */
static void bf16_path_note(int fp32_instead) {
    static int said[2];
    const char *why = ctrl_cpu_bf16_no_kernel_why();
    fp32_instead = fp32_instead && why; /* with a kernel the fallback changes nothing */
    if (__atomic_load_n(&said[fp32_instead], __ATOMIC_RELAXED) ||
        __atomic_exchange_n(&said[fp32_instead], 1, __ATOMIC_RELAXED))
        return;
    int fast;
    const char *path = ctrl_cpu_bf16_path(&fast);
    if (fast)
        CTRL_INFO("cpu: bf16 linear layers on %s", path);
    else if (fp32_instead)
        CTRL_WARN("cpu: bf16 compute has no fast path here (%s): the linear layers' products run in plain "
                  "fp32 (fp32's numbers, at fp32's speed; decoding keeps bf16's); [train] "
                  "bf16_fallback = rounded emulates bf16's rounded numbers instead (no faster than fp32)",
                  why);
    else
        CTRL_WARN("cpu: bf16 compute has no fast path here: linear layers run as %s, no faster than fp32%s",
                  path,
                  why ? "; [train] bf16_fallback = fp32 (the default) multiplies in plain fp32 instead" : "");
}
/* backend.h's bf16_kernel: the fp32 path is the only one without a bf16 kernel (AMX emulated in
 * software, a test switch, runs the kernel's products) */
static int bf16_kernel(int fp32_instead) {
    bf16_path_note(fp32_instead);
    return ctrl_cpu_bf16_kind_now() != CTRL_CPU_BF16_FP32;
}
static ctrl_status linear_forward_bf16(float *out, const float *x, const float *w, const float *bias, int T,
                                       int IN, int OUT, int w_rounded) {
    bf16_path_note(0);
    return ctrl_cpu_linear_forward_bf16(out, x, w, bias, T, IN, OUT, w_rounded) == 0
               ? CTRL_OK
               : bf16_scratch_error(T, IN, OUT);
}
static ctrl_status linear_backward_bf16(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                                        const float *w, int T, int IN, int OUT, int w_rounded) {
    return ctrl_cpu_linear_backward_bf16(dx, dw, dbias, dout, x, w, T, IN, OUT, w_rounded) == 0
               ? CTRL_OK
               : bf16_scratch_error(T, IN, OUT);
}
static ctrl_status nf4_status(int rc, int T, int IN, int OUT) {
    return rc == 0    ? CTRL_OK
           : rc == -2 ? ctrl_error_set(CTRL_ERR_RUNTIME, "QLoRA: an NF4 weight is not %d x %d", OUT, IN)
                      : ctrl_error_set(CTRL_ERR_NOMEM, "QLoRA: scratch of an NF4 product (%d x %d x %d)", T,
                                       IN, OUT);
}
static ctrl_status nf4_linear_forward(float *out, const float *x, const ctrl_nf4_ref *w, const float *bias,
                                      int T, int IN, int OUT, int bf16) {
    if (bf16) bf16_path_note(0);
    return nf4_status(ctrl_cpu_nf4_linear_forward(out, x, w, bias, T, IN, OUT, bf16), T, IN, OUT);
}
static ctrl_status nf4_linear_backward(float *dx, const float *dout, const ctrl_nf4_ref *w, int T, int IN,
                                       int OUT, int bf16) {
    return nf4_status(ctrl_cpu_nf4_linear_backward(dx, dout, w, T, IN, OUT, bf16), T, IN, OUT);
}
static ctrl_status round_to_bf16(float *dst, const float *src, int64_t n) {
    ctrl_cpu_round_to_bf16(dst, src, n);
    return CTRL_OK;
}
static ctrl_status to_bf16(uint16_t *dst, const float *src, int64_t n) {
    ctrl_cpu_f32_to_bf16(dst, src, n);
    return CTRL_OK;
}
static ctrl_status from_bf16(float *dst, const uint16_t *src, int64_t n) {
    ctrl_cpu_bf16_to_f32(dst, src, n);
    return CTRL_OK;
}
static ctrl_status rope_forward(float *out, const float *x, const int32_t *pos, const float *cos_tab,
                                const float *sin_tab, int T, int n_head, int head_dim) {
    ctrl_cpu_rope_forward(out, x, pos, cos_tab, sin_tab, T, n_head, head_dim);
    return CTRL_OK;
}
static ctrl_status rope_backward(float *dx, const float *dout, const int32_t *pos, const float *cos_tab,
                                 const float *sin_tab, int T, int n_head, int head_dim) {
    ctrl_cpu_rope_backward(dx, dout, pos, cos_tab, sin_tab, T, n_head, head_dim);
    return CTRL_OK;
}
static ctrl_status swiglu_forward(float *out, const float *gate, const float *up, int64_t n) {
    ctrl_cpu_swiglu_forward(out, gate, up, n);
    return CTRL_OK;
}
static ctrl_status swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                                   const float *up, int64_t n) {
    ctrl_cpu_swiglu_backward(dgate, dup, dout, gate, up, n);
    return CTRL_OK;
}
static ctrl_status rmsnorm_1p_forward(float *out, float *rstd, const float *x, const float *weight, int T,
                                      int C, float eps) {
    ctrl_cpu_rmsnorm_1p_forward(out, rstd, x, weight, T, C, eps);
    return CTRL_OK;
}
static ctrl_status rmsnorm_1p_backward(float *dx, float *dweight, const float *dout, const float *x,
                                       const float *weight, const float *rstd, int T, int C) {
    ctrl_cpu_rmsnorm_1p_backward(dx, dweight, dout, x, weight, rstd, T, C);
    return CTRL_OK;
}
static ctrl_status geglu_forward(float *out, const float *gate, const float *up, int64_t n) {
    ctrl_cpu_geglu_forward(out, gate, up, n);
    return CTRL_OK;
}
static ctrl_status geglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                                  const float *up, int64_t n) {
    ctrl_cpu_geglu_backward(dgate, dup, dout, gate, up, n);
    return CTRL_OK;
}
static ctrl_status rope_partial_forward(float *out, const float *x, const int32_t *pos, const float *cos_tab,
                                        const float *sin_tab, int T, int n_head, int head_dim, int rot_dim) {
    ctrl_cpu_rope_partial_forward(out, x, pos, cos_tab, sin_tab, T, n_head, head_dim, rot_dim);
    return CTRL_OK;
}
static ctrl_status rope_partial_backward(float *dx, const float *dout, const int32_t *pos,
                                         const float *cos_tab, const float *sin_tab, int T, int n_head,
                                         int head_dim, int rot_dim) {
    ctrl_cpu_rope_partial_backward(dx, dout, pos, cos_tab, sin_tab, T, n_head, head_dim, rot_dim);
    return CTRL_OK;
}
static ctrl_status gather_rows(float *out, const float *x, const int32_t *rows, const float *scale, int n,
                               int C) {
    ctrl_cpu_gather_rows(out, x, rows, scale, n, C);
    return CTRL_OK;
}
static ctrl_status scatter_add_rows(float *out, const float *y, const int32_t *rows, const float *scale,
                                    int n, int C) {
    ctrl_cpu_scatter_add_rows(out, y, rows, scale, n, C);
    return CTRL_OK;
}
static ctrl_status dora_norm(float *norm, float *g, const float *W, const float *B, const float *WA,
                             const float *BG, const float *mag, float s, int OUT, int IN, int r) {
    ctrl_cpu_dora_norm(norm, g, W, B, WA, BG, mag, s, OUT, IN, r);
    return CTRL_OK;
}
static ctrl_status dora_combine(float *out, const float *yl, const float *yb, const float *bias,
                                const float *g, int T, int OUT) {
    ctrl_cpu_dora_combine(out, yl, yb, bias, g, T, OUT);
    return CTRL_OK;
}
static ctrl_status lora_dropout(float *dst, const float *src, int64_t n, uint64_t key, float p, float keep) {
    lora_dropout_host(dst, src, n, key, p, keep);
    return CTRL_OK;
}
static ctrl_status dora_backward(float *dmag, float *yl, float *yb, const float *dout, const float *norm,
                                 const float *g, int T, int OUT) {
    ctrl_cpu_dora_backward(dmag, yl, yb, dout, norm, g, T, OUT);
    return CTRL_OK;
}
static ctrl_status rows_dot(float *out, const float *x, const int32_t *rows, const float *y, int n, int C) {
    ctrl_cpu_rows_dot(out, x, rows, y, n, C);
    return CTRL_OK;
}
static ctrl_status residual_forward(float *out, const float *a, const float *b, int64_t n) {
    ctrl_cpu_residual_forward(out, a, b, n);
    return CTRL_OK;
}
static ctrl_status residual_backward(float *da, float *db, const float *dout, int64_t n) {
    ctrl_cpu_residual_backward(da, db, dout, n);
    return CTRL_OK;
}
static ctrl_status head_forward(const ctrl_head_args *a, float *logp, float *entropy, float *lse,
                                int32_t *correct, void *workspace) {
    ctrl_cpu_head_forward(a, logp, entropy, lse, correct, workspace);
    return CTRL_OK;
}
static ctrl_status head_backward(const ctrl_head_args *a, const float *lse, const float *dlogp,
                                 const float *entropy, const float *dentropy, float *dhidden, float *dw,
                                 void *workspace) {
    ctrl_cpu_head_backward(a, lse, dlogp, entropy, dentropy, dhidden, dw, workspace);
    return CTRL_OK;
}
static ctrl_status head_forward_backward(const ctrl_head_args *a, const float *dlogp, float *logp,
                                         float *entropy, float *lse, int32_t *correct, float *dhidden,
                                         float *dw, void *workspace) {
    ctrl_cpu_head_forward_backward(a, dlogp, logp, entropy, lse, correct, dhidden, dw, workspace);
    return CTRL_OK;
}
static ctrl_status sum_squares(const float *x, int64_t n, double *out) {
    *out = ctrl_cpu_sum_squares(x, n);
    return CTRL_OK;
}
static ctrl_status gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                        const void *B, int ldb, float beta, void *C, int ldc, ctrl_dtype ab, ctrl_dtype c) {
    const int rc = ctrl_cpu_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab, c);
    if (rc == -2) return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "cpu gemm: this operand/result type pair");
    return rc == 0 ? CTRL_OK
                   : ctrl_error_set(CTRL_ERR_NOMEM, "cpu gemm: out of memory (M=%d N=%d K=%d)", M, N, K);
}

/* One row per new token into the pools, bf16 rows rounded as ctrl_cpu_f32_to_bf16 rounds. */
static ctrl_status kv_append(void *k_cache, void *v_cache, const float *k, const float *v,
                             const int32_t *slots, int T, int D, ctrl_dtype cache_dtype) {
    const size_t row = (size_t)D;
    for (int t = 0; t < T; t++) {
        const size_t at = (size_t)slots[t] * row;
        if (cache_dtype == CTRL_BF16) {
            ctrl_cpu_f32_to_bf16((uint16_t *)k_cache + at, k + t * row, D);
            ctrl_cpu_f32_to_bf16((uint16_t *)v_cache + at, v + t * row, D);
        } else {
            memcpy((float *)k_cache + at, k + t * row, sizeof(float) * row);
            memcpy((float *)v_cache + at, v + t * row, sizeof(float) * row);
        }
    }
    return CTRL_OK;
}

/* Host memory is malloc's: nothing is held back for reuse. */
static void release_cached(void) {}

static ctrl_status memory_info(size_t *free_bytes, size_t *total_bytes) {
    const double page = (double)sysconf(_SC_PAGESIZE);
    *free_bytes = (size_t)((double)sysconf(_SC_AVPHYS_PAGES) * page);
    *total_bytes = (size_t)((double)sysconf(_SC_PHYS_PAGES) * page);
    return CTRL_OK;
}

static ctrl_status scale(float *x, float s, int64_t n) {
    ctrl_cpu_scale(x, s, n);
    return CTRL_OK;
}

const ctrl_backend_ops *ctrl_backend_cpu(void) {
    static const ctrl_backend_ops ops = {
        .size = sizeof(ctrl_backend_ops),
        .name = "cpu",
        .device_type = CTRL_DEVICE_CPU,
        .host_memory = 1,
        .alloc = cpu_alloc,
        .free = cpu_free,
        .to_device = cpu_memcpy,
        .to_host = cpu_memcpy,
        .copy = cpu_memcpy,
        .fill_zero = cpu_fill_zero,
        .synchronize = cpu_synchronize,
        .embedding_forward = embedding_forward,
        .embedding_backward = embedding_backward,
        .rmsnorm_forward = rmsnorm_forward,
        .rmsnorm_backward = rmsnorm_backward,
        .linear_forward = linear_forward,
        .linear_backward = linear_backward,
        .linear_forward_bf16 = linear_forward_bf16,
        .linear_backward_bf16 = linear_backward_bf16,
        .round_to_bf16 = round_to_bf16,
        .bf16_rounds_weights = ctrl_cpu_has_avx512bf16,
        .rope_forward = rope_forward,
        .rope_backward = rope_backward,
        .swiglu_forward = swiglu_forward,
        .swiglu_backward = swiglu_backward,
        .residual_forward = residual_forward,
        .residual_backward = residual_backward,
        .head_workspace_bytes = ctrl_cpu_head_workspace_bytes,
        .head_fused_workspace_bytes = ctrl_cpu_head_fused_workspace_bytes,
        .head_forward = head_forward,
        .head_backward = head_backward,
        .head_forward_backward = head_forward_backward,
        .sum_squares = sum_squares,
        .scale = scale,
        .rmsnorm_1p_forward = rmsnorm_1p_forward,
        .rmsnorm_1p_backward = rmsnorm_1p_backward,
        .geglu_forward = geglu_forward,
        .geglu_backward = geglu_backward,
        .head_softcap = 1,
        .rope_partial_forward = rope_partial_forward,
        .rope_partial_backward = rope_partial_backward,
        .gather_rows = gather_rows,
        .scatter_add_rows = scatter_add_rows,
        .rows_dot = rows_dot,
        .gemm = gemm,
        .kv_append = kv_append,
        .release_cached = release_cached,
        .memory_info = memory_info,
        .nf4_dequantize = ctrl_nf4_dequantize_raw, /* QLoRA (model/nf4.c) */
        .nf4_linear_forward = nf4_linear_forward,  /* QLoRA's products (kernels/cpu/gemm_nf4.c) */
        .nf4_linear_backward = nf4_linear_backward,
        .dora_norm = dora_norm, /* DoRA (kernels/cpu/dora.c) */
        .dora_combine = dora_combine,
        .dora_backward = dora_backward,
        .lora_dropout = lora_dropout, /* LoRA's dropout masks (model/lora.c) */
        .to_bf16 = to_bf16,
        .from_bf16 = from_bf16,
        .bf16_kernel = bf16_kernel,
    };
    return &ops;
}
