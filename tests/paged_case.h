/* A paged-attention test case, shared by tests/unit/test_paged_attention.c (against flash) and
 * tests/cuda/test_cuda_paged.c (CUDA against CPU): random sequences laid out contiguously (for a
 * reference over them) and scattered into K/V block pools through shuffled block tables, with
 * the rows no sequence owns set to NaN; queries at every position or at each sequence's last. */
#ifndef CTRL_TEST_PAGED_CASE_H
#define CTRL_TEST_PAGED_CASE_H

#include <stdint.h>

#include <ctrl/attention.h>

typedef struct paged_shape {
    int H, HK, D, window, block, last_only, bf16; /* bf16: the cache holds bf16 */
} paged_shape;

enum { PAGED_CASE_MAX_SEQS = 8 };

typedef struct paged_case {
    int B, T, n;                         /* sequences, contiguous tokens, queries */
    int32_t cu[PAGED_CASE_MAX_SEQS + 1]; /* contiguous layout */
    float *q, *k, *v;                    /* [T, heads, D]; k and v bf16-rounded with a bf16 cache */
    int32_t *query_row;                  /* [n] each query's row in the contiguous layout */
    float *qs;                           /* [n, H, D] the queries in paged order */
    void *kc, *vc;                       /* the pools */
    size_t pool_bytes;
    int32_t *tables, *seq_of, *pos;
    ctrl_paged_attention_args args; /* host pointers; args.out is the caller's */
} paged_case;

/* lens[B] (B <= PAGED_CASE_MAX_SEQS); values from a generator seeded with `seed`. */
void paged_case_make(paged_case *c, paged_shape sh, const int *lens, int B, uint64_t seed);
void paged_case_free(paged_case *c);

#endif
