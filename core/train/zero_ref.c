/* DPO's and KTO's live reference under ZeRO-3 on several ranks (zero_ref.h, issue 19). TRL prepares
 * the reference model with the policy's own DeepSpeed ZeRO-3 config (its trainers'
 * _prepare_deepspeed), so the reference's parameters are partitioned as the policy's: here each rank
 * reads only its slices of the reference's layers, embeddings and untied head (train_zero_load, as
 * the policy's loader), cut as train_zero_init cuts the policy's (the final norm whole), and the
 * reference's forward gathers each unit just before its use and releases it after
 * (train_zero_attach_frozen: the policy's gather machinery, forward only, prefetched as the
 * policy's). Frozen: no gradients reduced, no optimizer state, no slice sums. An evaluation gathers
 * it whole on every rank, as the policy (train_zero_ref_whole). TR-DPO's sync mixes each rank's own
 * slices from the policy's same slices (train_zero_ref_mix): no gather (TRL gathers both whole and
 * rank 0 mixes: the same element-wise values). */
#include <stdio.h>
#include <stdlib.h>

#include <ctrl/log.h>

#include "collective/collective.h"
#include "page_pool.h"
#include "train/zero_ref.h"

int train_zero_ref_applies(const train_kind_env *env) {
    /* benchmarks: the reference whole as before (CTRL_TEST_ZERO3_WHOLE_REF), to compare */
    return env->zero3_sliced && !getenv("CTRL_TEST_ZERO3_WHOLE_REF");
}

ctrl_status train_zero_frozen_load(const char *path, const ctrl_attention_ops *attn, const ctrl_model *like,
                                   ctrl_dtype dtype, size_t prefetch, ctrl_model **ref, train_zero **out) {
    train_zero *z = calloc(1, sizeof *z);
    ctrl_model *m = NULL;
    ctrl_status st =
        z ? train_zero_load(path, attn, &m) : ctrl_error_set(CTRL_ERR_NOMEM, "zero3: out of memory");
    /* on the policy's device (a CUDA model's: nothing copied by the move, each rank's slices put there
     * by train_zero_init's zero_device.c, the rest mapped per use); the dtype after the move, which
     * resets the model's backend */
    if (st == CTRL_OK && like && ctrl_model_device(like).type != CTRL_DEVICE_CPU) ctrl_model_defer_device(m);
    if (st == CTRL_OK && like) st = ctrl_model_place_like(m, like);
    /* its compute dtype and no backward: one set of layer internals for all its layers */
    if (st == CTRL_OK) st = ctrl_model_set_compute_dtype(m, dtype);
    if (st == CTRL_OK) st = ctrl_model_set_recompute_all(m);
    /* units and slices cut as train_zero_init cuts a policy's, prefetched as its forward */
    if (st == CTRL_OK) st = train_zero_init(z, 3, m, 1, prefetch, 0, 0);
    if (st == CTRL_OK) {
        if (z->dev) /* frozen: no gradient slices' sums (a device's in its memory) */
            z->dev->free(z->acc);
        else
            free(z->acc);
        z->acc = NULL, z->acc_n = 0;
        st = train_zero_attach_frozen(z, m);
    }
    if (st != CTRL_OK) {
        if (z) train_zero_free(z);
        free(z);
        ctrl_model_free(m);
        return st;
    }
    *ref = m, *out = z;
    return CTRL_OK;
}

ctrl_status train_zero_frozen_describe(train_zero *z, const char *what, const char *how) {
    size_t n = 0;
    const float *p = ctrl_model_params(z->model, &n);
    /* a device's: the memory mapped for its parameters (its pieces, this rank's slices' and what is whole) */
    double v[2] = {(double)(z->dev ? train_zero_device_resident(z) : train_zero_resident(p, n * sizeof *p)),
                   0};
    for (int l = 0; l < ctrl_model_cfg(z->model)->n_layers; l++) { /* the largest layer gathered */
        train_zero_unit r[2];
        size_t f = 0;
        for (int i = 0, k = train_zero_layer_ranges(z, l, r); i < k; i++) f += r[i].b - r[i].a;
        if ((double)(f * sizeof(float)) > v[1]) v[1] = (double)(f * sizeof(float));
    }
    const ctrl_status st = ctrl_collective_allreduce_max_f64(v, 2);
    if (st == CTRL_OK && ctrl_collective_is_root())
        CTRL_INFO(
            "zero3: %s sliced %s: parameters resident at most %.0f of its %zu bytes per rank%s (layers, "
            "embeddings and head %zu bytes, sliced over %d ranks; a layer of %.0f bytes gathered around "
            "each use in its forward, then released)",
            what, how, v[0], n * sizeof *p, z->dev ? " on its device" : "", train_zero_layer_bytes(z),
            z->size, v[1]);
    return st;
}

ctrl_status train_zero_ref_load(const train_kind_env *env, ctrl_model **ref, train_zero **out) {
    const ctrl_run_settings *s = env->settings;
    ctrl_model *m = NULL;
    train_zero *z = NULL;
    /* the policy's compute dtype ([train] dtype: TRL's reference runs under the same autocast) */
    ctrl_status st =
        train_zero_frozen_load(s->model.path, env->plugins->attention->ops, env->model,
                               ctrl_model_compute_dtype(env->model), env->zero3_prefetch, &m, &z);
    if (st != CTRL_OK) return ctrl_error_wrap(st, "the reference model (%s) under zero3", s->model.path);
    ctrl_model_set_bf16_fallback(m, ctrl_model_bf16_fallback(env->model)); /* and its bf16 fallback */
    st = train_zero_frozen_describe(z, "the reference model", "as the policy");
    if (st != CTRL_OK) {
        train_zero_ref_free(z, m);
        return st;
    }
    *ref = m, *out = z;
    return CTRL_OK;
}

void train_zero_ref_free(train_zero *z, ctrl_model *ref) {
    ctrl_model_free(ref);
    if (!z) return;
    train_zero_free(z);
    free(z);
}

ctrl_status train_zero_ref_report(train_zero *z, const char *what) {
    if (!z || !z->measure) return CTRL_OK;
    z->measure = 0;
    size_t n = 0;
    const float *p = ctrl_model_params(z->model, &n);
    const size_t now = z->dev ? train_zero_device_resident(z) : train_zero_resident(p, n * sizeof *p);
    double v[2] = {(double)now, (double)z->grad_peak};
    const ctrl_status st = ctrl_collective_allreduce_max_f64(v, 2);
    /* its own pool's loans (rank 0's): its gathers into reused pages, as the policy's */
    const page_pool_stats ps = page_pool_get_stats(z->pool);
    char pool[160] = "its released pages faulted again at each use";
    if (z->dev)
        snprintf(pool, sizeof pool, "on the device: pieces mapped around each use, unmapped after");
    else if (z->pool)
        snprintf(pool, sizeof pool, "%ld of its gathers into reused pages, %ld the old way%s", ps.lent,
                 ps.missed, ps.broken ? "; failed, off" : "");
    if (st == CTRL_OK && ctrl_collective_is_root())
        CTRL_INFO("zero3: %s's parameters resident per rank: at most %.0f bytes during its forwards of the "
                  "first step, %.0f after them, of its %zu bytes (%ld layer gathers prefetched; %s)",
                  what, v[1], v[0], n * sizeof *p, z->prefetched, pool);
    return st;
}

ctrl_status train_zero_ref_whole(train_zero *z, int on) {
    if (!z) return CTRL_OK;
    if (on) return train_zero_gather_all(z);
    train_zero_release_all(z);
    return CTRL_OK;
}

ctrl_status train_zero_ref_mix(train_zero *z, ctrl_model *policy, train_zero *pz, float alpha) {
    size_t n = 0, n_ref = 0;
    const float *p = ctrl_model_params(policy, &n);
    float *r = ctrl_model_params(z->model, &n_ref);
    if (n != n_ref || z->first != 0 || z->total != n)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "sync_ref_model: the reference's shape differs");
    if (z->gathered)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "sync_ref_model: the zero3 reference is gathered whole");
    for (int l = 0; l < z->n_slots; l++)
        if (z->state[l])
            return ctrl_error_set(CTRL_ERR_RUNTIME, "sync_ref_model: the zero3 reference's unit %d is in use",
                                  l);
    if (z->dev)
        return train_zero_device_mix(z, pz, alpha); /* on the device, from the policy's slices there */
    for (int u = 0; u < z->n_units; u++) {
        size_t lo = z->units[u].a, hi = z->units[u].b;
        if (z->units[u].layer != -1) train_zero_slice(z, u, z->rank, &lo, &hi); /* sliced: this rank's */
        for (size_t i = lo; i < hi; i++) r[i] = r[i] * (1.0f - alpha) + p[i] * alpha;
    }
    ctrl_model_weights_changed(z->model); /* the bf16 copy of what is whole (the gathers round the rest) */
    return CTRL_OK;
}
