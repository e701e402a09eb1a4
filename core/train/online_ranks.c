/* The online loop over several ranks (see online_internal.h): which completions are this rank's,
 * the generation batch gathered, the metrics window summed. Gathers are sums of buffers that are
 * zero except where their owner wrote (exact: x + 0 = x, NaN stays NaN), which the collectives
 * already have, at 8 bytes a token: token ids are far below 2^53. */
#include <math.h>
#include <stdlib.h>

#include "collective/collective.h"
#include "train/online_internal.h"

int online_mine(const ctrl_online *o, int c) {
    return (c / o->bs) % ctrl_collective_size() == ctrl_collective_rank();
}

int online_slice(const ctrl_online *o, int u) {
    return (u * ctrl_collective_size() + ctrl_collective_rank()) * o->bs;
}

/* Every rank's [c0, c0 + n) of `gn` values `x` (zero elsewhere) summed into all. */
static ctrl_status gather_f32(float *x, int gn, int stride) {
    const size_t m = (size_t)gn * (size_t)stride;
    double *d = malloc(sizeof(double) * (m ? m : 1));
    if (!d) return ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
    for (size_t i = 0; i < m; i++) d[i] = x[i];
    ctrl_status st = ctrl_collective_allreduce_sum_f64(d, m);
    for (size_t i = 0; st == CTRL_OK && i < m; i++) x[i] = (float)d[i];
    free(d);
    return st;
}

ctrl_status online_gather(ctrl_online *o, int c0, int n, float *scores, float *total) {
    if (ctrl_collective_size() == 1) return CTRL_OK;
    const int gn = o->gn;
    /* lengths and stop flags, then the token ids laid end to end */
    double *meta = calloc((size_t)gn * 2, sizeof(double)), *ids = NULL;
    ctrl_status st = meta ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
    for (int i = c0; st == CTRL_OK && i < c0 + n; i++)
        meta[i] = o->gout[i].len, meta[gn + i] = o->gout[i].stopped;
    if (st == CTRL_OK) st = ctrl_collective_allreduce_sum_f64(meta, (size_t)gn * 2);
    size_t T = 0;
    for (int i = 0; st == CTRL_OK && i < gn; i++) T += (size_t)meta[i];
    if (st == CTRL_OK && !(ids = calloc(T ? T : 1, sizeof(double))))
        st = ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory for %zu gathered tokens", T);
    for (int i = 0, t = 0; st == CTRL_OK && i < gn; t += (int)meta[i], i++)
        for (int j = 0; i >= c0 && i < c0 + n && j < o->gout[i].len; j++) ids[t + j] = o->gout[i].ids[j];
    if (st == CTRL_OK) st = ctrl_collective_allreduce_sum_f64(ids, T);
    for (int i = 0, t = 0; st == CTRL_OK && i < gn; t += (int)meta[i], i++) {
        if (i >= c0 && i < c0 + n) continue;
        ctrl_gen_output *g = &o->gout[i];
        g->len = (int)meta[i], g->stopped = (int)meta[gn + i];
        if (!(g->ids = malloc(sizeof(int32_t) * (size_t)(g->len + 1)))) {
            st = ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
            break;
        }
        for (int j = 0; j < g->len; j++) g->ids[j] = (int32_t)ids[t + j];
    }
    free(meta), free(ids);
    if (st == CTRL_OK) st = gather_f32(scores, gn, ctrl_reward_set_count(o->rewards));
    if (st == CTRL_OK) st = gather_f32(total, gn, 1);
    return st;
}

ctrl_status online_gather_kl(ctrl_online *o, float *kl, int *ntok) {
    if (ctrl_collective_size() == 1) return CTRL_OK;
    const int gn = o->gn;
    double *d = malloc(sizeof(double) * (size_t)gn);
    if (!d) return ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
    for (int i = 0; i < gn; i++) d[i] = ntok[i];
    ctrl_status st = ctrl_collective_allreduce_sum_f64(d, (size_t)gn);
    for (int i = 0; st == CTRL_OK && i < gn; i++) ntok[i] = (int)d[i];
    free(d);
    return st == CTRL_OK ? gather_f32(kl, gn, 1) : st;
}

ctrl_status online_gather_rows(ctrl_online *o, float **rows) {
    if (ctrl_collective_size() == 1) return CTRL_OK;
    size_t T = 0;
    for (int i = 0; i < o->gn; i++) T += (size_t)o->gout[i].len;
    double *d = calloc(T ? T : 1, sizeof(double));
    if (!d) return ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory for %zu gathered tokens", T);
    for (int i = 0, t = 0; i < o->gn; t += o->gout[i].len, i++)
        for (int j = 0; rows[i] && j < o->gout[i].len; j++) d[t + j] = rows[i][j];
    ctrl_status st = ctrl_collective_allreduce_sum_f64(d, T);
    for (int i = 0, t = 0; st == CTRL_OK && i < o->gn; t += o->gout[i].len, i++) {
        if (rows[i]) continue;
        if (!(rows[i] = malloc(sizeof(float) * (size_t)(o->gout[i].len + 1)))) {
            st = ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
            break;
        }
        for (int j = 0; j < o->gout[i].len; j++) rows[i][j] = (float)d[t + j];
    }
    free(d);
    return st;
}

ctrl_status ctrl_online_sync_metrics(ctrl_online *o) {
    if (ctrl_collective_size() == 1) return CTRL_OK;
    const int n = o->n_metrics;
    double agree[2] = {n, -n}; /* every rank reports the same names in the same order */
    ctrl_status st = ctrl_collective_allreduce_max_f64(agree, 2);
    if (st != CTRL_OK) return st;
    if (agree[0] != -agree[1]) {
        if (!o->sync_warned++)
            CTRL_WARN("online metrics: the ranks report different metrics; rank 0's own logged");
        return CTRL_OK;
    }
    double d[2 * MAX_METRICS];
    for (int i = 0; i < n; i++)
        d[i] = o->msum[i] - o->msynced[i], d[n + i] = (double)(o->mcount[i] - o->csynced[i]);
    if ((st = ctrl_collective_allreduce_sum_f64(d, (size_t)n * 2)) != CTRL_OK) return st;
    for (int i = 0; i < n; i++) {
        o->msum[i] = o->msynced[i] += d[i];
        o->mcount[i] = o->csynced[i] += (long)d[n + i];
    }
    return CTRL_OK;
}
