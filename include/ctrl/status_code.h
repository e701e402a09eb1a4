/* ctrl_status: what every fallible function of the core and of a plugin returns. Types only, so
 * that plugins include it without seeing libctrl's functions (the message functions are in
 * status.h for libctrl's users, and reach a plugin through the host table: plugin_api.h). */
#ifndef CTRL_STATUS_CODE_H
#define CTRL_STATUS_CODE_H

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

#ifdef __cplusplus
}
#endif
#endif
