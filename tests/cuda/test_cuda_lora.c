/* LoRA's dropout on the CUDA backend (issue 18): the mask is drawn on the device, from the same
 * counter-based hash of (seed, step, layer, module, element) as on the host (core/model/lora.c), so
 * the device's masks are the host's bit for bit and nothing makes a host round trip. The backend op
 * (kernels/cuda/lora.cu) against the host's draw: every value equal, in place too, the share dropped
 * within 5 sigma of p and the kept values scaled by 1 / (1 - p); and a LoRA model training with
 * lora_dropout on the device (forward and backward, the fused head) gives the CPU's log-probs and
 * adapter gradients (a different mask would move them by O(1)) with no host staging allocated.
 * Skips without a GPU; test_cuda_lora_emu runs it under the CUDA emulator. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/attention.h>

#include "backend_case.h"
#include "cuda_test.h"
#include "device/backend.h"
#include "device/cuda_backend.h"
#include "model/model_internal.h"
#include "registry/registry.h"
#include "test.h"
#include "test_registry.h"

TEST(lora_dropout_mask_on_the_device_is_the_hosts) {
    const ctrl_backend_ops *be = cuda_test_ops();
    if (!be) TEST_SKIP(ctrl_error_message());
    CHECK(ctrl_backend_has(be, lora_dropout));
    if (!ctrl_backend_has(be, lora_dropout)) return;
    const int64_t n = 100003;
    float *x = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    uint64_t s = 99;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) + (i % 7 == 0 ? 1.0f : 0.0f);
    }
    float *d = NULL, *d2 = NULL;
    CHECK_EQ_INT(be->alloc((void **)&d, sizeof(float) * n), CTRL_OK);
    CHECK_EQ_INT(be->alloc((void **)&d2, sizeof(float) * n), CTRL_OK);
    static const float ps[3] = {0.1f, 0.25f, 0.5f};
    static const uint64_t keys[3] = {1, 0x9E3779B97F4A7C15ull, 0xFFFFFFFFFFFFFFFFull};
    for (int c = 0; c < 3 && d && d2; c++) {
        const float p = ps[c], keep = 1.0f / (1.0f - p);
        lora_dropout_host(want, x, n, keys[c], p, keep);
        CHECK_EQ_INT(be->to_device(d, x, sizeof(float) * n), CTRL_OK);
        CHECK_EQ_INT(be->lora_dropout(d2, d, n, keys[c], p, keep), CTRL_OK); /* out of place */
        CHECK_EQ_INT(be->to_host(got, d2, sizeof(float) * n), CTRL_OK);
        CHECK_MSG(!memcmp(got, want, sizeof(float) * n), "p %g: the device's mask differs from the host's",
                  p);
        CHECK_EQ_INT(be->lora_dropout(d, d, n, keys[c], p, keep), CTRL_OK); /* in place */
        CHECK_EQ_INT(be->to_host(got, d, sizeof(float) * n), CTRL_OK);
        CHECK(!memcmp(got, want, sizeof(float) * n));
        int64_t dropped = 0, bad = 0;
        for (int64_t i = 0; i < n; i++) {
            dropped += got[i] == 0.0f && x[i] != 0.0f;
            bad += got[i] != 0.0f && got[i] != x[i] * keep;
        }
        const double share = (double)dropped / n, sigma = sqrt(p * (1.0 - p) / n);
        CHECK_MSG(fabs(share - p) <= 5 * sigma, "p %g: %.4f dropped", p, share);
        CHECK_EQ_INT(bad, 0);
        printf("  p %.2f: %lld of %lld dropped (%.4f), the host's mask bit for bit\n", p, (long long)dropped,
               (long long)n, share);
    }
    be->free(d), be->free(d2);
    free(x), free(want), free(got);
}

/* A LoRA model (all-linear, dropout 0.3) training on the device: the CPU's log-probs and gradients,
 * and no host staging for the masks (m->lora_host never allocated). */
/* modules_to_save with the adapters off on the device: the base's tables swapped in there (PEFT's
 * disable_adapter()), the trained ones back when the adapters are (backend_case.c). */
TEST(modules_to_save_off_on_the_device_is_the_base) {
    const ctrl_backend_ops *be = cuda_test_ops();
    if (!be) TEST_SKIP(ctrl_error_message());
    backend_saved_off_check(be, (ctrl_device){CTRL_DEVICE_CUDA, 0}, "llama_all_rslora", "llama",
                            "lm_head.weight");
    backend_saved_off_check(be, (ctrl_device){CTRL_DEVICE_CUDA, 0}, "qwen2_tied_saved_ewt", "qwen2",
                            "model.embed_tokens.weight");
}

TEST(lora_dropout_trains_on_the_device_without_a_host_round_trip) {
    const ctrl_backend_ops *be = cuda_test_ops();
    if (!be) TEST_SKIP(ctrl_error_message());
    backend_lora_check(be, (ctrl_device){CTRL_DEVICE_CUDA, 0}, "qwen2", 1e-5); /* dropout 0.2 inside */
    backend_lora_check(be, (ctrl_device){CTRL_DEVICE_CUDA, 0}, "families/phi3_gqa",
                       1e-5); /* fused: one mask */
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "eager");
    static ctrl_lora_config lc;
    memset(&lc, 0, sizeof lc);
    lc.r = 4, lc.lora_alpha = 8, lc.lora_dropout = 0.3f, lc.init = CTRL_LORA_INIT_NONE, lc.seed = 7;
    CHECK_EQ_INT(ctrl_lora_add_target(&lc, "all-linear", "test"), CTRL_OK);
    ctrl_model *m = NULL;
    CHECK_EQ_INT(
        ctrl_model_load_lora(CTRL_FIXTURE_DIR "/models/qwen2", attn ? attn->plugin->ops : NULL, &lc, &m),
        CTRL_OK);
    if (m) CHECK_EQ_INT(ctrl_model_to_device(m, be, (ctrl_device){CTRL_DEVICE_CUDA, 0}), CTRL_OK);
    int32_t tokens[12], pos[12], tg[12], cu[2] = {0, 12};
    for (int i = 0; i < 12; i++)
        tokens[i] = (i * 37 + 5) % 100, pos[i] = i, tg[i] = i < 11 ? (i * 37 + 42) % 100 : -100;
    const ctrl_batch b = {
        .T = 12, .B = 1, .tokens = tokens, .positions = pos, .cu_seqlens = cu, .targets = tg};
    float logp[12], dlogp[12];
    for (int i = 0; i < 12; i++) dlogp[i] = tg[i] >= 0 ? -1.0f / 11 : 0.0f;
    if (m) {
        ctrl_model_set_training(m, 1, 3);
        CHECK_EQ_INT(ctrl_model_zero_grad(m), CTRL_OK);
        CHECK_EQ_INT(ctrl_model_forward(m, &b, logp, NULL, NULL), CTRL_OK);
        CHECK_EQ_INT(ctrl_model_backward(m, dlogp), CTRL_OK);
        CHECK_MSG(m->lora_host == NULL, "the dropout masks made a host round trip");
    }
    ctrl_model_free(m);
    ctrl_registry_destroy(reg);
}
