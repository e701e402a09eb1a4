/* Loading and validating a run configuration (internal to the core and the CLI). The public,
 * read-only accessors are in include/ctrl/config.h. */
#ifndef CTRL_CORE_CONFIG_LOAD_H
#define CTRL_CORE_CONFIG_LOAD_H

#include <stdio.h>

#include <ctrl/config.h>
#include <ctrl/option.h>

#include "registry.h"

/* Parses `path` (iniparser), applies `overrides` ("section.key=value", from --set), and validates
 * every section and key against the core's option tables and the options of the plugins the
 * config selects (which must be in `reg`). Any problem is CTRL_ERR_CONFIG (CTRL_ERR_IO for an
 * unreadable file) with a message naming file:line and the key, and a did-you-mean where one fits.
 * Defaults are filled in. */
ctrl_status ctrl_config_load(const char *path, const char *const *overrides, int n_overrides,
                             const ctrl_registry *reg, ctrl_config **out);
void ctrl_config_free(ctrl_config *cfg);

/* Writes the effective config (every section in use, defaults filled in) as INI. */
ctrl_status ctrl_config_write_effective(const ctrl_config *cfg, const char *path);

/* The core's own sections, NULL-terminated: {"run", run_options}, ... */
typedef struct ctrl_config_section {
    const char *name;
    const char *doc;
    const ctrl_option *options;
} ctrl_config_section;
const ctrl_config_section *ctrl_config_core_sections(void);

/* Prints one option table as aligned text (for `ctrl plugins describe`). */
void ctrl_option_table_print(FILE *out, const ctrl_option *options);

/* Writes docs/config-reference.md's content: core sections, then every plugin's options. */
ctrl_status ctrl_config_reference_write(const ctrl_registry *reg, FILE *out);

#endif
