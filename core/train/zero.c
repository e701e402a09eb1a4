/* ZeRO stages 1 and 2 in the step loop (see zero.h). */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/log.h>

#include "collective/collective.h"
#include "cpu/cpu_ops.h"
#include "model/safetensors.h"
#include "train/checkpoint.h"
#include "train/zero.h"

ctrl_status train_zero_init(train_zero *z, int stage, ctrl_model *m) {
    memset(z, 0, sizeof *z);
    if (stage <= 0) return CTRL_OK;
    z->stage = stage, z->rank = ctrl_collective_rank(), z->size = ctrl_collective_size();
    ctrl_model_grads(m, &z->total);
    z->first = ctrl_model_trainable_offset(m);
    const size_t piece = (z->total + (size_t)z->size - 1) / (size_t)z->size;
    if (z->total > (size_t)INT_MAX)
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "[memory] strategies = zero%d: %zu trainable floats, more than MPI's int counts "
            "reach (2^31 - 1) in one collective",
            stage, z->total);
    if (!(z->counts = calloc((size_t)z->size, sizeof *z->counts)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "zero: out of memory");
    for (int r = 0; r < z->size; r++) {
        const size_t lo = piece * (size_t)r < z->total ? piece * (size_t)r : z->total;
        const size_t hi = lo + piece < z->total ? lo + piece : z->total;
        z->counts[r] = (int)(hi - lo);
        if (r == z->rank) z->lo = lo, z->hi = hi;
    }
    if (z->counts[z->size - 1] == 0)
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "[memory] strategies = zero%d: %zu trainable floats cannot be cut in %d non-empty "
            "slices (run fewer ranks, or without zero%d)",
            stage, z->total, z->size, stage);
    return CTRL_OK;
}

void train_zero_free(train_zero *z) {
    free(z->counts);
    z->counts = NULL;
}

int train_zero_shard_groups(const train_zero *z, ctrl_model *m, ctrl_param_group *groups, int n) {
    float *grads = ctrl_model_grads(m, NULL);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        ctrl_param_group g = groups[i];
        const size_t a = (size_t)(g.grad - grads), b = a + (size_t)g.numel; /* in trainable floats */
        const size_t lo = a > z->lo ? a : z->lo, hi = b < z->hi ? b : z->hi;
        if (lo >= hi) continue;
        g.param += lo - a, g.grad += lo - a, g.numel = (int64_t)(hi - lo);
        groups[kept++] = g;
    }
    return kept;
}

ctrl_status train_zero_reduce_grads(const train_zero *z, ctrl_model *m, double *sum_sq) {
    ctrl_status st = ctrl_model_grads_to_host(m); /* a CUDA model's: the step is the host's */
    float *g = ctrl_model_grads(m, NULL);
    if (st == CTRL_OK)
        st = z->stage >= 2 ? ctrl_collective_reduce_scatter_mean_f32(g, z->counts)
                           : ctrl_collective_allreduce_mean_f32(g, z->total);
    if (st != CTRL_OK) return st;
    *sum_sq = ctrl_cpu_sum_squares(g + z->lo, (int64_t)(z->hi - z->lo));
    return ctrl_collective_allreduce_sum_f64(sum_sq, 1);
}

void train_zero_scale_grads(const train_zero *z, ctrl_model *m, float coef) {
    ctrl_cpu_scale(ctrl_model_grads(m, NULL) + z->lo, coef, (int64_t)(z->hi - z->lo));
}

ctrl_status train_zero_gather_params(const train_zero *z, ctrl_model *m) {
    ctrl_status st = ctrl_collective_allgather_f32(ctrl_model_params(m, NULL) + z->first, z->counts);
    ctrl_model_weights_changed(m);
    return st;
}

size_t train_zero_state_bytes(const ctrl_optimizer_ops *ops, ctrl_optimizer *opt) {
    size_t bytes = 0;
    const int n = ops->state_count ? ops->state_count(opt) : 0;
    for (int i = 0; i < n; i++) {
        const char *name;
        float *data;
        int64_t numel;
        if (ops->state_get(opt, i, &name, &data, &numel) == CTRL_OK) bytes += (size_t)numel * sizeof(float);
    }
    return bytes;
}

ctrl_status train_zero_report(const train_zero *z, const char *optimizer, const ctrl_optimizer_ops *ops,
                              ctrl_optimizer *opt) {
    const double mine = (double)train_zero_state_bytes(ops, opt);
    double max = mine, sum = mine;
    ctrl_status st = ctrl_collective_allreduce_max_f64(&max, 1);
    if (st == CTRL_OK) st = ctrl_collective_allreduce_sum_f64(&sum, 1);
    if (st != CTRL_OK || z->rank != 0) return st;
    if (!z->stage) {
        CTRL_INFO("optimizer %s: %.0f bytes of state per rank", optimizer, mine);
        return CTRL_OK;
    }
    CTRL_INFO("zero%d: %d ranks, each steps %d of %zu trainable floats; optimizer %s: at most %.0f bytes "
              "of state per rank, %.0f over the ranks",
              z->stage, z->size, z->counts[0], z->total, optimizer, max, sum);
    return CTRL_OK;
}

/* What a rank sends rank 0 for each of its optimizer state buffers before the floats. */
typedef struct shard_header {
    char name[64];
    int64_t numel;
} shard_header;

ctrl_status train_zero_send_state(const train_zero *z, const ctrl_optimizer_ops *ops, ctrl_optimizer *opt) {
    (void)z;
    const int64_t n = ops->state_count ? ops->state_count(opt) : 0;
    ctrl_status st = ctrl_collective_send(&n, sizeof n, 0);
    for (int i = 0; i < n && st == CTRL_OK; i++) {
        const char *name;
        float *data;
        shard_header h = {{0}, 0};
        if ((st = ops->state_get(opt, i, &name, &data, &h.numel)) != CTRL_OK) break;
        snprintf(h.name, sizeof h.name, "%s", name);
        st = ctrl_collective_send(&h, sizeof h, 0);
        if (st == CTRL_OK) st = ctrl_collective_send(data, (size_t)h.numel * sizeof(float), 0);
    }
    return st;
}

ctrl_status train_zero_write_shard(void *user, int rank, const char *path) {
    (void)user;
    int64_t n = 0;
    ctrl_status st = ctrl_collective_recv(&n, sizeof n, rank);
    if (st == CTRL_OK && (n < 0 || n > 1 << 20))
        st =
            ctrl_error_set(CTRL_ERR_RUNTIME, "zero: rank %d sent %lld optimizer buffers", rank, (long long)n);
    if (st != CTRL_OK) return st;
    ctrl_st_write *t = calloc((size_t)(n ? n : 1), sizeof *t);
    char(*names)[80] = calloc((size_t)(n ? n : 1), sizeof *names);
    float **data = calloc((size_t)(n ? n : 1), sizeof *data);
    if (!t || !names || !data) st = ctrl_error_set(CTRL_ERR_NOMEM, "zero: out of memory");
    for (int i = 0; i < n && st == CTRL_OK; i++) {
        shard_header h;
        if ((st = ctrl_collective_recv(&h, sizeof h, rank)) != CTRL_OK) break;
        h.name[sizeof h.name - 1] = '\0';
        if (h.numel < 0 || h.numel > (int64_t)1 << 40 ||
            !(data[i] = malloc((size_t)(h.numel ? h.numel : 1) * sizeof(float)))) {
            st = ctrl_error_set(CTRL_ERR_NOMEM, "zero: rank %d's optimizer buffer %d (%lld floats)", rank, i,
                                (long long)h.numel);
            break;
        }
        st = ctrl_collective_recv(data[i], (size_t)h.numel * sizeof(float), rank);
        ctrl_checkpoint_state_key(names[i], sizeof names[i], i, h.name);
        t[i] = (ctrl_st_write){.name = names[i], .data = data[i], .ndim = 1, .shape = {h.numel}};
    }
    if (st == CTRL_OK) st = ctrl_safetensors_write(path, t, (int)n, CTRL_F32);
    for (int i = 0; data && i < n; i++) free(data[i]);
    free(data), free(t), free(names);
    return st;
}
