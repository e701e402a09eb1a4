/* GRPO with TRL's semantics (GRPOTrainer, trl 1.x): group-normalized advantages
 * (scale_rewards group|batch|none), the clipped importance ratio at token or sequence level with
 * epsilon / epsilon_high and the optional `delta` cap, the k3 KL to a reference model (beta != 0,
 * importance-weighted as use_bias_correction_kl says), top_entropy_quantile masking, and the
 * loss aggregations grpo | bnpo | dr_grpo | dapo. The core generates, scores and batches; this
 * plugin turns rewards into advantages and log-probabilities into the loss and dL/dlogp. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/trainer.h>

#include "../online_stats.h"

enum { LOSS_GRPO, LOSS_BNPO, LOSS_DR_GRPO, LOSS_DAPO };
enum { SCALE_GROUP, SCALE_BATCH, SCALE_NONE };

struct ctrl_trainer {
    const ctrl_host *host;
    ctrl_online_spec spec;
    double beta, eps_low, eps_high, delta, top_entropy_quantile;
    int loss_type, scale, sequence_level, bias_correction_kl;
};

static int pick(const char *v, const char *const *names, int fallback) {
    for (int i = 0; v && names[i]; i++)
        if (!strcmp(v, names[i])) return i;
    return fallback;
}

static ctrl_status grpo_create(const ctrl_host *host, const ctrl_config *cfg, ctrl_trainer **out) {
    ctrl_trainer *t = calloc(1, sizeof *t);
    if (!t) return host->error_set(CTRL_ERR_NOMEM, "trainer grpo: out of memory");
    t->host = host;
    const char *s = "grpo";
    t->spec = (ctrl_online_spec){
        .size = sizeof(ctrl_online_spec),
        .num_generations = (int)host->config_get_int(cfg, s, "num_generations", 8),
        .max_completion_length = (int)host->config_get_int(cfg, s, "max_completion_length", 512),
        .steps_per_generation = (int)host->config_get_int(cfg, s, "steps_per_generation", 0),
        .num_iterations = (int)host->config_get_int(cfg, s, "num_iterations", 1),
        .mask_truncated_completions = host->config_get_bool(cfg, s, "mask_truncated_completions", false),
    };
    t->beta = host->config_get_float(cfg, s, "beta", 0.0);
    t->spec.needs_ref_logp = t->beta != 0.0;
    t->eps_low = host->config_get_float(cfg, s, "epsilon", 0.2);
    t->eps_high = host->config_get_float(cfg, s, "epsilon_high", 0.0);
    if (!(t->eps_high > 0)) t->eps_high = t->eps_low; /* unset: as epsilon */
    t->delta = host->config_get_float(cfg, s, "delta", 0.0);
    t->top_entropy_quantile = host->config_get_float(cfg, s, "top_entropy_quantile", 1.0);
    t->bias_correction_kl = host->config_get_bool(cfg, s, "use_bias_correction_kl", true);
    static const char *const losses[] = {"grpo", "bnpo", "dr_grpo", "dapo", NULL};
    static const char *const scales[] = {"group", "batch", "none", NULL};
    t->loss_type = pick(host->config_get_string(cfg, s, "loss_type"), losses, LOSS_DAPO);
    t->scale = pick(host->config_get_string(cfg, s, "scale_rewards"), scales, SCALE_GROUP);
    const char *level = host->config_get_string(cfg, s, "importance_sampling_level");
    t->sequence_level = level && !strcmp(level, "sequence");
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
    if (G < 1 || n % G)
        return t->host->error_set(CTRL_ERR_RUNTIME, "trainer grpo: %d completions are not groups of %d", n,
                                  G);
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
static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}
static double quantile(float *v, int n, double q) {
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    const double pos = q * (n - 1);
    const int lo = (int)floor(pos);
    const int hi = lo + 1 < n ? lo + 1 : lo;
    return v[lo] + (pos - lo) * (v[hi] - v[lo]);
}

/* The entropy threshold of top_entropy_quantile over the micro-batch's trained tokens (TRL's
 * get_high_entropy_mask); -INFINITY keeps every token, INFINITY none. */
static double entropy_threshold(const ctrl_trainer *t, const ctrl_trainer_batch *b) {
    if (t->top_entropy_quantile >= 1.0) return -INFINITY;
    float *v = malloc(sizeof(float) * (size_t)b->T);
    int n = 0;
    for (int i = 0; v && i < b->T; i++)
        if (b->weight[i] > 0) v[n++] = b->entropy[i];
    double thr = n && v ? quantile(v, n, 1.0 - t->top_entropy_quantile) : INFINITY;
    free(v);
    return thr;
}

/* d(-min(c1d * A, c2 * A)) / dc1 where c1d = min(c1, delta) and c2 = clamp(c1, lo, hi): torch's
 * minimum splits the gradient evenly on ties; clamp passes it inside its range only. */
static double policy_grad(const ctrl_trainer *t, double c1, double A) {
    const double lo = 1 - t->eps_low, hi = 1 + t->eps_high;
    const double c1d = t->delta > 0 && c1 > t->delta ? t->delta : c1;
    const double c2 = c1 < lo ? lo : c1 > hi ? hi : c1;
    const double da = (t->delta > 0 && c1 > t->delta) ? 0 : A, db = (c1 >= lo && c1 <= hi) ? A : 0;
    const double a = c1d * A, bb = c2 * A;
    return a < bb ? -da : a > bb ? -db : -(da + db) / 2;
}

static ctrl_status check_batch(const ctrl_trainer *t, const ctrl_trainer_batch *b) {
    if (b->size < sizeof(ctrl_trainer_batch) || b->n_seq < 1 || !b->cu_seqlens || !b->advantages)
        return t->host->error_set(CTRL_ERR_RUNTIME,
                                  "trainer grpo: the batch carries no sequences or advantages "
                                  "(an online trainer runs under the core's generation loop)");
    if (t->beta != 0 && !b->ref_logp)
        return t->host->error_set(CTRL_ERR_RUNTIME, "trainer grpo: beta != 0 needs reference log-probs");
    if ((t->top_entropy_quantile < 1.0 || b->report) && !b->entropy)
        return t->host->error_set(CTRL_ERR_RUNTIME, "trainer grpo: the batch carries no entropies");
    return CTRL_OK;
}

static ctrl_status grpo_loss(ctrl_trainer *t, const ctrl_trainer_batch *b, double *loss, float *dlogp) {
    ctrl_status st = check_batch(t, b);
    if (st != CTRL_OK) return st;
    const int ga = b->grad_accum > 0 ? b->grad_accum : 1, S = b->n_seq;
    const double thr = entropy_threshold(t, b), lo = 1 - t->eps_low, hi = 1 + t->eps_high;
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
            const double c1 = t->sequence_level ? seq_c1 : exp(lr);
            const double c1d = t->delta > 0 && c1 > t->delta ? t->delta : c1;
            const double c2 = c1 < lo ? lo : c1 > hi ? hi : c1;
            const double em = thr == -INFINITY || (double)b->entropy[i] >= thr ? 1.0 : 0.0;
            double pl = -fmin(c1d * A, c2 * A) * em, dc1 = policy_grad(t, c1, A) * em, dlp = 0;
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
            const int is_low = c1d < lo && A<0, is_high = c1d> hi && A > 0;
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
            const double c1d = t->delta > 0 && seq_c1 > t->delta ? t->delta : seq_c1;
            fl = c1d < lo && A<0, fh = c1d> hi && A > 0;
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
    {"num_generations", CTRL_OPT_INT, "8", CTRL_OPT_HAS_MIN, 2, 0, NULL,
     "Completions sampled per prompt (a group); the generation batch must be a multiple of it."},
    {"max_completion_length", CTRL_OPT_INT, "512", CTRL_OPT_HAS_MIN, 1, 0, NULL,
     "New tokens per completion at most."},
    {"steps_per_generation", CTRL_OPT_INT, "0", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Micro-batches one generation batch feeds (0 = gradient_accumulation_steps)."},
    {"num_iterations", CTRL_OPT_INT, "1", CTRL_OPT_HAS_MIN, 1, 0, NULL,
     "Optimization passes over each generation batch (TRL's mu)."},
    {"beta", CTRL_OPT_FLOAT, "0.0", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "KL coefficient (k3 estimator against the initial model); 0 loads no reference model."},
    {"epsilon", CTRL_OPT_FLOAT, "0.2", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Lower clipping bound: ratio >= 1 - epsilon."},
    {"epsilon_high", CTRL_OPT_FLOAT, "0", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Upper clipping bound 1 + epsilon_high (0 = epsilon; DAPO recommends 0.28)."},
    {"delta", CTRL_OPT_FLOAT, "0", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Upper cap of the unclipped ratio (two-sided clipping; 0 = off, > 1 + epsilon recommended)."},
    {"importance_sampling_level", CTRL_OPT_CHOICE, "token", 0, 0, 0, "token|sequence",
     "Importance ratio per token, or per sequence from its mean log-ratio (GSPO)."},
    {"loss_type", CTRL_OPT_CHOICE, "dapo", 0, 0, 0, "grpo|bnpo|dr_grpo|dapo",
     "Aggregation: per-sequence mean (grpo), token mean over the micro-batch (bnpo), sum over "
     "B x max_completion_length (dr_grpo), token mean over the generation batch (dapo)."},
    {"scale_rewards", CTRL_OPT_CHOICE, "group", 0, 0, 0, "group|batch|none",
     "Divide advantages by the group's reward std, the batch's, or not at all."},
    {"mask_truncated_completions", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "Exclude completions cut at max_completion_length from the loss."},
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
    .ops = &grpo_ops,
};

CTRL_PLUGIN_DEFINE(&grpo_plugin)
