/* Read access to a validated run configuration. Values are typed per the option tables; every
 * declared key has a value after validation (its default) unless it has no default and is absent. */
#ifndef CTRL_CONFIG_H
#define CTRL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
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
/* Where the value came from: "file:line", "--set section.key" for an override, "default". */
const char *ctrl_config_where(const ctrl_config *cfg, const char *section, const char *key);

/* Sections holding at least one value, in the order their first value was set: the file's order,
 * then --set, then sections filled with defaults only. For finding every [reward.NAME]. */
int ctrl_config_section_count(const ctrl_config *cfg);
const char *ctrl_config_section_at(const ctrl_config *cfg, int index); /* NULL when out of range */

/* A list value ("checkpointing, offload"): items separated by commas and/or blanks. */
int ctrl_config_list_count(const ctrl_config *cfg, const char *section, const char *key);
/* Copies item `index` into buf and returns buf; NULL when absent or longer than cap - 1. */
const char *ctrl_config_list_item(const ctrl_config *cfg, const char *section, const char *key, int index,
                                  char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
