/* The ppo trainer plugin against TRL 0.25's own PPOTrainer.train() (tests/reference/
 * make_ppo_fixtures.py): from fixed responses, generating and reference log-probs, value-model
 * outputs and reward-model scores, the rollout TRL computed (truncation after the stop token,
 * missing_eos_penalty, k1 / k3 KL penalty, score at the last token, whitened rewards, GAE,
 * whitened advantages, returns, masks, the objective metrics), then the first optimizer step's
 * micro-batches: dL/dlogp and dL/dvalue of every token and the per-update policy and value metrics.
 * The k1_plain case also runs the tiny Qwen2 policy and its value model (the same trunk under a
 * one-label score) through ctrl's model and compares their log-probs, values and every parameter
 * gradient. ppo_two_updates_match_trl runs two whole updates (rollout, epochs, both models' AdamW
 * steps) through the models against TRL's train(). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/optimizer.h>
#include <ctrl/trainer.h>

#include "fixture.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "test.h"
#include "test_registry.h"

/* max |a - b| / max |b| (TRL's padded entries included) */
static double rel(const float *a, const float *b, long n) {
    double num = 0, den = 0;
    for (long i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return num / (den > 0 ? den : 1);
}

/* config: bs ga nmb epochs stop(-1|eos) missing_eos_penalty k3 kl_coef gamma lam whiten cliprange
 * cliprange_value vf_coef temperature pad eos */
static ctrl_config *case_config(ctrl_registry *reg, const float *c) {
    char ini[2048];
    snprintf(ini, sizeof ini,
             "[model]\npath = %s/models/qwen2\n[memory]\nstrategies =\n[generation]\ntemperature = %g\n"
             "[run]\ntrainer = ppo\n[train]\nper_device_train_batch_size = %d\ngradient_accumulation_steps = "
             "%d\n[ppo]\nnum_mini_batches = %d\nnum_ppo_epochs = %d\nstop_token = %s\nmissing_eos_penalty = "
             "%g\nkl_estimator = %s\nkl_coef = %g\ngamma = %g\nlam = %g\nwhiten_rewards = %s\ncliprange = "
             "%g\ncliprange_value = %g\nvf_coef = %g\n",
             CTRL_FIXTURE_DIR, c[14], (int)c[0], (int)c[1], (int)c[2], (int)c[3], c[4] >= 0 ? "eos" : "none",
             isnan(c[5]) ? 0.0 : c[5], c[6] != 0 ? "k3" : "k1", c[7], c[8], c[9],
             c[10] != 0 ? "true" : "false", c[11], c[12], c[13]);
    return test_config_from_text(reg, "ppo.ini", ini);
}

/* The policy and value model over the micro-batch's rows: each row is its prompt and response
 * tokens up to the value model's last read (the last kept token); at[i * W + t] is the flat position
 * that reads response token t (-1 past the row). */
typedef struct model_batch {
    ctrl_batch b;
    int32_t *tok, *pos, *tg, cu[64];
    int *at;
} model_batch;

static void model_batch_build(model_batch *mb, const float *q, const float *resp, const int *rows, int n,
                              int P, int W, const float *pmask) {
    mb->tok = malloc(sizeof(int32_t) * n * (P + W)), mb->pos = malloc(sizeof(int32_t) * n * (P + W));
    mb->tg = malloc(sizeof(int32_t) * n * (P + W)), mb->at = malloc(sizeof(int) * n * W);
    int t = 0;
    for (int i = 0; i < n; i++) {
        const int r = rows[i];
        int keep = 0; /* the response tokens through the last trained one (the value reads one past it) */
        for (int j = 0; j < W; j++)
            if (pmask[r * W + j] != 0) keep = j + 1;
        mb->cu[i] = t;
        for (int j = 0; j < P + keep; j++, t++) {
            mb->tok[t] = (int32_t)(j < P ? q[r * P + j] : resp[r * W + j - P]);
            mb->pos[t] = j;
            mb->tg[t] = j >= P - 1 && j - P + 1 < keep ? (int32_t)resp[r * W + j - P + 1] : -100;
        }
        for (int j = 0; j < W; j++) mb->at[i * W + j] = j <= keep ? mb->cu[i] + P - 1 + j : -1;
    }
    mb->cu[n] = t;
    mb->b = (ctrl_batch){
        .T = t, .B = n, .tokens = mb->tok, .positions = mb->pos, .cu_seqlens = mb->cu, .targets = mb->tg};
}

static void compare_grads(ctrl_model *m, ctrl_safetensors *gs, const char *prefix, double *worst) {
    float *grads = ctrl_model_grads(m, NULL);
    for (int v = 0; v < ctrl_model_view_count(m); v++) {
        const ctrl_param_view *pv = ctrl_model_view(m, v);
        char name[256];
        snprintf(name, sizeof name, "%s%s", prefix, pv->name);
        float *want = malloc(sizeof(float) * (size_t)pv->numel);
        if (ctrl_safetensors_read_f32(gs, name, want, pv->numel) == CTRL_OK) {
            const double e = test_rel_error_f32(grads + pv->offset, want, pv->numel);
            if (e > *worst) *worst = e;
        }
        free(want);
    }
}

/* The plugin's view of a micro-batch of bs sequences (T tokens, TRL's width W): the policy's log-probs
 * lp, entropies ent and weights w, the old log-probs o, the rollout's advantages a, returns r and
 * old values ov, the values vp with their weights vw, stat weights sw, dL/dvalue into dv. */
static ctrl_trainer_batch ppo_batch(int T, int bs, const int32_t *cu, int ga, int W, fixture_metrics *got,
                                    float *lp, float *ent, float *w, float *o, float *a, float *r, float *ov,
                                    float *vp, float *vw, float *sw, float *dv) {
    return (ctrl_trainer_batch){.size = sizeof(ctrl_trainer_batch),
                                .T = T,
                                .logp = lp,
                                .weight = w,
                                .n_seq = bs,
                                .cu_seqlens = cu,
                                .old_logp = o,
                                .entropy = ent,
                                .grad_accum = ga,
                                .report = fixture_metrics_report,
                                .report_ctx = got,
                                .token_advantages = a,
                                .returns = r,
                                .old_values = ov,
                                .values = vp,
                                .value_weight = vw,
                                .stat_weight = sw,
                                .dvalues = dv,
                                .width = W};
}

/* The plugin's rollout of B responses of width W (config c: pad and EOS ids) into adv, ret, oval,
 * pm and vm, its metrics into got. */
static ctrl_token_rollout ppo_rollout(const float *c, int B, int W, const int32_t *resp, const float *lp,
                                      const float *ref, const float *val, const float *scores, float *adv,
                                      float *ret, float *oval, float *pm, float *vm, fixture_metrics *got) {
    return (ctrl_token_rollout){.size = sizeof(ctrl_token_rollout),
                                .n = B,
                                .width = W,
                                .pad_token_id = (int)c[15],
                                .eos_token_id = (int)c[16],
                                .responses = resp,
                                .logp = lp,
                                .ref_logp = ref,
                                .values = val,
                                .scores = scores,
                                .advantages = adv,
                                .returns = ret,
                                .old_values = oval,
                                .policy_mask = pm,
                                .value_mask = vm,
                                .report = fixture_metrics_report,
                                .report_ctx = got};
}

static void run_case(ctrl_registry *reg, const char *name) {
    char path[2400];
    snprintf(path, sizeof path, "%s/ppo/%s.bin", CTRL_FIXTURE_DIR, name);
    fixture *f = fixture_load(path);
    CHECK_MSG(f != NULL, "cannot load %s", path);
    if (!f) return;
    const float *c = fixture_array(f, "config", 17), *shape = fixture_array(f, "shape", 4);
    const int B = (int)shape[0], W = (int)shape[1], P = (int)shape[2], n_micro = (int)shape[3];
    const int bs = (int)c[0], ga = (int)c[1], epochs = (int)c[3];
    const long N = (long)B * W;
    ctrl_config *cfg = case_config(reg, c);
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_TRAINER, "ppo");
    CHECK(e != NULL && cfg != NULL);
    if (!e || !cfg) return;
    const ctrl_trainer_ops *ops = e->plugin->ops;
    ctrl_trainer *t = NULL;
    const ctrl_status cst = ops->create(ctrl_host_table(), cfg, &t);
    CHECK_MSG(cst == CTRL_OK, "%s: %s", name, ctrl_error_message());
    if (!t) return;
    const float *resp_f = fixture_array(f, "responses", N);
    int32_t *resp = malloc(sizeof(int32_t) * N);
    for (long i = 0; i < N; i++) resp[i] = (int32_t)resp_f[i];
    float *adv = malloc(sizeof(float) * N), *ret = malloc(sizeof(float) * N),
          *val = malloc(sizeof(float) * N);
    float *pm = malloc(sizeof(float) * N), *vm = malloc(sizeof(float) * N);
    fixture_metrics got = {0};
    ctrl_token_rollout ro = ppo_rollout(
        c, B, W, resp, fixture_array(f, "old_logp_raw", N), fixture_array(f, "trl:ref_logprobs", N),
        fixture_array(f, "values_raw", N), fixture_array(f, "scores_raw", B), adv, ret, val, pm, vm, &got);
    CHECK_EQ_INT(ops->token_rollout(t, &ro), CTRL_OK);
    const float *pad_m = fixture_array(f, "trl:padding_mask", N),
                *pad_m1 = fixture_array(f, "trl:padding_mask_p1", N);
    int masks_equal = 1;
    for (long i = 0; i < N; i++) masks_equal &= pm[i] == 1 - pad_m[i] && vm[i] == 1 - pad_m1[i];
    CHECK_MSG(masks_equal, "%s: policy / value masks differ from TRL's padding masks", name);
    const double e_adv = rel(adv, fixture_array(f, "trl:advantages", N), N),
                 e_ret = rel(ret, fixture_array(f, "trl:returns", N), N);
    const double e_val = rel(val, fixture_array(f, "trl:values", N), N);
    CHECK_MSG(e_adv <= 1e-5 && e_ret <= 1e-5 && e_val <= 1e-6,
              "%s: advantages %.3g, returns %.3g, values %.3g", name, e_adv, e_ret, e_val);

    /* the first optimizer step's micro-batches, with TRL's new log-probs and values (or the model's) */
    const float *rows_f = fixture_array(f, "mb_rows", (long)n_micro * bs),
                *lp_f = fixture_array(f, "mb_logp", (long)n_micro * bs * W);
    const float *ent_f = fixture_array(f, "mb_entropy", (long)n_micro * bs * W),
                *dlp_f = fixture_array(f, "mb_dlogp", -1);
    const float *vp_f = fixture_array(f, "mb_vpred", (long)n_micro * bs * W),
                *dvp_f = fixture_array(f, "mb_dvpred", -1);
    const float *old_lp = fixture_array(f, "trl:logprobs", N), *q = fixture_array(f, "queries", (long)B * P);
    ctrl_model *pol = NULL, *vmod = NULL;
    snprintf(path, sizeof path, "%s/ppo/%s.grads.safetensors", CTRL_FIXTURE_DIR, name);
    ctrl_safetensors *gs = NULL;
    const int with_model = !strcmp(name, "k1_plain");
    if (with_model) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/models/qwen2", CTRL_FIXTURE_DIR);
        const ctrl_attention_ops *fl = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash")->plugin->ops;
        CHECK_EQ_INT(ctrl_model_load(dir, fl, &pol), CTRL_OK);
        CHECK_EQ_INT(ctrl_model_load_classifier(dir, fl, 1, 1, &vmod), CTRL_OK);
        CHECK_EQ_INT(ctrl_safetensors_open(path, &gs), CTRL_OK);
        if (!pol || !vmod || !gs) return;
        for (int v = 0; v < ctrl_model_view_count(vmod); v++) /* TRL's value head */
            if (!strcmp(ctrl_model_view(vmod, v)->name, "score.weight"))
                CHECK_EQ_INT(ctrl_safetensors_read_f32(gs, "value_model.score.init",
                                                       ctrl_model_params(vmod, NULL) +
                                                           ctrl_model_view(vmod, v)->offset,
                                                       ctrl_model_view(vmod, v)->numel),
                             CTRL_OK);
        ctrl_model_weights_changed(vmod);
        ctrl_model_set_temperature(pol, (float)c[14]);
        ctrl_model_zero_grad(pol), ctrl_model_zero_grad(vmod);
    }
    double e_dlp = 0, e_dv = 0, e_lp = 0, e_vp = 0;
    for (int u = 0; u < n_micro; u++) {
        int rows[64];
        for (int i = 0; i < bs; i++) rows[i] = (int)rows_f[u * bs + i];
        const float *lpu = lp_f + (long)u * bs * W, *vpu = vp_f + (long)u * bs * W;
        /* the flat layout: bs rows of W positions (the math alone), or the model's rows */
        model_batch mb = {0};
        int T = bs * W;
        if (with_model) model_batch_build(&mb, q, resp_f, rows, bs, P, W, pm), T = mb.b.T;
        float *lp = calloc(T, sizeof(float)), *ent = calloc(T, sizeof(float)), *vp = calloc(T, sizeof(float));
        float *w = calloc(T, sizeof(float)), *vw = calloc(T, sizeof(float)), *sw = calloc(T, sizeof(float));
        float *o = calloc(T, sizeof(float)), *a = calloc(T, sizeof(float)), *r = calloc(T, sizeof(float));
        float *ov = calloc(T, sizeof(float)), *d = malloc(sizeof(float) * T), *dv = malloc(sizeof(float) * T);
        float *vall = NULL;
        int32_t cu[65];
        if (with_model) {
            CHECK_EQ_INT(ctrl_model_forward(pol, &mb.b, lp, ent, NULL), CTRL_OK);
            int32_t *at = malloc(sizeof(int32_t) * T);
            for (int k = 0; k < T; k++) at[k] = k;
            vall = malloc(sizeof(float) * T);
            CHECK_EQ_INT(ctrl_model_score_forward_at(vmod, &mb.b, T, at, vall), CTRL_OK);
            free(at);
            memcpy(cu, mb.cu, sizeof(int32_t) * (bs + 1));
        } else {
            for (int i = 0; i <= bs; i++) cu[i] = i * W;
        }
        for (int i = 0; i < bs; i++)
            for (int j = 0; j < W; j++) {
                const int k = with_model ? mb.at[i * W + j] : i * W + j;
                const long s = (long)rows[i] * W + j, x = (long)i * W + j;
                if (k < 0) continue;
                if (with_model) {
                    if (pm[s] != 0) e_lp = fmax(e_lp, fabs(lp[k] - lpu[x]) / (fabs(lpu[x]) + 1e-6));
                    if (vm[s] != 0) e_vp = fmax(e_vp, fabs(vall[k] - vpu[x]) / (fabs(vpu[x]) + 1e-3));
                    vp[k] = vall[k];
                } else {
                    lp[k] = lpu[x], vp[k] = vpu[x], ent[k] = ent_f[(long)u * bs * W + x];
                }
                sw[k] = 1, w[k] = pm[s], vw[k] = vm[s], o[k] = old_lp[s], a[k] = adv[s], r[k] = ret[s];
                ov[k] = val[s];
            }
        ctrl_trainer_batch tb = ppo_batch(T, bs, cu, ga, W, &got, lp, ent, w, o, a, r, ov, vp, vw, sw, dv);
        double loss = 0;
        CHECK_EQ_INT(ops->loss(t, &tb, &loss, d), CTRL_OK);
        for (int i = 0; i < bs; i++)
            for (int j = 0; j < W; j++) {
                const int k = with_model ? mb.at[i * W + j] : i * W + j;
                const long x = (long)u * bs * W + (long)i * W + j;
                const double got_d = k >= 0 ? d[k] : 0, got_v = k >= 0 ? dv[k] : 0;
                e_dlp = fmax(e_dlp, fabs(got_d - dlp_f[x]) / (fabs(dlp_f[x]) + 1e-4));
                e_dv = fmax(e_dv, fabs(got_v - dvp_f[x]) / (fabs(dvp_f[x]) + 1e-4));
            }
        if (with_model) {
            CHECK_EQ_INT(ctrl_model_backward(pol, d), CTRL_OK);
            int32_t *at = malloc(sizeof(int32_t) * T);
            for (int k = 0; k < T; k++) at[k] = k;
            CHECK_EQ_INT(ctrl_model_score_backward_at(vmod, T, at, dv), CTRL_OK);
            free(at);
            free(mb.tok), free(mb.pos), free(mb.tg), free(mb.at);
        }
        free(lp), free(ent), free(vp), free(w), free(vw), free(sw), free(o), free(a), free(r), free(ov),
            free(d);
        free(dv), free(vall);
    }
    const double tol = 1e-5;
    CHECK_MSG(e_dlp <= tol && e_dv <= tol, "%s: dL/dlogp %.3g, dL/dvalue %.3g", name, e_dlp, e_dv);
    if (with_model)
        CHECK_MSG(e_lp <= 1e-5 && e_vp <= 1e-5, "%s: model log-probs %.3g, values %.3g", name, e_lp, e_vp);
    /* the rollout's metrics always; the policy metrics when the first step is the whole update */
    int compared = 0;
    for (int i = 0; i < got.n; i++) {
        if (epochs > 1 && strncmp(got.name[i], "objective/", 10) && strcmp(got.name[i], "val/num_eos_tokens"))
            continue;
        /* TRL averages the entropy over the padded width too, at pad positions whose logits come
         * from a masked pad token; the model layout has no pads (the math cases feed TRL's) */
        if (with_model && !strcmp(got.name[i], "policy/entropy_avg")) continue;
        compared += fixture_metric_is_trls(f, &got, i, name, 1e-5, 0);
    }
    CHECK_MSG(compared >= (epochs > 1 ? 6 : with_model ? 13 : 14), "%s: %d metrics compared", name, compared);
    printf("  %-20s advantages %.1e, returns %.1e, dL/dlogp %.1e, dL/dvalue %.1e, %d metrics\n", name, e_adv,
           e_ret, e_dlp, e_dv, compared);
    if (with_model) {
        double worst = 0;
        compare_grads(pol, gs, "policy.", &worst);
        compare_grads(vmod, gs, "value_model.", &worst);
        CHECK_MSG(worst <= 1e-5, "%s: worst parameter gradient relative error %.3g", name, worst);
        printf("    policy and value model: log-probs %.1e, values %.1e, parameter gradients %.1e\n", e_lp,
               e_vp, worst);
        ctrl_safetensors_close(gs);
        ctrl_model_free(pol), ctrl_model_free(vmod);
    }
    ops->destroy(t);
    ctrl_config_free(cfg);
    free(resp), free(adv), free(ret), free(val), free(pm), free(vm);
    fixture_free(f);
}

TEST(ppo_matches_trl) {
    ctrl_registry *reg = test_plugin_registry();
    run_case(reg, "k1_plain");
    run_case(reg, "k3_whiten_stop");
    run_case(reg, "epochs_minibatches");
    ctrl_registry_destroy(reg);
}

/* Forward of the policy (log-probs at the fixture's temperature, entropies) and the value model
 * (values at every position) over mb; lp, ent, vall [T]. */
static void models_forward(ctrl_model *pol, ctrl_model *vmod, model_batch *mb, float *lp, float *ent,
                           float *vall) {
    const int T = mb->b.T;
    CHECK_EQ_INT(ctrl_model_forward(pol, &mb->b, lp, ent, NULL), CTRL_OK);
    int32_t *at = malloc(sizeof(int32_t) * T);
    for (int k = 0; k < T; k++) at[k] = k;
    if (vmod) CHECK_EQ_INT(ctrl_model_score_forward_at(vmod, &mb->b, T, at, vall), CTRL_OK);
    free(at);
}

/* Worst relative error of m's parameters against the tensors PREFIX + name that gs holds (-1: none). */
static double compare_params(ctrl_model *m, ctrl_safetensors *gs, const char *prefix) {
    const float *params = ctrl_model_params(m, NULL);
    double worst = -1;
    for (int v = 0; v < ctrl_model_view_count(m); v++) {
        const ctrl_param_view *pv = ctrl_model_view(m, v);
        char name[256];
        snprintf(name, sizeof name, "%s%s", prefix, pv->name);
        float *want = malloc(sizeof(float) * (size_t)pv->numel);
        if (ctrl_safetensors_read_f32(gs, name, want, pv->numel) == CTRL_OK)
            worst = fmax(worst, test_rel_error_f32(params + pv->offset, want, pv->numel));
        free(want);
    }
    return worst;
}

static void model_batch_free(model_batch *mb) { free(mb->tok), free(mb->pos), free(mb->tg), free(mb->at); }

/* Two whole updates against TRL's train() (make_ppo_fixtures.py --updates): the tiny Qwen2 policy,
 * its initial weights as the reference and the value model (the same trunk under TRL's initial
 * value head) run through ctrl's model; each update from fixed full-width responses and scores: the
 * generation's log-probs, reference log-probs and values from the models, the plugin's rollout,
 * then 2 epochs x 2 micro-batches (TRL's permutations) of forward, loss and backward, each epoch's
 * optimizer step of the policy and the value model (the adamw plugin at TRL's settings, lr 1e-3
 * constant, no clipping). Every update's metrics as TRL logs them within 1e-4 relative (1e-6
 * absolute): the second update's depend on the first's optimizer steps of both models. */
TEST(ppo_two_updates_match_trl) {
    ctrl_registry *reg = test_plugin_registry();
    char path[1200];
    snprintf(path, sizeof path, "%s/ppo/two_updates.updates", CTRL_FIXTURE_DIR);
    fixture *f = fixture_load(path);
    CHECK_MSG(f != NULL, "cannot load %s", path);
    const float *c = f ? fixture_array(f, "config", 17) : NULL,
                *shape = f ? fixture_array(f, "shape", 4) : NULL;
    ctrl_config *cfg = c ? case_config(reg, c) : NULL;
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_TRAINER, "ppo"),
                            *oe = ctrl_registry_find(reg, CTRL_KIND_OPTIMIZER, "adamw");
    ctrl_trainer *t = NULL;
    ctrl_model *pol = NULL, *ref = NULL, *vmod = NULL;
    ctrl_optimizer *opt[2] = {NULL, NULL};
    if (shape && cfg && e && oe) {
        CHECK_EQ_INT(((const ctrl_trainer_ops *)e->plugin->ops)->create(ctrl_host_table(), cfg, &t), CTRL_OK);
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/models/qwen2", CTRL_FIXTURE_DIR);
        const ctrl_attention_ops *fl = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash")->plugin->ops;
        CHECK_EQ_INT(ctrl_model_load(dir, fl, &pol), CTRL_OK);
        CHECK_EQ_INT(ctrl_model_load(dir, fl, &ref), CTRL_OK);
        CHECK_EQ_INT(ctrl_model_load_classifier(dir, fl, 1, 1, &vmod), CTRL_OK);
    }
    ctrl_safetensors *gs = NULL;
    snprintf(path, sizeof path, "%s/ppo/two_updates.safetensors", CTRL_FIXTURE_DIR);
    if (vmod) CHECK_EQ_INT(ctrl_safetensors_open(path, &gs), CTRL_OK);
    if (!t || !pol || !ref || !vmod || !gs) {
        CHECK(0);
        goto out;
    }
    for (int v = 0; v < ctrl_model_view_count(vmod); v++) /* TRL's initial value head */
        if (!strcmp(ctrl_model_view(vmod, v)->name, "score.weight"))
            CHECK_EQ_INT(
                ctrl_safetensors_read_f32(gs, "value_model.score.init",
                                          ctrl_model_params(vmod, NULL) + ctrl_model_view(vmod, v)->offset,
                                          ctrl_model_view(vmod, v)->numel),
                CTRL_OK);
    ctrl_model_weights_changed(vmod);
    ctrl_model_set_temperature(pol, (float)c[14]), ctrl_model_set_temperature(ref, (float)c[14]);
    const ctrl_trainer_ops *ops = e->plugin->ops;
    const ctrl_optimizer_ops *oops = oe->plugin->ops;
    ctrl_model *trained[2] = {pol, vmod};
    ctrl_param_group groups[2];
    for (int k = 0; k < 2; k++) {
        size_t n = 0;
        CHECK(ctrl_model_trainable_offset(trained[k]) == 0);
        groups[k] = (ctrl_param_group){.param = ctrl_model_params(trained[k], NULL),
                                       .grad = ctrl_model_grads(trained[k], &n),
                                       .numel = (int64_t)n,
                                       .weight_decay = 0};
        CHECK_EQ_INT(oops->create(ctrl_host_table(), cfg, &groups[k], 1,
                                  (ctrl_device){.type = CTRL_DEVICE_CPU}, &opt[k]),
                     CTRL_OK);
    }
    const int B = (int)shape[0], W = (int)shape[1], P = (int)shape[2], U = (int)shape[3];
    const int bs = (int)c[0], ga = (int)c[1], epochs = (int)c[3];
    const long N = (long)B * W;
    const double lr = fixture_array(f, "lr", 1)[0];
    const float *perm = fixture_array(f, "perm", (long)U * epochs * B);
    static const char *const keys[] = {
        "objective/kl",     "objective/entropy",   "objective/non_score_reward", "objective/rlhf_reward",
        "objective/scores", "policy/approxkl_avg", "policy/clipfrac_avg",        "loss/policy_avg",
        "loss/value_avg",   "val/clipfrac_avg",    "policy/entropy_avg",         "val/ratio"};
    float *ones = malloc(sizeof(float) * N), *old = calloc(N, sizeof(float)), *rlp = calloc(N, sizeof(float));
    float *val = calloc(N, sizeof(float)), *adv = malloc(sizeof(float) * N), *ret = malloc(sizeof(float) * N);
    float *oval = malloc(sizeof(float) * N), *pm = malloc(sizeof(float) * N), *vm = malloc(sizeof(float) * N);
    int32_t *resp = malloc(sizeof(int32_t) * N);
    int all[64];
    for (long i = 0; i < N; i++) ones[i] = 1;
    for (int i = 0; i < B; i++) all[i] = i;
    double worst = 0;
    long step = 0;
    for (int u = 0; u < U && opt[0] && opt[1]; u++) {
        char key[64];
        snprintf(key, sizeof key, "u%d_queries", u);
        const float *q = fixture_array(f, key, (long)B * P);
        snprintf(key, sizeof key, "u%d_responses", u);
        const float *resp_f = fixture_array(f, key, N);
        snprintf(key, sizeof key, "u%d_scores", u);
        const float *scores = fixture_array(f, key, B);
        if (!q || !resp_f || !scores) break;
        for (long i = 0; i < N; i++) resp[i] = (int32_t)resp_f[i];
        /* the generation: log-probs, reference log-probs and values of the whole batch */
        model_batch mb = {0};
        model_batch_build(&mb, q, resp_f, all, B, P, W, ones);
        const int T = mb.b.T;
        float *lp = malloc(sizeof(float) * T), *vall = malloc(sizeof(float) * T);
        models_forward(pol, vmod, &mb, lp, NULL, vall);
        for (long x = 0; x < N; x++) old[x] = lp[mb.at[x]], val[x] = vall[mb.at[x]];
        models_forward(ref, NULL, &mb, lp, NULL, NULL);
        for (long x = 0; x < N; x++) rlp[x] = lp[mb.at[x]];
        free(lp), free(vall);
        model_batch_free(&mb);
        fixture_metrics got = {0};
        ctrl_token_rollout ro =
            ppo_rollout(c, B, W, resp, old, rlp, val, scores, adv, ret, oval, pm, vm, &got);
        CHECK_EQ_INT(ops->token_rollout(t, &ro), CTRL_OK);
        double e_ro = 0; /* the rollout TRL computed from its own models */
        const char *const names[] = {"logprobs", "ref_logprobs", "values", "advantages", "returns"};
        const float *mine[] = {old, rlp, val, adv, ret};
        for (int k = 0; k < 5; k++) {
            snprintf(key, sizeof key, "u%d_trl:%s", u, names[k]);
            const float *want = fixture_array(f, key, N);
            const double e = want ? rel(mine[k], want, N) : INFINITY;
            CHECK_MSG(e <= 1e-5, "update %d: %s %.3g from TRL's", u + 1, names[k], e);
            e_ro = fmax(e_ro, e);
        }
        printf(
            "  update %d: log-probs, reference log-probs, values, advantages, returns within %.1e of TRL's\n",
            u + 1, e_ro);
        for (int ep = 0; ep < epochs; ep++) {
            CHECK_EQ_INT(ctrl_model_zero_grad(pol), CTRL_OK);
            CHECK_EQ_INT(ctrl_model_zero_grad(vmod), CTRL_OK);
            for (int k = 0; k < ga; k++) {
                int rows[64];
                for (int i = 0; i < bs; i++) rows[i] = (int)perm[((long)u * epochs + ep) * B + k * bs + i];
                model_batch_build(&mb, q, resp_f, rows, bs, P, W, ones);
                const int Tm = mb.b.T;
                float *mlp = malloc(sizeof(float) * Tm), *ent = malloc(sizeof(float) * Tm),
                      *vp = malloc(sizeof(float) * Tm);
                models_forward(pol, vmod, &mb, mlp, ent, vp);
                float *w = calloc(Tm, sizeof(float)), *vw = calloc(Tm, sizeof(float)),
                      *sw = calloc(Tm, sizeof(float));
                float *o = calloc(Tm, sizeof(float)), *a = calloc(Tm, sizeof(float)),
                      *r = calloc(Tm, sizeof(float));
                float *ov = calloc(Tm, sizeof(float)), *d = calloc(Tm, sizeof(float)),
                      *dv = calloc(Tm, sizeof(float));
                for (int i = 0; i < bs; i++)
                    for (int j = 0; j < W; j++) {
                        const int at = mb.at[i * W + j];
                        const long s = (long)rows[i] * W + j;
                        sw[at] = 1, w[at] = pm[s], vw[at] = vm[s], o[at] = old[s], a[at] = adv[s],
                        r[at] = ret[s];
                        ov[at] = oval[s];
                    }
                for (int x = 0; x < Tm; x++)
                    if (sw[x] == 0) mlp[x] = 0, ent[x] = 0, vp[x] = 0;
                ctrl_trainer_batch tb =
                    ppo_batch(Tm, bs, mb.cu, ga, W, &got, mlp, ent, w, o, a, r, ov, vp, vw, sw, dv);
                double loss = 0;
                CHECK_EQ_INT(ops->loss(t, &tb, &loss, d), CTRL_OK);
                CHECK_EQ_INT(ctrl_model_backward(pol, d), CTRL_OK);
                int32_t *at = malloc(sizeof(int32_t) * Tm);
                for (int x = 0; x < Tm; x++) at[x] = x;
                CHECK_EQ_INT(ctrl_model_score_backward_at(vmod, Tm, at, dv), CTRL_OK);
                free(at), free(mlp), free(ent), free(vp), free(w), free(vw), free(sw), free(o), free(a),
                    free(r);
                free(ov), free(d), free(dv);
                model_batch_free(&mb);
            }
            step++; /* one optimizer step of both models an epoch (one mini-batch of ga micro-batches) */
            for (int k = 0; k < 2; k++) {
                CHECK_EQ_INT(oops->step(opt[k], &groups[k], 1, lr, step), CTRL_OK);
                ctrl_model_weights_changed(trained[k]);
            }
        }
        if (u == 0) { /* both models after the first update's optimizer steps */
            const double ep = compare_params(pol, gs, "u0.policy."),
                         ev = compare_params(vmod, gs, "u0.value_model.");
            printf("  after update 1: policy weights %.1e, value model weights %.1e from TRL's\n", ep, ev);
            CHECK_MSG(ep >= 0 && ep <= 1e-4 && ev >= 0 && ev <= 1e-4,
                      "after update 1: policy weights %.3g, value model weights %.3g from TRL's", ep, ev);
        }
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
            fixture_metrics_check(f, &got, keys[k], u, U, 1e-4, 1e-6, &worst);
    }
    printf("  %d updates: %zu metrics each, worst relative error %.1e\n", U, sizeof keys / sizeof *keys,
           worst);
    free(ones), free(old), free(rlp), free(val), free(adv), free(ret), free(oval), free(pm), free(vm),
        free(resp);
out:
    for (int k = 0; k < 2; k++)
        if (opt[k]) ((const ctrl_optimizer_ops *)oe->plugin->ops)->destroy(opt[k]);
    if (gs) ctrl_safetensors_close(gs);
    if (t) ((const ctrl_trainer_ops *)e->plugin->ops)->destroy(t);
    ctrl_model_free(pol), ctrl_model_free(ref), ctrl_model_free(vmod);
    ctrl_config_free(cfg);
    fixture_free(f);
    ctrl_registry_destroy(reg);
}
