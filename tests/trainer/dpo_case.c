/* The dpo parity tests' shared pieces (see dpo_case.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dpo_case.h"
#include "model/safetensors.h"
#include "test.h"
#include "test_registry.h"
#include "train/sequence.h"

static const char *const losses[] = {"sigmoid",  "hinge",    "ipo",       "exo_pair", "nca_pair",
                                     "robust",   "bco_pair", "sppo_hard", "aot",      "aot_unpaired",
                                     "apo_zero", "apo_down", "discopop",  "sft",      "sigmoid_norm"};
static const char *const fdivs[] = {"reverse_kl", "forward_kl", "js_divergence", "alpha_divergence"};

void dpo_flat_build(dpo_flat *x, const fixture *f, int mb) {
    char key[64];
#define ARR(field, want) (snprintf(key, sizeof key, "mb%d_%s", mb, field), fixture_array(f, key, want))
    const float *shape = ARR("shape", 2);
    const int S = (int)shape[0], L = (int)shape[1];
    const float *ids = ARR("ids", S * L), *att = ARR("attention_mask", S * L),
                *cm = ARR("completion_mask", S * L);
    const float *lp = ARR("logp", S * (L - 1)), *dlp = ARR("dlogp", S * (L - 1)),
                *ref = ARR("ref_logp", S * (L - 1));
    const float *ent = ARR("entropy", S * (L - 1)), *ml = ARR("mean_logit", S * (L - 1));
    const float *top1 = ARR("is_top1", S * (L - 1));
    snprintf(key, sizeof key, "mb%d_log_sum_sq", mb);
    long n_lss = 0;
    const float *lss = fixture_get(f, key, &n_lss);
#undef ARR
    int T = 0;
    for (int i = 0; i < S * L; i++) T += att[i] != 0;
    memset(x, 0, sizeof *x);
    x->T = T, x->n_seq = S;
    x->cu = malloc(sizeof(int32_t) * (S + 1));
    x->tokens = malloc(sizeof(int32_t) * T), x->positions = malloc(sizeof(int32_t) * T);
    x->targets = malloc(sizeof(int32_t) * T), x->correct = calloc(T, sizeof(int32_t));
    x->weight = calloc(T, sizeof(float)), x->logp = calloc(T, sizeof(float)),
    x->dlogp = calloc(T, sizeof(float));
    x->ref_logp = calloc(T, sizeof(float)), x->entropy = calloc(T, sizeof(float));
    x->mean_logit = calloc(T, sizeof(float));
    x->log_sum_sq = lss ? calloc(T, sizeof(float)) : NULL;
    int t = 0;
    for (int s = 0; s < S; s++) {
        x->cu[s] = t;
        int len = 0;
        while (len < L && att[s * L + len] != 0) len++;
        for (int j = 0; j < len; j++, t++) {
            x->tokens[t] = (int32_t)ids[s * L + j], x->positions[t] = j;
            const int trained = j + 1 < len && cm[s * L + j + 1] != 0;
            x->targets[t] = trained ? (int32_t)ids[s * L + j + 1] : -100;
            if (!trained) continue;
            const int k = s * (L - 1) + j;
            x->weight[t] = 1, x->logp[t] = lp[k], x->dlogp[t] = dlp[k], x->ref_logp[t] = ref[k];
            x->entropy[t] = ent[k], x->mean_logit[t] = ml[k], x->correct[t] = top1[k] != 0;
            if (lss) x->log_sum_sq[t] = lss[k];
        }
    }
    x->cu[S] = t;
    x->batch = (ctrl_batch){.T = T,
                            .B = S,
                            .tokens = x->tokens,
                            .positions = x->positions,
                            .cu_seqlens = x->cu,
                            .targets = x->targets};
}

void dpo_flat_free(dpo_flat *x) {
    free(x->cu), free(x->tokens), free(x->positions), free(x->targets), free(x->correct), free(x->weight);
    free(x->logp), free(x->dlogp), free(x->ref_logp), free(x->entropy), free(x->mean_logit),
        free(x->log_sum_sq);
}

void dpo_flat_sums(const dpo_flat *x, const fixture *f, int mb, int S, const float *w, int pre, long n_ref,
                   double *sum, double *ml, int *n_tok, double *ref) {
    train_sequence_sums(S, x->cu, x->logp, w, sum, NULL);
    train_sequence_sums(S, x->cu, x->mean_logit, x->weight, ml, n_tok);
    for (int s = 0; s < S; s++) ml[s] = n_tok[s] ? ml[s] / n_tok[s] : 0;
    if (!pre) {
        train_sequence_sums(S, x->cu, x->ref_logp, w, ref, NULL);
        return;
    }
    const float *r = fixture_array(f, mb ? "mb1_ref_sum" : "mb0_ref_sum", n_ref);
    for (int s = 0; s < S; s++) ref[s] = r ? r[s] : NAN;
}

void dpo_case_ini(const fixture *f, char *buf, size_t cap) {
    const float *c = fixture_array(f, "config", DPO_CONFIG_N);
    int n = snprintf(buf, cap, "[dpo]\nloss_type = %s%s%s\nbeta = %.9g\nlabel_smoothing = %.9g\n",
                     losses[(int)c[0]], c[1] >= 0 ? "," : "", c[1] >= 0 ? losses[(int)c[1]] : "", c[4], c[5]);
    if (c[1] >= 0) n += snprintf(buf + n, cap - n, "loss_weights = %.9g,%.9g\n", c[2], c[3]);
    n += snprintf(buf + n, cap - n, "f_divergence_type = %s\nf_alpha_divergence_coef = %.9g\n",
                  fdivs[(int)c[6]], c[7]);
    n +=
        snprintf(buf + n, cap - n, "use_weighting = %s\ndiscopop_tau = %.9g\nprecompute_ref_log_probs = %s\n",
                 c[8] != 0 ? "true" : "false", c[10], c[11] != 0 ? "true" : "false");
    if (c[9] >= 0) snprintf(buf + n, cap - n, "ld_alpha = %.9g\n", c[9]);
}

const ctrl_trainer_ops *dpo_case_trainer(ctrl_registry *reg, const fixture *f, ctrl_trainer **out) {
    char ini[4096], sec[1024];
    dpo_case_ini(f, sec, sizeof sec);
    snprintf(ini, sizeof ini, "[model]\npath = %s/models/qwen2\n[run]\ntrainer = dpo\n%s", CTRL_FIXTURE_DIR,
             sec);
    ctrl_config *cfg = test_config_from_text(reg, "dpo_case.ini", ini);
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_TRAINER, "dpo");
    CHECK(cfg != NULL && e != NULL);
    if (!cfg || !e) return NULL;
    const ctrl_trainer_ops *ops = e->plugin->ops;
    const ctrl_status st = ops->create(ctrl_host_table(), cfg, out);
    CHECK_MSG(st == CTRL_OK, "dpo create: %s", ctrl_error_message());
    ctrl_config_free(cfg);
    return st == CTRL_OK ? ops : NULL;
}

int dpo_compare_metrics(const fixture *f, const fixture_metrics *got, const char *name, double rel) {
    int compared = 0;
    for (int i = 0; i < got->n; i++) compared += fixture_metric_is_trls(f, got, i, name, rel, 0);
    CHECK_MSG(compared >= 10, "%s: %d metrics compared (TRL logs 10 for DPO)", name, compared);
    return compared;
}

void dpo_case_models(ctrl_registry *reg, ctrl_model **policy, ctrl_model **ref) {
    char path[2048];
    const ctrl_attention_ops *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash")->plugin->ops;
    *ref = NULL;
    *policy = test_tiny_qwen2(reg);
    snprintf(path, sizeof path, "%s/dpo/ref_model", CTRL_FIXTURE_DIR);
    CHECK_EQ_INT(ctrl_model_load(path, attn, ref), CTRL_OK);
}

double dpo_compare_grads(ctrl_model *m, const char *path) {
    ctrl_safetensors *gs = NULL;
    CHECK_EQ_INT(ctrl_safetensors_open(path, &gs), CTRL_OK);
    if (!gs) return INFINITY;
    float *grads = ctrl_model_grads(m, NULL);
    double worst = 0;
    for (int v = 0; v < ctrl_model_view_count(m); v++) {
        const ctrl_param_view *pv = ctrl_model_view(m, v);
        float *want = malloc(sizeof(float) * (size_t)pv->numel);
        if (ctrl_safetensors_read_f32(gs, pv->name, want, pv->numel) == CTRL_OK) {
            const double e = test_rel_error_f32(grads + pv->offset, want, pv->numel);
            if (e > worst) worst = e;
        } else {
            CHECK_MSG(0, "%s: %s", path, ctrl_error_message());
            worst = INFINITY;
        }
        free(want);
    }
    ctrl_safetensors_close(gs);
    return worst;
}

int seq_case_open(seq_case *c, ctrl_registry *reg, const char *dir, const char *name,
                  seq_case_trainer_fn make) {
    memset(c, 0, sizeof *c);
    char path[2048];
    snprintf(path, sizeof path, "%s/%s/%s.bin", CTRL_FIXTURE_DIR, dir, name);
    c->f = fixture_load(path);
    CHECK_MSG(c->f != NULL, "cannot load %s", path);
    if (c->f) dpo_case_models(reg, &c->m, &c->ref);
    if (c->f) c->ops = make(reg, c->f, &c->t);
    if (!c->m || !c->ref || !c->ops) {
        seq_case_close(c);
        return 0;
    }
    c->spec.size = sizeof c->spec;
    CHECK_EQ_INT(c->ops->sequence_spec(c->t, &c->spec), CTRL_OK);
    c->step = (seq_step){.ops = c->ops,
                         .trainer = c->t,
                         .spec = &c->spec,
                         .model = c->m,
                         .ref = c->spec.precompute_ref_logp ? NULL : c->ref,
                         .report = fixture_metrics_report,
                         .report_ctx = &c->got};
    ctrl_model_zero_grad(c->m);
    return 1;
}

void seq_case_train(seq_case *c, const seq_micro_batch *run, double num_items, const char *name, int mb,
                    double want) {
    double loss = NAN;
    CHECK_EQ_INT(train_sequence_micro_batch(&c->step, run, num_items, 1, &loss), CTRL_OK);
    fixture_check_loss(name, mb, loss, want);
}

void seq_case_ref_sums(seq_case *c, seq_micro_batch *run, int mb, double *pre, double *worst) {
    if (!c->spec.precompute_ref_logp) return;
    CHECK_EQ_INT(train_sequence_ref_sums(&c->spec, c->ref, run, pre), CTRL_OK);
    const float *want = fixture_array(c->f, mb ? "mb1_ref_sum" : "mb0_ref_sum", run->n_seq);
    for (int s = 0; want && s < run->n_seq; s++) {
        const double e = fabs(pre[s] - want[s]) / fabs(want[s]);
        if (e > *worst) *worst = e;
    }
    run->ref_sum = pre;
}

void seq_case_close(seq_case *c) {
    if (c->ops && c->t) c->ops->destroy(c->t);
    ctrl_model_free(c->m), ctrl_model_free(c->ref);
    fixture_free(c->f);
    memset(c, 0, sizeof *c);
}
