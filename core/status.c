/* ctrl_status messages: one thread-local buffer, set where an error is found and wrapped with
 * context on the way up. */
#include <ctrl/status.h>

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define CTRL_ERROR_CAP 4096

static _Thread_local char error_buf[CTRL_ERROR_CAP];

ctrl_status ctrl_error_set(ctrl_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_buf, sizeof error_buf, fmt, ap);
    va_end(ap);
    return status;
}

ctrl_status ctrl_error_wrap(ctrl_status status, const char *fmt, ...) {
    char prefix[1024];
    char old[CTRL_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, error_buf, sizeof old);
    /* Truncation of very long messages is intended; built by hand to keep -Wformat-truncation quiet. */
    size_t n = strlen(prefix);
    memcpy(error_buf, prefix, n + 1);
    if (old[0] && n + 2 < sizeof error_buf) {
        memcpy(error_buf + n, ": ", 3);
        n += 2;
        size_t m = strlen(old);
        if (m > sizeof error_buf - 1 - n) m = sizeof error_buf - 1 - n;
        memcpy(error_buf + n, old, m);
        error_buf[n + m] = '\0';
    }
    return status;
}

ctrl_status ctrl_error_append(ctrl_status status, const char *fmt, ...) {
    const size_t n = strlen(error_buf);
    if (n + 2 >= sizeof error_buf) return status;
    memcpy(error_buf + n, "; ", 3);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_buf + n + 2, sizeof error_buf - n - 2, fmt, ap);
    va_end(ap);
    return status;
}

_Static_assert(sizeof(((ctrl_error_saved *)0)->message) == CTRL_ERROR_CAP,
               "a saved message holds any message");

void ctrl_error_save(ctrl_error_saved *saved, ctrl_status status) {
    saved->status = status;
    if (status != CTRL_OK) memcpy(saved->message, error_buf, sizeof error_buf);
}

ctrl_status ctrl_error_restore(const ctrl_error_saved *saved) {
    if (saved->status != CTRL_OK) memcpy(error_buf, saved->message, sizeof error_buf);
    return saved->status;
}

const char *ctrl_error_message(void) { return error_buf; }

void ctrl_error_clear(void) { error_buf[0] = '\0'; }

const char *ctrl_status_name(ctrl_status status) {
    switch (status) {
    case CTRL_OK: return "ok";
    case CTRL_ERR_USAGE: return "usage error";
    case CTRL_ERR_CONFIG: return "config error";
    case CTRL_ERR_IO: return "I/O error";
    case CTRL_ERR_FORMAT: return "format error";
    case CTRL_ERR_PLUGIN: return "plugin error";
    case CTRL_ERR_NOMEM: return "out of memory";
    case CTRL_ERR_DEVICE: return "device error";
    case CTRL_ERR_RUNTIME: return "run-time error";
    case CTRL_ERR_INTERRUPTED: return "interrupted";
    case CTRL_ERR_UNSUPPORTED: return "unsupported";
    }
    return "unknown error";
}

int ctrl_status_exit_code(ctrl_status status) {
    switch (status) {
    case CTRL_OK: return 0;
    case CTRL_ERR_USAGE:
    case CTRL_ERR_CONFIG: return 2;
    case CTRL_ERR_INTERRUPTED: return 130;
    default: return 1;
    }
}
