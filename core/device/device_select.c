/* `[run] device` (see cuda_backend.h): libctrl_cuda.so is looked for beside libctrl (the build
 * tree and the install prefix both keep them together), then on the loader's path; the
 * environment variable CTRL_CUDA_LIBRARY, when set, names the library to load instead (the CUDA
 * emulator's tests point it at build/cuda-emu/libctrl_cuda.so, kernels/cuda/emu/README.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ctrl/log.h>

#include "device/cuda_backend.h"
#include "sibling_library.h"

static const ctrl_cuda_backend *selected; /* the CUDA table a selection loaded (one per process) */

const ctrl_backend_ops *ctrl_device_backend(ctrl_device device) {
    if (device.type == CTRL_DEVICE_CPU) return ctrl_backend_cpu();
    return selected ? selected->ops : NULL;
}

ctrl_status ctrl_device_select(const char *spec, ctrl_device *out, const ctrl_cuda_backend **backend) {
    *out = (ctrl_device){CTRL_DEVICE_CPU, 0};
    *backend = NULL;
    if (!spec || !strcmp(spec, "cpu")) return CTRL_OK;
    const int is_auto = !strcmp(spec, "auto");
    int index = 0;
    char tail;
    if (!is_auto && strcmp(spec, "cuda") != 0 && (sscanf(spec, "cuda:%d%c", &index, &tail) != 1 || index < 0))
        return ctrl_error_set(CTRL_ERR_CONFIG, "[run] device = %s: expected auto, cpu, cuda or cuda:N", spec);
    /* no NVIDIA driver: not worth mapping the CUDA libraries (about 150 MiB) to find out */
    if (is_auto && access("/proc/driver/nvidia/version", R_OK) != 0) {
        CTRL_INFO("device auto: no NVIDIA driver; running on the CPU");
        return CTRL_OK;
    }
    char why[1024] = "";
    const ctrl_cuda_backend *b = ctrl_sibling_library_table("libctrl_cuda.so", "CTRL_CUDA_LIBRARY",
                                                            "ctrl_cuda_backend_table", 0, why, sizeof why);
    int count = b ? b->device_count() : 0;
    if (b && count == 0) snprintf(why, sizeof why, "%s", b->unavailable_reason());
    if (is_auto && count == 0) {
        CTRL_INFO("device auto: no usable GPU (%s); running on the CPU", why);
        return CTRL_OK;
    }
    if (index >= count)
        return ctrl_error_set(CTRL_ERR_DEVICE, "[run] device = %s: %s", spec,
                              count == 0 ? why : "no such CUDA device (see nvidia-smi)");
    ctrl_status st = b->set_device(index);
    if (st != CTRL_OK) return st;
    char name[256] = "";
    b->device_name(index, name, sizeof name);
    CTRL_INFO("device %s: CUDA device %d (%s)", spec, index, name);
    *out = (ctrl_device){CTRL_DEVICE_CUDA, index};
    *backend = selected = b;
    return CTRL_OK;
}
