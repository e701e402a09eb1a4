/* Read access to a validated run configuration. Values are typed per the option tables; every
 * declared key has a value after validation (its default) unless it has no default and is absent. */
#ifndef CTRL_CONFIG_H
#define CTRL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ctrl_config ctrl_config;

/* NULL when the key is absent and has no default. */
const char *ctrl_config_get_string(const ctrl_config *cfg, const char *section, const char *key);
int64_t ctrl_config_get_int(const ctrl_config *cfg, const char *section, const char *key, int64_t fallback);
double ctrl_config_get_float(const ctrl_config *cfg, const char *section, const char *key, double fallback);
bool ctrl_config_get_bool(const ctrl_config *cfg, const char *section, const char *key, bool fallback);
bool ctrl_config_has(const ctrl_config *cfg, const char *section, const char *key);
/* "file:line" where the key was set ("--set" for overrides, "default" for defaults). */
const char *ctrl_config_where(const ctrl_config *cfg, const char *section, const char *key);

#ifdef __cplusplus
}
#endif
#endif
