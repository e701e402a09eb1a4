/* The least work (elements a loop touches) for which a CPU kernel's loop runs in parallel. Below it
 * one thread finishes before the others would be awake: under OMP_WAIT_POLICY=PASSIVE the idle
 * threads sleep, and every parallel region wakes them and ends in a barrier (futex calls, tens of
 * microseconds on a busy machine). A decoding step of a few sequences is mostly such loops -- the
 * norms, rotations, adds and activations of a few rows between its GEMMs, in every layer; a
 * training step's are thousands of rows and stay parallel. Each element's arithmetic is the same at
 * any thread count (the loops split rows or elements, never a sum). */
#ifndef CTRL_KERNELS_CPU_PAR_MIN_H
#define CTRL_KERNELS_CPU_PAR_MIN_H

#define CTRL_CPU_PAR_MIN 65536

/* The same for a product, in multiply-adds (M N K): below it (~40 us on one core in bf16) the
 * product runs on one thread -- a decoding step's LoRA factors (8 x 16 x 896) and narrow
 * projections (k, v: 8 x 128 x 896) each cost less than the other threads' wake-up. The same
 * numbers either way: a thread computes whole output tiles, never part of a sum. */
#define CTRL_CPU_GEMM_PAR_MIN (1 << 21)
#define CTRL_CPU_GEMM_PARALLEL(M, N, K)                                                                      \
    ((double)(M) * (double)(N) * (double)(K) >= (double)CTRL_CPU_GEMM_PAR_MIN)

#endif
