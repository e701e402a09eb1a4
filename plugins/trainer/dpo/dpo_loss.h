/* The dpo trainer's loss (dpo_loss.c): TRL 1.16's DPOTrainer._compute_loss on one micro-batch of
 * pairs, with its gradient with respect to each sequence's summed log-prob (and, for the sft
 * loss_type, each token's log-prob), and TRL's metrics. */
#ifndef CTRL_PLUGINS_TRAINER_DPO_LOSS_H
#define CTRL_PLUGINS_TRAINER_DPO_LOSS_H

#include <ctrl/plugin_api.h>

/* loss_type, in TRL's order (dpo.c's loss_names) */
enum {
    DPO_SIGMOID,
    DPO_HINGE,
    DPO_IPO,
    DPO_EXO_PAIR,
    DPO_NCA_PAIR,
    DPO_ROBUST,
    DPO_BCO_PAIR,
    DPO_SPPO_HARD,
    DPO_AOT,
    DPO_AOT_UNPAIRED,
    DPO_APO_ZERO,
    DPO_APO_DOWN,
    DPO_DISCOPOP,
    DPO_SFT,
    DPO_SIGMOID_NORM,
};
enum { DPO_REVERSE_KL, DPO_FORWARD_KL, DPO_JS_DIVERGENCE, DPO_ALPHA_DIVERGENCE };

#define DPO_MAX_LOSSES 8

typedef struct dpo_params {
    int loss[DPO_MAX_LOSSES], n_losses;
    double weight[DPO_MAX_LOSSES];
    double beta, label_smoothing, alpha_coef, discopop_tau;
    int fdiv, use_weighting;
} dpo_params;

/* The micro-batch's share of the loss into *loss, dL/dlogp_sum[n_seq], and for the sft loss_type
 * dL/dlogp[T] with *per_token = 1; reports TRL's metrics through b->report. */
ctrl_status dpo_loss(const dpo_params *p, const ctrl_sequence_batch *b, double *loss, double *dlogp_sum,
                     float *dlogp, int *per_token);

#endif
