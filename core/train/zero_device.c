/* ZeRO stage 2 on a CUDA model (see zero.h): the gradient partition of zero_layers.c on the device.
 * As a bucket of layers completes in the backward, its gradients (the model's device buffer) are
 * reduce-scattered over NCCL (ncclAvg: each rank receives its slice's average), each rank adds its
 * slice to its sums in device memory (`acc`, 1/N of the trainable floats) and zeroes the bucket for
 * the next backward; the step's norm, clipping and the optimizer (on the device) then read the sums,
 * and the updated slices are all-gathered over NCCL into every rank's device parameters. Nothing
 * crosses to the host but the norm's one double. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/log.h>

#include "collective/collective.h"
#include "device/backend.h"
#include "train/zero.h"

typedef struct zero_vm zero_vm;
static ctrl_status vm_drop(zero_vm *v, size_t a, size_t b);
static uint16_t *b16_base(const train_zero *z);

int train_zero_wants_device(int stage, ctrl_model *m, int host_step) {
    /* zero3 partitions on the device with offload_optimizer too (the step alone on the host) */
    return (stage >= 3 || (stage == 2 && !host_step)) && ctrl_model_device(m).type != CTRL_DEVICE_CPU;
}

ctrl_status train_zero_device_init(train_zero *z, ctrl_model *m) {
    const ctrl_backend_ops *be = ctrl_model_backend(m);
    ctrl_status st = ctrl_collective_device_init(); /* the NCCL communicator (a no-op on one rank) */
    if (st == CTRL_OK) st = be->alloc((void **)&z->acc, (z->acc_n ? z->acc_n : 1) * sizeof(float));
    if (st == CTRL_OK) z->dev = be;
    if (st == CTRL_OK) st = be->fill_zero(z->acc, (z->acc_n ? z->acc_n : 1) * sizeof(float));
    if (st == CTRL_OK && z->host_step && !(z->hacc = malloc((z->acc_n ? z->acc_n : 1) * sizeof(float))))
        st = ctrl_error_set(CTRL_ERR_NOMEM, "out of memory for the host's copy of the gradient sums");
    return st == CTRL_OK ? CTRL_OK
                         : ctrl_error_wrap(st, "zero2 on %s: %zu gradient floats", be->name, z->acc_n);
}

void train_zero_device_free(train_zero *z) {
    if (!z->dev) return; /* the host's acc: train_zero_free's */
    if (z->overlap && z->rank == 0 && z->size > 1)
        CTRL_INFO("overlap_comm on %s: %ld reduce-scatters queued on the communication stream during the "
                  "backwards, %ld of them still in flight when a later layer's backward began (the compute "
                  "stream waited for each before reading its slice)",
                  z->dev->name, z->flight_started, z->flight_behind);
    if (z->acc) z->dev->free(z->acc); /* (a frozen model's was freed at its load) */
    z->dev = NULL, z->acc = NULL;
}

/* overlap_comm: unit u's reduce-scatter queued on the communication stream after the kernels that
 * wrote its gradients; the backward goes on, finish_unit waits for it (*handle). */
ctrl_status train_zero_device_start_unit(train_zero *z, int u, void **handle) {
    float *g = ctrl_model_device_grads(z->model, NULL) + z->units[u].a;
    const int outer = z->vm_grads && z->units[u].layer == TRAIN_ZERO_OUTER;
    ctrl_status st = outer ? train_zero_device_grads_in(z, u) : CTRL_OK;
    if (st == CTRL_OK)
        st = ctrl_collective_device_reduce_scatter_start_mean_f32(g, train_zero_counts(z, u), handle);
    if (st == CTRL_OK) z->flight_started++;
    return st;
}

ctrl_status train_zero_device_finish_unit(train_zero *z, int u, void *handle) {
    float *g = ctrl_model_device_grads(z->model, NULL) + z->units[u].a;
    const size_t len = z->units[u].b - z->units[u].a;
    const int outer = z->vm_grads && z->units[u].layer == TRAIN_ZERO_OUTER; /* the embeddings', head's */
    ctrl_status st = outer && !handle ? train_zero_device_grads_in(z, u) : CTRL_OK; /* (mapped by uses) */
    /* started (overlap_comm): the compute stream waits for it before the sums read the slice and the
     * zeroing overwrites the unit; else reduced now */
    if (st == CTRL_OK)
        st = handle ? ctrl_collective_device_reduce_scatter_wait(handle)
                    : ctrl_collective_device_reduce_scatter_mean_f32(g, train_zero_counts(z, u));
    size_t lo, hi;
    train_zero_slice(z, u, z->rank, &lo, &hi);
    float *acc = z->acc + z->acc_off[u];
    if (st == CTRL_OK && hi > lo) /* the slice's average added to its sums */
        st = z->dev->residual_forward(acc, acc, g + (lo - z->units[u].a), (int64_t)(hi - lo));
    if (st == CTRL_OK) st = z->dev->fill_zero(g, len * sizeof(float)); /* the next backward adds into zeros */
    const int drop = z->vm_grads && (z->units[u].layer >= 0 || outer); /* zero3: unmapped */
    if (st == CTRL_OK && drop) st = z->dev->synchronize();
    if (st == CTRL_OK && drop)
        st = vm_drop(z->vm_grads, z->units[u].a * sizeof(float), z->units[u].b * sizeof(float));
    if (st == CTRL_OK && outer) z->grads_in[u] = 0;
    return st;
}

ctrl_status train_zero_device_sum_squares(train_zero *z, double *sum_sq) {
    ctrl_status st = z->acc_n ? z->dev->sum_squares(z->acc, (int64_t)z->acc_n, sum_sq) : CTRL_OK;
    if (st == CTRL_OK && z->host_step && z->acc_n) /* offload_optimizer: the step reads them there */
        st = z->dev->to_host(z->hacc, z->acc, z->acc_n * sizeof(float));
    return st == CTRL_OK ? ctrl_collective_allreduce_sum_f64(sum_sq, 1) : st;
}

/* zero3 in bf16: unit u's fp32 master slice on the device (NULL for a unit outside the layers, whose
 * master is the parameters' own; with offload_optimizer its copy in acc, current right after the
 * step's upload), its bounds in trainable floats. */
static float *master_of(const train_zero *z, int u, size_t *lo, size_t *hi) {
    train_zero_slice(z, u, z->rank, lo, hi);
    if (!z->b16 || z->units[u].layer < 0) return NULL;
    return z->host_step ? z->acc + z->acc_off[u] : z->master + (z->acc_off[u] - z->master_lo);
}

/* offload_optimizer: the slices the host stepped onto the device -- into the device's parameters,
 * or (a layer's in bf16) into acc, whence refresh_b16 rounds them. */
static ctrl_status upload_slices(train_zero *z, ctrl_model *m) {
    const float *host = ctrl_model_params(m, NULL) + z->first;
    float *p = ctrl_model_device_params(m) + z->first;
    ctrl_status st = CTRL_OK;
    for (int u = 0; u < z->n_units && st == CTRL_OK; u++) {
        size_t lo, hi;
        float *master = master_of(z, u, &lo, &hi);
        if (hi > lo) st = z->dev->to_device(master ? master : p + lo, host + lo, (hi - lo) * sizeof(float));
    }
    return st;
}

/* zero3 in bf16: unit u's bf16 slice (vm_b16, mapped for the run) from its fp32 master. */
static ctrl_status refresh_b16(train_zero *z, int u) {
    size_t lo, hi;
    const float *master = master_of(z, u, &lo, &hi);
    uint16_t *b16 = b16_base(z) + z->first + lo;
    return hi > lo ? z->dev->to_bf16(b16, master, (int64_t)(hi - lo)) : CTRL_OK;
}

/* After a step (and upload: the host's values of this rank's slices put on the device first):
 * bf16 slices refreshed, the units kept whole all-gathered, the persistent views too. */
static ctrl_status device_gather(train_zero *z, ctrl_model *m, int upload) {
    float *p = ctrl_model_device_params(m) + z->first;
    ctrl_status st = upload ? upload_slices(z, m) : CTRL_OK;
    for (int u = 0; u < z->n_units && st == CTRL_OK; u++) { /* zero3's layers stay sliced */
        size_t lo, hi;
        const float *master = master_of(z, u, &lo, &hi);
        if (master) st = refresh_b16(z, u);                    /* bf16: the slice the next gathers send */
        if (st == CTRL_OK && master && z->gathered && hi > lo) /* whole now: the fp32 masters gathered */
            st = z->dev->copy(p + lo, master, (hi - lo) * sizeof(float));
        if (st == CTRL_OK && (z->stage < 3 || z->units[u].layer == -1 || z->gathered))
            st = ctrl_collective_device_allgather_f32(p + z->units[u].a, train_zero_counts(z, u));
        if (st == CTRL_OK && master && z->gathered && z->b16_direct) /* the bf16 values the products read */
            st = ctrl_collective_device_allgather_b16(b16_base(z) + z->first + z->units[u].a,
                                                      train_zero_counts(z, u), NULL);
    }
    /* zero3: the ranks' updated slices of the persistent views (stage3_param_persistence_threshold) */
    if (st == CTRL_OK && z->stage >= 3 && !z->gathered) st = train_zero_gather_kept(z, 0);
    ctrl_model_device_weights_changed(m);
    return st;
}

ctrl_status train_zero_device_upload_unit(train_zero *z, int u) {
    size_t lo, hi;
    float *master = master_of(z, u, &lo, &hi);
    const float *host = ctrl_model_params(z->model, NULL) + z->first;
    float *dst = master ? master : ctrl_model_device_params(z->model) + z->first + lo;
    /* (an empty slice: the event recorded all the same, after a copy of nothing) */
    return z->dev->upload_copy(hi > lo ? (void *)dst : (void *)z->acc, host + lo, (hi - lo) * sizeof(float),
                               u);
}

ctrl_status train_zero_device_unit_ready(train_zero *z, int u) {
    size_t lo, hi;
    float *master = master_of(z, u, &lo, &hi);
    ctrl_status st = master ? refresh_b16(z, u) : CTRL_OK;
    /* the unit's gradient sums from zeros for the backward (in bf16 they staged its masters; the
     * step's zero_grad left them alone while the round was in flight) */
    if (st == CTRL_OK && hi > lo) st = z->dev->fill_zero(z->acc + z->acc_off[u], (hi - lo) * sizeof(float));
    if (st == CTRL_OK && z->units[u].layer == -1) /* kept whole: every rank's slice */
        st = ctrl_collective_device_allgather_f32(
            ctrl_model_device_params(z->model) + z->first + z->units[u].a, train_zero_counts(z, u));
    return st;
}

ctrl_status train_zero_device_gather(train_zero *z, ctrl_model *m) {
    return device_gather(z, m, z->host_step);
}

ctrl_status train_zero_device_reload(train_zero *z, ctrl_model *m) { return device_gather(z, m, 1); }

void train_zero_device_groups(const train_zero *z, ctrl_model *m, ctrl_param_group *groups, int n) {
    const float *host = ctrl_model_params(m, NULL);
    float *dev = ctrl_model_device_params(m);
    for (int i = 0; i < n; i++) { /* grads: acc's already; zero3 in bf16: a layer's, its master slice */
        const size_t at = (size_t)(groups[i].grad - z->acc);
        if (z->host_step) { /* offload_optimizer: the host's parameters, the sums' host copy */
            groups[i].grad = z->hacc + at;
            continue;
        }
        groups[i].param = z->b16 && at >= z->master_lo && at < z->master_lo + z->master_n
                              ? z->master + (at - z->master_lo)
                              : dev + (groups[i].param - host);
    }
}

/* ZeRO-3 on a CUDA model: the parameters and the gradients each in one range of device addresses
 * (backend.h's vm_*), whose granularity-sized pieces are mapped while something in them is needed: a
 * piece holding this rank's slice of a layer or anything outside the layers is pinned (mapped for the
 * run), the others are mapped while a layer they hold is gathered (users: how many), and unmapped --
 * their memory handed back to the device -- when the last is released. A freshly mapped gradient piece
 * is zeroed (the backward adds into it); a parameter piece is written by the layer's gather. */
struct zero_vm {
    const ctrl_backend_ops *be;
    char *base;
    size_t bytes, gran, n; /* the range's bytes (those in use), the piece, the pieces */
    unsigned short *users;
    unsigned char *pinned;
    size_t mapped, peak; /* pieces mapped now, the most since train_zero_device_peak_reset */
    int zero_fresh;      /* gradients: a piece mapped anew is zeroed */
};

static ctrl_status vm_new(const ctrl_backend_ops *be, size_t bytes, int zero_fresh, zero_vm **out) {
    zero_vm *v = calloc(1, sizeof *v);
    if (!v) return ctrl_error_set(CTRL_ERR_NOMEM, "zero3: out of memory");
    *out = v;
    v->be = be, v->bytes = bytes, v->zero_fresh = zero_fresh;
    ctrl_status st = be->vm_reserve((void **)&v->base, bytes ? bytes : 1, &v->gran);
    if (st != CTRL_OK) return st;
    v->n = (bytes + v->gran - 1) / v->gran;
    if (!(v->users = calloc(v->n ? v->n : 1, sizeof *v->users)) || !(v->pinned = calloc(v->n ? v->n : 1, 1)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "zero3: out of memory");
    return CTRL_OK;
}

static void vm_free(zero_vm *v) {
    if (!v) return;
    if (v->base) v->be->vm_unreserve(v->base, v->bytes ? v->bytes : 1);
    free(v->users), free(v->pinned), free(v);
}

static ctrl_status vm_map_piece(zero_vm *v, size_t i) {
    ctrl_status st = v->be->vm_map(v->base + i * v->gran, v->gran);
    if (st == CTRL_OK && v->zero_fresh) st = v->be->fill_zero(v->base + i * v->gran, v->gran);
    if (st == CTRL_OK && ++v->mapped > v->peak) v->peak = v->mapped;
    return st;
}

/* The pieces that hold bytes [a, b) of the range. */
static void vm_pieces(const zero_vm *v, size_t a, size_t b, size_t *lo, size_t *hi) {
    *lo = a / v->gran, *hi = b > a ? (b + v->gran - 1) / v->gran : *lo;
}

static ctrl_status vm_pin(zero_vm *v, size_t a, size_t b) {
    size_t lo, hi;
    vm_pieces(v, a, b, &lo, &hi);
    ctrl_status st = CTRL_OK;
    for (size_t i = lo; i < hi && st == CTRL_OK; i++) {
        if (!v->pinned[i] && !v->users[i]) st = vm_map_piece(v, i);
        v->pinned[i] = 1;
    }
    return st;
}

static ctrl_status vm_use(zero_vm *v, size_t a, size_t b) {
    size_t lo, hi;
    vm_pieces(v, a, b, &lo, &hi);
    ctrl_status st = CTRL_OK;
    for (size_t i = lo; i < hi && st == CTRL_OK; i++)
        if (v->users[i]++ == 0 && !v->pinned[i]) st = vm_map_piece(v, i);
    return st;
}

/* The caller waited for the work that reads or writes [a, b). */
static ctrl_status vm_drop(zero_vm *v, size_t a, size_t b) {
    size_t lo, hi;
    vm_pieces(v, a, b, &lo, &hi);
    ctrl_status st = CTRL_OK;
    for (size_t i = lo; i < hi; i++) {
        if (!v->users[i]) continue; /* not in use (released already) */
        if (--v->users[i] == 0 && !v->pinned[i]) {
            const ctrl_status s = v->be->vm_unmap(v->base + i * v->gran, v->gran);
            if (st == CTRL_OK) st = s;
            v->mapped--;
        }
    }
    return st;
}

/* A sliced unit's range in the parameters, in bytes. */
static size_t param_byte(const train_zero *z, size_t trainable) {
    return (z->first + trainable) * sizeof(float);
}

static uint16_t *b16_base(const train_zero *z) { return (uint16_t *)(void *)z->vm_b16->base; }

int train_zero_in_b16(const train_zero *z, train_zero_unit u) {
    return z->b16 && u.layer >= 0 && u.layer < ctrl_model_cfg(z->model)->n_layers;
}

/* held16's entry of a layer's range: its trainable unit's, or LoRA's frozen base's. */
static size_t held_at(const train_zero *z, train_zero_unit u) {
    return 2 * (size_t)u.layer + (u.a < z->first);
}

/* Parameters [a, b) of the whole model into device memory dst: from the device's whole copy, or where
 * the model's move deferred it (ctrl_model_defer_device: the device never holds the whole model) from
 * the host's, which hold this rank's slices (a sliced load) or everything. */
static ctrl_status from_whole(const train_zero *z, void *dst, size_t a, size_t b) {
    const float *dev = ctrl_model_device_params(z->model);
    if (b <= a) return CTRL_OK;
    return dev ? z->dev->copy(dst, dev + a, (b - a) * sizeof(float))
               : z->dev->to_device(dst, ctrl_model_params(z->model, NULL) + a, (b - a) * sizeof(float));
}

/* zero3 in bf16: the layers' fp32 master slices (from the model's parameters, before it frees
 * them) and their bf16 values in vm_b16 (this rank's slices mapped for the run, indexed as the
 * parameters). */
static ctrl_status b16_init(train_zero *z, ctrl_model *m, size_t n_params) {
    const ctrl_backend_ops *be = z->dev;
    if (!ctrl_backend_has(be, to_bf16) || !ctrl_backend_has(be, from_bf16))
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "[train] dtype = bf16 with [memory] strategies = zero3 on %s: the backend has no "
            "bf16 conversions (an older libctrl_cuda.so?)",
            be->name);
    size_t hi_all = 0;
    z->master_lo = z->acc_n;
    for (int u = 0; u < z->n_units; u++) { /* the layer units' slices: consecutive in acc's layout */
        size_t lo, hi;
        train_zero_slice(z, u, z->rank, &lo, &hi);
        if (z->units[u].layer < 0) continue;
        if (z->acc_off[u] < z->master_lo) z->master_lo = z->acc_off[u];
        if (z->acc_off[u] + (hi - lo) > hi_all) hi_all = z->acc_off[u] + (hi - lo);
    }
    z->master_n = hi_all > z->master_lo ? hi_all - z->master_lo : 0;
    if (!z->master_n) z->master_lo = 0;
    const int n_layers = ctrl_model_cfg(m)->n_layers;
    if (!(z->held16 = calloc(2 * (size_t)(n_layers > 0 ? n_layers : 1), 1)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "zero3: out of memory");
    /* offload_optimizer: the masters are the host's parameters (staged through acc, master_of) */
    ctrl_status st = z->host_step
                         ? CTRL_OK
                         : be->alloc((void **)&z->master, (z->master_n ? z->master_n : 1) * sizeof(float));
    if (st == CTRL_OK) st = vm_new(be, n_params * sizeof(uint16_t), 0, &z->vm_b16);
    z->b16 = st == CTRL_OK;
    for (int u = 0; u < z->n_units && st == CTRL_OK; u++) {
        size_t lo, hi;
        float *master = master_of(z, u, &lo, &hi);
        if (!master || hi <= lo) continue;
        st = vm_pin(z->vm_b16, (z->first + lo) * sizeof(uint16_t), (z->first + hi) * sizeof(uint16_t));
        if (st == CTRL_OK) st = from_whole(z, master, z->first + lo, z->first + hi);
        if (st == CTRL_OK) st = refresh_b16(z, u);
    }
    if (st == CTRL_OK && z->host_step) /* acc staged the masters: the sums start from zeros */
        st = be->fill_zero(z->acc, (z->acc_n ? z->acc_n : 1) * sizeof(float));
    /* LoRA's frozen base: no master (never stepped); this rank's slice of each layer's as bf16 (the
     * frozen embeddings' and an untied head's stay fp32, as the trainable ones: pin_base) */
    for (int l = 0; z->frozen && l < n_layers && st == CTRL_OK; l++) {
        const train_zero_unit f = z->frozen[l];
        size_t lo, hi;
        if (f.layer < 0) continue;
        train_zero_cut(z, f, z->rank, &lo, &hi);
        if (hi <= lo) continue;
        st = vm_pin(z->vm_b16, lo * sizeof(uint16_t), hi * sizeof(uint16_t));
        float *tmp = NULL; /* (the model's move deferred: the host's values staged through device memory) */
        const float *src = ctrl_model_device_params(m) + lo;
        if (st == CTRL_OK && !ctrl_model_device_params(m)) {
            st = be->alloc((void **)&tmp, (hi - lo) * sizeof(float));
            if (st == CTRL_OK) st = from_whole(z, tmp, lo, hi);
            src = tmp;
        }
        if (st == CTRL_OK) st = be->to_bf16(b16_base(z) + lo, src, (int64_t)(hi - lo));
        if (tmp) be->free(tmp);
    }
    return st;
}

/* Pins [a, b) of the parameters (in parameters) but LoRA's frozen ranges, of which this rank's slices
 * only (in bf16 a layer's none: their bf16 values are in vm_b16). */
static ctrl_status pin_base(train_zero *z, size_t a, size_t b) {
    size_t at = a;
    ctrl_status st = CTRL_OK;
    while (at < b && st == CTRL_OK) {
        const train_zero_unit *next = NULL; /* the lowest frozen range from `at` on */
        for (int l = 0; z->frozen && l < z->n_slots; l++)
            if (z->frozen[l].layer >= 0 && z->frozen[l].b > at && (!next || z->frozen[l].a < next->a))
                next = &z->frozen[l];
        const size_t end = next && next->a < b ? (next->a > at ? next->a : at) : b;
        if (end > at) st = vm_pin(z->vm_params, at * sizeof(float), end * sizeof(float));
        if (!next || next->a >= b || st != CTRL_OK) break;
        size_t lo, hi;
        train_zero_cut(z, *next, z->rank, &lo, &hi);
        if (!train_zero_in_b16(z, *next) && hi > lo)
            st = vm_pin(z->vm_params, lo * sizeof(float), hi * sizeof(float));
        at = next->b;
    }
    return st;
}

/* Whether view v is a weight matrix inside layer l's sliced ranges (what the products multiply). */
static int layer_matrix(const train_zero *z, const ctrl_param_view *v) {
    if (v->ndim != 2 || !strstr(v->name, "_proj.")) return 0;
    const size_t a = v->offset, b = a + (size_t)v->numel;
    for (int l = 0; l < ctrl_model_cfg(z->model)->n_layers; l++) {
        train_zero_unit r[2];
        for (int i = 0, n = train_zero_layer_ranges(z, l, r); i < n; i++)
            if (a >= r[i].a && b <= r[i].b) return 1;
    }
    return 0;
}

static int by_start(const void *x, const void *y) {
    const size_t a = *(const size_t *)x, b = *(const size_t *)y;
    return a < b ? -1 : a > b;
}

/* zero3 in bf16: the layers' weight matrices handed to the model as bf16 values in vm_b16
 * (b16_direct), where its products take 2-byte operands; else every gather widens the whole range. */
static ctrl_status b16_direct_init(train_zero *z, ctrl_model *m) {
    const int n_views = ctrl_model_view_count(m);
    if (getenv("CTRL_TEST_ZERO3_WIDEN")) return CTRL_OK; /* tests: the widened fp32 layers, to compare */
    if (!(z->mat = malloc(2 * sizeof(size_t) * (size_t)(n_views > 0 ? n_views : 1))))
        return ctrl_error_set(CTRL_ERR_NOMEM, "zero3: out of memory");
    for (int i = 0; i < n_views; i++) {
        const ctrl_param_view *v = ctrl_model_view(m, i);
        if (!layer_matrix(z, v)) continue;
        z->mat[2 * z->n_mat] = v->offset, z->mat[2 * z->n_mat + 1] = v->offset + (size_t)v->numel;
        z->n_mat++;
    }
    qsort(z->mat, (size_t)z->n_mat, 2 * sizeof(size_t), by_start);
    z->b16_direct = ctrl_model_set_device_b16(m, b16_base(z), z->mat, z->n_mat);
    if (z->b16_direct && z->rank == 0)
        CTRL_INFO(
            "zero3 in bf16: the products read the %d weight matrices of the gathered layers as bf16 where "
            "the gather puts them (2 bytes a parameter in use; the rest of a layer widened to fp32)",
            z->n_mat);
    return CTRL_OK;
}

ctrl_status train_zero_device3_init(train_zero *z, ctrl_model *m) {
    const ctrl_backend_ops *be = ctrl_model_backend(m);
    if (!ctrl_backend_has(be, vm_reserve) || !ctrl_backend_has(be, vm_map) ||
        !ctrl_backend_has(be, vm_unmap) || !ctrl_backend_has(be, vm_unreserve))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "[memory] strategies = zero3 on %s: the backend cannot map device memory piece "
                              "by piece (an older libctrl_cuda.so?)",
                              be->name);
    ctrl_status st = train_zero_device_init(z, m);                     /* the slices' sums, NCCL */
    const size_t n_params = ctrl_model_param_bytes(m) / sizeof(float); /* fp32 on a device */
    float *old = ctrl_model_device_params(m); /* NULL where the move deferred it: the host's then */
    /* the device's copy current first: the host's may be newer (weights broadcast from rank 0, as a
     * LoRA run's are, reach the device at the next forward) */
    if (st == CTRL_OK) st = ctrl_model_params_to_host(m);
    if (st == CTRL_OK && old) st = be->to_device(old, ctrl_model_params(m, NULL), n_params * sizeof(float));
    if (st == CTRL_OK) st = vm_new(be, n_params * sizeof(float), 0, &z->vm_params);
    if (st == CTRL_OK) st = vm_new(be, (z->total ? z->total : 1) * sizeof(float), 1, &z->vm_grads);
    if (st == CTRL_OK && ctrl_model_compute_dtype(m) == CTRL_BF16) st = b16_init(z, m, n_params);
    /* pinned: what lies outside the sliced units, whole, and this rank's slice of each layer (in
     * bf16: its master is apart, and vm_b16 holds its bf16 values), of the embeddings and an untied
     * head (fp32: stepped there); the final norm's gradients (the embeddings' and head's are mapped
     * from their first use in a backward to their reduce-scatter, as a layer's) */
    if (st == CTRL_OK && !(z->grads_in = calloc((size_t)(z->n_units > 0 ? z->n_units : 1), 1)))
        st = ctrl_error_set(CTRL_ERR_NOMEM, "zero3: out of memory");
    if (st == CTRL_OK) st = pin_base(z, 0, z->first);
    for (int u = 0; u < z->n_units && st == CTRL_OK; u++) {
        const train_zero_unit un = z->units[u];
        size_t lo = un.a, hi = un.b;
        if (un.layer != -1) train_zero_slice(z, u, z->rank, &lo, &hi);
        if (un.layer < 0 || !z->b16) st = vm_pin(z->vm_params, param_byte(z, lo), param_byte(z, hi));
        if (st == CTRL_OK && un.layer == -1)
            st = vm_pin(z->vm_grads, un.a * sizeof(float), un.b * sizeof(float));
    }
    if (st == CTRL_OK) st = vm_pin(z->vm_params, param_byte(z, z->total), n_params * sizeof(float));
    /* the pinned pieces' parameters from the model's whole buffer, which the model then frees */
    const zero_vm *v = z->vm_params;
    for (size_t i = 0; v && i < v->n && st == CTRL_OK; i++) {
        const size_t a = i * v->gran, b = a + v->gran < v->bytes ? a + v->gran : v->bytes;
        if (v->pinned[i]) st = from_whole(z, v->base + a, a / sizeof(float), b / sizeof(float));
    }
    if (st == CTRL_OK) st = ctrl_model_adopt_device_buffers(m, (float *)v->base, (float *)z->vm_grads->base);
    size_t free_b = 0, total_b = 0; /* what the device holds now (its whole copy, if any, freed) */
    if (st == CTRL_OK && z->rank == 0 && ctrl_backend_has(be, memory_info) &&
        be->memory_info(&free_b, &total_b) == CTRL_OK)
        CTRL_INFO("zero3 on %s: %s; device memory in use now %zu of %zu bytes (the model's parameters %zu "
                  "bytes)",
                  be->name,
                  old ? "the model's move to the device copied it whole first (one rank), freed now"
                      : "each rank put its slices of the parameters on its device from the host (the move "
                        "to the device copied none: no device held the whole model)",
                  total_b - free_b, total_b, n_params * sizeof(float));
    if (st == CTRL_OK) ctrl_model_set_device_sliced(m, 1);
    if (st == CTRL_OK) ctrl_model_device_weights_changed(m); /* the device's are current (sliced) */
    if (st == CTRL_OK && z->b16) st = b16_direct_init(z, m);
    return st == CTRL_OK ? CTRL_OK : ctrl_error_wrap(st, "zero3 on %s", be->name);
}

void train_zero_device3_free(train_zero *z) {
    if (z->master && z->vm_params) z->vm_params->be->free(z->master); /* (z->dev is cleared first) */
    if (z->kept_buf && z->vm_params) z->vm_params->be->free(z->kept_buf), z->kept_buf = NULL; /* device's */
    vm_free(z->vm_params), vm_free(z->vm_grads), vm_free(z->vm_b16);
    free(z->held16), free(z->mat), free(z->grads_in);
    z->mat = NULL, z->n_mat = 0, z->b16_direct = 0, z->grads_in = NULL;
    z->vm_params = z->vm_grads = z->vm_b16 = NULL, z->master = NULL, z->held16 = NULL, z->b16 = 0;
}

/* zero3 in bf16: the fp32 master values of parameters [a, b) (inside this rank's slice of layer unit
 * k) into dst (device memory): the device's masters, or with offload_optimizer the host's parameters. */
static ctrl_status master_values(train_zero *z, int k, size_t a, size_t b, float *dst) {
    size_t lo, hi;
    const float *master = master_of(z, k, &lo, &hi);
    if (b <= a) return CTRL_OK;
    if (z->host_step)
        return z->dev->to_device(dst, ctrl_model_params(z->model, NULL) + a, (b - a) * sizeof(float));
    return z->dev->copy(dst, master + (a - z->first - lo), (b - a) * sizeof(float));
}

/* The trainable layer unit that holds range u (a layer's, or a run or persistent piece of one), else
 * -1 (LoRA's frozen base, a range outside the layers). */
static int unit_of(const train_zero *z, train_zero_unit u) {
    return u.layer >= 0 && u.a >= z->first ? z->layer_unit[u.layer] : -1;
}

/* zero3 in bf16, a gather of train_zero_gather_all: this rank's fp32 master slice of range u (a
 * layer's, or a run of one: the slice's part in it) into its place in the parameters, which are then
 * all-gathered in fp32. */
static ctrl_status master_in(train_zero *z, train_zero_unit u) {
    const int k = unit_of(z, u);
    size_t lo, hi;
    if (k < 0 || !master_of(z, k, &lo, &hi)) return CTRL_OK;
    const size_t a = z->first + lo > u.a ? z->first + lo : u.a, b = z->first + hi < u.b ? z->first + hi : u.b;
    return master_values(z, k, a, b, ctrl_model_device_params(z->model) + a);
}

ctrl_status train_zero_device_kept_part(train_zero *z, train_zero_unit piece, size_t lo, size_t hi,
                                        float *dst) {
    const int k = unit_of(z, piece);
    if (z->fp32_gather && k >= 0) return master_values(z, k, lo, hi, dst);
    return hi > lo ? z->dev->from_bf16(dst, b16_base(z) + lo, (int64_t)(hi - lo)) : CTRL_OK;
}

ctrl_status train_zero_device_kept_b16(train_zero *z, train_zero_unit piece) {
    return z->dev->to_bf16(b16_base(z) + piece.a, ctrl_model_device_params(z->model) + piece.a,
                           (int64_t)(piece.b - piece.a));
}

/* b16_direct: range u's parts outside the matrices the products read as bf16, each [a, b) (in
 * parameters) passed to fn. */
static ctrl_status each_rest(train_zero *z, train_zero_unit u,
                             ctrl_status (*fn)(train_zero *, size_t, size_t)) {
    size_t at = u.a;
    ctrl_status st = CTRL_OK;
    for (int i = 0; i < z->n_mat && at < u.b && st == CTRL_OK; i++) {
        const size_t a = z->mat[2 * i], b = z->mat[2 * i + 1];
        if (b <= at) continue;
        if (a >= u.b) break;
        if (a > at) st = fn(z, at, a);
        at = b;
    }
    return st == CTRL_OK && at < u.b ? fn(z, at, u.b) : st;
}

static ctrl_status use_rest(train_zero *z, size_t a, size_t b) {
    return vm_use(z->vm_params, a * sizeof(float), b * sizeof(float));
}

static ctrl_status drop_rest(train_zero *z, size_t a, size_t b) {
    return vm_drop(z->vm_params, a * sizeof(float), b * sizeof(float));
}

static ctrl_status widen_rest(train_zero *z, size_t a, size_t b) {
    return z->dev->from_bf16(ctrl_model_device_params(z->model) + a, b16_base(z) + a, (int64_t)(b - a));
}

/* held16's values: how a layer's range was gathered in bf16 */
enum { HELD_NONE, HELD_WIDENED, HELD_REST, HELD_BESIDE };

ctrl_status train_zero_device_gather_range(train_zero *z, train_zero_unit u, const int *counts,
                                           void **handle) {
    float *p = ctrl_model_device_params(z->model) + u.a;
    if (!counts) counts = train_zero_cut_counts(z, u);
    const int b16 = train_zero_in_b16(z, u), frozen = u.a < z->first;
    /* bf16: 2 bytes a parameter over NCCL, widened after (LoRA's frozen base: always, it has no fp32
     * master); a save's gather (fp32_gather) sends the fp32 masters, and with b16_direct the bf16
     * values beside them (the products read those) */
    const int from16 = b16 && (!z->fp32_gather || frozen), keep16 = b16 && (from16 || z->b16_direct);
    const int rest = from16 && !z->fp32_gather && z->b16_direct; /* the matrices stay bf16 only */
    ctrl_status st =
        rest ? each_rest(z, u, use_rest) : vm_use(z->vm_params, u.a * sizeof(float), u.b * sizeof(float));
    /* (set by every gather, never cleared: a layer's runs share the entry, the release of each reads it) */
    if (b16)
        z->held16[held_at(z, u)] = !keep16   ? HELD_NONE
                                   : !from16 ? HELD_BESIDE
                                   : rest    ? HELD_REST
                                             : HELD_WIDENED;
    if (st == CTRL_OK && keep16) {
        st = vm_use(z->vm_b16, u.a * sizeof(uint16_t), u.b * sizeof(uint16_t));
        if (st != CTRL_OK) return st;
        st = ctrl_collective_device_allgather_b16(b16_base(z) + u.a, counts, from16 ? handle : NULL);
        if (from16) return st == CTRL_OK && !handle ? train_zero_device_gathered(z, u) : st;
    }
    if (st == CTRL_OK && b16) st = master_in(z, u); /* fp32: the masters, for a save */
    if (st != CTRL_OK) return st;
    return handle ? ctrl_collective_device_allgather_start_f32(p, counts, handle)
                  : ctrl_collective_device_allgather_f32(p, counts);
}

ctrl_status train_zero_device_gathered(train_zero *z, train_zero_unit u) {
    if (!train_zero_in_b16(z, u)) return CTRL_OK;
    const int held = z->held16[held_at(z, u)];
    if (held == HELD_REST) return each_rest(z, u, widen_rest);
    if (held != HELD_WIDENED) return CTRL_OK;
    return z->dev->from_bf16(ctrl_model_device_params(z->model) + u.a, b16_base(z) + u.a,
                             (int64_t)(u.b - u.a));
}

ctrl_status train_zero_device_release_range(train_zero *z, train_zero_unit u) {
    const int held = train_zero_in_b16(z, u) ? z->held16[held_at(z, u)] : HELD_NONE;
    ctrl_status st = z->dev->synchronize(); /* the kernels that read the layer are done */
    if (st == CTRL_OK)
        st = held == HELD_REST ? each_rest(z, u, drop_rest)
                               : vm_drop(z->vm_params, u.a * sizeof(float), u.b * sizeof(float));
    if (st == CTRL_OK && held != HELD_NONE)
        st = vm_drop(z->vm_b16, u.a * sizeof(uint16_t), u.b * sizeof(uint16_t));
    return st;
}

ctrl_status train_zero_device_grads_in(train_zero *z, int u) {
    if (z->units[u].layer < 0 && z->grads_in[u]) return CTRL_OK; /* mapped already in this backward */
    if (z->units[u].layer < 0) z->grads_in[u] = 1;
    return vm_use(z->vm_grads, z->units[u].a * sizeof(float), z->units[u].b * sizeof(float));
}

void train_zero_device_b16_mapped(train_zero *z, double out[2]) {
    zero_vm *v = z->vm_b16;
    out[0] = v ? (double)(v->mapped * v->gran) : 0, out[1] = v ? (double)(v->peak * v->gran) : 0;
    if (v) v->peak = v->mapped;
}

size_t train_zero_device_mapped(train_zero *z, double out[4]) {
    zero_vm *v[2] = {z->vm_params, z->vm_grads};
    for (int k = 0; k < 2; k++) {
        out[2 * k] = v[k] ? (double)(v[k]->mapped * v[k]->gran) : 0;
        out[2 * k + 1] = v[k] ? (double)(v[k]->peak * v[k]->gran) : 0;
        if (v[k]) v[k]->peak = v[k]->mapped;
    }
    return z->vm_params ? z->vm_params->gran : 0;
}

size_t train_zero_device_resident(const train_zero *z) {
    size_t n = 0;
    const zero_vm *v[2] = {z->vm_params, z->vm_b16};
    for (int k = 0; k < 2; k++) n += v[k] ? v[k]->mapped * v[k]->gran : 0;
    return n + (z->master ? z->master_n * sizeof(float) : 0); /* in bf16: the fp32 master slices too */
}

/* Unit u's slice of the policy `pz` (its fp32 values, current after the step) into `dst` (device
 * memory, hi - lo floats): the host's masters with offload_optimizer, the device masters of a layer in
 * bf16, else the device's parameters; a unit kept whole (the final norm) from the device's, gathered. */
static ctrl_status policy_slice(train_zero *pz, int u, size_t lo, size_t hi, float *dst) {
    const float *dev = ctrl_model_device_params(pz->model) + pz->first;
    if (pz->units[u].layer == -1) return pz->dev->copy(dst, dev + lo, (hi - lo) * sizeof(float));
    if (pz->host_step)
        return pz->dev->to_device(dst, ctrl_model_params(pz->model, NULL) + pz->first + lo,
                                  (hi - lo) * sizeof(float));
    size_t a, b;
    const float *master = master_of(pz, u, &a, &b);
    return pz->dev->copy(dst, master ? master : dev + lo, (hi - lo) * sizeof(float));
}

ctrl_status train_zero_device_mix(train_zero *z, train_zero *pz, float alpha) {
    if (!pz || !pz->dev || pz->n_units != z->n_units || pz->b16 != z->b16)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "sync_ref_model: the zero3 reference is not cut as the policy");
    size_t most = 1;
    for (int u = 0; u < z->n_units; u++) {
        size_t lo = z->units[u].a, hi = z->units[u].b;
        if (z->units[u].layer != -1) train_zero_slice(z, u, z->rank, &lo, &hi);
        if (pz->units[u].a != z->units[u].a || pz->units[u].b != z->units[u].b)
            return ctrl_error_set(CTRL_ERR_RUNTIME, "sync_ref_model: the zero3 reference's unit %d differs",
                                  u);
        if (hi - lo > most) most = hi - lo;
    }
    float *tmp = NULL;
    ctrl_status st = z->dev->alloc((void **)&tmp, most * sizeof(float));
    float *ref = ctrl_model_device_params(z->model);
    for (int u = 0; u < z->n_units && st == CTRL_OK; u++) {
        size_t lo = z->units[u].a, hi = z->units[u].b;
        if (z->units[u].layer != -1) train_zero_slice(z, u, z->rank, &lo, &hi);
        if (hi <= lo) continue;
        size_t a, b;
        float *master = z->units[u].layer == -1 ? NULL : master_of(z, u, &a, &b);
        float *dst = master ? master : ref + lo; /* a layer in bf16: its fp32 master slice */
        const int64_t n = (int64_t)(hi - lo);
        /* reference * (1 - alpha) + policy * alpha, each product rounded to fp32 as the host's mix */
        st = policy_slice(pz, u, lo, hi, tmp);
        if (st == CTRL_OK) st = z->dev->scale(tmp, alpha, n);
        if (st == CTRL_OK) st = z->dev->scale(dst, 1.0f - alpha, n);
        if (st == CTRL_OK) st = z->dev->residual_forward(dst, dst, tmp, n);
        if (st == CTRL_OK && master) st = refresh_b16(z, u); /* the bf16 slice the next gathers send */
    }
    if (st == CTRL_OK) st = z->dev->synchronize();
    if (tmp) z->dev->free(tmp);
    ctrl_model_device_weights_changed(z->model);
    return st;
}

ctrl_status train_zero_device_keep(train_zero *z) {
    if (!z->n_kept) return CTRL_OK;
    ctrl_status st =
        z->dev->alloc((void **)&z->kept_buf, z->kept_n * sizeof(float)); /* the gathers' buffer */
    for (int i = 0; i < z->n_kept && st == CTRL_OK; i++) { /* whole on every rank: mapped for the run */
        const train_zero_unit k = z->kept[i].u;
        st = vm_pin(z->vm_params, k.a * sizeof(float), k.b * sizeof(float));
        if (st == CTRL_OK && train_zero_in_b16(z, k)) /* and a layer's bf16 values (a matrix's are read) */
            st = vm_pin(z->vm_b16, k.a * sizeof(uint16_t), k.b * sizeof(uint16_t));
    }
    return st == CTRL_OK ? train_zero_gather_kept(z, 1) : st; /* (each rank holds its slices of them) */
}
