/* The training run's compute device (see compute.h). */
#include <string.h>

#include "registry.h"
#include "train/compute.h"

ctrl_status train_compute_select(const char *device, train_compute *c) {
    ctrl_device dev;
    memset(c, 0, sizeof *c);
    return ctrl_device_select(device, &dev, &c->cuda);
}

ctrl_status train_compute_attach(train_compute *c, ctrl_model *host, const ctrl_attention_ops *attention,
                                 const char *dtype, const ctrl_memory_ops *mem_ops, const ctrl_config *cfg) {
    c->host = host;
    if (!c->cuda) {
        if (strcmp(dtype, "fp16") == 0)
            return ctrl_error_set(CTRL_ERR_CONFIG,
                                  "[train] dtype = fp16: not supported on the CPU (use bf16 or fp32)");
        ctrl_status st =
            ctrl_model_set_compute_dtype(host, strcmp(dtype, "bf16") == 0 ? CTRL_BF16 : CTRL_F32);
        if (st != CTRL_OK || !mem_ops) return st;
        st = mem_ops->create(ctrl_host_table(), cfg, ctrl_model_cfg(host)->n_layers, &c->mem);
        if (st == CTRL_OK) c->mem_ops = mem_ops, ctrl_model_set_memory(host, mem_ops, c->mem);
        return st;
    }
    /* fp32 on the device, the optimizer on the host (for now) */
    if (strcmp(dtype, "fp32") != 0)
        CTRL_WARN("[train] dtype = %s: the CUDA model computes in fp32 so far", dtype);
    ctrl_status st = c->cuda->model_create(host, attention, &c->dev);
    if (st == CTRL_OK && mem_ops)
        CTRL_WARN("[memory] strategies: not applied on CUDA yet (every activation is kept on the device)");
    return st;
}

int train_compute_on_host(const train_compute *c) { return c->dev == NULL; }

ctrl_status train_compute_forward(const train_compute *c, const ctrl_batch *b, float *logp, float *entropy,
                                  int32_t *correct) {
    return c->dev ? c->cuda->forward(c->dev, b, logp, entropy, correct)
                  : ctrl_model_forward(c->host, b, logp, entropy, correct);
}

ctrl_status train_compute_forward_fused(const train_compute *c, const ctrl_batch *b, const float *dlogp,
                                        float *logp, float *entropy, int32_t *correct) {
    if (c->dev)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "train: the fused head runs on the CPU model only");
    return ctrl_model_forward_fused(c->host, b, dlogp, logp, entropy, correct);
}

ctrl_status train_compute_backward(const train_compute *c, const float *dlogp) {
    return c->dev ? c->cuda->backward(c->dev, dlogp) : ctrl_model_backward(c->host, dlogp);
}

ctrl_status train_compute_zero_grad(const train_compute *c) {
    ctrl_model_zero_grad(c->host);
    return c->dev ? c->cuda->zero_grad(c->dev) : CTRL_OK;
}

ctrl_status train_compute_gather_grads(const train_compute *c) {
    return c->dev ? c->cuda->grads_to_host(c->dev, ctrl_model_grads(c->host, NULL)) : CTRL_OK;
}

ctrl_status train_compute_sync_params(const train_compute *c) {
    return c->dev ? c->cuda->params_from_host(c->dev) : CTRL_OK;
}

void train_compute_free(train_compute *c) {
    if (c->dev) c->cuda->model_free(c->dev);
    if (c->mem) c->mem_ops->destroy(c->mem);
    c->dev = NULL, c->mem = NULL;
}
