/* ctrl_status: every fallible function returns one; the message lives in a thread-local buffer. */
#ifndef CTRL_STATUS_H
#define CTRL_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ctrl_status {
    CTRL_OK = 0,
    CTRL_ERR_USAGE,       /* bad command line */
    CTRL_ERR_CONFIG,      /* bad INI file or --set override */
    CTRL_ERR_IO,          /* a file could not be read or written */
    CTRL_ERR_FORMAT,      /* a file was read but its content is invalid */
    CTRL_ERR_PLUGIN,      /* a plugin could not be loaded or failed to initialise */
    CTRL_ERR_NOMEM,       /* an allocation failed */
    CTRL_ERR_DEVICE,      /* a device (CUDA, ...) call failed or the device is absent */
    CTRL_ERR_RUNTIME,     /* anything else that went wrong while working */
    CTRL_ERR_INTERRUPTED, /* SIGINT/SIGTERM */
    CTRL_ERR_UNSUPPORTED, /* a feature this build or plugin does not provide */
} ctrl_status;

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
