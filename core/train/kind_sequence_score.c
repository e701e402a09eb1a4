/* One micro-batch of the sequence-level kind for a trainer with a score head (spec.needs_score:
 * the reward trainer): the model is a sequence classifier, each sequence's score is read at its
 * last non-pad token (the batch's `last`), the plugin's sequence_loss turns the scores into its
 * share of the loss and dL/dscore, and the score's backward runs the trunk's. The LM head is not
 * computed, and no log-prob exists on this path. */
#include <stdlib.h>

#include "train/kind_sequence.h"

ctrl_status train_sequence_score_micro_batch(const seq_step *s, const seq_micro_batch *mb, double num_items,
                                             int train, double *loss) {
    const int S = mb->n_seq;
    float *score = malloc(sizeof(float) * (size_t)(S > 0 ? S : 1)),
          *dscore = malloc(sizeof(float) * (size_t)(S > 0 ? S : 1));
    double *dsum = malloc(sizeof(double) * (size_t)(S > 0 ? S : 1));
    ctrl_status st = score && dscore && dsum
                         ? ctrl_model_score_forward_at(s->model, mb->batch, S, mb->last, score)
                         : ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory for %d scores", S);
    if (st == CTRL_OK) {
        ctrl_sequence_batch sb = {.size = sizeof sb,
                                  .T = mb->batch->T,
                                  .n_seq = S,
                                  .n_pairs = mb->n_pairs,
                                  .cu_seqlens = mb->seq_cu,
                                  .weight = mb->weight,
                                  .score = score,
                                  .margin = mb->margin,
                                  .num_items = num_items,
                                  .report = s->report,
                                  .report_ctx = s->report_ctx};
        train_sequence_set_ranks(&sb, train);
        int per_token = 0;
        st = s->ops->sequence_loss(s->trainer, &sb, loss, dsum, dscore, NULL, &per_token);
        if (st == CTRL_OK && per_token)
            st =
                ctrl_error_set(CTRL_ERR_PLUGIN, "trainer: a score-head loss cannot weigh tokens (per_token)");
        if (st == CTRL_OK && train) st = ctrl_model_score_backward_at(s->model, S, mb->last, dscore);
    }
    free(score), free(dscore), free(dsum);
    return st;
}
