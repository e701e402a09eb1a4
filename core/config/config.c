/* The run configuration: loading (read the file, apply --set overrides, validate) and the entry
 * store the other config files share. Every declared key has a value after loading (its default)
 * unless it has no default and is absent. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

config_entry *config_find(const ctrl_config *cfg, const char *section, const char *key) {
    if (!cfg || !section || !key) return NULL;
    for (int i = 0; i < cfg->n; i++)
        if (!strcmp(cfg->entries[i].section, section) && !strcmp(cfg->entries[i].key, key))
            return &cfg->entries[i];
    return NULL;
}

int config_has_section(const ctrl_config *cfg, const char *section) {
    for (int i = 0; i < cfg->n_sections; i++)
        if (!strcmp(cfg->sections[i].name, section)) return 1;
    return 0;
}

ctrl_status config_add_section(ctrl_config *cfg, const char *name, const char *where, int line) {
    if (cfg->n_sections == cfg->cap_sections) {
        int cap = cfg->cap_sections ? cfg->cap_sections * 2 : 16;
        config_section_seen *s = realloc(cfg->sections, (size_t)cap * sizeof *s);
        if (!s) return ctrl_error_set(CTRL_ERR_NOMEM, "config: out of memory");
        cfg->sections = s;
        cfg->cap_sections = cap;
    }
    config_section_seen *sec = &cfg->sections[cfg->n_sections++];
    sec->name = strdup(name);
    sec->where = strdup(where);
    sec->line = line;
    if (!sec->name || !sec->where) return ctrl_error_set(CTRL_ERR_NOMEM, "config: out of memory");
    return CTRL_OK;
}

ctrl_status config_put(ctrl_config *cfg, const char *section, const char *key, const char *value,
                       const char *where, int line) {
    config_entry *e = config_find(cfg, section, key);
    if (!e) {
        if (cfg->n == cfg->cap) {
            int cap = cfg->cap ? cfg->cap * 2 : 32;
            config_entry *ne = realloc(cfg->entries, (size_t)cap * sizeof *ne);
            if (!ne) return ctrl_error_set(CTRL_ERR_NOMEM, "config: out of memory");
            cfg->entries = ne;
            cfg->cap = cap;
        }
        e = &cfg->entries[cfg->n++];
        memset(e, 0, sizeof *e);
        e->section = strdup(section);
        e->key = strdup(key);
    }
    free(e->value);
    free(e->where);
    e->value = strdup(value);
    e->where = strdup(where);
    e->line = line;
    if (!e->section || !e->key || !e->value || !e->where)
        return ctrl_error_set(CTRL_ERR_NOMEM, "config: out of memory");
    return CTRL_OK;
}

void ctrl_config_free(ctrl_config *cfg) {
    if (!cfg) return;
    for (int i = 0; i < cfg->n; i++) {
        free(cfg->entries[i].section);
        free(cfg->entries[i].key);
        free(cfg->entries[i].value);
        free(cfg->entries[i].where);
    }
    for (int i = 0; i < cfg->n_sections; i++) {
        free(cfg->sections[i].name);
        free(cfg->sections[i].where);
    }
    for (int i = 0; i < cfg->n_asked; i++) free(cfg->asked[i]);
    free(cfg->settings.peft.choices);
    free(cfg->asked);
    free(cfg->entries);
    free(cfg->sections);
    free(cfg->path);
    free(cfg->file_name);
    free(cfg);
}

/* Section and key names follow the file's rules: letters, digits, '_', '-', '.'; lower-cased as
 * iniparser lower-cases the file's names. 0 when the name is empty or has another character. */
static int name_ok_lower(char *name) {
    if (!*name) return 0;
    for (char *c = name; *c; c++) {
        if (!(isalnum((unsigned char)*c) || *c == '_' || *c == '-' || *c == '.')) return 0;
        *c = (char)tolower((unsigned char)*c);
    }
    return 1;
}

/* "section.key=value": the section is everything before the last dot of the left side, so that
 * reward.NAME.weight=2 addresses [reward.NAME]. Spaces around the name and the value are dropped,
 * as in the file; the value is taken literally otherwise (the shell has removed any quotes). */
static ctrl_status apply_override(ctrl_config *cfg, const char *spec) {
    if (!spec) return ctrl_error_set(CTRL_ERR_CONFIG, "--set: missing override");
    const char *eq = strchr(spec, '=');
    if (!eq) return ctrl_error_set(CTRL_ERR_CONFIG, "--set %s: expected section.key=value", spec);
    size_t lhs_len = (size_t)(eq - spec);
    char buf[512];
    if (lhs_len >= sizeof buf)
        return ctrl_error_set(CTRL_ERR_CONFIG, "--set %.60s...: the name is too long", spec);
    memcpy(buf, spec, lhs_len);
    buf[lhs_len] = '\0';
    char *lhs = config_trim(buf);
    char *dot = strrchr(lhs, '.');
    if (!*lhs || !dot || dot == lhs || !dot[1])
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "--set %s: expected section.key=value (the key needs its section)", spec);
    *dot = '\0';
    char *section = lhs, *key = dot + 1;
    if (!name_ok_lower(section) || !name_ok_lower(key))
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "--set %s: section and key names use letters, digits, '_', '-' and '.' only",
                              spec);
    for (const char *c = eq + 1; *c; c++)
        if (iscntrl((unsigned char)*c) && *c != '\t')
            return ctrl_error_set(CTRL_ERR_CONFIG,
                                  "--set %s.%s: the value contains a control character (a newline?)", section,
                                  key);
    size_t vlen = strlen(eq + 1);
    char *value = malloc(vlen + 1);
    if (!value) return ctrl_error_set(CTRL_ERR_NOMEM, "config: out of memory");
    memcpy(value, eq + 1, vlen + 1);
    char where[600];
    snprintf(where, sizeof where, "--set %s.%s", section, key);
    ctrl_status st = CTRL_OK;
    /* An override may create a section the file does not have; it is reported as that --set. */
    if (!config_has_section(cfg, section)) st = config_add_section(cfg, section, where, 0);
    if (st == CTRL_OK) st = config_put(cfg, section, key, config_trim(value), where, 0);
    free(value);
    return st;
}

ctrl_status ctrl_config_load(const char *path, const char *const *overrides, int n_overrides,
                             const ctrl_registry *reg, ctrl_config **out) {
    if (!out) return ctrl_error_set(CTRL_ERR_USAGE, "ctrl_config_load: no output pointer");
    *out = NULL;
    if (!path || !path[0]) return ctrl_error_set(CTRL_ERR_USAGE, "no config file given");
    if (!reg) return ctrl_error_set(CTRL_ERR_USAGE, "ctrl_config_load: no plugin registry");
    if (n_overrides > 0 && !overrides)
        return ctrl_error_set(CTRL_ERR_USAGE, "ctrl_config_load: no overrides");
    ctrl_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg) return ctrl_error_set(CTRL_ERR_NOMEM, "config: out of memory");
    cfg->path = strdup(path);
    /* Messages use the path as given: that is what the user typed and can open. */
    cfg->file_name = strdup(path);
    ctrl_status st = (cfg->path && cfg->file_name) ? config_read_file(cfg, path)
                                                   : ctrl_error_set(CTRL_ERR_NOMEM, "config: out of memory");
    for (int i = 0; st == CTRL_OK && i < n_overrides; i++) st = apply_override(cfg, overrides[i]);
    if (st == CTRL_OK) st = config_validate(cfg, reg);
    if (st != CTRL_OK) {
        ctrl_config_free(cfg);
        return st;
    }
    *out = cfg;
    return CTRL_OK;
}
