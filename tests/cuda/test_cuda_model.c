/* The whole model on CUDA against the CPU model (fp32): the transformers fixtures of
 * tests/fixtures/models (Llama, Qwen2, Qwen3, Mistral) on their packed batch, per-token logp and
 * every parameter's gradient; the eager plugin's CUDA path does attention. Skips without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_ops.h"
#include "model/model_cuda.h"
#include "registry.h"
#include "test.h"

static int need_gpu(void) {
    static int state = -1;
    if (state < 0) {
        state = ctrl_cuda_device_count() > 0;
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

TEST(model_forward_backward_matches_cpu) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    ctrl_registry *reg;
    CHECK_EQ_INT(ctrl_registry_create(&reg), CTRL_OK);
    char so[1024];
    snprintf(so, sizeof so, "%s/eager.so", CTRL_PLUGIN_DIR);
    CHECK_MSG(ctrl_registry_load_file(reg, so) == CTRL_OK, "%s", ctrl_error_message());
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "eager");
    if (!e) return;
    static const char *const archs[] = {"llama", "qwen2", "qwen3", "mistral"};
    for (int a = 0; a < 4; a++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/models/%s", CTRL_FIXTURE_DIR, archs[a]);
        ctrl_model *m = NULL;
        CHECK_MSG(ctrl_model_load(dir, e->plugin->ops, &m) == CTRL_OK, "%s", ctrl_error_message());
        if (!m) continue;
        int32_t tok[64], pos[64], tg[64], cu[4];
        int T;
        make_batch(ctrl_model_cfg(m)->vocab_size, tok, pos, tg, cu, &T);
        ctrl_batch b = {.T = T, .B = 3, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
        float lp_cpu[64], lp_gpu[64], dl[64];
        int n_tg = 0;
        for (int t = 0; t < T; t++) n_tg += tg[t] >= 0;
        for (int t = 0; t < T; t++) dl[t] = tg[t] >= 0 ? -1.0f / n_tg : 0.0f;
        CHECK_EQ_INT(ctrl_model_forward(m, &b, lp_cpu, NULL, NULL), CTRL_OK);
        ctrl_model_zero_grad(m);
        CHECK_EQ_INT(ctrl_model_backward(m, dl), CTRL_OK);
        size_t n;
        float *g_cpu = ctrl_model_grads(m, &n), *g_gpu = malloc(n * 4);
        memset(g_gpu, 0xff, n * 4);
        ctrl_model_cuda *dm = NULL;
        CHECK_MSG(ctrl_model_cuda_create(m, e->plugin->ops, &dm) == CTRL_OK, "%s", ctrl_error_message());
        if (dm) {
            memset(lp_gpu, 0xff, sizeof lp_gpu);
            CHECK_MSG(ctrl_model_cuda_forward(dm, &b, lp_gpu, NULL, NULL) == CTRL_OK, "%s: %s", archs[a],
                      ctrl_error_message());
            CHECK_MSG(ctrl_model_cuda_backward(dm, dl) == CTRL_OK, "%s: %s", archs[a], ctrl_error_message());
            CHECK_EQ_INT(ctrl_model_cuda_grads_to_host(dm, g_gpu), CTRL_OK);
            double el = test_rel_error_f32(lp_gpu, lp_cpu, T), worst = 0;
            const char *worst_name = "";
            for (int v = 0; v < ctrl_model_view_count(m); v++) {
                const ctrl_param_view *pv = ctrl_model_view(m, v);
                double ev = test_rel_error_f32(g_gpu + pv->offset, g_cpu + pv->offset, pv->numel);
                if (!(ev <= worst)) worst = ev, worst_name = pv->name;
            }
            CHECK_MSG(el <= 1e-5, "%s: logp relative error %.3g (cuda vs cpu)", archs[a], el);
            CHECK_MSG(worst <= 1e-4, "%s: gradient of %s relative error %.3g (cuda vs cpu)", archs[a],
                      worst_name, worst);
            printf("  %-8s cuda vs cpu: logp rel %.1e, worst grad rel %.1e (%s)\n", archs[a], el, worst,
                   worst_name);
            ctrl_model_cuda_free(dm);
        }
        free(g_gpu);
        ctrl_model_free(m);
    }
    ctrl_registry_destroy(reg);
}
