/* DPO's and KTO's live reference under ZeRO-3 on several ranks (zero_ref.h, issue 19). TRL prepares
 * the reference model with the policy's own DeepSpeed ZeRO-3 config (its trainers'
 * _prepare_deepspeed), so the reference's parameters are partitioned as the policy's: here each rank
 * reads only its slices of the reference's layers, embeddings and untied head (train_zero_load, as
 * the policy's loader), cut as train_zero_init cuts the policy's (the final norm whole), and the
 * reference's forward gathers each unit just before its use and releases it after
 * (train_zero_attach_frozen: the policy's gather machinery, forward only, prefetched as the
 * policy's). Frozen: no gradients reduced, no optimizer state, no slice sums. An evaluation gathers
 * it whole on every rank, as the policy (train_zero_ref_whole). */
#include <stdlib.h>

#include <ctrl/log.h>

#include "collective/collective.h"
#include "train/zero_ref.h"

int train_zero_ref_applies(const train_kind_env *env) {
    /* benchmarks: the reference whole as before (CTRL_TEST_ZERO3_WHOLE_REF), to compare */
    return env->zero3_sliced && ctrl_model_device(env->model).type == CTRL_DEVICE_CPU &&
           !getenv("CTRL_TEST_ZERO3_WHOLE_REF");
}

ctrl_status train_zero_ref_load(const train_kind_env *env, ctrl_model **ref, train_zero **out) {
    const ctrl_run_settings *s = env->settings;
    train_zero *z = calloc(1, sizeof *z);
    ctrl_model *m = NULL;
    ctrl_status st = z ? train_zero_load(s->model.path, env->plugins->attention->ops, &m)
                       : ctrl_error_set(CTRL_ERR_NOMEM, "zero3: out of memory");
    /* the policy's compute dtype ([train] dtype: TRL's reference runs under the same autocast) and no
     * backward: one set of layer internals for all its layers */
    if (st == CTRL_OK) st = ctrl_model_set_compute_dtype(m, ctrl_model_compute_dtype(env->model));
    if (st == CTRL_OK) st = ctrl_model_set_recompute_all(m);
    /* the policy's units and slices (the same shape), prefetched as the policy's forward */
    if (st == CTRL_OK) st = train_zero_init(z, 3, m, 1, env->zero3_prefetch, 0, 0);
    if (st == CTRL_OK) {
        free(z->acc); /* frozen: no gradient slices' sums */
        z->acc = NULL, z->acc_n = 0;
        st = train_zero_attach_frozen(z, m);
    }
    if (st != CTRL_OK) {
        if (z) train_zero_free(z);
        free(z);
        ctrl_model_free(m);
        return ctrl_error_wrap(st, "the reference model (%s) under zero3", s->model.path);
    }
    size_t n = 0;
    const float *p = ctrl_model_params(m, &n);
    double v[2] = {(double)train_zero_resident(p, n * sizeof *p), 0};
    for (int l = 0; l < ctrl_model_cfg(m)->n_layers; l++) { /* the largest layer gathered */
        train_zero_unit r[2];
        size_t f = 0;
        for (int i = 0, k = train_zero_layer_ranges(z, l, r); i < k; i++) f += r[i].b - r[i].a;
        if ((double)(f * sizeof(float)) > v[1]) v[1] = (double)(f * sizeof(float));
    }
    st = ctrl_collective_allreduce_max_f64(v, 2);
    if (st == CTRL_OK && ctrl_collective_is_root())
        CTRL_INFO("zero3: the reference model sliced as the policy: parameters resident at most %.0f of its "
                  "%zu bytes per rank (layers, embeddings and head %zu bytes, sliced over %d ranks; a layer "
                  "of %.0f bytes gathered around each use in its forward, then released)",
                  v[0], n * sizeof *p, train_zero_layer_bytes(z), z->size, v[1]);
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

ctrl_status train_zero_ref_report(train_zero *z) {
    if (!z || !z->measure) return CTRL_OK;
    z->measure = 0;
    size_t n = 0;
    const float *p = ctrl_model_params(z->model, &n);
    double v[2] = {(double)train_zero_resident(p, n * sizeof *p), (double)z->grad_peak};
    const ctrl_status st = ctrl_collective_allreduce_max_f64(v, 2);
    if (st == CTRL_OK && ctrl_collective_is_root())
        CTRL_INFO("zero3: the reference model's parameters resident per rank: at most %.0f bytes during its "
                  "forwards of the first step, %.0f after them, of its %zu bytes (%ld layer gathers "
                  "prefetched)",
                  v[1], v[0], n * sizeof *p, z->prefetched);
    return st;
}

ctrl_status train_zero_ref_whole(train_zero *z, int on) {
    if (!z) return CTRL_OK;
    if (on) return train_zero_gather_all(z);
    train_zero_release_all(z);
    return CTRL_OK;
}
