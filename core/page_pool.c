/* The pool of page_pool.h. Each frame is written once before its first loan, so that its pages are
 * present and the whole pool keeps one anon_vma (the pieces moved home merge back into one mapping).
 * A loan moves the frame's pages onto the use's pieces in order (mremap with MREMAP_FIXED: the page
 * tables move; no fault, no copy); the release moves them back. Both moves keep the range they leave
 * mapped (MREMAP_DONTUNMAP: mapped, empty, reading zeros as after madvise(MADV_DONTNEED)): a lent
 * frame's home must stay reserved, or the next mmap -- malloc's, a collective's -- may be placed in
 * the hole and the move home would replace that memory with the frame's pages. A use with more bytes
 * or pieces than a frame takes, or while every frame is lent, takes the old way; so does every use
 * once an mremap has failed. */
#include "page_pool.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ctrl/hugepages.h>
#include <ctrl/log.h>

struct page_pool {
    char *base;
    size_t frame;
    int frames, cap; /* cap: pieces a frame lends at most */
    int *key_of;     /* per frame: the key it is lent to, -1 free */
    int *n;          /* per frame: its pieces lent, piece[f * cap ..] */
    char *ready;     /* per frame: written once (its pages present) */
    page_piece *piece;
    int *frame_of, n_keys; /* per key: its frame, -1 none */
    long lent, missed;
    int broken;
};

page_piece page_span(const void *from, const void *to) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = ((uintptr_t)from + page - 1) / page * page, hi = (uintptr_t)to / page * page;
    return (page_piece){(char *)lo, hi > lo ? hi - lo : 0};
}

void page_release(const void *from, const void *to) {
    const page_piece r = page_span(from, to);
    if (!r.len) return;
    ctrl_advise_small_pages(r.at, r.len);
    (void)madvise(r.at, r.len, MADV_DONTNEED);
}

page_pool *page_pool_new(int frames, size_t frame, int cap, int n_keys) {
    if (!frame || frames <= 0 || cap <= 0 || n_keys <= 0) return NULL;
    page_pool *pl = calloc(1, sizeof *pl);
    if (!pl) return NULL;
    pl->frame = frame, pl->frames = frames, pl->cap = cap, pl->n_keys = n_keys;
    pl->key_of = malloc(sizeof(int) * (size_t)frames), pl->n = calloc((size_t)frames, sizeof(int));
    pl->ready = calloc((size_t)frames, 1);
    pl->piece = malloc(sizeof(page_piece) * (size_t)frames * (size_t)cap);
    pl->frame_of = malloc(sizeof(int) * (size_t)n_keys);
    void *base =
        mmap(NULL, frame * (size_t)frames, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    pl->base = base == MAP_FAILED ? NULL : base;
    if (!pl->key_of || !pl->n || !pl->ready || !pl->piece || !pl->frame_of || !pl->base) {
        page_pool_free(pl);
        return NULL;
    }
    for (int f = 0; f < frames; f++) pl->key_of[f] = -1;
    for (int k = 0; k < n_keys; k++) pl->frame_of[k] = -1;
    return pl;
}

void page_pool_free(page_pool *pl) {
    if (!pl) return;
    if (pl->base) munmap(pl->base, pl->frame * (size_t)pl->frames);
    free(pl->key_of), free(pl->n), free(pl->ready), free(pl->piece), free(pl->frame_of), free(pl);
}

static void pool_broken(page_pool *pl, const char *what) {
    if (!pl->broken)
        CTRL_WARN("reusing released pages failed (%s: %s); they are faulted again at each use "
                  "from here on",
                  what, strerror(errno));
    pl->broken = 1;
}

/* One move of len bytes from `from` onto `to`, the range left behind kept mapped (empty). */
static int move_pages(char *from, size_t len, char *to) {
    return mremap(from, len, len, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, to) != MAP_FAILED;
}

void page_pool_lend(page_pool *pl, int key, const page_piece *pc, int n) {
    if (!pl || pl->broken || key < 0 || key >= pl->n_keys || pl->frame_of[key] >= 0) return;
    size_t need = 0;
    int k = 0, f = 0;
    for (int i = 0; i < n; i++) need += pc[i].len, k += pc[i].len > 0;
    if (!k) return;
    while (f < pl->frames && pl->key_of[f] >= 0) f++;
    if (need > pl->frame || k > pl->cap || f == pl->frames) {
        pl->missed++;
        return;
    }
    char *from = pl->base + (size_t)f * pl->frame;
    if (!pl->ready[f]) memset(from, 0, pl->frame), pl->ready[f] = 1; /* present (zeros: the gradients') */
    page_piece *mine = pl->piece + (size_t)f * (size_t)pl->cap;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (!pc[i].len) continue;
        if (!move_pages(from, pc[i].len, pc[i].at)) {
            /* the target mapped again, empty (a failed move may have unmapped it first); the pieces
             * moved so far stay as ordinary memory, which the use's release hands back */
            pool_broken(pl, "mremap");
            if (mmap(pc[i].at, pc[i].len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
                     0) == MAP_FAILED)
                CTRL_ERROR("page pool: a released range could not be mapped again: %s", strerror(errno));
            pl->missed++;
            return;
        }
        mine[m++] = pc[i], from += pc[i].len;
    }
    pl->n[f] = m, pl->key_of[f] = key, pl->frame_of[key] = f, pl->lent++;
}

int page_pool_give_back(page_pool *pl, int key) {
    const int f = pl && key >= 0 && key < pl->n_keys ? pl->frame_of[key] : -1;
    if (f < 0) return 0;
    char *home = pl->base + (size_t)f * pl->frame;
    const page_piece *mine = pl->piece + (size_t)f * (size_t)pl->cap;
    for (int i = 0; i < pl->n[f]; i++) {
        if (pl->broken || !move_pages(mine[i].at, mine[i].len, home)) {
            if (!pl->broken) pool_broken(pl, "mremap back");
            page_release(mine[i].at, mine[i].at + mine[i].len);
        }
        home += mine[i].len;
    }
    pl->n[f] = 0, pl->key_of[f] = -1, pl->frame_of[key] = -1;
    return 1;
}

void page_pool_count_miss(page_pool *pl) {
    if (pl) pl->missed++;
}

page_pool_stats page_pool_get_stats(const page_pool *pl) {
    page_pool_stats s = {0};
    if (!pl) return s;
    s.lent = pl->lent, s.missed = pl->missed, s.frames = pl->frames, s.frame = pl->frame;
    s.broken = pl->broken;
    for (int f = 0; f < pl->frames; f++) s.used += pl->ready[f];
    return s;
}
