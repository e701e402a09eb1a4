/* The table libctrl loads (see cuda_backend.h). */
#include "cuda/cuda_ops.h"
#include "device/cuda_backend.h"

const ctrl_cuda_backend *ctrl_cuda_backend_table(void) {
    static ctrl_cuda_backend table = {
        .device_count = ctrl_cuda_device_count,
        .unavailable_reason = ctrl_cuda_unavailable_reason,
        .set_device = ctrl_cuda_set_device,
        .device_name = ctrl_cuda_device_name,
    };
    table.ops = ctrl_cuda_backend_ops();
    return &table;
}
