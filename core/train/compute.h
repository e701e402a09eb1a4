/* Where a training run computes (`[run] device`): the model is placed on the CPU backend or the
 * CUDA backend's (ctrl_model_to_device) with its compute dtype and [memory] strategy, and from then
 * on the loop and the trainer kinds call the model itself (ctrl_model_forward/backward/zero_grad,
 * ctrl_model_grads_to_host before reading the gradients); nothing else in core/train knows the
 * device. The gradient norm and clipping run on the model's backend; an optimizer that can step
 * on the device (adamw) steps the device's buffers there, any other the host copies
 * (ctrl_model_weights_changed refreshes the device's copy). */
#ifndef CTRL_CORE_TRAIN_COMPUTE_H
#define CTRL_CORE_TRAIN_COMPUTE_H

#include <ctrl/memory.h>
#include <ctrl/optimizer.h>

#include "device/cuda_backend.h"
#include "model/model.h"

typedef struct train_compute {
    ctrl_device device;
    const ctrl_cuda_backend *cuda; /* set by train_compute_select for a CUDA device */
    const ctrl_memory_ops *mem_ops;
    ctrl_memory *mem; /* the [memory] strategy */
} train_compute;

/* Resolves `[run] device` (before the model loads: a CUDA device that cannot be used fails fast). */
ctrl_status train_compute_select(const char *device, train_compute *c);
/* Places the loaded model on the selected device. `dtype` is [train] dtype: bf16 runs the linear
 * projections in bf16 (fp32 accumulation and master weights, as torch.autocast) where the backend
 * has it, and is refused naming the key where it does not; where the device has no bf16 kernel,
 * [train] bf16_fallback (cfg's settings) says whether they run in plain fp32 or emulate bf16's
 * rounding (ctrl_model_set_bf16_fallback). `mem_ops` (may be NULL) is the
 * [memory] strategy, created from `cfg` and attached to the model. */
ctrl_status train_compute_attach(train_compute *c, ctrl_model *model, const char *dtype,
                                 const ctrl_memory_ops *mem_ops, const ctrl_config *cfg);
void train_compute_free(train_compute *c);
/* The optimizer's parameter groups of `model` over `params` / `grads` (the host's buffers or the
 * device's: ctrl_model_device_params / _grads): one per trainable tensor (with LoRA the adapters and
 * modules_to_save only), no weight decay on norms and biases (as the HF Trainer), `weight_decay`
 * on the rest. `groups` holds ctrl_model_view_count entries; returns how many were set. */
int train_param_groups(ctrl_model *model, float *params, float *grads, float weight_decay,
                       ctrl_param_group *groups);

#endif
