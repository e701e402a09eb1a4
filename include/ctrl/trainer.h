/* Trainer plugins (sft, dpo, grpo, ...): the kind's vtable. The core owns the loop (steps,
 * accumulation, schedules, clipping, checkpoints); a trainer turns rows into examples and a
 * micro-batch into a loss and dL/dlogp. This table grows as the trainer issues land. */
#ifndef CTRL_TRAINER_H
#define CTRL_TRAINER_H

#include <stdint.h>

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

    /* Online trainers (grpo, rloo); zero or NULL for offline ones. The micro-batch holds n_seq
     * prompt + completion sequences laid out flat: sequence s is tokens [cu_seqlens[s],
     * cu_seqlens[s+1]), and `weight` marks its completion tokens that are trained. */
    int n_seq;
    const int32_t *cu_seqlens; /* [n_seq + 1] */
    const float *advantages;   /* [n_seq] */
    const float *old_logp;     /* [T] log-probs under the policy that generated (NULL: this forward's,
                                  detached, as TRL when they are equal) */
    const float *ref_logp;     /* [T] the reference model's (NULL when the trainer asked for none) */
    const float *entropy;      /* [T] the policy's per-token entropy (temperature applied) */
    int grad_accum;            /* micro-batches in this optimizer step */
    /* Metrics with TRL's names: the trainer reports each once per micro-batch (or per generation
     * batch, from `advantages`); the core logs each name's mean over the logging window. */
    void (*report)(void *ctx, const char *name, double value);
    void *report_ctx;
    /* Appended (issue 17, ppo). Token-level online trainers with a value model (spec.value_model;
     * NULL / 0 otherwise), per token [T] of the flat layout, as ctrl_token_rollout wrote them: */
    const float *token_advantages; /* the token's advantage (`weight` is TRL's policy mask) */
    const float *returns;          /* the value target */
    const float *old_values;       /* the value model's output at generation */
    const float *values;           /* the value model's output in this forward (its gradient is kept) */
    const float *value_weight;     /* 1 where the value loss reads (one token past the policy's) */
    const float *stat_weight;      /* 1 at the positions of the padded response width that the layout
                                      holds (per-token metrics averaged over them) */
    float *dvalues;                /* written by `loss`: dL/dvalues [T] */
    int width;                     /* the generation batch's response width W (TRL's padded width) */
} ctrl_trainer_batch;

/* What an online trainer asks of the core's generation loop. */
typedef struct ctrl_online_spec {
    size_t size;                    /* sizeof(ctrl_online_spec) as built */
    int num_generations;            /* completions per prompt (a group) */
    int max_completion_length;      /* new tokens per completion at most */
    int steps_per_generation;       /* micro-batches one generation batch feeds (0: the gradient
                                       accumulation steps, as TRL) */
    int num_iterations;             /* optimizer passes over each generation batch (TRL's mu) */
    int needs_old_logp;             /* 1: always compute the generating policy's log-probs (RLOO);
                                       0: only when the policy moves between generation and loss */
    int needs_ref_logp;             /* 1: a reference model's log-probs (beta != 0) */
    int mask_truncated_completions; /* completions cut at max_completion_length are not trained */
    /* Appended (issue 17, online_dpo). */
    int batch_counts_prompts;     /* 1: per_device_train_batch_size counts prompts, a micro-batch holds
                                     it x num_generations completions (TRL's online DPO); 0: completions */
    int logp_at_unit_temperature; /* 1: trained and reference log-probs at temperature 1 (TRL's online
                                     DPO); 0: at the sampling temperature (GRPO, RLOO) */
    int max_length;               /* > 0: a prompt + completion longer than this loses its prompt's
                                     leftmost tokens in the log-prob forwards (not in generation) */
    /* Appended (issue 17, ppo). */
    int value_model;   /* 1: a value model beside the policy ([ppo] value_model), trained with it; the
                          trainer's token_rollout replaces `advantages` and the micro-batches carry
                          values (PPO) */
    int stop;          /* which tokens end a completion: CTRL_ONLINE_STOP_* */
    int stop_token_id; /* with CTRL_ONLINE_STOP_ID */
    int shuffle;       /* 1: the generation batch is shuffled before each pass over it (TRL's PPO
                          permutes it every epoch) */
    /* Appended: with value_model, the value model's directory as the trainer's config gives it
     * ([ppo] value_model; a string of the config); NULL or "": the policy's, under a fresh head. */
    const char *value_model_path;
    /* Appended (issue 21): 1 when, for a micro-batch without old_logp, ref_logp and values, `loss`'s
     * dL/dlogp depends on neither logp nor entropy (GRPO with beta = 0 and no entropy mask: the
     * ratio to the generating policy is exactly 1). The core may then call `loss` before the
     * forward on zero log-probs (entropy and report NULL) for dL/dlogp, fuse the LM head's backward
     * into the forward (the logits computed once, not again in the backward), and call `loss` again
     * on the real log-probs for the loss and the metrics; the two dL/dlogp must be the same. */
    int dlogp_before_forward;
} ctrl_online_spec;

enum {
    CTRL_ONLINE_STOP_MODEL = 0, /* generation_config.json's eos ids (GRPO, RLOO) */
    CTRL_ONLINE_STOP_EOS,       /* the tokenizer's EOS only */
    CTRL_ONLINE_STOP_ID,        /* stop_token_id only */
    CTRL_ONLINE_STOP_NONE,      /* none: every completion is max_completion_length tokens */
};

/* Appended (issue 17, ppo). A scored generation batch for a token-level trainer: n responses padded
 * to the batch's width with pad_token_id (as HF generate returns them), row-major [n * width]; index
 * t of a row is the t-th generated token, and values[t] the value model's output at the token before
 * it (the last prompt token for t = 0). The trainer writes the per-token targets the micro-batches
 * then carry. */
typedef struct ctrl_token_rollout {
    size_t size; /* sizeof(ctrl_token_rollout) as built */
    int n, width;
    int pad_token_id, eos_token_id;
    const int32_t *responses; /* [n * width] */
    const float *logp;        /* [n * width] the generating policy's log-probs (any value past a row's end) */
    const float *ref_logp;    /* [n * width] the reference model's */
    const float *values;      /* [n * width] the value model's */
    const float *scores;      /* [n] the reward functions' weighted sum (0 where none applied) */
    float *advantages, *returns, *old_values; /* [n * width] written */
    float *policy_mask, *value_mask;          /* [n * width] written: 1 where trained */
    void (*report)(void *ctx, const char *name, double value);
    void *report_ctx;
} ctrl_token_rollout;

/* One generation batch after scoring, for the advantages. */
typedef struct ctrl_rollout {
    size_t size;          /* sizeof(ctrl_rollout) as built */
    int n;                /* completions; i * group .. i * group + group - 1 answer prompt i */
    int group;            /* num_generations */
    const float *rewards; /* [n] weighted sum over reward functions, NaN where none applied */
    const float *kl;      /* [n] sum over completion tokens of old - reference log-prob (NULL when
                             no reference log-probs were asked for) */
    const int *n_tokens;  /* [n] trained completion tokens of each */
    void (*report)(void *ctx, const char *name, double value);
    void *report_ctx;
    /* Appended (issue 17, online_dpo). */
    const int *stopped; /* [n] 1 where a stop id (EOS) ended the completion, 0 where it was cut */
    double epoch;       /* training prompts taken before this batch / prompts in the train set
                           (TRL's state.epoch; 0 for evaluation batches) */
} ctrl_rollout;

/* Offline sequence-level trainers (dpo, kto, reward; issue 16): the loss sees one number per
 * sequence. A micro-batch holds n_seq prompt + completion sequences laid out flat (sequence s is
 * tokens [cu_seqlens[s], cu_seqlens[s+1])); `weight` marks its completion tokens. Paired data
 * (DPO, reward): sequences [0, n_pairs) are the chosen completions and [n_pairs, 2 n_pairs) the
 * rejected ones, pair i being (i, n_pairs + i), as TRL concatenates them. Unpaired data (KTO):
 * n_pairs = 0 and `label` says which completions are desirable; KTO's KL estimate comes from
 * extra sequences (mismatched prompt/completion pairs, as TRL builds them) flagged in `kl`. The
 * core computes the per-sequence sums from one forward through the fused head (no
 * [tokens x vocabulary] logits tensor), the reference model's sums (live, or precomputed before
 * training), and spreads the plugin's dL/dlogp_sum over each sequence's completion tokens. */
typedef struct ctrl_sequence_batch {
    size_t size; /* sizeof(ctrl_sequence_batch) as built */
    int T;       /* tokens in the flat micro-batch */
    int n_seq;
    int n_pairs;
    const int32_t *cu_seqlens;  /* [n_seq + 1] */
    const float *logp;          /* [T] log pi(target_t | prefix) under the policy */
    const float *weight;        /* [T] 1 on completion tokens that are trained, else 0 */
    const double *logp_sum;     /* [n_seq] sum of logp * weight over the sequence (TRL's logps;
                                   LD-DPO-weighted with spec.length_desensitized) */
    const int *n_tokens;        /* [n_seq] completion tokens (for length-normalised losses) */
    const double *ref_logp_sum; /* [n_seq] the same under the reference model (NULL: none asked) */
    const double *mean_logit;   /* [n_seq] mean over the completion tokens of the mean logit over
                                   the vocabulary (TRL's logits/chosen, token-weighted by n_tokens) */
    const float *score;         /* [n_seq] reward trainer: the score head at the last non-pad token
                                   (NULL for the others) */
    const float *label;         /* [n_seq] KTO: 1 desirable, 0 undesirable (NULL when paired) */
    const uint8_t *kl;          /* [n_seq] KTO: 1 for the KL estimate's mismatched sequences */
    const float *margin;        /* [n_pairs] reward trainer's margin column (NULL when absent) */
    double num_items;           /* sequences (pairs when paired) of the whole accumulated batch */
    void (*report)(void *ctx, const char *name, double value); /* TRL's metric names */
    void *report_ctx;
    /* Appended (issue 16, dpo). Per token [T], from the same fused-head pass as logp: */
    const float *entropy;    /* the policy's entropy (0 where weight is 0) */
    const int32_t *correct;  /* 1 where the target is the argmax (TRL's is_top1) */
    const float *log_sum_sq; /* log sum_v p_v^2 (WPO's weights; NULL unless spec.needs_log_sum_sq) */
    /* Appended (issue 16: data parallel). TRL's gather_for_metrics(x).sum(): v[0..n) replaced by
     * its sum over the n_ranks ranks that train this micro-batch together, for the metrics TRL
     * computes from sums gathered over its processes (token-weighted means, KTO's per-label means)
     * and KTO's KL estimate (their mean). Every rank calls it at the same point with the same n, so
     * a plugin calls it unconditionally, not depending on its own rows. n_ranks is 1 on one process
     * and in evaluation; v is then left as it is. */
    int n_ranks;
    ctrl_status (*sum_over_ranks)(double *v, int n);
    /* Appended: [n_seq] completion tokens of each sequence, TRL's completion_mask sum (IPO's and
     * sigmoid_norm's lengths): n_tokens, plus one for a sequence that starts with a completion
     * token (an empty prompt without BOS), which no log-prob predicts. NULL: use n_tokens. */
    const int *n_completion;
} ctrl_sequence_batch;

/* What a sequence-level trainer asks of the core. */
typedef struct ctrl_sequence_spec {
    size_t size;             /* sizeof(ctrl_sequence_spec) as built */
    int paired;              /* 1: {prompt, chosen, rejected} rows; 0: unpaired {.., label} */
    int needs_ref_logp;      /* 1: reference sums (frozen copy of the initial weights) */
    int precompute_ref_logp; /* 1: computed in one pass before training, not kept in memory */
    int needs_score;         /* 1: a sequence-classification head (reward trainer) */
    int kl_sequences;        /* 1: add KTO's mismatched sequences for the KL estimate */
    /* Appended (issue 16, dpo). */
    int precompute_ref_batch_size; /* pairs per precompute forward (0: per_device_train_batch_size,
                                      per_device_eval_batch_size for the eval set, as TRL) */
    int needs_log_sum_sq;          /* 1: batch.log_sum_sq (one more pass of the head, no gradient) */
    int length_desensitized;       /* LD-DPO: logp_sum and ref_logp_sum weigh a completion's tokens
                                      past the shorter completion of its pair by ld_alpha, and
                                      dL/dlogp_sum is spread with those weights */
    double ld_alpha;
    int sync_ref_model; /* TR-DPO: every ref_model_sync_steps optimizer steps the reference
                           becomes alpha * policy + (1 - alpha) * reference */
    double ref_model_mixup_alpha;
    int ref_model_sync_steps;
} ctrl_sequence_spec;

typedef struct ctrl_trainer_ops {
    size_t size;
    ctrl_status (*create)(const ctrl_host *host, const ctrl_config *cfg, ctrl_trainer **out);
    /* The micro-batch's share of the loss, and dL/dlogp[T] (written). */
    ctrl_status (*loss)(ctrl_trainer *t, const ctrl_trainer_batch *batch, double *loss, float *dlogp);
    void (*destroy)(ctrl_trainer *t);
    /* Online trainers only (NULL otherwise): what to generate, and the advantages [n] of a scored
     * generation batch. */
    ctrl_status (*online_spec)(ctrl_trainer *t, ctrl_online_spec *out);
    ctrl_status (*advantages)(ctrl_trainer *t, const ctrl_rollout *r, float *adv);
    /* 1 when dL/dlogp does not depend on logp (a token NLL, as SFT's): the core may then call `loss`
     * on zero log-probs before the forward for dL/dlogp, and fuse the LM head's backward into its
     * forward (its logits are not recomputed); `loss` is called again on the real log-probs. */
    int dlogp_before_forward;
    /* Offline sequence-level trainers only (NULL otherwise; `loss` may then be NULL): what to
     * build, and the micro-batch's share of the loss with dL/dlogp_sum[n_seq] (written) and, for
     * a score head, dL/dscore[n_seq] (NULL unless spec.needs_score). A loss with a token-level term
     * as well (DPO's `sft` loss_type) writes that term's dL/dlogp[T] into dlogp and sets
     * *per_token = 1: the core adds it to the spread of dL/dlogp_sum (*per_token = 0: dlogp is not
     * read). LD-DPO's weighting is the core's (spec.ld_alpha). */
    ctrl_status (*sequence_spec)(ctrl_trainer *t, ctrl_sequence_spec *out);
    ctrl_status (*sequence_loss)(ctrl_trainer *t, const ctrl_sequence_batch *batch, double *loss,
                                 double *dlogp_sum, float *dscore, float *dlogp, int *per_token);
    /* Appended (issue 17, gkd). Distillation trainers only (NULL otherwise): the core's distill kind
     * runs a trainer that has them (ctrl_trainer_distill_ops below; `loss` may then be NULL). */
    const struct ctrl_trainer_distill_ops *distill;
    /* Appended (issue 17, ppo). Token-level online trainers (spec.value_model): the per-token
     * advantages, returns and masks of a scored generation batch (NULL otherwise). */
    ctrl_status (*token_rollout)(ctrl_trainer *t, ctrl_token_rollout *r);
} ctrl_trainer_ops;

/* Appended (issue 16, kto). The option entries (ctrl_option, plugin.h) of TR-DPO's reference sync,
 * which TRL's DPOConfig and KTOConfig share; a sequence-level trainer lists them in its options and
 * reads them into its ctrl_sequence_spec. */
/* clang-format off */
#define CTRL_SEQUENCE_REF_SYNC_OPTIONS                                                              \
    {"sync_ref_model", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,                                       \
     "TR-DPO: mix the policy into the reference every ref_model_sync_steps steps."},                \
    {"ref_model_mixup_alpha", CTRL_OPT_FLOAT, "0.6", CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX, 0, 1, NULL, \
     "TR-DPO: reference = alpha * policy + (1 - alpha) * reference at each sync."},                 \
    {"ref_model_sync_steps", CTRL_OPT_INT, "512", CTRL_OPT_HAS_MIN, 1, 0, NULL,                     \
     "TR-DPO: optimizer steps between reference syncs."}
/* clang-format on */

/* Appended (issue 17, gkd). Distillation trainers: the loss is linear in the per-token divergence
 * between the student's and a frozen teacher's next-token distributions (model_jsd.c: TRL's
 * generalized JSD, computed by the core chunk by chunk from both heads). A micro-batch holds n_seq
 * prompt + completion sequences laid out flat; `weight` marks the completion tokens compared. */
typedef struct ctrl_distill_batch {
    size_t size;         /* sizeof(ctrl_distill_batch) as built */
    int T;               /* tokens in the flat micro-batch */
    const float *weight; /* [T] 1 where the token is compared (TRL: label != -100), else 0 */
    const float *jsd;    /* [T] the divergence per token; NULL when the core asks for dL/djsd first */
    double num_items;    /* compared tokens of the whole accumulated batch (TRL's num_items_in_batch) */
    int source;          /* where the completions came from: 0 the dataset, 1 the student (on-policy),
                            2 the teacher (seq_kd) */
    void (*report)(void *ctx, const char *name, double value);
    void *report_ctx;
} ctrl_distill_batch;

/* What a distillation trainer asks of the core. */
typedef struct ctrl_distill_spec {
    size_t size;             /* sizeof(ctrl_distill_spec) as built */
    double beta;             /* the divergence: 0 forward KL, 1 reverse KL, between the JSD */
    double loss_temperature; /* softmax temperature of both distributions in the divergence */
    double lmbda;            /* fraction of micro-batches whose completions the student samples */
    int seq_kd;              /* 1: the other micro-batches' completions are the teacher's samples */
    int max_new_tokens;      /* tokens sampled per completion at most */
    double temperature;      /* sampling temperature of the student and teacher completions */
} ctrl_distill_spec;

/* The distillation members of the ops table (a trainer with both is run by the core's distill
 * kind; its `loss` may be NULL). distill_loss: the micro-batch's share of the loss from
 * batch->jsd, and dL/djsd[T] (written; it must not depend on jsd: the core calls it once with
 * jsd NULL before the forward for the weights, and again with the divergences for the loss and
 * the metrics). */
typedef struct ctrl_trainer_distill_ops {
    ctrl_status (*distill_spec)(ctrl_trainer *t, ctrl_distill_spec *out);
    ctrl_status (*distill_loss)(ctrl_trainer *t, const ctrl_distill_batch *b, double *loss, float *djsd);
} ctrl_trainer_distill_ops;

#ifdef __cplusplus
}
#endif
#endif
