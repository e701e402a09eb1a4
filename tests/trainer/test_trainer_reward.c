/* The reward trainer (plugins/trainer/reward) on the score head against TRL 1.16's RewardTrainer
 * (tests/reference/make_reward_trainer_fixtures.py): the tiny Qwen2ForSequenceClassification scores
 * TRL's batch of four pairs (chosen then rejected, tokenized as TRL tokenizes them), the plugin's
 * sequence_loss gives the loss, TRL's metrics and dL/dscore, and the score backward the
 * gradients -- with and without the margin column and center_rewards_coefficient, within 1e-5
 * relative in fp32. And as two micro-batches of two pairs (num_items = 4): the same loss and
 * gradients, as TRL's gradient accumulation of equal micro-batches gives. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/trainer.h>

#include "file_text.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "test.h"
#include "test_registry.h"

const ctrl_plugin *const *ctrl_plugins_reward(void);

#define FIX CTRL_FIXTURE_DIR "/reward_trainer"

typedef struct metrics {
    const char *name[8];
    double value[8];
    int n;
} metrics;

static void report(void *ctx, const char *name, double value) {
    metrics *m = ctx;
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->name[i], name)) { /* a second micro-batch: the mean, as TRL averages at log */
            m->value[i] = (m->value[i] + value) / 2;
            return;
        }
    if (m->n < 8) m->name[m->n] = name, m->value[m->n++] = value;
}

typedef struct pairs {
    int32_t tokens[512], positions[512], cu[17];
    float margin[8];
    int T, n;
} pairs;

/* Pairs [from, from + n) of the fixture as one flat micro-batch: chosen rows, then rejected. */
static void layout(const cJSON *root, int from, int n, pairs *p) {
    const cJSON *sides[2] = {cJSON_GetObjectItemCaseSensitive(root, "chosen_ids"),
                             cJSON_GetObjectItemCaseSensitive(root, "rejected_ids")};
    p->T = 0, p->n = n, p->cu[0] = 0;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < n; i++) {
            int k = 0;
            for (const cJSON *t = cJSON_GetArrayItem(sides[s], from + i)->child; t; t = t->next, k++, p->T++)
                p->tokens[p->T] = (int32_t)t->valuedouble, p->positions[p->T] = k;
            p->cu[s * n + i + 1] = p->T;
        }
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(root, "pairs");
    for (int i = 0; i < n; i++)
        p->margin[i] = (float)cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(rows, from + i), "margin")
                           ->valuedouble;
}

static ctrl_registry *registry(void) {
    static ctrl_registry *reg;
    if (!reg) reg = test_plugin_registry();
    return reg;
}

static ctrl_config *config(double center) {
    ctrl_registry *reg = registry();
    char ini[512];
    snprintf(ini, sizeof ini,
             "[run]\ntrainer = reward\n[model]\npath = %s/score/qwen2\n[reward]\n"
             "center_rewards_coefficient = %g\n",
             CTRL_FIXTURE_DIR, center);
    return test_config_from_text(reg, "reward.ini", ini);
}

/* One case, as `split` micro-batches of the four pairs. */
static void check_case(const cJSON *root, const char *name, int split) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "cases"), name);
    const int use_margin = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "margin"));
    const cJSON *cc = cJSON_GetObjectItemCaseSensitive(c, "center_rewards_coefficient");
    const double center = cJSON_IsNumber(cc) ? cc->valuedouble : 0;
    const ctrl_plugin *p = ctrl_plugins_reward()[0];
    const ctrl_trainer_ops *ops = p->ops;
    CHECK_EQ_INT(p->init(ctrl_host_table()), CTRL_OK);
    ctrl_config *cfg = config(center);
    ctrl_trainer *t = NULL;
    CHECK_EQ_INT(ops->create(ctrl_host_table(), cfg, &t), CTRL_OK);
    ctrl_sequence_spec spec;
    CHECK_EQ_INT(ops->sequence_spec(t, &spec), CTRL_OK);
    CHECK(spec.paired && spec.needs_score && !spec.needs_ref_logp);
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_load(CTRL_FIXTURE_DIR "/score/qwen2",
                                 ctrl_registry_find(registry(), CTRL_KIND_ATTENTION, "eager")->plugin->ops,
                                 &m),
                 CTRL_OK);
    if (!m || !t) return;
    ctrl_model_zero_grad(m);
    metrics got = {0};
    double loss = 0;
    const int per = 4 / split;
    for (int k = 0; k < split; k++) {
        pairs pr;
        layout(root, k * per, per, &pr);
        const ctrl_batch b = {
            .T = pr.T, .B = 2 * per, .tokens = pr.tokens, .positions = pr.positions, .cu_seqlens = pr.cu};
        float score[16], dscore[16];
        double dsum[16], part = 0;
        int per_token = -1;
        CHECK_EQ_INT(ctrl_model_score_forward(m, &b, score), CTRL_OK);
        const ctrl_sequence_batch sb = {.size = sizeof sb,
                                        .T = pr.T,
                                        .n_seq = 2 * per,
                                        .n_pairs = per,
                                        .cu_seqlens = pr.cu,
                                        .score = score,
                                        .margin = use_margin ? pr.margin : NULL,
                                        .num_items = 4,
                                        .report = report,
                                        .report_ctx = &got};
        CHECK_EQ_INT(ops->sequence_loss(t, &sb, &part, dsum, dscore, NULL, &per_token), CTRL_OK);
        CHECK_EQ_INT(per_token, 0);
        loss += part;
        CHECK_EQ_INT(ctrl_model_score_backward(m, dscore), CTRL_OK);
    }
    const double want = cJSON_GetObjectItemCaseSensitive(c, "loss")->valuedouble;
    CHECK_MSG(fabs(loss - want) <= 1e-5 * fabs(want), "%s/%d: loss %.8f, TRL %.8f", name, split, loss, want);
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(c, "metrics");
    for (int i = 0; split == 1 && i < got.n; i++) {
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(tm, got.name[i]);
        CHECK_MSG(w != NULL, "%s: TRL logs no %s", name, got.name[i]);
        if (w)
            CHECK_MSG(fabs(got.value[i] - w->valuedouble) <= 1e-5 * fmax(1e-3, fabs(w->valuedouble)),
                      "%s: %s = %.8f, TRL %.8f", name, got.name[i], got.value[i], w->valuedouble);
    }
    for (const cJSON *w = tm->child; split == 1 && w; w = w->next) {
        int seen = !strcmp(w->string, "num_tokens"); /* the loop's */
        for (int i = 0; i < got.n; i++) seen |= !strcmp(got.name[i], w->string);
        CHECK_MSG(seen, "%s: TRL's metric %s is not reported", name, w->string);
    }
    char path[1024];
    snprintf(path, sizeof path, FIX "/grads_%s.safetensors", name);
    ctrl_safetensors *gs = NULL;
    CHECK_EQ_INT(ctrl_safetensors_open(path, &gs), CTRL_OK);
    double worst = 0;
    const float *grads = ctrl_model_grads(m, NULL);
    for (int i = 0; gs && i < ctrl_safetensors_count(gs); i++) {
        const ctrl_st_tensor *ts = ctrl_safetensors_at(gs, i);
        const ctrl_param_view *v = ctrl_model_find_view(m, ts->name);
        CHECK_MSG(v != NULL, "no parameter %s", ts->name);
        if (!v) continue;
        float *w = malloc(sizeof(float) * (size_t)v->numel);
        CHECK_EQ_INT(ctrl_safetensors_read_f32(gs, ts->name, w, v->numel), CTRL_OK);
        const double e = test_rel_error_f32(grads + v->offset, w, v->numel);
        CHECK_MSG(e <= 1e-5, "%s/%d: gradient of %s: relative error %.3g", name, split, ts->name, e);
        worst = e > worst ? e : worst;
        free(w);
    }
    printf("  %-13s %d micro-batch%s: loss %.6f (TRL %.6f), worst gradient rel %.1e\n", name, split,
           split > 1 ? "es" : "", loss, want, worst);
    ctrl_safetensors_close(gs);
    ctrl_model_free(m);
    ops->destroy(t);
    ctrl_config_free(cfg);
}

TEST(reward_trainer_matches_trl) {
    ctrl_status st;
    char *text = ctrl_read_text_file(FIX "/cases.json", 1 << 20, &st);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(root != NULL);
    if (!root) return;
    static const char *const cases[] = {"plain", "margin", "center", "margin_center"};
    for (int i = 0; i < 4; i++) check_case(root, cases[i], 1);
    check_case(root, "margin_center", 2);
    cJSON_Delete(root);
}
