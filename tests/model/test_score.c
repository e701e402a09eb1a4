/* The sequence-classification head (core/model/model_score.c) against transformers'
 * Qwen2ForSequenceClassification and LlamaForSequenceClassification
 * (tests/reference/make_score_fixtures.py): the scores of a right-padded batch -- one row ending in
 * attended pad tokens -- and the gradient of sum(w * score) for every parameter, within 1e-5
 * relative in fp32; the backward against finite differences; saving as transformers' classifier
 * directory and loading it back; a causal LM's trunk under a fresh score. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/attention.h>

#include "file_text.h"
#include "json_file.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "registry/registry.h"
#include "test.h"

const ctrl_plugin *const *ctrl_plugins_eager(void);

static const ctrl_attention_ops *eager(void) {
    const ctrl_plugin *p = ctrl_plugins_eager()[0];
    if (p->init) p->init(ctrl_host_table());
    return p->ops;
}

/* The fixture's rows as one flat batch (each row's attended tokens, positions from 0). */
typedef struct flat {
    int32_t tokens[256], positions[256], cu[16];
    float want[16], w[16];
    ctrl_batch b;
} flat;

static int load_batch(const char *dir, flat *f) {
    char path[1100];
    snprintf(path, sizeof path, "%s/batch.json", dir);
    cJSON *root = json_file(path);
    if (!root) return 0;
    int T = 0, B = 0;
    f->cu[0] = 0;
    for (const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "rows")->child; r; r = r->next, B++) {
        int p = 0;
        for (const cJSON *t = r->child; t; t = t->next, p++, T++)
            f->tokens[T] = (int32_t)t->valuedouble, f->positions[T] = p;
        f->cu[B + 1] = T;
    }
    int i = 0;
    for (const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "scores")->child; s; s = s->next)
        f->want[i++] = (float)s->valuedouble;
    i = 0;
    for (const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "w")->child; s; s = s->next)
        f->w[i++] = (float)s->valuedouble;
    cJSON_Delete(root);
    f->b = (ctrl_batch){.T = T, .B = B, .tokens = f->tokens, .positions = f->positions, .cu_seqlens = f->cu};
    return 1;
}

/* Worst relative L2 error over the gradient tensors of transformers' grads.safetensors. */
static double worst_grad_error(ctrl_model *m, const char *dir, const char **worst) {
    char path[1100];
    snprintf(path, sizeof path, "%s/grads.safetensors", dir);
    ctrl_safetensors *gs = NULL;
    CHECK_MSG(ctrl_safetensors_open(path, &gs) == CTRL_OK, "%s", ctrl_error_message());
    if (!gs) return INFINITY;
    CHECK_EQ_INT(ctrl_safetensors_count(gs), ctrl_model_view_count(m));
    const float *grads = ctrl_model_grads(m, NULL);
    double e = 0;
    for (int v = 0; v < ctrl_model_view_count(m); v++) {
        const ctrl_param_view *pv = ctrl_model_view(m, v);
        float *want = malloc(sizeof(float) * (size_t)pv->numel);
        CHECK_EQ_INT(ctrl_safetensors_read_f32(gs, pv->name, want, pv->numel), CTRL_OK);
        const double ev = test_rel_error_f32(grads + pv->offset, want, pv->numel);
        if (!(ev <= e)) e = ev, *worst = pv->name;
        free(want);
    }
    ctrl_safetensors_close(gs);
    return e;
}

static void check_arch(const char *arch) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/score/%s", CTRL_FIXTURE_DIR, arch);
    ctrl_model *m = NULL;
    CHECK_MSG(ctrl_model_load(dir, eager(), &m) == CTRL_OK, "%s: %s", arch, ctrl_error_message());
    flat f;
    if (!m || !load_batch(dir, &f)) return;
    CHECK_EQ_INT(ctrl_model_cfg(m)->num_labels, 1);
    CHECK(ctrl_model_find_view(m, "lm_head.weight") == NULL && ctrl_model_find_view(m, "score.weight"));
    float scores[16];
    CHECK_EQ_INT(ctrl_model_score_forward(m, &f.b, scores), CTRL_OK);
    const double es = test_rel_error_f32(scores, f.want, f.b.B);
    CHECK_MSG(es <= 1e-5, "%s: scores relative error %.3g", arch, es);
    ctrl_model_zero_grad(m);
    CHECK_EQ_INT(ctrl_model_score_backward(m, f.w), CTRL_OK);
    const char *worst = "";
    const double eg = worst_grad_error(m, dir, &worst);
    CHECK_MSG(eg <= 1e-5, "%s: gradient of %s: relative error %.3g", arch, worst, eg);
    printf("  %-6s scores rel %.1e, gradients worst tensor rel %.1e (%s)\n", arch, es, eg, worst);
    ctrl_model_free(m);
}

TEST(score_head_matches_transformers) {
    check_arch("qwen2");
    check_arch("llama");
}

static double weighted(ctrl_model *m, const flat *f) {
    float s[16];
    CHECK_EQ_INT(ctrl_model_score_forward(m, &f->b, s), CTRL_OK);
    double sum = 0;
    for (int i = 0; i < f->b.B; i++) sum += (double)f->w[i] * s[i];
    return sum;
}

/* Central differences of sum(w * score) on entries of the score, the final norm, a layer-0
 * projection and an embedding row the batch uses. */
TEST(score_backward_matches_finite_differences) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/score/llama", CTRL_FIXTURE_DIR);
    ctrl_model *m = NULL;
    flat f;
    CHECK_EQ_INT(ctrl_model_load(dir, eager(), &m), CTRL_OK);
    if (!m || !load_batch(dir, &f)) return;
    ctrl_model_zero_grad(m);
    weighted(m, &f);
    CHECK_EQ_INT(ctrl_model_score_backward(m, f.w), CTRL_OK);
    const float *g = ctrl_model_grads(m, NULL);
    float *p = ctrl_model_params(m, NULL);
    const struct {
        const char *name;
        int64_t at;
    } probes[] = {{"score.weight", 3},
                  {"model.norm.weight", 7},
                  {"model.layers.0.self_attn.q_proj.weight", 45},
                  {"model.layers.1.mlp.down_proj.weight", 100},
                  {"model.embed_tokens.weight", 32 * 0 + 5}};
    for (size_t k = 0; k < sizeof probes / sizeof *probes; k++) {
        const ctrl_param_view *v = ctrl_model_find_view(m, probes[k].name);
        if (!v) continue;
        size_t at = v->offset + (size_t)probes[k].at;
        if (!strcmp(probes[k].name, "model.embed_tokens.weight")) /* a row of the batch's first token */
            at = v->offset + (size_t)f.tokens[0] * (size_t)v->shape[1] + 5;
        const float keep = p[at], h = 1e-2f;
        p[at] = keep + h, ctrl_model_weights_changed(m);
        const double up = weighted(m, &f);
        p[at] = keep - h, ctrl_model_weights_changed(m);
        const double down = weighted(m, &f);
        p[at] = keep, ctrl_model_weights_changed(m);
        const double fd = (up - down) / (2.0 * h);
        CHECK_MSG(fabs(fd - g[at]) <= 2e-3 * fmax(1.0, fabs(fd)), "%s[%lld]: backward %.7g, differences %.7g",
                  probes[k].name, (long long)probes[k].at, (double)g[at], fd);
    }
    ctrl_model_free(m);
}

/* Saved, the classifier is transformers' directory again (the architecture, id2label, pad_token_id,
 * score.weight and no lm_head), and loading it back gives the same scores. */
TEST(classifier_saves_as_transformers_classifier) {
    char dir[1024], out[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/score/qwen2", CTRL_FIXTURE_DIR);
    snprintf(out, sizeof out, "%s/saved_classifier", test_tmp_dir());
    ctrl_model *m = NULL, *back = NULL;
    flat f;
    CHECK_EQ_INT(ctrl_model_load(dir, eager(), &m), CTRL_OK);
    if (!m || !load_batch(dir, &f)) return;
    CHECK_EQ_INT(ctrl_model_save(m, out, CTRL_F32), CTRL_OK);
    snprintf(path, sizeof path, "%s/config.json", out);
    cJSON *cfg = json_file(path);
    if (!cfg) return;
    CHECK_STR(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(cfg, "architectures"), 0)->valuestring,
              "Qwen2ForSequenceClassification");
    CHECK_EQ_INT(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(cfg, "id2label")), 1);
    CHECK_EQ_INT((int)cJSON_GetObjectItemCaseSensitive(cfg, "pad_token_id")->valuedouble, 0);
    cJSON_Delete(cfg);
    CHECK_EQ_INT(ctrl_model_load(out, eager(), &back), CTRL_OK);
    if (!back) return;
    float a[16], b[16];
    CHECK_EQ_INT(ctrl_model_score_forward(m, &f.b, a), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_score_forward(back, &f.b, b), CTRL_OK);
    for (int i = 0; i < f.b.B; i++) CHECK_EQ_INT(memcmp(&a[i], &b[i], sizeof(float)), 0);
    ctrl_safetensors *st = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    CHECK_EQ_INT(ctrl_safetensors_open(path, &st), CTRL_OK);
    CHECK_EQ_INT(ctrl_safetensors_count(st), ctrl_model_view_count(m));
    ctrl_safetensors_close(st);
    ctrl_model_free(m), ctrl_model_free(back);
}

/* With CTRL_SAVE_TEST_DIR set, both fixture classifiers saved there for
 * tests/reference/check_saved_classifiers.py (transformers loads them and gives the same scores). */
TEST(classifiers_saved_for_transformers_when_asked) {
    const char *out = getenv("CTRL_SAVE_TEST_DIR");
    if (!out) TEST_SKIP("CTRL_SAVE_TEST_DIR not set");
    static const char *const archs[] = {"qwen2", "llama"};
    for (int i = 0; i < 2; i++) {
        char dir[1024], to[1200];
        snprintf(dir, sizeof dir, "%s/score/%s", CTRL_FIXTURE_DIR, archs[i]);
        snprintf(to, sizeof to, "%s/%s", out, archs[i]);
        ctrl_model *m = NULL;
        CHECK_EQ_INT(ctrl_model_load(dir, eager(), &m), CTRL_OK);
        if (m) CHECK_EQ_INT(ctrl_model_save(m, to, CTRL_F32), CTRL_OK);
        ctrl_model_free(m);
    }
}

/* A causal LM's trunk under a fresh score: its weights as loaded, the score ~ N(0, initializer_range)
 * and the same for the same seed; the LM head is gone (the log-prob forward is refused), and a
 * causal LM has no score to run. */
TEST(causal_lm_gets_a_fresh_score) {
    const char *dir = CTRL_FIXTURE_DIR "/models/qwen2";
    ctrl_model *lm = NULL, *a = NULL, *b = NULL, *c = NULL;
    CHECK_EQ_INT(ctrl_model_load(dir, eager(), &lm), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_load_classifier(dir, eager(), 1, 7, &a), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_load_classifier(dir, eager(), 1, 7, &b), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_load_classifier(dir, eager(), 1, 8, &c), CTRL_OK);
    if (!lm || !a || !b || !c) return;
    const ctrl_param_view *sv = ctrl_model_find_view(a, "score.weight");
    CHECK(sv != NULL);
    if (!sv) return;
    const float *pa = ctrl_model_params(a, NULL) + sv->offset, *pb = ctrl_model_params(b, NULL) + sv->offset,
                *pc = ctrl_model_params(c, NULL) + sv->offset;
    double ss = 0;
    for (int64_t i = 0; i < sv->numel; i++) ss += (double)pa[i] * pa[i];
    const double std = sqrt(ss / (double)sv->numel);
    CHECK_MSG(std > 0.01 && std < 0.03, "score std %.4f (initializer_range 0.02)", std);
    CHECK_EQ_INT(memcmp(pa, pb, sizeof(float) * (size_t)sv->numel), 0);
    CHECK(memcmp(pa, pc, sizeof(float) * (size_t)sv->numel) != 0);
    const ctrl_param_view *lv = ctrl_model_find_view(lm, "model.layers.1.mlp.up_proj.weight"),
                          *av = ctrl_model_find_view(a, "model.layers.1.mlp.up_proj.weight");
    CHECK_EQ_INT(memcmp(ctrl_model_params(lm, NULL) + lv->offset, ctrl_model_params(a, NULL) + av->offset,
                        sizeof(float) * (size_t)lv->numel),
                 0);
    int32_t tok[3] = {1, 2, 3}, pos[3] = {0, 1, 2}, tg[3] = {2, 3, -100}, cu[2] = {0, 3};
    const ctrl_batch bt = {.T = 3, .B = 1, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
    float logp[3], s;
    CHECK_EQ_INT(ctrl_model_forward(a, &bt, logp, NULL, NULL), CTRL_ERR_RUNTIME);
    CHECK_CONTAINS(ctrl_error_message(), "no LM head");
    CHECK_EQ_INT(ctrl_model_score_forward(lm, &bt, &s), CTRL_ERR_RUNTIME);
    CHECK_CONTAINS(ctrl_error_message(), "no score head");
    CHECK_EQ_INT(ctrl_model_score_forward(a, &bt, &s), CTRL_OK);
    CHECK(isfinite(s));
    ctrl_model_free(lm), ctrl_model_free(a), ctrl_model_free(b), ctrl_model_free(c);
}

/* transformers' rule: the rightmost token that is not the pad token (0 when all are), the last
 * without a pad token. */
TEST(score_index_is_the_last_non_pad_token) {
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_load(CTRL_FIXTURE_DIR "/score/llama", eager(), &m), CTRL_OK);
    if (!m) return;
    const int32_t a[5] = {5, 0, 7, 0, 0}, all_pad[3] = {0, 0, 0}, plain[3] = {4, 5, 6};
    CHECK_EQ_INT(ctrl_model_score_index(m, a, 5), 2);
    CHECK_EQ_INT(ctrl_model_score_index(m, all_pad, 3), 0);
    CHECK_EQ_INT(ctrl_model_score_index(m, plain, 3), 2);
    ctrl_model_set_pad_token_id(m, -1);
    CHECK_EQ_INT(ctrl_model_score_index(m, a, 5), 4);
    ctrl_model_free(m);
}

/* With the read positions given (a layout with pad segments of their own, as the preference
 * batches): the scores and gradients of the batch without the pad segment. */
TEST(score_at_given_positions_skips_pad_segments) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/score/llama", CTRL_FIXTURE_DIR);
    ctrl_model *m = NULL;
    flat f, g;
    CHECK_EQ_INT(ctrl_model_load(dir, eager(), &m), CTRL_OK);
    if (!m || !load_batch(dir, &f) || !load_batch(dir, &g)) return;
    /* g: f's sequences, then a pad segment of 5 tokens */
    for (int i = 0; i < 5; i++) g.tokens[f.b.T + i] = 0, g.positions[f.b.T + i] = i;
    g.cu[f.b.B + 1] = f.b.T + 5;
    g.b.T = f.b.T + 5, g.b.B = f.b.B + 1;
    int32_t at[16];
    for (int s = 0; s < f.b.B; s++)
        at[s] = f.cu[s] + ctrl_model_score_index(m, f.tokens + f.cu[s], f.cu[s + 1] - f.cu[s]);
    float a[16], b[16];
    size_t n;
    ctrl_model_zero_grad(m);
    CHECK_EQ_INT(ctrl_model_score_forward(m, &f.b, a), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_score_backward(m, f.w), CTRL_OK);
    const float *gr = ctrl_model_grads(m, &n);
    float *want = malloc(sizeof(float) * n);
    memcpy(want, gr, sizeof(float) * n);
    ctrl_model_zero_grad(m);
    CHECK_EQ_INT(ctrl_model_score_forward_at(m, &g.b, f.b.B, at, b), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_score_backward_at(m, f.b.B, at, f.w), CTRL_OK);
    CHECK_REL(b, a, f.b.B, 1e-6);
    CHECK_REL(ctrl_model_grads(m, NULL), want, (long)n, 1e-6);
    at[0] = g.b.T; /* outside */
    CHECK_EQ_INT(ctrl_model_score_forward_at(m, &g.b, 1, at, b), CTRL_ERR_RUNTIME);
    free(want);
    ctrl_model_free(m);
}

/* LoRA on a classifier is PEFT's SEQ_CLS task: the score trains beside the adapters (it is laid out
 * among the trainable tensors); lm_head in modules_to_save is refused (a classifier has none). */
TEST(lora_on_a_classifier_trains_the_score) {
    ctrl_model_config cfg;
    CHECK_EQ_INT(ctrl_model_config_load(CTRL_FIXTURE_DIR "/score/llama", &cfg), CTRL_OK);
    ctrl_lora_config lc = {.r = 2, .lora_alpha = 4, .all_linear = 1};
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_create_lora(&cfg, eager(), &lc, &m), CTRL_OK);
    int score = 0;
    for (int i = 0; m && i < ctrl_model_view_count(m); i++) {
        const ctrl_param_view *v = ctrl_model_view(m, i);
        const int trains = v->offset >= ctrl_model_trainable_offset(m);
        score += !strcmp(v->name, "score.weight") && trains;
        CHECK_MSG(trains == (v->lora || !strcmp(v->name, "score.weight")), "%s", v->name);
    }
    CHECK_EQ_INT(score, 1);
    CHECK(m && ctrl_model_lora(m)->seq_cls);
    ctrl_model_free(m);
    m = NULL;
    lc.save_lm_head = 1;
    CHECK_EQ_INT(ctrl_model_create_lora(&cfg, eager(), &lc, &m), CTRL_ERR_CONFIG);
    CHECK_CONTAINS(ctrl_error_message(), "lm_head");
    CHECK(m == NULL);
}
