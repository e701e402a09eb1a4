/* The ctrl_host table lent to plugins: the core's services behind stable function pointers, so
 * that a plugin needs only the public headers and imports nothing from libctrl (plugin_api.h
 * routes a plugin's ctrl_error_set, ctrl_log, ctrl_option_int, ... calls through this table). */
#include <stdarg.h>
#include <stdio.h>

#include <ctrl/config.h>

#include "device/cuda_backend.h"
#include "registry/registry.h"
#include "train/score_model.h"

static void host_log(ctrl_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ctrl_logv(level, fmt, ap);
    va_end(ap);
}

/* The plugin's printf-style message, handed to libctrl's setter as text. */
static ctrl_status host_message(ctrl_status (*set)(ctrl_status, const char *, ...), ctrl_status status,
                                const char *fmt, va_list ap) {
    char buf[4096];
    vsnprintf(buf, sizeof buf, fmt, ap);
    return set(status, "%s", buf);
}

static ctrl_status host_error_set(ctrl_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    status = host_message(ctrl_error_set, status, fmt, ap);
    va_end(ap);
    return status;
}

static ctrl_status host_error_wrap(ctrl_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    status = host_message(ctrl_error_wrap, status, fmt, ap);
    va_end(ap);
    return status;
}

/* The option readers: the first failure sticks in *status (and its message in the thread's
 * buffer); later reads do nothing, so a plugin checks *status once after reading everything. */
#define HOST_OPTION_READER(name, type, require)                                                              \
    static type name(const ctrl_config *cfg, const char *section, const char *key, ctrl_status *status) {    \
        type v = (type)0;                                                                                    \
        if (*status != CTRL_OK) return v;                                                                    \
        *status = require(cfg, section, key, &v);                                                            \
        return v;                                                                                            \
    }
HOST_OPTION_READER(host_option_string, const char *, ctrl_config_require_string)
HOST_OPTION_READER(host_option_int, int64_t, ctrl_config_require_int)
HOST_OPTION_READER(host_option_float, double, ctrl_config_require_float)
HOST_OPTION_READER(host_option_bool, bool, ctrl_config_require_bool)

/* A device backend's memory, optimizer kernels and GEMM (ctrl_host.device_kernels): the ops of the
 * CUDA table device selection loaded, for the optimizer and attention plugins; none on the CPU. */
static const ctrl_device_kernels *host_device_kernels(ctrl_device device) {
    static ctrl_device_kernels k;
    const ctrl_backend_ops *be = device.type == CTRL_DEVICE_CPU ? NULL : ctrl_device_backend(device);
    if (!be || be->host_memory || !ctrl_backend_has(be, adamw_step)) return NULL;
    k = (ctrl_device_kernels){.size = sizeof k,
                              .alloc = be->alloc,
                              .free = be->free,
                              .fill_zero = be->fill_zero,
                              .to_host = be->to_host,
                              .to_device = be->to_device,
                              .adamw_step = be->adamw_step,
                              .gemm = ctrl_backend_has(be, gemm) ? be->gemm : NULL};
    return &k;
}

static const ctrl_host host = {
    .size = sizeof(ctrl_host),
    .abi = CTRL_PLUGIN_ABI,
    .log = host_log,
    .error_set = host_error_set,
    .config_get_string = ctrl_config_get_string,
    .config_get_int = ctrl_config_get_int,
    .config_get_float = ctrl_config_get_float,
    .config_get_bool = ctrl_config_get_bool,
#ifdef CTRL_HAVE_CUDA
    .has_cuda = 1,
#endif
    .option_string = host_option_string,
    .option_int = host_option_int,
    .option_float = host_option_float,
    .option_bool = host_option_bool,
    .error_wrap = host_error_wrap,
    .score_model_open = ctrl_score_model_open,
    .score_model_score = ctrl_score_model_score,
    .score_model_close = ctrl_score_model_close,
    .device_kernels = host_device_kernels,
    .score_model_chat_text = ctrl_score_model_chat_text,
};

const ctrl_host *ctrl_host_table(void) { return &host; }
