/* The `eager` attention plugin: the plain reference (materialised scores), the one every faster
 * backend is checked against: fp32 on the CPU, and on CUDA devices when built with CUDA. */
#include <ctrl/plugin_api.h>

#include "../attention_plugin_common.h"
#include "eager_cpu.h"

CTRL_PLUGIN_API_DEFINE;

static int eager_supports(const ctrl_attention_args *a) {
    return attention_cpu_f32_supported(a) || attention_cuda_f32_supported(a);
}

static ctrl_status eager_forward(const ctrl_attention_args *a, void *workspace) {
    (void)workspace;
    ctrl_status st = attention_check_args_softcap("eager", a, 0, eager_supports, 1);
    if (st != CTRL_OK) return st;
#ifdef CTRL_HAVE_CUDA
    if (a->device.type == CTRL_DEVICE_CUDA) return eager_cuda_forward(a);
#endif
    return eager_cpu_forward(a);
}

static ctrl_status eager_backward(const ctrl_attention_args *a, void *workspace) {
    (void)workspace;
    ctrl_status st = attention_check_args_softcap("eager", a, 1, eager_supports, 1);
    if (st != CTRL_OK) return st;
#ifdef CTRL_HAVE_CUDA
    if (a->device.type == CTRL_DEVICE_CUDA) return eager_cuda_backward(a);
#endif
    return eager_cpu_backward(a);
}

static const ctrl_attention_ops eager_ops = {
    .size = sizeof(ctrl_attention_ops),
    .supports = eager_supports,
    .forward = eager_forward,
    .backward = eager_backward,
    .features = CTRL_ATTENTION_SOFTCAP, /* on the CPU and on CUDA (eager_cuda.cu) */
};

static const ctrl_plugin eager_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_ATTENTION,
    .name = "eager",
    .version = "0.1.0",
    .summary = "reference attention: materialised scores, causal/window/GQA, variable-length batches",
    .init = ctrl_plugin_api_init,
    .ops = &eager_ops,
};

CTRL_PLUGIN_DEFINE(&eager_plugin)
