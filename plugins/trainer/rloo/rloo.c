/* RLOO with TRL's semantics (RLOOTrainer, trl 1.x): the KL to the reference model folded into the
 * reward (r - beta * sum_t (old - ref)), optional reward clipping, the leave-one-out baseline over
 * the group's scorable completions, optional batch normalization of the advantages, and the
 * sequence-level clipped ratio exp(sum_t logp - sum_t old) averaged over sequences. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <ctrl/plugin_api.h>

#include "../online_stats.h"
#include "../online_trainer.h"

CTRL_PLUGIN_API_DEFINE;

struct ctrl_trainer {
    ctrl_online_spec spec;
    double beta, lo, hi, clip_lo,
        clip_hi; /* the ratio is clipped to [lo, hi], rewards to [clip_lo, clip_hi] */
    int normalize, clip_rewards;
};

/* The options into t, checked (create, and check_options when the config is validated). */
static ctrl_status read_options(const ctrl_config *cfg, ctrl_trainer *t) {
    const char *s = "rloo";
    ctrl_status st = CTRL_OK;
    online_read_options(cfg, s, &t->spec, &t->beta, &t->lo, &t->hi, &st);
    t->spec.needs_old_logp = 1; /* the ratio and the KL use them */
    t->normalize = ctrl_option_bool(cfg, s, "normalize_advantages", &st);
    const char *range = ctrl_option_string(cfg, s, "reward_clip_range", &st);
    if (st == CTRL_OK && range[0]) {
        char tail;
        if (sscanf(range, "%lf , %lf %c", &t->clip_lo, &t->clip_hi, &tail) != 2 ||
            !(t->clip_lo <= t->clip_hi))
            st = ctrl_error_set(CTRL_ERR_CONFIG,
                                "[rloo] reward_clip_range = %s: expected LOW,HIGH with LOW <= HIGH", range);
        t->clip_rewards = 1;
    }
    return st;
}

static ctrl_status rloo_check_options(const ctrl_config *cfg, const char *section) {
    (void)section;
    ctrl_trainer t = {0};
    return read_options(cfg, &t);
}

static ctrl_status rloo_create(const ctrl_host *host, const ctrl_config *cfg, ctrl_trainer **out) {
    (void)host; /* kept by init (plugin_api.h) */
    ctrl_trainer *t = calloc(1, sizeof *t);
    if (!t) return ctrl_error_set(CTRL_ERR_NOMEM, "trainer rloo: out of memory");
    ctrl_status st = read_options(cfg, t);
    if (st != CTRL_OK) {
        free(t);
        return st;
    }
    *out = t;
    return CTRL_OK;
}

static ctrl_status rloo_spec(ctrl_trainer *t, ctrl_online_spec *out) {
    *out = t->spec;
    return CTRL_OK;
}

static ctrl_status rloo_advantages(ctrl_trainer *t, const ctrl_rollout *r, float *adv) {
    const int G = r->group, n = r->n;
    ctrl_status st = online_check_groups("rloo", r);
    if (st != CTRL_OK) return st;
    if (t->beta != 0 && (!r->kl || !r->n_tokens))
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer rloo: beta != 0 needs the KL of each completion");
    float *rw = malloc(sizeof(float) * (size_t)n);
    if (!rw) return ctrl_error_set(CTRL_ERR_NOMEM, "trainer rloo: out of memory");
    double kl_sum = 0, tokens = 0;
    for (int i = 0; i < n; i++) {
        double x = r->rewards[i];
        if (t->clip_rewards && !isnan(x)) x = x < t->clip_lo ? t->clip_lo : x > t->clip_hi ? t->clip_hi : x;
        if (t->beta != 0) x -= t->beta * r->kl[i], kl_sum += r->kl[i], tokens += r->n_tokens[i];
        rw[i] = (float)x;
    }
    long zero_std = 0;
    for (int g = 0; g < n / G; g++) {
        const float *x = rw + (size_t)g * G;
        zero_std += online_isclose0(G > 1 ? online_nanstd(x, G, 1) : 0.0);
        double sum = 0;
        int scorable = 0;
        for (int i = 0; i < G; i++)
            if (!isnan(x[i])) sum += x[i], scorable++;
        for (int i = 0; i < G; i++) /* leave-one-out baseline over the scorable siblings */
            adv[g * G + i] = G > 1 ? (float)(x[i] - (sum - x[i]) / (scorable - 1)) : 0.0f;
    }
    if (t->normalize) {
        const double mean = online_nanmean(adv, n, 1), std = online_nanstd(adv, n, 1);
        for (int i = 0; i < n; i++) adv[i] = (float)((adv[i] - mean) / (std + 1e-4));
    }
    for (int i = 0; i < n; i++)
        if (isnan(adv[i]) || isinf(adv[i])) adv[i] = 0.0f; /* unscorable, or alone in its group */
    free(rw);
    if (r->report) {
        r->report(r->report_ctx, "frac_reward_zero_std", (double)zero_std / (n / G));
        if (t->beta != 0) r->report(r->report_ctx, "kl", kl_sum / (tokens > 1 ? tokens : 1));
    }
    return CTRL_OK;
}

static ctrl_status rloo_loss(ctrl_trainer *t, const ctrl_trainer_batch *b, double *loss, float *dlogp) {
    if (b->size < sizeof(ctrl_trainer_batch) || b->n_seq < 1 || !b->cu_seqlens || !b->advantages ||
        !b->old_logp)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer rloo: the batch carries no sequences, advantages or "
                                                "old log-probs (an online trainer runs under the core's "
                                                "generation loop)");
    const int ga = b->grad_accum > 0 ? b->grad_accum : 1, S = b->n_seq;
    const double lo = t->lo, hi = t->hi;
    double L = 0, low = 0, high = 0, ent = 0, tokens = 0, low_min = 1, high_max = 0;
    for (int s = 0; s < S; s++) {
        const int t0 = b->cu_seqlens[s], t1 = b->cu_seqlens[s + 1];
        double lr = 0;
        for (int i = t0; i < t1; i++)
            if (b->weight[i] > 0) {
                lr += (double)b->logp[i] - b->old_logp[i], tokens += 1;
                if (b->entropy) ent += b->entropy[i];
            }
        const double A = b->advantages[s], c1 = exp(lr);
        double dc1;
        L += online_clipped_loss(c1, A, lo, hi, 0.0, &dc1) / S / ga;
        const float g = (float)(dc1 * c1 / S / ga);
        for (int i = t0; i < t1; i++) dlogp[i] = b->weight[i] > 0 ? g : 0.0f;
        const int is_low = online_clipped_low(c1, A, lo), is_high = online_clipped_high(c1, A, hi);
        low += is_low, high += is_high;
        if (is_low < low_min) low_min = is_low;
        if (is_high > high_max) high_max = is_high;
    }
    *loss = L;
    if (b->report) {
        if (b->entropy) b->report(b->report_ctx, "entropy", ent / (tokens > 1 ? tokens : 1));
        b->report(b->report_ctx, "clip_ratio/low_mean", low / S);
        b->report(b->report_ctx, "clip_ratio/low_min", low_min);
        b->report(b->report_ctx, "clip_ratio/high_mean", high / S);
        b->report(b->report_ctx, "clip_ratio/high_max", high_max);
        b->report(b->report_ctx, "clip_ratio/region_mean", (low + high) / S);
    }
    return CTRL_OK;
}

static void rloo_destroy(ctrl_trainer *t) { free(t); }

static const ctrl_trainer_ops rloo_ops = {
    .size = sizeof(ctrl_trainer_ops),
    .create = rloo_create,
    .loss = rloo_loss,
    .destroy = rloo_destroy,
    .online_spec = rloo_spec,
    .advantages = rloo_advantages,
};

static const ctrl_option rloo_options[] = {
    ONLINE_OPTION_NUM_GENERATIONS(
        "2", "Completions sampled per prompt; each one's baseline is the mean reward of the others."),
    ONLINE_OPTIONS_GENERATION,
    ONLINE_OPTION_BETA("0.05",
                       "KL coefficient: the reward becomes r - beta * sum_t (log pi_old - log pi_ref); 0 "
                       "loads no reference model."),
    ONLINE_OPTIONS_CLIP,
    {"normalize_advantages", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "Normalize the advantages over the generation batch (mean 0, std 1)."},
    {"reward_clip_range", CTRL_OPT_STRING, "", 0, 0, 0, NULL,
     "LOW,HIGH: clip each total reward to this range."},
    CTRL_OPTION_END,
};

static const ctrl_plugin rloo_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_TRAINER,
    .name = "rloo",
    .version = "0.1.0",
    .summary =
        "REINFORCE Leave-One-Out with TRL's semantics (KL in the reward, sequence-level clipped ratio)",
    .options = rloo_options,
    .init = ctrl_plugin_api_init,
    .ops = &rloo_ops,
    .check_options = rloo_check_options,
};

CTRL_PLUGIN_DEFINE(&rloo_plugin)
