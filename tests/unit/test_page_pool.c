/* The reused pages of core/page_pool.c (zero3's gathers, the bf16 store's widened layer): a frame's pages
 * lent onto a released range arrive present (writing them faults nothing) and keep what the last use wrote; a
 * give-back leaves the range mapped and reading zeros; uses too large, with too many pieces or while every
 * frame is lent are refused and counted; and -- the defect behind a crashed zero3 LoRA run -- while a frame
 * is lent its home stays reserved: memory mapped meanwhile (malloc's, a collective's) is never placed there
 * and then overwritten by the move home; and thousands of loans leave the process's mappings as many. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "test.h"
#include "page_pool.h"

static size_t page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static char *map(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static long minor_faults(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

static int all_bytes(const char *p, size_t n, char v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

TEST(page_pool_lends_present_pages_and_takes_them_back) {
    const size_t pg = page(), frame = 16 * pg;
    char *params = map(64 * pg);
    CHECK(params != NULL);
    if (!params) return;
    memset(params, 7, 64 * pg);
    page_pool *pl = page_pool_new(2, frame, 2, 4);
    CHECK(pl != NULL);
    if (!pl) return;
    /* key 0: two pieces (4 + 12 pages), released first as zero3 does */
    const page_piece a[2] = {{params, 4 * pg}, {params + 20 * pg, 12 * pg}};
    for (int i = 0; i < 2; i++) madvise(a[i].at, a[i].len, MADV_DONTNEED);
    page_pool_lend(pl, 0, a, 2);
    CHECK(all_bytes(a[0].at, a[0].len, 0) && all_bytes(a[1].at, a[1].len, 0)); /* a fresh frame: zeros */
    for (int i = 0; i < 2; i++) memset(a[i].at, 3, a[i].len);
    CHECK_EQ_INT(page_pool_give_back(pl, 0), 1);
    CHECK(all_bytes(a[0].at, a[0].len, 0) && all_bytes(a[1].at, a[1].len, 0)); /* mapped, empty */
    CHECK(all_bytes(params + 4 * pg, 16 * pg, 7) && all_bytes(params + 32 * pg, 32 * pg, 7));
    /* key 1 on the same frame: its pages already present, holding what key 0 wrote */
    const page_piece b = {params + 40 * pg, 16 * pg};
    madvise(b.at, b.len, MADV_DONTNEED);
    page_pool_lend(pl, 1, &b, 1);
    const long before = minor_faults();
    CHECK(all_bytes(b.at, b.len, 3));
    memset(b.at, 5, b.len);
    const long faults = minor_faults() - before;
    CHECK_MSG(faults < 4, "writing 16 lent pages faulted %ld times", faults);
    CHECK_EQ_INT(page_pool_give_back(pl, 1), 1);
    CHECK_EQ_INT(page_pool_give_back(pl, 1), 0); /* nothing lent now */
    const page_pool_stats s = page_pool_get_stats(pl);
    CHECK(s.lent == 2 && s.missed == 0 && s.used == 1 && s.frames == 2 && s.frame == frame && !s.broken);
    page_pool_free(pl);
    munmap(params, 64 * pg);
}

TEST(page_pool_refuses_what_a_frame_cannot_take) {
    const size_t pg = page();
    char *params = map(64 * pg);
    CHECK(params != NULL);
    if (!params) return;
    page_pool *pl = page_pool_new(1, 8 * pg, 1, 3);
    CHECK(pl != NULL);
    if (!pl) return;
    const page_piece big = {params, 9 * pg}, two[2] = {{params, pg}, {params + 2 * pg, pg}};
    page_pool_lend(pl, 0, &big, 1); /* larger than a frame */
    page_pool_lend(pl, 0, two, 2);  /* more pieces than cap */
    CHECK_EQ_INT(page_pool_give_back(pl, 0), 0);
    const page_piece one = {params + 16 * pg, 8 * pg}, other = {params + 32 * pg, 8 * pg};
    page_pool_lend(pl, 1, &one, 1);
    page_pool_lend(pl, 2, &other, 1); /* the only frame is lent */
    page_pool_count_miss(pl);
    page_pool_stats s = page_pool_get_stats(pl);
    CHECK_MSG(s.lent == 1 && s.missed == 4, "lent %ld missed %ld", s.lent, s.missed);
    CHECK_EQ_INT(page_pool_give_back(pl, 2), 0);
    CHECK_EQ_INT(page_pool_give_back(pl, 1), 1);
    page_pool_free(pl);
    CHECK(page_pool_new(1, 0, 1, 3) == NULL);
    page_pool_free(NULL);
    munmap(params, 64 * pg);
}

/* While a frame is lent, new mappings of every size up to a frame are made and written; the frame's
 * move home must leave each of them as written (before the fix the first of them landed in the frame's
 * vacated home and the move home replaced its pages). */
TEST(page_pool_keeps_a_lent_frames_home_reserved) {
    const size_t pg = page(), frame = 32 * pg;
    char *params = map(64 * pg);
    CHECK(params != NULL);
    if (!params) return;
    page_pool *pl = page_pool_new(1, frame, 1, 1);
    CHECK(pl != NULL);
    if (!pl) return;
    enum { N = 32 };
    char *other[N] = {0};
    for (int round = 0; round < 2; round++) {
        const page_piece use = {params + 16 * pg, frame};
        page_pool_lend(pl, 0, &use, 1);
        memset(use.at, 9, use.len);
        for (int i = 0; round == 0 && i < N; i++) {
            const size_t n = (size_t)(i % 32 + 1) * pg;
            other[i] = i % 2 ? malloc(n) : map(n);
            CHECK(other[i] != NULL);
            if (other[i]) memset(other[i], 'a' + i % 26, n);
        }
        CHECK_EQ_INT(page_pool_give_back(pl, 0), 1);
        for (int i = 0; i < N; i++)
            CHECK_MSG(other[i] && all_bytes(other[i], (size_t)(i % 32 + 1) * pg, (char)('a' + i % 26)),
                      "round %d: mapping %d (%d pages) overwritten by the frame's move home", round, i,
                      i % 32 + 1);
    }
    for (int i = 0; i < N; i++) i % 2 ? free(other[i]) : (void)munmap(other[i], (size_t)(i % 32 + 1) * pg);
    page_pool_free(pl);
    munmap(params, 64 * pg);
}

static int mappings(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    int n = 0, c;
    if (!f) return -1;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

/* A run lends and takes back thousands of times: the process's mappings must not grow with it (the
 * kernel's limit, vm.max_map_count, is 65530 by default). */
TEST(page_pool_cycles_do_not_fragment_the_mappings) {
    const size_t pg = page();
    char *params = map(256 * pg);
    CHECK(params != NULL);
    if (!params) return;
    page_pool *pl = page_pool_new(2, 24 * pg, 2, 4);
    CHECK(pl != NULL);
    if (!pl) return;
    const page_piece use[4][2] = {{{params + 3 * pg, 5 * pg}, {params + 20 * pg, 11 * pg}},
                                  {{params + 64 * pg, 24 * pg}, {params, 0}},
                                  {{params + 100 * pg, pg}, {params + 110 * pg, 20 * pg}},
                                  {{params + 200 * pg, 16 * pg}, {params + 240 * pg, 8 * pg}}};
    int first = -1;
    for (int cycle = 0; cycle < 3000; cycle++) {
        const int k = cycle % 4, next = (cycle + 1) % 4;
        page_pool_lend(pl, k, use[k], 2);
        page_pool_lend(pl, next, use[next], 2); /* two in use at a time, as a prefetch holds them */
        memset(use[k][0].at, 1, use[k][0].len);
        CHECK_EQ_INT(page_pool_give_back(pl, k), 1);
        CHECK_EQ_INT(page_pool_give_back(pl, next), 1);
        if (cycle == 8) first = mappings();
    }
    const int last = mappings();
    CHECK(first > 0);
    CHECK_MSG(last <= first + 4, "mappings %d after 8 cycles, %d after 3000", first, last);
    const page_pool_stats s = page_pool_get_stats(pl);
    CHECK(s.lent == 6000 && s.missed == 0 && !s.broken);
    page_pool_free(pl);
    munmap(params, 256 * pg);
}
