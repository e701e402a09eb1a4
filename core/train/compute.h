/* Where a training run computes (`[run] device`): the host model, or its copy on a CUDA device
 * whose gradients come back to the host buffer for clipping and the optimizer, and whose
 * parameters are refreshed from the host after each optimizer step. The loop and the trainer
 * kinds call these and never ask which device it is; when the model itself becomes
 * device-agnostic (a backend ops table), this file is what goes away. */
#ifndef CTRL_CORE_TRAIN_COMPUTE_H
#define CTRL_CORE_TRAIN_COMPUTE_H

#include <ctrl/memory.h>

#include "device/cuda_backend.h"
#include "model/model.h"

typedef struct train_compute {
    ctrl_model *host;
    const ctrl_cuda_backend *cuda; /* set by train_compute_select for a CUDA device */
    ctrl_model_cuda *dev;          /* the device copy (train_compute_attach) */
    const ctrl_memory_ops *mem_ops;
    ctrl_memory *mem; /* the [memory] strategy of the CPU model */
} train_compute;

/* Resolves `[run] device` (before the model loads: a CUDA device that cannot be used fails fast). */
ctrl_status train_compute_select(const char *device, train_compute *c);
/* Binds the loaded host model; on CUDA, copies it to the device. `dtype` is [train] dtype: bf16
 * runs the CPU model's projections in bf16 (fp32 accumulation and master weights, as
 * torch.autocast); the CUDA model computes in fp32 so far. `mem_ops` (may be NULL) is the [memory]
 * strategy, created from `cfg` and attached to the CPU model (not applied on CUDA yet). */
ctrl_status train_compute_attach(train_compute *c, ctrl_model *host, const ctrl_attention_ops *attention,
                                 const char *dtype, const ctrl_memory_ops *mem_ops, const ctrl_config *cfg);
/* 1 when the model computes on the host: what the online kind and the fused head need so far. */
int train_compute_on_host(const train_compute *c);

ctrl_status train_compute_forward(const train_compute *c, const ctrl_batch *b, float *logp, float *entropy,
                                  int32_t *correct);
/* The forward with the LM head's backward fused into it (dL/dlogp known before the forward; a
 * host model only: see train_compute_on_host); backward then takes NULL. */
ctrl_status train_compute_forward_fused(const train_compute *c, const ctrl_batch *b, const float *dlogp,
                                        float *logp, float *entropy, int32_t *correct);
ctrl_status train_compute_backward(const train_compute *c, const float *dlogp);
ctrl_status train_compute_zero_grad(const train_compute *c);
/* After the micro-batches: the step's gradients in the host buffer. */
ctrl_status train_compute_gather_grads(const train_compute *c);
/* After the optimizer step on the host parameters. */
ctrl_status train_compute_sync_params(const train_compute *c);
void train_compute_free(train_compute *c);

#endif
