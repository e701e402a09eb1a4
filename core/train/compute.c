/* The training run's compute device (see compute.h). */
#include <stdio.h>
#include <string.h>

#include "collective/collective.h"
#include "config/config_load.h"
#include "registry/registry.h"
#include "train/compute.h"

ctrl_status train_compute_select(const char *device, train_compute *c) {
    memset(c, 0, sizeof *c);
    /* data parallel: "cuda" (and "auto") means the rank's GPU on its node */
    char local[32];
    if (ctrl_collective_size() > 1 && device && !strncmp(device, "cuda:", 5))
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "[run] device = %s with %d ranks: every rank would take that one GPU; say "
                              "device = cuda (each rank takes the GPU of its local rank) and choose the GPUs "
                              "with CUDA_VISIBLE_DEVICES",
                              device, ctrl_collective_size());
    if (ctrl_collective_size() > 1 && device && (!strcmp(device, "cuda") || !strcmp(device, "auto"))) {
        snprintf(local, sizeof local, "cuda:%d", ctrl_collective_local_rank());
        if (!strcmp(device, "cuda"))
            device = local;
        else if (ctrl_device_select(local, &c->device, &c->cuda) == CTRL_OK)
            return CTRL_OK;
        else
            device = "cpu"; /* auto: no GPU for this rank */
    }
    return ctrl_device_select(device, &c->device, &c->cuda);
}

ctrl_status train_compute_attach(train_compute *c, ctrl_model *model, const char *dtype,
                                 const ctrl_memory_ops *mem_ops, const ctrl_config *cfg) {
    if (strcmp(dtype, "fp16") == 0)
        return ctrl_error_set(CTRL_ERR_CONFIG, "[train] dtype = fp16: not supported (use bf16 or fp32)");
    ctrl_status st = CTRL_OK;
    if (c->cuda) {
        if (!c->cuda->ops)
            return ctrl_error_set(CTRL_ERR_DEVICE, "[run] device: libctrl_cuda.so has no model ops");
        st = ctrl_model_to_device(model, c->cuda->ops, c->device);
    }
    /* [train] bf16_fallback: where the device has no bf16 kernel, plain fp32 products or bf16's rounded
     * numbers (the model asks the backend per product; nothing changes where a kernel runs) */
    const ctrl_run_settings *s = cfg ? ctrl_config_settings(cfg) : NULL;
    ctrl_model_set_bf16_fallback(model, !s || s->train.bf16_fallback_fp32 ? CTRL_BF16_FALLBACK_FP32
                                                                          : CTRL_BF16_FALLBACK_ROUNDED);
    /* bf16 where the backend has its ops; refused naming the key where it does not */
    if (st == CTRL_OK)
        st = ctrl_model_set_compute_dtype(model, strcmp(dtype, "bf16") == 0 ? CTRL_BF16 : CTRL_F32);
    if (st != CTRL_OK && strcmp(dtype, "bf16") == 0)
        return ctrl_error_wrap(st, "[train] dtype = bf16 (fp32 runs everywhere)");
    if (st != CTRL_OK || !mem_ops) return st;
    st = mem_ops->create(ctrl_host_table(), cfg, ctrl_model_cfg(model)->n_layers, &c->mem);
    if (st == CTRL_OK) c->mem_ops = mem_ops, st = ctrl_model_set_memory(model, mem_ops, c->mem);
    return st;
}

void train_compute_free(train_compute *c) {
    if (c->mem) c->mem_ops->destroy(c->mem);
    c->mem = NULL;
}

int train_param_groups(ctrl_model *model, float *params, float *grads, float weight_decay,
                       ctrl_param_group *groups) {
    const size_t first = ctrl_model_trainable_offset(model); /* grads start there */
    int n = 0;
    for (int i = 0; i < ctrl_model_view_count(model); i++) {
        const ctrl_param_view *v = ctrl_model_view(model, i);
        if (v->offset < first) continue;
        groups[n++] = (ctrl_param_group){.param = params + v->offset,
                                         .grad = grads + (v->offset - first),
                                         .numel = v->numel,
                                         .weight_decay = v->no_decay ? 0.0f : weight_decay};
    }
    return n;
}
