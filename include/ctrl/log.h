/* Logging: levels, timestamps, and a prefix hook (the rank in distributed runs). */
#ifndef CTRL_LOG_H
#define CTRL_LOG_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ctrl_log_level {
    CTRL_LOG_TRACE = 0,
    CTRL_LOG_DEBUG,
    CTRL_LOG_INFO,
    CTRL_LOG_WARN,
    CTRL_LOG_ERROR,
    CTRL_LOG_OFF,
} ctrl_log_level;

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

#define CTRL_TRACE(...) ctrl_log(CTRL_LOG_TRACE, __VA_ARGS__)
#define CTRL_DEBUG(...) ctrl_log(CTRL_LOG_DEBUG, __VA_ARGS__)
#define CTRL_INFO(...) ctrl_log(CTRL_LOG_INFO, __VA_ARGS__)
#define CTRL_WARN(...) ctrl_log(CTRL_LOG_WARN, __VA_ARGS__)
#define CTRL_ERROR(...) ctrl_log(CTRL_LOG_ERROR, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
