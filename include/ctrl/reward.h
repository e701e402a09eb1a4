/* Reward-function plugins (length, format, accuracy, regex, third-party): the kind's vtable.
 * One instance per [reward.NAME] section; scores a batch of completions. */
#ifndef CTRL_REWARD_H
#define CTRL_REWARD_H

#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One column of the dataset row beyond prompt/completion (e.g. "solution"), as JSON text. */
typedef struct ctrl_reward_column {
    const char *name;
    const char *const *values; /* [n] one per completion; NULL entries when the row lacks it */
} ctrl_reward_column;

typedef struct ctrl_reward_batch {
    size_t size;                          /* sizeof(ctrl_reward_batch) as built */
    int n;                                /* completions */
    const char *const *prompts;           /* [n] rendered prompt text */
    const char *const *completions;       /* [n] completion text */
    const int32_t *const *completion_ids; /* [n] token ids */
    const int *completion_lens;           /* [n] number of ids */
    int n_columns;
    const ctrl_reward_column *columns;
    /* Appended (check `size`): [n] the prompt's message list as JSON text where the dataset's
     * prompt is conversational, else NULL (the array or an entry): what TRL's GRPOTrainer renders,
     * with the completion as the assistant's message, for a reward model (reward_model). */
    const char *const *prompt_messages;
} ctrl_reward_batch;

typedef struct ctrl_reward ctrl_reward; /* the plugin's own state */

typedef struct ctrl_reward_ops {
    size_t size;
    /* `section` is this instance's INI section ("reward.NAME"); options are read from it. */
    ctrl_status (*create)(const ctrl_host *host, const ctrl_config *cfg, const char *section,
                          ctrl_reward **out);
    /* Writes one score per completion; NaN means "does not apply" (TRL's None). */
    ctrl_status (*score)(ctrl_reward *r, const ctrl_reward_batch *batch, float *out);
    void (*destroy)(ctrl_reward *r);
} ctrl_reward_ops;

#ifdef __cplusplus
}
#endif
#endif
