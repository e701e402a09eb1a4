/* Seconds on CLOCK_MONOTONIC: the deadlines of the reward plugins that wait on another program
 * (`command` over a pipe, `http`). Plugins share only headers, not core's clock. */
#ifndef CTRL_PLUGINS_REWARD_CLOCK_H
#define CTRL_PLUGINS_REWARD_CLOCK_H

#include <time.h>

static inline double reward_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#endif
