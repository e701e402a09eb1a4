/* Kinds of trainer: what the shared step loop (train_loop.c) asks of each. The loop owns the
 * schedule, gradient accumulation's bookkeeping, clipping, the optimizer, health checks,
 * checkpoints, the metrics file and the evaluation cadence; a kind owns its rows (what an epoch
 * iterates over), how one optimizer step's gradients are accumulated from them, its evaluation
 * and its metric names. A trainer plugin's ops decide its kind (train_kind_for):
 *
 *   token     (kind_token.c)  offline, token-level: SFT. Rows are tokenized examples; the plugin's
 *                             `loss` turns per-token log-probs into the loss and dL/dlogp.
 *   online    (kind_online.c) GRPO, RLOO: rows are prompts; generation batches are sampled from the
 *                             live weights, scored by the reward set, turned into advantages by the
 *                             plugin, then trained on as token-level micro-batches (online_loop.c).
 *   sequence  (kind_sequence*.c: DPO, KTO, reward models) offline, sequence-level: rows
 *                             are preference pairs {prompt, chosen, rejected} or labelled
 *                             completions {prompt, completion, label}. Its accumulate, per
 *                             micro-batch: lay the pairs out flat (chosen then rejected, padding
 *                             free), one forward through the fused head (logp per token), reduce to
 *                             per-sequence sums (sequence.c: train_sequence_sums), add the
 *                             reference sums (a frozen copy, or precomputed before training as
 *                             precompute_ref_logp asks), call the plugin's sequence_loss
 *                             (ctrl_sequence_batch in <ctrl/trainer.h>), spread dL/dlogp_sum back
 *                             over the tokens (train_sequence_spread) and run the backward. Its
 *                             rows_per_step counts pairs; num_items is the accumulated batch's
 *                             pair count (sequences when unpaired), so a batch split differently
 *                             gives the same loss.
 *   distill   (kind_distill.c: GKD) offline rows (SFT examples) whose completions may be
 *                             replaced by the student's or the teacher's samples; each micro-batch
 *                             is trained on the generalized JSD from a frozen teacher
 *                             (train/teacher.h), computed chunk by chunk from both heads
 *                             (ctrl_model_jsd_forward); the plugin's distill_loss turns the
 *                             per-token divergences into the loss and dL/djsd.
 *
 * Adding a kind is a new kind_*.c with a train_kind_ops and a line in train_kind_for; the loop
 * does not change. */
#ifndef CTRL_CORE_TRAIN_KIND_H
#define CTRL_CORE_TRAIN_KIND_H

#include <stddef.h>
#include <stdio.h>

#include <ctrl/trainer.h>

#include "config/config_load.h"
#include "tokenizer/tokenizer.h"
#include "train/compute.h"

/* 1 when a trainer plugin built against this header or an older one has `member` set (its
 * table's size covers the member). */
#define TRAINER_HAS(ops, member)                                                                             \
    ((ops)->size >= offsetof(ctrl_trainer_ops, member) + sizeof((ops)->member) && (ops)->member)

/* What a kind is made from (owned by the loop, alive as long as the kind). */
typedef struct train_kind_env {
    const ctrl_config *cfg; /* for the data loaders and the plugins' create() */
    const ctrl_run_settings *settings;
    const ctrl_run_plugins *plugins;
    ctrl_model *model;
    const ctrl_tokenizer *tok;
    const ctrl_trainer_ops *trainer_ops;
    ctrl_trainer *trainer;
    /* ZeRO-3 (zero.h): the whole model gathered on every rank (on = 1, a collective) for what reads
     * it outside the layer hooks -- a generation phase, DeepSpeed's ds3_gather_for_generation --
     * and released after (on = 0); nothing without zero3 */
    ctrl_status (*whole_weights)(void *ctx, int on);
    void *whole_ctx;
    /* ZeRO-3: every layer gathered on every rank (on = 1, a collective) and released (0), whatever
     * ds3_gather_for_generation says -- for TR-DPO's sync of the reference; nothing without zero3 */
    ctrl_status (*gather_whole)(void *ctx, int on);
    void *gather_ctx;
    /* ZeRO-3: the weights pushed to a `ctrl serve` (server mode) made readable around the push, on =
     * 1 before, 0 after it (ctrl_remote_server.whole: train_zero_push); nothing without zero3 */
    ctrl_status (*push_whole)(void *ctx, int on);
    void *push_ctx;
    /* ZeRO-3 on several ranks with the policy's layers sliced (train_zero_load): a frozen model the
     * kind keeps beside it (the sequence kind's reference) is sliced too (zero_ref.h), its gathers
     * prefetched by zero3_prefetch floats (prefetch_bucket_size); 0 otherwise */
    int zero3_sliced;
    size_t zero3_prefetch;
    /* ZeRO-3 on several ranks, however the policy was loaded (a LoRA run reads it whole before
     * slicing it): a frozen model of its own files the kind keeps beside it (GKD's teacher) can be
     * sliced (zero_ref.h; on a CUDA model on its device); 0 otherwise */
    int zero3_frozen;
    /* ZeRO-3: the policy's train_zero (zero.h), set up after the kind is created -- where a sliced
     * reference's sync (TR-DPO on a device) reads the policy's slices; NULL otherwise */
    struct train_zero *zero3_policy;
} train_kind_env;

/* One optimizer step as a kind reports it (the loop adds the gradient norm). */
typedef struct train_step_stats {
    double loss;     /* the step's loss (summed over its micro-batches' shares) */
    double accuracy; /* token accuracy and entropy over the trained tokens (0 where not measured) */
    double entropy;
    long tokens;  /* what TRL's num_tokens counts for this step */
    long trained; /* trained targets */
} train_step_stats;

/* The logging window's means, for a kind's metrics line. */
typedef struct train_window {
    long step, total;
    double loss, grad_norm, learning_rate, entropy, accuracy, tokens_per_second;
} train_window;

typedef struct train_kind train_kind; /* a kind's own state */

typedef struct train_kind_ops {
    const char *name;
    ctrl_status (*create)(const train_kind_env *env, train_kind **out);
    void (*destroy)(train_kind *k);
    /* The rows an epoch iterates over, and how many one optimizer step of bs x ga consumes. */
    int (*row_count)(const train_kind *k);
    long (*rows_per_step)(const train_kind *k, int bs, int ga);
    /* The "training: ..." line. */
    void (*describe)(const train_kind *k, long total_steps, int bs, int ga, size_t n_params);
    /* One optimizer step's gradients, into the model's (zeroed) gradient buffers: ga micro-batches
     * of bs taking rows order[*cursor % row_count ...] (advancing *cursor). */
    ctrl_status (*accumulate)(train_kind *k, const int *order, long *cursor, int bs, int ga,
                              train_step_stats *out);
    /* After each optimizer step (may be NULL); `step`: the optimizer steps done, counted from the
     * run's start through resumes (the HF Trainer's state.global_step). */
    ctrl_status (*after_step)(train_kind *k, long step);
    /* The wall time of the whole step just done and the process's CPU time in it, user + system of
     * every thread (may be NULL: not logged). */
    void (*step_time)(train_kind *k, double seconds, double cpu_seconds);
    /* Writes the window's metrics as JSON members ("loss": ..., ...) between the loop's "step"
     * and "num_tokens", and the terminal's progress line when stderr is not a terminal. */
    void (*log_window)(train_kind *k, const train_window *w, FILE *metrics);
    /* Evaluation: has_eval says whether there is anything to evaluate; evaluate writes its own
     * metrics line for `step`. eval_at_start: also before the first step (RL's "before"). */
    int (*has_eval)(const train_kind *k);
    ctrl_status (*evaluate)(train_kind *k, long step, FILE *metrics);
    int eval_at_start;
    /* Data parallel (train/data_parallel.h). 0: the loop hands each rank its share of the step's
     * rows. 1: the kind splits the work itself -- it gets the epoch's whole order and the global
     * cursor, advances that by every rank's rows (online: generation batches are split by prompts
     * and gathered, as TRL's). Either way evaluate runs on every rank with `metrics` NULL except on
     * rank 0: each rank evaluates its batches (train_dp_eval_mine) and the values are summed over
     * the ranks (train_dp_eval_reduce) -- the online kind's too (its batches' prompts sampled and
     * scored, the reward sums reduced). */
    int splits_ranks;
    /* Right after the policy's optimizer step, with its learning rate and step (from 1): a kind
     * that trains a second model steps it here (may be NULL). */
    ctrl_status (*optimizer_step)(train_kind *k, double lr, long step);
    /* 1: the kind reads the tokenizer only in create (its rows are tokenized when loaded), so the
     * loop frees it right after, before the optimizer state and activations exist (a 151k
     * vocabulary's tokenizer holds ~90 MiB). */
    int tokenizer_only_at_create;
    /* Checkpoints (may be NULL): what the kind trains besides the model (a value model) written into
     * a checkpoint directory being made (rank 0 only), and read back from one by every rank when
     * the run resumes there, after `step` optimizer steps. */
    ctrl_status (*save_state)(train_kind *k, const char *dir);
    ctrl_status (*load_state)(train_kind *k, const char *dir, long step);
    /* (may be NULL) On every rank but 0, after its ZeRO optimizer state went to rank 0, while rank 0
     * is in save_state: what that writes of this rank's (zero3's sliced value model: its slices). */
    ctrl_status (*save_state_serve)(train_kind *k);
    /* ZeRO-3 (may be NULL): around an evaluation, on every rank (a collective), the kind's own sliced
     * models (the sequence kind's reference) gathered whole (on = 1) and released after (on = 0). */
    ctrl_status (*eval_whole)(train_kind *k, int on);
    /* 1: evaluate's forwards (the policy's, a sliced reference's or teacher's) are the training
     * forwards' calls without the backward, the batches walked with train_dp_eval_span, so under
     * zero3 they run with the layers gathered around each use as in training, every rank running as
     * many (data_parallel.h's lockstep), and nothing is gathered whole (eval_whole not called); the
     * online kind's evaluation generates through the same whole_weights hook as its training
     * (ds3_gather_for_generation: whole, or a layer at a time with idle passes; server mode: the
     * push) and scores with the reward functions only. 0: the whole model gathered on every rank
     * around the evaluation. */
    int eval_layerwise;
    /* (may be NULL) Once, on every rank, when the run is set up -- ZeRO's hooks attached, the optimizer
     * made -- before a checkpoint's state is read and before the first step: work that runs through the
     * policy as training will (a collective under zero3). The sequence kind precomputes a LoRA
     * policy's reference log-probs here: its base with the adapters off, gathered as training gathers
     * it, whatever the ZeRO stage (kind_sequence_ref.c). */
    ctrl_status (*ready)(train_kind *k);
} train_kind_ops;

extern const train_kind_ops train_kind_token;
extern const train_kind_ops train_kind_online;
extern const train_kind_ops train_kind_sequence;
extern const train_kind_ops train_kind_distill;

/* The kind a trainer plugin's ops call for (an error naming the trainer when none fits). */
ctrl_status train_kind_for(const ctrl_trainer_ops *ops, const char *trainer_name, const train_kind_ops **out);

#endif
