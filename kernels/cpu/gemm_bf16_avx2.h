/* Decoding's (and a prefill's) bf16 product on a CPU with AVX2 and FMA but no bf16 instructions
 * (gemm_bf16_avx2.c): C[M, N] = bf16(A)[M, K] bf16(W)[N, K]^T, fp32 accumulation, W packed once into panels
 * of 2 bytes a value (where the fp32 fallback of kernels/cpu/bf16.c reads 4 bytes a value of a rounded fp32
 * copy, or rounds W in every call).
 *
 * Each C element is one fp32 sum over k in increasing order (fused multiply-adds, both factors
 * bf16 values: each product is exact), the same for any M, any row of a block, any thread count:
 * a sequence's logits do not depend on how many others decode beside it nor on the threads, nor on
 * how its prompt was cut into prefill calls. Up to 64 rows (decoding's steps) narrow tiles read the
 * 2-byte panels directly; more rows (a prefill) a widened 6 x 16 fp32 tile (CTRL_NO_AVX2_WIDE=1: the
 * narrow tiles at any row count, for comparisons): the same sums either way.
 *
 * ctrl_cpu_bf16_avx2_available: 1 where this CPU runs the kernel (AVX2 and FMA; compiled for x86-64).
 * _pack: W [N, K] (row stride ldw) rounded and packed (NULL: unavailable or out of memory);
 * _repack: W's new values into p (same shape; 0, or -1); _linear: C (row stride ldc) = the product
 * of A [M, K] (row stride lda; rounded to bf16 as it is read) and p's W^T (0, or -1 without scratch
 * memory: C untouched); _unpack: p's bf16 values back as fp32 into W [N, K] (tests); _bytes, _free. */
#ifndef CTRL_KERNELS_CPU_GEMM_BF16_AVX2_H
#define CTRL_KERNELS_CPU_GEMM_BF16_AVX2_H

#include <stddef.h>

typedef struct ctrl_cpu_bf16_avx2_panels ctrl_cpu_bf16_avx2_panels;

int ctrl_cpu_bf16_avx2_available(void);
ctrl_cpu_bf16_avx2_panels *ctrl_cpu_bf16_avx2_pack(int N, int K, const float *W, int ldw);
int ctrl_cpu_bf16_avx2_repack(ctrl_cpu_bf16_avx2_panels *p, const float *W, int ldw);
int ctrl_cpu_bf16_avx2_linear(int M, const float *A, int lda, const ctrl_cpu_bf16_avx2_panels *p, float *C,
                              int ldc);
int ctrl_cpu_bf16_avx2_unpack(const ctrl_cpu_bf16_avx2_panels *p, float *W, int ldw);
int ctrl_cpu_bf16_avx2_shape(const ctrl_cpu_bf16_avx2_panels *p, int *N, int *K);
size_t ctrl_cpu_bf16_avx2_bytes(const ctrl_cpu_bf16_avx2_panels *p);
void ctrl_cpu_bf16_avx2_free(ctrl_cpu_bf16_avx2_panels *p);

#endif
