/* Reused pages on the host (page_pool.c): a small pool of anonymous memory whose pages are moved
 * (mremap) onto released ranges (given back with madvise MADV_DONTNEED, reading zeros) just before they
 * are written again, and moved back at their next release, so that the writes do not fault and zero
 * each page again. ZeRO stage 3 lends them to the layers' gathers and to their gradients in the backward
 * (train/zero_layers.c); a frozen model held in bf16 to the layer widened into fp32
 * (model/model_bf16_store.c). */
#ifndef CTRL_CORE_PAGE_POOL_H
#define CTRL_CORE_PAGE_POOL_H

#include <stddef.h>

/* A run of whole pages. */
typedef struct page_piece {
    char *at;
    size_t len;
} page_piece;

/* The whole pages inside [from, to) (len 0 when there are none). */
page_piece page_span(const void *from, const void *to);
/* The whole pages inside [from, to) given back to the system (MADV_DONTNEED: they read as zeros until
 * written again), advised to small pages first (ctrl/hugepages.h: a partly released 2 MiB block is not
 * kept whole, a released one not filled again). Advice: kept resident where refused. */
void page_release(const void *from, const void *to);

typedef struct page_pool page_pool;

/* `frames` frames of `frame` bytes, each lending at most `cap` pieces to one use, for keys
 * 0 .. n_keys - 1; NULL (every use the old way) when there is nothing to lend or without memory for
 * it. (The callers' switches that turn their pool off for comparisons: CTRL_TEST_ZERO3_REFAULT,
 * CTRL_TEST_BF16_REFAULT.) */
page_pool *page_pool_new(int frames, size_t frame, int cap, int n_keys);
/* What is lent stays where it is, as ordinary memory. NULL: nothing. */
void page_pool_free(page_pool *pl);
/* `key`'s n pieces (its released ranges, to be written next) backed by a free frame's pages, when a
 * frame is free and large enough; otherwise nothing (the writes fault fresh pages, the old way). */
void page_pool_lend(page_pool *pl, int key, const page_piece *pc, int n);
/* `key`'s frame, when it has one, back: its pages moved home, the pieces left mapped and empty
 * (reading zeros). Returns whether it had one (else the caller releases its ranges itself). */
int page_pool_give_back(page_pool *pl, int key);
/* A use counted as taken the old way without asking the pool (more pieces than the caller holds). */
void page_pool_count_miss(page_pool *pl);

typedef struct page_pool_stats {
    long lent, missed; /* uses on a frame; uses the old way (too large, none free) */
    int frames, used;  /* frames; frames lent at least once (their pages resident since) */
    size_t frame;      /* bytes a frame */
    int broken;        /* an mremap failed: every use the old way from then on */
} page_pool_stats;
page_pool_stats page_pool_get_stats(const page_pool *pl);

#endif
