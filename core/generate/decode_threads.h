/* The OpenMP threads of an engine step ([generation] decode_threads, ctrl generate
 * --decode-threads): 0, the default, every thread (OMP_NUM_THREADS); N, every step on N (at most
 * that many). A decoding step of a few sequences on the CPU multiplies a few rows by every weight
 * in several parallel regions a layer, each ending in a barrier; on cores busy with other work the
 * threads of a region wait for each other, and under OMP_WAIT_POLICY=PASSIVE each wait is a sleep
 * and a wake-up in the kernel: there one thread spends less CPU time (system time) for the same
 * user time, while on idle cores every thread decodes faster by the wall clock. Measured in
 * docs/performance.md; an automatic choice by measured step times was tried and not kept (under
 * load the step times were too noisy to choose by). The thread count never changes what is
 * computed: every kernel sums in the same order at any count (tests/unit/test_decode_threads.c). */
#ifndef CTRL_CORE_DECODE_THREADS_H
#define CTRL_CORE_DECODE_THREADS_H

/* The threads of a step: setting (0 every thread, else a count) of max_threads (omp_get_max_threads()). */
int ctrl_decode_threads_choose(int setting, int max_threads);

typedef struct ctrl_decode_threads {
    int saved, chosen;
} ctrl_decode_threads;

/* Sets the calling thread's OpenMP thread count for a step (what choose says); leave restores it.
 * *logged (the engine's, 0 at first): the first step with a setting logs it once. */
int ctrl_decode_threads_enter(ctrl_decode_threads *d, int setting, int *logged);
void ctrl_decode_threads_leave(const ctrl_decode_threads *d);

#endif
