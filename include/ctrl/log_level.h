/* Log levels, and the CTRL_INFO(...)-style shorthands. Types only: `ctrl_log` is libctrl's
 * function for libctrl's users (log.h) and the host table's for a plugin (plugin_api.h), so the
 * shorthands work in both. */
#ifndef CTRL_LOG_LEVEL_H
#define CTRL_LOG_LEVEL_H

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

#define CTRL_TRACE(...) ctrl_log(CTRL_LOG_TRACE, __VA_ARGS__)
#define CTRL_DEBUG(...) ctrl_log(CTRL_LOG_DEBUG, __VA_ARGS__)
#define CTRL_INFO(...) ctrl_log(CTRL_LOG_INFO, __VA_ARGS__)
#define CTRL_WARN(...) ctrl_log(CTRL_LOG_WARN, __VA_ARGS__)
#define CTRL_ERROR(...) ctrl_log(CTRL_LOG_ERROR, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
