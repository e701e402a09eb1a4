/* The sequence kind's reference model (see kind_sequence.h): a frozen copy of the initial weights
 * placed beside the policy, or the reference sums of every row precomputed in one pass before
 * training (TRL's precompute_ref_log_probs) and stored in output_dir/ref_logps.bin, so that the
 * reference is not in memory while training and a resumed run reads them back instead of needing
 * the initial weights again (with LoRA the pass runs the policy's base, adapters off, as TRL's). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collective/collective.h"
#include "model/lora.h"
#include "train/compute.h"
#include "train/kind.h"
#include "train/kind_sequence.h"
#include "train/pref_data.h"
#include "train/zero_ref.h"

int train_sequence_role(const ctrl_pref_batch *b, int s) {
    return b->n_pairs > 0 ? s >= b->n_pairs : (b->kl && b->kl[s]);
}

ctrl_status train_sequence_load_reference(const train_kind_env *env, ctrl_model **out, train_zero **zout) {
    const ctrl_run_settings *s = env->settings;
    if (zout) *zout = NULL;
    if (zout && train_zero_ref_applies(env)) return train_zero_ref_load(env, out, zout);
    ctrl_model *ref = NULL;
    ctrl_status st = ctrl_model_load(s->model.path, env->plugins->attention->ops, &ref);
    /* beside the policy, on its backend and in its compute dtype ([train] dtype: TRL's reference
     * runs under the same autocast); the dtype after the move, which resets the model's backend */
    if (st == CTRL_OK && ctrl_model_device(env->model).type != CTRL_DEVICE_CPU)
        st = ctrl_model_to_device(ref, ctrl_model_backend(env->model), ctrl_model_device(env->model));
    if (st == CTRL_OK) st = ctrl_model_set_compute_like(ref, env->model);
    /* no backward through the reference: one set of layer internals for all its layers (with a
     * 151k vocabulary and 8 pairs, 6 layers kept ~110 MiB of activations it never reads again) */
    if (st == CTRL_OK) st = ctrl_model_set_recompute_all(ref);
    if (st != CTRL_OK) {
        ctrl_model_free(ref);
        return ctrl_error_wrap(st, "the reference model (%s)", s->model.path);
    }
    if (zout && env->zero3_sliced && ctrl_collective_is_root()) /* CTRL_TEST_ZERO3_WHOLE_REF */
        CTRL_INFO("zero3 on %s: the reference model is whole on every rank (%zu bytes of parameters: "
                  "CTRL_TEST_ZERO3_WHOLE_REF), the policy sliced",
                  s->run.device, ctrl_model_param_bytes(ref));
    *out = ref;
    return CTRL_OK;
}

/* FNV-1a over what the sums depend on: the reference's weights (by path; QLoRA's quantized, the
 * compute dtype), the rows' tokens, the layout, LD-DPO's weighting. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

static uint64_t set_hash(uint64_t h, const ctrl_pref_set *d) {
    h = fnv(h, &d->n, sizeof d->n), h = fnv(h, &d->max_length, sizeof d->max_length);
    h = fnv(h, &d->keep_end, sizeof d->keep_end), h = fnv(h, &d->task, sizeof d->task);
    for (int i = 0; i < d->n; i++) {
        const ctrl_pref_row *r = &d->rows[i];
        h = fnv(h, &r->n_prompt, sizeof r->n_prompt),
        h = fnv(h, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
        h = fnv(h, &r->n_chosen, sizeof r->n_chosen),
        h = fnv(h, r->chosen, sizeof(int32_t) * (size_t)r->n_chosen);
        h = fnv(h, &r->n_rejected, sizeof r->n_rejected);
        if (r->rejected) h = fnv(h, r->rejected, sizeof(int32_t) * (size_t)r->n_rejected);
        h = fnv(h, &r->kl_row, sizeof r->kl_row);
    }
    return h;
}

#define CACHE_MAGIC "ctrl-ref-logps 1"

static int read_cache(const char *path, uint64_t hash, const ctrl_pref_set *tr, const ctrl_pref_set *ev,
                      double *rt, double *re) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char magic[32] = "";
    unsigned long long h = 0;
    int nt = -1, ne = -1;
    int ok = fscanf(f, "%31[^\n]\n%llx %d %d\n", magic, &h, &nt, &ne) == 4 && !strcmp(magic, CACHE_MAGIC) &&
             h == hash && nt == tr->n && ne == ev->n;
    ok = ok && fread(rt, sizeof(double), 2 * (size_t)nt, f) == 2 * (size_t)nt;
    ok = ok && (ne == 0 || fread(re, sizeof(double), 2 * (size_t)ne, f) == 2 * (size_t)ne);
    fclose(f);
    return ok;
}

static void write_cache(const char *path, uint64_t hash, int nt, int ne, const double *rt, const double *re) {
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int ok = f && fprintf(f, "%s\n%llx %d %d\n", CACHE_MAGIC, (unsigned long long)hash, nt, ne) > 0 &&
             fwrite(rt, sizeof(double), 2 * (size_t)nt, f) == 2 * (size_t)nt &&
             (ne == 0 || fwrite(re, sizeof(double), 2 * (size_t)ne, f) == 2 * (size_t)ne);
    if (f && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, path) == 0)
        CTRL_INFO("reference log-probs stored in %s", path);
    else
        CTRL_WARN(
            "%s: cannot store the precomputed reference log-probs (%s); a resumed run computes them again",
            path, strerror(errno));
}

/* One pass over `d` in batches of bs rows: out[2 row + role] = the reference sum of that sequence. */
static ctrl_status pass(const ctrl_sequence_spec *spec, ctrl_model *ref, const ctrl_pref_set *d, int bs,
                        double *out) {
    int *idx = malloc(sizeof(int) * (size_t)bs);
    ctrl_status st = idx ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    for (int i = 0; i < 2 * d->n; i++) out[i] = 0;
    for (int i0 = 0; i0 < d->n && st == CTRL_OK; i0 += bs) {
        const int n = i0 + bs <= d->n ? bs : d->n - i0;
        for (int i = 0; i < n; i++) idx[i] = i0 + i;
        ctrl_pref_batch b;
        if ((st = ctrl_pref_batch_build(d, idx, n, &b)) != CTRL_OK) break;
        double *sum = malloc(sizeof(double) * (size_t)b.n_seq);
        const seq_micro_batch mb = {.batch = &b.batch,
                                    .n_seq = b.n_seq,
                                    .n_pairs = b.n_pairs,
                                    .seq_cu = b.seq_cu,
                                    .weight = b.weight};
        st = sum ? train_sequence_ref_sums(spec, ref, &mb, sum)
                 : ctrl_error_set(CTRL_ERR_NOMEM, "out of memory");
        for (int s = 0; st == CTRL_OK && s < b.n_seq; s++)
            out[2 * (size_t)b.row[s] + train_sequence_role(&b, s)] = sum[s];
        free(sum);
        ctrl_pref_batch_free(&b);
    }
    free(idx);
    return st;
}

ctrl_status train_sequence_precompute(const train_kind_env *env, const ctrl_sequence_spec *spec,
                                      const ctrl_pref_set *train, const ctrl_pref_set *eval,
                                      double **ref_train, double **ref_eval) {
    const ctrl_run_settings *s = env->settings;
    char path[4200];
    snprintf(path, sizeof path, "%s/ref_logps.bin", s->run.output_dir);
    uint64_t h = fnv(1469598103934665603ull, s->model.path, strlen(s->model.path));
    h = fnv(h, &spec->length_desensitized, sizeof spec->length_desensitized);
    if (spec->length_desensitized) h = fnv(h, &spec->ld_alpha, sizeof spec->ld_alpha);
    /* and what the base computes with: QLoRA's NF4 store, the compute dtype */
    const ctrl_lora_config *lora = ctrl_model_lora(env->model);
    const int nf4 = lora && lora->nf4, dtype = (int)ctrl_model_compute_dtype(env->model);
    h = fnv(fnv(h, &nf4, sizeof nf4), &dtype, sizeof dtype);
    h = set_hash(set_hash(h, train), eval);
    double *rt = malloc(sizeof(double) * 2 * (size_t)train->n),
           *re = malloc(sizeof(double) * 2 * (size_t)(eval->n + 1));
    if (!rt || !re) {
        free(rt), free(re);
        return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory for the reference log-probs");
    }
    ctrl_status st = CTRL_OK;
    /* LoRA: the policy's frozen base with its adapters off, as the live reference (called once the run
     * is set up: under zero3 its layers gathered as training gathers them) */
    const int base = lora != NULL;
    /* on several ranks the pass may be a collective (zero3's gathers): every rank computes unless all
     * read */
    double missing = !read_cache(path, h, train, eval, rt, re);
    if (ctrl_collective_size() > 1) st = ctrl_collective_allreduce_max_f64(&missing, 1);
    if (st == CTRL_OK && !missing) {
        CTRL_INFO("reference log-probs read from %s", path);
    } else if (st == CTRL_OK) {
        /* else the reference is the initial weights: the policy itself before training, loaded again
         * when resuming (the policy has moved) and under zero3 on several ranks (the policy holds
         * only its slices, its gathers not hooked yet: the reference is loaded sliced and hooked) */
        ctrl_model *ref = env->model, *loaded = NULL;
        train_zero *lz = NULL;
        if (!base && (s->train.resume_from_checkpoint || env->zero3_sliced)) {
            st = train_sequence_load_reference(env, &loaded, &lz);
            ref = loaded;
        }
        const int bt = spec->precompute_ref_batch_size > 0 ? spec->precompute_ref_batch_size
                                                           : s->train.per_device_train_batch_size;
        const int be = spec->precompute_ref_batch_size > 0 ? spec->precompute_ref_batch_size
                                                           : s->train.per_device_eval_batch_size;
        CTRL_INFO("precomputing the reference log-probs of %d + %d rows", train->n, eval->n);
        if (base) ctrl_model_set_adapters_enabled(ref, 0);
        if (st == CTRL_OK) st = pass(spec, ref, train, bt > 0 ? bt : 1, rt);
        if (st == CTRL_OK && eval->n) st = pass(spec, ref, eval, be > 0 ? be : 1, re);
        if (base) ctrl_model_set_adapters_enabled(ref, 1);
        train_zero_ref_free(lz, loaded);
        if (st == CTRL_OK && ctrl_collective_is_root()) write_cache(path, h, train->n, eval->n, rt, re);
    }
    if (st != CTRL_OK) {
        free(rt), free(re);
        return st;
    }
    *ref_train = rt, *ref_eval = re;
    return CTRL_OK;
}
