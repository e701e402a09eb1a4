/* The whole model on the CUDA backend against the CPU backend (fp32), through backend_case.c: the
 * transformers fixtures of tests/fixtures/models (Llama, Qwen2, Qwen3, Mistral), one copy placed on
 * the device with ctrl_model_to_device (the same model code, the CUDA backend ops table), a plain
 * step, a step after a weight change, and a fused step at temperature 0.7 (what only the CPU model
 * had before the model was written once), with and without checkpointing; log-probs and entropies
 * within 1e-5 relative, every parameter's gradient within 1e-4. The eager plugin's CUDA path does
 * attention. bf16: both models with bf16 compute (the CUDA backend's cuBLASLt bf16 GEMMs against
 * the CPU's bf16 linear: the same bf16 products summed in another order, so an activation a few
 * ulps apart can round to the neighbouring bf16 value): log-probs within 2e-4, gradients within
 * 3e-3 (measured under the emulator: at most 7e-5 and 1.1e-3; fp32 on the device against bf16 on
 * the CPU is 7e-4..1e-3 and 9e-3..1.4e-2, so the check tells them apart). The model families' fixtures
 * (`families` below) run through the same cases. Skips without a GPU. */
#include <stdlib.h>
#include <string.h>

#include "backend_case.h"
#include "cuda_test.h"
#include "cuda/cuda_ops.h"
#include "device/cuda_backend.h"
#include "cpu/cpu_ops.h"
#include "test.h"

/* The model families (issue 22, tests/fixtures/families: transformers-made tiny models): Llama 3.2's
 * rope scaling; Gemma 3's (1 + w) norms, GeGLU, sandwich norms, per-layer windows and RoPE bases, and
 * final-logit soft-capping in gemma3_mha and the Gemma 2s (the head's on the device), Gemma 2's
 * attention logit soft-capping in gemma2_gqa (the eager plugin's CUDA path); Phi-3's fused
 * projections, partial rotary and longrope; the mixture-of-experts layers of Qwen3-MoE (two shapes),
 * Mixtral and OLMoE (routing on the host, the row gather / scatter and the experts' GEMMs on the
 * device). */
static const char *const families[] = {
    "../families/llama32",     "../families/gemma3_gqa", "../families/gemma3_mha", "../families/gemma2_mha",
    "../families/gemma2_gqa",  "../families/phi3_gqa",   "../families/phi3_mha",   "../families/qwen3_moe_a",
    "../families/qwen3_moe_b", "../families/mixtral",    "../families/olmoe"};

static void compare(int checkpointing, double tol_logp, double tol_grad) {
    static const char *const archs[] = {"llama", "qwen2", "qwen3", "mistral"};
    for (int a = 0; a < 4; a++)
        backend_case_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, archs[a], "eager",
                           checkpointing, tol_logp, tol_grad);
    /* with checkpointing (the emulated runtime kept small): the families whose layers keep activations
     * of their own (the sandwich norms' and the experts' buffers, refilled by the recompute) */
    for (size_t a = 0; a < sizeof families / sizeof families[0]; a++)
        if (!checkpointing || strstr(families[a], "gemma3_gqa") || strstr(families[a], "qwen3_moe_b") ||
            strstr(families[a], "mixtral"))
            backend_case_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, families[a],
                               "eager", checkpointing, tol_logp, tol_grad);
}

TEST(model_matches_cpu) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    compare(0, 1e-5, 1e-4);
}

TEST(model_with_checkpointing_matches_cpu) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    compare(1, 1e-5, 1e-4);
}

/* Gemma 2 through the flash plugin (its attention logit soft-capping on the CUDA paths, forward and
 * backward) against the CPU's flash, as the eager cases above. */
TEST(gemma2_flash_matches_cpu) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    backend_case_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, "../families/gemma2_gqa",
                       "flash", 0, 1e-5, 1e-4);
    backend_case_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, "../families/gemma2_mha",
                       "flash", 1, 1e-5, 1e-4);
}

/* The sequence-classification head (reward models) through the same ops table. */
TEST(lora_matches_cpu) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    backend_lora_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, "llama", 1e-5);
    backend_lora_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, "qwen2", 1e-5);
    /* Phi-3's fused qkv_proj / gate_up_proj (all-linear), and the experts of an MoE (target_parameters) */
    backend_lora_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, "families/phi3_mha",
                       1e-5);
    backend_lora_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, "families/qwen3_moe_a",
                       1e-5);
}

TEST(score_head_matches_cpu) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    backend_score_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, "qwen2", 1e-5);
    backend_score_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, "llama", 1e-5);
}

TEST(model_bf16_matches_cpu_bf16) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    /* CUDA runs every linear layer and the LM head on bf16 operands; the CPU does the same where it has
     * AVX-512 BF16 (its head stays fp32 elsewhere: tests/kernels/test_gemm_bf16.c head_in_bf16) */
    if (!ctrl_cpu_has_avx512bf16() || getenv("CTRL_NO_AVX512BF16"))
        TEST_SKIP("the CPU reference computes the LM head in bf16 only with AVX-512 BF16");
    backend_case_bf16 = 1;
    compare(0, 2e-4, 3e-3);
    backend_case_bf16 = 0;
}

#ifdef CTRL_CUDA_EMU
#include <cuda_runtime.h> /* the emulator's counters (ctrl_emu_launches, ctrl_emu_matmuls) */

#include "config/config_load.h"
#include "model/model.h"
#include "random_batch.h"
#include "test_registry.h"

enum { B16_T = 57 };

/* A checkpointed bf16 training step of the qwen2 fixture on the device (the weights changed before
 * it, as after an optimizer step): its log-probs and gradients, and what the device was asked to do
 * -- the fp32 -> bf16 conversion launches (f32_to_bf16 and round_bf16 kernels), all launches, and the
 * GEMMs on bf16 and on fp32 operands. */
typedef struct b16_step {
    float logp[B16_T];
    float *grads;
    size_t n;
    long convs, launches, mm_bf16, mm_f32;
} b16_step;

static int bf16_step_keep(int per_product, int tune, int keep_mlp, b16_step *o) {
    if (per_product) setenv("CTRL_NO_BF16_OPERANDS", "1", 1);
    if (tune) setenv("CTRL_CUDA_GEMM_TUNE", "1", 1);
    ctrl_cuda_gemm_forget_algorithms(); /* the GEMM problems chosen afresh (tune) */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/qwen2", CTRL_FIXTURE_DIR);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "eager");
    const ctrl_plugin_entry *ckpt = ctrl_registry_find(reg, CTRL_KIND_MEMORY, "checkpointing");
    ctrl_memory *mem = NULL;
    ctrl_model *m = NULL;
    int ok = attn && ckpt;
    CHECK(ok);
    if (ok) {
        char ini[1200];
        snprintf(ini, sizeof ini, "[model]\npath = %s\n[checkpointing]\nevery = 1\nkeep_mlp = %s\n", dir,
                 keep_mlp ? "true" : "false");
        ctrl_config *cfg = test_config_from_text(reg, "checkpointing.ini", ini);
        const ctrl_memory_ops *mops = ckpt->plugin->ops;
        ok =
            cfg && mops->create(ctrl_host_table(), cfg, 2, &mem) == CTRL_OK &&
            ctrl_model_load(dir, attn->plugin->ops, &m) == CTRL_OK &&
            ctrl_model_set_memory(m, mops, mem) == CTRL_OK &&
            ctrl_model_to_device(m, ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}) == CTRL_OK &&
            ctrl_model_set_compute_dtype(m, CTRL_BF16) == CTRL_OK;
        ctrl_config_free(cfg);
        CHECK_MSG(ok, "%s", ctrl_error_message());
    }
    ctrl_batch b;
    static int32_t tok[B16_T], pos[B16_T], tg[B16_T], cu[4] = {0, 20, 37, B16_T};
    float dlogp[B16_T];
    if (ok) {
        random_batch(&b, tok, pos, tg, cu, 3, 777, ctrl_model_cfg(m)->vocab_size);
        for (int t = 0; t < B16_T; t++) dlogp[t] = b.targets[t] >= 0 ? -1.0f / 50 : 0.0f;
        /* a first step makes the buffers; the second is counted */
        ok = ctrl_model_zero_grad(m) == CTRL_OK &&
             ctrl_model_forward(m, &b, o->logp, NULL, NULL) == CTRL_OK &&
             ctrl_model_backward(m, dlogp) == CTRL_OK && ctrl_model_zero_grad(m) == CTRL_OK;
        ctrl_model_weights_changed(m);
        ctrl_emu_reset_counters();
        ok = ok && ctrl_model_forward(m, &b, o->logp, NULL, NULL) == CTRL_OK &&
             ctrl_model_backward(m, dlogp) == CTRL_OK;
        o->convs = ctrl_emu_launches("f32_to_bf16") + ctrl_emu_launches("round_bf16");
        o->launches = ctrl_emu_launches(NULL), o->mm_bf16 = ctrl_emu_matmuls(0),
        o->mm_f32 = ctrl_emu_matmuls(1);
        ok = ok && ctrl_model_grads_to_host(m) == CTRL_OK;
        CHECK_MSG(ok, "%s", ctrl_error_message());
    }
    float *g = ok ? ctrl_model_grads(m, &o->n) : NULL;
    if (g && (o->grads = malloc(sizeof(float) * o->n))) memcpy(o->grads, g, sizeof(float) * o->n);
    ctrl_model_free(m);
    if (mem) ((const ctrl_memory_ops *)ckpt->plugin->ops)->destroy(mem);
    ctrl_registry_destroy(reg);
    unsetenv("CTRL_NO_BF16_OPERANDS"), unsetenv("CTRL_CUDA_GEMM_TUNE");
    ctrl_cuda_gemm_forget_algorithms();
    return ok && o->grads;
}

static int bf16_step(int per_product, int tune, b16_step *o) {
    return bf16_step_keep(per_product, tune, 0, o);
}

/* Selective checkpointing on the device ([checkpointing] keep_mlp): the recompute skips each layer's
 * gate_proj and up_proj products (2 GEMMs a layer fewer in the step), the log-probs and gradients
 * the same bits as recomputing them. */
TEST(checkpointing_keep_mlp_skips_gate_up_on_device) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    b16_step all = {0}, keep = {0};
    if (!bf16_step_keep(0, 0, 0, &all) || !bf16_step_keep(0, 0, 1, &keep)) {
        free(all.grads), free(keep.grads);
        return;
    }
    printf("  qwen2 (2 layers) bf16 step, checkpointed: GEMMs %ld, with keep_mlp %ld\n", all.mm_bf16,
           keep.mm_bf16);
    CHECK(!memcmp(all.logp, keep.logp, sizeof all.logp));
    CHECK(all.n == keep.n && !memcmp(all.grads, keep.grads, sizeof(float) * all.n));
    CHECK_EQ_INT(all.mm_bf16 - keep.mm_bf16, 2 * 2); /* gate and up, in each of the 2 layers */
    free(all.grads), free(keep.grads);
}

/* bf16 compute on the device converts each GEMM input to bf16 once (issue 20's MFU work): the weights
 * held as bf16 (the LM head's chunks read from that copy too), ln1 converted once for q, k and v, and
 * ln1, att, ln2 and h made by the checkpointed layer's recompute reused by the weight gradients. The
 * same bf16 operands as the per-product conversions (CTRL_NO_BF16_OPERANDS=1), so on the emulator the
 * same bits; every GEMM of the step on bf16 operands. */
TEST(bf16_step_converts_each_operand_once) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    b16_step once = {0}, per = {0}, tuned = {0};
    if (!bf16_step(0, 0, &once) || !bf16_step(1, 0, &per) || !bf16_step(0, 1, &tuned)) {
        free(once.grads), free(per.grads), free(tuned.grads);
        return;
    }
    printf("  qwen2 (2 layers) bf16 step, checkpointed: conversions %ld -> %ld, launches %ld -> %ld, "
           "GEMMs bf16 %ld -> %ld, fp32 %ld -> %ld\n",
           per.convs, once.convs, per.launches, once.launches, per.mm_bf16, once.mm_bf16, per.mm_f32,
           once.mm_f32);
    CHECK(!memcmp(once.logp, per.logp, sizeof once.logp));
    CHECK(once.n == per.n && !memcmp(once.grads, per.grads, sizeof(float) * once.n));
    CHECK_EQ_INT(once.mm_f32, 0);
    CHECK_EQ_INT(per.mm_f32, 0);
    CHECK_EQ_INT(once.mm_bf16, per.mm_bf16);
    CHECK(once.convs < per.convs);
    /* CTRL_CUDA_GEMM_TUNE=1 (gemm.cu: the heuristic's candidates timed, the fastest kept): the emulator
     * offers two of one arithmetic, so the same bits; its timing runs go to scratch, not the step */
    CHECK(!memcmp(once.logp, tuned.logp, sizeof once.logp));
    CHECK(once.n == tuned.n && !memcmp(once.grads, tuned.grads, sizeof(float) * once.n));
    free(once.grads), free(per.grads), free(tuned.grads);
}

/* ctrl_model_defer_device (ZeRO-3 on a device: the move copies nothing, zero_device.c puts the slices
 * there): a forward before that is an error naming the cause, not a read of memory that is not there;
 * nothing of the parameters was allocated on the device. */
TEST(deferred_move_refuses_a_forward) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/qwen2", CTRL_FIXTURE_DIR);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "eager");
    ctrl_model *m = NULL;
    int ok = attn && ctrl_model_load(dir, attn->plugin->ops, &m) == CTRL_OK;
    if (ok) ctrl_model_defer_device(m);
    ok =
        ok && ctrl_model_to_device(m, ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}) == CTRL_OK;
    CHECK_MSG(ok, "%s", ctrl_error_message());
    if (ok) {
        CHECK(ctrl_model_device_params(m) == NULL && ctrl_model_device_grads(m, NULL) == NULL);
        ctrl_batch b;
        static int32_t tok[8], pos[8], tg[8], cu[2] = {0, 8};
        float logp[8];
        random_batch(&b, tok, pos, tg, cu, 1, 5, ctrl_model_cfg(m)->vocab_size);
        CHECK_EQ_INT(ctrl_model_forward(m, &b, logp, NULL, NULL), CTRL_ERR_RUNTIME);
        CHECK(strstr(ctrl_error_message(), "before ZeRO-3 put its parameters there") != NULL);
    }
    ctrl_model_free(m);
    ctrl_registry_destroy(reg);
}
#endif
