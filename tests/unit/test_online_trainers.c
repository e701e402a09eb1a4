/* The grpo and rloo trainer plugins against TRL's own GRPOTrainer / RLOOTrainer code
 * (tests/reference/make_grpo_fixtures.py): for every loss_type x importance_sampling_level x
 * scale_rewards x beta, and RLOO's beta / normalize_advantages / reward_clip_range, the advantages
 * TRL computed from fixed rewards, then over two micro-batches of one optimizer step the loss,
 * dL/dlogp of every completion token and the metrics. Model cases also run the tiny Qwen2 with
 * temperature 0.7 through ctrl's model and compare every parameter gradient. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/trainer.h>

#include "fixture.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "test.h"
#include "test_registry.h"

/* The trainer plugin configured as the fixture case says. */
static ctrl_config *case_config(ctrl_registry *reg, const char *name, const float *c) {
    char ini[2048];
    int n =
        snprintf(ini, sizeof ini,
                 "[model]\npath = %s/models/qwen2\n[memory]\nstrategies =\n[generation]\ntemperature = 0.7\n",
                 CTRL_FIXTURE_DIR);
    if (!strncmp(name, "grpo", 4)) {
        static const char *const losses[] = {"grpo", "bnpo", "dr_grpo", "dapo"},
                                 *scales[] = {"group", "batch", "none"};
        n += snprintf(ini + n, sizeof ini - n,
                      "[run]\ntrainer = grpo\n[grpo]\nnum_generations = 4\nmax_completion_length = 7\n"
                      "loss_type = %s\nimportance_sampling_level = %s\nscale_rewards = %s\nbeta = %g\n"
                      "epsilon = 0.2\nepsilon_high = 0.28\n",
                      losses[(int)c[0]], c[1] != 0 ? "sequence" : "token", scales[(int)c[2]], c[3]);
        if (strstr(name, "delta_entropy"))
            snprintf(ini + n, sizeof ini - n,
                     "delta = 1.25\ntop_entropy_quantile = 0.5\nmask_truncated_completions = true\n");
    } else {
        n += snprintf(
            ini + n, sizeof ini - n,
            "[run]\ntrainer = rloo\n[rloo]\nnum_generations = 4\nmax_completion_length = 7\nbeta = %g\n"
            "normalize_advantages = %s\n",
            c[0], c[1] != 0 ? "true" : "false");
        if (c[2] != 0 || c[3] != 0)
            snprintf(ini + n, sizeof ini - n, "reward_clip_range = %g,%g\n", c[2], c[3]);
    }
    return test_config_from_text(reg, "online.ini", ini);
}

/* Runs the tiny model over micro-batch `mb` (prompt + completion per sequence, unpadded) and
 * returns its completion tokens' log-probs and entropies in the fixture's [4, C] layout. */
typedef struct model_batch {
    ctrl_batch b;
    int32_t *tok, *pos, *tg, cu[5];
    int *at; /* [4 * C]: flat position predicting completion token (i, j), or -1 */
} model_batch;

static void model_batch_build(model_batch *mb, const fixture *f, int first, int C, const int *len) {
    const float *shape = fixture_array(f, "shape", 4), *ids = fixture_array(f, "completion_ids", -1);
    int T = 0;
    for (int i = 0; i < 4; i++) T += (int)shape[2 + (first + i) / 4] + len[first + i];
    mb->tok = malloc(sizeof(int32_t) * T), mb->pos = malloc(sizeof(int32_t) * T);
    mb->tg = malloc(sizeof(int32_t) * T), mb->at = malloc(sizeof(int) * 4 * C);
    int t = 0;
    for (int i = 0; i < 4; i++) {
        const int s = first + i, P = (int)shape[2 + s / 4];
        char key[16];
        snprintf(key, sizeof key, "prompt%d", s / 4);
        const float *prompt = fixture_array(f, key, P);
        mb->cu[i] = t;
        for (int j = 0; j < P + len[s]; j++, t++) {
            mb->tok[t] = (int32_t)(j < P ? prompt[j] : ids[s * C + j - P]);
            mb->pos[t] = j, mb->tg[t] = -100;
        }
        for (int j = 0; j < C; j++) {
            mb->at[i * C + j] = j < len[s] ? mb->cu[i] + P - 1 + j : -1;
            if (j < len[s]) mb->tg[mb->cu[i] + P - 1 + j] = (int32_t)ids[s * C + j];
        }
    }
    mb->cu[4] = t;
    mb->b = (ctrl_batch){
        .T = T, .B = 4, .tokens = mb->tok, .positions = mb->pos, .cu_seqlens = mb->cu, .targets = mb->tg};
}

static void model_batch_free(model_batch *mb) { free(mb->tok), free(mb->pos), free(mb->tg), free(mb->at); }

static void compare_grads(ctrl_model *m, const char *path) {
    ctrl_safetensors *gs = NULL;
    CHECK_EQ_INT(ctrl_safetensors_open(path, &gs), CTRL_OK);
    float *grads = ctrl_model_grads(m, NULL);
    double worst = 0;
    for (int v = 0; gs && v < ctrl_model_view_count(m); v++) {
        const ctrl_param_view *pv = ctrl_model_view(m, v);
        float *want = malloc(sizeof(float) * (size_t)pv->numel);
        if (ctrl_safetensors_read_f32(gs, pv->name, want, pv->numel) == CTRL_OK) {
            double e = test_rel_error_f32(grads + pv->offset, want, pv->numel);
            if (e > worst) worst = e;
        } else {
            CHECK_MSG(0, "%s: %s", path, ctrl_error_message());
        }
        free(want);
    }
    CHECK_MSG(worst <= 1e-4, "%s: worst parameter gradient relative error %.3g", path, worst);
    printf("    parameter gradients through the model: worst relative error %.1e\n", worst);
    ctrl_safetensors_close(gs);
}

static void run_case(void *reg, const char *dir, const char *file) {
    char path[2400], name[256];
    fixture *f = fixture_open_case(dir, file, name, sizeof name);
    if (!f) return;
    const float *shape = fixture_array(f, "shape", 4);
    const int B = (int)shape[0], C = (int)shape[1], rloo = !strncmp(name, "rloo", 4);
    ctrl_config *cfg = case_config(reg, name, fixture_array(f, "config", 4));
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_TRAINER, rloo ? "rloo" : "grpo");
    CHECK(e != NULL && cfg != NULL);
    if (!e || !cfg) return;
    const ctrl_trainer_ops *ops = e->plugin->ops;
    ctrl_trainer *t = NULL;
    CHECK_EQ_INT(ops->create(ctrl_host_table(), cfg, &t), CTRL_OK);
    const float *ids = fixture_array(f, "completion_ids", B * C),
                *mask = fixture_array(f, "completion_mask", B * C);
    const float *old = fixture_array(f, "old_logp", B * C), *ref = fixture_array(f, "ref_logp", B * C);
    int *len = calloc((size_t)B, sizeof(int)), *ntok = calloc((size_t)B, sizeof(int));
    float *kl = calloc((size_t)B, sizeof(float)), *adv = malloc(sizeof(float) * B);
    for (int i = 0; i < B; i++)
        for (int j = 0; j < C; j++) {
            len[i] += ids[i * C + j] != 0; /* real ids are >= 1; 0 pads */
            if (mask[i * C + j] > 0) kl[i] += old[i * C + j] - ref[i * C + j], ntok[i]++;
        }
    fixture_metrics got = {0};
    ctrl_rollout ro = {.size = sizeof ro,
                       .n = B,
                       .group = 4,
                       .rewards = fixture_array(f, "rewards", B),
                       .kl = kl,
                       .n_tokens = ntok,
                       .report = fixture_metrics_report,
                       .report_ctx = &got};
    CHECK_EQ_INT(ops->advantages(t, &ro, adv), CTRL_OK);
    const float *want_adv = fixture_array(f, "advantages", B);
    CHECK_MSG(test_rel_error_f32(adv, want_adv, B) <= 1e-5, "%s: advantages differ from TRL's (rel %.3g)",
              name, test_rel_error_f32(adv, want_adv, B));

    snprintf(path, sizeof path, "%s/%s.grads.safetensors", dir, name);
    ctrl_model *m = test_file_exists(path) ? test_tiny_qwen2(reg) : NULL;
    if (m) ctrl_model_set_temperature(m, 0.7f), ctrl_model_zero_grad(m);
    const float *want_loss = fixture_array(f, "loss", 2), *want_d = fixture_array(f, "dlogp", B * C);
    double worst_lp = 0;
    float *got_d = malloc(sizeof(float) * B * C), *exp_d = malloc(sizeof(float) * B * C);
    int n_d = 0;                  /* dL/dlogp of every real completion token, compared as one vector */
    for (int k = 0; k < 2; k++) { /* the two micro-batches of the optimizer step */
        char key[32];
        snprintf(key, sizeof key, "mb%d_logp", k);
        const float *lp_f = fixture_array(f, key, 4 * C);
        snprintf(key, sizeof key, "mb%d_entropy", k);
        const float *ent_f = fixture_array(f, key, 4 * C);
        model_batch mb;
        int T = 0, cu[5], *at;
        if (m) {
            model_batch_build(&mb, f, 4 * k, C, len);
            T = mb.b.T, at = mb.at;
        } else {
            at = malloc(sizeof(int) * 4 * C);
            for (int i = 0; i < 4; i++) {
                cu[i] = T;
                for (int j = 0; j < C; j++) at[i * C + j] = j < len[4 * k + i] ? T++ : -1;
            }
            cu[4] = T;
        }
        float *lp = calloc((size_t)T, sizeof(float)), *ent = calloc((size_t)T, sizeof(float));
        float *w = calloc((size_t)T, sizeof(float)), *o = calloc((size_t)T, sizeof(float));
        float *r = calloc((size_t)T, sizeof(float)), *d = malloc(sizeof(float) * T);
        if (m) {
            CHECK_EQ_INT(ctrl_model_forward(m, &mb.b, lp, ent, NULL), CTRL_OK);
        }
        for (int q = 0; q < 4 * C; q++) {
            const int p = at[q], s = 4 * k * C + q;
            if (p < 0) continue;
            if (m) {
                double e = fabs(lp[p] - lp_f[q]) / (fabs(lp_f[q]) + 1e-6);
                if (e > worst_lp) worst_lp = e;
            } else {
                lp[p] = lp_f[q], ent[p] = ent_f[q];
            }
            w[p] = mask[s], o[p] = old[s], r[p] = ref[s];
        }
        int32_t seq[5];
        for (int i = 0; i < 5; i++) seq[i] = m ? mb.cu[i] : cu[i];
        memset(d, 0xff, sizeof(float) * T); /* poisoned: every element must be written */
        ctrl_trainer_batch tb = {.size = sizeof tb,
                                 .T = T,
                                 .logp = lp,
                                 .weight = w,
                                 .num_items = fixture_array(f, "num_items", 1)[0],
                                 .n_seq = 4,
                                 .cu_seqlens = seq,
                                 .advantages = want_adv + 4 * k,
                                 .old_logp = o,
                                 .ref_logp = r,
                                 .entropy = ent,
                                 .grad_accum = 2,
                                 .report = fixture_metrics_report,
                                 .report_ctx = &got};
        double loss = 0;
        CHECK_EQ_INT(ops->loss(t, &tb, &loss, d), CTRL_OK);
        fixture_check_loss(name, k, loss, want_loss[k]);
        for (int q = 0; q < 4 * C; q++) {
            if (at[q] < 0) continue;
            got_d[n_d] = d[at[q]], exp_d[n_d++] = want_d[4 * k * C + q];
        }
        if (m) {
            CHECK_EQ_INT(ctrl_model_backward(m, d), CTRL_OK);
            model_batch_free(&mb);
        } else {
            free(at);
        }
        free(lp), free(ent), free(w), free(o), free(r), free(d);
    }
    const double worst_d = test_rel_error_f32(got_d, exp_d, n_d);
    CHECK_MSG(worst_d <= (m ? 1e-4 : 1e-5), "%s: dL/dlogp relative error %.3g", name, worst_d);
    free(got_d), free(exp_d);
    if (m) CHECK_MSG(worst_lp <= 1e-4, "%s: model log-probs relative error %.3g", name, worst_lp);
    int compared = 0;
    for (int i = 0; i < got.n; i++) compared += fixture_metric_is_trls(f, &got, i, name, 1e-5, 1);
    printf("  %-40s advantages, loss, dL/dlogp (rel %.1e), %d metrics match TRL\n", name, worst_d, compared);
    if (m) {
        snprintf(path, sizeof path, "%s/%s.grads.safetensors", dir, name);
        compare_grads(m, path);
        ctrl_model_free(m);
    }
    ops->destroy(t);
    ctrl_config_free(cfg);
    free(len), free(ntok), free(kl), free(adv);
    fixture_free(f);
}

/* GRPO says dL/dlogp is known before the forward (ctrl_online_spec.dlogp_before_forward) exactly when
 * beta = 0 and no entropy mask; then, without old log-probs, its dL/dlogp on zero log-probs with no
 * entropies equals the one on real ones, for every loss type and importance-sampling level. */
TEST(grpo_dlogp_before_forward_only_where_it_holds) {
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_TRAINER, "grpo");
    CHECK(e != NULL);
    if (!e) return;
    const ctrl_trainer_ops *ops = e->plugin->ops;
    static const char *const extra[] = {"", "beta = 0.04\n", "top_entropy_quantile = 0.5\n"};
    static const char *const losses[] = {"grpo", "bnpo", "dr_grpo", "dapo"};
    for (int x = 0; x < 3; x++)
        for (int lt = 0; lt < 4; lt++)
            for (int lvl = 0; lvl < 2; lvl++) {
                char ini[1024];
                snprintf(ini, sizeof ini,
                         "[model]\npath = %s/models/qwen2\n[memory]\nstrategies =\n[run]\ntrainer = "
                         "grpo\n[grpo]\nnum_generations = "
                         "4\nloss_type = %s\nimportance_sampling_level = %s\ndelta = 1.25\n%s",
                         CTRL_FIXTURE_DIR, losses[lt], lvl ? "sequence" : "token", extra[x]);
                ctrl_config *cfg = test_config_from_text(reg, "grpo.ini", ini);
                ctrl_trainer *t = NULL;
                CHECK(cfg != NULL);
                if (!cfg) continue;
                CHECK_EQ_INT(ops->create(ctrl_host_table(), cfg, &t), CTRL_OK);
                ctrl_online_spec spec = {.size = sizeof spec};
                CHECK_EQ_INT(ops->online_spec(t, &spec), CTRL_OK);
                CHECK_EQ_INT(spec.dlogp_before_forward, x == 0);
                if (x == 0) { /* two sequences of 5 tokens, the first of each untrained */
                    enum { T = 10 };
                    float lp[T], ent[T], zero[T] = {0}, w[T], d_real[T], d_zero[T];
                    const int32_t cu[3] = {0, 5, 10};
                    const float adv[2] = {0.7f, -1.3f};
                    for (int i = 0; i < T; i++)
                        lp[i] = -0.3f * (float)(i + 1), ent[i] = 0.1f * (float)i, w[i] = i % 5 ? 1.0f : 0.0f;
                    ctrl_trainer_batch b = {.size = sizeof b,
                                            .T = T,
                                            .logp = lp,
                                            .weight = w,
                                            .num_items = 8,
                                            .n_seq = 2,
                                            .cu_seqlens = cu,
                                            .advantages = adv,
                                            .entropy = ent,
                                            .grad_accum = 2};
                    double l_real = 0, l_zero = 0;
                    CHECK_EQ_INT(ops->loss(t, &b, &l_real, d_real), CTRL_OK);
                    b.logp = zero, b.entropy = NULL;
                    CHECK_EQ_INT(ops->loss(t, &b, &l_zero, d_zero), CTRL_OK);
                    CHECK_MSG(!memcmp(d_real, d_zero, sizeof d_real) && l_real == l_zero,
                              "%s/%s: dL/dlogp depends on the log-probs", losses[lt],
                              lvl ? "sequence" : "token");
                }
                ops->destroy(t);
                ctrl_config_free(cfg);
            }
    ctrl_registry_destroy(reg);
}

TEST(grpo_and_rloo_match_trl) {
    ctrl_registry *reg = test_plugin_registry();
    const int n = fixture_each_case("online", 128, run_case, reg);
    CHECK_MSG(n >= 53, "%d fixture cases (expected 48 GRPO grid cases + extras + 4 RLOO)", n);
    ctrl_registry_destroy(reg);
}
