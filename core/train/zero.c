/* ZeRO stages 1 to 3 in the step loop (see zero.h); stage 3's layer hooks are zero_layers.c. */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/log.h>

#include "collective/collective.h"
#include "cpu/cpu_ops.h"
#include "device/backend.h"
#include "model/lora.h"
#include "model/safetensors.h"
#include "train/checkpoint.h"
#include "train/offload_overlap.h"
#include "train/zero.h"

void train_zero_cut(const train_zero *z, train_zero_unit u, int r, size_t *lo, size_t *hi) {
    const size_t len = u.b - u.a, piece = (len + (size_t)z->size - 1) / (size_t)z->size;
    const size_t at = piece * (size_t)r;
    *lo = u.a + (at < len ? at : len);
    *hi = u.a + (at + piece < len ? at + piece : len);
}

void train_zero_slice(const train_zero *z, int u, int r, size_t *lo, size_t *hi) {
    train_zero_cut(z, z->units[u], r, lo, hi);
}

const int *train_zero_cut_counts(train_zero *z, train_zero_unit u) {
    for (int r = 0; r < z->size; r++) {
        size_t lo, hi;
        train_zero_cut(z, u, r, &lo, &hi);
        z->counts[r] = (int)(hi - lo);
    }
    return z->counts;
}

void train_zero_run_cut(const train_zero *z, const train_zero_run *run, int r, size_t *lo, size_t *hi) {
    train_zero_cut(z, run->of, r, lo, hi);
    const size_t a = run->u.a, b = run->u.b;
    *lo = *lo < a ? a : *lo > b ? b : *lo;
    *hi = *hi < *lo ? *lo : *hi > b ? b : *hi;
}

const int *train_zero_run_counts(train_zero *z, const train_zero_run *run) {
    for (int r = 0; r < z->size; r++) {
        size_t lo, hi;
        train_zero_run_cut(z, run, r, &lo, &hi);
        z->counts[r] = (int)(hi - lo);
    }
    return z->counts;
}

const int *train_zero_counts(train_zero *z, int u) { return train_zero_cut_counts(z, z->units[u]); }

/* The layer a view belongs to ("model.layers.L.*"), else -1. */
static int view_layer(const ctrl_param_view *v) {
    int l = -1, n = 0;
    return sscanf(v->name, "model.layers.%d.%n", &l, &n) == 1 && n > 0 ? l : -1;
}

int train_zero_outer_index(const ctrl_param_view *v) {
    /* tests and benchmarks: kept whole as before (CTRL_TEST_ZERO3_WHOLE_EMBED), to compare */
    if (getenv("CTRL_TEST_ZERO3_WHOLE_EMBED")) return -1;
    if (!strcmp(v->name, "model.embed_tokens.weight")) return 0;
    if (!strcmp(v->name, "lm_head.weight")) return 1;
    return -1;
}

/* Stage 3: the slot of a view outside the layers that is sliced (train_zero_outer_index: the
 * embeddings n_layers, an untied LM head n_layers + 1), else -1. */
static int outer_slot(const train_zero *z, const ctrl_param_view *v, int n_layers) {
    const int o = z->stage >= 3 ? train_zero_outer_index(v) : -1;
    return o < 0 ? -1 : n_layers + o;
}

/* The partitioned stages' units (2 and 3 on the CPU): the runs of consecutive views of one layer
 * (or of none), in trainable floats (the views below ctrl_model_trainable_offset, LoRA's frozen
 * base, left out). */
static ctrl_status layer_units(train_zero *z, ctrl_model *m) {
    const int n_views = ctrl_model_view_count(m), n_layers = ctrl_model_cfg(m)->n_layers;
    const struct ctrl_lora_config *lora = ctrl_model_lora(m);
    const int nf4 = lora && lora->nf4;
    z->n_slots = n_layers + (z->stage >= 3 ? 2 : 0);
    const size_t ns = (size_t)(z->n_slots > 0 ? z->n_slots : 1);
    if (!(z->units = calloc((size_t)n_views + 1, sizeof *z->units)) ||
        !(z->layer_unit = malloc(sizeof(int) * ns)) || !(z->closes = calloc(ns, 1)) ||
        !(z->frozen = calloc(ns, sizeof *z->frozen)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "zero: out of memory");
    for (int l = 0; l < z->n_slots; l++) z->layer_unit[l] = -1, z->frozen[l] = (train_zero_unit){0, 0, -1};
    for (int i = 0; i < n_views; i++) {
        const ctrl_param_view *v = ctrl_model_view(m, i);
        const int slot = outer_slot(z, v, n_layers);
        if ((size_t)v->offset < z->first) { /* LoRA's frozen base: stage 3 slices each layer's too */
            int l = view_layer(v);
            if (l >= n_layers) l = -1;
            /* QLoRA: the projections are in the NF4 store (sliced by zero_nf4.c; their views share
             * layer 0's fp32 slot), the rest of a layer's base (norms, biases) a few floats kept whole */
            if (l >= 0 && nf4) continue;
            /* and the frozen embeddings, an untied head: their own slots */
            if (l < 0) l = slot;
            if (z->stage < 3 || l < 0) continue;
            train_zero_unit *f = &z->frozen[l];
            const size_t end = (size_t)v->offset + (size_t)v->numel;
            if (f->layer < 0) *f = (train_zero_unit){(size_t)v->offset, end, l};
            if (end > f->b) f->b = end;
            if ((size_t)v->offset < f->a) f->a = (size_t)v->offset;
            continue;
        }
        const size_t at = (size_t)v->offset - z->first;
        int layer = view_layer(v);
        if (layer >= n_layers) layer = -1;
        if (layer < 0 && slot >= 0) layer = TRAIN_ZERO_OUTER; /* a unit of its own, in its slot */
        if (z->n_units && z->units[z->n_units - 1].layer == layer && layer != TRAIN_ZERO_OUTER) continue;
        if (z->n_units) z->units[z->n_units - 1].b = at;
        z->units[z->n_units++] = (train_zero_unit){at, z->total, layer};
        if (slot >= 0) z->layer_unit[slot] = z->n_units - 1;
        if (layer >= 0 && layer < n_layers) {
            if (z->layer_unit[layer] >= 0)
                return ctrl_error_set(
                    CTRL_ERR_UNSUPPORTED,
                    "[memory] strategies = zero%d: layer %d's parameters are not consecutive", z->stage,
                    layer);
            z->layer_unit[layer] = z->n_units - 1;
        }
    }
    return CTRL_OK;
}

/* The buckets (reduce_bucket_size): consecutive layers, from the last (the backward's first) down,
 * at most `bucket` floats together (DeepSpeed reduces its bucket before a gradient that would
 * overflow it; a layer larger than a bucket is one alone); closes[l] marks the layer whose backward completes
 * one. Stage 2 merges each bucket's units into one (one reduce-scatter, slices cut over the bucket); stage 3
 * keeps a unit per layer (what a gather fetches) and reduce-scatters each when the bucket completes. A bucket
 * never spans a unit outside the layers. */
static void make_buckets(train_zero *z, int n_layers, size_t bucket) {
    size_t held = 0;
    int prev = -1; /* the unit of the last layer taken into the open bucket */
    for (int l = n_layers - 1; l >= 0; l--) {
        const int u = z->layer_unit[l];
        if (u < 0) continue;
        const size_t len = z->units[u].b - z->units[u].a;
        if (prev >= 0 && (u != prev - 1 || held + len > bucket)) { /* the open bucket ends above this layer */
            for (int k = l + 1; k < n_layers; k++)
                if (z->layer_unit[k] == prev) z->closes[k] = 1;
            held = 0;
        }
        held += len, prev = u;
    }
    for (int l = 0; l < n_layers && prev >= 0; l++)
        if (z->layer_unit[l] == prev) z->closes[l] = 1;
    if (z->stage != 2) return;
    /* stage 2: a bucket's units as one, each layer mapped to it */
    int n = 0;
    for (int u = 0; u < z->n_units; u++) {
        const int layer = z->units[u].layer;
        /* the bucket's lowest layer, which closes it, starts it in the buffer */
        if (n > 0 && layer >= 0 && z->units[n - 1].layer >= 0 && !z->closes[layer])
            z->units[n - 1].b = z->units[u].b;
        else
            z->units[n++] = z->units[u];
        if (layer >= 0) z->layer_unit[layer] = n - 1;
    }
    z->n_units = n;
}

ctrl_status train_zero_init(train_zero *z, int stage, ctrl_model *m, size_t bucket, size_t prefetch,
                            int overlap, int host_step) {
    memset(z, 0, sizeof *z);
    if (stage <= 0) return CTRL_OK;
    z->stage = stage, z->rank = ctrl_collective_rank(), z->size = ctrl_collective_size(), z->model = m;
    z->bucket = bucket, z->prefetch = prefetch, z->overlap = overlap;
    ctrl_model_grads(m, &z->total);
    z->first = ctrl_model_trainable_offset(m);
    if (z->total > (size_t)INT_MAX)
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "[memory] strategies = zero%d: %zu trainable floats, more than MPI's int counts "
            "reach (2^31 - 1) in one collective",
            stage, z->total);
    if (!(z->counts = calloc((size_t)z->size, sizeof *z->counts)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "zero: out of memory");
    if (stage >= 3) {
        z->host_step = host_step && ctrl_model_device(m).type != CTRL_DEVICE_CPU; /* the step on the host */
    }
    /* stage 2 (on a CUDA model: on the device, zero_device.c), stage 3: the gradients partitioned
     * during the backward (zero_layers.c) */
    const int on_device = train_zero_wants_device(stage, m, host_step);
    z->partitioned = stage >= 3 || (stage == 2 && ctrl_model_device(m).type == CTRL_DEVICE_CPU) || on_device;
    if (!z->partitioned) {
        if (!(z->units = calloc(1, sizeof *z->units)))
            return ctrl_error_set(CTRL_ERR_NOMEM, "zero: out of memory");
        z->units[0] = (train_zero_unit){0, z->total, -1}, z->n_units = 1;
    } else {
        ctrl_status st = layer_units(z, m);
        if (st != CTRL_OK) return st;
        make_buckets(z, ctrl_model_cfg(m)->n_layers, bucket);
        size_t n = 0;
        if (!(z->acc_off = calloc((size_t)z->n_units, sizeof *z->acc_off)))
            return ctrl_error_set(CTRL_ERR_NOMEM, "zero: out of memory");
        for (int u = 0; u < z->n_units; u++) {
            size_t lo, hi;
            train_zero_slice(z, u, z->rank, &lo, &hi);
            z->acc_off[u] = n, n += hi - lo;
        }
        z->acc_n = n;
        if (on_device) {
            ctrl_status sd = stage >= 3 ? train_zero_device3_init(z, m) : train_zero_device_init(z, m);
            if (sd != CTRL_OK) return sd;
        } else if (!(z->acc = calloc(n ? n : 1, sizeof *z->acc)))
            return ctrl_error_set(CTRL_ERR_NOMEM, "zero%d: out of memory for %zu gradient floats", stage, n);
    }
    double least = 0; /* the fewest floats a rank steps */
    for (int u = 0; u < z->n_units; u++) least += train_zero_counts(z, u)[z->size - 1];
    if (least == 0)
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "[memory] strategies = zero%d: %zu trainable floats cannot be cut in %d non-empty "
            "slices (run fewer ranks, or without zero%d)",
            stage, z->total, z->size, stage);
    return stage >= 3 ? train_zero_nf4_init(z, m)
                      : CTRL_OK; /* QLoRA: the NF4 store sliced (a device's too) */
}

void train_zero_free(train_zero *z) {
    train_zero_device_free(z); /* a device's acc */
    train_zero_device3_free(z);
    train_zero_pool_free(z); /* the reused pages (what is lent stays where it is) */
    train_zero_nf4_free(z);
    free(z->counts), free(z->units), free(z->layer_unit), free(z->hooks), free(z->acc), free(z->acc_off);
    free(z->closes), free(z->frozen), free(z->skip), free(z->state), free(z->pending), free(z->hacc);
    z->hacc = NULL;
    free(z->flight_u), free(z->flight_h);
    free(z->runs), free(z->run_at), free(z->run_views), free(z->kept), free(z->kept_counts),
        free(z->kept_buf);
    z->runs = z->kept = NULL, z->run_at = z->run_views = z->kept_counts = NULL, z->kept_buf = NULL;
    z->frozen = NULL, z->skip = NULL, z->state = NULL, z->pending = NULL, z->flight_u = NULL,
    z->flight_h = NULL;
    z->counts = NULL, z->units = NULL, z->layer_unit = NULL, z->hooks = NULL, z->acc = NULL,
    z->acc_off = NULL, z->closes = NULL;
}

int train_zero_shard_groups(const train_zero *z, ctrl_model *m, ctrl_param_group *groups, int n) {
    float *grads = ctrl_model_grads(m, NULL);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        ctrl_param_group g = groups[i];
        const size_t a = (size_t)(g.grad - grads), b = a + (size_t)g.numel; /* in trainable floats */
        int u = 0;
        while (u + 1 < z->n_units && z->units[u].b <= a) u++; /* a group is inside one unit */
        size_t lo, hi;
        train_zero_slice(z, u, z->rank, &lo, &hi);
        const size_t slice_lo = lo;
        lo = a > lo ? a : lo, hi = b < hi ? b : hi;
        if (lo >= hi) continue;
        g.param += lo - a, g.grad += lo - a, g.numel = (int64_t)(hi - lo);
        if (z->partitioned) g.grad = z->acc + z->acc_off[u] + (lo - slice_lo); /* the slices' sums */
        groups[kept++] = g;
    }
    if (z->dev) train_zero_device_groups(z, m, groups, kept);
    return kept;
}

ctrl_status train_zero_reduce_grads(train_zero *z, ctrl_model *m, double *sum_sq) {
    *sum_sq = 0;
    /* on the device, reduced likewise (offload_optimizer: the sums then brought to the host) */
    if (z->dev) return train_zero_device_sum_squares(z, sum_sq);
    if (z->partitioned) { /* reduced bucket by bucket in the backward (zero_layers.c) */
        *sum_sq = ctrl_cpu_sum_squares(z->acc, (int64_t)z->acc_n);
        return ctrl_collective_allreduce_sum_f64(sum_sq, 1);
    }
    ctrl_status st = ctrl_model_grads_to_host(m); /* a CUDA model's: the step is the host's */
    float *g = ctrl_model_grads(m, NULL);
    if (st == CTRL_OK && z->stage == 1) st = ctrl_collective_allreduce_mean_f32(g, z->total);
    size_t lo, hi;
    train_zero_slice(z, 0, z->rank, &lo, &hi); /* one unit */
    if (st == CTRL_OK && z->stage >= 2)
        st = ctrl_collective_reduce_scatter_mean_f32(g, train_zero_counts(z, 0));
    *sum_sq = ctrl_cpu_sum_squares(g + lo, (int64_t)(hi - lo));
    return st == CTRL_OK ? ctrl_collective_allreduce_sum_f64(sum_sq, 1) : st;
}

ctrl_status train_zero_scale_grads(const train_zero *z, ctrl_model *m, float coef) {
    if (z->host_step) { /* zero3 on a CUDA model, offload_optimizer: the sums on the host */
        ctrl_cpu_scale(z->hacc, coef, (int64_t)z->acc_n);
        return CTRL_OK;
    }
    if (z->dev) return z->dev->scale(z->acc, coef, (int64_t)z->acc_n);
    if (z->partitioned) {
        ctrl_cpu_scale(z->acc, coef, (int64_t)z->acc_n);
        return CTRL_OK;
    }
    size_t lo, hi;
    train_zero_slice(z, 0, z->rank, &lo, &hi);
    ctrl_cpu_scale(ctrl_model_grads(m, NULL) + lo, coef, (int64_t)(hi - lo));
    return CTRL_OK;
}

uint64_t train_zero_layout(const train_zero *z) {
    if (!z->stage) return 0;
    uint64_t h = 14695981039346656037ull; /* FNV-1a over the ranks and the units' bounds */
    const uint64_t v0[2] = {(uint64_t)z->size, (uint64_t)z->n_units};
    for (int i = 0; i < 2 + 2 * z->n_units; i++) {
        uint64_t v = i < 2 ? v0[i] : i % 2 ? z->units[(i - 2) / 2].b : z->units[(i - 2) / 2].a;
        for (int k = 0; k < 8; k++, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
    }
    return h ? h : 1;
}

size_t train_zero_layer_bytes(const train_zero *z) {
    size_t n = 0;
    for (int u = 0; u < z->n_units; u++) n += z->units[u].layer != -1 ? z->units[u].b - z->units[u].a : 0;
    for (int l = 0; z->frozen && l < z->n_slots; l++) n += z->frozen[l].b - z->frozen[l].a;
    return n * sizeof(float) - z->persist_bytes;
}

ctrl_status train_zero_zero_grad(train_zero *z, ctrl_model *m) {
    z->gathers = z->gather_views = 0, z->gather_floats = 0; /* a step's gathers counted from here */
    if (!z->partitioned) return ctrl_model_zero_grad(m);
    /* the model's gradients are zeroed and released after each backward's reduction; the host step
     * overlapped: each unit's sums once it is ready (train_zero_device_unit_ready) */
    if (z->dev && train_offload_active(z->ov)) return CTRL_OK;
    if (z->dev) return z->dev->fill_zero(z->acc, (z->acc_n ? z->acc_n : 1) * sizeof(float));
    memset(z->acc, 0, sizeof(float) * z->acc_n);
    return CTRL_OK;
}

ctrl_status train_zero_gather_params(train_zero *z, ctrl_model *m) {
    if (z->dev) return train_zero_device_gather(z, m);
    float *p = ctrl_model_params(m, NULL) + z->first;
    ctrl_status st = CTRL_OK;
    for (int u = 0; u < z->n_units && st == CTRL_OK; u++) /* zero3's layers stay sliced */
        if (z->stage < 3 || z->units[u].layer == -1 || z->gathered) {
            st = ctrl_collective_allgather_f32(p + z->units[u].a, train_zero_counts(z, u));
            z->gathers++, z->gather_floats += (double)(z->units[u].b - z->units[u].a);
        }
    /* zero3: the persistent views' slices (whole already when every layer is) */
    if (st == CTRL_OK && z->stage >= 3 && !z->gathered) st = train_zero_gather_kept(z, 0);
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
        if (ops->state_get(opt, i, &name, &data, &numel) == CTRL_OK)
            bytes += (size_t)numel * ctrl_dtype_size(ctrl_optimizer_state_dtype(ops, opt, i));
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
    size_t lo, hi, stepped = 0;
    for (int u = 0; u < z->n_units; u++) train_zero_slice(z, u, 0, &lo, &hi), stepped += hi - lo;
    CTRL_INFO("zero%d: %d ranks, each steps %zu of %zu trainable floats; optimizer %s: at most %.0f bytes "
              "of state per rank, %.0f over the ranks",
              z->stage, z->size, stepped, z->total, optimizer, max, sum);
    return CTRL_OK;
}
/* What a rank sends rank 0 for each of its optimizer state buffers before the floats. */
typedef struct shard_header {
    char name[64];
    int64_t numel;
    int64_t dtype; /* ctrl_dtype of the elements (adamw_8bit's moments: CTRL_U8) */
} shard_header;

ctrl_status train_zero_send_state(const train_zero *z, const ctrl_optimizer_ops *ops, ctrl_optimizer *opt) {
    (void)z;
    const int64_t n = ops->state_count ? ops->state_count(opt) : 0;
    ctrl_status st = CTRL_OK;
    /* zero2 on a CUDA model: the device's state to the host copies state_get returns */
    if (ops->size >= offsetof(ctrl_optimizer_ops, state_sync) + sizeof ops->state_sync && ops->state_sync)
        st = ops->state_sync(opt, 0);
    if (st == CTRL_OK) st = ctrl_collective_send(&n, sizeof n, 0);
    for (int i = 0; i < n && st == CTRL_OK; i++) {
        const char *name;
        float *data;
        shard_header h = {{0}, 0, CTRL_F32};
        if ((st = ops->state_get(opt, i, &name, &data, &h.numel)) != CTRL_OK) break;
        snprintf(h.name, sizeof h.name, "%s", name);
        h.dtype = ctrl_optimizer_state_dtype(ops, opt, i);
        st = ctrl_collective_send(&h, sizeof h, 0);
        if (st == CTRL_OK) st = ctrl_collective_send(data, (size_t)h.numel * ctrl_dtype_size(h.dtype), 0);
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
        if (h.dtype != CTRL_F32 && h.dtype != CTRL_U8) {
            st = ctrl_error_set(CTRL_ERR_RUNTIME, "zero: rank %d's optimizer buffer %d has dtype %lld", rank,
                                i, (long long)h.dtype);
            break;
        }
        const size_t esz = ctrl_dtype_size((ctrl_dtype)h.dtype);
        if (h.numel < 0 || h.numel > (int64_t)1 << 40 ||
            !(data[i] = malloc((size_t)(h.numel ? h.numel : 1) * esz))) {
            st = ctrl_error_set(CTRL_ERR_NOMEM, "zero: rank %d's optimizer buffer %d (%lld elements)", rank,
                                i, (long long)h.numel);
            break;
        }
        st = ctrl_collective_recv(data[i], (size_t)h.numel * esz, rank);
        ctrl_checkpoint_state_key(names[i], sizeof names[i], i, h.name);
        t[i] = (ctrl_st_write){.name = names[i], .data = data[i], .ndim = 1, .shape = {h.numel}};
        if (h.dtype != CTRL_F32) t[i].raw = data[i], t[i].raw_dtype = (ctrl_dtype)h.dtype; /* as it is */
    }
    if (st == CTRL_OK) st = ctrl_safetensors_write(path, t, (int)n, CTRL_F32);
    for (int i = 0; data && i < n; i++) free(data[i]);
    free(data), free(t), free(names);
    return st;
}
