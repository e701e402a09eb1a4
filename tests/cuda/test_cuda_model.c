/* The whole model on the CUDA backend against the CPU backend (fp32), through backend_case.c: the
 * transformers fixtures of tests/fixtures/models (Llama, Qwen2, Qwen3, Mistral), one copy placed on
 * the device with ctrl_model_to_device (the same model code, the CUDA backend ops table), a plain
 * step, a step after a weight change, and a fused step at temperature 0.7 (what only the CPU model
 * had before the model was written once), with and without checkpointing; log-probs and entropies
 * within 1e-5 relative, every parameter's gradient within 1e-4. The eager plugin's CUDA path does
 * attention. Skips without a GPU. */
#include <stdlib.h>

#include "backend_case.h"
#include "cuda/cuda_ops.h"
#include "device/cuda_backend.h"
#include "test.h"

static int need_gpu(void) {
    static int state = -1;
    if (state < 0) {
        state = ctrl_cuda_device_count() > 0 && ctrl_cuda_backend_ops() != NULL;
        if (state) atexit(ctrl_cuda_shutdown);
    }
    return state;
}

static void compare(int checkpointing) {
    static const char *const archs[] = {"llama", "qwen2", "qwen3", "mistral"};
    for (int a = 0; a < 4; a++)
        backend_case_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, archs[a], "eager",
                           checkpointing, 1e-5, 1e-4);
}

TEST(model_matches_cpu) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    compare(0);
}

TEST(model_with_checkpointing_matches_cpu) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    compare(1);
}

/* The sequence-classification head (reward models) through the same ops table. */
TEST(lora_matches_cpu) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    backend_lora_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, "llama", 1e-5);
    backend_lora_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, "qwen2", 1e-5);
}

TEST(score_head_matches_cpu) {
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    backend_score_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, "qwen2", 1e-5);
    backend_score_check(ctrl_cuda_backend_ops(), (ctrl_device){CTRL_DEVICE_CUDA, 0}, "llama", 1e-5);
}
