/* How many OpenMP threads an engine step runs on ([generation] decode_threads, see
 * decode_threads.h), and running a step on them. */
#include "generate/decode_threads.h"

#include <omp.h>

#include <ctrl/log.h>

int ctrl_decode_threads_choose(int setting, int max_threads) {
    if (max_threads < 1) max_threads = 1;
    return setting > 0 && setting < max_threads ? setting : max_threads;
}

int ctrl_decode_threads_enter(ctrl_decode_threads *d, int setting, int *logged) {
    d->saved = omp_get_max_threads();
    d->chosen = ctrl_decode_threads_choose(setting, d->saved);
    if (d->chosen != d->saved) omp_set_num_threads(d->chosen);
    if (setting > 0 && !*logged) {
        CTRL_INFO("generation: decoding on %d of %d threads ([generation] decode_threads = %d)", d->chosen,
                  d->saved, setting);
        *logged = 1;
    }
    return d->chosen;
}

void ctrl_decode_threads_leave(const ctrl_decode_threads *d) {
    if (d->chosen != d->saved) omp_set_num_threads(d->saved);
}
