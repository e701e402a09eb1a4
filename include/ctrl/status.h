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

/* Appends "; " and the text to the current message (for what is left to do after a failure). */
ctrl_status ctrl_error_append(ctrl_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* A status and the thread's message, kept while other work may overwrite the message: cleanup
 * after a failure (saving what can be saved), or attempts that go on after the first failure.
 *   ctrl_error_saved first = {CTRL_OK};
 *   for (...) if ((st = attempt()) != CTRL_OK && first.status == CTRL_OK) ctrl_error_save(&first, st);
 *   return ctrl_error_restore(&first);                                                              */
typedef struct ctrl_error_saved {
    ctrl_status status;
    char message[4096];
} ctrl_error_saved;
/* Keeps `status` and, unless it is CTRL_OK, the current message. */
void ctrl_error_save(ctrl_error_saved *saved, ctrl_status status);
/* Puts the kept message back (nothing for CTRL_OK) and returns the kept status. */
ctrl_status ctrl_error_restore(const ctrl_error_saved *saved);

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
