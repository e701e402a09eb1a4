/* The OpenMP threads of an engine step on the CPU ([generation] decode_threads). A decoding step of
 * a few sequences multiplies a few rows by every weight in several parallel regions a layer, each
 * ending in a barrier; where the machine's cores are busy with other work the threads of a region
 * do not run at once, they wait for each other, and under OMP_WAIT_POLICY=PASSIVE every wait is a
 * sleep and a wake-up in the kernel: one thread is then as fast and spends less CPU time, while on
 * idle cores all threads decode faster. So auto (0) measures: steps of at most
 * CTRL_DECODE_FEW_TOKENS tokens alternate between one thread and all of them for
 * CTRL_DECODE_PROBE_STEPS steps, then the faster (wall clock per token) runs the next
 * CTRL_DECODE_RUN_STEPS such steps, and the engine measures again (the machine's load changes);
 * larger steps (many sequences, prefill) run on all threads. A number runs every step on that many
 * (at most OpenMP's thread count). The thread count never changes what is computed: every kernel
 * sums in the same order at any count (tests/unit/test_decode_threads.c). A model on a device
 * decodes there: auto keeps the host's threads. */
#ifndef CTRL_CORE_DECODE_THREADS_H
#define CTRL_CORE_DECODE_THREADS_H

#define CTRL_DECODE_FEW_TOKENS 16
#define CTRL_DECODE_PROBE_STEPS 8 /* half on one thread, half on all */
#define CTRL_DECODE_RUN_STEPS 64

/* An engine's measurements for auto (zero-initialised: nothing measured yet). */
typedef struct ctrl_decode_tuner {
    int probing;       /* probe steps done in the current round (< CTRL_DECODE_PROBE_STEPS) */
    int run_left;      /* steps left on `choice` before the next round */
    int choice;        /* 0: none yet; else the count the last round chose */
    double per_tok[2]; /* the round's wall seconds per token: [0] one thread, [1] all */
    int n[2];
    unsigned logged; /* what was said in the log: bit 0 a choice, bit 1 the large steps' count */
    int last_logged; /* the count last logged for small steps */
} ctrl_decode_tuner;

/* The threads of a step of `step_tokens` tokens: setting (0 auto, else a count), of max_threads
 * (omp_get_max_threads()); on_host: the model computes in host memory; t: the engine's tuner (auto
 * only; read, not changed). */
int ctrl_decode_threads_choose(const ctrl_decode_tuner *t, int setting, int max_threads, int step_tokens,
                               int on_host);
/* After a step that ran on `threads` of max_threads, for `seconds` wall clock: auto's bookkeeping
 * (a probe's measurement, the choice at the end of a round, the countdown to the next round). */
void ctrl_decode_tuner_record(ctrl_decode_tuner *t, int setting, int threads, int max_threads,
                              int step_tokens, int on_host, double seconds);

typedef struct ctrl_decode_threads {
    int saved, chosen;
    double t0;
} ctrl_decode_threads;

/* Sets the calling thread's OpenMP thread count for a step (what choose says) and starts its
 * clock; leave restores the count, records the step in the tuner and logs a new choice. */
int ctrl_decode_threads_enter(ctrl_decode_threads *d, const ctrl_decode_tuner *t, int setting,
                              int step_tokens, int on_host);
void ctrl_decode_threads_leave(const ctrl_decode_threads *d, ctrl_decode_tuner *t, int setting,
                               int step_tokens, int on_host);

#endif
