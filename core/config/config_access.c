/* The typed read accessors of include/ctrl/config.h over a validated config. Values were checked
 * against their options when loading, so a typed read of a declared key does not fail; the
 * fallbacks cover undeclared keys and reads with the wrong type. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

/* config_find for a reader: notes that the key was asked for. */
static config_entry *consume(const ctrl_config *cfg, const char *section, const char *key) {
    config_note_read(cfg, section, key);
    return config_find(cfg, section, key);
}

const char *ctrl_config_get_string(const ctrl_config *cfg, const char *section, const char *key) {
    config_entry *e = consume(cfg, section, key);
    return e ? e->value : NULL;
}

int64_t ctrl_config_get_int(const ctrl_config *cfg, const char *section, const char *key, int64_t fallback) {
    config_entry *e = consume(cfg, section, key);
    int64_t v;
    return (e && e->value[0] && config_parse_int(e->value, &v) == 0) ? v : fallback;
}

double ctrl_config_get_float(const ctrl_config *cfg, const char *section, const char *key, double fallback) {
    config_entry *e = consume(cfg, section, key);
    double v;
    return (e && e->value[0] && config_parse_float(e->value, &v) == 0) ? v : fallback;
}

bool ctrl_config_get_bool(const ctrl_config *cfg, const char *section, const char *key, bool fallback) {
    config_entry *e = consume(cfg, section, key);
    bool v;
    return (e && config_parse_bool(e->value, &v) == 0) ? v : fallback;
}

/* The entry of a key that must have a value, or NULL with the error set. */
static config_entry *required(const ctrl_config *cfg, const char *section, const char *key) {
    config_entry *e = consume(cfg, section, key);
    if (!e)
        ctrl_error_set(CTRL_ERR_CONFIG,
                       "[%s] %s: has no value (read as a declared option, but no option table declares it "
                       "with a default and the file does not set it)",
                       section, key);
    return e;
}

static ctrl_status not_of_type(const config_entry *e, const char *type) {
    return ctrl_error_set(CTRL_ERR_CONFIG, "[%s] %s = %s (%s): read as %s", e->section, e->key, e->value,
                          e->where ? e->where : "?", type);
}

ctrl_status ctrl_config_require_string(const ctrl_config *cfg, const char *section, const char *key,
                                       const char **out) {
    config_entry *e = required(cfg, section, key);
    if (!e) return CTRL_ERR_CONFIG;
    *out = e->value;
    return CTRL_OK;
}

ctrl_status ctrl_config_require_int(const ctrl_config *cfg, const char *section, const char *key,
                                    int64_t *out) {
    config_entry *e = required(cfg, section, key);
    if (!e) return CTRL_ERR_CONFIG;
    return config_parse_int(e->value, out) == 0 ? CTRL_OK : not_of_type(e, "an integer");
}

ctrl_status ctrl_config_require_float(const ctrl_config *cfg, const char *section, const char *key,
                                      double *out) {
    config_entry *e = required(cfg, section, key);
    if (!e) return CTRL_ERR_CONFIG;
    return config_parse_float(e->value, out) == 0 ? CTRL_OK : not_of_type(e, "a number");
}

ctrl_status ctrl_config_require_bool(const ctrl_config *cfg, const char *section, const char *key,
                                     bool *out) {
    config_entry *e = required(cfg, section, key);
    if (!e) return CTRL_ERR_CONFIG;
    return config_parse_bool(e->value, out) == 0 ? CTRL_OK : not_of_type(e, "a boolean");
}

bool ctrl_config_has(const ctrl_config *cfg, const char *section, const char *key) {
    return consume(cfg, section, key) != NULL;
}

const char *ctrl_config_where(const ctrl_config *cfg, const char *section, const char *key) {
    config_entry *e = config_find(cfg, section, key);
    return e ? e->where : NULL;
}

int ctrl_config_section_count(const ctrl_config *cfg) {
    if (!cfg) return 0;
    int n = 0;
    for (int i = 0; i < cfg->n; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++)
            if (!strcmp(cfg->entries[j].section, cfg->entries[i].section)) first = 0;
        n += first;
    }
    return n;
}

const char *ctrl_config_section_at(const ctrl_config *cfg, int index) {
    if (!cfg || index < 0) return NULL;
    int n = 0;
    for (int i = 0; i < cfg->n; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++)
            if (!strcmp(cfg->entries[j].section, cfg->entries[i].section)) first = 0;
        if (first && n++ == index) return cfg->entries[i].section;
    }
    return NULL;
}

int ctrl_config_list_count(const ctrl_config *cfg, const char *section, const char *key) {
    config_entry *e = consume(cfg, section, key);
    if (!e) return 0;
    int n = 0;
    char word[8];
    for (const char *pos = e->value; config_list_next(&pos, word, sizeof word) != 0;) n++;
    return n;
}

const char *ctrl_config_list_item(const ctrl_config *cfg, const char *section, const char *key, int index,
                                  char *buf, size_t cap) {
    config_entry *e = consume(cfg, section, key);
    if (!e || index < 0 || !buf || !cap) return NULL;
    int n = 0, r;
    for (const char *pos = e->value; (r = config_list_next(&pos, buf, cap)) != 0;)
        if (n++ == index) return r > 0 ? buf : NULL;
    return NULL;
}

void config_note_read(const ctrl_config *cfg, const char *section, const char *key) {
    if (!cfg || !section || !key || config_was_read(cfg, section, key)) return;
    ctrl_config *c = (ctrl_config *)cfg; /* the read log is bookkeeping beside the values */
    if (c->n_asked == c->cap_asked) {
        const int cap = c->cap_asked ? 2 * c->cap_asked : 64;
        char **a = realloc(c->asked, sizeof *a * (size_t)cap);
        if (!a) return; /* only the test reads the log */
        c->asked = a, c->cap_asked = cap;
    }
    const size_t n = strlen(section) + strlen(key) + 2;
    char *name = malloc(n);
    if (!name) return;
    snprintf(name, n, "%s\x1f%s", section, key);
    c->asked[c->n_asked++] = name;
}

int config_was_read(const ctrl_config *cfg, const char *section, const char *key) {
    if (!cfg || !section || !key) return 0;
    const size_t ls = strlen(section);
    for (int i = 0; i < cfg->n_asked; i++)
        if (!strncmp(cfg->asked[i], section, ls) && cfg->asked[i][ls] == '\x1f' &&
            !strcmp(cfg->asked[i] + ls + 1, key))
            return 1;
    return 0;
}
