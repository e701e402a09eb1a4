/* GRPO with TRL's semantics (GRPOTrainer, trl 1.x): group-normalized advantages
 * (scale_rewards group|batch|none), the clipped importance ratio at token or sequence level with
 * epsilon / epsilon_high and the optional `delta` cap, the k3 KL to a reference model (beta != 0,
 * importance-weighted as use_bias_correction_kl says), top_entropy_quantile masking, and the
 * loss aggregations grpo | bnpo | dr_grpo | dapo. The core generates, scores and batches; this
 * plugin turns rewards into advantages and log-probabilities into the loss and dL/dlogp. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/float_order.h>
#include <ctrl/plugin_api.h>

#include "../online_stats.h"
#include "../online_trainer.h"

CTRL_PLUGIN_API_DEFINE;

enum { LOSS_GRPO, LOSS_BNPO, LOSS_DR_GRPO, LOSS_DAPO };
enum { SCALE_GROUP, SCALE_BATCH, SCALE_NONE };

struct ctrl_trainer {
    ctrl_online_spec spec;
    double beta, lo, hi, delta, top_entropy_quantile; /* the ratio is clipped to [lo, hi] */
    int loss_type, scale, sequence_level, bias_correction_kl;
};

static ctrl_status grpo_create(const ctrl_host *host, const ctrl_config *cfg, ctrl_trainer **out) {
    (void)host; /* kept by init (plugin_api.h) */
    ctrl_trainer *t = calloc(1, sizeof *t);
    if (!t) return ctrl_error_set(CTRL_ERR_NOMEM, "trainer grpo: out of memory");
    const char *s = "grpo";
    static const char *const losses[] = {"grpo", "bnpo", "dr_grpo", "dapo", NULL};
    static const char *const scales[] = {"group", "batch", "none", NULL};
    static const char *const levels[] = {"token", "sequence", NULL};
    ctrl_status st = CTRL_OK;
    online_read_options(cfg, s, &t->spec, &t->beta, &t->lo, &t->hi, &st);
    t->delta = ctrl_option_float(cfg, s, "delta", &st);
    t->top_entropy_quantile = ctrl_option_float(cfg, s, "top_entropy_quantile", &st);
    t->bias_correction_kl = ctrl_option_bool(cfg, s, "use_bias_correction_kl", &st);
    t->loss_type = ctrl_option_choice(cfg, s, "loss_type", losses, &st);
    t->scale = ctrl_option_choice(cfg, s, "scale_rewards", scales, &st);
    t->sequence_level = ctrl_option_choice(cfg, s, "importance_sampling_level", levels, &st) == 1;
    if (st != CTRL_OK) {
        free(t);
        return st;
    }
    /* without old log-probs the ratio is exp(0) = 1 and, with no KL term and no entropy mask,
     * dL/dlogp is a function of the advantages and the mask alone (grpo_loss) */
    t->spec.dlogp_before_forward = t->beta == 0 && t->top_entropy_quantile >= 1.0;
    *out = t;
    return CTRL_OK;
}

static ctrl_status grpo_spec(ctrl_trainer *t, ctrl_online_spec *out) {
    *out = t->spec;
    return CTRL_OK;
}

/* A = r - mean(group), divided by (std + 1e-4) unless scale_rewards = none; completions no reward
 * function scored (NaN) get 0. */
static ctrl_status grpo_advantages(ctrl_trainer *t, const ctrl_rollout *r, float *adv) {
    const int G = r->group, n = r->n;
    ctrl_status st = online_check_groups("grpo", r);
    if (st != CTRL_OK) return st;
    const double batch_std = n > 1 ? online_nanstd(r->rewards, n, 1) : 0.0;
    long zero_std = 0;
    for (int g = 0; g < n / G; g++) {
        const float *x = r->rewards + (size_t)g * G;
        const double mean = online_nanmean(x, G, 1);
        double std = t->scale == SCALE_BATCH ? batch_std : (G > 1 ? online_nanstd(x, G, 1) : 0.0);
        for (int i = 0; i < G; i++) {
            double a = x[i] - mean;
            if (t->scale != SCALE_NONE) a /= std + 1e-4;
            adv[g * G + i] = isnan(a) ? 0.0f : (float)a;
            zero_std += online_isclose0(std);
        }
    }
    if (r->report) r->report(r->report_ctx, "frac_reward_zero_std", (double)zero_std / n);
    return CTRL_OK;
}

/* torch.quantile(values, q) with linear interpolation; sorts `v` in place. */
static double quantile(float *v, int n, double q) {
    qsort(v, (size_t)n, sizeof *v, ctrl_float_ascending);
    const double pos = q * (n - 1);
    const int lo = (int)floor(pos);
    const int hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (pos - lo) * (v[hi] - v[lo]);
}

/* The entropy threshold of top_entropy_quantile over the micro-batch's trained tokens (TRL's
 * get_high_entropy_mask) into *thr; -INFINITY keeps every token, INFINITY none. */
static ctrl_status entropy_threshold(const ctrl_trainer *t, const ctrl_trainer_batch *b, double *thr) {
    *thr = -INFINITY;
    if (t->top_entropy_quantile >= 1.0) return CTRL_OK;
    float *v = malloc(sizeof(float) * (size_t)(b->T > 0 ? b->T : 1));
    if (!v) return ctrl_error_set(CTRL_ERR_NOMEM, "trainer grpo: out of memory for %d entropies", b->T);
    int n = 0;
    for (int i = 0; i < b->T; i++)
        if (b->weight[i] > 0) v[n++] = b->entropy[i];
    *thr = n ? quantile(v, n, 1.0 - t->top_entropy_quantile) : INFINITY;
    free(v);
    return CTRL_OK;
}

static ctrl_status check_batch(const ctrl_trainer *t, const ctrl_trainer_batch *b) {
    if (b->size < sizeof(ctrl_trainer_batch) || b->n_seq < 1 || !b->cu_seqlens || !b->advantages)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer grpo: the batch carries no sequences or advantages "
                                                "(an online trainer runs under the core's generation loop)");
    if (t->beta != 0 && !b->ref_logp)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer grpo: beta != 0 needs reference log-probs");
    if ((t->top_entropy_quantile < 1.0 || b->report) && !b->entropy)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer grpo: the batch carries no entropies");
    return CTRL_OK;
}

static ctrl_status grpo_loss(ctrl_trainer *t, const ctrl_trainer_batch *b, double *loss, float *dlogp) {
    ctrl_status st = check_batch(t, b);
    if (st != CTRL_OK) return st;
    const int ga = b->grad_accum > 0 ? b->grad_accum : 1, S = b->n_seq;
    double thr;
    if ((st = entropy_threshold(t, b, &thr)) != CTRL_OK) return st;
    const double lo = t->lo, hi = t->hi;
    double mask_total = 0, L = 0;
    for (int i = 0; i < b->T; i++) mask_total += b->weight[i] > 0;
    /* metrics: sums over trained tokens (token level) or sequences (sequence level) */
    double m_low = 0, m_high = 0, m_region = 0, m_kl = 0, m_ent = 0, low_min = NAN, high_max = NAN;
    for (int s = 0; s < S; s++) {
        const int t0 = b->cu_seqlens[s], t1 = b->cu_seqlens[s + 1];
        const double A = b->advantages[s];
        double cnt = 0, seq_lr = 0;
        for (int i = t0; i < t1; i++)
            if (b->weight[i] > 0) cnt += 1, seq_lr += b->old_logp ? b->logp[i] - b->old_logp[i] : 0.0;
        const double denom = cnt > 1 ? cnt : 1;
        const double seq_c1 = exp(seq_lr / denom);
        double agg; /* each trained token's weight in the loss */
        switch (t->loss_type) {
        case LOSS_GRPO: agg = 1.0 / denom / S / ga; break;
        case LOSS_BNPO: agg = 1.0 / (mask_total > 1 ? mask_total : 1) / ga; break;
        case LOSS_DR_GRPO: agg = 1.0 / ((double)S * t->spec.max_completion_length) / ga; break;
        default: agg = 1.0 / (b->num_items > 1 ? b->num_items : 1); break;
        }
        double dseq = 0, s_low = 0, s_high = 0; /* dL/dcoef1 of the sequence; its clipped tokens */
        for (int i = t0; i < t1; i++) {
            dlogp[i] = 0;
            if (!(b->weight[i] > 0)) continue;
            const double lr = b->old_logp ? b->logp[i] - b->old_logp[i] : 0.0;
            const double c1 = t->sequence_level ? seq_c1 : exp(lr), c1d = online_capped(c1, t->delta);
            const double em = thr == -INFINITY || (double)b->entropy[i] >= thr ? 1.0 : 0.0;
            double dc1, pl = online_clipped_loss(c1, A, lo, hi, t->delta, &dc1) * em, dlp = 0;
            dc1 *= em;
            if (t->beta != 0) {
                const double d = b->ref_logp[i] - b->logp[i], e = exp(d), kl = e - d - 1;
                const double w = t->bias_correction_kl ? c1 : 1.0;
                pl += t->beta * kl * w;
                dlp += t->beta * (1 - e) * w; /* d kl / d logp = 1 - exp(ref - logp) */
                if (t->bias_correction_kl) dc1 += t->beta * kl;
                m_kl += kl * w;
            }
            L += agg * pl;
            if (t->sequence_level)
                dseq += agg * dc1, dlogp[i] = (float)(agg * dlp);
            else
                dlogp[i] = (float)(agg * (dlp + dc1 * c1));
            const int is_low = online_clipped_low(c1d, A, lo), is_high = online_clipped_high(c1d, A, hi);
            s_low += is_low, s_high += is_high;
            if (b->entropy) m_ent += b->entropy[i];
        }
        if (t->sequence_level && cnt > 0)
            for (int i = t0; i < t1; i++)
                if (b->weight[i] > 0) dlogp[i] += (float)(dseq * seq_c1 / denom);
        /* per-sequence clip fractions; a sequence-level ratio clips all of a sequence or none, and
         * TRL counts it once per sequence, empty ones included */
        double fl = cnt > 0 ? s_low / cnt : NAN, fh = cnt > 0 ? s_high / cnt : NAN;
        if (t->sequence_level) {
            const double c1d = online_capped(seq_c1, t->delta);
            fl = online_clipped_low(c1d, A, lo), fh = online_clipped_high(c1d, A, hi);
            m_low += fl, m_high += fh, m_region += fl + fh;
        } else {
            m_low += s_low, m_high += s_high, m_region += s_low + s_high;
        }
        if (!isnan(fl) && (isnan(low_min) || fl < low_min)) low_min = fl;
        if (!isnan(fh) && (isnan(high_max) || fh > high_max)) high_max = fh;
    }
    *loss = L;
    if (b->report) {
        const double tok = mask_total > 1 ? mask_total : 1, clip_n = t->sequence_level ? S : tok;
        if (t->beta != 0) b->report(b->report_ctx, "kl", m_kl / tok);
        b->report(b->report_ctx, "entropy", m_ent / tok);
        b->report(b->report_ctx, "clip_ratio/low_mean", m_low / clip_n);
        b->report(b->report_ctx, "clip_ratio/high_mean", m_high / clip_n);
        b->report(b->report_ctx, "clip_ratio/region_mean", m_region / clip_n);
        b->report(b->report_ctx, "clip_ratio/low_min", low_min);
        b->report(b->report_ctx, "clip_ratio/high_max", high_max);
    }
    return CTRL_OK;
}

static void grpo_destroy(ctrl_trainer *t) { free(t); }

static const ctrl_trainer_ops grpo_ops = {
    .size = sizeof(ctrl_trainer_ops),
    .create = grpo_create,
    .loss = grpo_loss,
    .destroy = grpo_destroy,
    .online_spec = grpo_spec,
    .advantages = grpo_advantages,
};

static const ctrl_option grpo_options[] = {
    ONLINE_OPTION_NUM_GENERATIONS(
        "8", "Completions sampled per prompt (a group); the generation batch must be a multiple of it."),
    ONLINE_OPTIONS_GENERATION,
    ONLINE_OPTION_BETA(
        "0.0", "KL coefficient (k3 estimator against the initial model); 0 loads no reference model."),
    ONLINE_OPTIONS_CLIP,
    {"delta", CTRL_OPT_FLOAT, "0", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Upper cap of the unclipped ratio (two-sided clipping; 0 = off, > 1 + epsilon recommended)."},
    {"importance_sampling_level", CTRL_OPT_CHOICE, "token", 0, 0, 0, "token|sequence",
     "Importance ratio per token, or per sequence from its mean log-ratio (GSPO)."},
    {"loss_type", CTRL_OPT_CHOICE, "dapo", 0, 0, 0, "grpo|bnpo|dr_grpo|dapo",
     "Aggregation: per-sequence mean (grpo), token mean over the micro-batch (bnpo), sum over "
     "B x max_completion_length (dr_grpo), token mean over the generation batch (dapo)."},
    {"scale_rewards", CTRL_OPT_CHOICE, "group", 0, 0, 0, "group|batch|none",
     "Divide advantages by the group's reward std, the batch's, or not at all."},
    {"top_entropy_quantile", CTRL_OPT_FLOAT, "1.0", CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX, 0, 1, NULL,
     "Train only on the tokens whose entropy is in this top fraction of the micro-batch (1 = all)."},
    {"use_bias_correction_kl", CTRL_OPT_BOOL, "true", 0, 0, 0, NULL,
     "Multiply the KL term by the importance ratio (unbiased reverse-KL gradient, TRL's default)."},
    CTRL_OPTION_END,
};

static const ctrl_plugin grpo_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_TRAINER,
    .name = "grpo",
    .version = "0.1.0",
    .summary = "Group Relative Policy Optimization with TRL's losses (grpo, bnpo, dr_grpo, dapo)",
    .options = grpo_options,
    .init = ctrl_plugin_api_init,
    .ops = &grpo_ops,
};

CTRL_PLUGIN_DEFINE(&grpo_plugin)
