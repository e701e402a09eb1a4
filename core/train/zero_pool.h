/* ZeRO stage 3's reused pages on the host (zero_pool.c): a small pool of anonymous memory whose
 * pages are moved (mremap) onto the released pages of the parameters or gradients in use, and moved
 * back at their release, so that a gather into released memory does not fault and zero each page
 * again (zero_layers.c lends them to the layers' gathers and to their gradients in the backward). */
#ifndef CTRL_TRAIN_ZERO_POOL_H
#define CTRL_TRAIN_ZERO_POOL_H

#include <stddef.h>

/* A run of whole pages. */
typedef struct zero_piece {
    char *at;
    size_t len;
} zero_piece;

/* The whole pages inside [from, to) (len 0 when there are none). */
zero_piece zero_page_span(const void *from, const void *to);

typedef struct zero_pool zero_pool;

/* `frames` frames of `frame` bytes, each lending at most `cap` pieces to one use, for keys
 * 0 .. n_keys - 1; NULL (every use the old way) when there is nothing to lend, without memory for it,
 * or with CTRL_TEST_ZERO3_REFAULT set (tests and benchmarks compare with it). */
zero_pool *zero_pool_new(int frames, size_t frame, int cap, int n_keys);
/* What is lent stays where it is, as ordinary memory. NULL: nothing. */
void zero_pool_free(zero_pool *pl);
/* `key`'s n pieces (its released ranges, to be written next) backed by a free frame's pages, when a
 * frame is free and large enough; otherwise nothing (the writes fault fresh pages, the old way). */
void zero_pool_lend(zero_pool *pl, int key, const zero_piece *pc, int n);
/* `key`'s frame, when it has one, back: its pages moved home, the pieces left mapped and empty
 * (reading zeros). Returns whether it had one (else the caller releases its ranges itself). */
int zero_pool_give_back(zero_pool *pl, int key);
/* A use counted as taken the old way without asking the pool (more pieces than the caller holds). */
void zero_pool_count_miss(zero_pool *pl);

typedef struct zero_pool_stats {
    long lent, missed; /* uses on a frame; uses the old way (too large, none free) */
    int frames, used;  /* frames; frames lent at least once (their pages resident since) */
    size_t frame;      /* bytes a frame */
    int broken;        /* an mremap failed: every use the old way from then on */
} zero_pool_stats;
zero_pool_stats zero_pool_get_stats(const zero_pool *pl);

#endif
