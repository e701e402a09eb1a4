/* The online_dpo trainer plugin against TRL 1.16's own OnlineDPOTrainer.training_step
 * (tests/reference/make_online_dpo_fixtures.py): sigmoid and ipo, two betas, with and without
 * missing_eos_penalty. Two micro-batches of two prompts x two fixed completions make one optimizer
 * step: the scores after the penalty, the chosen / rejected choice (a tie included), the loss,
 * dL/dlogp of every completion token and TRL's metrics. Model cases run the tiny Qwen2 through
 * ctrl's model at temperature 1 and compare its log-probs and every parameter gradient. Bad options
 * are refused naming the key. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void run_case(ctrl_registry *reg, const char *dir, const char *file) {
    char path[2400], name[256], opts[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    snprintf(name, sizeof name, "%.*s", (int)(strlen(file) - 4), file);
    fixture *f = fixture_load(path);
    CHECK_MSG(f != NULL, "cannot load %s", path);
    if (!f) return;
    const float *c = dpo_fixture_get(f, "config", 8);
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
    float rewards[64], adv[64];
    int stopped[64];
    for (int k = 0; k < GA; k++) {
        char key[32];
        snprintf(key, sizeof key, "mb%d_rewards", k);
        const float *r = dpo_fixture_get(f, key, S);
        snprintf(key, sizeof key, "mb%d_eos", k);
        const float *eos = dpo_fixture_get(f, key, S);
        for (int i = 0; i < S; i++) rewards[k * S + i] = r[i], stopped[k * S + i] = eos[i] != 0;
    }
    dpo_metrics got = {0};
    ctrl_rollout ro = {.size = sizeof ro,
                       .n = GA * S,
                       .group = 2,
                       .rewards = rewards,
                       .report = dpo_report,
                       .report_ctx = &got,
                       .stopped = stopped,
                       .epoch = 0};
    CHECK_EQ_INT(ops->advantages(t, &ro, adv), CTRL_OK);

    snprintf(path, sizeof path, "%s/%s.grads.safetensors", dir, name);
    FILE *gf = fopen(path, "rb");
    ctrl_model *m = NULL;
    if (gf) {
        fclose(gf);
        char model_dir[1024];
        snprintf(model_dir, sizeof model_dir, "%s/models/qwen2", CTRL_FIXTURE_DIR);
        CHECK_EQ_INT(ctrl_model_load(model_dir,
                                     ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash")->plugin->ops, &m),
                     CTRL_OK);
        if (m) ctrl_model_zero_grad(m); /* log-probs at temperature 1, as TRL's online DPO */
    }
    const float *want_loss = dpo_fixture_get(f, "loss", GA);
    double worst_d = 0, worst_lp = 0;
    for (int k = 0; k < GA; k++) {
        const int C = (int)c[5 + k], T = S * (P + C);
        char key[32];
        snprintf(key, sizeof key, "mb%d_prompts", k);
        const float *prompts = dpo_fixture_get(f, key, BS * P);
        snprintf(key, sizeof key, "mb%d_completions", k);
        const float *comp = dpo_fixture_get(f, key, S * C);
        snprintf(key, sizeof key, "mb%d_logp", k);
        const float *lp_f = dpo_fixture_get(f, key, S * C);
        snprintf(key, sizeof key, "mb%d_ref_logp", k);
        const float *ref_f = dpo_fixture_get(f, key, S * C);
        snprintf(key, sizeof key, "mb%d_dlogp", k);
        const float *d_f = dpo_fixture_get(f, key, S * C);
        /* flat prompt + completion sequences; the position predicting completion token j of
         * sequence s is s (P + C) + P - 1 + j */
        int32_t *tok = malloc(sizeof(int32_t) * T), *pos = malloc(sizeof(int32_t) * T);
        int32_t *tg = malloc(sizeof(int32_t) * T), cu[65];
        float *lp = calloc((size_t)T, sizeof(float)), *w = calloc((size_t)T, sizeof(float));
        float *ref = calloc((size_t)T, sizeof(float)), *d = malloc(sizeof(float) * T);
        for (int s = 0; s < S; s++) {
            const int t0 = s * (P + C);
            cu[s] = t0;
            for (int j = 0; j < P + C; j++) {
                tok[t0 + j] = (int32_t)(j < P ? prompts[(s / 2) * P + j] : comp[s * C + j - P]);
                pos[t0 + j] = j, tg[t0 + j] = -100;
            }
            for (int j = 0; j < C; j++) {
                const int at = t0 + P - 1 + j;
                tg[at] = (int32_t)comp[s * C + j], w[at] = 1, ref[at] = ref_f[s * C + j],
                lp[at] = lp_f[s * C + j];
            }
        }
        cu[S] = T;
        ctrl_batch mb = {.T = T, .B = S, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
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
        ctrl_trainer_batch tb = {.size = sizeof tb,
                                 .T = T,
                                 .logp = lp,
                                 .weight = w,
                                 .n_seq = S,
                                 .cu_seqlens = cu,
                                 .advantages = adv + k * S,
                                 .ref_logp = ref,
                                 .grad_accum = GA,
                                 .report = dpo_report,
                                 .report_ctx = &got};
        double loss = 0;
        CHECK_EQ_INT(ops->loss(t, &tb, &loss, d), CTRL_OK);
        CHECK_MSG(fabs(loss - want_loss[k]) <= 1e-5 * fabs(want_loss[k]) + 1e-7,
                  "%s mb%d: loss %.8g vs TRL %.8g", name, k, loss, want_loss[k]);
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
        free(mlp), free(tok), free(pos), free(tg), free(lp), free(w), free(ref), free(d);
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

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

TEST(online_dpo_matches_trl) {
    ctrl_registry *reg = test_plugin_registry();
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/online_dpo", CTRL_FIXTURE_DIR);
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "cannot open %s", dir);
    char *files[32];
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d)) && n < 32;) {
        const size_t l = strlen(de->d_name);
        if (l > 4 && !strcmp(de->d_name + l - 4, ".bin")) files[n++] = strdup(de->d_name);
    }
    if (d) closedir(d);
    qsort(files, (size_t)n, sizeof *files, by_name);
    CHECK_MSG(n == 8, "%d fixture cases (expected sigmoid|ipo x 2 betas x with|without missing_eos_penalty)",
              n);
    for (int i = 0; i < n; i++) run_case(reg, dir, files[i]), free(files[i]);
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
        dpo_metrics got = {0};
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
                                .report = dpo_report,
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
