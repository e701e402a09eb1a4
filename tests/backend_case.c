/* See backend_case.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_case.h"
#include "config/config_load.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/peft.h"
#include "test.h"
#include "test_registry.h"
#include "random_batch.h"

enum { CASE_T = 57 };

/* Three packed sequences from the model's vocabulary. */
static void make_batch(ctrl_batch *b, int vocab) {
    static int32_t tok[CASE_T], pos[CASE_T], tg[CASE_T], cu[4] = {0, 20, 37, CASE_T};
    random_batch(b, tok, pos, tg, cu, 3, 777, vocab);
}

typedef struct outputs {
    float logp[3][CASE_T], ent[CASE_T], *grads;
    int32_t correct[CASE_T];
    size_t n;
} outputs;

static int run(ctrl_model *m, outputs *o) {
    ctrl_batch b;
    make_batch(&b, ctrl_model_cfg(m)->vocab_size);
    float dlogp[CASE_T];
    for (int t = 0; t < CASE_T; t++) dlogp[t] = b.targets[t] >= 0 ? -1.0f / 50 : 0.0f;
    memset(o->logp, 0xff, sizeof o->logp);
    int ok = ctrl_model_zero_grad(m) == CTRL_OK &&
             ctrl_model_forward(m, &b, o->logp[0], o->ent, o->correct) == CTRL_OK &&
             ctrl_model_backward(m, dlogp) == CTRL_OK;
    size_t n;
    float *p = ctrl_model_params(m, &n);
    for (size_t i = 0; i < n; i += 7) p[i] *= 0.99f;
    ctrl_model_weights_changed(m);
    ok = ok && ctrl_model_forward(m, &b, o->logp[1], NULL, NULL) == CTRL_OK &&
         ctrl_model_backward(m, dlogp) == CTRL_OK;
    ctrl_model_set_temperature(m, 0.7f);
    ok = ok && ctrl_model_forward_fused(m, &b, dlogp, o->logp[2], NULL, NULL) == CTRL_OK &&
         ctrl_model_backward(m, NULL) == CTRL_OK && ctrl_model_grads_to_host(m) == CTRL_OK;
    CHECK_MSG(ok, "%s", ctrl_error_message());
    float *g = ctrl_model_grads(m, &o->n);
    if ((o->grads = malloc(sizeof(float) * o->n))) memcpy(o->grads, g, sizeof(float) * o->n);
    return ok && o->grads;
}

static int same(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

int backend_case_bf16;

void backend_case_check(const ctrl_backend_ops *be, ctrl_device device, const char *arch,
                        const char *attention, int checkpointing, double tol_logp, double tol_grad) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", CTRL_FIXTURE_DIR, arch);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, attention);
    const ctrl_plugin_entry *ckpt = ctrl_registry_find(reg, CTRL_KIND_MEMORY, "checkpointing");
    CHECK(attn && ckpt);
    ctrl_memory *mem = NULL;
    const ctrl_memory_ops *mops = ckpt ? ckpt->plugin->ops : NULL;
    if (attn && mops && checkpointing) { /* every layer recomputed */
        char ini[1200];
        snprintf(ini, sizeof ini, "[model]\npath = %s\n[checkpointing]\nevery = 1\n", dir);
        ctrl_config *cfg = test_config_from_text(reg, "checkpointing.ini", ini);
        CHECK(cfg && mops->create(ctrl_host_table(), cfg, 2, &mem) == CTRL_OK);
        ctrl_config_free(cfg);
    }
    outputs ref = {0}, dev = {0};
    int ok = attn != NULL;
    for (int side = 0; ok && side < 2; side++) {
        ctrl_model *m = NULL;
        ok = ctrl_model_load(dir, attn->plugin->ops, &m) == CTRL_OK;
        CHECK_MSG(ok, "%s: %s", dir, ctrl_error_message());
        if (ok && mem) CHECK_EQ_INT(ctrl_model_set_memory(m, mops, mem), CTRL_OK);
        if (ok && side == 1) {
            ok = ctrl_model_to_device(m, be, device) == CTRL_OK;
            CHECK_MSG(ok, "%s onto %s: %s", arch, be->name, ctrl_error_message());
        }
        if (ok && backend_case_bf16) { /* both sides in bf16 compute */
            ok = ctrl_model_set_compute_dtype(m, CTRL_BF16) == CTRL_OK;
            CHECK_MSG(ok, "%s in bf16 on %s: %s", arch, side ? be->name : "cpu", ctrl_error_message());
        }
        ok = ok && run(m, side ? &dev : &ref);
        ctrl_model_free(m);
    }
    if (ok) {
        const char *what = be->name;
        double el = 0, ee = test_rel_error_f32(dev.ent, ref.ent, CASE_T), worst = -1;
        for (int i = 0; i < 3; i++) {
            double e = test_rel_error_f32(dev.logp[i], ref.logp[i], CASE_T);
            el = e > el || e != e ? e : el;
        }
        char worst_name[96] = "";
        ctrl_model *shape = NULL;
        ctrl_model_load(dir, NULL, &shape);
        for (int v = 0; shape && v < ctrl_model_view_count(shape); v++) {
            const ctrl_param_view *pv = ctrl_model_view(shape, v);
            double e = test_rel_error_f32(dev.grads + pv->offset, ref.grads + pv->offset, pv->numel);
            if (!(e <= worst)) worst = e, snprintf(worst_name, sizeof worst_name, "%s", pv->name);
        }
        ctrl_model_free(shape);
        worst = worst < 0 ? 0 : worst;
        if (tol_logp == 0) {
            CHECK_MSG(same(dev.logp, ref.logp, sizeof ref.logp), "%s/%s on %s: log-probs differ", arch,
                      attention, what);
            CHECK_MSG(same(dev.ent, ref.ent, sizeof ref.ent), "%s on %s: entropies differ", arch, what);
            CHECK_MSG(same(dev.correct, ref.correct, sizeof ref.correct), "%s on %s: accuracy flags differ",
                      arch, what);
        } else {
            CHECK_MSG(el <= tol_logp && ee <= tol_logp, "%s/%s on %s: log-prob rel error %.3g, entropy %.3g",
                      arch, attention, what, el, ee);
        }
        if (tol_grad == 0)
            CHECK_MSG(ref.n == dev.n && same(dev.grads, ref.grads, sizeof(float) * ref.n),
                      "%s/%s on %s: gradients differ", arch, attention, what);
        else
            CHECK_MSG(worst <= tol_grad, "%s/%s on %s: gradient of %s rel error %.3g", arch, attention, what,
                      worst_name, worst);
        /* the nudged parameters and the temperature did change the log-probs */
        CHECK(!same(ref.logp[0], ref.logp[1], sizeof ref.logp[0]));
        CHECK(!same(ref.logp[1], ref.logp[2], sizeof ref.logp[1]));
        printf("  %-8s %-6s %s%s vs cpu: logp rel %.1e, entropy %.1e, worst grad rel %.1e (%s)\n", arch,
               attention, what, checkpointing ? " (checkpointing)" : "", el, ee, worst, worst_name);
    }
    free(ref.grads), free(dev.grads);
    if (mem) mops->destroy(mem);
    ctrl_registry_destroy(reg);
}

/* The score head (sequence classification) on `be` against the CPU: tests/fixtures/score/ARCH's
 * classifier scores a packed batch (one sequence ending in pad tokens) and takes dL/dscores back. */
void backend_score_check(const ctrl_backend_ops *be, ctrl_device device, const char *arch, double tol) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/score/%s", CTRL_FIXTURE_DIR, arch);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "eager");
    CHECK(attn != NULL);
    ctrl_batch b;
    make_batch(&b, 100);
    ((int32_t *)b.tokens)[CASE_T - 1] = ((int32_t *)b.tokens)[CASE_T - 2] = 0; /* the pad token, twice */
    const float dscores[3] = {0.7f, -1.3f, 0.4f};
    float scores[2][3], *grads[2] = {NULL, NULL};
    size_t n = 0;
    for (int side = 0; attn && side < 2; side++) {
        ctrl_model *m = NULL;
        int ok = ctrl_model_load(dir, attn->plugin->ops, &m) == CTRL_OK;
        if (ok && side == 1) ok = ctrl_model_to_device(m, be, device) == CTRL_OK;
        ok = ok && ctrl_model_zero_grad(m) == CTRL_OK &&
             ctrl_model_score_forward(m, &b, scores[side]) == CTRL_OK &&
             ctrl_model_score_backward(m, dscores) == CTRL_OK && ctrl_model_grads_to_host(m) == CTRL_OK;
        CHECK_MSG(ok, "%s score on %s: %s", arch, side ? be->name : "cpu", ctrl_error_message());
        const float *g = ok ? ctrl_model_grads(m, &n) : NULL;
        if (g && (grads[side] = malloc(sizeof(float) * n))) memcpy(grads[side], g, sizeof(float) * n);
        ctrl_model_free(m);
    }
    if (grads[0] && grads[1]) {
        const double es = test_rel_error_f32(scores[1], scores[0], 3),
                     eg = test_rel_error_f32(grads[1], grads[0], (long)n);
        if (tol == 0)
            CHECK_MSG(same(scores[1], scores[0], sizeof scores[0]) &&
                          same(grads[1], grads[0], sizeof(float) * n),
                      "%s score on %s: differs from the cpu", arch, be->name);
        else
            CHECK_MSG(es <= tol && eg <= tol, "%s score on %s: scores rel %.3g, gradients rel %.3g", arch,
                      be->name, es, eg);
        printf("  %-8s score on %s vs cpu: scores rel %.1e, gradients rel %.1e\n", arch, be->name, es, eg);
    }
    free(grads[0]), free(grads[1]);
    ctrl_registry_destroy(reg);
}

/* LoRA on `be` against the CPU: tests/fixtures/models/ARCH under adapters on every linear layer
 * (init false: B != 0), dropout 0.2 in training mode, modules_to_save lm_head where the head is
 * untied (with DoRA rows of that head trained instead: trainable tokens), trainable_token_indices (rows
 * of the embedding, and of a head tied to it: the device's table written, its lookup's and head's
 * gradients of those rows); a forward and backward, the adapters nudged,
 * a fused forward and backward; log-probs and
 * every trainable tensor's gradient within `tol` (0: bit-identical). The base has no gradients
 * (the backend's kernels skip NULL parameter gradients). */
static void lora_check(const ctrl_backend_ops *be, ctrl_device device, const char *arch, double tol, int dora,
                       int nf4) {
    const char *kind = nf4 ? (dora ? "QDoRA" : "QLoRA") : dora ? "DoRA" : "LoRA";
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s%s", CTRL_FIXTURE_DIR, strchr(arch, '/') ? "" : "models/", arch);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "eager");
    CHECK(attn != NULL);
    static ctrl_lora_config lc;
    memset(&lc, 0, sizeof lc);
    /* an MoE model (families/qwen3_moe_*): q_proj and the experts (target_parameters, no dropout) */
    const int experts = strstr(arch, "moe") != NULL;
    lc.r = 4, lc.lora_alpha = 8, lc.lora_dropout = experts ? 0.0f : 0.2f, lc.init = CTRL_LORA_INIT_NONE,
    lc.seed = 5;
    lc.use_dora = dora, lc.nf4 = nf4;
    CHECK_EQ_INT(ctrl_lora_add_target(&lc, experts ? "q_proj" : "all-linear", "test"), CTRL_OK);
    if (experts) {
        CHECK_EQ_INT(ctrl_lora_add_parameter(&lc, "experts.gate_up_proj", "test"), CTRL_OK);
        CHECK_EQ_INT(ctrl_lora_add_parameter(&lc, "experts.down_proj", "test"), CTRL_OK);
    } else { /* modules of their own rank and alpha (rank_pattern, alpha_pattern); lora_bias without DoRA */
        lc.lora_bias = !dora;
        CHECK_EQ_INT(ctrl_lora_add_rank_pattern(&lc, "q_proj|qkv_proj", 2, "test"), CTRL_OK);
        CHECK_EQ_INT(ctrl_lora_add_rank_pattern(&lc, "layers\\.1\\.mlp\\.down_proj", 6, "test"), CTRL_OK);
        CHECK_EQ_INT(ctrl_lora_add_alpha_pattern(&lc, "v_proj|gate_up_proj", 3, "test"), CTRL_OK);
    }
    ctrl_model_config mc;
    CHECK_EQ_INT(ctrl_model_config_load(dir, &mc), CTRL_OK);
    static const int rows[] = {5, 17, 42, 61}; /* make_batch draws below min(vocab, 100) */
    for (int k = 0; !experts && k < 4; k++)
        if (rows[k] < mc.vocab_size) CHECK_EQ_INT(ctrl_lora_add_token(&lc, rows[k], "test"), CTRL_OK);
    ctrl_batch b;
    make_batch(&b, mc.vocab_size < 100 ? mc.vocab_size : 100);
    float dlogp[CASE_T], logp[2][2][CASE_T], *grads[2] = {NULL, NULL};
    for (int t = 0; t < CASE_T; t++) dlogp[t] = b.targets[t] >= 0 ? -1.0f / 50 : 0.0f;
    size_t n = 0;
    for (int side = 0; attn && side < 2; side++) {
        ctrl_model *m = NULL;
        lc.save_lm_head = 0;
        int ok = ctrl_model_load_lora(dir, attn->plugin->ops, &lc, &m) == CTRL_OK;
        if (ok && !ctrl_model_cfg(m)->tie_word_embeddings) { /* once more, with the head trained in full */
            ctrl_model_free(m);
            lc.save_lm_head = !dora; /* (with DoRA: rows of the head trained instead, trainable tokens) */
            lc.n_head_tokens = 0;
            for (int k = 0; dora && !experts && k < 4; k++)
                if (rows[3 - k] < mc.vocab_size)
                    CHECK_EQ_INT(ctrl_lora_add_head_token(&lc, rows[3 - k], "test"), CTRL_OK);
            ok = ctrl_model_load_lora(dir, attn->plugin->ops, &lc, &m) == CTRL_OK;
        }
        if (ok && side == 1) ok = ctrl_model_to_device(m, be, device) == CTRL_OK;
        if (ok) ctrl_model_set_training(m, 1, 9);
        ok = ok && ctrl_model_zero_grad(m) == CTRL_OK &&
             ctrl_model_forward(m, &b, logp[side][0], NULL, NULL) == CTRL_OK &&
             ctrl_model_backward(m, dlogp) == CTRL_OK;
        size_t all;
        float *p = ctrl_model_params(m, &all);
        for (size_t i = ctrl_model_trainable_offset(m); i < all; i += 5) p[i] *= 0.9f;
        ctrl_model_weights_changed(m);
        ok = ok && ctrl_model_forward_fused(m, &b, dlogp, logp[side][1], NULL, NULL) == CTRL_OK &&
             ctrl_model_backward(m, NULL) == CTRL_OK && ctrl_model_grads_to_host(m) == CTRL_OK;
        CHECK_MSG(ok, "%s %s on %s: %s", arch, kind, side ? be->name : "cpu", ctrl_error_message());
        const float *g = ok ? ctrl_model_grads(m, &n) : NULL;
        if (g && (grads[side] = malloc(sizeof(float) * n))) memcpy(grads[side], g, sizeof(float) * n);
        ctrl_model_free(m);
    }
    if (grads[0] && grads[1]) {
        const double el = test_rel_error_f32(logp[1][0], logp[0][0], 2 * CASE_T),
                     eg = test_rel_error_f32(grads[1], grads[0], (long)n);
        if (tol == 0)
            CHECK_MSG(same(logp[1], logp[0], sizeof logp[0]) && same(grads[1], grads[0], sizeof(float) * n),
                      "%s %s on %s: differs from the cpu", arch, kind, be->name);
        else
            CHECK_MSG(el <= tol && eg <= tol, "%s %s on %s: log-probs rel %.3g, gradients rel %.3g", arch,
                      kind, be->name, el, eg);
        CHECK(!same(logp[0][0], logp[0][1], sizeof logp[0][0])); /* the nudge changed something */
        printf(
            "  %-8s %s (dropout %.1f) on %s vs cpu: log-probs rel %.1e, %zu trainable gradients rel %.1e\n",
            arch, kind, (double)lc.lora_dropout, be->name, el, n, eg);
    }
    free(grads[0]), free(grads[1]);
    ctrl_registry_destroy(reg);
}

void backend_saved_off_check(const ctrl_backend_ops *be, ctrl_device device, const char *adapter,
                             const char *arch, const char *view) {
    char a[512], base[512];
    snprintf(a, sizeof a, "%s/lora/%s", CTRL_FIXTURE_DIR, adapter);
    snprintf(base, sizeof base, "%s/models/%s", CTRL_FIXTURE_DIR, arch);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "eager");
    ctrl_model *m = NULL, *b = NULL;
    CHECK_EQ_INT(ctrl_peft_load(base, a, attn ? attn->plugin->ops : NULL, &m), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_load(base, attn ? attn->plugin->ops : NULL, &b), CTRL_OK);
    const ctrl_param_view *v = m ? ctrl_model_find_view(m, view) : NULL;
    CHECK(v && v->offset >= ctrl_model_trainable_offset(m));
    if (v && b) {
        float *p = ctrl_model_params(m, NULL);
        for (int64_t i = 0; i < v->numel; i++) p[v->offset + i] *= 1.3f; /* trained away from the base */
        ctrl_model_weights_changed(m);
        float *want = malloc(sizeof(float) * (size_t)v->numel);
        memcpy(want, p + v->offset, sizeof(float) * (size_t)v->numel);
        if (be) CHECK_EQ_INT(ctrl_model_to_device(m, be, device), CTRL_OK);
        if (be) CHECK_EQ_INT(ctrl_model_to_device(b, be, device), CTRL_OK);
        ctrl_batch bt;
        make_batch(&bt, ctrl_model_cfg(m)->vocab_size < 100 ? ctrl_model_cfg(m)->vocab_size : 100);
        static float on[CASE_T], off[CASE_T], again[CASE_T], plain[CASE_T];
        CHECK_EQ_INT(ctrl_model_forward(m, &bt, on, NULL, NULL), CTRL_OK);
        ctrl_model_set_adapters_enabled(m, 0);
        CHECK_EQ_INT(ctrl_model_forward(m, &bt, off, NULL, NULL), CTRL_OK);
        CHECK_EQ_INT(ctrl_model_forward(b, &bt, plain, NULL, NULL), CTRL_OK);
        CHECK_MSG(same(off, plain, sizeof off), "%s: adapters off: not the base's log-probs (rel %.3g)",
                  adapter, test_rel_error_f32(off, plain, CASE_T));
        ctrl_model_set_adapters_enabled(m, 1); /* the trained table back at once: a save reads it */
        const float *now = ctrl_model_params(m, NULL);
        CHECK_MSG(!memcmp(now + v->offset, want, sizeof(float) * (size_t)v->numel),
                  "%s: the trained %s not back with the adapters", adapter, view);
        CHECK_EQ_INT(ctrl_model_forward(m, &bt, again, NULL, NULL), CTRL_OK);
        CHECK_MSG(same(on, again, sizeof on), "%s: adapters on again: not the adapter's log-probs", adapter);
        CHECK(!same(on, off, sizeof on));
        printf("  %-22s %s on %s: adapters off = the base bit for bit, on again = the adapter\n", adapter,
               view, be ? be->name : "cpu");
        free(want);
    }
    ctrl_model_free(m), ctrl_model_free(b);
    ctrl_registry_destroy(reg);
}

/* LoRA, then DoRA (its per-row norms and scalings by the backend's dora ops: on a device, on it). */
void backend_lora_check(const ctrl_backend_ops *be, ctrl_device device, const char *arch, double tol) {
    lora_check(be, device, arch, tol, 0, 0);
    if (!strstr(arch, "moe")) lora_check(be, device, arch, tol, 1, 0); /* no DoRA on experts (as PEFT) */
}

void backend_qlora_check(const ctrl_backend_ops *be, ctrl_device device, const char *arch, double tol) {
    lora_check(be, device, arch, tol, 0, 1);
}

void backend_qdora_check(const ctrl_backend_ops *be, ctrl_device device, const char *arch, double tol) {
    lora_check(be, device, arch, tol, 1, 1);
}
