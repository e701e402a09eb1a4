/* The dpo trainer plugin against TRL 1.16's own DPOTrainer._compute_loss
 * (tests/reference/make_dpo_fixtures.py): every loss_type x beta in {0.1, 0.5} x {reference live,
 * precomputed}, sigmoid + sft with loss_weights, WPO, LD-DPO, the f-divergences. Per case, the two
 * micro-batches of one optimizer step are laid out flat as the sequence kind lays them (chosen
 * sequences, then rejected ones, unpadded), with TRL's per-token log-probs and fused-head outputs;
 * the core's reductions (train_sequence_sums, LD-DPO's weights, train_sequence_spread) and the
 * plugin's sequence_loss must give TRL's loss, dL/dlogp of every token and every metric TRL logs,
 * within 1e-5 relative. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/trainer.h>

#include "dpo_case.h"
#include "fixture.h"
#include "test.h"
#include "test_registry.h"
#include "train/kind_sequence.h"
#include "train/sequence.h"

static void run_case(void *reg, const char *dir, const char *file) {
    char name[256];
    fixture *f = fixture_open_case(dir, file, name, sizeof name);
    if (!f) return;
    fixture_metrics got = {0};
    ctrl_trainer *t = NULL;
    const ctrl_trainer_ops *ops = dpo_case_trainer(reg, f, &t);
    const float *cfg = fixture_array(f, "config", DPO_CONFIG_N);
    const double ld = cfg[9];
    const int pre = cfg[11] != 0;
    const float *want_loss = fixture_array(f, "loss", 2);
    double worst_d = 0;
    int sft = 0;
    for (int mb = 0; mb < 2 && ops; mb++) {
        dpo_flat x;
        dpo_flat_build(&x, f, mb);
        const int S = x.n_seq, B = S / 2;
        double *sum = malloc(sizeof(double) * S), *ref = malloc(sizeof(double) * S),
               *ml = malloc(sizeof(double) * S);
        double *dsum = malloc(sizeof(double) * S);
        int *n_tok = malloc(sizeof(int) * S);
        float *sw = malloc(sizeof(float) * x.T), *d = malloc(sizeof(float) * x.T),
              *dt = malloc(sizeof(float) * x.T);
        /* what the kind computes: LD-DPO weights, the sums, the mean logits */
        if (ld >= 0)
            train_sequence_ld_weights(B, x.cu, x.weight, ld, sw);
        else
            memcpy(sw, x.weight, sizeof(float) * x.T);
        dpo_flat_sums(&x, f, mb, S, sw, pre, S, sum, ml, n_tok, ref);
        ctrl_sequence_batch b = {.size = sizeof b,
                                 .T = x.T,
                                 .n_seq = S,
                                 .n_pairs = B,
                                 .cu_seqlens = x.cu,
                                 .logp = x.logp,
                                 .weight = x.weight,
                                 .logp_sum = sum,
                                 .n_tokens = n_tok,
                                 .ref_logp_sum = ref,
                                 .mean_logit = ml,
                                 .num_items = 2 * B,
                                 .report = fixture_metrics_report,
                                 .report_ctx = &got,
                                 .entropy = x.entropy,
                                 .correct = x.correct,
                                 .log_sum_sq = x.log_sum_sq};
        double loss = NAN;
        int per_token = -1;
        memset(dt, 0xff, sizeof(float) * x.T); /* poisoned: the plugin writes it whole when it says so */
        CHECK_EQ_INT(ops->sequence_loss(t, &b, &loss, dsum, NULL, dt, &per_token), CTRL_OK);
        fixture_check_loss(name, mb, loss, want_loss[mb]);
        train_sequence_spread(S, x.cu, sw, dsum, d);
        if (per_token == 1)
            for (int i = 0; i < x.T; i++) d[i] += dt[i];
        sft |= per_token == 1;
        const double e = test_rel_error_f32(d, x.dlogp, x.T);
        if (e > worst_d) worst_d = e;
        dpo_flat_free(&x);
        free(sum), free(ref), free(ml), free(dsum), free(n_tok), free(sw), free(d), free(dt);
    }
    CHECK_MSG(worst_d <= 1e-5, "%s: dL/dlogp relative error %.3g", name, worst_d);
    const int compared = dpo_compare_metrics(f, &got, name, 1e-5);
    printf("  %-40s loss, dL/dlogp (rel %.1e)%s, %d metrics match TRL\n", name, worst_d,
           sft ? " with sft" : "", compared);
    if (ops) ops->destroy(t);
    fixture_free(f);
}

TEST(dpo_losses_match_trl) {
    ctrl_registry *reg = test_plugin_registry();
    const int n = fixture_each_case("dpo", 160, run_case, reg);
    CHECK_MSG(n >= 74, "%d fixture cases (expected 60 loss_type x beta x reference cases + 14 more)", n);
    ctrl_registry_destroy(reg);
}

/* What TRL refuses (or fails on) is refused when the config is validated (`ctrl config check`,
 * the plugin's check_options, which create() runs too), naming file:line and the key. */
TEST(dpo_refuses_bad_combinations) {
    ctrl_registry *reg = test_plugin_registry();
    static const char *const bad[][2] = {
        {"loss_type = sigmoid,sft\nloss_weights = 1.0\n", "dpo_bad.ini:7: [dpo] loss_weights"},
        {"loss_type = sigmoid,sft\nloss_weights = 1.0,x\n", "dpo_bad.ini:7: [dpo] loss_weights"},
        {"loss_type = bco_pair\nf_divergence_type = js_divergence\n",
         "dpo_bad.ini:7: [dpo] f_divergence_type"},
        {"loss_type = aot\nuse_weighting = true\n", "dpo_bad.ini:7: [dpo] use_weighting"},
        {"loss_type = sigmoid,sft\nuse_weighting = true\n", "dpo_bad.ini:7: [dpo] use_weighting"},
        {"loss_type = exo_pair\n", "dpo_bad.ini:6: [dpo] loss_type"},
        {"precompute_ref_log_probs = true\nsync_ref_model = true\n", "dpo_bad.ini:7: [dpo] sync_ref_model"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char ini[1024];
        snprintf(ini, sizeof ini, "[model]\npath = %s/models/qwen2\n[run]\ntrainer = dpo\n[dpo]\n%s",
                 CTRL_FIXTURE_DIR, bad[i][0]);
        test_config_refused(reg, "dpo_bad.ini", ini, bad[i][1]);
    }
    ctrl_registry_destroy(reg);
}

/* The sequence kind's micro-batch (kind_sequence_step.c) through the tiny Qwen2 policy and the
 * reference model of the fixtures: the fused head's log-probs and its mean logits / log sum p^2
 * per token, the reference sums (live forward, or the precompute pass's function), the loss, the
 * metrics and every parameter gradient of one optimizer step against TRL's. */
static void run_model_case(ctrl_registry *reg, const char *name) {
    seq_case c;
    if (!seq_case_open(&c, reg, "dpo", name, dpo_case_trainer)) return;
    const float *want_loss = fixture_array(c.f, "loss", 2);
    double worst_lp = 0, worst_ml = 0, worst_lss = 0, worst_ref = 0;
    for (int mb = 0; mb < 2; mb++) {
        dpo_flat x;
        dpo_flat_build(&x, c.f, mb);
        double *pre = malloc(sizeof(double) * x.n_seq);
        seq_micro_batch run = {
            .batch = &x.batch, .n_seq = x.n_seq, .n_pairs = x.n_seq / 2, .seq_cu = x.cu, .weight = x.weight};
        seq_case_ref_sums(&c, &run, mb, pre, &worst_ref);
        /* the head's per-token outputs, checked on their own first */
        float *lp = malloc(sizeof(float) * x.T), *ml = malloc(sizeof(float) * x.T),
              *lss = malloc(sizeof(float) * x.T);
        CHECK_EQ_INT(ctrl_model_forward(c.m, &x.batch, lp, NULL, NULL), CTRL_OK);
        CHECK_EQ_INT(ctrl_model_head_stats(c.m, ml, x.log_sum_sq ? lss : NULL), CTRL_OK);
        for (int i = 0; i < x.T; i++) {
            if (x.weight[i] == 0) continue;
            const double e1 = fabs(lp[i] - x.logp[i]) / fabs(x.logp[i]), e2 = fabs(ml[i] - x.mean_logit[i]);
            worst_lp = e1 > worst_lp ? e1 : worst_lp, worst_ml = e2 > worst_ml ? e2 : worst_ml;
            if (x.log_sum_sq) {
                const double e3 = fabs(lss[i] - x.log_sum_sq[i]) / fabs(x.log_sum_sq[i]);
                worst_lss = e3 > worst_lss ? e3 : worst_lss;
            }
        }
        free(lp), free(ml), free(lss);
        seq_case_train(&c, &run, 6, name, mb, want_loss[mb]);
        free(pre);
        dpo_flat_free(&x);
    }
    CHECK_MSG(worst_lp <= 1e-5, "%s: log-probs relative error %.3g", name, worst_lp);
    CHECK_MSG(worst_ml <= 1e-6, "%s: mean logits absolute error %.3g", name, worst_ml);
    CHECK_MSG(worst_lss <= 1e-5, "%s: log sum p^2 relative error %.3g", name, worst_lss);
    CHECK_MSG(worst_ref <= 1e-5, "%s: precomputed reference sums relative error %.3g", name, worst_ref);
    dpo_compare_metrics(c.f, &c.got, name, 1e-5);
    char path[2048];
    snprintf(path, sizeof path, "%s/dpo/%s.grads.safetensors", CTRL_FIXTURE_DIR, name);
    const double worst = dpo_compare_grads(c.m, path);
    CHECK_MSG(worst <= 1e-4, "%s: worst parameter gradient relative error %.3g", name, worst);
    printf("  %-28s through the models: log-probs %.1e, mean logits %.1e (abs), log sum p^2 %.1e, reference "
           "sums %.1e, loss and metrics match, parameter gradients %.1e\n",
           name, worst_lp, worst_ml, worst_lss, worst_ref, worst);
    seq_case_close(&c);
}

TEST(dpo_step_through_the_model_matches_trl) {
    ctrl_registry *reg = test_plugin_registry();
    run_model_case(reg, "sigmoid_b10_live");
    run_model_case(reg, "sigmoid+sft_b10_pre");
    run_model_case(reg, "sigmoid_wpo_ld_b10_live");
    ctrl_registry_destroy(reg);
}
