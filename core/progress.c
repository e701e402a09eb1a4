/* See progress.h. */
#include <stdio.h>
#include <unistd.h>

#include "clock.h"
#include "progress.h"

void ctrl_progress_start(ctrl_progress *p, const char *unit, double every_s) {
    *p =
        (ctrl_progress){.unit = unit, .start = ctrl_now(), .every_s = every_s, .tty = isatty(fileno(stderr))};
    p->last_line = p->start;
}

void ctrl_progress_update(ctrl_progress *p, long done, long total, double rate_count, const char *rate_unit,
                          const char *extra) {
    const double t = ctrl_now(), dt = t - p->start > 1e-9 ? t - p->start : 1e-9;
    const double rate = rate_count / dt,
                 eta = done > 0 && total > done ? dt / done * (double)(total - done) : 0;
    if (p->tty) {
        enum { WIDTH = 30 };
        const int full = total > 0 ? (int)(WIDTH * (done < total ? done : total) / total) : 0;
        fprintf(stderr, "\r[%.*s%*s] %ld/%ld %s  %.0f %s/s  ETA %.0fs %s ", full,
                "##############################", WIDTH - full, "", done, total, p->unit, rate, rate_unit,
                eta, extra ? extra : "");
        fflush(stderr);
    } else if (t - p->last_line >= p->every_s || (total > 0 && done >= total)) {
        fprintf(stderr, "%ld/%ld %s  %.0f %s/s  ETA %.0fs %s\n", done, total, p->unit, rate, rate_unit, eta,
                extra ? extra : "");
        p->last_line = t;
    }
}

void ctrl_progress_end(ctrl_progress *p) {
    if (p->tty) fputc('\n', stderr);
}
