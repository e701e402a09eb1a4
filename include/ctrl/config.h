/* libctrl's read access to a validated run configuration (ctrl_config, option.h). Values are typed
 * per the option tables; every declared key has a value after validation (its default) unless it
 * has no default and is absent. For libctrl's users; a plugin reads through the host table. */
#ifndef CTRL_CONFIG_H
#define CTRL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "option.h"
#include "status_code.h"

#ifdef __cplusplus
extern "C" {
#endif

/* NULL when the key is absent and has no default. */
const char *ctrl_config_get_string(const ctrl_config *cfg, const char *section, const char *key);
int64_t ctrl_config_get_int(const ctrl_config *cfg, const char *section, const char *key, int64_t fallback);
double ctrl_config_get_float(const ctrl_config *cfg, const char *section, const char *key, double fallback);
bool ctrl_config_get_bool(const ctrl_config *cfg, const char *section, const char *key, bool fallback);
/* The value of a key that must have one: a declared option, after validation, holds the file's
 * value or its default, so these read it without restating a default. CTRL_ERR_CONFIG naming
 * [section] key when the key has no value (undeclared, or declared without a default and absent) or
 * is not of the type read; *out is left alone then. */
ctrl_status ctrl_config_require_string(const ctrl_config *cfg, const char *section, const char *key,
                                       const char **out);
ctrl_status ctrl_config_require_int(const ctrl_config *cfg, const char *section, const char *key,
                                    int64_t *out);
ctrl_status ctrl_config_require_float(const ctrl_config *cfg, const char *section, const char *key,
                                      double *out);
ctrl_status ctrl_config_require_bool(const ctrl_config *cfg, const char *section, const char *key, bool *out);
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
