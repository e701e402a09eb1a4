/* One micro-batch of the sequence-level kind (see kind_sequence.h): the policy's forward through the
 * fused head gives per-token log-probs, entropies and argmax flags, and (ctrl_model_head_stats, from
 * the same hidden states) the mean logits and, for WPO, log sum p^2; no [tokens x vocabulary]
 * tensor exists at any time. The sums per sequence, the reference's, the plugin's loss, then
 * dL/dlogp = the spread of dL/dlogp_sum (plus the plugin's token-level term) into the backward. */
#include <stdlib.h>
#include <string.h>

#include "collective/collective.h"
#include "train/kind_sequence.h"
#include "train/moe_aux.h"
#include "train/sequence.h"

static ctrl_status sum_over_ranks(double *v, int n) {
    return n > 0 ? ctrl_collective_allreduce_sum_f64(v, (size_t)n) : CTRL_OK;
}
static ctrl_status sum_over_one_rank(double *v, int n) {
    (void)v, (void)n;
    return CTRL_OK;
}

void train_sequence_set_ranks(ctrl_sequence_batch *sb, int train) {
    sb->n_ranks = train ? ctrl_collective_size() : 1;
    sb->sum_over_ranks = sb->n_ranks > 1 ? sum_over_ranks : sum_over_one_rank;
}

void train_sequence_sum_weights(const ctrl_sequence_spec *spec, const seq_micro_batch *mb, float *out) {
    const int T = mb->batch->T;
    if (spec->length_desensitized && mb->n_pairs > 0)
        train_sequence_ld_weights(mb->n_pairs, mb->seq_cu, mb->weight, spec->ld_alpha, out);
    else
        memcpy(out, mb->weight, sizeof(float) * (size_t)T);
}

ctrl_status train_sequence_ref_sums(const ctrl_sequence_spec *spec, ctrl_model *ref,
                                    const seq_micro_batch *mb, double *out) {
    const int T = mb->batch->T;
    float *lp = malloc(sizeof(float) * (size_t)T), *w = malloc(sizeof(float) * (size_t)T);
    ctrl_status st = lp && w ? ctrl_model_forward(ref, mb->batch, lp, NULL, NULL)
                             : ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory for %d tokens", T);
    if (st == CTRL_OK) {
        train_sequence_sum_weights(spec, mb, w);
        train_sequence_sums(mb->n_seq, mb->seq_cu, lp, w, out, NULL);
    }
    free(lp), free(w);
    return st;
}

typedef struct step_bufs {
    float *lp, *ent, *ml_tok, *lss, *sw, *dlp, *dtok;
    int32_t *ok;
    double *sum, *ref, *ml, *dsum;
    int *n_tok;
} step_bufs;

static void bufs_free(step_bufs *b) {
    free(b->lp), free(b->ent), free(b->ml_tok), free(b->lss), free(b->sw), free(b->dlp), free(b->dtok);
    free(b->ok), free(b->sum), free(b->ref), free(b->ml), free(b->dsum), free(b->n_tok);
}

static int bufs_alloc(step_bufs *b, int T, int S, int lss) {
    const size_t t = sizeof(float) * (size_t)(T > 0 ? T : 1), s = sizeof(double) * (size_t)(S > 0 ? S : 1);
    memset(b, 0, sizeof *b);
    b->lp = malloc(t), b->ent = malloc(t), b->ml_tok = malloc(t), b->sw = malloc(t), b->dlp = malloc(t);
    b->dtok = malloc(t), b->ok = malloc(sizeof(int32_t) * (size_t)(T > 0 ? T : 1));
    b->lss = lss ? malloc(t) : NULL;
    b->sum = malloc(s), b->ref = malloc(s), b->ml = malloc(s), b->dsum = malloc(s);
    b->n_tok = malloc(sizeof(int) * (size_t)(S > 0 ? S : 1));
    return b->lp && b->ent && b->ml_tok && b->sw && b->dlp && b->dtok && b->ok && (!lss || b->lss) &&
           b->sum && b->ref && b->ml && b->dsum && b->n_tok;
}

/* Teacher-forced exact match of the chosen completions (ctrl's own evaluation metric, as the token
 * kind's eval_exact_match): every completion token the argmax given the true prefix. */
static void report_exact_match(const seq_step *s, const seq_micro_batch *mb, const int32_t *ok) {
    int exact = 0, n = 0;
    for (int i = 0; i < mb->n_pairs; i++) {
        int all = 1, any = 0;
        for (int32_t t = mb->seq_cu[i]; t < mb->seq_cu[i + 1]; t++)
            if (mb->weight[t] != 0) all &= ok[t] != 0, any = 1;
        exact += any && all, n += any;
    }
    if (n) s->report(s->report_ctx, "exact_match", (double)exact / n);
}

/* TRL's load-balancing loss on the policy's forward (train/moe_aux.h): over the real tokens of the
 * batch its attention mask keeps -- every sequence's prompt and completion, not its padding, and not
 * KTO's KL sequences, which TRL runs through a forward of their own -- coef x aux / accumulation steps
 * into the loss (coef x aux in evaluation), "aux_loss" reported. */
static ctrl_status add_aux_loss(const seq_step *s, const seq_micro_batch *mb, int train, double *loss) {
    if (s->aux_coef == 0) return CTRL_OK;
    uint8_t *mask = calloc((size_t)mb->batch->T, 1);
    if (!mask) return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    for (int i = 0; i < mb->n_seq; i++)
        if (!mb->kl || !mb->kl[i])
            memset(mask + mb->seq_cu[i], 1,
                   (size_t)(mb->seq_len ? mb->seq_len[i] : mb->seq_cu[i + 1] - mb->seq_cu[i]));
    double aux = 0;
    const ctrl_status st = train_moe_aux_add(s->model, s->aux_coef, mask, train ? s->grad_accum : 1, train,
                                             loss, &aux, s->report, s->report_ctx);
    free(mask);
    return st;
}

ctrl_status train_sequence_micro_batch(const seq_step *s, const seq_micro_batch *mb, double num_items,
                                       int train, double *loss) {
    const ctrl_sequence_spec *spec = s->spec;
    if (spec->needs_score) return train_sequence_score_micro_batch(s, mb, num_items, train, loss);
    const int T = mb->batch->T, S = mb->n_seq;
    step_bufs b;
    if (!bufs_alloc(&b, T, S, spec->needs_log_sum_sq)) {
        bufs_free(&b);
        return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory for a micro-batch of %d tokens", T);
    }
    /* the reference first: with LoRA it is the policy itself with its adapters off, whose forward
     * must not replace the activations the policy's backward needs */
    ctrl_status st = CTRL_OK;
    if (spec->needs_ref_logp) {
        if (mb->ref_sum) {
            memcpy(b.ref, mb->ref_sum, sizeof(double) * (size_t)S);
        } else if (s->ref) {
            st = train_sequence_ref_sums(spec, s->ref, mb, b.ref);
            /* not held through the policy's passes; on a device, freeing would synchronize it
             * (cudaFree) every micro-batch: kept there */
            if (ctrl_model_device(s->ref).type == CTRL_DEVICE_CPU) ctrl_model_release_scratch(s->ref);
        } else if (s->ref_is_base) {
            ctrl_model_set_adapters_enabled(s->model, 0);
            st = train_sequence_ref_sums(spec, s->model, mb, b.ref);
            ctrl_model_set_adapters_enabled(s->model, 1);
        } else {
            st = ctrl_error_set(
                CTRL_ERR_RUNTIME,
                "train: the trainer needs reference log-probs and none were loaded or precomputed");
        }
    }
    if (st == CTRL_OK) st = ctrl_model_forward(s->model, mb->batch, b.lp, b.ent, b.ok);
    if (st == CTRL_OK) st = ctrl_model_head_stats(s->model, b.ml_tok, b.lss);
    if (st == CTRL_OK) {
        train_sequence_sum_weights(spec, mb, b.sw);
        train_sequence_sums(S, mb->seq_cu, b.lp, b.sw, b.sum, NULL);
        train_sequence_sums(S, mb->seq_cu, b.ml_tok, mb->weight, b.ml, b.n_tok);
        for (int i = 0; i < S; i++) b.ml[i] = b.n_tok[i] ? b.ml[i] / b.n_tok[i] : 0.0;
        for (int t = 0; t < T; t++) /* the plugin sees the completion tokens' values only */
            if (mb->weight[t] == 0) b.ent[t] = 0, b.ok[t] = 0;
        ctrl_sequence_batch sb = {.size = sizeof sb,
                                  .T = T,
                                  .n_seq = S,
                                  .n_pairs = mb->n_pairs,
                                  .cu_seqlens = mb->seq_cu,
                                  .logp = b.lp,
                                  .weight = mb->weight,
                                  .logp_sum = b.sum,
                                  .n_tokens = b.n_tok,
                                  .ref_logp_sum = spec->needs_ref_logp ? b.ref : NULL,
                                  .mean_logit = b.ml,
                                  .label = mb->label,
                                  .kl = mb->kl,
                                  .margin = mb->margin,
                                  .num_items = num_items,
                                  .report = s->report,
                                  .report_ctx = s->report_ctx,
                                  .entropy = b.ent,
                                  .correct = b.ok,
                                  .log_sum_sq = b.lss};
        train_sequence_set_ranks(&sb, train);
        if (s->exact_match && s->report && mb->n_pairs > 0) report_exact_match(s, mb, b.ok);
        int per_token = 0;
        st = s->ops->sequence_loss(s->trainer, &sb, loss, b.dsum, NULL, b.dtok, &per_token);
        if (st == CTRL_OK) st = add_aux_loss(s, mb, train, loss);
        if (st == CTRL_OK && train) {
            train_sequence_spread(S, mb->seq_cu, b.sw, b.dsum, b.dlp);
            if (per_token)
                for (int t = 0; t < T; t++) b.dlp[t] += b.dtok[t];
            st = ctrl_model_backward(s->model, b.dlp);
        }
    }
    bufs_free(&b);
    return st;
}
