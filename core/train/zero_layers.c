/* ZeRO stage 3's layers (see zero.h): each rank keeps its slice of every layer's parameters; the
 * model's layer hooks all-gather a layer just before its forward and again before its backward
 * (with activation checkpointing, before the recompute) and release the other ranks' slices after
 * each: the pages are handed back to the system (madvise MADV_DONTNEED: they read as zeros until
 * the next gather writes them), so a rank's resident parameters are its slices plus the units kept
 * whole (embeddings, final norm, head: DeepSpeed's persistent parameters) plus one layer at a
 * time. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "collective/collective.h"
#include "train/zero.h"

struct ctrl_memory {
    train_zero *z;
};

static float *unit_params(const train_zero *z, int u) {
    return ctrl_model_params(z->model, NULL) + z->first + z->units[u].a;
}

/* [from, to) of the parameters back to the system, the whole pages inside it. */
static void release_range(float *from, float *to) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = ((uintptr_t)from + page - 1) / page * page, hi = (uintptr_t)to / page * page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* Unit u's other slices released: before this rank's and after it. */
static void release_unit(const train_zero *z, int u) {
    float *p = unit_params(z, u) - z->units[u].a; /* indexed by trainable float */
    size_t lo, hi;
    train_zero_slice(z, u, z->rank, &lo, &hi);
    release_range(p + z->units[u].a, p + lo);
    release_range(p + hi, p + z->units[u].b);
}

static ctrl_status gather_unit(train_zero *z, int u) {
    return ctrl_collective_allgather_f32(unit_params(z, u), train_zero_counts(z, u));
}

static ctrl_status gather_layer(ctrl_memory *m, int layer) {
    train_zero *z = m->z;
    return z->stage < 3 || z->gathered || z->layer_unit[layer] < 0 ? CTRL_OK
                                                                   : gather_unit(z, z->layer_unit[layer]);
}

static ctrl_status release_layer(ctrl_memory *m, int layer) {
    train_zero *z = m->z;
    if (z->stage >= 3 && !z->gathered && z->layer_unit[layer] >= 0) release_unit(z, z->layer_unit[layer]);
    return CTRL_OK;
}

/* Unit u's gradients averaged over the ranks (reduce-scatter), this rank's slice added to its sums,
 * and the whole unit's gradients zeroed and released (the next backward adds into zeros). */
static ctrl_status reduce_unit(train_zero *z, int u) {
    float *g = ctrl_model_grads(z->model, NULL) + z->units[u].a;
    const size_t len = z->units[u].b - z->units[u].a;
    ctrl_status st = ctrl_collective_reduce_scatter_mean_f32(g, train_zero_counts(z, u));
    if (st != CTRL_OK) return st;
    size_t lo, hi;
    train_zero_slice(z, u, z->rank, &lo, &hi);
    float *acc = z->acc + z->acc_off[u];
    const float *mine = g + (lo - z->units[u].a);
    for (size_t i = 0; i < hi - lo; i++) acc[i] += mine[i];
    memset(g, 0, sizeof(float) * len);
    release_range(g, g + len);
    return CTRL_OK;
}

/* While measuring (the first step): the gradient buffer's resident bytes, the most seen. */
static void measure(train_zero *z) {
    if (!z->measure) return;
    size_t n = 0;
    const float *g = ctrl_model_grads(z->model, &n);
    const size_t r = train_zero_resident(g, n * sizeof *g);
    if (r > z->grad_peak) z->grad_peak = r;
}

/* After a layer's backward: its parameters released (stage 3); when it completes its bucket (the
 * bucket's lowest layer), the bucket's units reduced. Layer -1: the end of the backward (the
 * model's call), the units outside the layers reduced (embeddings, final norm, head). */
static ctrl_status reduce_layer(ctrl_memory *m, int layer) {
    train_zero *z = m->z;
    if (layer >= 0) release_layer(m, layer);
    const int u = layer >= 0 ? z->layer_unit[layer] : -1;
    if (layer >= 0 && (u < 0 || !z->closes[layer])) return CTRL_OK;
    measure(z);
    ctrl_status st = CTRL_OK;
    if (layer < 0) {
        for (int k = 0; k < z->n_units && st == CTRL_OK; k++)
            if (z->units[k].layer < 0) st = reduce_unit(z, k);
        return st;
    }
    /* the bucket: this layer's unit and those above it, up to the next bucket's (stage 3: one a layer) */
    for (int k = u; k < z->n_units && st == CTRL_OK && z->units[k].layer >= 0; k++) {
        if (k > u && z->closes[z->units[k].layer]) break;
        st = reduce_unit(z, k);
    }
    return st;
}

static const ctrl_memory_ops layer_hooks = {
    .size = sizeof(ctrl_memory_ops),
    .before_forward = gather_layer,
    .after_forward = release_layer,
    .before_backward = gather_layer,
    .after_backward = reduce_layer,
};

ctrl_status train_zero_attach(train_zero *z, ctrl_model *m) {
    if (!z->partitioned) return CTRL_OK;
    if (!(z->hooks = malloc(sizeof *z->hooks))) return ctrl_error_set(CTRL_ERR_NOMEM, "zero: out of memory");
    z->hooks->z = z, z->model = m, z->measure = 1;
    ctrl_status st = ctrl_model_set_sharding(m, &layer_hooks, z->hooks);
    if (st == CTRL_OK) st = ctrl_model_zero_grad(m);
    if (st != CTRL_OK) return st;
    size_t n = 0;
    float *g = ctrl_model_grads(m, &n);
    release_range(g, g + n); /* zeros: the backward adds into them */
    train_zero_release_all(z);
    return CTRL_OK;
}

ctrl_status train_zero_gather_all(train_zero *z) {
    if (z->stage < 3 || z->gathered) return CTRL_OK;
    ctrl_status st = CTRL_OK;
    for (int u = 0; u < z->n_units && st == CTRL_OK; u++)
        if (z->units[u].layer >= 0) st = gather_unit(z, u);
    z->gathered = st == CTRL_OK;
    return st;
}

ctrl_status train_zero_whole(void *ctx, int on) {
    train_zero *z = ctx;
    if (z->stage < 3) return CTRL_OK;
    if (on) {
        if (z->gathered) return CTRL_OK; /* already whole (an evaluation): its owner releases */
        ctrl_status st = train_zero_gather_all(z);
        z->lent = st == CTRL_OK;
        return st;
    }
    if (z->lent) z->lent = 0, train_zero_release_all(z);
    return CTRL_OK;
}

void train_zero_release_all(train_zero *z) {
    if (z->stage < 3) return;
    z->gathered = 0;
    for (int u = 0; u < z->n_units; u++)
        if (z->units[u].layer >= 0) release_unit(z, u);
}

size_t train_zero_resident(const void *p, size_t bytes) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = (uintptr_t)p / page * page, hi = ((uintptr_t)p + bytes + page - 1) / page * page;
    unsigned char *vec = malloc((hi - lo) / page);
    if (!vec || mincore((void *)lo, hi - lo, vec) != 0) {
        free(vec);
        return bytes;
    }
    size_t resident = 0;
    for (size_t i = 0; i < (hi - lo) / page; i++) resident += vec[i] & 1 ? page : 0;
    free(vec);
    return resident;
}
