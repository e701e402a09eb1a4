/* The sequence kind's live reference under ZeRO-3 on several ranks (zero_ref.c): sliced over the
 * ranks as the policy, gathered a unit at a time in its forward. */
#ifndef CTRL_CORE_TRAIN_ZERO_REF_H
#define CTRL_CORE_TRAIN_ZERO_REF_H

#include "train/kind.h"
#include "train/zero.h"

/* 1 when the reference is sliced: zero3 on several ranks with the policy sliced
 * (env->zero3_sliced), on the host or on the policy's device (zero_device.c's pieces mapped per
 * use); CTRL_TEST_ZERO3_WHOLE_REF keeps it whole (the caller says so). */
int train_zero_ref_applies(const train_kind_env *env);
/* The reference ([model] path): this rank's slices read, hooked to gather each unit around its
 * forward use (train_zero_attach_frozen); logs (rank 0) its resident bytes per rank. A collective. */
ctrl_status train_zero_ref_load(const train_kind_env *env, ctrl_model **ref, train_zero **out);
/* What train_zero_ref_load does for any frozen model of DIR `path` (the reference, GKD's teacher):
 * this rank's slices read, placed on `like`'s device (NULL: the host), computing in `dtype`, forward
 * only, cut as a policy of its shape would be and hooked to gather each unit around its use
 * (prefetch: prefetch_bucket_size floats). On a device its slices live in device memory mapped piece
 * by piece as a zero3 policy's (zero_device.c), each unit's other pieces mapped and all-gathered over
 * NCCL around its use. No collective (on a device, but the NCCL communicator's making if it is the
 * first). */
ctrl_status train_zero_frozen_load(const char *path, const ctrl_attention_ops *attn, const ctrl_model *like,
                                   ctrl_dtype dtype, size_t prefetch, ctrl_model **out, train_zero **zout);
/* Logs (rank 0) "zero3: WHAT sliced HOW: parameters resident at most ..." -- its resident bytes per
 * rank and its largest layer, the largest over the ranks. A collective. */
ctrl_status train_zero_frozen_describe(train_zero *z, const char *what, const char *how);
void train_zero_ref_free(train_zero *z, ctrl_model *ref);
/* After the first step (a collective; later calls do nothing): logs "zero3: WHAT's parameters
 * resident per rank: ..." -- the most resident during its forwards and after them, the largest over
 * the ranks, and rank 0's loans of its own page pool ("N of its gathers into reused pages, M the old
 * way", or "its released pages faulted again at each use" with none). */
ctrl_status train_zero_ref_report(train_zero *z, const char *what);
/* Around an evaluation (a collective; z NULL: nothing): gathered whole (on = 1), released (0). */
ctrl_status train_zero_ref_whole(train_zero *z, int on);
/* TR-DPO's sync under zero3 (sync_ref_model): reference = alpha * policy + (1 - alpha) * reference on
 * what this rank holds of the reference -- its slices of the sliced units and the whole units (the
 * final norm) --, read from the policy, which holds the same slices (the same shape cut the same way)
 * up to date after its step (on a device: the policy's train_zero `pz` says where its slices are, the
 * mix runs there, train_zero_device_mix). No collective: every rank mixes its own slices. An error
 * when the reference is gathered or a gather is in flight. */
ctrl_status train_zero_ref_mix(train_zero *z, ctrl_model *policy, train_zero *pz, float alpha);

#endif
