/* The whole model on the CUDA backend against the CPU backend (fp32): the transformers fixtures of
 * tests/fixtures/models (Llama, Qwen2, Qwen3, Mistral) on their packed batch, one model placed on
 * the device with ctrl_model_to_device (the same model code, the CUDA backend ops table), per-token
 * logp and every parameter's gradient; the eager plugin's CUDA path does attention. A second case
 * runs what only the CPU model had before the model was written once: a temperature, the fused
 * head (SFT's step) and activation checkpointing. Skips without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_ops.h"
#include "device/cuda_backend.h"
#include "model/model.h"
#include "config_load.h"
#include "registry.h"
#include "test.h"
#include "test_registry.h"

static int need_gpu(void) {
    static int state = -1;
    if (state < 0) {
        state = ctrl_cuda_device_count() > 0 && ctrl_cuda_backend_ops() != NULL;
        if (state) atexit(ctrl_cuda_shutdown);
    }
    return state;
}

/* A packed batch of three sequences from the model's vocabulary (deterministic). */
static void make_batch(int V, int32_t *tok, int32_t *pos, int32_t *tg, int32_t *cu, int *T) {
    static const int lens[3] = {9, 17, 6};
    int t = 0;
    cu[0] = 0;
    unsigned s = 7;
    for (int b = 0; b < 3; b++) {
        for (int i = 0; i < lens[b]; i++, t++) {
            s = s * 1103515245u + 12345u;
            tok[t] = (int32_t)((s >> 8) % (unsigned)V);
            pos[t] = i;
        }
        cu[b + 1] = t;
    }
    for (int b = 0; b < 3; b++)
        for (int k = cu[b]; k < cu[b + 1]; k++) tg[k] = k + 1 < cu[b + 1] ? tok[k + 1] : -100;
    *T = t;
}

typedef struct result {
    float lp[64];
    float *grads;
    size_t n;
} result;

/* One step on a freshly loaded model, on the CPU (cuda = 0) or the GPU: a plain forward and
 * backward, or (variant 1) temperature 0.8, the fused forward and checkpointing. */
static int step(const char *dir, const ctrl_plugin_entry *attn, int cuda, int variant, result *r) {
    ctrl_model *m = NULL;
    CHECK_MSG(ctrl_model_load(dir, attn->plugin->ops, &m) == CTRL_OK, "%s", ctrl_error_message());
    if (!m) return 0;
    ctrl_memory *mem = NULL;
    const ctrl_memory_ops *mops = NULL;
    ctrl_registry *reg = NULL;
    if (variant == 1) { /* every layer recomputed */
        reg = test_plugin_registry();
        const ctrl_plugin_entry *ck = ctrl_registry_find(reg, CTRL_KIND_MEMORY, "checkpointing");
        char ini[1200];
        snprintf(ini, sizeof ini, "[model]\npath = %s\n[checkpointing]\nevery = 1\n", dir);
        ctrl_config *cfg = ck ? test_config_from_text(reg, "checkpointing.ini", ini) : NULL;
        CHECK(cfg != NULL);
        if (cfg && (mops = ck->plugin->ops)->create(ctrl_host_table(), cfg, 2, &mem) == CTRL_OK)
            ctrl_model_set_memory(m, mops, mem);
        ctrl_config_free(cfg);
        ctrl_model_set_temperature(m, 0.8f);
    }
    int ok = !cuda ||
             ctrl_model_to_device(m, ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}) == CTRL_OK;
    CHECK_MSG(ok, "%s: %s", dir, ctrl_error_message());
    int32_t tok[64], pos[64], tg[64], cu[4];
    int T;
    make_batch(ctrl_model_cfg(m)->vocab_size, tok, pos, tg, cu, &T);
    ctrl_batch b = {.T = T, .B = 3, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
    float dl[64];
    int n_tg = 0;
    for (int t = 0; t < T; t++) n_tg += tg[t] >= 0;
    for (int t = 0; t < T; t++) dl[t] = tg[t] >= 0 ? -1.0f / n_tg : 0.0f;
    memset(r->lp, 0xff, sizeof r->lp);
    ok = ok && ctrl_model_zero_grad(m) == CTRL_OK;
    if (ok && variant == 0)
        ok = ctrl_model_forward(m, &b, r->lp, NULL, NULL) == CTRL_OK && ctrl_model_backward(m, dl) == CTRL_OK;
    else if (ok)
        ok = ctrl_model_forward_fused(m, &b, dl, r->lp, NULL, NULL) == CTRL_OK &&
             ctrl_model_backward(m, NULL) == CTRL_OK;
    ok = ok && ctrl_model_grads_to_host(m) == CTRL_OK;
    CHECK_MSG(ok, "%s (%s): %s", dir, cuda ? "cuda" : "cpu", ctrl_error_message());
    float *g = ctrl_model_grads(m, &r->n);
    r->grads = malloc(r->n * 4);
    memcpy(r->grads, g, r->n * 4);
    ctrl_model_free(m);
    if (mem) mops->destroy(mem);
    ctrl_registry_destroy(reg);
    return ok ? T : 0;
}

static void compare(int variant) {
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "eager");
    CHECK(e != NULL);
    if (!e) return;
    static const char *const archs[] = {"llama", "qwen2", "qwen3", "mistral"};
    for (int a = 0; a < 4; a++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/models/%s", CTRL_FIXTURE_DIR, archs[a]);
        result cpu = {0}, gpu = {0};
        const int T = step(dir, e, 0, variant, &cpu);
        if (T && step(dir, e, 1, variant, &gpu)) {
            double el = test_rel_error_f32(gpu.lp, cpu.lp, T), worst = 0;
            const char *worst_name = "";
            ctrl_model *m = NULL;
            ctrl_model_load(dir, NULL, &m);
            for (int v = 0; m && v < ctrl_model_view_count(m); v++) {
                const ctrl_param_view *pv = ctrl_model_view(m, v);
                double ev = test_rel_error_f32(gpu.grads + pv->offset, cpu.grads + pv->offset, pv->numel);
                if (!(ev <= worst)) worst = ev, worst_name = pv->name;
            }
            ctrl_model_free(m);
            CHECK_MSG(el <= 1e-5, "%s: logp relative error %.3g (cuda vs cpu)", archs[a], el);
            CHECK_MSG(worst <= 1e-4, "%s: gradient of %s relative error %.3g (cuda vs cpu)", archs[a],
                      worst_name, worst);
            printf("  %-8s cuda vs cpu%s: logp rel %.1e, worst grad rel %.1e (%s)\n", archs[a],
                   variant ? " (temperature, fused head, checkpointing)" : "", el, worst, worst_name);
        }
        free(cpu.grads), free(gpu.grads);
    }
    ctrl_registry_destroy(reg);
}

TEST(model_forward_backward_matches_cpu) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    compare(0);
}

TEST(model_temperature_fused_checkpointing_match_cpu) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    compare(1);
}
