/* The plugin registry (internal to the core and the CLI). Loads every .so in each plugin
 * directory with libltdl, checks the ABI, and registers descriptors by (kind, name). */
#ifndef CTRL_CORE_REGISTRY_H
#define CTRL_CORE_REGISTRY_H

#include <ctrl/config.h>
#include <ctrl/log.h>
#include <ctrl/plugin.h>
#include <ctrl/status.h>

typedef struct ctrl_registry ctrl_registry;

typedef struct ctrl_plugin_entry {
    const ctrl_plugin *plugin;
    const char *file; /* the .so it came from, or "<static:NAME>" for linked-in lists */
} ctrl_plugin_entry;

ctrl_status ctrl_registry_create(ctrl_registry **out);
void ctrl_registry_destroy(ctrl_registry *reg);

/* Loads every shared object in `dir` (sorted by file name). Files that fail are reported through
 * the log, one clear message naming the file each; loading goes on with the others. Returns the
 * first failure's status (its message in ctrl_error_message()), or CTRL_OK. */
ctrl_status ctrl_registry_load_dir(ctrl_registry *reg, const char *dir);

/* Loads one shared object. */
ctrl_status ctrl_registry_load_file(ctrl_registry *reg, const char *path);

/* The standard search: each of `dirs` (the --plugin-dir list, in order), then every directory of
 * CTRL_PLUGIN_PATH (colon-separated), then the install directory. Directories that do not exist
 * are skipped, except those in `dirs`, which are an error. */
ctrl_status ctrl_registry_load_standard(ctrl_registry *reg, const char *const *dirs, int n_dirs);

/* Registers a list returned by a statically linked plugin's entry function. */
ctrl_status ctrl_registry_add_list(ctrl_registry *reg, const ctrl_plugin *const *list, const char *origin);

int ctrl_registry_count(const ctrl_registry *reg);
/* Entries sorted by kind, then name. */
const ctrl_plugin_entry *ctrl_registry_at(const ctrl_registry *reg, int i);
const ctrl_plugin_entry *ctrl_registry_find(const ctrl_registry *reg, ctrl_kind kind, const char *name);
/* The plugin (kind, name), or an error naming it "not loaded (see --plugin-dir)": for commands
 * that choose a plugin without a run config (ctrl generate, ctrl serve); a run config's plugins are
 * resolved by ctrl_config_load (ctrl_config_plugins). */
ctrl_status ctrl_registry_require(const ctrl_registry *reg, ctrl_kind kind, const char *name,
                                  const ctrl_plugin **out);
/* "eager, flash" — the names of one kind, for error messages. */
void ctrl_registry_names(const ctrl_registry *reg, ctrl_kind kind, char *buf, size_t cap);

/* The host table lent to plugins. */
const ctrl_host *ctrl_host_table(void);

/* Parses "attention" etc.; -1 when unknown. */
int ctrl_kind_parse(const char *name);

#endif
