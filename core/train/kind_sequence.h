/* The sequence-level kind's internals (kind.h; DPO, and the KTO / reward trainers to come):
 * kind_sequence_step.c runs one micro-batch -- one forward of the policy through the fused head,
 * the per-sequence sums, the reference's sums, the trainer plugin's sequence_loss, the spread of
 * dL/dlogp_sum back over the tokens and the backward -- and kind_sequence.c is the kind (the
 * preference sets, the accumulated step, the precomputed reference, TR-DPO's sync, evaluation). */
#ifndef CTRL_CORE_TRAIN_KIND_SEQUENCE_H
#define CTRL_CORE_TRAIN_KIND_SEQUENCE_H

#include <ctrl/trainer.h>

#include "model/model.h"
#include "train/kind.h"
#include "train/pref_data.h"
#include "train/zero.h"

/* One micro-batch as the step sees it (the preference batch builder's layout: pref_data.h). */
typedef struct seq_micro_batch {
    const ctrl_batch *batch; /* tokens, positions, cu_seqlens (pad segments included), targets */
    int n_seq, n_pairs;
    const int32_t *seq_cu;   /* [n_seq + 1] each sequence with its padding */
    const float *weight;     /* [T] 1 on the log-probs of completion tokens */
    const int *n_completion; /* [n_seq] completion tokens (pref_data.h), or NULL */
    const float *label;      /* [n_seq] or NULL (KTO) */
    const uint8_t *kl;       /* [n_seq] or NULL (KTO) */
    const float *margin;     /* [n_pairs] or NULL (reward) */
    const double *ref_sum;   /* [n_seq] precomputed reference sums (NULL: from the reference model) */
    const int32_t *last;     /* [n_seq] where a score head reads each sequence (pref_data's `last`) */
    const int *seq_len;      /* [n_seq] each sequence's real tokens from seq_cu[s] (the rest: padding) */
} seq_micro_batch;

/* What a step runs with. */
typedef struct seq_step {
    const ctrl_trainer_ops *ops;
    ctrl_trainer *trainer;
    const ctrl_sequence_spec *spec;
    ctrl_model *model;
    ctrl_model *ref; /* the frozen reference (NULL: precomputed sums, the base, or none asked for) */
    int ref_is_base; /* with LoRA: the reference is `model` with its adapters off (TRL's
                        disable_adapter), no second copy */
    void (*report)(void *ctx, const char *name, double value);
    void *report_ctx;
    double aux_coef; /* the mixture-of-experts load-balancing loss' coefficient (train/moe_aux.h; 0: off) */
    int grad_accum;  /* training: the accumulation steps it is divided by */
    int exact_match; /* paired: also report "exact_match", the chosen completions whose every token
                        is the argmax given the true prefix (greedy decoding would write them) */
} seq_step;

/* The batch's n_ranks and sum_over_ranks (trainer.h): the data-parallel ranks when `train`, else
 * one (evaluation runs on one rank). */
void train_sequence_set_ranks(ctrl_sequence_batch *sb, int train);

/* The token weights the sums use: `weight`, or LD-DPO's (spec->length_desensitized). */
void train_sequence_sum_weights(const ctrl_sequence_spec *spec, const seq_micro_batch *mb, float *out);

/* The micro-batch's reference sums under `ref` (a forward, no gradient) into out[n_seq]. */
ctrl_status train_sequence_ref_sums(const ctrl_sequence_spec *spec, ctrl_model *ref,
                                    const seq_micro_batch *mb, double *out);

/* One micro-batch: its share of the loss into *loss (num_items: the pairs -- or sequences when
 * unpaired -- of the whole accumulated batch); with `train`, the gradients accumulated into the
 * model's. */
ctrl_status train_sequence_micro_batch(const seq_step *s, const seq_micro_batch *mb, double num_items,
                                       int train, double *loss);

/* kind_sequence_ref.c: which of a row's two precomputed sums sequence s of a batch is (0: chosen,
 * or an unpaired completion; 1: rejected, or a KTO KL sequence). */
int train_sequence_role(const ctrl_pref_batch *b, int s);
/* The frozen reference: the initial weights ([model] path) placed where the policy is; with zero3 on
 * several ranks on the host and `zout` given, sliced as the policy (zero_ref.h: *zout its layout,
 * else NULL). A collective then. */
ctrl_status train_sequence_load_reference(const train_kind_env *env, ctrl_model **out, train_zero **zout);
/* precompute_ref_log_probs: the reference sums of every row of both sets ([row][2], malloc'd), read
 * from output_dir/ref_logps.bin when it was made from the same rows and weights, else computed in
 * one pass (batches of spec->precompute_ref_batch_size rows, or the train / eval batch size) by the
 * policy before training -- with LoRA its base, adapters off (the kind's `ready`: after ZeRO's
 * hooks); without, when resuming or under zero3 on several ranks, a copy of the initial weights
 * loaded for the pass -- and stored there. A collective on several ranks. */
ctrl_status train_sequence_precompute(const train_kind_env *env, const ctrl_sequence_spec *spec,
                                      const ctrl_pref_set *train, const ctrl_pref_set *eval,
                                      double **ref_train, double **ref_eval);

/* The same for a trainer with a score head (spec->needs_score: the reward trainer;
 * kind_sequence_score.c): the classifier's scores at mb->last instead of log-probs. */
ctrl_status train_sequence_score_micro_batch(const seq_step *s, const seq_micro_batch *mb, double num_items,
                                             int train, double *loss);

#endif
