/* PPO's arithmetic as TRL's PPOTrainer (trl 0.25, the last that shipped trl/trainer/ppo_trainer.py)
 * computes it, on plain arrays so that tests can feed it TRL's own tensors. A generation batch is n
 * responses padded to the batch's width W with pad_token_id, as HF generate returns them; index t of
 * a response row is its t-th generated token, and values[t] is the value model's output at the
 * token before it (the last prompt token for t = 0). */
#ifndef CTRL_PLUGINS_TRAINER_PPO_MATH_H
#define CTRL_PLUGINS_TRAINER_PPO_MATH_H

#include <stdint.h>

#include <ctrl/status_code.h>

#define PPO_INVALID_LOGPROB 1.0f /* TRL's fill of log-probs past a response */

typedef struct ppo_options {
    double kl_coef, gamma, lam, cliprange, cliprange_value, vf_coef;
    double missing_eos_penalty; /* 0: none (TRL's None subtracts nothing either) */
    int k3;                     /* kl_estimator: 0 k1, 1 k3 */
    int whiten_rewards;
    int stop_token_id; /* truncate after it (-1: no stop token) */
    int num_ppo_epochs, num_mini_batches;
} ppo_options;

/* The rollout's per-update metrics with TRL's names (objective/..., val/num_eos_tokens). */
typedef struct ppo_rollout_metrics {
    double kl, entropy, non_score_reward, rlhf_reward, scores, num_eos_tokens;
} ppo_rollout_metrics;

/* One generation batch, n x W row-major. In: responses, logp (the generating policy's, at the
 * sampling temperature), ref_logp, values, scores (the reward at each truncated response's end,
 * before missing_eos_penalty). Out (each n x W unless said): the masked log-probs, rewards,
 * advantages (whitened, 0 past each response), returns, values (0 past each response's end + 1),
 * policy_mask (1 where TRL's padding_mask is false) and value_mask (padding_mask_p1 false),
 * scores_out [n] after the penalty, seqlen [n] (index of the last kept token). Any out pointer but
 * advantages / returns / values_out / masks may be NULL. Errors: whitening over fewer than two
 * tokens (TRL divides by zero there). */
typedef struct ppo_rollout_io {
    int n, W, pad_token_id, eos_token_id;
    const int32_t *responses;
    const float *logp, *ref_logp, *values, *scores;
    float *logp_out, *ref_logp_out, *rewards, *advantages, *returns, *values_out, *policy_mask, *value_mask;
    float *scores_out, *kl_out, *non_score_out;
    int *seqlen;
} ppo_rollout_io;

ctrl_status ppo_rollout(const ppo_options *o, ppo_rollout_io *io, ppo_rollout_metrics *m);

/* One micro-batch's loss on m rows of the batch (width W), flat over tokens: at each of T positions
 * logp (new, this forward), old_logp, advantages, returns, old_values and values (vpred, this
 * forward), policy_mask / value_mask as ppo_rollout wrote them, entropy and stat_mask (the positions
 * of the rows' width TRL averages entropy over that the layout holds). Writes the loss (pg_loss +
 * vf_coef vf_loss, divided by grad_accum as accelerate's backward does) and dL/dlogp, dL/dvalues
 * [T]. */
typedef struct ppo_micro_stats {
    double pg_loss, vf_loss, pg_clipfrac, vf_clipfrac, approxkl, entropy, ratio;
} ppo_micro_stats;

typedef struct ppo_micro_io {
    int T, rows, W, grad_accum;
    const float *logp, *old_logp, *advantages, *returns, *old_values, *values, *policy_mask, *value_mask;
    const float *entropy, *stat_mask;
    float *dlogp, *dvalues;
} ppo_micro_io;

ctrl_status ppo_micro_loss(const ppo_options *o, const ppo_micro_io *io, double *loss, ppo_micro_stats *s);

/* TRL's per-update policy metrics from the micro-batches' stats in order (num_ppo_epochs x
 * grad_accum of them): its stats tensors are num_ppo_epochs x num_mini_batches x grad_accum, of
 * which it fills grad_accum / num_mini_batches per mini-batch (the rest stay 0), and it logs their
 * means and the ratio's unbiased variance. */
typedef struct ppo_update_metrics {
    double approxkl, pg_clipfrac, pg_loss, vf_loss, vf_clipfrac, entropy, ratio, ratio_var;
} ppo_update_metrics;

void ppo_update_metrics_of(const ppo_options *o, int grad_accum, const ppo_micro_stats *s, int n,
                           ppo_update_metrics *out);

#endif
