/* Which kind of trainer a plugin is (see kind.h). */
#include "train/kind.h"

ctrl_status train_kind_for(const ctrl_trainer_ops *ops, const char *trainer_name,
                           const train_kind_ops **out) {
    if (TRAINER_HAS(ops, distill) && ops->distill->distill_spec && ops->distill->distill_loss)
        *out = &train_kind_distill;
    else if ((TRAINER_HAS(ops, advantages) || TRAINER_HAS(ops, token_rollout)) &&
             TRAINER_HAS(ops, online_spec))
        *out = &train_kind_online;
    else if (TRAINER_HAS(ops, sequence_loss) && TRAINER_HAS(ops, sequence_spec))
        *out = &train_kind_sequence;
    else if (TRAINER_HAS(ops, sequence_loss))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "trainer '%s' is sequence-level (sequence_loss) but has no sequence_spec",
                              trainer_name);
    else if (ops->loss)
        *out = &train_kind_token;
    else
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "trainer '%s' has no loss the core loop can run",
                              trainer_name);
    return CTRL_OK;
}
