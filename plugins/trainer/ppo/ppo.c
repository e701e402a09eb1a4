/* PPO with the semantics of TRL's PPOTrainer as last shipped (trl 0.25, trl/trainer/ppo_trainer.py):
 * one completion per prompt, the reward functions' score at the end of each response (truncated
 * after stop_token, missing_eos_penalty), a per-token KL penalty kl_coef (k1 or k3) to the initial
 * model, GAE with gamma and lam over a value model's outputs, whitened advantages (and rewards with
 * whiten_rewards), the clipped policy loss (cliprange) plus vf_coef times the clipped value loss
 * (cliprange_value), num_ppo_epochs passes over each generation batch, and TRL's metric names. The
 * core generates, holds and runs the value model (core/train/online_ppo.c); this plugin does the
 * arithmetic (ppo_math.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/plugin_api.h>

#include "ppo_math.h"

CTRL_PLUGIN_API_DEFINE;

#define PPO_MAX_MICRO 4096

struct ctrl_trainer {
    ctrl_online_spec spec;
    ppo_options o;
    ppo_micro_stats *stats; /* this update's micro-batches so far */
    int n_stats;
};

static ctrl_status ppo_create(const ctrl_host *host, const ctrl_config *cfg, ctrl_trainer **out) {
    (void)host; /* kept by init (plugin_api.h) */
    ctrl_trainer *t = calloc(1, sizeof *t);
    if (!t) return ctrl_error_set(CTRL_ERR_NOMEM, "trainer ppo: out of memory");
    const char *s = "ppo";
    static const char *const estimators[] = {"k1", "k3", NULL};
    static const char *const stops[] = {"none", "eos", NULL};
    ctrl_status st = CTRL_OK;
    ppo_options *o = &t->o;
    o->num_ppo_epochs = (int)ctrl_option_int(cfg, s, "num_ppo_epochs", &st);
    o->num_mini_batches = (int)ctrl_option_int(cfg, s, "num_mini_batches", &st);
    o->kl_coef = ctrl_option_float(cfg, s, "kl_coef", &st);
    o->k3 = ctrl_option_choice(cfg, s, "kl_estimator", estimators, &st) == 1;
    o->whiten_rewards = ctrl_option_bool(cfg, s, "whiten_rewards", &st);
    o->cliprange = ctrl_option_float(cfg, s, "cliprange", &st);
    o->cliprange_value = ctrl_option_float(cfg, s, "cliprange_value", &st);
    o->vf_coef = ctrl_option_float(cfg, s, "vf_coef", &st);
    o->gamma = ctrl_option_float(cfg, s, "gamma", &st);
    o->lam = ctrl_option_float(cfg, s, "lam", &st);
    o->missing_eos_penalty = ctrl_option_float(cfg, s, "missing_eos_penalty", &st);
    const int stop_eos = ctrl_option_choice(cfg, s, "stop_token", stops, &st) == 1;
    const int stop_id = (int)ctrl_option_int(cfg, s, "stop_token_id", &st);
    const int response_length = (int)ctrl_option_int(cfg, s, "response_length", &st);
    const char *value_model = ctrl_config_get_string(cfg, s, "value_model"); /* the core loads it */
    const int bs = (int)ctrl_config_get_int(cfg, "train", "per_device_train_batch_size", 8);
    const int ga = (int)ctrl_config_get_int(cfg, "train", "gradient_accumulation_steps", 1);
    if (st == CTRL_OK && stop_eos && stop_id >= 0)
        st = ctrl_error_set(CTRL_ERR_CONFIG,
                            "[ppo] stop_token_id: set stop_token = eos or stop_token_id, not both");
    if (st == CTRL_OK && ga % o->num_mini_batches != 0)
        st =
            ctrl_error_set(CTRL_ERR_CONFIG,
                           "[ppo] num_mini_batches = %d must divide [train] gradient_accumulation_steps = %d "
                           "(a mini-batch is whole micro-batches of per_device_train_batch_size)",
                           o->num_mini_batches, ga);
    if (st == CTRL_OK && o->whiten_rewards && bs * ga / o->num_mini_batches < 8)
        st = ctrl_error_set(CTRL_ERR_CONFIG,
                            "[ppo] whiten_rewards = true needs a mini-batch of at least 8 completions (TRL's "
                            "assertion); per_device_train_batch_size x gradient_accumulation_steps / "
                            "num_mini_batches = %d",
                            bs * ga / o->num_mini_batches);
    o->stop_token_id = -1;
    if (st == CTRL_OK && (t->stats = calloc(PPO_MAX_MICRO, sizeof *t->stats)) == NULL)
        st = ctrl_error_set(CTRL_ERR_NOMEM, "trainer ppo: out of memory");
    if (st != CTRL_OK) {
        free(t->stats), free(t);
        return st;
    }
    /* one completion per prompt; a generation batch of bs x ga feeds num_ppo_epochs passes, one
     * optimizer step each (accelerate steps every ga micro-batches, whatever num_mini_batches) */
    t->spec = (ctrl_online_spec){.size = sizeof t->spec,
                                 .num_generations = 1,
                                 .max_completion_length = response_length,
                                 .steps_per_generation = 0,
                                 .num_iterations = o->num_ppo_epochs,
                                 .needs_old_logp = 1,
                                 .needs_ref_logp = 1,
                                 .value_model = 1,
                                 .stop = stop_eos       ? CTRL_ONLINE_STOP_EOS
                                         : stop_id >= 0 ? CTRL_ONLINE_STOP_ID
                                                        : CTRL_ONLINE_STOP_NONE,
                                 .stop_token_id = stop_id,
                                 .shuffle = 1,
                                 .value_model_path = value_model};
    if (stop_id >= 0) o->stop_token_id = stop_id;
    *out = t;
    return CTRL_OK;
}

static ctrl_status ppo_spec(ctrl_trainer *t, ctrl_online_spec *out) {
    *out = t->spec;
    return CTRL_OK;
}

static ctrl_status ppo_token_rollout(ctrl_trainer *t, ctrl_token_rollout *r) {
    ppo_options o = t->o;
    if (t->spec.stop == CTRL_ONLINE_STOP_EOS) o.stop_token_id = r->eos_token_id;
    ppo_rollout_io io = {.n = r->n,
                         .W = r->width,
                         .pad_token_id = r->pad_token_id,
                         .eos_token_id = r->eos_token_id,
                         .responses = r->responses,
                         .logp = r->logp,
                         .ref_logp = r->ref_logp,
                         .values = r->values,
                         .scores = r->scores,
                         .advantages = r->advantages,
                         .returns = r->returns,
                         .values_out = r->old_values,
                         .policy_mask = r->policy_mask,
                         .value_mask = r->value_mask};
    ppo_rollout_metrics m;
    ctrl_status st = ppo_rollout(&o, &io, &m);
    t->n_stats = 0; /* a new update */
    if (st == CTRL_OK && r->report) {
        r->report(r->report_ctx, "objective/kl", m.kl);
        r->report(r->report_ctx, "objective/entropy", m.entropy);
        r->report(r->report_ctx, "objective/non_score_reward", m.non_score_reward);
        r->report(r->report_ctx, "objective/rlhf_reward", m.rlhf_reward);
        r->report(r->report_ctx, "objective/scores", m.scores);
        r->report(r->report_ctx, "val/num_eos_tokens", m.num_eos_tokens);
    }
    return st;
}

static ctrl_status ppo_loss(ctrl_trainer *t, const ctrl_trainer_batch *b, double *loss, float *dlogp) {
    if (b->size < offsetof(ctrl_trainer_batch, width) + sizeof b->width || !b->token_advantages ||
        !b->values || !b->dvalues || !b->old_logp)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "trainer ppo: the micro-batch carries no value model outputs (a core "
                              "without token-level online training)");
    const ppo_micro_io io = {.T = b->T,
                             .rows = b->n_seq,
                             .W = b->width,
                             .grad_accum = b->grad_accum,
                             .logp = b->logp,
                             .old_logp = b->old_logp,
                             .advantages = b->token_advantages,
                             .returns = b->returns,
                             .old_values = b->old_values,
                             .values = b->values,
                             .policy_mask = b->weight,
                             .value_mask = b->value_weight,
                             .entropy = b->entropy,
                             .stat_mask = b->stat_weight,
                             .dlogp = dlogp,
                             .dvalues = b->dvalues};
    ppo_micro_stats s;
    ctrl_status st = ppo_micro_loss(&t->o, &io, loss, &s);
    if (st != CTRL_OK) return st;
    if (t->n_stats < PPO_MAX_MICRO) t->stats[t->n_stats++] = s;
    /* TRL logs the policy metrics once per update, after num_ppo_epochs x ga micro-batches */
    if (t->n_stats == t->o.num_ppo_epochs * b->grad_accum && b->report) {
        ppo_update_metrics u;
        ppo_update_metrics_of(&t->o, b->grad_accum, t->stats, t->n_stats, &u);
        b->report(b->report_ctx, "policy/approxkl_avg", u.approxkl);
        b->report(b->report_ctx, "policy/clipfrac_avg", u.pg_clipfrac);
        b->report(b->report_ctx, "loss/policy_avg", u.pg_loss);
        b->report(b->report_ctx, "loss/value_avg", u.vf_loss);
        b->report(b->report_ctx, "val/clipfrac_avg", u.vf_clipfrac);
        b->report(b->report_ctx, "policy/entropy_avg", u.entropy);
        b->report(b->report_ctx, "val/ratio", u.ratio);
        b->report(b->report_ctx, "val/ratio_var", u.ratio_var);
        t->n_stats = 0;
    }
    return CTRL_OK;
}

static void ppo_destroy(ctrl_trainer *t) {
    if (!t) return;
    free(t->stats);
    free(t);
}

static const ctrl_trainer_ops ppo_ops = {
    .size = sizeof(ctrl_trainer_ops),
    .create = ppo_create,
    .loss = ppo_loss,
    .destroy = ppo_destroy,
    .online_spec = ppo_spec,
    .token_rollout = ppo_token_rollout,
};

/* clang-format off */
static const ctrl_option ppo_options_table[] = {
    {"num_ppo_epochs", CTRL_OPT_INT, "4", CTRL_OPT_HAS_MIN, 1, 0, NULL,
     "Passes over each generation batch (one optimizer step each)."},
    {"num_mini_batches", CTRL_OPT_INT, "1", CTRL_OPT_HAS_MIN, 1, 0, NULL,
     "Mini-batches per pass (must divide gradient_accumulation_steps; as in TRL it changes only how the "
     "per-update metrics are averaged)."},
    {"response_length", CTRL_OPT_INT, "53", CTRL_OPT_HAS_MIN, 1, 0, NULL, "New tokens per completion at most."},
    {"stop_token", CTRL_OPT_CHOICE, "none", 0, 0, 0, "none|eos",
     "eos: completions stop at the tokenizer's EOS and are truncated after it; none: no stop token."},
    {"stop_token_id", CTRL_OPT_INT, "-1", CTRL_OPT_HAS_MIN, -1, 0, NULL,
     "A token id that ends completions (-1: none; exclusive with stop_token = eos)."},
    {"missing_eos_penalty", CTRL_OPT_FLOAT, "0", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Subtracted from the score of a completion without an EOS token (0: none)."},
    {"kl_coef", CTRL_OPT_FLOAT, "0.05", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Coefficient of the per-token KL penalty to the initial model in the rewards."},
    {"kl_estimator", CTRL_OPT_CHOICE, "k1", 0, 0, 0, "k1|k3",
     "KL estimator: k1 = log pi - log ref; k3 = (ref/pi - 1) - log(ref/pi)."},
    {"whiten_rewards", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "Whiten the per-token rewards (mean kept) before GAE (needs mini-batches of 8 or more)."},
    {"gamma", CTRL_OPT_FLOAT, "1.0", CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX, 0, 1, NULL, "Discount factor."},
    {"lam", CTRL_OPT_FLOAT, "0.95", CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX, 0, 1, NULL, "GAE lambda."},
    {"cliprange", CTRL_OPT_FLOAT, "0.2", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Policy ratio clip range [1 - cliprange, 1 + cliprange]."},
    {"cliprange_value", CTRL_OPT_FLOAT, "0.2", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Value clip range around the values at generation."},
    {"vf_coef", CTRL_OPT_FLOAT, "0.1", CTRL_OPT_HAS_MIN, 0, 0, NULL, "Weight of the value loss."},
    {"value_model", CTRL_OPT_PATH, NULL, 0, 0, 0, NULL,
     "Value model directory (a *ForSequenceClassification with one label, or a causal LM given a fresh "
     "value head); default: the policy's weights with a fresh value head."},
    CTRL_OPTION_END,
};
/* clang-format on */

static const ctrl_plugin ppo_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_TRAINER,
    .name = "ppo",
    .version = "0.1.0",
    .summary = "Proximal Policy Optimization with a value model (TRL 0.25's PPOTrainer)",
    .options = ppo_options_table,
    .init = ctrl_plugin_api_init,
    .ops = &ppo_ops,
};

CTRL_PLUGIN_DEFINE(&ppo_plugin)
