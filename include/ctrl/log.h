/* libctrl's logging: levels (log_level.h), timestamps, and a prefix hook (the rank in distributed
 * runs). For libctrl's users; a plugin logs through the host table (plugin_api.h). */
#ifndef CTRL_LOG_H
#define CTRL_LOG_H

#include <stdarg.h>

#include "log_level.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes the prefix for each line (e.g. "[rank 3] ") into buf; returns the length written. */
typedef int (*ctrl_log_prefix_fn)(char *buf, int cap, void *user);

void ctrl_log_set_level(ctrl_log_level level);
ctrl_log_level ctrl_log_get_level(void);
/* Parses "trace|debug|info|warn|error|off"; returns 0 on success, -1 when unknown. */
int ctrl_log_level_parse(const char *name, ctrl_log_level *out);
const char *ctrl_log_level_name(ctrl_log_level level);
void ctrl_log_set_prefix(ctrl_log_prefix_fn fn, void *user);

void ctrl_log(ctrl_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void ctrl_logv(ctrl_log_level level, const char *fmt, va_list ap);

#ifdef __cplusplus
}
#endif
#endif
