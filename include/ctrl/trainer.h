/* Trainer plugins (sft, dpo, grpo, ...): the kind's vtable. The core owns the loop (steps,
 * accumulation, schedules, clipping, checkpoints); a trainer turns rows into examples and a
 * micro-batch into a loss and dL/dlogp. This table grows as the trainer issues land. */
#ifndef CTRL_TRAINER_H
#define CTRL_TRAINER_H

#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ctrl_trainer ctrl_trainer; /* the plugin's own state */

/* One micro-batch as the loss sees it: per-token log-probabilities of the targets under the
 * policy (from the fused head), and which tokens are trained. */
typedef struct ctrl_trainer_batch {
    size_t size;         /* sizeof(ctrl_trainer_batch) as built */
    int T;               /* tokens in the flat micro-batch */
    const float *logp;   /* [T] log pi(target_t | prefix) */
    const float *weight; /* [T] 1 where the token is trained (TRL: label != -100), else 0 */
    double num_items;    /* trained tokens in the whole accumulated batch (TRL's
                            num_items_in_batch), so that splitting a batch differently does not
                            change the loss */
} ctrl_trainer_batch;

typedef struct ctrl_trainer_ops {
    size_t size;
    ctrl_status (*create)(const ctrl_host *host, const ctrl_config *cfg, ctrl_trainer **out);
    /* The micro-batch's share of the loss, and dL/dlogp[T] (written). */
    ctrl_status (*loss)(ctrl_trainer *t, const ctrl_trainer_batch *batch, double *loss, float *dlogp);
    void (*destroy)(ctrl_trainer *t);
} ctrl_trainer_ops;

#ifdef __cplusplus
}
#endif
#endif
