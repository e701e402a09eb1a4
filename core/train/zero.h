/* ZeRO stages 1 and 2 in the shared step loop (issue 19; the `zero1` and `zero2` memory strategies
 * declare the stage, plugins/memory/zero/), with DeepSpeed's meaning (stage_1_and_2.py):
 *
 * The trainable floats of the model (ctrl_model_grads' layout: all parameters, or the LoRA adapters)
 * are one flat buffer cut in N consecutive slices of ceil(T / N) floats (the last one shorter), slice
 * r being rank r's. Each rank creates its optimizer on the parameter groups clipped to its slice
 * (train_zero_shard_groups), so it holds 1/N of the optimizer state (AdamW: exp_avg, exp_avg_sq).
 * A step: the gradients are averaged over the ranks -- all-reduced (stage 1) or reduce-scattered
 * (stage 2: each rank receives its slice's average only) --, the global gradient norm is the
 * ranks' slices' sums of squares added up (DeepSpeed's partitioned norm), clipping scales the slice,
 * the rank's optimizer steps it, and the updated slices are all-gathered into every rank's model.
 * The loss curve is plain data parallel's.
 *
 * Checkpoints: the model is gathered (every rank holds it), rank 0 writes it as ever; the optimizer
 * state stays sharded, one file per rank (optimizer.rank-R.safetensors, as DeepSpeed's per-rank
 * zero_pp_rank_R files), which rank 0 writes from what each rank sends it (one rank's slice in memory
 * at a time); a resume reads each rank's own file and needs the same number of ranks (as every
 * data-parallel resume).
 *
 * On a CUDA model the sharded step runs on the host (the gradients brought back first, the state in
 * host memory, the weights copied back to the device after the gather). */
#ifndef CTRL_CORE_TRAIN_ZERO_H
#define CTRL_CORE_TRAIN_ZERO_H

#include <stddef.h>

#include <ctrl/optimizer.h>

#include "model/model.h"

typedef struct train_zero {
    int stage; /* 0: off (everything below unused); 1 or 2 */
    int rank, size;
    size_t total;  /* trainable floats */
    size_t lo, hi; /* this rank's slice of them */
    size_t first;  /* ctrl_model_trainable_offset: where they start in the parameters */
    int *counts;   /* each rank's slice length */
} train_zero;

/* Lays out the slices of the model's trainable floats (stage 0: nothing). An error when a slice
 * offset does not fit MPI's int counts (more than 2^31 - 1 trainable floats). */
ctrl_status train_zero_init(train_zero *z, int stage, ctrl_model *m);
void train_zero_free(train_zero *z);
/* The groups (set over the whole model) clipped to this rank's slice, in place, those outside it
 * dropped; returns how many are left (0 when a rank's slice is empty: a tiny model on many ranks). */
int train_zero_shard_groups(const train_zero *z, ctrl_model *m, ctrl_param_group *groups, int n);
/* After the kind accumulated: the gradients averaged (the slice at least, see above) on the host
 * and their global sum of squares. */
ctrl_status train_zero_reduce_grads(const train_zero *z, ctrl_model *m, double *sum_sq);
/* Clipping: the slice's gradients times `coef`. */
void train_zero_scale_grads(const train_zero *z, ctrl_model *m, float coef);
/* After the optimizer stepped the slice: every rank's slice into every rank's model. */
ctrl_status train_zero_gather_params(const train_zero *z, ctrl_model *m);
/* The optimizer state's bytes (state_get's buffers) on this rank. */
size_t train_zero_state_bytes(const ctrl_optimizer_ops *ops, ctrl_optimizer *opt);
/* Logs (rank 0) the optimizer state per rank, the largest and the sum over the ranks. */
ctrl_status train_zero_report(const train_zero *z, const char *optimizer, const ctrl_optimizer_ops *ops,
                              ctrl_optimizer *opt);
/* A checkpoint save: ranks other than 0 send their optimizer state to rank 0 (call while rank 0 is
 * in ctrl_checkpoint_save, which receives it with train_zero_write_shard). */
ctrl_status train_zero_send_state(const train_zero *z, const ctrl_optimizer_ops *ops, ctrl_optimizer *opt);
/* Rank 0: receives rank `rank`'s optimizer state and writes it to `path` (safetensors, the names
 * optimizer.safetensors has). `user` is the train_zero. */
ctrl_status train_zero_write_shard(void *user, int rank, const char *path);

#endif
