/* CPU kernels: the reference implementation of every model op (forward and backward).
 * The CUDA backend (kernels/cuda/cuda_ops.h) mirrors these signatures with a ctrl_cuda_ prefix
 * and device pointers, and is tested against them.
 *
 * Conventions (llm.c style, flat row-major buffers):
 *   T = tokens in the flat batch, C = hidden size, V = vocab, IN/OUT = linear sizes.
 *   Linear weights use the Hugging Face layout [OUT, IN]: y = x W^T + b.
 *   Backward: gradients of PARAMETERS are accumulated (+=); gradients of INPUTS are written (=).
 *   Optional outputs/inputs may be NULL where the comment says so. */
#ifndef CTRL_KERNELS_CPU_OPS_H
#define CTRL_KERNELS_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include <ctrl/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Embedding: out[t] = wte[tokens[t]]. */
void ctrl_cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte, int T, int C);
/* Tokens < 0 add nothing: the model passes its padding_idx (config.json's pad_token_id) as -1, whose
 * row nn.Embedding never gives a gradient. */
void ctrl_cpu_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int T, int C);
/* A frozen table held as bf16 values (wte16 [V, C], 2 bytes a value): out[t] = wte16[tokens[t]] widened
 * to fp32 (exact). */
void ctrl_cpu_embedding_forward_bf16(float *out, const int32_t *tokens, const uint16_t *wte16, int T, int C);
/* C[M,N] (+)= alpha op(A)[M,K] op(B)[K,N] with B held as bf16 values (ldb apart; trans_b: B stored
 * [N,K], else [K,N]; alpha other than 1 only with trans_b and without accumulate): B's rows widened
 * to fp32 a block at a time (about 4 MiB of scratch) and multiplied there, with bf16 by
 * ctrl_cpu_gemm_bf16 -- bit for bit its product on B's fp32 values where a bf16 kernel runs (the
 * blocks split N, or K at whole depth blocks) -- otherwise, and with bf16 = 0, by SGEMM. 0; -1 out
 * of memory or a product it does not form. */
int ctrl_cpu_gemm_w16(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                      const uint16_t *B, int ldb, float *C, int ldc, int accumulate, int bf16);

/* RMSNorm (Llama/Qwen): out = x / sqrt(mean(x^2) + eps) * weight; rstd[T] saved for backward. */
void ctrl_cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *weight, int T, int C,
                              float eps);
void ctrl_cpu_rmsnorm_backward(float *dx, float *dweight, const float *dout, const float *x,
                               const float *weight, const float *rstd, int T, int C);
/* Gemma's RMSNorm: out = (x / sqrt(mean(x^2) + eps)) * (1 + weight); the same backward contract. */
void ctrl_cpu_rmsnorm_1p_forward(float *out, float *rstd, const float *x, const float *weight, int T, int C,
                                 float eps);
void ctrl_cpu_rmsnorm_1p_backward(float *dx, float *dweight, const float *dout, const float *x,
                                  const float *weight, const float *rstd, int T, int C);

/* Linear: out[T,OUT] = x[T,IN] W[OUT,IN]^T + bias[OUT] (bias may be NULL). GEMM through OpenBLAS. */
void ctrl_cpu_linear_forward(float *out, const float *x, const float *w, const float *bias, int T, int IN,
                             int OUT);
/* dx may be NULL (not needed); dbias may be NULL (no bias). */
void ctrl_cpu_linear_backward(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                              const float *w, int T, int IN, int OUT);

/* bf16 (kernels/cpu/bf16.c, gemm_bf16.c): conversions with round-to-nearest-even; C[M,N] (+)=
 * A[M,K] B[N,K]^T on bf16 inputs with fp32 accumulation, through AVX-512 BF16 where the CPU has it
 * (ctrl_cpu_has_avx512bf16: cpuid and the OS's saved state; CTRL_NO_AVX512BF16 in the environment
 * forces the portable path); and the linear layer on it: inputs rounded to bf16, outputs and
 * gradients fp32 (w_rounded = 1: w already holds bf16 values, e.g. a model's rounded copy, and is not
 * rounded again). The linear functions return 0, or -1 when scratch memory could not be had. */
void ctrl_cpu_f32_to_bf16(uint16_t *dst, const float *src, int64_t n);
void ctrl_cpu_bf16_to_f32(float *dst, const uint16_t *src, int64_t n);
/* dst = src rounded to the nearest bf16 value, kept in fp32 (dst may be src). */
void ctrl_cpu_round_to_bf16(float *dst, const float *src, int64_t n);
int ctrl_cpu_has_avx512bf16(void);
/* The bf16 GEMM's path, picked at run time (environment switches read at each call, so tests flip
 * them): AMX tiles where cpuid reports amx_tile and amx_bf16, XCR0 has the tile state enabled and
 * Linux grants it to the process (arch_prctl ARCH_REQ_XCOMP_PERM), unless CTRL_NO_AMX is set; else
 * AVX-512 BF16 (ctrl_cpu_has_avx512bf16); else fp32. CTRL_NO_AVX512BF16 turns off both (AMX's
 * packing is AVX-512 code). CTRL_AMX_EMULATE=1 (tests only; slow) runs the AMX kernel on the
 * software emulation of its instructions (kernels/cpu/amx_emu.h) where AVX-512 BF16 is on and
 * CTRL_NO_AMX is not set. ctrl_cpu_has_amx: the CPU, the OS and Linux allow AMX (no switch read). */
typedef enum ctrl_cpu_bf16_kind {
    CTRL_CPU_BF16_FP32 = 0,     /* no bf16 instructions: SGEMM on bf16-rounded inputs */
    CTRL_CPU_BF16_AVX512,       /* vdpbf16ps register tiles */
    CTRL_CPU_BF16_AMX,          /* tdpbf16ps on AMX tiles */
    CTRL_CPU_BF16_AMX_EMULATED, /* the AMX kernel on emulated instructions */
} ctrl_cpu_bf16_kind;
ctrl_cpu_bf16_kind ctrl_cpu_bf16_kind_now(void);
int ctrl_cpu_has_amx(void);
/* OpenBLAS's kernels against the CPU (kernels/cpu/blas_core.c). ctrl_cpu_blas_better_core: the
 * OPENBLAS_CORETYPE to use instead of the kernels named current (OpenBLAS's core name) where they
 * predate AVX2 and the CPU has AVX2 + FMA ("SkylakeX" with AVX-512, else "Haswell"); NULL where
 * current is fine. ctrl_cpu_blas_core_advice: the same for the loaded OpenBLAS and this CPU, *current
 * set to OpenBLAS's choice (CTRL_TEST_BLAS_CORENAME, where set, stands in for it: tests). */
const char *ctrl_cpu_blas_better_core(const char *current, int avx2_fma, int avx512);
const char *ctrl_cpu_blas_core_advice(const char **current);
/* How bf16 linear layers run here, in words; *fast = 0 where that is no faster than fp32. */
const char *ctrl_cpu_bf16_path(int *fast);
/* Why no bf16 kernel runs now (no AVX-512 BF16, turned off, not built), in words; NULL where one runs
 * (AMX, AVX-512 BF16, AMX emulated). */
const char *ctrl_cpu_bf16_no_kernel_why(void);
/* Row-major C = alpha op(A) op(B) + beta C over typed operands (A, B of `ab`; C of `c`: fp32 x fp32
 * -> fp32, bf16 x bf16 -> fp32 or bf16), fp32 accumulation (gemm_typed.c). 0; -1 out of memory;
 * -2 an unsupported combination. */
int ctrl_cpu_gemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                  const void *B, int ldb, float beta, void *C, int ldc, ctrl_dtype ab, ctrl_dtype c);
void ctrl_cpu_gemm_bf16_nt(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K,
                           int accumulate);
/* The blocked bf16 GEMM (gemm_bf16.c; AMX tiles or AVX-512 BF16, ctrl_cpu_bf16_kind_now), as
 * cblas_sgemm row-major with alpha 1:
 * C[M,N] = (accumulate ? C : 0) + op(A) op(B), op(A)[M,K] = trans_a ? A^T (A stored [K,M]) : A,
 * op(B)[K,N] = trans_b ? B^T (B stored [N,K]) : B; fp32 inputs are rounded to bf16 as they are packed,
 * products accumulate in fp32. Returns 0, or -1 (C untouched) on the fp32 path or without scratch memory.
 * A few rows (M <= 4) times B^T (x W^T while decoding) read B once, rounding it in registers (AVX-512).
 * ctrl_cpu_gemm_bf16_nt_avx512: the same on bf16 inputs, C[M,N] (+)= A[M,K] B[N,K]^T (on AMX too).
 * ctrl_cpu_gemm_bf16_compiled: 1 when this build has the AVX-512 BF16 code at all. */
int ctrl_cpu_gemm_bf16(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda, const float *B,
                       int ldb, float *C, int ldc, int accumulate);
int ctrl_cpu_gemm_bf16_nt_avx512(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K,
                                 int accumulate);
int ctrl_cpu_gemm_bf16_compiled(void);
/* op(B)[K,N] (trans_b as ctrl_cpu_gemm_bf16) rounded and packed once, in the layout of the kernel
 * that runs now, for products against it without packing it again (weights between optimizer
 * steps; decoding; a LoRA run's frozen base, held as panels and nothing else): ctrl_cpu_gemm_bf16_pack
 * (NULL on the fp32 path or without memory; about 2 bytes a value: _pack_bytes says how many for
 * N x K under the kernel running now, 0 on the fp32 path), _repack (B's new values, same shape;
 * repacks for the kernel running now; 0 or -1), _packed: C[M,N] (+)= op(A)[M,K] B as
 * ctrl_cpu_gemm_bf16 computes it, bit for bit where it would take the blocked path (a kernel of
 * another layout than the panels' -- CTRL_NO_AMX flipped -- reads them into its own as it goes);
 * _packed_t: C[M,K] (+)= op(A)[M,N] op(B)^T on the same panels (a linear layer's dX = dY W on the
 * panels of its forward's x W^T: they are re-paired 16 x 16 as they are read, 2 bytes a value, no
 * second copy), bit for bit ctrl_cpu_gemm_bf16 on op(B)^T; both -1, C untouched, on the fp32 path
 * or without memory. _unpack writes the bf16 values back as fp32, B stored as packed (trans_b: [N,K],
 * else [K,N]; -1 where no panels can exist). The packed copy is a snapshot: repack after B changes. */
typedef struct ctrl_cpu_bf16_packed ctrl_cpu_bf16_packed;
ctrl_cpu_bf16_packed *ctrl_cpu_gemm_bf16_pack(int trans_b, int N, int K, const float *B, int ldb);
int ctrl_cpu_gemm_bf16_repack(ctrl_cpu_bf16_packed *p, const float *B, int ldb);
/* Whether p holds panels of B [N, K] (trans_b 1) or [K, N] (trans_b 0): a repack of such a B fits it. */
int ctrl_cpu_gemm_bf16_packed_is(const ctrl_cpu_bf16_packed *p, int trans_b, int N, int K);
int ctrl_cpu_gemm_bf16_packed(int trans_a, int M, const float *A, int lda, const ctrl_cpu_bf16_packed *p,
                              float *C, int ldc, int accumulate);
int ctrl_cpu_gemm_bf16_packed_t(int trans_a, int M, const float *A, int lda, const ctrl_cpu_bf16_packed *p,
                                float *C, int ldc, int accumulate);
int ctrl_cpu_gemm_bf16_packed_unpack(const ctrl_cpu_bf16_packed *p, float *B, int ldb);
size_t ctrl_cpu_gemm_bf16_pack_bytes(int N, int K);
/* Panels of a B stored [N, K] (trans_b 1: a weight W, op(B) = W^T) read in parts, for a W whose panels
 * are its only copy (a frozen embedding tied to the LM head). _block: the width of p's column blocks
 * (0: not such panels); _cols: a range of op(B)'s columns [n0, n0 + n) -- n0 a multiple of the block,
 * n one too or reaching N -- as a product of its own: C[M, n] (+)= A[M, K] op(B)[:, n0 : n0 + n]
 * (transposed 0), or C[M, K] (+)= A[M, n] op(B)[:, n0 : n0 + n]^T (transposed 1: dX = dY W over a
 * chunk of W's rows), bit for bit _packed and _packed_t on panels packed from those rows alone (with
 * transposed 0 also the whole product's columns); A row-major; -1 (C untouched) for another range or
 * without a kernel. _rows: rows[i] of B (of W) as fp32 into out + i * ldo (exact: they are bf16 values); -1
 * where a row is out of range (nothing written). */
int ctrl_cpu_gemm_bf16_packed_block(const ctrl_cpu_bf16_packed *p);
int ctrl_cpu_gemm_bf16_packed_cols(int transposed, int M, const float *A, int lda,
                                   const ctrl_cpu_bf16_packed *p, int n0, int n, float *C, int ldc,
                                   int accumulate);
int ctrl_cpu_gemm_bf16_packed_rows(const ctrl_cpu_bf16_packed *p, const int32_t *rows, int n, float *out,
                                   int ldo);
/* The depth block (kc) of the kernel ctrl_cpu_gemm_bf16 runs now for N columns and depth K (0: none): a
 * product cut along K into whole multiples of it sums in the unsplit product's order. */
int ctrl_cpu_gemm_bf16_depth_block(int N, int K);
size_t ctrl_cpu_gemm_bf16_packed_bytes(const ctrl_cpu_bf16_packed *p);
void ctrl_cpu_gemm_bf16_packed_free(ctrl_cpu_bf16_packed *p);
/* An operand several products read (x by q, k and v and their LoRA adapters' A; dL/dout by dX and the
 * adapter's B^T; x as the B of several weight gradients), packed once instead of in each product:
 * ctrl_cpu_gemm_bf16_share puts X in slot (0 or 1) of the calling thread as op(A)[rows, K] (as_b 0,
 * trans = trans_a, ld = lda) or op(B)[K, rows] (as_b 1, trans = trans_b, ld = ldb); the first product
 * of this thread (ctrl_cpu_gemm_bf16, _source, _packed, _packed_t) whose operand is exactly that --
 * the same pointer, transposition, shape and leading dimension -- packs it whole, and the later ones
 * whose kernel has the same layout read it as packed. The products are bit for bit those packing per
 * call. X must not change while it is in the slot; X NULL empties the slot (its memory kept for the
 * next operand); _share_release frees the thread's slots' memory; _share_stats: how many operands
 * were packed into slots and how many products read one, on this thread, so far. 0, or -1 (slot out
 * of range, or no blocked GEMM in this build). */
int ctrl_cpu_gemm_bf16_share(int slot, int as_b, int trans, int rows, int K, const float *X, int ld);
void ctrl_cpu_gemm_bf16_share_release(void);
void ctrl_cpu_gemm_bf16_share_stats(size_t *packed, size_t *read);
/* ctrl_cpu_gemm_bf16 with B made on the fly instead of read from memory (QLoRA's NF4 weights,
 * gemm_nf4.c): src(ctx, i, n, dst) writes the n values at row-major indices [i, i + n) of B as
 * stored (ldb apart, [K,N] or [N,K] as trans_b says) into dst as bf16 (round to nearest even, as the
 * packing rounds an fp32 B), a run of a row (at most a depth block, or a few groups of 16 columns) at
 * a time; called from several threads at once. */
typedef void (*ctrl_cpu_gemm_source)(const void *ctx, size_t i, int n, uint16_t *dst);
int ctrl_cpu_gemm_bf16_source(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                              ctrl_cpu_gemm_source b_src, const void *b_ctx, int ldb, float *C, int ldc,
                              int accumulate);
/* A weight held in NF4 (QLoRA; core/model/nf4.h): n values, the packed nibbles, one absmax byte per
 * block of 64, one fp32 scale per 256 blocks and the offset, and the code books (the 16 NF4 values,
 * the 256 of the dynamic code); pointers in the backend's memory. first: where the weight's value 0
 * is in the quantized tensor (0, or a row block of a fused tensor quantized whole, as bitsandbytes
 * quantizes Phi-3's qkv_proj: its blocks of 64 run over the flat index of the whole tensor, so a
 * row block may start inside one); the weight's values are [first, first + n) of it. */
typedef struct ctrl_nf4_ref {
    const uint8_t *packed, *qabsmax;
    const float *absmax2;
    float offset;
    const float *code, *dynamic;
    int64_t n;
    int64_t first;
} ctrl_nf4_ref;
/* QLoRA's products (gemm_nf4.c), W [OUT, IN] in NF4 dequantized a tile at a time inside the
 * product, never whole: out[T, OUT] = x W^T + bias, and dx[T, IN] = dout W (the base is frozen: no
 * dW). bf16 = 1: as ctrl_cpu_linear_forward_bf16 (inputs and W's values rounded to bf16, fp32
 * accumulation). 0; -1 out of memory; -2 when OUT * IN is not w->n. ctrl_cpu_nf4_values: W's values
 * [i, i + n) as fp32 (ctrl_nf4_dequantize's bit for bit). ctrl_cpu_nf4_scratch_bytes: the most
 * memory a product takes besides the GEMM's own packing (a band of W, the rounded input). */
void ctrl_cpu_nf4_values(const ctrl_nf4_ref *w, int64_t i, int64_t n, float *dst);
/* The scale of block b of 64: dynamic[qabsmax[b]] * absmax2[b / 256] + offset, each operation rounded. */
float ctrl_cpu_nf4_block_scale(const ctrl_nf4_ref *w, int64_t b);
int ctrl_cpu_nf4_linear_forward(float *out, const float *x, const ctrl_nf4_ref *w, const float *bias, int T,
                                int IN, int OUT, int bf16);
int ctrl_cpu_nf4_linear_backward(float *dx, const float *dout, const ctrl_nf4_ref *w, int T, int IN, int OUT,
                                 int bf16);
size_t ctrl_cpu_nf4_scratch_bytes(int T, int IN, int OUT, int bf16);
int ctrl_cpu_linear_forward_bf16(float *out, const float *x, const float *w, const float *bias, int T, int IN,
                                 int OUT, int w_rounded);
int ctrl_cpu_linear_backward_bf16(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                                  const float *w, int T, int IN, int OUT, int w_rounded);

/* RoPE tables. Kinds follow transformers' rope_scaling "rope_type". */
typedef enum ctrl_rope_kind {
    CTRL_ROPE_DEFAULT = 0,
    CTRL_ROPE_LINEAR,
    CTRL_ROPE_LLAMA3,
    CTRL_ROPE_YARN,
    CTRL_ROPE_DYNAMIC,  /* NTK-aware dynamic: tables depend on the sequence length seen */
    CTRL_ROPE_LONGROPE, /* Phi-3's longrope ("su"): short_factor, or long_factor past the trained context */
} ctrl_rope_kind;

#define CTRL_ROPE_MAX_FACTORS 512 /* longrope's per-frequency factors: head_dim / 2 at most */

typedef struct ctrl_rope_params {
    ctrl_rope_kind kind;
    double theta;                 /* rope_theta */
    double factor;                /* rope_scaling.factor */
    double low_freq_factor;       /* llama3 */
    double high_freq_factor;      /* llama3 */
    int original_max_position;    /* original_max_position_embeddings (llama3, yarn, dynamic) */
    double beta_fast, beta_slow;  /* yarn (defaults 32, 1) */
    double attention_factor;      /* yarn mscale; 0 = derived from factor as transformers does */
    double partial_rotary_factor; /* 1.0 = rotate the whole head */
    /* longrope: the frequencies divided by short_factor[i], or by long_factor[i] when `use_long` (the
     * sequence seen exceeds original_max_position: transformers' longrope_frequency_update); cos and
     * sin times attention_factor (0: sqrt(1 + ln(factor) / ln(original_max_position)), factor > 1) */
    int n_factors;
    float short_factor[CTRL_ROPE_MAX_FACTORS], long_factor[CTRL_ROPE_MAX_FACTORS];
    int use_long;
} ctrl_rope_params;

/* cos/sin tables [max_pos, head_dim/2] (rotate-half convention: pairs (i, i + head_dim/2)); for partial
 * rotary pass the rotated dimensions as head_dim. */
void ctrl_cpu_rope_tables(float *cos_tab, float *sin_tab, int max_pos, int head_dim,
                          const ctrl_rope_params *p);
/* x: [T, n_head, head_dim]; pos[T] gives each token's position (restarting per packed sequence).
 * In place is allowed (out == x). */
void ctrl_cpu_rope_forward(float *out, const float *x, const int32_t *pos, const float *cos_tab,
                           const float *sin_tab, int T, int n_head, int head_dim);
void ctrl_cpu_rope_backward(float *dx, const float *dout, const int32_t *pos, const float *cos_tab,
                            const float *sin_tab, int T, int n_head, int head_dim);
/* Partial rotary (Phi-3/4's partial_rotary_factor): only the first rot_dim (even) dimensions of each head
 * rotate, pairs (i, i + rot_dim/2), over tables of rot_dim/2 columns; the rest pass through. */
void ctrl_cpu_rope_partial_forward(float *out, const float *x, const int32_t *pos, const float *cos_tab,
                                   const float *sin_tab, int T, int n_head, int head_dim, int rot_dim);
void ctrl_cpu_rope_partial_backward(float *dx, const float *dout, const int32_t *pos, const float *cos_tab,
                                    const float *sin_tab, int T, int n_head, int head_dim, int rot_dim);

/* SwiGLU: out = silu(gate) * up, elementwise over n values. */
void ctrl_cpu_swiglu_forward(float *out, const float *gate, const float *up, int64_t n);
void ctrl_cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                              int64_t n);

/* GeGLU (Gemma): out = gelu_tanh(gate) * up (torch's approximate="tanh" GELU), elementwise. */
void ctrl_cpu_geglu_forward(float *out, const float *gate, const float *up, int64_t n);
void ctrl_cpu_geglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                             int64_t n);

/* Mixture of experts (kernels/cpu/moe.c), n rows of C: out[i] = scale[i] x[rows[i]] (gather);
 * out[rows[i]] += scale[i] y[i], in the order of i (scatter, accumulating); out[i] = x[rows[i]] . y[i]
 * (the routing weights' gradient). scale may be NULL (1). */
void ctrl_cpu_gather_rows(float *out, const float *x, const int32_t *rows, const float *scale, int n, int C);
void ctrl_cpu_scatter_add_rows(float *out, const float *y, const int32_t *rows, const float *scale, int n,
                               int C);
void ctrl_cpu_rows_dot(float *out, const float *x, const int32_t *rows, const float *y, int n, int C);

/* Residual: out = a + b. Backward: da += dout, db += dout (both accumulate: the residual stream). */
void ctrl_cpu_residual_forward(float *out, const float *a, const float *b, int64_t n);
void ctrl_cpu_residual_backward(float *da, float *db, const float *dout, int64_t n);

/* The fused head (DESIGN §5): per-token log-probability of targets[t] under
 * softmax(hidden[t] W_lm^T / temperature), and the entropy of that distribution, computed in
 * chunks of tokens and vocabulary so that the [T, V] logits never exist in full.
 *   logp[T]      written
 *   entropy[T]   written, may be NULL
 *   lse[T]       written: log-sum-exp of the scaled logits, saved for backward
 *   correct[T]   written, may be NULL: 1 when argmax == target (mean_token_accuracy)
 * targets[t] < 0 marks a position with no target (logp, entropy = 0 there). */
typedef struct ctrl_head_args {
    const float *hidden;    /* [T, C] */
    const float *w;         /* [V, C] (lm_head, or the tied embedding) */
    const int32_t *targets; /* [T] */
    int T, C, V;
    float temperature; /* > 0 */
    int chunk_tokens;  /* 0 = default */
    int chunk_vocab;   /* 0 = default */
    int bf16;          /* 1: the products in bf16 as torch.autocast runs lm_head (inputs rounded to bf16,
                        * fp32 accumulation) where the CPU has a fast bf16 GEMM; fp32 otherwise */
    /* Appended: final-logit soft-capping (Gemma 2): logits = softcap * tanh(h W^T / softcap) before
     * the temperature; 0 = none. A backend that cannot cap refuses a nonzero one. */
    float softcap;
    /* Appended: 1: the rows without a target are skipped (no logits: TRL's logits_to_keep, done by
     * row), their logp, entropy, correct, lse and dhidden rows 0; the rest exactly as with 0. A
     * backend may ignore it (compute every row; lse is then defined there too). */
    int targets_only;
    /* Appended: W's bf16 panels as ctrl_cpu_gemm_bf16_pack(1, V, C, w, C) made them from w as it is
     * now (decoding's, core/model/model_decode_pack.c), or NULL: with bf16, the one-pass head's
     * logits multiply by them instead of packing W anew (the same sums). Host memory only. With w
     * and w16 NULL they are W's only copy (a frozen embedding tied to the head, held as the head's
     * panels; dw must be NULL): every product of the head reads them (ctrl_cpu_gemm_bf16_packed_cols,
     * the vocabulary chunks whole column blocks of theirs), whatever bf16 says. */
    const struct ctrl_cpu_bf16_packed *w_packed;
    /* Appended: with bf16, w already rounded to bf16 and held as 2-byte values [V, C] (the model's bf16
     * copy of its weights on a device): the products read it as it is instead of rounding w's chunks
     * in every call. NULL: none. Used by the CUDA head; the CPU head reads w, and w16 only where w is
     * NULL (a frozen embedding tied to the head held as bf16 values alone: [peft] embedding_dtype =
     * bf16; dw must then be NULL): the same products on the same bf16 values (ctrl_cpu_gemm_w16). */
    const uint16_t *w16;
    /* Appended: where the one-pass bf16 head keeps the panels it packs W into for a trained head
     * (dw given, no w_packed) from one call to the next: the caller's slot, NULL at first; each call
     * packs W anew into the kept buffer (ctrl_cpu_gemm_bf16_repack: the same values as a fresh pack)
     * instead of allocating, faulting in and unmapping it every step (272 MB at Qwen's vocabulary).
     * The caller frees *w_keep (ctrl_cpu_gemm_bf16_packed_free). NULL: packed and freed in each call. */
    struct ctrl_cpu_bf16_packed **w_keep;
    /* Appended: the backward's gradient of W's rows tt_rows[0 .. tt_n) (host memory, distinct, < V)
     * accumulated into tt_dw [tt_n, C] (the backend's memory) as dw's rows would be, dw itself may be
     * NULL: PEFT's trainable_token_indices on a head tied to the embedding (core/model/lora_tokens.c).
     * tt_n 0: none. */
    const int32_t *tt_rows;
    int tt_n;
    float *tt_dw;
} ctrl_head_args;

/* Bytes of scratch forward/backward need (the chunk buffers); the caller provides it. */
size_t ctrl_cpu_head_workspace_bytes(const ctrl_head_args *a);
void ctrl_cpu_head_forward(const ctrl_head_args *a, float *logp, float *entropy, float *lse, int32_t *correct,
                           void *workspace);
/* dlogp[T] = dL/dlogp; dentropy may be NULL (no loss term on entropy). Writes dhidden[T, C],
 * accumulates dw[V, C]. Recomputes logits chunk by chunk from lse. */
void ctrl_cpu_head_backward(const ctrl_head_args *a, const float *lse, const float *dlogp,
                            const float *entropy, const float *dentropy, float *dhidden, float *dw,
                            void *workspace);

/* Forward and backward in one pass for a dL/dlogp known before the forward (no entropy term):
 * writes what ctrl_cpu_head_forward writes, dhidden[T, C], and accumulates dw[V, C] — the
 * logits of a chunk of tokens exist over the whole vocabulary at once (the workspace: 32 MiB, or
 * 128 tokens' worth for vocabularies over 64k, unless chunk_tokens says otherwise) and are never
 * recomputed. */
size_t ctrl_cpu_head_fused_workspace_bytes(const ctrl_head_args *a);
void ctrl_cpu_head_forward_backward(const ctrl_head_args *a, const float *dlogp, float *logp, float *entropy,
                                    float *lse, int32_t *correct, float *dhidden, float *dw, void *workspace);

/* Global gradient norm: sum of squares over n values (accumulated in double). */
double ctrl_cpu_sum_squares(const float *x, int64_t n);
void ctrl_cpu_scale(float *x, float s, int64_t n);

/* DoRA's per-row ops (core/model/dora.c), on an adapted linear y = x W^T with adapter A [r, IN],
 * B [OUT, r], scaling s and magnitude mag [OUT]:
 * dora_norm: with W (else norm is kept as it is) norm_j = ||W_j + s (B A)_j|| from WA = W A^T
 *   [OUT, r] and BG = B (A A^T) [OUT, r] (sums in double); with g, g_j = mag_j / norm_j.
 * dora_combine: out [T, OUT] (holding x W^T + bias) += (g - 1) base + g yl, base = yb (the dropped-out
 *   input's x' W^T) or else out - bias (bias may be NULL).
 * dora_backward: dmag_j += sum_t dout (yb + yl) / norm_j (in double), then in place yl = g dout,
 *   yb = (g - 1) dout. */
void ctrl_cpu_dora_norm(float *norm, float *g, const float *W, const float *B, const float *WA,
                        const float *BG, const float *mag, float s, int OUT, int IN, int r);
void ctrl_cpu_dora_combine(float *out, const float *yl, const float *yb, const float *bias, const float *g,
                           int T, int OUT);
void ctrl_cpu_dora_backward(float *dmag, float *yl, float *yb, const float *dout, const float *norm,
                            const float *g, int T, int OUT);

#ifdef __cplusplus
}
#endif
#endif
