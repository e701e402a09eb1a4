/* libctrl's error messages: every fallible function returns a ctrl_status (status_code.h); the
 * message lives in a thread-local buffer. For libctrl's users (the CLI, tests): a plugin reports
 * errors through the host table (plugin_api.h), never by linking these. */
#ifndef CTRL_STATUS_H
#define CTRL_STATUS_H

#include "status_code.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the calling thread's error message (printf-style) and returns `status`, so that
 * `return ctrl_error_set(CTRL_ERR_IO, "%s: %s", path, strerror(errno));` reads naturally. */
ctrl_status ctrl_error_set(ctrl_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Prefixes the current message with "context: " (for adding a file name or step on the way up). */
ctrl_status ctrl_error_wrap(ctrl_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The calling thread's last message ("" when none). */
const char *ctrl_error_message(void);
void ctrl_error_clear(void);

/* A short name for a status ("config error", ...). */
const char *ctrl_status_name(ctrl_status status);

/* The process exit code for a status: 0 ok, 2 usage/config, 130 interrupted, 1 otherwise. */
int ctrl_status_exit_code(ctrl_status status);

#ifdef __cplusplus
}
#endif
#endif
