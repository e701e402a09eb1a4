#ifndef CTRL_VERSION_H
#define CTRL_VERSION_H

#define CTRL_VERSION_MAJOR 0
#define CTRL_VERSION_MINOR 1
#define CTRL_VERSION_PATCH 0
#define CTRL_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif
const char *ctrl_version(void);
#ifdef __cplusplus
}
#endif
#endif
