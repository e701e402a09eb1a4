/* The `flash` attention plugin: tiled online softmax (FlashAttention-2's algorithm), memory
 * linear in the sequence length. CPU fp32 path here; the CUDA kernels come with the CUDA
 * attention work and dispatch on args->device. */
#include <ctrl/attention.h>

#include "../attention_plugin_common.h"
#include "flash_cpu.h"

const ctrl_host *flash_host;

static ctrl_status flash_init(const ctrl_host *host) {
    flash_host = host;
    return CTRL_OK;
}

static ctrl_status flash_forward(const ctrl_attention_args *a, void *workspace) {
    (void)workspace;
    ctrl_status st = attention_check_args(flash_host, "flash", a, 0);
    return st != CTRL_OK ? st : flash_cpu_forward(a);
}

static ctrl_status flash_backward(const ctrl_attention_args *a, void *workspace) {
    (void)workspace;
    ctrl_status st = attention_check_args(flash_host, "flash", a, 1);
    return st != CTRL_OK ? st : flash_cpu_backward(a);
}

static const ctrl_attention_ops flash_ops = {
    .size = sizeof(ctrl_attention_ops),
    .supports = attention_cpu_f32_supported,
    .forward = flash_forward,
    .backward = flash_backward,
};

static const ctrl_plugin flash_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_ATTENTION,
    .name = "flash",
    .version = "0.1.0",
    .summary = "flash attention: tiled online softmax, never materialises T x T; causal/window/GQA, varlen",
    .init = flash_init,
    .ops = &flash_ops,
};

CTRL_PLUGIN_DEFINE(&flash_plugin)
