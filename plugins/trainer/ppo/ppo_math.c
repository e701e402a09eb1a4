/* PPO's rollout and loss arithmetic as TRL 0.25's PPOTrainer.train() computes them (see ppo_math.h),
 * in double precision over TRL's fp32 tensors. */
#include "ppo_math.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/plugin_api.h>

/* masked_mean / masked_var(unbiased) as TRL: over the entries where mask is 1. */
static ctrl_status masked_stats(const double *x, const float *mask, size_t N, double *mean, double *var) {
    double s = 0, c = 0;
    for (size_t i = 0; i < N; i++) s += mask[i] * x[i], c += mask[i];
    if (c < 2)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "trainer ppo: whitening over %.0f tokens (TRL needs at least 2: raise "
                              "per_device_train_batch_size or gradient_accumulation_steps)",
                              c);
    *mean = s / c;
    double v = 0;
    for (size_t i = 0; i < N; i++) v += mask[i] * (x[i] - *mean) * (x[i] - *mean);
    *var = v / c * (c / (c - 1));
    return CTRL_OK;
}

/* masked_whiten: (x - mean) / sqrt(var + 1e-8), the mean added back unless shift_mean. */
static ctrl_status masked_whiten(double *x, const float *mask, size_t N, int shift_mean) {
    double mean = 0, var = 0;
    ctrl_status st = masked_stats(x, mask, N, &mean, &var);
    if (st != CTRL_OK) return st;
    const double r = 1.0 / sqrt(var + 1e-8);
    for (size_t i = 0; i < N; i++) x[i] = (x[i] - mean) * r + (shift_mean ? 0 : mean);
    return CTRL_OK;
}

ctrl_status ppo_rollout(const ppo_options *o, ppo_rollout_io *io, ppo_rollout_metrics *m) {
    const int n = io->n, W = io->W;
    const size_t N = (size_t)n * (size_t)W;
    double *rew = malloc(sizeof(double) * (N ? N : 1)), *adv = malloc(sizeof(double) * (N ? N : 1));
    double *val = malloc(sizeof(double) * (N ? N : 1));
    if (!rew || !adv || !val) {
        free(rew), free(adv), free(val);
        return ctrl_error_set(CTRL_ERR_NOMEM, "trainer ppo: out of memory for %zu tokens", N);
    }
    memset(m, 0, sizeof *m);
    double score_sum = 0;
    for (int i = 0; i < n; i++) {
        const int32_t *r = io->responses + (size_t)i * W;
        /* 1. truncate after the first stop token (the rest becomes pad), 2. the last kept token is
         * the one before the first pad (first_true_indices - 1; W - 1 when there is none) */
        int trunc = W, seq = W - 1, has_eos = 0;
        if (o->stop_token_id >= 0)
            for (int t = 0; t < W; t++)
                if (r[t] == o->stop_token_id) {
                    trunc = t;
                    break;
                }
        for (int t = 0; t < W; t++) {
            const int32_t tok = t > trunc ? io->pad_token_id : r[t];
            if (tok == io->pad_token_id) {
                seq = t - 1;
                break;
            }
        }
        for (int t = 0; t < W; t++) {
            const int32_t tok = t > trunc ? io->pad_token_id : r[t];
            has_eos |= tok == io->eos_token_id;
            m->num_eos_tokens += r[t] == io->eos_token_id; /* counted on the untruncated responses */
        }
        /* 3. missing_eos_penalty on responses whose truncated form has no EOS */
        double score = io->scores[i];
        if (!has_eos && o->missing_eos_penalty != 0) score -= o->missing_eos_penalty;
        score_sum += score;
        if (io->scores_out) io->scores_out[i] = (float)score;
        if (io->seqlen) io->seqlen[i] = seq;
        const int end = seq + 1 < W ? seq + 1 : seq; /* where the score is added */
        double kl_row = 0, nsr_row = 0, ent_row = 0;
        for (int t = 0; t < W; t++) {
            const size_t k = (size_t)i * W + t;
            const int pol = t <= seq, vm = t <= seq + 1;
            io->policy_mask[k] = (float)pol, io->value_mask[k] = (float)vm;
            const double lp = pol ? io->logp[k] : PPO_INVALID_LOGPROB;
            const double rl = pol ? io->ref_logp[k] : PPO_INVALID_LOGPROB;
            if (io->logp_out) io->logp_out[k] = (float)lp;
            if (io->ref_logp_out) io->ref_logp_out[k] = (float)rl;
            /* 4. the per-token KL penalty (k1: -logr; k3: (e^logr - 1) - logr) */
            const double logr = (float)((float)rl - (float)lp);
            const double kl = o->k3 ? (exp(logr) - 1) - logr : -logr;
            const double nsr = -o->kl_coef * kl;
            if (io->kl_out) io->kl_out[k] = (float)kl;
            if (io->non_score_out) io->non_score_out[k] = (float)nsr;
            kl_row += kl, nsr_row += nsr, ent_row += -lp;
            rew[k] = nsr + (t == end ? score : 0);
            val[k] = vm ? io->values[k] : 0.0;
        }
        m->kl += kl_row / n, m->non_score_reward += nsr_row / n, m->entropy += ent_row / n;
    }
    m->scores = n ? score_sum / n : 0;
    m->rlhf_reward = m->non_score_reward + m->scores;
    ctrl_status st = CTRL_OK;
    /* 5. whiten the rewards over the value mask, keeping their mean, 0 outside it */
    if (o->whiten_rewards) {
        st = masked_whiten(rew, io->value_mask, N, 0);
        for (size_t k = 0; st == CTRL_OK && k < N; k++)
            if (io->value_mask[k] == 0) rew[k] = 0;
    }
    /* 6. GAE backwards over the width, returns = advantages + values, whitened advantages */
    for (int i = 0; st == CTRL_OK && i < n; i++) {
        double last = 0;
        for (int t = W - 1; t >= 0; t--) {
            const size_t k = (size_t)i * W + t;
            const double next = t < W - 1 ? val[k + 1] : 0.0;
            const double delta = rew[k] + o->gamma * next - val[k];
            last = delta + o->gamma * o->lam * last;
            adv[k] = last;
            io->returns[k] = (float)(last + val[k]);
        }
    }
    if (st == CTRL_OK) st = masked_whiten(adv, io->policy_mask, N, 1);
    for (size_t k = 0; st == CTRL_OK && k < N; k++) {
        io->advantages[k] = io->policy_mask[k] != 0 ? (float)adv[k] : 0.0f;
        io->values_out[k] = (float)val[k];
        if (io->rewards) io->rewards[k] = (float)rew[k];
    }
    free(rew), free(adv), free(val);
    return st;
}

/* d/dx of torch.maximum(a, b) with da, db the two branches' derivatives: split evenly on ties. */
static double dmax(double a, double b, double da, double db) {
    return a > b ? da : a < b ? db : (da + db) / 2;
}

ctrl_status ppo_micro_loss(const ppo_options *o, const ppo_micro_io *io, double *loss, ppo_micro_stats *s) {
    double pg = 0, vf = 0, npol = 0, nval = 0, pg_clip = 0, vf_clip = 0, kl2 = 0, ratio_sum = 0;
    double ent = 0, nent = 0;
    const double c = o->cliprange, cv = o->cliprange_value;
    for (int k = 0; k < io->T; k++) {
        io->dlogp[k] = 0, io->dvalues[k] = 0;
        if (io->stat_mask[k] != 0) ent += io->entropy[k], nent += 1;
        if (io->policy_mask[k] != 0) {
            const double diff = (double)io->logp[k] - io->old_logp[k], ratio = exp(diff),
                         A = io->advantages[k];
            const double cl = ratio < 1 - c ? 1 - c : ratio > 1 + c ? 1 + c : ratio;
            const double l1 = -A * ratio, l2 = -A * cl;
            pg += fmax(l1, l2), npol += 1;
            pg_clip += l2 > l1;
            kl2 += diff * diff, ratio_sum += ratio;
        }
        if (io->value_mask[k] != 0) {
            const double v = io->values[k], ov = io->old_values[k], R = io->returns[k];
            const double vc = v < ov - cv ? ov - cv : v > ov + cv ? ov + cv : v;
            const double l1 = (v - R) * (v - R), l2 = (vc - R) * (vc - R);
            vf += fmax(l1, l2), nval += 1;
            vf_clip += l2 > l1;
        }
    }
    if (npol == 0 || nval == 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer ppo: a micro-batch with no trained token");
    const double ga = io->grad_accum > 0 ? io->grad_accum : 1;
    for (int k = 0; k < io->T; k++) { /* the gradients of pg_loss + vf_coef * vf_loss, over ga */
        if (io->policy_mask[k] != 0) {
            const double ratio = exp((double)io->logp[k] - io->old_logp[k]), A = io->advantages[k];
            const double cl = ratio < 1 - c ? 1 - c : ratio > 1 + c ? 1 + c : ratio;
            const double dr = dmax(-A * ratio, -A * cl, -A, (ratio >= 1 - c && ratio <= 1 + c) ? -A : 0);
            io->dlogp[k] = (float)(dr * ratio / npol / ga);
        }
        if (io->value_mask[k] != 0) {
            const double v = io->values[k], ov = io->old_values[k], R = io->returns[k];
            const double vc = v < ov - cv ? ov - cv : v > ov + cv ? ov + cv : v;
            const double pass = v >= ov - cv && v <= ov + cv;
            const double d = dmax((v - R) * (v - R), (vc - R) * (vc - R), 2 * (v - R), pass * 2 * (vc - R));
            io->dvalues[k] = (float)(o->vf_coef * 0.5 * d / nval / ga);
        }
    }
    const double cells = (double)io->rows * io->W; /* TRL's means over the padded rows */
    s->pg_loss = pg / npol;
    s->vf_loss = 0.5 * vf / nval;
    s->pg_clipfrac = pg_clip / npol;
    s->vf_clipfrac = vf_clip / nval;
    s->approxkl = 0.5 * kl2 / cells;
    s->ratio = (ratio_sum + (cells - npol)) / cells; /* 1 at every padded position */
    s->entropy = nent > 0 ? ent / nent : 0;
    *loss = (s->pg_loss + o->vf_coef * s->vf_loss) / ga;
    return CTRL_OK;
}

void ppo_update_metrics_of(const ppo_options *o, int grad_accum, const ppo_micro_stats *s, int n,
                           ppo_update_metrics *out) {
    const int nmb = o->num_mini_batches > 0 ? o->num_mini_batches : 1;
    const double cells = (double)o->num_ppo_epochs * nmb * grad_accum; /* the stats tensors' size */
    memset(out, 0, sizeof *out);
    for (int i = 0; i < n; i++) {
        out->approxkl += s[i].approxkl / cells, out->pg_clipfrac += s[i].pg_clipfrac / cells;
        out->pg_loss += s[i].pg_loss / cells, out->vf_loss += s[i].vf_loss / cells;
        out->vf_clipfrac += s[i].vf_clipfrac / cells, out->entropy += s[i].entropy / cells;
        out->ratio += s[i].ratio / cells;
    }
    double v = (cells - n) * out->ratio * out->ratio; /* the entries it never fills are 0 */
    for (int i = 0; i < n; i++) v += (s[i].ratio - out->ratio) * (s[i].ratio - out->ratio);
    out->ratio_var = cells > 1 ? v / (cells - 1) : NAN;
}
