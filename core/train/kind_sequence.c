/* The offline sequence-level kind (see kind.h; DPO, and the KTO / reward trainers to come): rows are
 * preference pairs (pref_data.h), a step is ga micro-batches of bs pairs run by
 * kind_sequence_step.c, the loss divided by the pairs of the whole accumulated batch. The reference
 * is a frozen copy of the initial weights, loaded once, or its sums are precomputed before training
 * (kind_sequence_ref.c) so that no reference is in memory while training. TR-DPO's reference sync
 * after the optimizer steps; evaluation over the eval pairs with TRL's eval_ metrics. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collective/collective.h"
#include "train/data_parallel.h"
#include "train/kind.h"
#include "train/kind_sequence.h"
#include "train/moe_aux.h"
#include "train/pref_data.h"
#include "train/zero_ref.h"

#define MAX_METRICS 48

typedef struct seq_metrics {
    char *name[MAX_METRICS];
    double sum[MAX_METRICS];
    long count[MAX_METRICS];
    /* where each name was first reported: an evaluation's batch x 2^16 + the report's place in it
     * (metrics_merge_ranks orders names by it); batch and tick: the present batch, its reports */
    double key[MAX_METRICS];
    long batch, tick;
    int n;
} seq_metrics;

struct train_kind {
    const ctrl_trainer_ops *ops;
    ctrl_trainer *trainer;
    ctrl_model *model, *ref;
    ctrl_sequence_spec spec;
    ctrl_pref_set train, eval;
    double *ref_train, *ref_eval; /* precomputed: [row][2] (chosen or desirable, rejected or KL) */
    int ref_is_base;              /* LoRA: the reference is the policy with its adapters off */
    /* LoRA with precompute_ref_logp: the pass waits for the run's setup (sequence_ready), made from
     * `env` (its tokenizer gone by then) */
    int precompute_at_ready;
    train_kind_env env;
    train_zero *ref_zero; /* zero3 on several ranks: the reference sliced (zero_ref.h) */
    /* zero3 with the reference whole beside the sliced policy (CTRL_TEST_ZERO3_WHOLE_REF): the policy
     * gathered whole on every rank for a sync (kind.h's gather_whole); NULL otherwise */
    ctrl_status (*gather_whole)(void *ctx, int on);
    void *gather_ctx;
    train_zero *policy_zero; /* zero3: the policy's (a sliced reference's sync on a device reads it) */
    int eval_bs;
    double aux_coef;                    /* train/moe_aux.h */
    seq_metrics step_m, window, eval_m; /* this step's (every rank's), the logging window's, eval's */
};

static void seq_report(void *ctx, const char *name, double value) {
    seq_metrics *m = ctx;
    int i = 0;
    while (i < m->n && strcmp(m->name[i], name)) i++;
    if (i == m->n) {
        if (i == MAX_METRICS) return;
        if (!(m->name[i] = strdup(name))) return;
        m->sum[i] = 0, m->count[i] = 0, m->key[i] = (double)m->batch * 65536 + (double)m->tick, m->n++;
    }
    m->tick++;
    if (!isnan(value)) m->sum[i] += value, m->count[i]++;
}

static void seq_drop(void *ctx, const char *name, double value) { (void)ctx, (void)name, (void)value; }

static void metrics_free(seq_metrics *m) {
    for (int i = 0; i < m->n; i++) free(m->name[i]);
    m->n = 0;
}

typedef struct metric_rec {
    double key, sum, count;
    char name[104]; /* a plugin's metric names are short ("rewards/margins"); longer ones cut here */
} metric_rec;

/* Data parallel: every rank's metrics merged by name into each rank's `m` (the same table on every
 * rank after), sums and counts added in rank order. A rank may have reported a name the others did
 * not (KTO reports rewards/chosen only for a batch with a desirable row), or in another order, so
 * the names travel with the values (each rank's table broadcast in turn). The names are ordered by
 * where they were first reported (key; for an evaluation, one process's order) and keep that
 * place at the next merges, before any name new then. */
static ctrl_status metrics_merge_ranks(seq_metrics *m) {
    const int N = ctrl_collective_size(), me = ctrl_collective_rank();
    if (N == 1) return CTRL_OK;
    metric_rec *recs = calloc(MAX_METRICS, sizeof *recs);
    seq_metrics all = {.batch = m->batch, .tick = m->tick};
    ctrl_status st = recs ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    for (int r = 0; r < N && st == CTRL_OK; r++) {
        double n = 0;
        if (r == me) {
            n = m->n;
            for (int i = 0; i < m->n; i++) {
                recs[i] = (metric_rec){m->key[i], m->sum[i], (double)m->count[i], ""};
                snprintf(recs[i].name, sizeof recs[i].name, "%s", m->name[i]);
            }
        }
        st = ctrl_collective_broadcast(&n, sizeof n, r);
        if (st == CTRL_OK) st = ctrl_collective_broadcast(recs, (size_t)n * sizeof *recs, r);
        for (int j = 0; st == CTRL_OK && j < (int)n; j++) {
            int i = 0;
            while (i < all.n && strcmp(all.name[i], recs[j].name)) i++;
            if (i == all.n) {
                if (i == MAX_METRICS) continue;
                if (!(all.name[i] = strdup(recs[j].name))) {
                    st = ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
                    break;
                }
                all.key[i] = recs[j].key, all.sum[i] = 0, all.count[i] = 0, all.n++;
            }
            if (recs[j].key < all.key[i]) all.key[i] = recs[j].key;
            all.sum[i] += recs[j].sum, all.count[i] += (long)recs[j].count;
        }
    }
    free(recs);
    if (st != CTRL_OK) {
        metrics_free(&all);
        return st;
    }
    for (int i = 1; i < all.n; i++) /* by key, stably: the same order on every rank */
        for (int j = i; j > 0 && all.key[j] < all.key[j - 1]; j--) {
            char *nm = all.name[j];
            const double key = all.key[j], sum = all.sum[j];
            const long count = all.count[j];
            all.name[j] = all.name[j - 1], all.key[j] = all.key[j - 1], all.sum[j] = all.sum[j - 1],
            all.count[j] = all.count[j - 1];
            all.name[j - 1] = nm, all.key[j - 1] = key, all.sum[j - 1] = sum, all.count[j - 1] = count;
        }
    for (int i = 0; i < all.n; i++) all.key[i] = i - MAX_METRICS; /* before any name new later */
    metrics_free(m);
    *m = all;
    return CTRL_OK;
}

static void sequence_destroy(train_kind *k) {
    if (!k) return;
    ctrl_pref_set_free(&k->train);
    ctrl_pref_set_free(&k->eval);
    train_zero_ref_free(k->ref_zero, k->ref);
    free(k->ref_train), free(k->ref_eval);
    metrics_free(&k->step_m), metrics_free(&k->window), metrics_free(&k->eval_m);
    free(k);
}

static ctrl_status sequence_create(const train_kind_env *env, train_kind **out) {
    train_kind *k = calloc(1, sizeof *k);
    if (!k) return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    k->ops = env->trainer_ops, k->trainer = env->trainer, k->model = env->model;
    k->eval_bs = env->settings->train.per_device_eval_batch_size;
    k->aux_coef = train_moe_aux_coef(env->settings, env->model);
    k->spec.size = sizeof k->spec;
    ctrl_status st = k->ops->sequence_spec(k->trainer, &k->spec);
    if (st == CTRL_OK) st = ctrl_pref_sets_load(env->cfg, env->tok, &k->spec, &k->train, &k->eval);
    /* the pad token the score is read before, as TRL sets the model's (saved in config.json) */
    if (st == CTRL_OK && k->spec.needs_score) ctrl_model_set_pad_token_id(k->model, k->train.pad_id);
    if (st == CTRL_OK && k->train.n == 0)
        st = ctrl_error_set(CTRL_ERR_CONFIG, "[data] train_file: no usable row");
    if (st == CTRL_OK && k->spec.needs_ref_logp) {
        if (k->spec.precompute_ref_logp && ctrl_model_lora(k->model))
            k->precompute_at_ready = 1, k->env = *env, k->env.tok = NULL;
        else if (k->spec.precompute_ref_logp)
            st = train_sequence_precompute(env, &k->spec, &k->train, &k->eval, &k->ref_train, &k->ref_eval);
        else if (!ctrl_model_lora(k->model)) {
            st = train_sequence_load_reference(env, &k->ref, &k->ref_zero);
            k->policy_zero = env->zero3_policy;
            /* zero3 with the reference whole beside the sliced policy (CTRL_TEST_ZERO3_WHOLE_REF): a
             * sync gathers the whole policy first */
            if (st == CTRL_OK && k->spec.sync_ref_model && env->zero3_sliced && !k->ref_zero)
                k->gather_whole = env->gather_whole, k->gather_ctx = env->gather_ctx;
        } else if (k->spec.sync_ref_model)
            st = ctrl_error_set(CTRL_ERR_CONFIG,
                                "[%s] sync_ref_model: not with [peft] (the reference is the base "
                                "model with the adapters off, as TRL's)",
                                env->settings->run.trainer);
        else
            k->ref_is_base = 1;
    }
    if (st != CTRL_OK) {
        sequence_destroy(k);
        return st;
    }
    *out = k;
    return CTRL_OK;
}

/* LoRA's precomputed reference: the policy's base with its adapters off, run once the setup is done,
 * so under zero3 the pass gathers the base's layers as training does (each rank read only its
 * slices: QLoRA's NF4 super-blocks too) and a resumed run needs no second copy of the base. */
static ctrl_status sequence_ready(train_kind *k) {
    if (!k->precompute_at_ready) return CTRL_OK;
    k->precompute_at_ready = 0;
    return train_sequence_precompute(&k->env, &k->spec, &k->train, &k->eval, &k->ref_train, &k->ref_eval);
}

static int sequence_rows(const train_kind *k) { return k->train.n; }
static long sequence_rows_per_step(const train_kind *k, int bs, int ga) {
    (void)k;
    return (long)bs * ga; /* pairs (rows) */
}

static void sequence_describe(const train_kind *k, long total, int bs, int ga, size_t n_params) {
    CTRL_INFO(
        "training: %d %s (%ld bad rows skipped, %ld dropped by max_length, %ld truncated), %ld steps of "
        "%d x %d, %zu parameters, reference %s",
        k->train.n, k->train.paired ? "pairs" : "rows", k->train.skipped_bad, k->train.dropped,
        k->train.truncated, total, bs, ga, n_params,
        !k->spec.needs_ref_logp       ? "none"
        : k->spec.precompute_ref_logp ? "precomputed"
        : k->spec.sync_ref_model      ? "live (TR-DPO sync)"
        : k->ref_is_base              ? "the base model (LoRA adapters off)"
        : k->ref_zero                 ? "live (zero3: sliced over the ranks)"
                                      : "live");
}

/* Items the loss is divided by: pairs, or the non-KL sequences of unpaired data. */
static long batch_items(const ctrl_pref_batch *b) {
    if (b->n_pairs > 0) return b->n_pairs;
    long n = 0;
    for (int s = 0; s < b->n_seq; s++) n += !b->kl || !b->kl[s];
    return n;
}

/* The micro-batch as the step sees it, with its rows' precomputed reference sums (ref_rows may be
 * NULL) gathered into *ref_sum (malloc'd). */
static ctrl_status micro_view(const ctrl_pref_batch *b, const double *ref_rows, seq_micro_batch *mb,
                              double **ref_sum) {
    *mb = (seq_micro_batch){.batch = &b->batch,
                            .n_seq = b->n_seq,
                            .n_pairs = b->n_pairs,
                            .seq_cu = b->seq_cu,
                            .weight = b->weight,
                            .n_completion = b->n_completion,
                            .label = b->label,
                            .kl = b->kl,
                            .margin = b->margin,
                            .last = b->last,
                            .seq_len = b->seq_len};
    *ref_sum = NULL;
    if (!ref_rows) return CTRL_OK;
    if (!(*ref_sum = malloc(sizeof(double) * (size_t)b->n_seq)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    for (int s = 0; s < b->n_seq; s++)
        (*ref_sum)[s] = ref_rows[2 * (size_t)b->row[s] + train_sequence_role(b, s)];
    mb->ref_sum = *ref_sum;
    return CTRL_OK;
}

/* The step's context, its metrics reported into `m`. */
static seq_step step_for(train_kind *k, seq_metrics *m) {
    return (seq_step){.ops = k->ops,
                      .trainer = k->trainer,
                      .spec = &k->spec,
                      .model = k->model,
                      .ref = k->ref,
                      .ref_is_base = k->ref_is_base,
                      .report = seq_report,
                      .report_ctx = m,
                      .aux_coef = k->spec.needs_score ? 0 : k->aux_coef,
                      .grad_accum = 1};
}

static ctrl_status sequence_accumulate(train_kind *k, const int *order, long *cursor, int bs, int ga,
                                       train_step_stats *out) {
    ctrl_pref_batch *mb = calloc((size_t)ga, sizeof *mb);
    int *idx = malloc(sizeof(int) * (size_t)bs);
    ctrl_status st = mb && idx ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    long items = 0;
    for (int g = 0; g < ga && st == CTRL_OK; g++) {
        for (int i = 0; i < bs; i++) idx[i] = order[(*cursor)++ % k->train.n];
        st = ctrl_pref_batch_build(&k->train, idx, bs, &mb[g]);
        if (st == CTRL_OK) items += batch_items(&mb[g]), out->tokens += mb[g].tokens;
    }
    /* the loss is over the pairs of every rank's share of the batch (data_parallel.h) */
    const double num_items = st == CTRL_OK ? train_dp_items(items) : 0;
    seq_step step = step_for(k, &k->step_m);
    step.grad_accum = ga;
    for (int g = 0; g < ga && st == CTRL_OK; g++) {
        seq_micro_batch v;
        double *ref = NULL, loss = 0;
        st = micro_view(&mb[g], k->ref_train, &v, &ref);
        if (st == CTRL_OK) st = train_sequence_micro_batch(&step, &v, num_items, 1, &loss);
        if (st == CTRL_OK) out->loss += loss;
        for (int t = 0; st == CTRL_OK && t < mb[g].T; t++) out->trained += mb[g].weight[t] != 0;
        free(ref);
    }
    for (int g = 0; mb && g < ga; g++) ctrl_pref_batch_free(&mb[g]);
    free(mb), free(idx);
    if (st == CTRL_OK)
        st = train_zero_ref_report(k->ref_zero, "the reference model"); /* the first step's, once */
    return st;
}

/* The step's metrics into the logging window; with several ranks summed over them first, as TRL
 * gathers its metrics across processes (every rank reports the same names in the same order). */
static ctrl_status window_add_step(train_kind *k) {
    seq_metrics *m = &k->step_m;
    ctrl_status st = metrics_merge_ranks(m); /* by name: a rank may lack one (metrics_merge_ranks) */
    if (st != CTRL_OK) return st;
    for (int i = 0; i < m->n; i++) {
        int j = 0;
        while (j < k->window.n && strcmp(k->window.name[j], m->name[i])) j++;
        if (j == k->window.n) {
            if (j == MAX_METRICS || !(k->window.name[j] = strdup(m->name[i]))) continue;
            k->window.sum[j] = 0, k->window.count[j] = 0, k->window.n++;
        }
        k->window.sum[j] += m->sum[i], k->window.count[j] += m->count[i];
        m->sum[i] = 0, m->count[i] = 0;
    }
    return CTRL_OK;
}

/* TR-DPO (TRL's SyncRefModelCallback): every ref_model_sync_steps optimizer steps, the reference
 * becomes alpha * policy + (1 - alpha) * reference. TRL syncs when state.global_step %
 * ref_model_sync_steps == 0: the global step, so a resumed run syncs at the same steps as an
 * uninterrupted one. */
static ctrl_status sequence_after_step(train_kind *k, long step) {
    ctrl_status st = window_add_step(k);
    if (st != CTRL_OK) return st;
    if (!k->spec.sync_ref_model || !k->ref || step % k->spec.ref_model_sync_steps) return CTRL_OK;
    const float a = (float)k->spec.ref_model_mixup_alpha;
    if (k->ref_zero) { /* zero3: both sliced alike, each rank mixes its own slices */
        st = train_zero_ref_mix(k->ref_zero, k->model, k->policy_zero, a);
        if (st == CTRL_OK && ctrl_collective_is_root())
            CTRL_INFO("sync_ref_model: reference mixed with the policy (alpha %g) after step %ld, each "
                      "rank its zero3 slices",
                      (double)a, step);
        return st;
    }
    /* the reference whole beside a zero3-sliced policy: the policy gathered whole for the mix */
    if (k->gather_whole && (st = k->gather_whole(k->gather_ctx, 1)) != CTRL_OK) return st;
    size_t n, n_ref;
    const float *p = ctrl_model_params(k->model, &n);
    float *r = ctrl_model_params(k->ref, &n_ref);
    if (n != n_ref) st = ctrl_error_set(CTRL_ERR_RUNTIME, "sync_ref_model: the reference's shape differs");
    for (size_t i = 0; st == CTRL_OK && i < n; i++) r[i] = r[i] * (1.0f - a) + p[i] * a;
    if (st == CTRL_OK) ctrl_model_weights_changed(k->ref);
    const ctrl_status released = k->gather_whole ? k->gather_whole(k->gather_ctx, 0) : CTRL_OK;
    if (st == CTRL_OK && ctrl_collective_is_root())
        CTRL_INFO("sync_ref_model: reference mixed with the policy (alpha %g) after step %ld%s", (double)a,
                  step, k->gather_whole ? ", the policy gathered whole" : "");
    return st != CTRL_OK ? st : released;
}

static void write_metric(FILE *f, const char *prefix, const char *name, double v) {
    if (isnan(v) || isinf(v))
        fprintf(f, "\"%s%s\": null", prefix, name);
    else
        fprintf(f, "\"%s%s\": %.6g", prefix, name, v);
}

static void sequence_log_window(train_kind *k, const train_window *w, FILE *f) {
    fprintf(f, "\"loss\": %.6g, \"grad_norm\": %.6f, \"learning_rate\": %.6g, ", w->loss, w->grad_norm,
            w->learning_rate);
    seq_metrics *m = &k->window;
    double acc = NAN, margin = NAN;
    for (int i = 0; i < m->n; i++) {
        const double v = m->count[i] ? m->sum[i] / m->count[i] : NAN;
        write_metric(f, "", m->name[i], v);
        fputs(", ", f);
        if (!strcmp(m->name[i], "rewards/accuracies") || !strcmp(m->name[i], "accuracy")) acc = v;
        if (!strcmp(m->name[i], "rewards/margins") || !strcmp(m->name[i], "margin")) margin = v;
        m->sum[i] = 0, m->count[i] = 0;
    }
    if (isatty(fileno(stderr))) return;
    char extra[64] = ""; /* a trainer without the metric (KTO logs no reward accuracy) shows none */
    if (!isnan(acc)) snprintf(extra, sizeof extra, "  reward acc %.3f", acc);
    if (!isnan(margin))
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "  margin %.3f", margin);
    fprintf(stderr, "step %ld/%ld  loss %.4f  grad_norm %.3f  lr %.3g%s  %.0f tok/s\n", w->step, w->total,
            w->loss, w->grad_norm, w->learning_rate, extra, w->tokens_per_second);
}

static int sequence_has_eval(const train_kind *k) { return k->eval.n > 0; }
static ctrl_status sequence_eval_whole(train_kind *k, int on) {
    return train_zero_ref_whole(k->ref_zero, on);
}

/* TRL's evaluation: the loss of each batch of per_device_eval_batch_size pairs (its mean),
 * eval_loss their mean weighted by the batch's pairs, the metrics the mean over batches. */
static ctrl_status sequence_evaluate(train_kind *k, long step, FILE *f) {
    const ctrl_pref_set *d = &k->eval;
    if (d->n == 0) return CTRL_OK; /* the loop asks before the first step too */
    const int bs = k->eval_bs > 0 ? k->eval_bs : 1;
    int *idx = malloc(sizeof(int) * (size_t)bs);
    ctrl_status st = idx ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "eval: out of memory");
    seq_step s = step_for(k, &k->eval_m);
    s.exact_match = 1;
    seq_step padding = s; /* zero3's lockstep: a padding batch's metrics dropped */
    padding.report = seq_drop;
    double loss_sum = 0, items = 0;
    long mine = 0;
    const long n_batches = (d->n + bs - 1) / bs;
    for (long e = 0; e < train_dp_eval_span(n_batches) && st == CTRL_OK; e++) {
        if (!train_dp_eval_mine(e)) continue; /* another rank's batch (data_parallel.h) */
        int pad;
        const int i0 = (int)train_dp_eval_batch(e, n_batches, &pad) * bs;
        mine += !pad;
        k->eval_m.batch = i0 / bs, k->eval_m.tick = 0;
        const int n = i0 + bs <= d->n ? bs : d->n - i0;
        for (int i = 0; i < n; i++) idx[i] = i0 + i;
        ctrl_pref_batch b;
        st = ctrl_pref_batch_build(d, idx, n, &b);
        if (st != CTRL_OK) break;
        seq_micro_batch v;
        double *ref = NULL, loss = 0;
        const long m = batch_items(&b);
        st = micro_view(&b, k->ref_eval, &v, &ref);
        if (st == CTRL_OK) st = train_sequence_micro_batch(pad ? &padding : &s, &v, (double)m, 0, &loss);
        if (!pad) loss_sum += loss * m, items += m;
        free(ref);
        ctrl_pref_batch_free(&b);
    }
    free(idx);
    /* every rank's batches' sums, and their metrics by name: one process's values */
    double v[3] = {loss_sum, items, (double)mine};
    st = train_dp_eval_reduce(st, v, 3);
    if (st == CTRL_OK) st = metrics_merge_ranks(&k->eval_m);
    if (st != CTRL_OK || !f) { /* rank 0 writes */
        for (int i = 0; i < k->eval_m.n; i++) k->eval_m.sum[i] = 0, k->eval_m.count[i] = 0;
        return st;
    }
    loss_sum = v[0], items = v[1];
    const double loss = items > 0 ? loss_sum / items : 0;
    fprintf(f, "{\"step\": %ld, \"eval_loss\": %.6g", step, loss);
    double acc = NAN;
    for (int i = 0; i < k->eval_m.n; i++) {
        const double v = k->eval_m.count[i] ? k->eval_m.sum[i] / k->eval_m.count[i] : NAN;
        fputs(", ", f);
        write_metric(f, "eval_", k->eval_m.name[i], v);
        if (!strcmp(k->eval_m.name[i], "rewards/accuracies") || !strcmp(k->eval_m.name[i], "accuracy"))
            acc = v;
        k->eval_m.sum[i] = 0, k->eval_m.count[i] = 0;
    }
    fputs("}\n", f);
    fflush(f);
    char note[128];
    train_dp_eval_note(note, sizeof note, mine, (long)v[2]);
    if (isnan(acc)) /* KTO logs no accuracy */
        CTRL_INFO("eval: loss %.4f (%d %s%s)", loss, d->n, d->paired ? "pairs" : "rows", note);
    else
        CTRL_INFO("eval: loss %.4f, reward accuracy %.3f (%d %s%s)", loss, acc, d->n,
                  d->paired ? "pairs" : "rows", note);
    return CTRL_OK;
}

const train_kind_ops train_kind_sequence = {
    .name = "sequence",
    .create = sequence_create,
    .destroy = sequence_destroy,
    .row_count = sequence_rows,
    .rows_per_step = sequence_rows_per_step,
    .describe = sequence_describe,
    .accumulate = sequence_accumulate,
    .after_step = sequence_after_step,
    .log_window = sequence_log_window,
    .has_eval = sequence_has_eval,
    .evaluate = sequence_evaluate,
    .eval_whole = sequence_eval_whole,
    .eval_at_start = 1, /* the "before" of a preference run (TRL's eval_on_start) */
    .tokenizer_only_at_create = 1,
    .eval_layerwise = 1,
    .ready = sequence_ready,
};
