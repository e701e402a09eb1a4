/* Online DPO with TRL 1.16's semantics (trl/experimental/online_dpo, OnlineDPOTrainer.training_step):
 * the core's generation loop samples two completions per prompt from the live policy and scores
 * them with the run's [reward.NAME] functions (NaN, none applied, counts 0 as TRL's nansum);
 * missing_eos_penalty is subtracted from completions that no stop id ended; the higher score is
 * chosen (the first sample on a tie), and the pair's loss is sigmoid -log sigma(beta x) or ipo
 * (x - 1/(2 beta))^2 on x = (log pi_c - log pi_r) - (log ref_c - log ref_r), the sums over each
 * completion's tokens at temperature 1. beta may be a per-epoch list (the last entry for the
 * epochs after it). As TRL under transformers 5 (its training_step backpropagates each
 * micro-batch's mean loss undivided, the Trainer's accelerator accumulating with num_steps = 1),
 * the gradient of a step is the sum over its micro-batches of their mean pair loss, while the
 * logged loss is their mean. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/plugin_api.h>

CTRL_PLUGIN_API_DEFINE;

#define MAX_BETAS 64

enum { LOSS_SIGMOID, LOSS_IPO };

struct ctrl_trainer {
    ctrl_online_spec spec;
    double betas[MAX_BETAS], beta, penalty;
    int n_betas, loss_type;
};

/* beta = B or B1,B2,...: each > 0 (ipo divides by it). */
static ctrl_status parse_betas(ctrl_trainer *t, const char *text) {
    t->n_betas = 0;
    for (const char *s = text; *s;) {
        while (*s == ' ' || *s == ',') s++;
        if (!*s) break;
        char *e;
        const double b = strtod(s, &e);
        if (e == s || !isfinite(b) || !(b > 0))
            return ctrl_error_set(
                CTRL_ERR_CONFIG,
                "[online_dpo] beta = %s: expected a number > 0 or a comma-separated list of "
                "them (one per epoch)",
                text);
        if (t->n_betas == MAX_BETAS)
            return ctrl_error_set(CTRL_ERR_CONFIG, "[online_dpo] beta = %s: at most %d values", text,
                                  MAX_BETAS);
        t->betas[t->n_betas++] = b;
        s = e;
        while (*s == ' ') s++;
        if (*s && *s != ',')
            return ctrl_error_set(CTRL_ERR_CONFIG, "[online_dpo] beta = %s: not a list of numbers", text);
    }
    if (!t->n_betas) return ctrl_error_set(CTRL_ERR_CONFIG, "[online_dpo] beta: empty");
    t->beta = t->betas[0];
    return CTRL_OK;
}

/* The options into t, checked (create, and check_options when the config is validated). */
static ctrl_status read_options(const ctrl_config *cfg, ctrl_trainer *t) {
    const char *s = "online_dpo";
    static const char *const losses[] = {"sigmoid", "ipo", NULL};
    ctrl_status st = CTRL_OK;
    t->spec = (ctrl_online_spec){
        .size = sizeof(ctrl_online_spec),
        .num_generations = 2,
        .max_completion_length = (int)ctrl_option_int(cfg, s, "max_new_tokens", &st),
        .num_iterations = 1,
        .needs_ref_logp = 1,
        .batch_counts_prompts = 1,
        .logp_at_unit_temperature = 1,
        .max_length = (int)ctrl_option_int(cfg, s, "max_length", &st),
    };
    t->penalty = ctrl_option_float(cfg, s, "missing_eos_penalty", &st);
    t->loss_type = ctrl_option_choice(cfg, s, "loss_type", losses, &st);
    const char *betas = ctrl_option_string(cfg, s, "beta", &st);
    if (st == CTRL_OK) st = parse_betas(t, betas);
    if (st == CTRL_OK && t->spec.max_length > 0 && t->spec.max_completion_length >= t->spec.max_length)
        st = ctrl_error_set(CTRL_ERR_CONFIG,
                            "[online_dpo] max_length = %d: must exceed max_new_tokens (%d), or the prompt is "
                            "truncated away (0 = no limit)",
                            t->spec.max_length, t->spec.max_completion_length);
    return st;
}

static ctrl_status odpo_check_options(const ctrl_config *cfg, const char *section) {
    (void)section;
    ctrl_trainer t = {0};
    return read_options(cfg, &t);
}

static ctrl_status odpo_create(const ctrl_host *host, const ctrl_config *cfg, ctrl_trainer **out) {
    (void)host; /* kept by init (plugin_api.h) */
    ctrl_trainer *t = calloc(1, sizeof *t);
    if (!t) return ctrl_error_set(CTRL_ERR_NOMEM, "trainer online_dpo: out of memory");
    const ctrl_status st = read_options(cfg, t);
    if (st != CTRL_OK) {
        free(t);
        return st;
    }
    *out = t;
    return CTRL_OK;
}

static ctrl_status odpo_spec(ctrl_trainer *t, ctrl_online_spec *out) {
    *out = t->spec;
    return CTRL_OK;
}

/* The scores: the weighted reward sum (0 where no function applied, TRL's nansum) less
 * missing_eos_penalty where no stop id ended the completion; the loss reads them as advantages.
 * Also picks beta for the batch's epoch and reports the score metrics, which TRL logs per
 * micro-batch of whole pairs (their mean over the batch is the mean of its micro-batches'). */
static ctrl_status odpo_advantages(ctrl_trainer *t, const ctrl_rollout *r, float *adv) {
    if (r->size < sizeof(ctrl_rollout) || r->group != 2 || r->n % 2 || !r->stopped)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "trainer online_dpo: the generation batch is not pairs with "
                              "their stop flags (it runs under the core's generation loop)");
    const int e = r->epoch > 0 ? (int)floor(r->epoch) : 0;
    t->beta = t->betas[e < t->n_betas ? e : t->n_betas - 1];
    double sum = 0, margin = 0, eos = 0;
    for (int i = 0; i < r->n; i++) {
        double x = isnan(r->rewards[i]) ? 0.0 : r->rewards[i];
        if (!r->stopped[i]) x -= t->penalty;
        adv[i] = (float)x, sum += adv[i], eos += r->stopped[i] != 0;
    }
    for (int i = 0; i < r->n; i += 2) margin += fabs((double)adv[i] - adv[i + 1]);
    if (r->report) {
        r->report(r->report_ctx, "objective/scores", sum / r->n);
        r->report(r->report_ctx, "objective/scores_margin", margin / (r->n / 2));
        r->report(r->report_ctx, "val/contain_eos_token", eos / r->n);
    }
    return CTRL_OK;
}

/* -log sigmoid(z), stable on both sides. */
static double softplus_neg(double z) { return z > 0 ? log1p(exp(-z)) : -z + log1p(exp(z)); }

static ctrl_status odpo_loss(ctrl_trainer *t, const ctrl_trainer_batch *b, double *loss, float *dlogp) {
    if (b->size < sizeof(ctrl_trainer_batch) || b->n_seq < 2 || b->n_seq % 2 || !b->cu_seqlens ||
        !b->advantages || !b->ref_logp)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "trainer online_dpo: the batch carries no pairs, scores or "
                              "reference log-probs (it runs under the core's generation loop)");
    const int S = b->n_seq, n_pairs = S / 2, ga = b->grad_accum > 0 ? b->grad_accum : 1;
    const double beta = t->beta;
    double L = 0, m_lc = 0, m_lr = 0, m_kl = 0, m_ent = 0, m_rc = 0, m_rr = 0, m_acc = 0, m_score = 0;
    for (int i = 0; i < b->T; i++) dlogp[i] = 0;
    for (int p = 0; p < n_pairs; p++) {
        double lp[2], ref[2];
        for (int k = 0; k < 2; k++) {
            const int s = 2 * p + k, t0 = b->cu_seqlens[s], t1 = b->cu_seqlens[s + 1];
            double r = 0;
            lp[k] = 0;
            for (int i = t0; i < t1; i++)
                if (b->weight[i] > 0) lp[k] += b->logp[i], r += b->ref_logp[i];
            ref[k] = r;
            m_kl += lp[k] - ref[k], m_ent -= lp[k], m_score += b->advantages[s];
        }
        const int c = b->advantages[2 * p] >= b->advantages[2 * p + 1] ? 0 : 1, r = 1 - c;
        const double x = (lp[c] - lp[r]) - (ref[c] - ref[r]);
        double l, dx;
        if (t->loss_type == LOSS_SIGMOID) {
            l = softplus_neg(beta * x);
            dx = -beta / (1 + exp(beta * x)); /* d/dx -log sigmoid(beta x) = -beta sigmoid(-beta x) */
        } else {
            const double h = x - 1 / (2 * beta);
            l = h * h, dx = 2 * h;
        }
        L += l / n_pairs;
        const double g = dx / n_pairs; /* the micro-batch mean, undivided by ga (TRL's gradient) */
        for (int k = 0; k < 2; k++) {
            const int s = 2 * p + k;
            const float gk = (float)(k == c ? g : -g);
            for (int i = b->cu_seqlens[s]; i < b->cu_seqlens[s + 1]; i++)
                if (b->weight[i] > 0) dlogp[i] = gk;
        }
        const double rc = beta * (lp[c] - ref[c]), rr = beta * (lp[r] - ref[r]);
        m_lc += lp[c], m_lr += lp[r], m_rc += rc, m_rr += rr, m_acc += rc - rr > 0;
    }
    *loss = L / ga; /* TRL's logged loss: the micro-batch mean over the accumulation steps */
    if (b->report) {
        void *ctx = b->report_ctx;
        b->report(ctx, "objective/kl", m_kl / S);
        b->report(ctx, "objective/entropy", m_ent / S);
        b->report(ctx, "objective/non_score_reward", -beta * m_kl / S);
        b->report(ctx, "objective/rlhf_reward", (m_score - beta * m_kl) / S);
        b->report(ctx, "logps/chosen", m_lc / n_pairs);
        b->report(ctx, "logps/rejected", m_lr / n_pairs);
        b->report(ctx, "rewards/chosen", m_rc / n_pairs);
        b->report(ctx, "rewards/rejected", m_rr / n_pairs);
        b->report(ctx, "rewards/margins", (m_rc - m_rr) / n_pairs);
        b->report(ctx, "rewards/accuracies", m_acc / n_pairs);
        b->report(ctx, "beta", beta);
    }
    return CTRL_OK;
}

static void odpo_destroy(ctrl_trainer *t) { free(t); }

static const ctrl_trainer_ops odpo_ops = {
    .size = sizeof(ctrl_trainer_ops),
    .create = odpo_create,
    .loss = odpo_loss,
    .destroy = odpo_destroy,
    .online_spec = odpo_spec,
    .advantages = odpo_advantages,
};

static const ctrl_option odpo_options[] = {
    {"beta", CTRL_OPT_STRING, "0.1", 0, 0, 0, NULL,
     "Deviation from the reference (ipo's tau): a number > 0, or a comma-separated list of one per epoch "
     "(the last one for later epochs)."},
    {"loss_type", CTRL_OPT_CHOICE, "sigmoid", 0, 0, 0, "sigmoid|ipo",
     "-log sigmoid(beta x) (sigmoid) or (x - 1/(2 beta))^2 (ipo), x the pair's log-ratio margin over the "
     "reference's."},
    {"missing_eos_penalty", CTRL_OPT_FLOAT, "0", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Subtracted from the score of a completion that no EOS / stop id ended (0 = none)."},
    {"max_new_tokens", CTRL_OPT_INT, "64", CTRL_OPT_HAS_MIN, 1, 0, NULL,
     "New tokens per completion at most."},
    {"max_length", CTRL_OPT_INT, "512", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Prompt + completion tokens at most in the log-prob forwards: longer ones lose the prompt's leftmost "
     "tokens (0 = no limit); must exceed max_new_tokens."},
    CTRL_OPTION_END,
};

static const ctrl_plugin odpo_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_TRAINER,
    .name = "online_dpo",
    .version = "0.1.0",
    .summary = "Online DPO: two sampled completions per prompt ranked by the reward functions, TRL's sigmoid "
               "or ipo loss",
    .options = odpo_options,
    .init = ctrl_plugin_api_init,
    .ops = &odpo_ops,
    .check_options = odpo_check_options,
};

CTRL_PLUGIN_DEFINE(&odpo_plugin)
