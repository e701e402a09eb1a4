/* The reward-model trainer (TRL's RewardTrainer): a sequence classifier's score r read at the
 * last non-pad token of each chosen and rejected sequence, and the Bradley-Terry loss
 *   -log sigma(r_chosen - r_rejected - margin)
 * with the optional `margin` column of the data, plus center_rewards_coefficient * (r_chosen +
 * r_rejected)^2 (Eisenstein et al., Eq. 2), each averaged over the pairs. The pairs of a
 * micro-batch come flat from the `sequence` kind (chosen first, then rejected); the sums here are
 * divided by the pairs of the whole accumulated batch (num_items), so gradient accumulation gives
 * TRL's mean of micro-batch means for equal micro-batches. Logs TRL's metrics: min_reward,
 * mean_reward, max_reward (over every score), accuracy (r_chosen > r_rejected) and margin (the
 * mean r_chosen - r_rejected); num_tokens comes from the loop. */
#include <math.h>
#include <stdlib.h>

#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

struct ctrl_trainer {
    double center; /* center_rewards_coefficient (0: off, TRL's None) */
};

static ctrl_status reward_create(const ctrl_host *host, const ctrl_config *cfg, ctrl_trainer **out) {
    (void)host;
    ctrl_status st = CTRL_OK;
    const double center = ctrl_option_float(cfg, "reward", "center_rewards_coefficient", &st);
    if (st != CTRL_OK) return st;
    ctrl_trainer *t = calloc(1, sizeof *t);
    if (!t) return ctrl_error_set(CTRL_ERR_NOMEM, "trainer reward: out of memory");
    t->center = center;
    *out = t;
    return CTRL_OK;
}

static ctrl_status reward_spec(ctrl_trainer *t, ctrl_sequence_spec *out) {
    (void)t;
    *out = (ctrl_sequence_spec){.size = sizeof *out, .paired = 1, .needs_score = 1};
    return CTRL_OK;
}

/* -log sigma(x) = softplus(-x), without overflow either way. */
static double neg_log_sigmoid(double x) { return (x < 0 ? -x : 0) + log1p(exp(-fabs(x))); }

static ctrl_status reward_loss(ctrl_trainer *t, const ctrl_sequence_batch *b, double *loss, double *dlogp_sum,
                               float *dscore, float *dlogp, int *per_token) {
    (void)dlogp;
    const int n = b->n_pairs;
    if (!b->score || !dscore || n < 1 || b->n_seq != 2 * n)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer reward: a micro-batch without pairs of scores");
    if (!(b->num_items > 0))
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer reward: no pairs to average over");
    const double inv = 1.0 / b->num_items;
    double sum = 0, mn = INFINITY, mx = -INFINITY, all = 0, right = 0, gap = 0;
    for (int i = 0; i < n; i++) {
        const double rc = b->score[i], rr = b->score[n + i], m = b->margin ? b->margin[i] : 0.0;
        const double x = rc - rr - m, s = rc + rr;
        sum += neg_log_sigmoid(x) + t->center * s * s;
        const double g = -1.0 / (1.0 + exp(x)); /* d(-log sigma(x))/dx = -sigma(-x) */
        dscore[i] = (float)((g + 2.0 * t->center * s) * inv);
        dscore[n + i] = (float)((-g + 2.0 * t->center * s) * inv);
        right += rc > rr, gap += rc - rr;
    }
    for (int i = 0; i < 2 * n; i++) {
        const double r = b->score[i];
        all += r, mn = r < mn ? r : mn, mx = r > mx ? r : mx;
    }
    for (int i = 0; i < b->n_seq; i++) dlogp_sum[i] = 0; /* the LM head is not used */
    *per_token = 0;
    *loss = sum * inv;
    if (b->report) {
        b->report(b->report_ctx, "min_reward", mn);
        b->report(b->report_ctx, "mean_reward", all / (2 * n));
        b->report(b->report_ctx, "max_reward", mx);
        b->report(b->report_ctx, "accuracy", right / n);
        b->report(b->report_ctx, "margin", gap / n);
    }
    return CTRL_OK;
}

static void reward_destroy(ctrl_trainer *t) { free(t); }

static const ctrl_trainer_ops reward_ops = {
    .size = sizeof(ctrl_trainer_ops),
    .create = reward_create,
    .destroy = reward_destroy,
    .sequence_spec = reward_spec,
    .sequence_loss = reward_loss,
};

static const ctrl_option reward_options[] = {
    {.key = "center_rewards_coefficient",
     .type = CTRL_OPT_FLOAT,
     .default_value = "0",
     .flags = CTRL_OPT_HAS_MIN,
     .min = 0,
     .doc =
         "Adds this times the mean (r_chosen + r_rejected)^2 to the loss, pulling rewards toward zero mean "
         "(TRL's center_rewards_coefficient; 0 = off, TRL's None; 0.01 recommended)."},
    CTRL_OPTION_END,
};

static const ctrl_plugin reward_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_TRAINER,
    .name = "reward",
    .version = "0.1.0",
    .summary =
        "reward model: -log sigmoid(r_chosen - r_rejected - margin) on a score head (TRL RewardTrainer)",
    .options = reward_options,
    .init = ctrl_plugin_api_init,
    .ops = &reward_ops,
};

CTRL_PLUGIN_DEFINE(&reward_plugin)
