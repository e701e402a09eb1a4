/* The `flash` attention plugin: tiled online softmax (FlashAttention-2's algorithm), memory
 * linear in the sequence length. fp32 on the CPU (flash_cpu.c); fp32 or bf16 on CUDA devices when
 * built with CUDA (flash_cuda.cu). */
#include <ctrl/plugin_api.h>

#include "../attention_plugin_common.h"
#include "flash_cpu.h"
#ifdef CTRL_HAVE_CUDA
#include "flash_cuda.h"
#endif

CTRL_PLUGIN_API_DEFINE;

static int flash_supports(const ctrl_attention_args *a) {
#ifdef CTRL_HAVE_CUDA
    if (flash_cuda_supported(a)) return 1;
#endif
    return attention_cpu_f32_supported(a);
}

static ctrl_status flash_forward(const ctrl_attention_args *a, void *workspace) {
    (void)workspace;
    ctrl_status st = attention_check_args_softcap("flash", a, 0, flash_supports, 1);
    if (st != CTRL_OK) return st;
#ifdef CTRL_HAVE_CUDA
    if (a->device.type == CTRL_DEVICE_CUDA) return flash_cuda_forward(a);
#endif
    return flash_cpu_forward(a);
}

static ctrl_status flash_backward(const ctrl_attention_args *a, void *workspace) {
    (void)workspace;
    ctrl_status st = attention_check_args_softcap("flash", a, 1, flash_supports, 1);
    if (st != CTRL_OK) return st;
#ifdef CTRL_HAVE_CUDA
    if (a->device.type == CTRL_DEVICE_CUDA) return flash_cuda_backward(a);
#endif
    return flash_cpu_backward(a);
}

static const ctrl_attention_ops flash_ops = {
    .size = sizeof(ctrl_attention_ops),
    .supports = flash_supports,
    .features = CTRL_ATTENTION_SOFTCAP, /* on the CPU and every CUDA path */
    .forward = flash_forward,
    .backward = flash_backward,
};

static const ctrl_plugin flash_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_ATTENTION,
    .name = "flash",
    .version = "0.1.0",
    .summary = "flash attention: tiled online softmax, never materialises T x T; causal/window/GQA, varlen",
    .init = ctrl_plugin_api_init,
    .ops = &flash_ops,
};

CTRL_PLUGIN_DEFINE(&flash_plugin)
