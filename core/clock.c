/* See clock.h. */
#include "clock.h"

double ctrl_clock_seconds(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double ctrl_now(void) { return ctrl_clock_seconds(CLOCK_MONOTONIC); }
