/* The CUDA backend as the CPU core sees it: libctrl_cuda.so is loaded with dlopen only when a run
 * asks for a GPU, so a CPU run never maps the CUDA libraries; this table is what it exports. */
#ifndef CTRL_CORE_CUDA_BACKEND_H
#define CTRL_CORE_CUDA_BACKEND_H

#include <ctrl/config.h>
#include <ctrl/tensor.h>

#include "model/model.h"

typedef struct ctrl_model_cuda ctrl_model_cuda;

typedef struct ctrl_cuda_backend {
    int (*device_count)(void);
    const char *(*unavailable_reason)(void);
    ctrl_status (*set_device)(int index);
    ctrl_status (*device_name)(int index, char *buf, size_t cap);
    ctrl_status (*model_create)(ctrl_model *m, const ctrl_attention_ops *attn, ctrl_model_cuda **out);
    void (*model_free)(ctrl_model_cuda *dm);
    ctrl_status (*forward)(ctrl_model_cuda *dm, const ctrl_batch *b, float *logp, float *entropy,
                           int32_t *correct);
    ctrl_status (*backward)(ctrl_model_cuda *dm, const float *dlogp);
    ctrl_status (*zero_grad)(ctrl_model_cuda *dm);
    ctrl_status (*grads_to_host)(ctrl_model_cuda *dm, float *dst);
    ctrl_status (*params_from_host)(ctrl_model_cuda *dm);
} ctrl_cuda_backend;

/* Exported by libctrl_cuda.so (cuda_backend_table.c). */
const ctrl_cuda_backend *ctrl_cuda_backend_table(void);

/* `[run] device` resolved (device_select.c): "cpu"; "cuda" or "cuda:N" (an error naming the key
 * and why when that device cannot be used); "auto": the first CUDA device when the backend loads
 * and one exists, else the CPU; the choice is logged. *backend is the loaded table for CUDA. */
ctrl_status ctrl_device_select(const char *spec, ctrl_device *out, const ctrl_cuda_backend **backend);

#endif
