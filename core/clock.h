/* Seconds on a clock, as a double: what timers, rates, deadlines and time stamps are computed from. */
#ifndef CTRL_CORE_CLOCK_H
#define CTRL_CORE_CLOCK_H

#include <time.h>

/* clock_gettime(clock) in seconds: CLOCK_MONOTONIC for intervals and deadlines, CLOCK_REALTIME for
 * wall-clock stamps, CLOCK_PROCESS_CPUTIME_ID for the process's CPU time. */
double ctrl_clock_seconds(clockid_t clock);
/* ctrl_clock_seconds(CLOCK_MONOTONIC). */
double ctrl_now(void);

#endif
