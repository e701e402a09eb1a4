/* The online_dpo trainer plugin against TRL 1.16's own OnlineDPOTrainer.training_step
 * (tests/reference/make_online_dpo_fixtures.py): sigmoid and ipo, two betas, with and without
 * missing_eos_penalty. Two micro-batches of two prompts x two fixed completions make one optimizer
 * step: the scores after the penalty, the chosen / rejected choice (a tie included), the loss,
 * dL/dlogp of every completion token and TRL's metrics. Model cases run the tiny Qwen2 through
 * ctrl's model at temperature 1 and compare its log-probs and every parameter gradient. Bad options
 * are refused naming the key. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/optimizer.h>
#include <ctrl/trainer.h>

#include "dpo_case.h"
#include "fixture.h"
#include "model/model.h"
#include "test.h"
#include "test_registry.h"

static ctrl_config *odpo_config(ctrl_registry *reg, const char *options) {
    char ini[2048];
    snprintf(ini, sizeof ini,
             "[model]\npath = %s/models/qwen2\n[memory]\nstrategies =\n[run]\ntrainer = online_dpo\n"
             "[online_dpo]\n%s",
             CTRL_FIXTURE_DIR, options);
    return test_config_from_text(reg, "online_dpo.ini", ini);
}

/* A micro-batch of S = 2 x BS flat prompt + completion sequences (prompt s / 2 with completion s):
 * the position predicting completion token j of sequence s is s (P + C) + P - 1 + j, with weight 1,
 * its target, and the reference log-prob ref_f[s C + j]. */
typedef struct odpo_mb {
    ctrl_batch b;
    int32_t *tok, *pos, *tg, cu[65];
    float *w, *ref;
} odpo_mb;

static void odpo_mb_build(odpo_mb *x, const float *prompts, const float *comp, const float *ref_f, int S,
                          int P, int C) {
    const int T = S * (P + C);
    x->tok = malloc(sizeof(int32_t) * T), x->pos = malloc(sizeof(int32_t) * T),
    x->tg = malloc(sizeof(int32_t) * T);
    x->w = calloc((size_t)T, sizeof(float)), x->ref = calloc((size_t)T, sizeof(float));
    for (int s = 0; s < S; s++) {
        const int t0 = s * (P + C);
        x->cu[s] = t0;
        for (int j = 0; j < P + C; j++) {
            x->tok[t0 + j] = (int32_t)(j < P ? prompts[(s / 2) * P + j] : comp[s * C + j - P]);
            x->pos[t0 + j] = j, x->tg[t0 + j] = -100;
        }
        for (int j = 0; j < C; j++) {
            const int at = t0 + P - 1 + j;
            x->tg[at] = (int32_t)comp[s * C + j], x->w[at] = 1, x->ref[at] = ref_f[s * C + j];
        }
    }
    x->cu[S] = T;
    x->b = (ctrl_batch){
        .T = T, .B = S, .tokens = x->tok, .positions = x->pos, .cu_seqlens = x->cu, .targets = x->tg};
}

static void odpo_mb_free(odpo_mb *x) { free(x->tok), free(x->pos), free(x->tg), free(x->w), free(x->ref); }

/* The plugin's view of micro-batch k of GA: log-probs lp, the generation's advantages, metrics into got. */
static ctrl_trainer_batch odpo_mb_trainer(odpo_mb *x, float *lp, int S, const float *adv, int GA,
                                          fixture_metrics *got) {
    return (ctrl_trainer_batch){.size = sizeof(ctrl_trainer_batch),
                                .T = x->b.T,
                                .logp = lp,
                                .weight = x->w,
                                .n_seq = S,
                                .cu_seqlens = x->cu,
                                .advantages = adv,
                                .ref_logp = x->ref,
                                .grad_accum = GA,
                                .report = fixture_metrics_report,
                                .report_ctx = got};
}

/* The generation's scores: the rewards and EOS flags of GA micro-batches (fixture arrays
 * PREFIXmbK_rewards / _eos) through the plugin's advantages, its metrics into got. */
static void odpo_score(const ctrl_trainer_ops *ops, ctrl_trainer *t, const fixture *f, const char *prefix,
                       int GA, int S, fixture_metrics *got, float *adv) {
    float rewards[64];
    int stopped[64];
    char key[64];
    for (int k = 0; k < GA; k++) {
        snprintf(key, sizeof key, "%smb%d_rewards", prefix, k);
        const float *r = fixture_array(f, key, S);
        snprintf(key, sizeof key, "%smb%d_eos", prefix, k);
        const float *eos = fixture_array(f, key, S);
        for (int i = 0; r && eos && i < S; i++) rewards[k * S + i] = r[i], stopped[k * S + i] = eos[i] != 0;
    }
    ctrl_rollout ro = {.size = sizeof ro,
                       .n = GA * S,
                       .group = 2,
                       .rewards = rewards,
                       .report = fixture_metrics_report,
                       .report_ctx = got,
                       .stopped = stopped,
                       .epoch = 0};
    CHECK_EQ_INT(ops->advantages(t, &ro, adv), CTRL_OK);
}

static void run_case(void *reg, const char *dir, const char *file) {
    char path[2400], name[256], opts[512];
    fixture *f = fixture_open_case(dir, file, name, sizeof name);
    if (!f) return;
    const float *c = fixture_array(f, "config", 8);
    const int BS = (int)c[3], GA = (int)c[4], P = (int)c[7], S = 2 * BS;
    snprintf(opts, sizeof opts, "loss_type = %s\nbeta = %.9g\nmissing_eos_penalty = %g\nmax_new_tokens = 6\n",
             c[0] != 0 ? "ipo" : "sigmoid", c[1], c[2]);
    ctrl_config *cfg = odpo_config(reg, opts);
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_TRAINER, "online_dpo");
    CHECK(e != NULL && cfg != NULL);
    if (!e || !cfg) return;
    const ctrl_trainer_ops *ops = e->plugin->ops;
    ctrl_trainer *t = NULL;
    CHECK_EQ_INT(ops->create(ctrl_host_table(), cfg, &t), CTRL_OK);
    ctrl_online_spec spec = {.size = sizeof spec};
    CHECK_EQ_INT(ops->online_spec(t, &spec), CTRL_OK);
    CHECK(spec.num_generations == 2 && spec.needs_ref_logp && spec.batch_counts_prompts &&
          spec.logp_at_unit_temperature);

    /* the generation batch: both micro-batches' completions, scored */
    float adv[64];
    fixture_metrics got = {0};
    odpo_score(ops, t, f, "", GA, S, &got, adv);

    snprintf(path, sizeof path, "%s/%s.grads.safetensors", dir, name);
    ctrl_model *m = test_file_exists(path) ? test_tiny_qwen2(reg) : NULL;
    if (m) ctrl_model_zero_grad(m); /* log-probs at temperature 1, as TRL's online DPO */
    const float *want_loss = fixture_array(f, "loss", GA);
    double worst_d = 0, worst_lp = 0;
    for (int k = 0; k < GA; k++) {
        const int C = (int)c[5 + k], T = S * (P + C);
        char key[32];
        snprintf(key, sizeof key, "mb%d_prompts", k);
        const float *prompts = fixture_array(f, key, BS * P);
        snprintf(key, sizeof key, "mb%d_completions", k);
        const float *comp = fixture_array(f, key, S * C);
        snprintf(key, sizeof key, "mb%d_logp", k);
        const float *lp_f = fixture_array(f, key, S * C);
        snprintf(key, sizeof key, "mb%d_ref_logp", k);
        const float *ref_f = fixture_array(f, key, S * C);
        snprintf(key, sizeof key, "mb%d_dlogp", k);
        const float *d_f = fixture_array(f, key, S * C);
        odpo_mb x;
        odpo_mb_build(&x, prompts, comp, ref_f, S, P, C);
        float *lp = calloc((size_t)T, sizeof(float)), *d = malloc(sizeof(float) * T), *w = x.w;
        for (int s_ = 0; s_ < S; s_++)
            for (int j = 0; j < C; j++) lp[s_ * (P + C) + P - 1 + j] = lp_f[s_ * C + j];
        ctrl_batch mb = x.b;
        float *mlp = m ? malloc(sizeof(float) * T) : NULL;
        if (m) {
            CHECK_EQ_INT(ctrl_model_forward(m, &mb, mlp, NULL, NULL), CTRL_OK);
            for (int t_ = 0; t_ < T; t_++)
                if (w[t_] > 0) {
                    const double err = fabs(mlp[t_] - lp[t_]) / (fabs(lp[t_]) + 1e-6);
                    if (err > worst_lp) worst_lp = err;
                } else {
                    mlp[t_] = 0;
                }
        }
        memset(d, 0xff, sizeof(float) * T); /* poisoned: every element must be written */
        ctrl_trainer_batch tb = odpo_mb_trainer(&x, lp, S, adv + k * S, GA, &got);
        double loss = 0;
        CHECK_EQ_INT(ops->loss(t, &tb, &loss, d), CTRL_OK);
        fixture_check_loss(name, k, loss, want_loss[k]);
        float got_d[256], exp_d[256];
        int n = 0;
        for (int s = 0; s < S; s++)
            for (int j = 0; j < C; j++) got_d[n] = d[s * (P + C) + P - 1 + j], exp_d[n++] = d_f[s * C + j];
        for (int t_ = 0; t_ < T; t_++)
            if (!(w[t_] > 0)) CHECK_MSG(d[t_] == 0, "%s: dL/dlogp written on a prompt token", name);
        const double err = test_rel_error_f32(got_d, exp_d, n);
        if (err > worst_d) worst_d = err;
        if (m) { /* the model's backward from the loss on its own log-probs */
            tb.logp = mlp, tb.report = NULL;
            CHECK_EQ_INT(ops->loss(t, &tb, &loss, d), CTRL_OK);
            CHECK_EQ_INT(ctrl_model_backward(m, d), CTRL_OK);
        }
        free(mlp), free(lp), free(d);
        odpo_mb_free(&x);
    }
    CHECK_MSG(worst_d <= 1e-5, "%s: dL/dlogp relative error %.3g", name, worst_d);
    if (m) CHECK_MSG(worst_lp <= 1e-5, "%s: model log-probs relative error %.3g", name, worst_lp);
    const int compared = dpo_compare_metrics(f, &got, name, 1e-5);
    CHECK_MSG(compared == 14, "%s: %d metrics compared, TRL logs 14", name, compared);
    printf("  %-28s loss, dL/dlogp (rel %.1e), %d metrics match TRL\n", name, worst_d, compared);
    if (m) {
        printf("    model log-probs: worst relative error %.1e\n", worst_lp);
        const double worst = dpo_compare_grads(m, path);
        CHECK_MSG(worst <= 1e-5, "%s: worst parameter gradient relative error %.3g", name, worst);
        printf("    parameter gradients through the model: worst relative error %.1e\n", worst);
        ctrl_model_free(m);
    }
    ops->destroy(t);
    ctrl_config_free(cfg);
    fixture_free(f);
}

TEST(online_dpo_matches_trl) {
    ctrl_registry *reg = test_plugin_registry();
    const int n = fixture_each_case("online_dpo", 32, run_case, reg);
    CHECK_MSG(n == 8, "%d fixture cases (expected sigmoid|ipo x 2 betas x with|without missing_eos_penalty)",
              n);
    ctrl_registry_destroy(reg);
}

/* Several optimizer steps against TRL's (make_online_dpo_fixtures.py --curve): each step's two
 * micro-batches of fixed completions and rewards through the plugin and the tiny Qwen2's forward and
 * backward, then global-norm clipping to 1 (torch's clip_grad_norm_) and the adamw plugin at TRL's
 * AdamW settings; per step the micro-batch losses and the gradient norm before clipping within 1e-5
 * relative, TRL's rewards/margins, rewards/chosen, logps/chosen and objective/kl within 1e-4 (5
 * steps: the weights move, so each later step's log-probs are the updated policy's). */
TEST(online_dpo_curve_matches_trl) {
    ctrl_registry *reg = test_plugin_registry();
    char path[1200];
    snprintf(path, sizeof path, "%s/online_dpo/curve_sigmoid.curve", CTRL_FIXTURE_DIR);
    fixture *f = fixture_load(path);
    CHECK_MSG(f != NULL, "cannot load %s", path);
    const float *c = f ? fixture_array(f, "config", 10) : NULL;
    ctrl_config *cfg = odpo_config(reg, "loss_type = sigmoid\nbeta = 0.1\nmissing_eos_penalty = 1.0\n"
                                        "max_new_tokens = 6\n");
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_TRAINER, "online_dpo"),
                            *oe = ctrl_registry_find(reg, CTRL_KIND_OPTIMIZER, "adamw");
    ctrl_trainer *t = NULL;
    ctrl_model *m = NULL;
    if (c && cfg && e && oe) {
        CHECK_EQ_INT(((const ctrl_trainer_ops *)e->plugin->ops)->create(ctrl_host_table(), cfg, &t), CTRL_OK);
        m = test_tiny_qwen2(reg);
    }
    if (!t || !m) {
        CHECK(0);
        goto out;
    }
    const ctrl_trainer_ops *ops = e->plugin->ops;
    const ctrl_optimizer_ops *oops = oe->plugin->ops;
    const int BS = (int)c[3], GA = (int)c[4], P = (int)c[7], STEPS = (int)c[8], S = 2 * BS;
    size_t n = 0;
    float *params = ctrl_model_params(m, &n), *grads = ctrl_model_grads(m, NULL);
    const ctrl_param_group group = {.param = params, .grad = grads, .numel = (int64_t)n, .weight_decay = 0};
    ctrl_optimizer *opt = NULL;
    CHECK_EQ_INT(
        oops->create(ctrl_host_table(), cfg, &group, 1, (ctrl_device){.type = CTRL_DEVICE_CPU}, &opt),
        CTRL_OK);
    const float *want_loss = fixture_array(f, "loss", (long)STEPS * GA),
                *want_norm = fixture_array(f, "grad_norm", STEPS);
    static const char *const keys[] = {"rewards/margins", "rewards/chosen", "logps/chosen", "objective/kl"};
    double worst_loss = 0, worst_norm = 0, worst_metric = 0;
    for (int step = 0; opt && step < STEPS; step++) {
        CHECK_EQ_INT(ctrl_model_zero_grad(m), CTRL_OK);
        fixture_metrics got = {0};
        float adv[64];
        char key[64];
        snprintf(key, sizeof key, "s%d_", step);
        odpo_score(ops, t, f, key, GA, S, &got, adv);
        for (int k = 0; k < GA; k++) {
            const int C = (int)c[5 + k];
            snprintf(key, sizeof key, "s%d_mb%d_prompts", step, k);
            const float *prompts = fixture_array(f, key, BS * P);
            snprintf(key, sizeof key, "s%d_mb%d_completions", step, k);
            const float *comp = fixture_array(f, key, S * C);
            snprintf(key, sizeof key, "s%d_mb%d_ref_logp", step, k);
            const float *ref_f = fixture_array(f, key, S * C);
            if (!prompts || !comp || !ref_f) continue;
            odpo_mb x;
            odpo_mb_build(&x, prompts, comp, ref_f, S, P, C);
            float *lp = malloc(sizeof(float) * x.b.T), *d = malloc(sizeof(float) * x.b.T);
            CHECK_EQ_INT(ctrl_model_forward(m, &x.b, lp, NULL, NULL), CTRL_OK);
            for (int i = 0; i < x.b.T; i++) lp[i] = x.w[i] > 0 ? lp[i] : 0;
            ctrl_trainer_batch tb = odpo_mb_trainer(&x, lp, S, adv + k * S, GA, &got);
            double loss = 0;
            CHECK_EQ_INT(ops->loss(t, &tb, &loss, d), CTRL_OK);
            CHECK_EQ_INT(ctrl_model_backward(m, d), CTRL_OK);
            const double w = want_loss[step * GA + k], el = fabs(loss - w) / fmax(fabs(w), 1e-12);
            worst_loss = fmax(worst_loss, el);
            CHECK_MSG(el <= 1e-5, "step %d mb%d: loss %.8g vs TRL %.8g", step + 1, k, loss, w);
            free(lp), free(d);
            odpo_mb_free(&x);
        }
        double sq = 0; /* clip_grad_norm_(max_norm 1): scaled by 1 / (norm + 1e-6) when that is below 1 */
        for (size_t i = 0; i < n; i++) sq += (double)grads[i] * grads[i];
        const double norm = sqrt(sq), en = fabs(norm - want_norm[step]) / want_norm[step];
        worst_norm = fmax(worst_norm, en);
        CHECK_MSG(en <= 1e-5, "step %d: grad_norm %.8g vs TRL %.8g", step + 1, norm, want_norm[step]);
        const double coef = 1.0 / (norm + 1e-6);
        if (coef < 1)
            for (size_t i = 0; i < n; i++) grads[i] = (float)(grads[i] * coef);
        CHECK_EQ_INT(oops->step(opt, &group, 1, c[9], step + 1), CTRL_OK);
        ctrl_model_weights_changed(m);
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
            fixture_metrics_check(f, &got, keys[k], step, STEPS, 1e-4, 0, &worst_metric);
    }
    printf("  %d steps: worst relative error loss %.1e, grad_norm %.1e, metrics %.1e\n", STEPS, worst_loss,
           worst_norm, worst_metric);
    if (opt) oops->destroy(opt);
out:
    if (t) ((const ctrl_trainer_ops *)e->plugin->ops)->destroy(t);
    ctrl_model_free(m);
    ctrl_config_free(cfg);
    fixture_free(f);
    ctrl_registry_destroy(reg);
}

/* beta per epoch: the epoch's entry, then the last one. */
TEST(online_dpo_beta_per_epoch) {
    ctrl_registry *reg = test_plugin_registry();
    ctrl_config *cfg = odpo_config(reg, "beta = 0.5, 0.2,0.1\n");
    const ctrl_trainer_ops *ops = ctrl_registry_find(reg, CTRL_KIND_TRAINER, "online_dpo")->plugin->ops;
    ctrl_trainer *t = NULL;
    CHECK_EQ_INT(ops->create(ctrl_host_table(), cfg, &t), CTRL_OK);
    const double epochs[] = {0, 0.75, 1.0, 2.5, 7}, want[] = {0.5, 0.5, 0.2, 0.1, 0.1};
    for (int k = 0; t && k < 5; k++) {
        float r[2] = {1, 0}, adv[2];
        int stopped[2] = {1, 1};
        fixture_metrics got = {0};
        ctrl_rollout ro = {
            .size = sizeof ro, .n = 2, .group = 2, .rewards = r, .stopped = stopped, .epoch = epochs[k]};
        CHECK_EQ_INT(ops->advantages(t, &ro, adv), CTRL_OK);
        float lp[2] = {-1, -2}, w[2] = {1, 1}, ref[2] = {-1, -2}, d[2];
        int32_t cu[3] = {0, 1, 2};
        ctrl_trainer_batch b = {.size = sizeof b,
                                .T = 2,
                                .logp = lp,
                                .weight = w,
                                .n_seq = 2,
                                .cu_seqlens = cu,
                                .advantages = adv,
                                .ref_logp = ref,
                                .grad_accum = 1,
                                .report = fixture_metrics_report,
                                .report_ctx = &got};
        double loss;
        CHECK_EQ_INT(ops->loss(t, &b, &loss, d), CTRL_OK);
        CHECK_MSG(got.n > 0 && !strcmp(got.name[got.n - 1], "beta") && got.sum[got.n - 1] == want[k],
                  "epoch %g: beta %g, want %g", epochs[k], got.n ? got.sum[got.n - 1] : -1.0, want[k]);
        CHECK_MSG(fabs(d[0] + want[k] / 2) < 1e-7, "epoch %g: dL/dlogp %g, want -beta/2", epochs[k], d[0]);
    }
    if (t) ops->destroy(t);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

/* Options out of range or malformed: refused, naming the key. */
TEST(online_dpo_refuses_bad_options) {
    ctrl_registry *reg = test_plugin_registry();
    /* refused when the config loads (the option table, and the plugin's check_options on the
     * values), naming the key where it was set */
    static const char *const refused[][2] = {{"loss_type = hinge\n", "loss_type"},
                                             {"missing_eos_penalty = -1\n", "missing_eos_penalty"},
                                             {"num_generations = 4\n", "num_generations"},
                                             {"beta = 0\n", "beta"},
                                             {"beta = 0.1, x\n", "beta"},
                                             {"beta = -1\n", "beta"},
                                             {"max_new_tokens = 64\nmax_length = 64\n", "max_length"}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char path[1024], ini[512];
        snprintf(path, sizeof path, "%s/bad_online_dpo.ini", test_tmp_dir());
        snprintf(ini, sizeof ini,
                 "[model]\npath = %s/models/qwen2\n[run]\ntrainer = online_dpo\n[online_dpo]\n%s",
                 CTRL_FIXTURE_DIR, refused[i][0]);
        FILE *f = fopen(path, "w");
        CHECK(f != NULL);
        if (!f) continue;
        fputs(ini, f);
        fclose(f);
        ctrl_config *cfg = NULL;
        CHECK_MSG(ctrl_config_load(path, NULL, 0, reg, &cfg) != CTRL_OK, "accepted %s", refused[i][0]);
        CHECK_MSG(strstr(ctrl_error_message(), refused[i][1]) &&
                      strstr(ctrl_error_message(), "bad_online_dpo.ini:"),
                  "%s: error does not name the key and file:line: %s", refused[i][0], ctrl_error_message());
        ctrl_config_free(cfg);
    }
    ctrl_registry_destroy(reg);
}
