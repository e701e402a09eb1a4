/* ZeRO stage 3's layers (see zero.h): each rank keeps its slice of every layer's parameters; the
 * model's layer hooks all-gather a layer just before its forward and again before its backward
 * (with activation checkpointing, before the recompute) and release the other ranks' slices after
 * each: the pages are handed back to the system (madvise MADV_DONTNEED: they read as zeros until
 * the next gather writes them), so a rank's resident parameters are its slices plus the units kept
 * whole (the final norm, a score head: DeepSpeed's persistent parameters) plus one layer at a time.
 * The embeddings and an untied LM head are sliced the same way (slots n_layers and n_layers + 1 of
 * layer_unit, frozen, state): the model's hooks gather them around each use -- the lookup, the head's
 * forward (with its backward when fused), its backward -- and release them after; no prefetch.
 *
 * The released ranges' pages are reused (page_pool.h): a gather into released pages would fault and
 * zero each page again, at every use of every layer (5-20x the cost of writing resident memory on the
 * CPUs measured, docs/performance.md), so the layers in use borrow the pages of a small pool instead, moved
 * onto their released ranges (mremap) before the gather and moved back at the release. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ctrl/log.h>

#include "collective/collective.h"
#include "train/offload_overlap.h"
#include "train/zero.h"
#include "page_pool.h"

struct ctrl_memory {
    train_zero *z;
};

/* Unit u's range in the parameters (the units are in trainable floats). */
static train_zero_unit in_params(const train_zero *z, int u) {
    return (train_zero_unit){z->first + z->units[u].a, z->first + z->units[u].b, z->units[u].layer};
}

/* [from, to) of the parameters back to the system, the whole pages inside it. */
static void release_range(float *from, float *to) { page_release(from, to); }

/* [from, to) zeroed without touching its whole pages: those handed back (read as zeros next), the
 * partial pages at either end cleared. */
static void clear_range(float *from, float *to) {
    const page_piece r = page_span(from, to);
    if (!r.len) {
        memset(from, 0, (size_t)(to - from) * sizeof *from);
        return;
    }
    memset(from, 0, (size_t)(r.at - (char *)from));
    memset(r.at + r.len, 0, (size_t)((char *)to - (r.at + r.len)));
    page_release(r.at, r.at + r.len);
}

/* A run of a sliced range (in parameters): the other ranks' slices released, before this rank's and
 * after it (unless `lent`: their pages went back to the pool), and the whole run of the bf16 copy
 * (re-rounded at the next gather; never lent: a gather re-rounds it only while the copy is current). */
static ctrl_status release_params(train_zero *z, const train_zero_run *run, int lent) {
    const train_zero_unit u = run->u;
    if (z->dev) return train_zero_device_release_range(z, u); /* a CUDA model's: unmapped */
    float *p = ctrl_model_params(z->model, NULL), *rounded = ctrl_model_bf16_copy(z->model);
    size_t lo, hi;
    train_zero_run_cut(z, run, z->rank, &lo, &hi);
    if (!lent) release_range(p + u.a, p + lo), release_range(p + hi, p + u.b);
    if (rounded) release_range(rounded + u.a, rounded + u.b);
    return CTRL_OK;
}

/* The whole pages a run's release hands back (the other ranks' slices, before and after this rank's),
 * into out[0..2); returns 2. */
static int run_pieces(train_zero *z, const train_zero_run *run, page_piece out[2]) {
    const float *p = ctrl_model_params(z->model, NULL);
    size_t lo, hi;
    train_zero_run_cut(z, run, z->rank, &lo, &hi);
    out[0] = page_span(p + run->u.a, p + lo), out[1] = page_span(p + hi, p + run->u.b);
    return 2;
}

/* Every rank's slices of the run into every rank's parameters, and its bf16 copy re-rounded. */
static ctrl_status gather_params(train_zero *z, const train_zero_run *run) {
    const train_zero_unit u = run->u;
    if (z->dev) /* mapped, over NCCL */
        return train_zero_device_gather_range(z, u, train_zero_run_counts(z, run), NULL);
    ctrl_status st =
        ctrl_collective_allgather_f32(ctrl_model_params(z->model, NULL) + u.a, train_zero_run_counts(z, run));
    return st == CTRL_OK ? ctrl_model_params_range_changed(z->model, u.a, u.b - u.a) : st;
}

/* Layer l's sliced ranges: its trainable unit's and (LoRA) its frozen base's. */
static int layer_ranges(const train_zero *z, int l, train_zero_unit out[2]) {
    int n = 0;
    if (z->layer_unit[l] >= 0) out[n++] = in_params(z, z->layer_unit[l]);
    if (z->frozen && z->frozen[l].layer >= 0) out[n++] = z->frozen[l];
    return n;
}

/* Slot l's runs: what its gathers fetch and its releases hand back (the sliced ranges less the
 * persistent views), runs[*first .. return). */
static int slot_runs(const train_zero *z, int l, int *first) {
    *first = z->run_at[l];
    return z->run_at[l + 1];
}

/* The floats of layer l's runs. */
static size_t layer_floats(const train_zero *z, int l) {
    size_t n = 0;
    for (int i, e = slot_runs(z, l, &i); i < e; i++) n += z->runs[i].u.b - z->runs[i].u.a;
    return n;
}

/* A use's gather of slot l counted (train_zero_gather_counts). */
static void count_use(train_zero *z, int l) {
    int i;
    const int e = slot_runs(z, l, &i);
    z->gathers += e - i, z->gather_views += z->run_views[l], z->gather_floats += (double)layer_floats(z, l);
}

/* Slot l's released pages backed by a frame of the pool before its gathers write them (the host's;
 * kept, at most two runs' pieces on the stack at a time, up to the pool's cap). */
static void lend_slot(train_zero *z, int l) {
    if (!z->pool || z->dev) return;
    int i;
    const int e = slot_runs(z, l, &i);
    page_piece pc[64];
    int n = 0;
    for (; i < e && n + 2 <= (int)(sizeof pc / sizeof pc[0]); i++) n += run_pieces(z, &z->runs[i], pc + n);
    if (i < e) { /* more runs than pc holds: the old way (page_pool_lend must not read past pc) */
        page_pool_count_miss(z->pool);
        return;
    }
    page_pool_lend(z->pool, l, pc, n);
}

/* Slot l's runs released: the pool's pages back, or the ranges handed to the system. */
static ctrl_status release_slot(train_zero *z, int l) {
    train_zero_nf4_release(z, l); /* QLoRA: the layer's NF4 weights freed */
    const int lent = page_pool_give_back(z->pool, l);
    ctrl_status st = CTRL_OK;
    for (int i, e = slot_runs(z, l, &i); i < e && st == CTRL_OK; i++)
        st = release_params(z, &z->runs[i], lent);
    return st;
}

/* offload_optimizer overlapped: slot l's unit stepped on the host and its slice on the device (every
 * rank's) before any gather of it. */
static ctrl_status stepped(train_zero *z, int l) {
    return z->ov && z->layer_unit[l] >= 0 ? train_offload_need(z->ov, z->layer_unit[l]) : CTRL_OK;
}

/* Layer l's gathers started (prefetch): completed by need_layer. */
static ctrl_status start_layer(train_zero *z, int l) {
    ctrl_status st = stepped(z, l);
    if (st != CTRL_OK) return st;
    z->state[l] = 1;
    count_use(z, l);
    lend_slot(z, l);
    for (int i, e = slot_runs(z, l, &i); i < e && st == CTRL_OK; i++)
        st = z->dev
                 ? train_zero_device_gather_range(z, z->runs[i].u, train_zero_run_counts(z, &z->runs[i]),
                                                  &z->pending[i]) /* a side stream */
                 : ctrl_collective_allgather_start_f32(ctrl_model_params(z->model, NULL) + z->runs[i].u.a,
                                                       train_zero_run_counts(z, &z->runs[i]), &z->pending[i]);
    return st == CTRL_OK ? train_zero_nf4_start(z, l) : st; /* QLoRA: the layer's NF4 weights too */
}

/* Layer l whole: its prefetch completed, or gathered now. */
static ctrl_status need_layer(train_zero *z, int l) {
    ctrl_status st = z->state[l] == 0 ? stepped(z, l) : CTRL_OK;
    if (z->state[l] == 0) count_use(z, l), lend_slot(z, l);
    for (int i, e = slot_runs(z, l, &i); i < e && st == CTRL_OK; i++) {
        const train_zero_unit r = z->runs[i].u;
        if (z->state[l] == 2) break;
        if (z->state[l] == 1) {
            st = z->dev ? ctrl_collective_device_allgather_wait(z->pending[i])
                        : ctrl_collective_allgather_wait(z->pending[i]);
            z->pending[i] = NULL;
            if (st == CTRL_OK && z->dev) st = train_zero_device_gathered(z, r); /* bf16: widened */
            if (st == CTRL_OK && !z->dev) st = ctrl_model_params_range_changed(z->model, r.a, r.b - r.a);
        } else {
            st = gather_params(z, &z->runs[i]);
        }
    }
    if (st == CTRL_OK) st = train_zero_nf4_gather(z, l); /* QLoRA: the layer's NF4 weights (zero_nf4.c) */
    z->state[l] = 2;
    return st;
}

/* Before layer l's forward (dir +1) or backward (-1): l gathered, and the gathers of the layers the
 * pass takes next started while fewer than prefetch_bucket_size floats are in flight (DeepSpeed's
 * stage3_prefetch_bucket_size, counted as it does: checked before each start, so a bucket above 0
 * always takes the next layer), so they can move while l computes. A slot outside the layers (the
 * embeddings, the head): gathered alone. */
static ctrl_status gather_layer_dir(train_zero *z, int layer, int dir) {
    if (z->stage < 3 || z->gathered) return CTRL_OK;
    if (layer < 0 || layer >= z->n_slots)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "zero3: gather of unit %d of %d", layer, z->n_slots);
    ctrl_status st = need_layer(z, layer);
    size_t held = 0;
    const int n_layers = ctrl_model_cfg(z->model)->n_layers;
    if (layer >= n_layers) return st;
    for (int l = layer + dir; st == CTRL_OK && l >= 0 && l < n_layers; l += dir) {
        if (held >= z->prefetch) break;
        held += layer_floats(z, l) + train_zero_nf4_floats(z, l); /* (QLoRA: its NF4 bytes too) */
        if (z->state[l] == 0) st = start_layer(z, l), z->prefetched++;
    }
    return st;
}

static ctrl_status gather_forward(ctrl_memory *m, int layer) { return gather_layer_dir(m->z, layer, 1); }
static ctrl_status gather_backward(ctrl_memory *m, int layer) {
    train_zero *z = m->z; /* a CUDA model's zero3: the layer's (the head's) gradients mapped for its
                           * backward; before layer 0's, the embeddings' for the lookup's backward */
    z->flight_behind += z->n_flight; /* overlap_comm: reductions still in flight as this one begins */
    ctrl_status st = z->vm_grads && layer >= 0 && layer < z->n_slots && z->layer_unit[layer] >= 0
                         ? train_zero_device_grads_in(z, z->layer_unit[layer])
                         : CTRL_OK;
    if (z->gpool && layer >= 0 && layer < ctrl_model_cfg(z->model)->n_layers && z->layer_unit[layer] >= 0) {
        const int u = z->layer_unit[layer]; /* the host's: the layer's gradients on zeroed pool pages */
        const float *g = ctrl_model_grads(z->model, NULL);
        const page_piece pc = page_span(g + z->units[u].a, g + z->units[u].b);
        page_pool_lend(z->gpool, u, &pc, 1);
    }
    for (int u = 0; z->vm_grads && layer == 0 && u < z->n_units && st == CTRL_OK; u++)
        if (z->units[u].layer == TRAIN_ZERO_OUTER) st = train_zero_device_grads_in(z, u);
    return st == CTRL_OK ? gather_layer_dir(z, layer, -1) : st;
}

static ctrl_status release_layer(ctrl_memory *m, int layer) {
    train_zero *z = m->z;
    /* offload_optimizer overlapped: after the last layer's forward every unit stepped and on the
     * device (the final norm, kept whole, is read next, outside any gather) */
    ctrl_status st =
        z->ov && layer == ctrl_model_cfg(z->model)->n_layers - 1 ? train_offload_need(z->ov, -1) : CTRL_OK;
    if (st != CTRL_OK || z->stage < 3 || z->gathered || layer < 0 || layer >= z->n_slots ||
        z->state[layer] != 2)
        return st;
    st = release_slot(z, layer);
    z->state[layer] = 0;
    return st;
}

/* Unit u's reduce-scatter done (`handle`: started by reduce_unit with overlap_comm, else NULL and
 * done here): this rank's slice of the average added to its sums, and the whole unit's gradients
 * zeroed and released (the next backward adds into zeros). */
static ctrl_status finish_unit(train_zero *z, int u, void *handle) {
    if (z->dev) return train_zero_device_finish_unit(z, u, handle); /* a CUDA model's, over NCCL */
    float *g = ctrl_model_grads(z->model, NULL) + z->units[u].a;
    const size_t len = z->units[u].b - z->units[u].a;
    ctrl_status st = handle ? ctrl_collective_reduce_scatter_wait_mean(handle, g, train_zero_counts(z, u))
                            : ctrl_collective_reduce_scatter_mean_f32(g, train_zero_counts(z, u));
    if (st != CTRL_OK) return st;
    size_t lo, hi;
    train_zero_slice(z, u, z->rank, &lo, &hi);
    float *acc = z->acc + z->acc_off[u];
    const float *mine = g + (lo - z->units[u].a);
    for (size_t i = 0; i < hi - lo; i++) acc[i] += mine[i];
    memset(g, 0, sizeof(float) * len); /* (the pool's pages go back zeroed, as it lends them) */
    if (!page_pool_give_back(z->gpool, u)) release_range(g, g + len);
    return CTRL_OK;
}

/* Unit u's gradients averaged over the ranks: at once, or (overlap_comm) started, to be finished
 * when the next bucket is reduced or the backward ends, while the backward goes on. */
static ctrl_status reduce_unit(train_zero *z, int u) {
    if (!z->overlap) return finish_unit(z, u, NULL);
    void *h = NULL; /* a CUDA model's: on the communication stream (zero_device.c) */
    ctrl_status st =
        z->dev ? train_zero_device_start_unit(z, u, &h)
               : ctrl_collective_reduce_scatter_start_f32(ctrl_model_grads(z->model, NULL) + z->units[u].a,
                                                          train_zero_counts(z, u), &h);
    if (st == CTRL_OK) z->flight_u[z->n_flight] = u, z->flight_h[z->n_flight++] = h;
    return st;
}

/* overlap_comm: the reductions in flight finished, in the order they started. */
static ctrl_status finish_flight(train_zero *z) {
    ctrl_status st = CTRL_OK;
    for (int i = 0; i < z->n_flight; i++) {
        const ctrl_status s = finish_unit(z, z->flight_u[i], z->flight_h[i]);
        if (st == CTRL_OK) st = s;
    }
    z->n_flight = 0;
    return st;
}

/* While measuring (the first step): the gradient buffer's resident bytes, the most seen. */
static void measure(train_zero *z) {
    if (!z->measure || z->dev) return; /* a device's buffer is allocated whole */
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
    ctrl_status sr = layer >= 0 ? release_layer(m, layer) : CTRL_OK;
    if (sr != CTRL_OK) return sr;
    const int u = layer >= 0 ? z->layer_unit[layer] : -1;
    if (layer >= 0 && (u < 0 || !z->closes[layer])) return CTRL_OK;
    measure(z);
    ctrl_status st = finish_flight(z); /* overlap_comm: the previous bucket's */
    if (layer < 0) {
        for (int k = 0; k < z->n_units && st == CTRL_OK; k++)
            if (z->units[k].layer < 0) st = finish_unit(z, k, NULL);
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
    .before_forward = gather_forward,
    .after_forward = release_layer,
    .before_backward = gather_backward,
    .after_backward = reduce_layer,
};

/* CTRL_TEST_ZERO3_REFAULT set: no pools, every use the old way (tests and benchmarks compare with it). */
static int refault(void) { return getenv("CTRL_TEST_ZERO3_REFAULT") != NULL; }

/* The frames the pools lend (the layer in use and the next one, prefetched or reduced in flight). */
#define POOL_FRAMES 2

/* Stage 3's parameter pool: frames of the largest layer's released pages (the embeddings and a head
 * borrow one when they fit; at a real vocabulary they are larger and take the old way). */
static void make_pool(train_zero *z) {
    const int n_layers = ctrl_model_cfg(z->model)->n_layers;
    size_t frame = 0;
    int cap = 0;
    for (int l = 0; l < z->n_slots; l++) {
        size_t bytes = 0;
        int n = 0;
        for (int i, e = slot_runs(z, l, &i); i < e; i++) {
            page_piece pc[2];
            run_pieces(z, &z->runs[i], pc);
            bytes += pc[0].len + pc[1].len, n += (pc[0].len > 0) + (pc[1].len > 0);
        }
        if (l < n_layers && bytes > frame) frame = bytes;
        cap = n > cap ? n : cap;
    }
    z->pool = refault() ? NULL : page_pool_new(POOL_FRAMES, frame, cap, z->n_slots);
}

/* Stage 3's gradient pool: frames of the largest layer unit's pages (a unit a layer at any bucket). */
static void make_gpool(train_zero *z) {
    const float *g = ctrl_model_grads(z->model, NULL);
    size_t frame = 0;
    for (int u = 0; u < z->n_units; u++) {
        const page_piece pc = page_span(g + z->units[u].a, g + z->units[u].b);
        if (z->units[u].layer >= 0 && pc.len > frame) frame = pc.len;
    }
    z->gpool = refault() ? NULL : page_pool_new(POOL_FRAMES, frame, 1, z->n_units);
}

void train_zero_pool_free(train_zero *z) {
    page_pool_free(z->pool), page_pool_free(z->gpool);
    z->pool = z->gpool = NULL;
}

void train_zero_pool_report(const train_zero *z) {
    if (z->rank != 0 || z->stage < 3 || z->dev) return;
    if (getenv("CTRL_TEST_ZERO3_REFAULT")) /* (else no pool: nothing released to back) */
        CTRL_INFO("zero3: the released pages are faulted again at each use (CTRL_TEST_ZERO3_REFAULT)");
    const page_pool_stats p = page_pool_get_stats(z->pool), g = page_pool_get_stats(z->gpool);
    if (z->pool)
        CTRL_INFO("zero3: gathers into reused pages: %ld uses on %d of %d frames of %zu bytes, %ld the old "
                  "way (larger than a frame, or none free)%s",
                  p.lent, p.used, p.frames, p.frame, p.missed, p.broken ? "; failed, off" : "");
    if (z->gpool)
        CTRL_INFO("zero3: gradients on reused pages: %ld backwards of a layer on %d of %d frames of %zu "
                  "bytes, %ld the old way%s",
                  g.lent, g.used, g.frames, g.frame, g.missed, g.broken ? "; failed, off" : "");
}

/* The hooks' instance and stage 3's per-slot state: the gathers' states, the prefetches' handles,
 * the sliced ranges the bf16 copy leaves to the gathers (skip). */
static ctrl_status attach_slots(train_zero *z, ctrl_model *m) {
    if (!(z->hooks = malloc(sizeof *z->hooks))) return ctrl_error_set(CTRL_ERR_NOMEM, "zero: out of memory");
    z->hooks->z = z, z->model = m, z->measure = 1;
    const size_t nl = (size_t)(z->n_slots > 0 ? z->n_slots : 1);
    ctrl_status sr = z->stage >= 3 ? train_zero_make_runs(z, m) : CTRL_OK;
    if (sr != CTRL_OK) return sr;
    const size_t nr = (size_t)(z->n_runs > 0 ? z->n_runs : 1);
    if (z->stage >= 3 && (!(z->skip = malloc(sizeof(size_t) * 2 * nr)) || !(z->state = calloc(nl, 1)) ||
                          !(z->pending = calloc(nr, sizeof *z->pending))))
        return ctrl_error_set(CTRL_ERR_NOMEM, "zero: out of memory");
    if (z->stage >= 3 && !z->dev) make_pool(z);
    for (int k = 0; z->stage >= 3 && k < z->n_runs; k++) { /* kept in the parameters' order */
        const train_zero_unit r = z->runs[k].u;
        int at = z->n_skip++;
        for (; at > 0 && z->skip[2 * at - 2] > r.a; at--)
            z->skip[2 * at] = z->skip[2 * at - 2], z->skip[2 * at + 1] = z->skip[2 * at - 1];
        z->skip[2 * at] = r.a, z->skip[2 * at + 1] = r.b;
    }
    return CTRL_OK;
}

ctrl_status train_zero_attach(train_zero *z, ctrl_model *m) {
    if (!z->partitioned) return CTRL_OK;
    ctrl_status st = attach_slots(z, m);
    if (st != CTRL_OK) return st;
    if (!(z->flight_u = malloc(sizeof(int) * (size_t)z->n_units)) ||
        !(z->flight_h = malloc(sizeof(void *) * (size_t)z->n_units)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "zero: out of memory");
    st = ctrl_model_set_sharding(m, &layer_hooks, z->hooks);
    ctrl_model_set_sharding_outer(m, z->stage >= 3); /* the embeddings' and head's hooks too */
    /* a device's (zero3's: zeroed as mapped); the host's below, without touching them */
    if (st == CTRL_OK && z->dev && !z->vm_grads) st = ctrl_model_zero_grad(m);
    if (st == CTRL_OK && z->vm_params && z->n_kept) { /* the persistent views whole on the devices */
        st = train_zero_device_keep(z);
        z->gathers = z->gather_views = 0, z->gather_floats = 0;
    }
    if (st != CTRL_OK || z->dev) return st; /* a device's gradients: zeroed in place after each bucket */
    size_t n = 0;
    float *g = ctrl_model_grads(m, &n);
    /* zeros for the backward to add into; clearing them as a step's zero_grad does made every rank
     * hold the whole model's gradients once at start-up */
    clear_range(g, g + n);
    if (z->stage >= 3) make_gpool(z); /* (zero2's units are buckets: a frame of one could be them all) */
    train_zero_release_all(z);
    /* the persistent views whole (a sliced load read this rank's slices of them only), their bf16 copy */
    st = z->n_kept ? train_zero_gather_kept(z, 1) : CTRL_OK;
    if (z->n_kept) ctrl_model_weights_changed(m);
    z->gathers = z->gather_views = 0, z->gather_floats = 0;
    return st;
}

/* A frozen model's hooks (train_zero_attach_frozen): after a use, while measuring, the parameters'
 * resident bytes (the slices, what is whole, the unit in use) into grad_peak; then released. */
static ctrl_status release_frozen(ctrl_memory *m, int layer) {
    train_zero *z = m->z;
    if (z->measure && !z->gathered) { /* not while whole (an evaluation) */
        size_t n = 0;
        const float *p = ctrl_model_params(z->model, &n);
        /* a device's: the memory mapped for its parameters */
        const size_t r = z->dev ? train_zero_device_resident(z) : train_zero_resident(p, n * sizeof *p);
        if (r > z->grad_peak) z->grad_peak = r;
    }
    return release_layer(m, layer);
}

static ctrl_status no_backward(ctrl_memory *m, int layer) {
    (void)m;
    return ctrl_error_set(CTRL_ERR_RUNTIME, "zero3: a backward through a frozen sliced model (unit %d)",
                          layer);
}

static const ctrl_memory_ops frozen_hooks = {
    .size = sizeof(ctrl_memory_ops),
    .before_forward = gather_forward,
    .after_forward = release_frozen,
    .before_backward = no_backward,
};

ctrl_status train_zero_attach_frozen(train_zero *z, ctrl_model *m) {
    if (z->stage < 3)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "zero3: a frozen model sliced by zero3 only");
    ctrl_status st = attach_slots(z, m);
    if (st == CTRL_OK) st = ctrl_model_set_sharding(m, &frozen_hooks, z->hooks);
    ctrl_model_set_sharding_outer(m, 1);
    if (st == CTRL_OK) train_zero_release_all(z);
    return st;
}

ctrl_status train_zero_forward_layer(train_zero *z, int l, int after) {
    return after ? release_layer(z->hooks, l) : gather_layer_dir(z, l, 1);
}

int train_zero_layer_ranges(const train_zero *z, int l, train_zero_unit out[2]) {
    return layer_ranges(z, l, out);
}

void train_zero_release_layer(train_zero *z, int l) { release_slot(z, l); }

ctrl_status train_zero_gather_all(train_zero *z) {
    if (z->stage < 3 || z->gathered) return CTRL_OK;
    ctrl_status st = ctrl_model_set_round_skip(z->model, NULL, 0); /* whole: the bf16 copy rounds all */
    z->fp32_gather = 1; /* a CUDA model's zero3 in bf16: the fp32 masters, not the bf16 slices */
    for (int l = 0; l < z->n_slots && st == CTRL_OK; l++) st = need_layer(z, l);
    /* in bf16 on a device the persistent views held their bf16 values: their fp32 masters now */
    if (st == CTRL_OK && z->b16) st = train_zero_gather_kept(z, 0);
    z->fp32_gather = 0;
    z->gathered = st == CTRL_OK;
    z->whole_gathers++;
    if (z->gathered && z->dev) { /* whole on the device: the host's copy refreshed at its next read */
        ctrl_model_set_device_sliced(z->model, 0);
        ctrl_model_device_weights_changed(z->model);
    }
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

void train_zero_whole_report(const train_zero *z) {
    if (z->stage < 3 || z->size < 2 || z->rank != 0) return;
    CTRL_INFO("zero3: the whole model gathered on every rank %ld time(s) in this run (evaluations, "
              "generation with ds3_gather_for_generation = true, saves or pushes not streamed)",
              z->whole_gathers);
}

void train_zero_release_all(train_zero *z) {
    if (z->stage < 3) return;
    const int was_whole = z->gathered;
    z->gathered = 0;
    if (z->dev) ctrl_model_set_device_sliced(z->model, 1);
    for (int l = 0; l < z->n_slots; l++) {
        if ((!z->dev || z->state[l]) && release_slot(z, l) != CTRL_OK)
            CTRL_ERROR("zero3: %s", ctrl_error_message());
        z->state[l] = 0;
    }
    /* in bf16 on a device: the persistent views' bf16 values again (the forward's, as a gathered layer's) */
    if (was_whole && z->b16 && train_zero_gather_kept(z, 0) != CTRL_OK)
        CTRL_ERROR("zero3: %s", ctrl_error_message());
    ctrl_model_set_round_skip(z->model, z->skip, z->n_skip); /* the gathers round the layers */
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
