/* offload_optimizer with its host step overlapped with the next step's compute, exactly (no stale
 * weight is ever read; DeepSpeed's ZeRO-Offload "one-step delayed update" is not done).
 *
 * After the backward the gradients are on the host (clipped by the global norm first: the norm needs
 * every gradient, so the host step starts only once the backward has ended, with or without
 * clipping). The host step then runs on a thread of its own, one unit at a time in the order the
 * next forward reads them: unit 0 the parameters before the layers (the embeddings, and anything
 * that is not a layer's nor the head's), unit 1 + l layer l, the last unit the final norm and the
 * head (lm_head, score). The thread that queues the device's work (the main one) uploads each unit
 * as soon as it is stepped, on an upload stream of its own (backend.h's upload_copy: no wait for the
 * compute stream, whose queued work never reads those parameters then), one event per unit; the
 * compute stream waits for exactly the unit it needs next: the step returns once unit 0 is stepped
 * and its upload waited for (the embedding lookup is the forward's first read), layer l's forward
 * waits for unit 1 + l (the before_forward hook), the final norm and head for the last (after the
 * last layer's forward). So the host steps layers 0..L-1 and the head while the device runs the
 * next step's embedding and the layers before them, and the device never waits for more than the
 * unit it needs. The updates are the optimizer's own per group (step_groups), so the weights are the
 * non-overlapped path's bit for bit.
 *
 * Where the host's parameters or optimizer state are read, or the model runs other than through its
 * layer hooks (a checkpoint, an evaluation, generation, the end of training), the caller drains
 * first (train_offload_drain). With gradient accumulation only the first micro-batch's forward
 * waits (the others find every unit there).
 *
 * Under ZeRO-3 (zero3 with offload_optimizer on a device: train_offload_create given the train_zero)
 * the units are ZeRO's (the embeddings, each layer, the final norm, an untied head: parameter order,
 * the forward's), the host steps this rank's slice of each, its upload is ZeRO's (the slice into the
 * device's parameters, or in bf16 into its fp32 master staging, train_zero_device_upload_unit) and
 * what follows the wait too (the bf16 slice refreshed, a unit kept whole all-gathered, the unit's
 * gradient sums zeroed for the backward: train_zero_device_unit_ready); ZeRO's own hooks call
 * train_offload_need before a unit's gather (its slice must be the stepped one on every rank before
 * any rank gathers it) and for every unit after the last layer's forward (the final norm is read
 * next). */
#include "train/offload_overlap.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/log.h>
#include <ctrl/memory.h>

#include "device/backend.h"
#include "train/zero.h"

struct ctrl_memory {
    train_offload *o;
};

struct train_offload {
    ctrl_model *m;
    const ctrl_backend_ops *be;
    const ctrl_optimizer_ops *oo;
    ctrl_optimizer *opt;
    const ctrl_param_group *groups;
    int n_groups, n_layers, n_units;
    int *unit;         /* per group: the unit it belongs to */
    float *host, *dev; /* the parameters' bases (host and device) */
    struct ctrl_memory hooks;
    /* the host thread's progress, under mu: units stepped, its error, whether the next forward began */
    pthread_t thread;
    int running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stepped, began, release;
    ctrl_status wst;
    char werr[512];
    int hold; /* tests: the host waits for the next forward to begin before unit 1 */
    double lr;
    int64_t step;
    /* the main thread's: a round in flight, units whose uploads are queued, waited for per unit */
    int active, queued;
    unsigned char *waited;
    long steps, waits, late;
    /* the host's parameters and gradients page-locked (host_register) for the copies: 1 each */
    int pinned_params, pinned_grads;
    train_zero *z; /* ZeRO-3's units, uploads and hooks (NULL: the model's layers, its hooks) */
};

/* unit of view `name`: 1 + its layer, n_units - 1 the final norm and head, else 0 */
static int unit_of(const char *name, int n_layers) {
    const char *p = strstr(name, "layers.");
    if (p && p[7] >= '0' && p[7] <= '9') {
        char *end;
        const long l = strtol(p + 7, &end, 10);
        if (*end == '.' && l >= 0 && l < n_layers) return 1 + (int)l;
    }
    if (!strcmp(name, "model.norm.weight") || !strcmp(name, "model.norm.bias") ||
        !strcmp(name, "lm_head.weight") || !strcmp(name, "score.weight") || !strcmp(name, "score.bias"))
        return n_layers + 1;
    return 0;
}

static ctrl_status step_unit(train_offload *o, int u) {
    for (int g = 0; g < o->n_groups; g++) {
        if (o->unit[g] != u) continue;
        int g1 = g + 1;
        while (g1 < o->n_groups && o->unit[g1] == u) g1++;
        ctrl_status st = o->oo->step_groups(o->opt, o->groups, o->n_groups, o->lr, o->step, g, g1);
        if (st != CTRL_OK) return st;
        g = g1 - 1;
    }
    return CTRL_OK;
}

static void *host_step(void *arg) {
    train_offload *o = arg;
    for (int u = 0; u < o->n_units; u++) {
        pthread_mutex_lock(&o->mu);
        while (u == 1 && o->hold && !o->began && !o->release) pthread_cond_wait(&o->cv, &o->mu);
        const int began = o->began;
        pthread_mutex_unlock(&o->mu);
        const ctrl_status st = step_unit(o, u);
        pthread_mutex_lock(&o->mu);
        if (st != CTRL_OK) {
            o->wst = st;
            snprintf(o->werr, sizeof o->werr, "%s", ctrl_error_message());
        } else {
            o->stepped = u + 1;
            o->late += began && u > 0;
        }
        pthread_cond_broadcast(&o->cv);
        pthread_mutex_unlock(&o->mu);
        if (st != CTRL_OK) break;
    }
    return NULL;
}

/* For each run of contiguous parameters of unit u: fn(o, offset, floats). */
static ctrl_status each_range(train_offload *o, int u,
                              ctrl_status (*fn)(train_offload *, size_t, size_t, int)) {
    for (int g = 0; g < o->n_groups; g++) {
        if (o->unit[g] != u) continue;
        const size_t off = (size_t)(o->groups[g].param - o->host);
        size_t n = (size_t)o->groups[g].numel;
        while (g + 1 < o->n_groups && o->unit[g + 1] == u && o->groups[g + 1].param == o->host + off + n)
            n += (size_t)o->groups[++g].numel;
        ctrl_status st = fn(o, off, n, u);
        if (st != CTRL_OK) return st;
    }
    return CTRL_OK;
}

static ctrl_status upload(train_offload *o, size_t off, size_t n, int u) {
    return o->be->upload_copy(o->dev + off, o->host + off, n * sizeof(float), u);
}

static ctrl_status changed(train_offload *o, size_t off, size_t n, int u) {
    (void)u; /* bf16 compute: that part of the model's bf16 copy, converted on the compute stream */
    return ctrl_model_params_range_changed(o->m, off, n);
}

/* The uploads of every unit stepped so far queued (the host does not wait). */
static ctrl_status pump(train_offload *o) {
    pthread_mutex_lock(&o->mu);
    const int n = o->stepped;
    pthread_mutex_unlock(&o->mu);
    for (; o->queued < n; o->queued++) {
        ctrl_status st =
            o->z ? train_zero_device_upload_unit(o->z, o->queued) : each_range(o, o->queued, upload);
        if (st != CTRL_OK) return st;
    }
    return CTRL_OK;
}

/* The compute stream's next work waits for unit u's upload (the host first for its step). */
static ctrl_status need(train_offload *o, int u) {
    if (u < 0 || u >= o->n_units) return ctrl_error_set(CTRL_ERR_RUNTIME, "offload_optimizer: no unit %d", u);
    if (!o->active || o->waited[u]) return CTRL_OK;
    pthread_mutex_lock(&o->mu);
    while (o->stepped <= u && o->wst == CTRL_OK) pthread_cond_wait(&o->cv, &o->mu);
    const ctrl_status wst = o->wst;
    pthread_mutex_unlock(&o->mu);
    if (wst != CTRL_OK && o->stepped <= u)
        return ctrl_error_set(wst, "offload_optimizer: the host step: %s", o->werr);
    ctrl_status st = pump(o);
    if (st == CTRL_OK) st = o->be->upload_wait(u);
    if (st == CTRL_OK) st = o->z ? train_zero_device_unit_ready(o->z, u) : each_range(o, u, changed);
    if (st == CTRL_OK) o->waited[u] = 1, o->waits++;
    return st;
}

/* The next forward began (the host's later unit steps count as overlapped). */
static void began(train_offload *o) {
    pthread_mutex_lock(&o->mu);
    o->began = 1;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

ctrl_status train_offload_need(train_offload *o, int u) {
    if (!o || !o->active) return CTRL_OK;
    if (u != 0) began(o); /* (unit 0 is the step's own wait: the embeddings) */
    ctrl_status st = pump(o);
    for (int k = u < 0 ? 0 : u; st == CTRL_OK && k < (u < 0 ? o->n_units : u + 1); k++) st = need(o, k);
    return st;
}

int train_offload_active(const train_offload *o) { return o && o->active; }

/* The hooks get the layers' indices 0 .. n_layers - 1; any other (a model that also calls the
 * sharding hooks around its embeddings and head with slots n_layers, n_layers + 1) needs nothing
 * more: the embeddings were waited for when the step returned, the final norm and head after the
 * last layer's forward. */
static ctrl_status before_forward(ctrl_memory *h, int layer) {
    train_offload *o = h->o;
    if (!o->active || layer < 0 || layer >= o->n_layers) return CTRL_OK;
    if (layer == 0) began(o);
    ctrl_status st = pump(o);
    return st == CTRL_OK ? need(o, 1 + layer) : st;
}

static ctrl_status after_forward(ctrl_memory *h, int layer) {
    train_offload *o = h->o;
    if (!o->active || layer != o->n_layers - 1) return o->active ? pump(o) : CTRL_OK; /* others too */
    return need(o, o->n_units - 1); /* the final norm and the head come next */
}

static const ctrl_memory_ops hook_ops = {
    .size = sizeof(ctrl_memory_ops),
    .before_forward = before_forward,
    .after_forward = after_forward,
};

/* The host's parameters (the uploads' sources) and gradients (the copy back's destination)
 * page-locked where the backend can: the uploads then run beside the kernels without the driver
 * staging them through a buffer of its own on the thread that queues them, the gradients come back
 * at full speed. Pageable where it cannot (said once). */
static void pin(train_offload *o) {
    if (!ctrl_backend_has(o->be, host_register) || !ctrl_backend_has(o->be, host_unregister)) return;
    size_t np = 0, ng = 0;
    ctrl_model_params(o->m, &np);
    float *g = ctrl_model_grads(o->m, &ng);
    o->pinned_params = np && o->be->host_register(o->host, np * sizeof(float)) == CTRL_OK;
    if (!o->pinned_params)
        CTRL_WARN("offload_optimizer: host parameters not page-locked: %s", ctrl_error_message());
    o->pinned_grads = ng && o->be->host_register(g, ng * sizeof(float)) == CTRL_OK;
    if (!o->pinned_grads)
        CTRL_WARN("offload_optimizer: host gradients not page-locked: %s", ctrl_error_message());
}

int train_offload_pinned(const train_offload *o) { return o->pinned_params && o->pinned_grads; }

/* ZeRO-3's unit of a group (this rank's slice of a view): the unit its parameters lie in. */
static int zero_unit_of(const train_zero *z, size_t off) {
    for (int u = 0; u < z->n_units; u++)
        if (off >= z->first + z->units[u].a && off < z->first + z->units[u].b) return u;
    return 0;
}

ctrl_status train_offload_create(train_offload **out, const char **why, ctrl_model *m,
                                 const ctrl_optimizer_ops *oo, ctrl_optimizer *opt,
                                 const ctrl_param_group *groups, int n_groups, train_zero *z) {
    *out = NULL, *why = NULL;
    const ctrl_backend_ops *be = ctrl_model_backend(m);
    const int n_layers = ctrl_model_cfg(m)->n_layers;
    const int n_units = z ? z->n_units : n_layers + 2;
    if (!ctrl_backend_has(be, upload_copy) || !ctrl_backend_has(be, upload_wait))
        *why = "the backend has no upload stream";
    else if (oo->size < offsetof(ctrl_optimizer_ops, step_groups) + sizeof oo->step_groups ||
             !oo->step_groups)
        *why = "the optimizer cannot step one layer at a time (no step_groups)";
    else if (ctrl_model_lora(m))
        *why = "a LoRA model (its adapters are stepped whole)";
    else if (n_units > CTRL_UPLOAD_EVENTS)
        *why = "more layers than the upload stream has events";
    else if (z && z->n_kept)
        *why = "zero3's persistent tensors (stage3_param_persistence_threshold) are all-gathered together "
               "after the whole step";
    if (*why) return CTRL_OK;
    train_offload *o = calloc(1, sizeof *o);
    if (!o) return ctrl_error_set(CTRL_ERR_NOMEM, "offload_optimizer: out of memory");
    o->m = m, o->be = be, o->oo = oo, o->opt = opt, o->groups = groups, o->n_groups = n_groups;
    o->n_layers = n_layers, o->n_units = n_units, o->z = z;
    o->host = ctrl_model_params(m, NULL), o->dev = ctrl_model_device_params(m);
    o->hooks.o = o;
    o->hold = getenv("CTRL_TEST_OFFLOAD_HOLD") != NULL;
    o->unit = calloc((size_t)(n_groups ? n_groups : 1), sizeof *o->unit);
    o->waited = calloc((size_t)o->n_units, 1);
    if (!o->unit || !o->waited) {
        free(o->unit), free(o->waited), free(o);
        return ctrl_error_set(CTRL_ERR_NOMEM, "offload_optimizer: out of memory");
    }
    /* the groups are the views from the trainable offset on, in order (train_param_groups) */
    const size_t first = ctrl_model_trainable_offset(m);
    for (int i = 0, g = 0; !z && i < ctrl_model_view_count(m) && g < n_groups; i++) {
        const ctrl_param_view *v = ctrl_model_view(m, i);
        if (v->offset < first) continue;
        o->unit[g++] = unit_of(v->name, n_layers);
    }
    /* (ZeRO-3: its slices of the views, by where they lie) */
    for (int g = 0; z && g < n_groups; g++) o->unit[g] = zero_unit_of(z, (size_t)(groups[g].param - o->host));
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    /* (ZeRO-3: the host's parameters are the whole model's address range, this rank's slices alone
     * backed; page-locking it would back it all -- copies from pageable memory, and ZeRO's hooks) */
    if (!z) pin(o);
    ctrl_status st = z ? CTRL_OK : ctrl_model_set_sharding(m, &hook_ops, &o->hooks);
    if (st != CTRL_OK) {
        train_offload_destroy(o);
        return st;
    }
    *out = o;
    return CTRL_OK;
}

ctrl_status train_offload_launch(train_offload *o, double lr, int64_t step) {
    ctrl_status st = train_offload_drain(o); /* nothing is in flight by now: cheap */
    if (st != CTRL_OK) return st;
    o->lr = lr, o->step = step;
    o->stepped = 0, o->began = 0, o->release = 0, o->wst = CTRL_OK, o->werr[0] = 0;
    o->queued = 0;
    memset(o->waited, 0, (size_t)o->n_units);
    if (pthread_create(&o->thread, NULL, host_step, o) != 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "offload_optimizer: cannot start the host step's thread");
    o->running = 1, o->active = 1;
    o->steps++;
    return need(o, 0); /* the embeddings: the next forward's first read */
}

ctrl_status train_offload_drain(train_offload *o) {
    if (!o || (!o->running && !o->active)) return CTRL_OK;
    pthread_mutex_lock(&o->mu);
    o->release = 1; /* a held host step goes on */
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    if (o->running) pthread_join(o->thread, NULL);
    o->running = 0;
    ctrl_status st = CTRL_OK;
    for (int u = 0; u < o->n_units && st == CTRL_OK; u++) st = need(o, u);
    const ctrl_status w = o->be->upload_wait(-1); /* the host's sources free again */
    o->active = 0;
    return st != CTRL_OK ? st : w;
}

void train_offload_report(const train_offload *o) {
    if (!o || !o->steps) return;
    CTRL_INFO(
        "offload_optimizer: the host step overlapped with the next step's compute in %ld steps of %d units "
        "(the embeddings, %d layers, the final norm and head), each uploaded on its own stream as soon "
        "as stepped; the device waited for %ld uploads, each only where its unit is read; %ld unit steps "
        "ran on the host after the next forward had begun",
        o->steps, o->n_units, o->n_layers, o->waits, o->late);
}

void train_offload_counts(const train_offload *o, long *steps, long *waits, long *late) {
    *steps = o->steps, *waits = o->waits, *late = o->late;
}

void train_offload_destroy(train_offload *o) {
    if (!o) return;
    ctrl_status st = train_offload_drain(o);
    (void)st; /* at teardown: an error was reported where it happened */
    if (!o->z) ctrl_model_set_sharding(o->m, NULL, NULL);
    if (o->pinned_params) o->be->host_unregister(o->host);
    if (o->pinned_grads) o->be->host_unregister(ctrl_model_grads(o->m, NULL));
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    free(o->unit), free(o->waited), free(o);
}
