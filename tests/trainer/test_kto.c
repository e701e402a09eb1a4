/* The kto trainer plugin against TRL 1.16's own KTOTrainer._compute_loss
 * (tests/reference/make_kto_fixtures.py): loss_type kto and apo_zero_unpaired x beta in {0.1, 0.5}
 * x desirable/undesirable weights {1, 1} and {1.33, 0.7}, the reference live or precomputed. Per
 * case, the two micro-batches of one optimizer step are laid out flat as the sequence kind lays
 * them (the rows' completions, then for kto the KL estimate's mismatched sequences, unpadded) with
 * TRL's per-token log-probs; the core's reductions and the plugin's sequence_loss must give TRL's
 * loss, dL/dlogp of every token and every metric TRL logs (and no other), within 1e-5 relative.
 * Then the same step through the tiny Qwen2 policy and reference (the kind's micro-batch). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/trainer.h>

#include "dpo_case.h"
#include "fixture.h"
#include "test.h"
#include "test_registry.h"
#include "config/config_load.h"
#include "train/kind_sequence.h"
#include "train/sequence.h"

static const char *const losses[] = {"kto", "apo_zero_unpaired"};

static ctrl_config *kto_config(ctrl_registry *reg, const char *section, int bs) {
    char ini[2048];
    snprintf(ini, sizeof ini,
             "[model]\npath = %s/models/qwen2\n[run]\ntrainer = kto\n[train]\nper_device_train_batch_size = "
             "%d\n[kto]\n%s",
             CTRL_FIXTURE_DIR, bs, section);
    return test_config_from_text(reg, "kto_case.ini", ini);
}

/* The kto trainer as the case's config says. */
static const ctrl_trainer_ops *case_trainer(ctrl_registry *reg, const fixture *f, ctrl_trainer **out) {
    const float *c = fixture_array(f, "config", 5);
    char sec[512];
    snprintf(sec, sizeof sec,
             "loss_type = %s\nbeta = %.9g\ndesirable_weight = %.9g\nundesirable_weight = %.9g\n"
             "precompute_ref_log_probs = %s\n",
             losses[(int)c[0]], c[1], c[2], c[3], c[4] != 0 ? "true" : "false");
    ctrl_config *cfg = kto_config(reg, sec, 4);
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_TRAINER, "kto");
    CHECK(cfg != NULL && e != NULL);
    if (!cfg || !e) return NULL;
    const ctrl_trainer_ops *ops = e->plugin->ops;
    const ctrl_status st = ops->create(ctrl_host_table(), cfg, out);
    CHECK_MSG(st == CTRL_OK, "kto create: %s", ctrl_error_message());
    ctrl_config_free(cfg);
    return st == CTRL_OK ? ops : NULL;
}

/* Every metric KTOTrainer can log (num_tokens is the core's, aux_loss is for MoE routers). */
static const char *const trl_metrics[] = {
    "kl",           "entropy",          "logits/chosen",  "logits/rejected", "rewards/chosen",
    "logps/chosen", "rewards/rejected", "logps/rejected", "rewards/margins"};

/* Every metric TRL logged was reported with TRL's mean, and every one reported is TRL's. */
static int compare_metrics(const fixture *f, const fixture_metrics *got, const char *name) {
    int n = 0;
    for (size_t i = 0; i < sizeof trl_metrics / sizeof *trl_metrics; i++) {
        char key[96];
        snprintf(key, sizeof key, "metric:%s", trl_metrics[i]);
        long len = 0;
        const float *want = fixture_get(f, key, &len);
        int j = 0;
        while (j < got->n && strcmp(got->name[j], trl_metrics[i])) j++;
        CHECK_MSG((want != NULL) == (j < got->n), "%s: %s logged by TRL %s, reported %s", name,
                  trl_metrics[i], want ? "yes" : "no", j < got->n ? "yes" : "no");
        if (!want || j == got->n) continue;
        const double mean = got->sum[j] / got->count[j];
        CHECK_MSG(fabs(mean - want[0]) <= 1e-5 * fabs(want[0]) + 1e-6, "%s: %s = %.7g, TRL %.7g", name,
                  trl_metrics[i], mean, want[0]);
        n++;
    }
    CHECK_MSG(n == got->n, "%s: %d metrics reported, %d of them TRL's", name, got->n, n);
    CHECK_MSG(n >= 6, "%s: %d metrics compared", name, n);
    return n;
}

/* Micro-batch mb of the case as the kind lays it out: x (dpo_flat of the 2B fixture rows) cut to
 * the B completions when the loss has no KL term, with labels and KL flags. */
static int case_layout(const fixture *f, int mb, int with_kl, dpo_flat *x, float *label, uint8_t *kl) {
    dpo_flat_build(x, f, mb);
    const int B = x->n_seq / 2, S = with_kl ? 2 * B : B;
    char key[32];
    snprintf(key, sizeof key, "mb%d_label", mb);
    const float *lab = fixture_array(f, key, B);
    for (int s = 0; s < S; s++) label[s] = s < B ? lab[s] : 0, kl[s] = s >= B;
    x->n_seq = S, x->T = x->cu[S], x->batch.T = x->T, x->batch.B = S;
    return S;
}

static void run_case(void *reg, const char *dir, const char *file) {
    char name[256];
    fixture *f = fixture_open_case(dir, file, name, sizeof name);
    if (!f) return;
    fixture_metrics got = {0};
    ctrl_trainer *t = NULL;
    const ctrl_trainer_ops *ops = case_trainer(reg, f, &t);
    const float *cfg = fixture_array(f, "config", 5);
    const int with_kl = cfg[0] == 0, pre = cfg[4] != 0;
    const float *want_loss = fixture_array(f, "loss", 2);
    double worst_d = 0;
    for (int mb = 0; mb < 2 && ops; mb++) {
        dpo_flat x;
        float label[64];
        uint8_t kl[64];
        const int S = case_layout(f, mb, with_kl, &x, label, kl), B = with_kl ? S / 2 : S;
        double sum[64], ref[64], ml[64], dsum[64];
        int n_tok[64];
        float *d = malloc(sizeof(float) * x.T);
        dpo_flat_sums(&x, f, mb, S, x.weight, pre, 2 * B, sum, ml, n_tok, ref);
        const ctrl_sequence_batch b = {.size = sizeof b,
                                       .T = x.T,
                                       .n_seq = S,
                                       .cu_seqlens = x.cu,
                                       .logp = x.logp,
                                       .weight = x.weight,
                                       .logp_sum = sum,
                                       .n_tokens = n_tok,
                                       .ref_logp_sum = ref,
                                       .mean_logit = ml,
                                       .label = label,
                                       .kl = with_kl ? kl : NULL,
                                       .num_items = 2 * B,
                                       .report = fixture_metrics_report,
                                       .report_ctx = &got,
                                       .entropy = x.entropy,
                                       .correct = x.correct};
        double loss = NAN;
        int per_token = -1;
        CHECK_EQ_INT(ops->sequence_loss(t, &b, &loss, dsum, NULL, NULL, &per_token), CTRL_OK);
        CHECK_EQ_INT(per_token, 0);
        fixture_check_loss(name, mb, loss, want_loss[mb]);
        train_sequence_spread(S, x.cu, x.weight, dsum, d);
        const double e = test_rel_error_f32(d, x.dlogp, x.T);
        if (e > worst_d) worst_d = e;
        dpo_flat_free(&x);
        free(d);
    }
    CHECK_MSG(worst_d <= 1e-5, "%s: dL/dlogp relative error %.3g", name, worst_d);
    const int compared = compare_metrics(f, &got, name);
    printf("  %-38s loss, dL/dlogp (rel %.1e), %d metrics match TRL\n", name, worst_d, compared);
    if (ops) ops->destroy(t);
    fixture_free(f);
}

TEST(kto_losses_match_trl) {
    ctrl_registry *reg = test_plugin_registry();
    const int n = fixture_each_case("kto", 64, run_case, reg);
    CHECK_MSG(n >= 10, "%d fixture cases (expected 2 loss types x 2 betas x 2 weightings + 2 precomputed)",
              n);
    ctrl_registry_destroy(reg);
}

/* What TRL refuses is refused when the config is validated (`ctrl config check`; the typed options
 * or the plugin's check_options), naming file:line and the key. */
TEST(kto_refuses_bad_options) {
    ctrl_registry *reg = test_plugin_registry();
    static const struct {
        const char *section, *want;
        int bs;
    } bad[] = {
        {"loss_type = sigmoid\n", "kto_bad.ini:8: [kto] loss_type", 4},
        {"beta = 0\n", "kto_bad.ini:8: [kto] beta", 4},
        {"desirable_weight = -1\n", "kto_bad.ini:8: [kto] desirable_weight", 4},
        {"loss_type = kto\n", "kto_bad.ini:6: [train] per_device_train_batch_size", 1},
        {"precompute_ref_log_probs = true\nsync_ref_model = true\n", "kto_bad.ini:9: [kto] sync_ref_model",
         4},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char ini[2048];
        snprintf(ini, sizeof ini,
                 "[model]\npath = %s/models/qwen2\n[run]\ntrainer = kto\n[train]\n"
                 "per_device_train_batch_size = %d\n[kto]\n%s",
                 CTRL_FIXTURE_DIR, bad[i].bs, bad[i].section);
        test_config_refused(reg, "kto_bad.ini", ini, bad[i].want);
    }
    /* apo_zero_unpaired has no KL term: one row per micro-batch is fine, as in TRL */
    ctrl_config *cfg = kto_config(reg, "loss_type = apo_zero_unpaired\n", 1);
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_TRAINER, "kto");
    ctrl_trainer *t = NULL;
    CHECK(cfg && e);
    if (cfg && e) {
        const ctrl_trainer_ops *ops = e->plugin->ops;
        CHECK_EQ_INT(ops->create(ctrl_host_table(), cfg, &t), CTRL_OK);
        ctrl_sequence_spec spec = {.size = sizeof spec};
        if (t) {
            CHECK_EQ_INT(ops->sequence_spec(t, &spec), CTRL_OK);
            ops->destroy(t);
        }
        CHECK_EQ_INT(spec.kl_sequences, 0);
        CHECK_EQ_INT(spec.paired, 0);
    }
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

/* The kind's micro-batch (kind_sequence_step.c) through the tiny Qwen2 policy and the fixtures'
 * reference: completions and KL sequences in one forward, the reference live or through the
 * precompute pass's function; the loss and the metrics against TRL's. */
static void run_model_case(ctrl_registry *reg, const char *name) {
    seq_case c;
    if (!seq_case_open(&c, reg, "kto", name, case_trainer)) return;
    const float *want_loss = fixture_array(c.f, "loss", 2);
    double worst_ref = 0;
    for (int mb = 0; mb < 2; mb++) {
        dpo_flat x;
        float label[64];
        uint8_t kl[64];
        const int S = case_layout(c.f, mb, c.spec.kl_sequences, &x, label, kl);
        double pre[64];
        seq_micro_batch run = {.batch = &x.batch,
                               .n_seq = S,
                               .seq_cu = x.cu,
                               .weight = x.weight,
                               .label = label,
                               .kl = c.spec.kl_sequences ? kl : NULL};
        seq_case_ref_sums(&c, &run, mb, pre, &worst_ref);
        seq_case_train(&c, &run, 8, name, mb, want_loss[mb]);
        dpo_flat_free(&x);
    }
    CHECK_MSG(worst_ref <= 1e-5, "%s: precomputed reference sums relative error %.3g", name, worst_ref);
    compare_metrics(c.f, &c.got, name);
    printf("  %-38s through the models: loss and metrics match TRL, precomputed reference sums %.1e\n", name,
           worst_ref);
    seq_case_close(&c);
}

TEST(kto_step_through_the_model_matches_trl) {
    ctrl_registry *reg = test_plugin_registry();
    run_model_case(reg, "kto_b50_w133_70_live");
    run_model_case(reg, "kto_b10_w100_100_pre");
    run_model_case(reg, "apo_zero_unpaired_b10_w133_70_live");
    ctrl_registry_destroy(reg);
}
