/* Data parallel in the shared step loop (issue 19; the collectives are core/collective/): each
 * of N ranks trains on its share of every global batch and the gradients are averaged, so that N
 * ranks x per_device_train_batch_size b follow one process's curve with batch N·b.
 *
 * A global optimizer step takes N x rows_per_step(bs, ga) rows of the epoch's order, in chunks of
 * rows_per_step(bs, 1) (a micro-batch's rows): chunk c goes to rank c % N. Rank r's chunks are laid
 * out for its kind where it reads them, order[(cursor + j) % n_rows] for j < its rows (the view),
 * so a kind knows nothing of ranks -- except one normalising its loss over items counted across
 * the whole accumulated batch (SFT's trained tokens): it divides by train_dp_items(count), the
 * job's count over N (the loop averages the gradients, so each rank's loss is N times its share,
 * as the HF Trainer's average_tokens_across_devices). With one rank every function here is the
 * identity or a no-op. */
#ifndef CTRL_CORE_TRAIN_DATA_PARALLEL_H
#define CTRL_CORE_TRAIN_DATA_PARALLEL_H

#include "model/model.h"
#include "train/kind.h"

typedef struct train_dp {
    int rank, size;
    int kind_splits;    /* the kind takes its own share (train_kind_ops.splits_ranks) */
    long rows_per_rank; /* rows one rank takes per optimizer step */
    long chunk;         /* rows of one micro-batch */
    int *view;          /* n_rows entries: the rank's share where its kind reads it */
    int n_rows;
    /* train_dp_average_grads's collective: wall-clock and CPU seconds in it, calls, floats each */
    double sync_s, sync_cpu_s;
    long syncs;
    size_t sync_floats;
    int shared; /* the gradients in memory every rank maps (train_dp_share_grads) */
} train_dp;

/* Checks that the share can be laid out (a rank's rows per step must fit in one epoch's order)
 * and allocates the view. */
ctrl_status train_dp_init(train_dp *dp, const train_kind_ops *ops, const train_kind *kind, int bs, int ga);
void train_dp_free(train_dp *dp);
/* The order the kind reads for the step starting at global `cursor` (the epoch's own order with
 * one rank, or for a kind that splits the work itself). */
const int *train_dp_share(train_dp *dp, const int *order, long cursor);
/* The global cursor after a step that started at `start` and left the kind's at `mine`. */
long train_dp_advance(const train_dp *dp, long start, long mine);
/* After the kind accumulated: `st` is this rank's status. Agrees on the outcome (one rank's
 * failure or interruption stops every rank, the others with a message naming it) and sums the
 * step's statistics over the ranks (loss, accuracy and entropy averaged). */
ctrl_status train_dp_reduce_step(const train_dp *dp, ctrl_status st, train_step_stats *s);
/* Plain data parallel on the CPU ([train] ddp_shared_memory, no ZeRO; call before the optimizer's
 * groups are made): the model's gradient buffer replaced by one in memory every rank maps, when
 * the ranks are on one node, so that train_dp_average_grads sums it in place
 * (ctrl_collective_allreduce_mean_shared_f32) instead of MPI_Allreduce's copies. Every rank agrees
 * on the outcome; where it cannot be done, an info line and MPI_Allreduce as before. */
ctrl_status train_dp_share_grads(train_dp *dp, ctrl_model *m, int enabled);
/* The model's gradients averaged over the ranks: NCCL on a CUDA model's device buffer, else MPI
 * on the host's (call before, respectively after, ctrl_model_grads_to_host: `on_device`). */
ctrl_status train_dp_average_grads(train_dp *dp, ctrl_model *m, int on_device);
/* Rank 0, at the end of a run of several ranks: the gradient allreduce's average wall-clock and
 * CPU time per step, the transfer alone (the ranks met in train_dp_reduce_step just before it), as
 * an info line for the benches (bench/distributed/bench_dp.sh). On free cores the two agree; on a
 * loaded machine the wall clock measures the load. */
void train_dp_report(const train_dp *dp);
/* Rank 0's weights to every rank (after loading; adapters initialised at random included) but the
 * trained views for which `keep` (NULL: none) says each rank holds its own. */
ctrl_status train_dp_broadcast_weights(const train_dp *dp, ctrl_model *m,
                                       int (*keep)(const ctrl_param_view *v));
/* Checks that every rank holds the same weights (a checksum compared): an error naming the step
 * when they diverged. */
ctrl_status train_dp_check_weights(const train_dp *dp, ctrl_model *m, long step);
/* v[0..n) summed over the ranks (a kind's counts). */
ctrl_status train_dp_sum(double *v, size_t n);
/* 1 when `flag` is set on any rank. */
int train_dp_any(const train_dp *dp, int flag);
/* Every rank runs rank 0's config: each compares rank 0's values with its own, and a key that
 * differs (or is set on one side only) is a config error on that rank naming the key and both
 * values, and on the others one naming that rank. A no-op on one rank. (data_parallel_config.c) */
ctrl_status train_dp_agree_config(const ctrl_config *cfg);
/* See above: a count over the whole accumulated batch of every rank, divided by their number. */
double train_dp_items(long local_count);
/* Evaluation split over the ranks, as the HF Trainer's sharded eval dataloader (Accelerate's
 * BatchSamplerShard): the evaluation's batches of per_device_eval_batch_size rows, in one process's
 * order, batch i on rank i % N -- each batch holds the rows one process would put in it, so its
 * values are one process's. 1 when batch i is this rank's (always with one rank). */
int train_dp_eval_mine(long batch);
/* Lockstep (zero3 evaluating with its layers gathered around each use: every forward is a collective,
 * so every rank must run as many, in the same order): set around such an evaluation (train_run_evaluate).
 * The batch indices an evaluation of n_batches batches walks (with train_dp_eval_mine): n_batches, or in
 * lockstep the next multiple of the ranks, so that each rank runs as many; a batch index past the
 * end is padding (train_dp_eval_batch), as Accelerate's even_batches pads the last round -- the
 * rank runs the last batch again and drops its values. */
void train_dp_eval_set_lockstep(int on);
long train_dp_eval_span(long n_batches);
/* Batch `batch` of n_batches: the batch to run (itself, or for padding the last one); *padding set
 * when its values are to be dropped. */
long train_dp_eval_batch(long batch, long n_batches, int *padding);
/* After a rank evaluated its batches (`st` its status): the outcome agreed (one rank's failure fails
 * every rank, the others with a message naming it), then v[0..n) -- the evaluation's sums and
 * counts -- summed over the ranks, so that the means made from them are one process's (within the
 * summation order's rounding). A rank with fewer batches (an uneven last round) adds what it has:
 * nothing is counted twice, as Accelerate's gather_for_metrics drops its padding. The identity with
 * one rank. */
ctrl_status train_dp_eval_reduce(ctrl_status st, double *v, size_t n);
/* The evaluation's info line's note on the split into buf ("" with one rank): ", rank 0 evaluated
 * `mine` of the `all` batches of N ranks" (`all` summed over the ranks: one process's count). */
void train_dp_eval_note(char *buf, size_t cap, long mine, long all);

#endif
