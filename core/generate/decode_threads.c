/* How many OpenMP threads an engine step runs on ([generation] decode_threads, see
 * decode_threads.h): the choice, auto's measurements, and running a step on them. */
#include "generate/decode_threads.h"

#include <omp.h>

#include <ctrl/log.h>

#include "clock.h"

static int auto_small(int setting, int max_threads, int step_tokens, int on_host) {
    return setting == 0 && on_host && max_threads > 1 && step_tokens <= CTRL_DECODE_FEW_TOKENS;
}

int ctrl_decode_threads_choose(const ctrl_decode_tuner *t, int setting, int max_threads, int step_tokens,
                               int on_host) {
    if (max_threads < 1) max_threads = 1;
    if (setting > 0) return setting < max_threads ? setting : max_threads;
    if (!auto_small(setting, max_threads, step_tokens, on_host)) return max_threads;
    if (t->run_left > 0 && t->choice > 0) return t->choice < max_threads ? t->choice : max_threads;
    return t->probing % 2 == 0 ? 1 : max_threads; /* a round: one thread, all, one, all, ... */
}

void ctrl_decode_tuner_record(ctrl_decode_tuner *t, int setting, int threads, int max_threads,
                              int step_tokens, int on_host, double seconds) {
    if (!auto_small(setting, max_threads, step_tokens, on_host) || step_tokens < 1) return;
    if (t->run_left > 0 && t->choice > 0) {
        t->run_left--;
        return;
    }
    const int k = threads > 1;
    t->per_tok[k] += seconds / step_tokens, t->n[k]++;
    if (++t->probing < CTRL_DECODE_PROBE_STEPS) return;
    const double one = t->n[0] ? t->per_tok[0] / t->n[0] : 0, all = t->n[1] ? t->per_tok[1] / t->n[1] : 0;
    t->choice = t->n[0] && (!t->n[1] || one <= all) ? 1 : max_threads;
    t->run_left = CTRL_DECODE_RUN_STEPS, t->probing = 0;
    t->per_tok[0] = t->per_tok[1] = 0, t->n[0] = t->n[1] = 0;
    if (t->choice == t->last_logged) return;
    /* the first choice at INFO, later changes (the machine's load moved) at DEBUG */
    ctrl_log((t->logged & 1) ? CTRL_LOG_DEBUG : CTRL_LOG_INFO,
             "generation: decoding steps of <= %d tokens on %d of %d threads ([generation] decode_threads "
             "= auto: %.3f ms a token on one thread, %.3f on %d, measured over the last %d steps)",
             CTRL_DECODE_FEW_TOKENS, t->choice, max_threads, one * 1e3, all * 1e3, max_threads,
             CTRL_DECODE_PROBE_STEPS);
    t->logged |= 1, t->last_logged = t->choice;
}

int ctrl_decode_threads_enter(ctrl_decode_threads *d, const ctrl_decode_tuner *t, int setting,
                              int step_tokens, int on_host) {
    d->saved = omp_get_max_threads();
    d->chosen = ctrl_decode_threads_choose(t, setting, d->saved, step_tokens, on_host);
    if (d->chosen != d->saved) omp_set_num_threads(d->chosen);
    d->t0 = ctrl_now();
    return d->chosen;
}

void ctrl_decode_threads_leave(const ctrl_decode_threads *d, ctrl_decode_tuner *t, int setting,
                               int step_tokens, int on_host) {
    const double seconds = ctrl_now() - d->t0;
    if (d->chosen != d->saved) omp_set_num_threads(d->saved);
    if (setting > 0 && on_host && !(t->logged & 2)) {
        CTRL_INFO("generation: decoding on %d of %d threads ([generation] decode_threads = %d)", d->chosen,
                  d->saved, setting);
        t->logged |= 2;
    }
    ctrl_decode_tuner_record(t, setting, d->chosen, d->saved, step_tokens, on_host, seconds);
}
