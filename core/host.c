/* The ctrl_host table lent to plugins: the core's services behind stable function pointers, so
 * that a plugin needs only the public headers and never links against libctrl's internals. */
#include <stdarg.h>
#include <stdio.h>

#include "registry.h"

static void host_log(ctrl_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ctrl_logv(level, fmt, ap);
    va_end(ap);
}

static ctrl_status host_error_set(ctrl_status status, const char *fmt, ...) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return ctrl_error_set(status, "%s", buf);
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
};

const ctrl_host *ctrl_host_table(void) { return &host; }
