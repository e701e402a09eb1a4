/* The offline token-level kind (SFT; see kind.h): tokenized examples laid out as flat
 * micro-batches, the loss normalised over the trained tokens of the whole accumulated batch
 * (TRL's num_items_in_batch), token accuracy and entropy as TRL's SFTTrainer logs them, and a
 * teacher-forced evaluation. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/data_parallel.h"
#include "train/kind.h"
#include "train/moe_aux.h"
#include "train/train.h"

struct train_kind {
    const ctrl_trainer_ops *ops;
    ctrl_trainer *trainer;
    ctrl_model *model;
    ctrl_dataset train, eval;
    int eval_bs;
    double aux_coef;      /* the load-balancing loss' (moe_aux.h; 0: off) */
    double aux_sum[2];    /* this step's aux_loss values' sum and count (every rank's, after_step) */
    double aux_window[2]; /* the logging window's */
};

static void token_destroy(train_kind *k) {
    if (!k) return;
    ctrl_dataset_free(&k->train);
    ctrl_dataset_free(&k->eval);
    free(k);
}

static ctrl_status token_create(const train_kind_env *env, train_kind **out) {
    train_kind *k = calloc(1, sizeof *k);
    if (!k) return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    k->ops = env->trainer_ops, k->trainer = env->trainer, k->model = env->model;
    k->eval_bs = env->settings->train.per_device_eval_batch_size;
    k->aux_coef = train_moe_aux_coef(env->settings, env->model);
    ctrl_status st = ctrl_datasets_load(env->cfg, env->tok, &k->train, &k->eval);
    if (st != CTRL_OK) {
        token_destroy(k);
        return st;
    }
    *out = k;
    return CTRL_OK;
}

static int token_rows(const train_kind *k) { return k->train.n; }
static long token_rows_per_step(const train_kind *k, int bs, int ga) {
    (void)k;
    return (long)bs * ga;
}

static void token_describe(const train_kind *k, long total, int bs, int ga, size_t n_params) {
    CTRL_INFO("training: %d examples%s (%ld dropped without a trained token, %ld truncated), %ld steps "
              "of %d x %d, %zu parameters",
              k->train.n, k->train.packed_from ? " (packed)" : "", k->train.dropped_empty, k->train.truncated,
              total, bs, ga, n_params);
}

/* One micro-batch: forward, the trainer's loss, backward; counts[0..2] = its trained tokens, those
 * predicted right, their entropies' sum (for accuracy and entropy, as TRL's SFTTrainer logs them). */
/* The tokens the attention mask of TRL's padded batch keeps (pad segments, which predict nothing,
 * out; padding-free rows: every token) into mask[T] (malloc'd; NULL on failure). */
static uint8_t *token_mask(const train_kind *k, const ctrl_batch *b) {
    uint8_t *mask = malloc((size_t)b->T);
    for (int s = 0; mask && s < b->B; s++) {
        int trained = !k->train.padded;
        for (int t = b->cu_seqlens[s]; t < b->cu_seqlens[s + 1] && !trained; t++)
            trained = b->targets[t] >= 0;
        for (int t = b->cu_seqlens[s]; t < b->cu_seqlens[s + 1]; t++) mask[t] = (uint8_t)trained;
    }
    return mask;
}

/* The mixture-of-experts load-balancing loss TRL's SFTTrainer adds (moe_aux.h): coef aux / ga into
 * the micro-batch's loss (div = ga) and gradient, or coef aux into an evaluation batch's (train 0). */
static ctrl_status aux_loss(train_kind *k, const ctrl_batch *b, int ga, int train, double *loss,
                            double *aux) {
    *aux = 0;
    if (k->aux_coef == 0) return CTRL_OK;
    uint8_t *mask = token_mask(k, b);
    if (!mask) return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    const ctrl_status st = train_moe_aux_add(k->model, k->aux_coef, mask, ga, train, loss, aux, NULL, NULL);
    free(mask);
    return st;
}

static ctrl_status micro_batch(train_kind *k, const ctrl_batch *b, double num_items, int ga, double *counts,
                               train_step_stats *out) {
    const int T = b->T;
    float *lp = malloc(sizeof(float) * (size_t)T), *w = malloc(sizeof(float) * (size_t)T);
    float *dlp = malloc(sizeof(float) * (size_t)T), *ent = malloc(sizeof(float) * (size_t)T);
    int32_t *ok = malloc(sizeof(int32_t) * (size_t)T);
    ctrl_status st =
        lp && w && dlp && ent && ok ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    ctrl_trainer_batch tb = {.size = sizeof tb, .T = T, .logp = lp, .weight = w, .num_items = num_items};
    for (int t = 0; st == CTRL_OK && t < T; t++) w[t] = b->targets[t] >= 0 ? 1.0f : 0.0f;
    double loss;
    /* a loss linear in the log-probs (SFT): dL/dlogp first, and the head's backward fused into the
     * forward (on every backend) */
    const int fused = TRAINER_HAS(k->ops, dlogp_before_forward);
    if (st == CTRL_OK && fused) {
        memset(lp, 0, sizeof(float) * (size_t)T);
        st = k->ops->loss(k->trainer, &tb, &loss, dlp);
        if (st == CTRL_OK) st = ctrl_model_forward_fused(k->model, b, dlp, lp, ent, ok);
    } else if (st == CTRL_OK) {
        st = ctrl_model_forward(k->model, b, lp, ent, ok);
    }
    if (st == CTRL_OK) {
        long valid = 0, correct = 0;
        double ent_sum = 0;
        for (int t = 0; t < T; t++)
            if (w[t] > 0) valid++, correct += ok[t] != 0, ent_sum += ent[t];
        counts[0] = (double)valid, counts[1] = (double)correct, counts[2] = ent_sum;
        st = k->ops->loss(k->trainer, &tb, &loss, dlp);
        double aux = 0;
        if (st == CTRL_OK) st = aux_loss(k, b, ga, 1, &loss, &aux);
        if (st == CTRL_OK && k->aux_coef != 0) k->aux_sum[0] += aux, k->aux_sum[1] += 1;
        if (st == CTRL_OK) out->loss += loss, st = ctrl_model_backward(k->model, fused ? NULL : dlp);
    }
    free(lp), free(w), free(dlp), free(ent), free(ok);
    return st;
}

static ctrl_status token_accumulate(train_kind *k, const int *order, long *cursor, int bs, int ga,
                                    train_step_stats *out) {
    ctrl_batch *mb = calloc((size_t)ga, sizeof *mb);
    int *idx = malloc(sizeof(int) * (size_t)bs);
    double *counts = calloc((size_t)ga * 3, sizeof(double));
    if (!mb || !idx || !counts) {
        free(mb), free(idx), free(counts);
        return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    }
    long num_items = 0, real_tokens = 0;
    ctrl_status st = CTRL_OK;
    for (int g = 0; g < ga && st == CTRL_OK; g++) {
        for (int i = 0; i < bs; i++) idx[i] = order[(*cursor)++ % k->train.n];
        const long trained = ctrl_batch_build(&k->train, idx, bs, &mb[g], &real_tokens);
        if (trained < 0) st = CTRL_ERR_NOMEM;
        num_items += trained;
        out->tokens += real_tokens; /* num_tokens counts what is not padding, as TRL */
    }
    free(idx);
    /* the loss is over the trained tokens of every rank's share of the batch (data_parallel.h) */
    const double items = st == CTRL_OK ? train_dp_items(num_items) : 0;
    for (int g = 0; g < ga && st == CTRL_OK; g++) st = micro_batch(k, &mb[g], items, ga, counts + 3 * g, out);
    /* each micro-batch's accuracy and entropy over every rank's share of it, then their mean */
    if (st == CTRL_OK) st = train_dp_sum(counts, (size_t)ga * 3);
    for (int g = 0; g < ga && st == CTRL_OK; g++) {
        const double valid = counts[3 * g], correct = counts[3 * g + 1], ent_sum = counts[3 * g + 2];
        out->accuracy += valid > 0 ? correct / valid / ga : 0;
        out->entropy += valid > 0 ? ent_sum / valid / ga : 0;
    }
    for (int g = 0; g < ga; g++) ctrl_batch_free(&mb[g]);
    free(mb), free(counts);
    out->trained = num_items;
    return st;
}

/* The step's aux_loss values into the window, every rank's (TRL gathers them). */
static ctrl_status token_after_step(train_kind *k, long step) {
    (void)step;
    if (k->aux_coef == 0) return CTRL_OK;
    const ctrl_status st = train_dp_sum(k->aux_sum, 2);
    k->aux_window[0] += k->aux_sum[0], k->aux_window[1] += k->aux_sum[1];
    k->aux_sum[0] = k->aux_sum[1] = 0;
    return st;
}

static void token_log_window(train_kind *k, const train_window *w, FILE *f) {
    fprintf(f,
            "\"loss\": %.6f, \"grad_norm\": %.6f, \"learning_rate\": %.6g, \"entropy\": %.6f, "
            "\"mean_token_accuracy\": %.6f, ",
            w->loss, w->grad_norm, w->learning_rate, w->entropy, w->accuracy);
    if (k->aux_coef != 0 && k->aux_window[1] > 0)
        fprintf(f, "\"aux_loss\": %.6g, ", k->aux_window[0] / k->aux_window[1]);
    k->aux_window[0] = k->aux_window[1] = 0;
    if (!isatty(fileno(stderr)))
        fprintf(stderr, "step %ld/%ld  loss %.4f  grad_norm %.3f  lr %.3g  acc %.3f  %.0f tok/s\n", w->step,
                w->total, w->loss, w->grad_norm, w->learning_rate, w->accuracy, w->tokens_per_second);
}

/* Teacher-forced evaluation. Exact match under greedy decoding equals "every trained token is the
 * argmax given the true prefix" (by induction over the completion), so it needs no generation; it
 * is counted per sequence (a packed row holds several), over sequences with a trained token. */
static ctrl_status token_evaluate(train_kind *k, long step, FILE *f) {
    const ctrl_dataset *d = &k->eval;
    const int bs = k->eval_bs;
    double nll = 0, aux_sum = 0;
    long tokens = 0, correct = 0, exact = 0, sequences = 0, batches = 0;
    int *idx = malloc(sizeof(int) * (size_t)bs);
    ctrl_status st = idx ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "eval: out of memory");
    const long n_batches = (d->n + bs - 1) / bs;
    for (long e = 0; e < train_dp_eval_span(n_batches) && st == CTRL_OK; e++) {
        if (!train_dp_eval_mine(e)) continue; /* another rank's batch (data_parallel.h) */
        int pad;                              /* zero3's lockstep: a padding forward, its values dropped */
        const int i0 = (int)train_dp_eval_batch(e, n_batches, &pad) * bs;
        int n = i0 + bs <= d->n ? bs : d->n - i0;
        for (int i = 0; i < n; i++) idx[i] = i0 + i;
        ctrl_batch b;
        if (ctrl_batch_build(d, idx, n, &b, NULL) < 0) {
            st = CTRL_ERR_NOMEM;
            break;
        }
        float *lp = malloc(sizeof(float) * (size_t)b.T);
        int32_t *ok = malloc(sizeof(int32_t) * (size_t)b.T);
        st = lp && ok ? ctrl_model_forward(k->model, &b, lp, NULL, ok)
                      : ctrl_error_set(CTRL_ERR_NOMEM, "eval: out of memory");
        double aux = 0, unused = 0;
        if (st == CTRL_OK) st = aux_loss(k, &b, 1, 0, &unused, &aux);
        if (!pad) aux_sum += aux, batches++;
        for (int s = 0; st == CTRL_OK && !pad && s < b.B; s++) {
            int all = 1, any = 0;
            for (int t = b.cu_seqlens[s]; t < b.cu_seqlens[s + 1]; t++) {
                if (b.targets[t] < 0) continue;
                nll -= lp[t], tokens++, correct += ok[t];
                all &= ok[t], any = 1;
            }
            exact += any && all, sequences += any;
        }
        free(lp), free(ok);
        ctrl_batch_free(&b);
    }
    free(idx);
    /* every rank's batches' sums: the whole set's means, as one process makes them */
    const long mine = batches;
    double v[7] = {nll,     (double)tokens, (double)correct, (double)exact, (double)sequences,
                   aux_sum, (double)batches};
    if ((st = train_dp_eval_reduce(st, v, 7)) != CTRL_OK) return st;
    nll = v[0], tokens = (long)v[1], correct = (long)v[2], exact = (long)v[3], sequences = (long)v[4];
    aux_sum = v[5], batches = (long)v[6];
    if (!f) return CTRL_OK; /* rank 0 writes */
    /* with the load-balancing loss, TRL's eval_loss holds coef x each batch's aux too */
    const double aux = batches ? aux_sum / batches : 0;
    const double loss = (tokens ? nll / tokens : 0) + k->aux_coef * aux,
                 accuracy = tokens ? (double)correct / tokens : 0,
                 exact_match = sequences ? (double)exact / sequences : 0;
    fprintf(f, "{\"step\": %ld, ", step);
    fprintf(f, "\"eval_loss\": %.6f, \"eval_mean_token_accuracy\": %.6f, \"eval_exact_match\": %.6f", loss,
            accuracy, exact_match);
    if (k->aux_coef != 0) fprintf(f, ", \"eval_aux_loss\": %.6g", aux);
    fputs("}\n", f);
    fflush(f);
    char note[128];
    train_dp_eval_note(note, sizeof note, mine, batches);
    CTRL_INFO("eval: loss %.4f, token accuracy %.3f, exact match %.3f (%d examples%s)", loss, accuracy,
              exact_match, d->n, note);
    return CTRL_OK;
}

static int token_has_eval(const train_kind *k) { return k->eval.n > 0; }

const train_kind_ops train_kind_token = {
    .name = "token",
    .create = token_create,
    .destroy = token_destroy,
    .row_count = token_rows,
    .rows_per_step = token_rows_per_step,
    .describe = token_describe,
    .accumulate = token_accumulate,
    .after_step = token_after_step,
    .log_window = token_log_window,
    .has_eval = token_has_eval,
    .evaluate = token_evaluate,
    .eval_layerwise = 1,
};
