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
