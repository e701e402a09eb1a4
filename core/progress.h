/* Progress of long work (training steps, generated tokens): on a terminal a bar with the count,
 * the rate and the ETA, redrawn in place; otherwise a plain line every `every_s` seconds (and at
 * the end), so logs stay readable. */
#ifndef CTRL_CORE_PROGRESS_H
#define CTRL_CORE_PROGRESS_H

typedef struct ctrl_progress {
    const char *unit; /* "steps", "tokens" */
    double start, last_line, every_s;
    int tty;
} ctrl_progress;

void ctrl_progress_start(ctrl_progress *p, const char *unit, double every_s);
/* done of total (total <= 0: unknown, no bar or ETA); rate counts `rate_count` per second since
 * start (e.g. tokens while the bar counts steps); `extra` (may be NULL) is appended. */
void ctrl_progress_update(ctrl_progress *p, long done, long total, double rate_count, const char *rate_unit,
                          const char *extra);
/* Ends the bar's line on a terminal. */
void ctrl_progress_end(ctrl_progress *p);

#endif
