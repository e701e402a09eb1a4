/* RLOO with TRL's semantics (RLOOTrainer, trl 1.x): the KL to the reference model folded into the
 * reward (r - beta * sum_t (old - ref)), optional reward clipping, the leave-one-out baseline over
 * the group's scorable completions, optional batch normalization of the advantages, and the
 * sequence-level clipped ratio exp(sum_t logp - sum_t old) averaged over sequences. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <ctrl/trainer.h>

#include "../online_stats.h"

struct ctrl_trainer {
    const ctrl_host *host;
    ctrl_online_spec spec;
    double beta, eps_low, eps_high, clip_lo, clip_hi;
    int normalize, clip_rewards;
};

static ctrl_status rloo_create(const ctrl_host *host, const ctrl_config *cfg, ctrl_trainer **out) {
    ctrl_trainer *t = calloc(1, sizeof *t);
    if (!t) return host->error_set(CTRL_ERR_NOMEM, "trainer rloo: out of memory");
    t->host = host;
    const char *s = "rloo";
    t->beta = host->config_get_float(cfg, s, "beta", 0.05);
    t->spec = (ctrl_online_spec){
        .size = sizeof(ctrl_online_spec),
        .num_generations = (int)host->config_get_int(cfg, s, "num_generations", 2),
        .max_completion_length = (int)host->config_get_int(cfg, s, "max_completion_length", 512),
        .steps_per_generation = (int)host->config_get_int(cfg, s, "steps_per_generation", 0),
        .num_iterations = (int)host->config_get_int(cfg, s, "num_iterations", 1),
        .needs_old_logp = 1, /* the ratio and the KL use them */
        .needs_ref_logp = t->beta != 0.0,
        .mask_truncated_completions = host->config_get_bool(cfg, s, "mask_truncated_completions", false),
    };
    t->eps_low = host->config_get_float(cfg, s, "epsilon", 0.2);
    t->eps_high = host->config_get_float(cfg, s, "epsilon_high", 0.0);
    if (!(t->eps_high > 0)) t->eps_high = t->eps_low;
    t->normalize = host->config_get_bool(cfg, s, "normalize_advantages", false);
    const char *range = host->config_get_string(cfg, s, "reward_clip_range");
    if (range && range[0]) {
        char tail;
        if (sscanf(range, "%lf , %lf %c", &t->clip_lo, &t->clip_hi, &tail) != 2 ||
            !(t->clip_lo <= t->clip_hi)) {
            free(t);
            return host->error_set(
                CTRL_ERR_CONFIG, "[rloo] reward_clip_range = %s: expected LOW,HIGH with LOW <= HIGH", range);
        }
        t->clip_rewards = 1;
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
    if (G < 1 || n % G)
        return t->host->error_set(CTRL_ERR_RUNTIME, "trainer rloo: %d completions are not groups of %d", n,
                                  G);
    if (t->beta != 0 && (!r->kl || !r->n_tokens))
        return t->host->error_set(CTRL_ERR_RUNTIME,
                                  "trainer rloo: beta != 0 needs the KL of each completion");
    float *rw = malloc(sizeof(float) * (size_t)n);
    if (!rw) return t->host->error_set(CTRL_ERR_NOMEM, "trainer rloo: out of memory");
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
        return t->host->error_set(CTRL_ERR_RUNTIME,
                                  "trainer rloo: the batch carries no sequences, advantages or "
                                  "old log-probs (an online trainer runs under the core's "
                                  "generation loop)");
    const int ga = b->grad_accum > 0 ? b->grad_accum : 1, S = b->n_seq;
    const double lo = 1 - t->eps_low, hi = 1 + t->eps_high;
    double L = 0, low = 0, high = 0, ent = 0, tokens = 0, low_min = 1, high_max = 0;
    for (int s = 0; s < S; s++) {
        const int t0 = b->cu_seqlens[s], t1 = b->cu_seqlens[s + 1];
        double lr = 0;
        for (int i = t0; i < t1; i++)
            if (b->weight[i] > 0) {
                lr += (double)b->logp[i] - b->old_logp[i], tokens += 1;
                if (b->entropy) ent += b->entropy[i];
            }
        const double A = b->advantages[s], c1 = exp(lr), c2 = c1 < lo ? lo : c1 > hi ? hi : c1;
        const double a = c1 * A, bb = c2 * A, da = A, db = (c1 >= lo && c1 <= hi) ? A : 0;
        const double dc1 = a < bb ? -da : a > bb ? -db : -(da + db) / 2; /* as torch.minimum */
        L += -fmin(a, bb) / S / ga;
        const float g = (float)(dc1 * c1 / S / ga);
        for (int i = t0; i < t1; i++) dlogp[i] = b->weight[i] > 0 ? g : 0.0f;
        const int is_low = c1 < lo && A<0, is_high = c1> hi && A > 0;
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
    {"num_generations", CTRL_OPT_INT, "2", CTRL_OPT_HAS_MIN, 2, 0, NULL,
     "Completions sampled per prompt; each one's baseline is the mean reward of the others."},
    {"max_completion_length", CTRL_OPT_INT, "512", CTRL_OPT_HAS_MIN, 1, 0, NULL,
     "New tokens per completion at most."},
    {"steps_per_generation", CTRL_OPT_INT, "0", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Micro-batches one generation batch feeds (0 = gradient_accumulation_steps)."},
    {"num_iterations", CTRL_OPT_INT, "1", CTRL_OPT_HAS_MIN, 1, 0, NULL,
     "Optimization passes over each generation batch."},
    {"beta", CTRL_OPT_FLOAT, "0.05", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "KL coefficient: the reward becomes r - beta * sum_t (log pi_old - log pi_ref); 0 loads no reference "
     "model."},
    {"epsilon", CTRL_OPT_FLOAT, "0.2", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Lower clipping bound of the sequence ratio."},
    {"epsilon_high", CTRL_OPT_FLOAT, "0", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Upper clipping bound (0 = epsilon)."},
    {"normalize_advantages", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "Normalize the advantages over the generation batch (mean 0, std 1)."},
    {"reward_clip_range", CTRL_OPT_STRING, "", 0, 0, 0, NULL,
     "LOW,HIGH: clip each total reward to this range."},
    {"mask_truncated_completions", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "Exclude completions cut at max_completion_length from the loss."},
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
    .ops = &rloo_ops,
};

CTRL_PLUGIN_DEFINE(&rloo_plugin)
