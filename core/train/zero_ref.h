/* The sequence kind's live reference under ZeRO-3 on several ranks (zero_ref.c): sliced over the
 * ranks as the policy, gathered a unit at a time in its forward. */
#ifndef CTRL_CORE_TRAIN_ZERO_REF_H
#define CTRL_CORE_TRAIN_ZERO_REF_H

#include "train/kind.h"
#include "train/zero.h"

/* 1 when the reference is sliced: zero3 on several ranks with the policy sliced
 * (env->zero3_sliced), on the host. A CUDA model's reference stays whole on every rank (the caller
 * says so). */
int train_zero_ref_applies(const train_kind_env *env);
/* The reference ([model] path): this rank's slices read, hooked to gather each unit around its
 * forward use (train_zero_attach_frozen); logs (rank 0) its resident bytes per rank. A collective. */
ctrl_status train_zero_ref_load(const train_kind_env *env, ctrl_model **ref, train_zero **out);
void train_zero_ref_free(train_zero *z, ctrl_model *ref);
/* After the first step (a collective; later calls do nothing): logs the most resident during its
 * forwards and after them, the largest over the ranks. */
ctrl_status train_zero_ref_report(train_zero *z);
/* Around an evaluation (a collective; z NULL: nothing): gathered whole (on = 1), released (0). */
ctrl_status train_zero_ref_whole(train_zero *z, int on);

#endif
