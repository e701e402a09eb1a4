/* Internals of the config module shared by its files (not for other modules). */
#ifndef CTRL_CORE_CONFIG_INTERNAL_H
#define CTRL_CORE_CONFIG_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config_load.h"

/* One key as it appears in the file (or a --set, or a filled-in default). */
typedef struct config_entry {
    char *section;
    char *key;
    char *value;
    char *where; /* "file:line", "--set section.key" or "default" */
    int line;    /* 0 for --set and defaults */
} config_entry;

/* A section header as it appears in the file. */
typedef struct config_section_seen {
    char *name;
    int line;    /* 0 for a section that only --set created */
    char *where; /* "file:line", or "--set section.key" of the override that created it */
} config_section_seen;

struct ctrl_config {
    char *path;
    char *file_name; /* basename used in messages */
    config_entry *entries;
    int n, cap;
    config_section_seen *sections;
    int n_sections, cap_sections;
    ctrl_run_plugins plugins;   /* resolved by config_validate */
    ctrl_run_settings settings; /* filled by config_settings_fill once valid */
    char **asked;               /* "section\x1fkey" of every key a reader asked for (config_note_read) */
    int n_asked, cap_asked;
};

/* Reads `path` with a line scanner (for line numbers, syntax and duplicate checks) and iniparser
 * (for the values); fills cfg->entries and cfg->sections. */
ctrl_status config_read_file(ctrl_config *cfg, const char *path);
/* s without its leading and trailing white space (cut in place). */
char *config_trim(char *s);

/* Adds or replaces an entry; copies the strings. */
ctrl_status config_put(ctrl_config *cfg, const char *section, const char *key, const char *value,
                       const char *where, int line);
/* Records a section header (line 0 for one created by --set); duplicates are the caller's check. */
ctrl_status config_add_section(ctrl_config *cfg, const char *name, const char *where, int line);
config_entry *config_find(const ctrl_config *cfg, const char *section, const char *key);
/* Records that a reader (the typed settings, validation, a plugin's accessor) asked for a key, set
 * or not; config_was_read answers for the test that no declared key lacks a reader. */
void config_note_read(const ctrl_config *cfg, const char *section, const char *key);
int config_was_read(const ctrl_config *cfg, const char *section, const char *key);
int config_has_section(const ctrl_config *cfg, const char *section);

/* Value parsing shared by validation and the accessors; 0 on success, -1 when the text is not a
 * number, -2 when it is one but does not fit (int64 overflow, a float beyond double's range). */
int config_parse_int(const char *s, int64_t *out);
int config_parse_float(const char *s, double *out);
int config_parse_bool(const char *s, bool *out);
/* Iterates the items of a list value ("a, b c"): start with *pos at the value; returns 1 with the
 * next item copied into word, 0 at the end, -1 for an item of cap bytes or more. */
int config_list_next(const char **pos, char *word, size_t cap);
/* 1 when `word` is one of the '|'-separated `choices`. */
int config_choice_ok(const char *choices, const char *word);

/* Checks one entry's value against its option (type, range, choices); CTRL_ERR_CONFIG with a
 * message naming e->where, the section and the key. */
ctrl_status config_check_value(const config_entry *e, const ctrl_option *o);

/* The closest of `candidates` to `word` (edit distance ≤ max(2, len/3)), or NULL. */
const char *config_suggest(const char *word, const char *const *candidates, int n);
/* ctrl's name for a TRL / transformers setting (trl_names.c), or NULL. */
const char *config_trl_name_hint(const char *key);

/* The option tables of the core's sections and of the reward-instance header keys. */
extern const ctrl_option config_reward_instance_options[];

/* Problems found while validating, reported together in one message (one line each, in file
 * order, --set overrides last). */
#define CONFIG_MAX_PROBLEMS 12
typedef struct config_problems {
    int n; /* found; only the first CONFIG_MAX_PROBLEMS are kept */
    ctrl_status status;
    char text[CONFIG_MAX_PROBLEMS][400];
} config_problems;
/* Records ctrl_error_message() as one problem of `status`. */
void config_problem_note(config_problems *p, ctrl_status status);
/* CTRL_OK when there were none; else the first problem's status with every message joined. */
ctrl_status config_problems_report(config_problems *p, const char *file_name);

/* The plugins a config selects, from its values or the defaults. */
#define CONFIG_MAX_MEMORY CTRL_RUN_MAX_MEMORY
typedef ctrl_run_plugins config_selection;

/* The typed settings of a validated config (settings.c). */
ctrl_status config_settings_fill(ctrl_config *cfg);
/* [peft]'s target_modules_regex, exclude_modules(_regex), layers_to_transform, layers_pattern, rank_pattern
 * and alpha_pattern, checked, into s->peft.choices (settings_peft.c; NULL when none is set). */
ctrl_status settings_read_peft_choices(const ctrl_config *cfg, ctrl_run_settings *s);

/* Helpers of validation shared by validate.c and plugin_sections.c. */
const ctrl_option *config_core_table(const char *section);
const ctrl_option *config_find_option(const ctrl_option *opts, const char *key);
/* The value of a key, else its declared default in `opts`, else NULL. */
const char *config_value_or_default(const ctrl_config *cfg, const char *section, const ctrl_option *opts,
                                    const char *key);
/* A plugin name given by [section] key: it must be loaded, with `kind`. */
ctrl_status config_check_plugin_name(const ctrl_config *cfg, const ctrl_registry *reg, ctrl_kind kind,
                                     const char *section, const char *key, const char *name,
                                     const ctrl_plugin **out);
/* Checks every key of one section against up to two tables; notes each problem. */
void config_check_section_keys(const ctrl_config *cfg, const char *section, const ctrl_option *t1,
                               const ctrl_option *t2, const char *owner, config_problems *pr);
/* The plugin whose options a section that is neither core nor [reward.*] holds, or an error
 * saying why the section does not belong (not selected, or unknown with a did-you-mean). */
ctrl_status config_plugin_section(const ctrl_config *cfg, const ctrl_registry *reg,
                                  const config_selection *sel, const config_section_seen *sec,
                                  const ctrl_plugin **out);
/* [reward.NAME]: its plugin (NULL when the section is wrong; problems noted) and its keys. */
const ctrl_plugin *config_check_reward_section(const ctrl_config *cfg, const ctrl_registry *reg,
                                               const config_section_seen *sec, config_problems *pr);

/* Runs every selected plugin's check_options (plugin.h) on the validated values; notes each
 * refusal, located at the key its message names (plugin_checks.c). */
void config_check_plugin_options(const ctrl_config *cfg, const config_selection *sel, config_problems *pr);

/* Validates every entry and fills defaults; messages name file:line and the key. */
ctrl_status config_validate(ctrl_config *cfg, const ctrl_registry *reg);

#endif
