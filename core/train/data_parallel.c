/* Data parallel in the step loop (see data_parallel.h). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ctrl/log.h>

#include "clock.h"
#include "collective/collective.h"
#include "train/data_parallel.h"

ctrl_status train_dp_init(train_dp *dp, const train_kind_ops *ops, const train_kind *kind, int bs, int ga) {
    memset(dp, 0, sizeof *dp);
    dp->rank = ctrl_collective_rank(), dp->size = ctrl_collective_size();
    dp->rows_per_rank = ops->rows_per_step(kind, bs, ga);
    dp->chunk = ops->rows_per_step(kind, bs, 1);
    dp->n_rows = ops->row_count(kind);
    dp->kind_splits = ops->splits_ranks;
    if (dp->size == 1 || dp->kind_splits) return CTRL_OK;
    if (dp->rows_per_rank > dp->n_rows)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "[train] per_device_train_batch_size = %d, gradient_accumulation_steps = %d: "
                              "each of the %d ranks takes %ld rows a step, more than the %d training rows",
                              bs, ga, dp->size, dp->rows_per_rank, dp->n_rows);
    if (!(dp->view = malloc(sizeof(int) * (size_t)dp->n_rows)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    return CTRL_OK;
}

void train_dp_free(train_dp *dp) {
    free(dp->view);
    dp->view = NULL;
}

const int *train_dp_share(train_dp *dp, const int *order, long cursor) {
    if (dp->size == 1 || dp->kind_splits) return order;
    const long n = dp->n_rows, N = dp->size;
    for (long j = 0; j < dp->rows_per_rank; j++) {
        const long c = j / dp->chunk, global = (c * N + dp->rank) * dp->chunk + j % dp->chunk;
        dp->view[(cursor + j) % n] = order[(cursor + global) % n];
    }
    return dp->view;
}

long train_dp_advance(const train_dp *dp, long start, long mine) {
    return dp->kind_splits ? mine : start + (mine - start) * dp->size; /* every rank's rows */
}

ctrl_status train_dp_reduce_step(const train_dp *dp, ctrl_status st, train_step_stats *s) {
    if (dp->size == 1) return st;
    /* the worst outcome (a failure over an interruption) and a rank that had it, for the message */
    double agreed[2] = {st == CTRL_OK                ? 0
                        : st == CTRL_ERR_INTERRUPTED ? 1
                                                     : 2,
                        st != CTRL_OK ? dp->rank : -1};
    ctrl_status cs = ctrl_collective_allreduce_max_f64(agreed, 2);
    if (cs != CTRL_OK) return cs;
    if (st != CTRL_OK) return st;
    if (agreed[0] == 1)
        return ctrl_error_set(CTRL_ERR_INTERRUPTED, "rank %d was interrupted", (int)agreed[1]);
    if (agreed[0] == 2)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "rank %d failed (its message above)", (int)agreed[1]);
    double v[5] = {s->loss, s->accuracy, s->entropy, (double)s->tokens, (double)s->trained};
    if ((cs = ctrl_collective_allreduce_sum_f64(v, 5)) != CTRL_OK) return cs;
    s->loss = v[0] / dp->size, s->accuracy = v[1] / dp->size, s->entropy = v[2] / dp->size;
    s->tokens = (long)v[3], s->trained = (long)v[4];
    return CTRL_OK;
}

ctrl_status train_dp_share_grads(train_dp *dp, ctrl_model *m, int enabled) {
    if (dp->size == 1 || !enabled || ctrl_model_device(m).type != CTRL_DEVICE_CPU) return CTRL_OK;
    size_t n = 0;
    (void)ctrl_model_grads(m, &n);
    float *buf = NULL;
    ctrl_status st = ctrl_collective_shared_f32(n, &buf);
    if (st != CTRL_OK && st != CTRL_ERR_UNSUPPORTED) return st;
    double failed = st != CTRL_OK; /* one rank without it: none uses it */
    const char *why = st != CTRL_OK ? ctrl_error_message() : "";
    char reason[256];
    snprintf(reason, sizeof reason, "%s", why);
    ctrl_status cs = ctrl_collective_allreduce_max_f64(&failed, 1);
    if (cs != CTRL_OK) return cs;
    if (failed) {
        if (dp->rank == 0)
            CTRL_INFO("data parallel: gradients averaged with MPI_Allreduce (%s)",
                      reason[0] ? reason : "another rank could not map the shared buffer");
        return CTRL_OK;
    }
    if ((st = ctrl_model_adopt_host_grads(m, buf)) != CTRL_OK) return st;
    dp->shared = 1;
    if (dp->rank == 0)
        CTRL_INFO("data parallel: %zu gradients in memory shared by the %d ranks, averaged in place "
                  "([train] ddp_shared_memory)",
                  n, dp->size);
    return CTRL_OK;
}

ctrl_status train_dp_average_grads(train_dp *dp, ctrl_model *m, int on_device) {
    if (dp->size == 1) return CTRL_OK;
    size_t n = 0;
    const double t0 = ctrl_clock_seconds(CLOCK_MONOTONIC), c0 = ctrl_clock_seconds(CLOCK_PROCESS_CPUTIME_ID);
    ctrl_status st;
    if (on_device) {
        float *d = ctrl_model_device_grads(m, &n);
        st = ctrl_collective_device_init();
        if (st == CTRL_OK) st = ctrl_collective_device_allreduce_mean_f32(d, n);
    } else {
        float *g = ctrl_model_grads(m, &n);
        st = dp->shared ? ctrl_collective_allreduce_mean_shared_f32(g, n)
                        : ctrl_collective_allreduce_mean_f32(g, n);
    }
    dp->sync_s += ctrl_clock_seconds(CLOCK_MONOTONIC) - t0,
        dp->sync_cpu_s += ctrl_clock_seconds(CLOCK_PROCESS_CPUTIME_ID) - c0;
    dp->syncs++, dp->sync_floats = n;
    return st;
}

void train_dp_report(const train_dp *dp) {
    if (dp->size == 1 || dp->rank != 0 || !dp->syncs) return;
    CTRL_INFO(
        "data parallel: gradient allreduce of %zu floats (%.1f MB): %.1f ms wall clock, %.1f ms CPU per "
        "step on average over %ld steps (rank 0)",
        dp->sync_floats, (double)dp->sync_floats * 4 / 1e6, dp->sync_s * 1e3 / (double)dp->syncs,
        dp->sync_cpu_s * 1e3 / (double)dp->syncs, dp->syncs);
}

ctrl_status train_dp_broadcast_weights(const train_dp *dp, ctrl_model *m,
                                       int (*keep)(const ctrl_param_view *v)) {
    if (dp->size == 1) return CTRL_OK;
    size_t n = 0;
    float *p = ctrl_model_params(m, &n);
    /* Only what trains: a LoRA run's frozen base (the floats before the trainable offset) came from the
     * same files on every rank, and where it is held elsewhere (bf16, panels, NF4) its fp32 pages were
     * given back: writing them again would make every other rank hold the whole fp32 base. Nor the
     * trained views `keep` names (each rank read its own slice of them, rank 0 holds only its own):
     * the runs of views between them are sent, in order. */
    const size_t first = ctrl_model_trainable_offset(m);
    ctrl_status st = CTRL_OK;
    size_t at = first; /* the start of the run not sent yet */
    for (int i = 0; keep && i < ctrl_model_view_count(m) && st == CTRL_OK; i++) {
        const ctrl_param_view *v = ctrl_model_view(m, i);
        if ((size_t)v->offset < first || !keep(v)) continue;
        if ((size_t)v->offset > at)
            st = ctrl_collective_broadcast(p + at, ((size_t)v->offset - at) * sizeof *p, 0);
        at = (size_t)v->offset + (size_t)v->numel;
    }
    if (st == CTRL_OK && n > at) st = ctrl_collective_broadcast(p + at, (n - at) * sizeof *p, 0);
    const char *diverge = getenv("CTRL_TEST_DIVERGE_RANK"); /* tests: one rank's weights set apart */
    if (st == CTRL_OK && diverge && atoi(diverge) == dp->rank && n) p[n - 1] += 1.0f;
    ctrl_model_weights_changed(m);
    return st;
}

/* FNV-1a over the parameters' 64-bit words: any differing bit shows. */
static uint64_t checksum(const float *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const uint32_t *w = (const uint32_t *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ w[i]) * 1099511628211ull;
    return h;
}

ctrl_status train_dp_check_weights(const train_dp *dp, ctrl_model *m, long step) {
    if (dp->size == 1) return CTRL_OK;
    size_t n = 0;
    const float *p = ctrl_model_params(m, &n); /* before n is read: arguments have no fixed order */
    const uint64_t h = checksum(p, n);
    /* the two 32-bit halves exactly as doubles: max and -min equal on every rank iff all agree */
    double v[4] = {(double)(h >> 32), (double)(h & 0xffffffffu), -(double)(h >> 32),
                   -(double)(h & 0xffffffffu)};
    ctrl_status st = ctrl_collective_allreduce_max_f64(v, 4);
    if (st == CTRL_OK && (v[0] != -v[2] || v[1] != -v[3]))
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "step %ld: the ranks' weights differ (data parallel out of step)", step);
    return st;
}

ctrl_status train_dp_sum(double *v, size_t n) { return ctrl_collective_allreduce_sum_f64(v, n); }

int train_dp_any(const train_dp *dp, int flag) {
    if (dp->size == 1) return flag;
    double v = flag ? 1 : 0;
    if (ctrl_collective_allreduce_max_f64(&v, 1) != CTRL_OK) return 1; /* cannot agree: stop */
    return v > 0;
}

double train_dp_items(long local_count) {
    const int size = ctrl_collective_size();
    if (size == 1) return (double)local_count;
    double v = (double)local_count;
    if (ctrl_collective_allreduce_sum_f64(&v, 1) != CTRL_OK) return (double)local_count * size;
    return v / size;
}

int train_dp_eval_mine(long batch) {
    const int size = ctrl_collective_size();
    return size == 1 || batch % size == ctrl_collective_rank();
}

static int eval_lockstep; /* train_dp_eval_set_lockstep */

void train_dp_eval_set_lockstep(int on) { eval_lockstep = on; }

long train_dp_eval_span(long n_batches) {
    const long size = ctrl_collective_size();
    return eval_lockstep && size > 1 ? (n_batches + size - 1) / size * size : n_batches;
}

long train_dp_eval_batch(long batch, long n_batches, int *padding) {
    *padding = batch >= n_batches;
    return *padding ? n_batches - 1 : batch;
}

ctrl_status train_dp_eval_reduce(ctrl_status st, double *v, size_t n) {
    if (ctrl_collective_size() == 1) return st;
    /* the worst outcome and a rank that had it (an interruption inside a forward: a failure here) */
    double agreed[2] = {st == CTRL_OK ? 0 : 1, st != CTRL_OK ? ctrl_collective_rank() : -1};
    ctrl_status cs = ctrl_collective_allreduce_max_f64(agreed, 2);
    if (cs != CTRL_OK) return cs;
    if (st != CTRL_OK) return st;
    if (agreed[0] > 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "evaluation: rank %d failed (its message above)",
                              (int)agreed[1]);
    return n ? ctrl_collective_allreduce_sum_f64(v, n) : CTRL_OK;
}

void train_dp_eval_note(char *buf, size_t cap, long mine, long all) {
    const int size = ctrl_collective_size();
    if (size == 1)
        snprintf(buf, cap, "%s", "");
    else
        snprintf(buf, cap, "; rank %d evaluated %ld of the %ld batches of %d ranks", ctrl_collective_rank(),
                 mine, all, size);
}
