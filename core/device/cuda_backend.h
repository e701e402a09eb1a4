/* The CUDA backend as the CPU core sees it: libctrl_cuda.so is loaded with dlopen only when a run
 * asks for a GPU, so a CPU run never maps the CUDA libraries; this table is what it exports: the
 * device functions, and the backend ops table (device/backend.h) a model is placed on with
 * ctrl_model_to_device. Nothing here knows the model. */
#ifndef CTRL_CORE_CUDA_BACKEND_H
#define CTRL_CORE_CUDA_BACKEND_H

#include <ctrl/status.h>
#include <ctrl/tensor.h>

#include "device/backend.h"

typedef struct ctrl_cuda_backend {
    int (*device_count)(void);
    const char *(*unavailable_reason)(void);
    ctrl_status (*set_device)(int index);
    ctrl_status (*device_name)(int index, char *buf, size_t cap);
    /* The model's ops on the current device (cuda_backend_ops.c); NULL when built without CUDA. */
    const ctrl_backend_ops *ops;
} ctrl_cuda_backend;

/* Exported by libctrl_cuda.so (cuda_backend_table.c). */
const ctrl_cuda_backend *ctrl_cuda_backend_table(void);
/* The CUDA backend ops table (cuda_backend_ops.c, in libctrl_cuda.so; NULL built without CUDA). */
const ctrl_backend_ops *ctrl_cuda_backend_ops(void);

/* `[run] device` resolved (device_select.c): "cpu"; "cuda" or "cuda:N" (an error naming the key
 * and why when that device cannot be used); "auto": the first CUDA device when the backend loads
 * and one exists, else the CPU; the choice is logged. *backend is the loaded table for CUDA. */
ctrl_status ctrl_device_select(const char *spec, ctrl_device *out, const ctrl_cuda_backend **backend);
/* The backend ops of `device`: the CPU's, or the CUDA table ctrl_device_select loaded (NULL before
 * a CUDA device was selected). */
const ctrl_backend_ops *ctrl_device_backend(ctrl_device device);

#endif
