/* Kahneman-Tversky Optimization with TRL 1.16's semantics (KTOTrainer._compute_loss): loss_type kto
 * or apo_zero_unpaired, beta, desirable_weight / undesirable_weight, the precomputed reference and
 * TR-DPO's reference sync (the core's, through the ctrl_sequence_spec this plugin fills). Rows are
 * unpaired {prompt, completion, label}; the core lays a micro-batch out as its completions, then
 * (loss_type kto) the KL estimate's mismatched sequences (prompt i with another row's completion,
 * TRL's rotation, flagged in batch->kl), computes their summed completion log-probs under the
 * policy and the reference, and spreads dL/dlogp_sum back over the tokens. Per row, with
 * r = logp - ref_logp and the KL estimate z = max(0, mean over the micro-batch's KL sequences of
 * logp - ref_logp), detached:
 *   kto               desirable 1 - sigmoid(beta (r - z)),   undesirable 1 - sigmoid(beta (z - r))
 *   apo_zero_unpaired desirable 1 - sigmoid(beta r),         undesirable sigmoid(beta r)
 * weighed by desirable_weight / undesirable_weight, summed over the micro-batch and divided by the
 * rows of the whole accumulated batch (TRL: the micro-batch mean over the gradient accumulation
 * steps). With several ranks z is the mean of the ranks' estimates and the metrics come from sums
 * over the ranks, as TRL gathers them over its processes (gather_for_metrics). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/plugin_api.h>

#include "../trainer_sigmoid.h"

CTRL_PLUGIN_API_DEFINE;

enum { KTO_KTO, KTO_APO_ZERO_UNPAIRED };
static const char *const loss_names[] = {"kto", "apo_zero_unpaired", NULL};

struct ctrl_trainer {
    ctrl_sequence_spec spec;
    int loss_type;
    double beta, desirable_weight, undesirable_weight;
};

/* The options into t, checked (create, and check_options when the config is validated). */
static ctrl_status read_options(const ctrl_config *cfg, ctrl_trainer *t) {
    const char *s = "kto";
    ctrl_status st = CTRL_OK;
    t->loss_type = ctrl_option_choice(cfg, s, "loss_type", loss_names, &st);
    t->beta = ctrl_option_float(cfg, s, "beta", &st);
    t->desirable_weight = ctrl_option_float(cfg, s, "desirable_weight", &st);
    t->undesirable_weight = ctrl_option_float(cfg, s, "undesirable_weight", &st);
    t->spec = (ctrl_sequence_spec){
        .size = sizeof(ctrl_sequence_spec),
        .paired = 0,
        .needs_ref_logp = 1,
        .precompute_ref_logp = ctrl_option_bool(cfg, s, "precompute_ref_log_probs", &st),
        .kl_sequences = t->loss_type == KTO_KTO,
        .precompute_ref_batch_size = (int)ctrl_option_int(cfg, s, "precompute_ref_batch_size", &st),
        .sync_ref_model = ctrl_option_bool(cfg, s, "sync_ref_model", &st),
        .ref_model_mixup_alpha = ctrl_option_float(cfg, s, "ref_model_mixup_alpha", &st),
        .ref_model_sync_steps = (int)ctrl_option_int(cfg, s, "ref_model_sync_steps", &st),
    };
    const long bs = ctrl_option_int(cfg, "train", "per_device_train_batch_size", &st);
    /* TRL's checks (KTOTrainer.__init__ / KTOConfig) */
    if (st == CTRL_OK && t->spec.kl_sequences && bs <= 1)
        st = ctrl_error_set(CTRL_ERR_CONFIG,
                            "[train] per_device_train_batch_size = %ld: loss_type kto needs more than 1 row "
                            "per micro-batch (the KL estimate would equal the implied reward)",
                            bs);
    if (st == CTRL_OK && t->spec.sync_ref_model && t->spec.precompute_ref_logp)
        st = ctrl_error_set(CTRL_ERR_CONFIG,
                            "[kto] sync_ref_model: not with precompute_ref_log_probs = true (precomputed "
                            "log-probs assume a fixed reference)");
    return st;
}

static ctrl_status kto_check_options(const ctrl_config *cfg, const char *section) {
    (void)section;
    ctrl_trainer t = {0};
    return read_options(cfg, &t);
}

static ctrl_status kto_create(const ctrl_host *host, const ctrl_config *cfg, ctrl_trainer **out) {
    (void)host;
    ctrl_trainer *t = calloc(1, sizeof *t);
    if (!t) return ctrl_error_set(CTRL_ERR_NOMEM, "trainer kto: out of memory");
    ctrl_status st = read_options(cfg, t);
    if (st != CTRL_OK) {
        free(t);
        return st;
    }
    *out = t;
    return CTRL_OK;
}

static ctrl_status kto_spec(ctrl_trainer *t, ctrl_sequence_spec *out) {
    size_t n = out->size < sizeof t->spec ? out->size : sizeof t->spec; /* a core built with an older spec */
    memcpy(out, &t->spec, n);
    out->size = n;
    return CTRL_OK;
}

static int is_kl(const ctrl_sequence_batch *b, int s) { return b->kl && b->kl[s]; }

/* TRL's metrics of the micro-batch (its _compute_loss logs them once per call), each from sums
 * over the ranks as TRL gathers them over its processes (v: the sums below, already summed); a
 * metric whose rows no rank has is absent, as in TRL. */
enum { N0, N1, REW0, REW1, LP0, LP1, LG0, LG1, TOK0, TOK1, ENT, ENT_TOK, KL_SUM, NV };

static void metric_sums(const ctrl_trainer *t, const ctrl_sequence_batch *b, double *v) {
    for (int i = 0; i < NV; i++) v[i] = 0;
    for (int s = 0; s < b->n_seq; s++) {
        if (is_kl(b, s)) continue;
        const int d = b->label[s] == 0; /* 0 desirable (TRL's chosen), 1 undesirable */
        v[N0 + d] += 1;
        v[REW0 + d] += t->beta * (b->logp_sum[s] - b->ref_logp_sum[s]);
        v[LP0 + d] += b->logp_sum[s];
        if (b->mean_logit) v[LG0 + d] += b->mean_logit[s] * b->n_tokens[s], v[TOK0 + d] += b->n_tokens[s];
        for (int32_t i = b->cu_seqlens[s]; b->entropy && i < b->cu_seqlens[s + 1]; i++)
            if (b->weight[i] != 0) v[ENT] += b->entropy[i], v[ENT_TOK] += 1;
    }
}

static void report_metrics(const ctrl_sequence_batch *b, const double *v, double kl) {
    b->report(b->report_ctx, "kl", kl);
    if (b->entropy) b->report(b->report_ctx, "entropy", v[ENT_TOK] > 0 ? v[ENT] / v[ENT_TOK] : 0.0);
    if (v[TOK0] > 0) b->report(b->report_ctx, "logits/chosen", v[LG0] / v[TOK0]);
    if (v[TOK1] > 0) b->report(b->report_ctx, "logits/rejected", v[LG1] / v[TOK1]);
    if (v[N0] > 0) {
        b->report(b->report_ctx, "rewards/chosen", v[REW0] / v[N0]);
        b->report(b->report_ctx, "logps/chosen", v[LP0] / v[N0]);
    }
    if (v[N1] > 0) {
        b->report(b->report_ctx, "rewards/rejected", v[REW1] / v[N1]);
        b->report(b->report_ctx, "logps/rejected", v[LP1] / v[N1]);
    }
    if (v[N0] > 0 && v[N1] > 0)
        b->report(b->report_ctx, "rewards/margins", v[REW0] / v[N0] - v[REW1] / v[N1]);
}

static ctrl_status kto_sequence_loss(ctrl_trainer *t, const ctrl_sequence_batch *b, double *loss,
                                     double *dlogp_sum, float *dscore, float *dlogp, int *per_token) {
    (void)dscore, (void)dlogp;
    if (b->size < sizeof(ctrl_sequence_batch) || b->n_pairs != 0 || !b->label || !b->ref_logp_sum)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer kto: the batch must hold unpaired rows with their "
                                                "labels and the reference's log-prob sums");
    if (!(b->num_items > 0))
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer kto: the accumulated batch has no row");
    /* the KL estimate: mean of policy - reference over the mismatched sequences, its mean over the
     * ranks (TRL's gather_for_metrics(kl).mean()), clamped, detached */
    double kl = 0, n_kl = 0;
    for (int s = 0; s < b->n_seq; s++)
        if (is_kl(b, s)) kl += b->logp_sum[s] - b->ref_logp_sum[s], n_kl += 1;
    if (t->spec.kl_sequences && n_kl == 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer kto: loss_type kto needs the KL sequences");
    double v[NV];
    metric_sums(t, b, v);
    v[KL_SUM] = n_kl > 0 ? kl / n_kl : 0.0;
    const int ranks = b->size >= offsetof(ctrl_sequence_batch, sum_over_ranks) + sizeof(void *) &&
                              b->sum_over_ranks && b->n_ranks > 1
                          ? b->n_ranks
                          : 1;
    if (ranks > 1) {
        const ctrl_status st = b->sum_over_ranks(v, NV);
        if (st != CTRL_OK) return ctrl_error_wrap(st, "trainer kto: the KL estimate over the ranks");
    }
    kl = n_kl > 0 ? fmax(v[KL_SUM] / ranks, 0.0) : 0.0;
    const double beta = t->beta, inv = 1.0 / b->num_items;
    double L = 0;
    for (int s = 0; s < b->n_seq; s++) {
        dlogp_sum[s] = 0;
        if (is_kl(b, s)) continue;
        const double r = b->logp_sum[s] - b->ref_logp_sum[s];
        const int desirable = b->label[s] != 0;
        const double w = (desirable ? t->desirable_weight : t->undesirable_weight) * inv;
        double l, g; /* the row's loss and its derivative in r */
        if (t->loss_type == KTO_KTO) {
            const double p = trainer_sigmoid(beta * (desirable ? r - kl : kl - r));
            l = 1 - p, g = (desirable ? -beta : beta) * p * (1 - p);
        } else {
            const double p = trainer_sigmoid(beta * r);
            l = desirable ? 1 - p : p, g = (desirable ? -beta : beta) * p * (1 - p);
        }
        L += w * l, dlogp_sum[s] = w * g;
    }
    *loss = L, *per_token = 0;
    if (b->report) report_metrics(b, v, kl);
    return CTRL_OK;
}

static void kto_destroy(ctrl_trainer *t) { free(t); }

static const ctrl_trainer_ops kto_ops = {
    .size = sizeof(ctrl_trainer_ops),
    .create = kto_create,
    .destroy = kto_destroy,
    .sequence_spec = kto_spec,
    .sequence_loss = kto_sequence_loss,
};

static const ctrl_option kto_options[] = {
    {"loss_type", CTRL_OPT_CHOICE, "kto", 0, 0, 0, "kto|apo_zero_unpaired",
     "kto (with the KL estimate from mismatched prompt/completion pairs) or apo_zero_unpaired (APO-zero's "
     "unpaired variant, no KL term)."},
    {"beta", CTRL_OPT_FLOAT, "0.1", CTRL_OPT_HAS_MIN | CTRL_OPT_MIN_OPEN, 0, 0, NULL,
     "Deviation from the reference model (higher: less deviation)."},
    {"desirable_weight", CTRL_OPT_FLOAT, "1.0", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Weight of the desirable rows' losses (to counter unequal numbers of desirable and undesirable rows)."},
    {"undesirable_weight", CTRL_OPT_FLOAT, "1.0", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Weight of the undesirable rows' losses."},
    {"precompute_ref_log_probs", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "Compute the reference log-probs (completions and KL sequences) in one pass before training (stored "
     "in output_dir), so that no reference model is in memory while training."},
    {"precompute_ref_batch_size", CTRL_OPT_INT, "0", CTRL_OPT_HAS_MIN, 0, 0, NULL,
     "Rows per forward of the precompute pass (0: per_device_train_batch_size / "
     "per_device_eval_batch_size)."},
    CTRL_SEQUENCE_REF_SYNC_OPTIONS,
    CTRL_OPTION_END,
};

static const ctrl_plugin kto_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_TRAINER,
    .name = "kto",
    .version = "0.1.0",
    .summary =
        "Kahneman-Tversky Optimization on unpaired rows, TRL 1.16's KTOTrainer (kto, apo_zero_unpaired)",
    .options = kto_options,
    .init = ctrl_plugin_api_init,
    .ops = &kto_ops,
    .check_options = kto_check_options,
};

CTRL_PLUGIN_DEFINE(&kto_plugin)
