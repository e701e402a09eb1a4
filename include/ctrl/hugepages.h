/* Transparent huge pages for large host buffers -- parameters, gradients, optimizer state, packed
 * weights -- in the core and in plugins. Where the kernel's THP mode is "madvise" (a common default),
 * anonymous memory comes in 4 KiB pages unless a range asks for more: a buffer of gigabytes then costs
 * a page fault per 4 KiB when first touched (in a VM ~10 us each, an IPI to the other threads too
 * when a read mapped the zero page first: a 0.5B model's first GRPO step spent 30 s of system time
 * there) and a TLB entry per 4 KiB when streamed. Advising the buffer's whole 2 MiB blocks lets the
 * kernel back them with huge pages: a fault and a TLB entry per 2 MiB. Advice only: where THP is off,
 * or the headers lack it (_GNU_SOURCE), or the call is refused, nothing changes. A range whose pages
 * are later given back piecewise (released layers) is advised back to small pages first, so that the
 * kernel neither fills a released 2 MiB block again nor keeps a partly released one whole. */
#ifndef CTRL_HUGEPAGES_H
#define CTRL_HUGEPAGES_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#define CTRL_HUGE_PAGE ((size_t)2 << 20)

/* Advises the whole 2 MiB blocks inside [p, p + bytes) to be huge pages. */
static inline void ctrl_advise_huge_pages(void *p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t lo = ((uintptr_t)p + CTRL_HUGE_PAGE - 1) & ~(uintptr_t)(CTRL_HUGE_PAGE - 1),
                    hi = ((uintptr_t)p + bytes) & ~(uintptr_t)(CTRL_HUGE_PAGE - 1);
    if (p && hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p, (void)bytes;
#endif
}

/* Advises [p, p + bytes), page-aligned, back to small pages (before its pages are given back). */
static inline void ctrl_advise_small_pages(void *p, size_t bytes) {
#if defined(__linux__) && defined(MADV_NOHUGEPAGE)
    if (p && bytes) (void)madvise(p, bytes, MADV_NOHUGEPAGE);
#else
    (void)p, (void)bytes;
#endif
}

/* calloc, its whole 2 MiB blocks advised to be huge pages (freed with free). */
static inline void *ctrl_calloc_huge(size_t n, size_t size) {
    void *p = calloc(n, size); /* (NULL where n * size overflows) */
    ctrl_advise_huge_pages(p, n * size);
    return p;
}

#endif
