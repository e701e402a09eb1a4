/* ZeRO-3's persistent parameters ([memory] stage3_param_persistence_threshold, see zero.h): the views
 * of fewer elements than the threshold inside the sliced ranges (a layer's norm weights and biases,
 * and at a large threshold whole layers, the embeddings of a small vocabulary) stay whole on every rank,
 * as DeepSpeed keeps its persistent parameters (ds_persist): never released after a use nor gathered
 * before one -- a slot's gathers fetch the runs of its other views only (zero_layers.c). Their gradients
 * are reduce-scattered with their unit's and their optimizer state is sliced as before (the units and
 * their cut do not change, so a checkpoint resumes with any threshold); after each step the ranks'
 * updated slices of every persistent view are all-gathered in one collective (train_zero_gather_kept). */
#include <stdlib.h>
#include <string.h>

#include <ctrl/log.h>

#include "collective/collective.h"
#include "device/backend.h"
#include "train/zero.h"

void train_zero_set_persistence(train_zero *z, size_t threshold) {
    z->persist = z->stage >= 3 ? threshold : 0;
}

void train_zero_gather_counts(train_zero *z, long *gathers, long *views, double *floats) {
    *gathers = z->gathers, *views = z->gather_views, *floats = z->gather_floats;
    z->gathers = z->gather_views = 0, z->gather_floats = 0;
}

/* A run [a, b) of the sliced range r appended (a < b; its layer: the range's, -2 outside the layers). */
static void add_run(train_zero *z, size_t a, size_t b, train_zero_unit r) {
    if (a < b)
        z->runs[z->n_runs++] = (train_zero_run){{a, b, r.layer}, r}; /* (the range's layer: -2 outside) */
}

ctrl_status train_zero_make_runs(train_zero *z, ctrl_model *m) {
    const int n_views = ctrl_model_view_count(m);
    const size_t cap = (size_t)n_views + 2 * (size_t)z->n_slots + 1;
    if (!(z->runs = calloc(cap, sizeof *z->runs)) ||
        !(z->run_at = calloc((size_t)z->n_slots + 1, sizeof *z->run_at)) ||
        !(z->run_views = calloc((size_t)z->n_slots + 1, sizeof *z->run_views)) ||
        !(z->kept = calloc((size_t)n_views + 1, sizeof *z->kept)) ||
        !(z->kept_counts = calloc((size_t)z->size, sizeof *z->kept_counts)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "zero3: out of memory");
    for (int l = 0; l < z->n_slots; l++) {
        z->run_at[l] = z->n_runs;
        train_zero_unit r[2];
        for (int k = 0, n = train_zero_layer_ranges(z, l, r); k < n; k++) {
            size_t at = r[k].a; /* the start of the open run */
            for (int i = 0; i < n_views; i++) {
                const ctrl_param_view *v = ctrl_model_view(m, i);
                const size_t a = (size_t)v->offset, b = a + (size_t)v->numel;
                if (a < r[k].a || b > r[k].b) continue;
                if (a < at)
                    return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                                          "[memory] stage3_param_persistence_threshold: %s is not after the "
                                          "views before it in the parameters",
                                          v->name);
                if ((size_t)v->numel >= z->persist) {
                    z->run_views[l]++;
                    continue;
                }
                add_run(z, at, a, r[k]); /* the run before it ends */
                at = b;
                z->n_persist++, z->persist_bytes += (b - a) * sizeof(float);
                z->kept[z->n_kept++] = (train_zero_run){{a, b, r[k].layer}, r[k]};
                z->kept_n += b - a;
            }
            add_run(z, at, r[k].b, r[k]);
        }
    }
    z->run_at[z->n_slots] = z->n_runs;
    /* (a CUDA model's in device memory: train_zero_device_keep) */
    if (z->kept_n && !z->dev && !z->kept_buf && !(z->kept_buf = malloc(z->kept_n * sizeof *z->kept_buf)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "zero3: out of memory for %zu persistent floats", z->kept_n);
    return CTRL_OK;
}

/* The persistent pieces gathered: those of the trainable units, or (all) the frozen base's too. */
static int wanted(const train_zero *z, const train_zero_run *k, int all) {
    return all || k->of.a >= z->first;
}

/* n floats from src to dst: host memory, or a CUDA model's (device memory, kept_buf there too). */
static ctrl_status put(const train_zero *z, float *dst, const float *src, size_t n) {
    if (z->dev) return n ? z->dev->copy(dst, src, n * sizeof(float)) : CTRL_OK;
    memcpy(dst, src, n * sizeof(float));
    return CTRL_OK;
}

ctrl_status train_zero_gather_kept(train_zero *z, int all) {
    if (!z->n_kept || (z->dev && !z->vm_params)) return CTRL_OK;
    /* a CUDA model's zero3: on the device, over NCCL (kept_buf in device memory, train_zero_device_keep) */
    float *p = z->dev ? ctrl_model_device_params(z->model) : ctrl_model_params(z->model, NULL);
    size_t total = 0, mine = 0;
    long views = 0;
    for (int r = 0; r < z->size; r++) { /* rank r's block: its slices of the pieces, in their order */
        size_t n = 0, lo, hi;
        for (int i = 0; i < z->n_kept; i++)
            if (wanted(z, &z->kept[i], all)) train_zero_run_cut(z, &z->kept[i], r, &lo, &hi), n += hi - lo;
        if (r == z->rank) mine = total;
        z->kept_counts[r] = (int)n, total += n;
    }
    ctrl_status st = CTRL_OK;
    for (int i = 0; i < z->n_kept && st == CTRL_OK; i++) {
        size_t lo, hi;
        if (!wanted(z, &z->kept[i], all)) continue;
        views++;
        train_zero_run_cut(z, &z->kept[i], z->rank, &lo, &hi);
        /* a layer's in bf16 on a device: its bf16 values widened, as a gathered layer's (or its fp32
         * masters, fp32_gather) */
        st = train_zero_in_b16(z, z->kept[i].u)
                 ? train_zero_device_kept_part(z, z->kept[i].u, lo, hi, z->kept_buf + mine)
                 : put(z, z->kept_buf + mine, p + lo, hi - lo);
        mine += hi - lo;
    }
    if (st != CTRL_OK || !total) return st;
    st = z->dev ? ctrl_collective_device_allgather_f32(z->kept_buf, z->kept_counts)
                : ctrl_collective_allgather_f32(z->kept_buf, z->kept_counts);
    if (st != CTRL_OK) return st;
    size_t at = 0;
    for (int r = 0; r < z->size && st == CTRL_OK; r++)
        for (int i = 0; i < z->n_kept && st == CTRL_OK; i++) {
            size_t lo, hi;
            if (!wanted(z, &z->kept[i], all)) continue;
            train_zero_run_cut(z, &z->kept[i], r, &lo, &hi);
            st = put(z, p + lo, z->kept_buf + at, hi - lo), at += hi - lo;
        }
    for (int i = 0; z->b16 && i < z->n_kept && st == CTRL_OK; i++) /* whole: their bf16 values too */
        if (wanted(z, &z->kept[i], all) && train_zero_in_b16(z, z->kept[i].u))
            st = train_zero_device_kept_b16(z, z->kept[i].u);
    z->gathers++, z->gather_views += views, z->gather_floats += (double)total;
    return st;
}

ctrl_status train_zero_fp32_phase(train_zero *z, int on) {
    z->fp32_gather = on;
    return z->b16 ? train_zero_gather_kept(z, 0) : CTRL_OK;
}
