/* Direct Preference Optimization with TRL 1.16's semantics (DPOTrainer._compute_loss): every
 * loss_type, combined as loss_type = a,b with loss_weights; beta, label_smoothing, the
 * f-divergences (f_divergence_type, f_alpha_divergence_coef), WPO's use_weighting, discopop_tau;
 * LD-DPO's ld_alpha, the precomputed reference and TR-DPO's reference sync are the core's (the
 * ctrl_sequence_spec this plugin fills). The core lays each micro-batch out as chosen sequences
 * then rejected ones, computes their summed completion log-probs through the fused head (policy
 * and reference), and spreads dL/dlogp_sum back over the tokens; this plugin turns the sums into
 * the loss, its gradient and TRL's metrics. Each pair's loss is summed over the micro-batch and
 * divided by the pairs of the whole accumulated batch (TRL: the micro-batch mean over the gradient
 * accumulation steps), so a batch split differently gives the same loss. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/plugin_api.h>

#include "dpo_loss.h"

CTRL_PLUGIN_API_DEFINE;

static const char *const loss_names[] = {
    "sigmoid", "hinge",        "ipo",      "exo_pair", "nca_pair", "robust", "bco_pair",     "sppo_hard",
    "aot",     "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft",    "sigmoid_norm", NULL};
static const char *const fdiv_names[] = {"reverse_kl", "forward_kl", "js_divergence", "alpha_divergence",
                                         NULL};

struct ctrl_trainer {
    ctrl_sequence_spec spec;
    dpo_params p;
};

static int loss_index(const char *name, size_t len) {
    for (int i = 0; loss_names[i]; i++)
        if (strlen(loss_names[i]) == len && !strncmp(loss_names[i], name, len)) return i;
    return -1;
}

/* loss_type (a comma-separated list, as TRL's list) and loss_weights (as many numbers, or empty:
 * all 1). */
static ctrl_status read_losses(const ctrl_config *cfg, dpo_params *p) {
    ctrl_status st = CTRL_OK;
    const char *types = ctrl_option_string(cfg, "dpo", "loss_type", &st);
    const char *weights = ctrl_option_string(cfg, "dpo", "loss_weights", &st);
    if (st != CTRL_OK) return st;
    p->n_losses = 0;
    for (const char *s = types; *s;) {
        while (*s == ' ' || *s == ',') s++;
        const char *e = s;
        while (*e && *e != ',' && *e != ' ') e++;
        if (e == s) break;
        const int k = loss_index(s, (size_t)(e - s));
        if (k < 0)
            return ctrl_error_set(CTRL_ERR_CONFIG,
                                  "[dpo] loss_type = %s: '%.*s' is not one of TRL 1.16's losses", types,
                                  (int)(e - s), s);
        if (p->n_losses == DPO_MAX_LOSSES)
            return ctrl_error_set(CTRL_ERR_CONFIG, "[dpo] loss_type = %s: at most %d losses", types,
                                  DPO_MAX_LOSSES);
        p->loss[p->n_losses] = k, p->weight[p->n_losses++] = 1.0;
        s = e;
    }
    if (p->n_losses == 0) return ctrl_error_set(CTRL_ERR_CONFIG, "[dpo] loss_type: empty");
    if (!weights[0]) return CTRL_OK;
    int n = 0;
    for (const char *s = weights; *s && n <= p->n_losses;) {
        while (*s == ' ' || *s == ',') s++;
        if (!*s) break;
        char *e;
        const double w = strtod(s, &e);
        if (e == s || !isfinite(w))
            return ctrl_error_set(CTRL_ERR_CONFIG, "[dpo] loss_weights = %s: not a list of numbers", weights);
        if (n < p->n_losses) p->weight[n] = w;
        n++, s = e;
    }
    if (n != p->n_losses)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "[dpo] loss_weights = %s: %d weights for %d loss types (loss_type = %s)",
                              weights, n, p->n_losses, types);
    return CTRL_OK;
}

static int uses(const dpo_params *p, int loss) {
    for (int i = 0; i < p->n_losses; i++)
        if (p->loss[i] == loss) return 1;
    return 0;
}

/* TRL's checks of the combinations (DPOTrainer.__init__), plus the one TRL 1.16 crashes on. */
static ctrl_status check_params(const dpo_params *p, const ctrl_sequence_spec *spec) {
    if (p->fdiv != DPO_REVERSE_KL)
        for (int i = 0; i < p->n_losses; i++) {
            const int l = p->loss[i];
            if (l != DPO_SIGMOID && l != DPO_SIGMOID_NORM && l != DPO_HINGE && l != DPO_IPO &&
                l != DPO_EXO_PAIR && l != DPO_ROBUST && l != DPO_DISCOPOP && l != DPO_SFT)
                return ctrl_error_set(
                    CTRL_ERR_CONFIG,
                    "[dpo] f_divergence_type = %s: only for the loss types sigmoid, "
                    "sigmoid_norm, hinge, ipo, exo_pair, robust, discopop and sft (loss_type "
                    "%s has no f-divergence generalization)",
                    fdiv_names[p->fdiv], loss_names[l]);
        }
    if (p->use_weighting && (uses(p, DPO_AOT) || uses(p, DPO_AOT_UNPAIRED)))
        return ctrl_error_set(CTRL_ERR_CONFIG, "[dpo] use_weighting: not with loss_type aot or aot_unpaired "
                                               "(they sort the pairs, which would misalign the weights)");
    if (p->use_weighting && uses(p, DPO_SFT))
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "[dpo] use_weighting: not with loss_type sft (TRL 1.16 fails on "
                              "this combination)");
    if (uses(p, DPO_EXO_PAIR) && !(p->label_smoothing > 0))
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "[dpo] loss_type: exo_pair needs label_smoothing > 0 (the EXO paper "
                              "recommends 1e-3)");
    if (spec->sync_ref_model && spec->precompute_ref_logp)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "[dpo] sync_ref_model: not with precompute_ref_log_probs = true (precomputed "
                              "log-probs assume a fixed reference)");
    return CTRL_OK;
}

/* The options into t, checked (create, and check_options when the config is validated). */
static ctrl_status read_options(const ctrl_config *cfg, ctrl_trainer *t) {
    const char *s = "dpo";
    ctrl_status st = read_losses(cfg, &t->p);
    dpo_params *p = &t->p;
    p->beta = ctrl_option_float(cfg, s, "beta", &st);
    p->label_smoothing = ctrl_option_float(cfg, s, "label_smoothing", &st);
    p->fdiv = ctrl_option_choice(cfg, s, "f_divergence_type", fdiv_names, &st);
    p->alpha_coef = ctrl_option_float(cfg, s, "f_alpha_divergence_coef", &st);
    p->use_weighting = ctrl_option_bool(cfg, s, "use_weighting", &st);
    p->discopop_tau = ctrl_option_float(cfg, s, "discopop_tau", &st);
    const double ld = ctrl_option_float(cfg, s, "ld_alpha", &st);
    t->spec = (ctrl_sequence_spec){
        .size = sizeof(ctrl_sequence_spec),
        .paired = 1,
        .needs_ref_logp = 1,
        .precompute_ref_logp = ctrl_option_bool(cfg, s, "precompute_ref_log_probs", &st),
        .precompute_ref_batch_size = (int)ctrl_option_int(cfg, s, "precompute_ref_batch_size", &st),
        .needs_log_sum_sq = p->use_weighting,
        .length_desensitized = ld < 1.0, /* 1.0 weighs every token as the plain sum: TRL's None */
        .ld_alpha = ld,
        .sync_ref_model = ctrl_option_bool(cfg, s, "sync_ref_model", &st),
        .ref_model_mixup_alpha = ctrl_option_float(cfg, s, "ref_model_mixup_alpha", &st),
        .ref_model_sync_steps = (int)ctrl_option_int(cfg, s, "ref_model_sync_steps", &st),
    };
    return st == CTRL_OK ? check_params(p, &t->spec) : st;
}

static ctrl_status dpo_check_options(const ctrl_config *cfg, const char *section) {
    (void)section;
    ctrl_trainer t = {0};
    return read_options(cfg, &t);
}

static ctrl_status dpo_create(const ctrl_host *host, const ctrl_config *cfg, ctrl_trainer **out) {
    (void)host;
    ctrl_trainer *t = calloc(1, sizeof *t);
    if (!t) return ctrl_error_set(CTRL_ERR_NOMEM, "trainer dpo: out of memory");
    ctrl_status st = read_options(cfg, t);
    if (st != CTRL_OK) {
        free(t);
        return st;
    }
    *out = t;
    return CTRL_OK;
}

static ctrl_status dpo_spec(ctrl_trainer *t, ctrl_sequence_spec *out) {
    size_t n = out->size < sizeof t->spec ? out->size : sizeof t->spec; /* a core built with an older spec */
    memcpy(out, &t->spec, n);
    out->size = n;
    return CTRL_OK;
}

static ctrl_status dpo_sequence_loss(ctrl_trainer *t, const ctrl_sequence_batch *b, double *loss,
                                     double *dlogp_sum, float *dscore, float *dlogp, int *per_token) {
    (void)dscore;
    if (b->size < sizeof(ctrl_sequence_batch) || b->n_pairs < 1 || b->n_seq != 2 * b->n_pairs ||
        !b->ref_logp_sum)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "trainer dpo: the batch must hold pairs (chosen then rejected) "
                              "and the reference's log-prob sums");
    if (!(b->num_items > 0))
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer dpo: the accumulated batch has no pair");
    if (t->p.use_weighting && !b->log_sum_sq)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer dpo: use_weighting needs log sum p^2 per token");
    return dpo_loss(&t->p, b, loss, dlogp_sum, dlogp, per_token);
}

static void dpo_destroy(ctrl_trainer *t) { free(t); }

static const ctrl_trainer_ops dpo_ops = {
    .size = sizeof(ctrl_trainer_ops),
    .create = dpo_create,
    .destroy = dpo_destroy,
    .sequence_spec = dpo_spec,
    .sequence_loss = dpo_sequence_loss,
};

static const ctrl_option dpo_options[] = {
    {"loss_type", CTRL_OPT_LIST, "sigmoid", 0, 0, 0,
     "sigmoid|hinge|ipo|exo_pair|nca_pair|robust|bco_pair|sppo_hard|aot|aot_unpaired|apo_zero|apo_down|"
     "discopop|"
     "sft|sigmoid_norm",
     "TRL's DPO losses; several (e.g. sigmoid,sft) are summed with loss_weights."},
    {"loss_weights", CTRL_OPT_STRING, "", 0, 0, 0, NULL,
     "One weight per loss_type, comma-separated (empty: all 1)."},
    {"beta", CTRL_OPT_FLOAT, "0.1", CTRL_OPT_HAS_MIN | CTRL_OPT_MIN_OPEN, 0, 0, NULL,
     "Deviation from the reference model (IPO's regularization tau for loss_type ipo)."},
    {"label_smoothing", CTRL_OPT_FLOAT, "0", CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX | CTRL_OPT_MAX_OPEN, 0, 0.5,
     NULL, "Label noise for the robust, exo_pair, aot and aot_unpaired losses (in [0, 0.5))."},
    {"f_divergence_type", CTRL_OPT_CHOICE, "reverse_kl", 0, 0, 0,
     "reverse_kl|forward_kl|js_divergence|alpha_divergence",
     "The f-divergence regularizer (f-DPO); reverse_kl is standard DPO."},
    {"f_alpha_divergence_coef", CTRL_OPT_FLOAT, "1.0", 0, 0, 0, NULL,
     "alpha of f_divergence_type = alpha_divergence (1: reverse KL)."},
    {"use_weighting", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "WPO: weigh each pair by the policy's length-normalized probability of both completions."},
    {"ld_alpha", CTRL_OPT_FLOAT, "1.0", CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX, 0, 1, NULL,
     "LD-DPO: weight of completion tokens past the shorter completion of the pair (1: off, TRL's None)."},
    {"discopop_tau", CTRL_OPT_FLOAT, "0.05", CTRL_OPT_HAS_MIN | CTRL_OPT_MIN_OPEN, 0, 0, NULL,
     "Temperature of the discopop loss's mixing of its logistic and exponential parts."},
    {"precompute_ref_log_probs", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "Compute the reference log-probs in one pass before training (stored in output_dir), so that no "
     "reference model is in memory while training."},
    {"precompute_ref_batch_size", CTRL_OPT_INT, "0", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Pairs per forward of the precompute pass (0: per_device_train_batch_size / "
     "per_device_eval_batch_size)."},
    CTRL_SEQUENCE_REF_SYNC_OPTIONS,
    CTRL_OPTION_END,
};

static const ctrl_plugin dpo_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_TRAINER,
    .name = "dpo",
    .version = "0.1.0",
    .summary = "Direct Preference Optimization with every TRL 1.16 loss_type (DPOTrainer)",
    .options = dpo_options,
    .init = ctrl_plugin_api_init,
    .ops = &dpo_ops,
    .check_options = dpo_check_options,
};

CTRL_PLUGIN_DEFINE(&dpo_plugin)
