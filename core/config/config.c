/* The run configuration: loading (read, apply --set, validate) and the typed accessors of
 * include/ctrl/config.h. Every declared key has a value after loading (its default) unless it
 * has no default and is absent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

config_entry *config_find(const ctrl_config *cfg, const char *section, const char *key) {
    if (!cfg) return NULL;
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

ctrl_status config_add_section(ctrl_config *cfg, const char *name, int line) {
    if (cfg->n_sections == cfg->cap_sections) {
        int cap = cfg->cap_sections ? cfg->cap_sections * 2 : 16;
        config_section_seen *s = realloc(cfg->sections, (size_t)cap * sizeof *s);
        if (!s) return ctrl_error_set(CTRL_ERR_NOMEM, "config: out of memory");
        cfg->sections = s;
        cfg->cap_sections = cap;
    }
    cfg->sections[cfg->n_sections].name = strdup(name);
    cfg->sections[cfg->n_sections].line = line;
    cfg->n_sections++;
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
    for (int i = 0; i < cfg->n_sections; i++) free(cfg->sections[i].name);
    free(cfg->entries);
    free(cfg->sections);
    free(cfg->path);
    free(cfg->file_name);
    free(cfg);
}

/* "section.key=value": the section is everything before the last dot of the left side, so that
 * reward.NAME.weight=2 addresses [reward.NAME]. */
static ctrl_status apply_override(ctrl_config *cfg, const char *spec) {
    const char *eq = strchr(spec, '=');
    if (!eq) return ctrl_error_set(CTRL_ERR_CONFIG, "--set %s: expected section.key=value", spec);
    size_t lhs_len = (size_t)(eq - spec);
    char lhs[512];
    if (lhs_len == 0 || lhs_len >= sizeof lhs)
        return ctrl_error_set(CTRL_ERR_CONFIG, "--set %s: expected section.key=value", spec);
    memcpy(lhs, spec, lhs_len);
    lhs[lhs_len] = '\0';
    char *dot = strrchr(lhs, '.');
    if (!dot || dot == lhs || !dot[1])
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "--set %s: expected section.key=value (the key needs its section)", spec);
    *dot = '\0';
    for (char *c = lhs; *c; c++)
        if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
    for (char *c = dot + 1; *c; c++)
        if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
    char where[600];
    snprintf(where, sizeof where, "--set %s.%s", lhs, dot + 1);
    /* An override may create a section the file does not have. */
    if (!config_has_section(cfg, lhs)) {
        ctrl_status st = config_add_section(cfg, lhs, 0);
        if (st != CTRL_OK) return st;
    }
    return config_put(cfg, lhs, dot + 1, eq + 1, where, 0);
}

ctrl_status ctrl_config_load(const char *path, const char *const *overrides, int n_overrides,
                             const ctrl_registry *reg, ctrl_config **out) {
    *out = NULL;
    ctrl_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg) return ctrl_error_set(CTRL_ERR_NOMEM, "config: out of memory");
    cfg->path = strdup(path);
    /* Messages use the path as given: that is what the user typed and can open. */
    cfg->file_name = strdup(path);
    ctrl_status st = config_read_file(cfg, path);
    for (int i = 0; st == CTRL_OK && i < n_overrides; i++) st = apply_override(cfg, overrides[i]);
    if (st == CTRL_OK) st = config_validate(cfg, reg);
    if (st != CTRL_OK) {
        ctrl_config_free(cfg);
        return st;
    }
    *out = cfg;
    return CTRL_OK;
}

/* ---- public accessors ---------------------------------------------------------------------- */

const char *ctrl_config_get_string(const ctrl_config *cfg, const char *section, const char *key) {
    config_entry *e = config_find(cfg, section, key);
    return e ? e->value : NULL;
}

int64_t ctrl_config_get_int(const ctrl_config *cfg, const char *section, const char *key, int64_t fallback) {
    config_entry *e = config_find(cfg, section, key);
    int64_t v;
    return (e && e->value[0] && config_parse_int(e->value, &v) == 0) ? v : fallback;
}

double ctrl_config_get_float(const ctrl_config *cfg, const char *section, const char *key, double fallback) {
    config_entry *e = config_find(cfg, section, key);
    double v;
    return (e && e->value[0] && config_parse_float(e->value, &v) == 0) ? v : fallback;
}

bool ctrl_config_get_bool(const ctrl_config *cfg, const char *section, const char *key, bool fallback) {
    config_entry *e = config_find(cfg, section, key);
    bool v;
    return (e && config_parse_bool(e->value, &v) == 0) ? v : fallback;
}

bool ctrl_config_has(const ctrl_config *cfg, const char *section, const char *key) {
    return config_find(cfg, section, key) != NULL;
}

const char *ctrl_config_where(const ctrl_config *cfg, const char *section, const char *key) {
    config_entry *e = config_find(cfg, section, key);
    return e ? e->where : NULL;
}
