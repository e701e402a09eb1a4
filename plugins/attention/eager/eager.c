/* The `eager` attention plugin: the plain reference (materialised scores), the one every faster
 * backend is checked against. CPU fp32 for now; a CUDA path (batched GEMM) comes with the CUDA
 * backend. */
#include <ctrl/attention.h>

#include "eager_cpu.h"

/* The core's services, kept from init(): plugins report errors through the host table. */
const ctrl_host *eager_host;

static ctrl_status eager_init(const ctrl_host *host) {
    eager_host = host;
    return CTRL_OK;
}

static int eager_supports(const ctrl_attention_args *a) {
    return a->device.type == CTRL_DEVICE_CPU && a->dtype == CTRL_F32 && a->n_kv_head > 0 && a->n_head > 0 &&
           a->n_head % a->n_kv_head == 0 && a->cu_seqlens_host != NULL;
}

static ctrl_status check(const ctrl_attention_args *a) {
    if (a->size < sizeof(ctrl_attention_args))
        return eager_host->error_set(CTRL_ERR_RUNTIME,
                                     "attention eager: argument struct of size %zu is too old", a->size);
    if (!eager_supports(a))
        return eager_host->error_set(
            CTRL_ERR_UNSUPPORTED,
            "attention eager: supports fp32 on the CPU with n_head %% n_kv_head == 0 "
            "(got %s on %s, %d/%d heads)",
            ctrl_dtype_name(a->dtype), a->device.type == CTRL_DEVICE_CPU ? "cpu" : "cuda", a->n_head,
            a->n_kv_head);
    return CTRL_OK;
}

static ctrl_status eager_forward(const ctrl_attention_args *a, void *workspace) {
    (void)workspace;
    ctrl_status st = check(a);
    return st != CTRL_OK ? st : eager_cpu_forward(a);
}

static ctrl_status eager_backward(const ctrl_attention_args *a, void *workspace) {
    (void)workspace;
    ctrl_status st = check(a);
    if (st != CTRL_OK) return st;
    if (!a->lse || !a->dout || !a->dq || !a->dk || !a->dv)
        return eager_host->error_set(CTRL_ERR_RUNTIME,
                                     "attention eager: backward needs lse, dout, dq, dk and dv");
    return eager_cpu_backward(a);
}

static const ctrl_attention_ops eager_ops = {
    .size = sizeof(ctrl_attention_ops),
    .supports = eager_supports,
    .workspace_bytes = NULL,
    .forward = eager_forward,
    .backward = eager_backward,
};

static const ctrl_plugin eager_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_ATTENTION,
    .name = "eager",
    .version = "0.1.0",
    .summary = "reference attention: materialised scores, causal/window/GQA, variable-length batches",
    .options = NULL,
    .init = eager_init,
    .ops = &eager_ops,
};

CTRL_PLUGIN_DEFINE(&eager_plugin)
