/* The table libctrl loads (see cuda_backend.h). */
#include "device/cuda_backend.h"
#include "cuda/cuda_ops.h"
#include "model/model_cuda.h"

const ctrl_cuda_backend *ctrl_cuda_backend_table(void) {
    static const ctrl_cuda_backend table = {
        .device_count = ctrl_cuda_device_count,
        .unavailable_reason = ctrl_cuda_unavailable_reason,
        .set_device = ctrl_cuda_set_device,
        .device_name = ctrl_cuda_device_name,
        .model_create = ctrl_model_cuda_create,
        .model_free = ctrl_model_cuda_free,
        .forward = ctrl_model_cuda_forward,
        .backward = ctrl_model_cuda_backward,
        .zero_grad = ctrl_model_cuda_zero_grad,
        .grads_to_host = ctrl_model_cuda_grads_to_host,
        .params_from_host = ctrl_model_cuda_params_from_host,
    };
    return &table;
}
