/* The decoder on a CUDA device, fp32: the same forward and backward as model.c, on device copies
 * of the flat parameter and gradient buffers, through the ctrl_cuda_* kernels and the attention
 * plugin's CUDA path. Checked against the CPU model (tests/cuda/test_cuda_model.c). */
#ifndef CTRL_CORE_MODEL_CUDA_H
#define CTRL_CORE_MODEL_CUDA_H

#include "model/model.h"

typedef struct ctrl_model_cuda ctrl_model_cuda;

/* Copies `m`'s parameters to the current device; `attn` must run on CUDA. */
ctrl_status ctrl_model_cuda_create(ctrl_model *m, const ctrl_attention_ops *attn, ctrl_model_cuda **out);
void ctrl_model_cuda_free(ctrl_model_cuda *dm);
/* The batch lives on the host; logp (and entropy and correct, may be NULL) are returned to the host. */
ctrl_status ctrl_model_cuda_forward(ctrl_model_cuda *dm, const ctrl_batch *b, float *logp, float *entropy,
                                    int32_t *correct);
/* dlogp on the host; gradients accumulate on the device. */
ctrl_status ctrl_model_cuda_backward(ctrl_model_cuda *dm, const float *dlogp);
ctrl_status ctrl_model_cuda_zero_grad(ctrl_model_cuda *dm);
ctrl_status ctrl_model_cuda_grads_to_host(ctrl_model_cuda *dm, float *dst);
/* The host model's parameters (after an optimizer step on the host) copied to the device. */
ctrl_status ctrl_model_cuda_params_from_host(ctrl_model_cuda *dm);

#endif
