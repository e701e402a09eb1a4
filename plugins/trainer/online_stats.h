/* Statistics the online trainers (grpo, rloo) share, with torch's NaN conventions as TRL uses
 * them: nanmean ignores NaN (NaN when nothing is left), nanstd is TRL's Bessel-corrected std over
 * the non-NaN values (NaN for fewer than two), isclose(x, 0) is torch.isclose's default tolerance. */
#ifndef CTRL_PLUGINS_TRAINER_ONLINE_STATS_H
#define CTRL_PLUGINS_TRAINER_ONLINE_STATS_H

#include <math.h>

static inline double online_nanmean(const float *x, int n, int stride) {
    double s = 0;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i * stride])) s += x[i * stride], k++;
    return k ? s / k : NAN;
}

static inline double online_nanstd(const float *x, int n, int stride) {
    const double mean = online_nanmean(x, n, stride);
    double s = 0;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i * stride])) s += (x[i * stride] - mean) * (x[i * stride] - mean), k++;
    return k > 1 ? sqrt(s / (k - 1)) : NAN;
}

static inline int online_isclose0(double x) { return fabs(x) <= 1e-8; }

/* Per-sequence sum of x over the trained tokens of sequence s, and their count. */
static inline double online_seq_sum(const float *x, const float *w, int t0, int t1, double *count) {
    double s = 0, c = 0;
    for (int t = t0; t < t1; t++)
        if (w[t] > 0) s += x[t], c += 1;
    *count = c;
    return s;
}

#endif
