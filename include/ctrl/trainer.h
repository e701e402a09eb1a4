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

typedef struct ctrl_trainer_ops {
    size_t size;
    ctrl_status (*create)(const ctrl_host *host, const ctrl_config *cfg, ctrl_trainer **out);
    void (*destroy)(ctrl_trainer *t);
} ctrl_trainer_ops;

#ifdef __cplusplus
}
#endif
#endif
