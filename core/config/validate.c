/* Validation of a whole run config before any work: every section and key against the core's
 * tables and the selected plugins' tables; types, ranges, choices, required keys and plugin
 * names. Each message names where the value came from (file:line or --set) and the key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

#define MAX_NAMES 256

/* The plugins a config selects, from its values or the defaults. */
typedef struct selection {
    const ctrl_plugin *trainer, *optimizer, *attention;
    const ctrl_plugin *memory[32];
    int n_memory;
} selection;

static const ctrl_option *find_option(const ctrl_option *opts, const char *key) {
    for (int i = 0; opts && opts[i].key; i++)
        if (!strcmp(opts[i].key, key)) return &opts[i];
    return NULL;
}

static const char *value_or_default(const ctrl_config *cfg, const char *section, const ctrl_option *opts,
                                    const char *key) {
    config_entry *e = config_find(cfg, section, key);
    if (e) return e->value;
    const ctrl_option *o = find_option(opts, key);
    return o ? o->default_value : NULL;
}

static const char *where_of(const ctrl_config *cfg, const config_entry *e) {
    return e ? e->where : cfg->file_name;
}

/* A word of a '|'-separated list, for did-you-mean among choices. */
static int split_choices(const char *choices, char buf[][64], const char **out, int cap) {
    int n = 0;
    for (const char *p = choices; p && *p && n < cap;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len >= 64) len = 63;
        memcpy(buf[n], p, len);
        buf[n][len] = '\0';
        out[n] = buf[n];
        n++;
        p = bar ? bar + 1 : NULL;
    }
    return n;
}

static void choices_text(const char *choices, char *out, size_t cap) {
    snprintf(out, cap, "%s", choices);
    for (char *c = out; *c; c++)
        if (*c == '|') *c = ',';
}

static ctrl_status bad_choice(const config_entry *e, const char *word, const char *choices) {
    char buf[64][64];
    const char *names[64];
    int n = split_choices(choices, buf, names, 64);
    const char *s = config_suggest(word, names, n);
    char list[1024];
    choices_text(choices, list, sizeof list);
    char hint[160] = "";
    if (s) snprintf(hint, sizeof hint, " (did you mean '%s'?)", s);
    return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s = '%s': expected one of %s%s", e->where, e->section,
                          e->key, word, list, hint);
}

static ctrl_status check_range(const config_entry *e, const ctrl_option *o, double v) {
    int lo_bad = (o->flags & CTRL_OPT_HAS_MIN) && ((o->flags & CTRL_OPT_MIN_OPEN) ? v <= o->min : v < o->min);
    int hi_bad = (o->flags & CTRL_OPT_HAS_MAX) && ((o->flags & CTRL_OPT_MAX_OPEN) ? v >= o->max : v > o->max);
    if (!lo_bad && !hi_bad) return CTRL_OK;
    char range[128];
    if ((o->flags & CTRL_OPT_HAS_MIN) && (o->flags & CTRL_OPT_HAS_MAX))
        snprintf(range, sizeof range, "%s%g, %g%s", (o->flags & CTRL_OPT_MIN_OPEN) ? "(" : "[", o->min,
                 o->max, (o->flags & CTRL_OPT_MAX_OPEN) ? ")" : "]");
    else if (o->flags & CTRL_OPT_HAS_MIN)
        snprintf(range, sizeof range, "%s %g", (o->flags & CTRL_OPT_MIN_OPEN) ? ">" : ">=", o->min);
    else
        snprintf(range, sizeof range, "%s %g", (o->flags & CTRL_OPT_MAX_OPEN) ? "<" : "<=", o->max);
    return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s = %s: out of range (must be %s)", e->where,
                          e->section, e->key, e->value, range);
}

static ctrl_status check_value(const config_entry *e, const ctrl_option *o) {
    const char *v = e->value;
    switch (o->type) {
    case CTRL_OPT_INT: {
        int64_t x;
        double f;
        if (config_parse_int(v, &x) != 0) {
            if (config_parse_float(v, &f) == 0)
                return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s = %s: expected a whole number", e->where,
                                      e->section, e->key, v);
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s = '%s': expected an integer", e->where,
                                  e->section, e->key, v);
        }
        return check_range(e, o, (double)x);
    }
    case CTRL_OPT_FLOAT: {
        double x;
        if (config_parse_float(v, &x) != 0)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s = '%s': expected a number", e->where,
                                  e->section, e->key, v);
        return check_range(e, o, x);
    }
    case CTRL_OPT_BOOL: {
        bool b;
        if (config_parse_bool(v, &b) != 0)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s = '%s': expected true or false", e->where,
                                  e->section, e->key, v);
        return CTRL_OK;
    }
    case CTRL_OPT_CHOICE: return config_choice_ok(o->choices, v) ? CTRL_OK : bad_choice(e, v, o->choices);
    case CTRL_OPT_LIST: {
        if (!o->choices) return CTRL_OK;
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", v);
        char *save = NULL;
        for (char *w = strtok_r(buf, ", \t", &save); w; w = strtok_r(NULL, ", \t", &save))
            if (!config_choice_ok(o->choices, w)) return bad_choice(e, w, o->choices);
        return CTRL_OK;
    }
    case CTRL_OPT_PATH:
        if (!v[0])
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s: empty path", e->where, e->section, e->key);
        return CTRL_OK;
    case CTRL_OPT_STRING: return CTRL_OK;
    }
    return CTRL_OK;
}

/* A plugin name given by a key: it must be loaded, with the kind the key selects. */
static ctrl_status check_plugin_name(const ctrl_config *cfg, const ctrl_registry *reg, ctrl_kind kind,
                                     const char *section, const char *key, const char *name,
                                     const ctrl_plugin **out) {
    const ctrl_plugin_entry *pe = ctrl_registry_find(reg, kind, name);
    if (pe) {
        *out = pe->plugin;
        return CTRL_OK;
    }
    const char *names[MAX_NAMES];
    int n = 0;
    for (int i = 0; i < ctrl_registry_count(reg) && n < MAX_NAMES; i++) {
        const ctrl_plugin *p = ctrl_registry_at(reg, i)->plugin;
        if (p->kind == kind) names[n++] = p->name;
    }
    char loaded[1024];
    ctrl_registry_names(reg, kind, loaded, sizeof loaded);
    const char *s = config_suggest(name, names, n);
    char hint[160] = "";
    if (s) snprintf(hint, sizeof hint, "did you mean '%s'? ", s);
    config_entry *e = config_find(cfg, section, key);
    return ctrl_error_set(CTRL_ERR_CONFIG,
                          "%s: [%s] %s = '%s': no %s plugin of that name is loaded (%sloaded: %s)",
                          where_of(cfg, e), section, key, name, ctrl_kind_name(kind), hint, loaded);
}

static int is_core_section(const char *name) {
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++)
        if (!strcmp(s->name, name)) return 1;
    return 0;
}

static const ctrl_option *core_table(const char *name) {
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++)
        if (!strcmp(s->name, name)) return s->options;
    return NULL;
}

/* Checks every key of one section against up to two tables. */
static ctrl_status check_section_keys(const ctrl_config *cfg, const char *section, const ctrl_option *t1,
                                      const ctrl_option *t2, const char *owner) {
    for (int i = 0; i < cfg->n; i++) {
        const config_entry *e = &cfg->entries[i];
        if (strcmp(e->section, section) != 0) continue;
        const ctrl_option *o = find_option(t1, e->key);
        if (!o) o = find_option(t2, e->key);
        if (!o) {
            const char *names[MAX_NAMES];
            int n = 0;
            for (int k = 0; t1 && t1[k].key && n < MAX_NAMES; k++) names[n++] = t1[k].key;
            for (int k = 0; t2 && t2[k].key && n < MAX_NAMES; k++) names[n++] = t2[k].key;
            const char *s = config_suggest(e->key, names, n);
            char hint[160] = "";
            if (s)
                snprintf(hint, sizeof hint, " (did you mean '%s'?)", s);
            else if (n == 0)
                snprintf(hint, sizeof hint, " (%s has no options)", owner);
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s: unknown key%s", e->where, section, e->key,
                                  hint);
        }
        ctrl_status st = check_value(e, o);
        if (st != CTRL_OK) return st;
    }
    return CTRL_OK;
}

/* Missing required keys are errors; absent keys with defaults are filled in. */
static ctrl_status require_and_fill(ctrl_config *cfg, const char *section, const ctrl_option *opts) {
    for (int i = 0; opts && opts[i].key; i++) {
        const ctrl_option *o = &opts[i];
        if (config_find(cfg, section, o->key)) continue;
        if (o->flags & CTRL_OPT_REQUIRED) {
            int line = 0;
            for (int s = 0; s < cfg->n_sections; s++)
                if (!strcmp(cfg->sections[s].name, section)) line = cfg->sections[s].line;
            if (line)
                return ctrl_error_set(CTRL_ERR_CONFIG, "%s:%d: [%s] %s: required key is missing (%s)",
                                      cfg->file_name, line, section, o->key, o->doc ? o->doc : "");
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s: required key is missing (%s)",
                                  cfg->file_name, section, o->key, o->doc ? o->doc : "");
        }
        if (o->default_value) {
            ctrl_status st = config_put(cfg, section, o->key, o->default_value, "default", 0);
            if (st != CTRL_OK) return st;
        }
    }
    return CTRL_OK;
}

static ctrl_status check_device(const ctrl_config *cfg) {
    config_entry *e = config_find(cfg, "run", "device");
    if (!e) return CTRL_OK;
    const char *v = e->value;
    if (!strcmp(v, "auto") || !strcmp(v, "cpu") || !strcmp(v, "cuda")) return CTRL_OK;
    if (!strncmp(v, "cuda:", 5)) {
        int64_t idx;
        if (config_parse_int(v + 5, &idx) == 0 && idx >= 0 && idx < 1024) return CTRL_OK;
    }
    return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [run] device = '%s': expected auto, cpu, cuda or cuda:N",
                          e->where, v);
}

static ctrl_status select_plugins(const ctrl_config *cfg, const ctrl_registry *reg, selection *sel) {
    ctrl_status st;
    const char *name = value_or_default(cfg, "run", core_table("run"), "trainer");
    if ((st = check_plugin_name(cfg, reg, CTRL_KIND_TRAINER, "run", "trainer", name, &sel->trainer)))
        return st;
    name = value_or_default(cfg, "train", core_table("train"), "optimizer");
    if ((st = check_plugin_name(cfg, reg, CTRL_KIND_OPTIMIZER, "train", "optimizer", name, &sel->optimizer)))
        return st;
    name = value_or_default(cfg, "model", core_table("model"), "attention");
    if ((st = check_plugin_name(cfg, reg, CTRL_KIND_ATTENTION, "model", "attention", name, &sel->attention)))
        return st;
    const char *list = value_or_default(cfg, "memory", core_table("memory"), "strategies");
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list ? list : "");
    char *save = NULL;
    for (char *w = strtok_r(buf, ", \t", &save); w; w = strtok_r(NULL, ", \t", &save)) {
        const ctrl_plugin *p = NULL;
        if ((st = check_plugin_name(cfg, reg, CTRL_KIND_MEMORY, "memory", "strategies", w, &p))) return st;
        for (int i = 0; i < sel->n_memory; i++)
            if (sel->memory[i] == p)
                return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [memory] strategies: '%s' is listed twice",
                                      where_of(cfg, config_find(cfg, "memory", "strategies")), w);
        if (sel->n_memory < 32) sel->memory[sel->n_memory++] = p;
    }
    return CTRL_OK;
}

/* The table for a non-core section, or an error saying why the section does not belong. */
static ctrl_status plugin_section(const ctrl_config *cfg, const ctrl_registry *reg, const selection *sel,
                                  const config_section_seen *sec, const ctrl_plugin **out) {
    const char *name = sec->name;
    char where[600];
    if (sec->line)
        snprintf(where, sizeof where, "%s:%d", cfg->file_name, sec->line);
    else
        snprintf(where, sizeof where, "--set");
    *out = NULL;
    if (!strncmp(name, "attention.", 10)) {
        const char *a = name + 10;
        if (sel->attention && !strcmp(a, sel->attention->name)) {
            *out = sel->attention;
            return CTRL_OK;
        }
        if (ctrl_registry_find(reg, CTRL_KIND_ATTENTION, a))
            return ctrl_error_set(CTRL_ERR_CONFIG,
                                  "%s: [%s]: section is for attention '%s' but [model] attention = %s", where,
                                  name, a, sel->attention ? sel->attention->name : "?");
    } else {
        if (!strcmp(name, sel->trainer->name)) *out = sel->trainer;
        if (!*out && !strcmp(name, sel->optimizer->name)) *out = sel->optimizer;
        for (int i = 0; !*out && i < sel->n_memory; i++)
            if (!strcmp(name, sel->memory[i]->name)) *out = sel->memory[i];
        if (*out) return CTRL_OK;
        static const struct {
            ctrl_kind kind;
            const char *selector;
        } selectors[] = {{CTRL_KIND_TRAINER, "[run] trainer"},
                         {CTRL_KIND_OPTIMIZER, "[train] optimizer"},
                         {CTRL_KIND_MEMORY, "[memory] strategies"}};
        for (int k = 0; k < 3; k++)
            if (ctrl_registry_find(reg, selectors[k].kind, name))
                return ctrl_error_set(CTRL_ERR_CONFIG,
                                      "%s: [%s]: section is for %s '%s', which %s does not select", where,
                                      name, ctrl_kind_name(selectors[k].kind), name, selectors[k].selector);
    }
    /* Unknown: suggest among every section that would be valid here. */
    const char *names[MAX_NAMES];
    char attn[128];
    int n = 0;
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++) names[n++] = s->name;
    names[n++] = sel->trainer->name;
    names[n++] = sel->optimizer->name;
    for (int i = 0; i < sel->n_memory; i++) names[n++] = sel->memory[i]->name;
    snprintf(attn, sizeof attn, "attention.%s", sel->attention->name);
    names[n++] = attn;
    const char *s = config_suggest(name, names, n);
    char hint[200];
    if (s)
        snprintf(hint, sizeof hint, " (did you mean [%s]?)", s);
    else
        snprintf(hint, sizeof hint, " (reward functions go in [reward.NAME] sections)");
    return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s]: unknown section%s", where, name, hint);
}

static ctrl_status check_reward_section(ctrl_config *cfg, const ctrl_registry *reg,
                                        const config_section_seen *sec) {
    const char *name = sec->name;
    if (!name[7])
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s:%d: [reward.]: the reward needs a name ([reward.NAME])",
                              cfg->file_name, sec->line);
    const ctrl_plugin *plugin = NULL;
    config_entry *pe = config_find(cfg, name, "plugin");
    if (pe) {
        ctrl_status st = check_plugin_name(cfg, reg, CTRL_KIND_REWARD, name, "plugin", pe->value, &plugin);
        if (st != CTRL_OK) return st;
    }
    ctrl_status st = check_section_keys(cfg, name, config_reward_instance_options,
                                        plugin ? plugin->options : NULL, "reward");
    if (st != CTRL_OK) return st;
    st = require_and_fill(cfg, name, config_reward_instance_options);
    if (st != CTRL_OK) return st;
    return require_and_fill(cfg, name, plugin->options);
}

ctrl_status config_validate(ctrl_config *cfg, const ctrl_registry *reg) {
    ctrl_status st;
    /* 1. The core sections first: plugin selection depends on their values. */
    for (int i = 0; i < cfg->n_sections; i++) {
        const char *name = cfg->sections[i].name;
        if (!is_core_section(name)) continue;
        if ((st = check_section_keys(cfg, name, core_table(name), NULL, "the core"))) return st;
    }
    if ((st = check_device(cfg))) return st;
    selection sel = {0};
    if ((st = select_plugins(cfg, reg, &sel))) return st;
    /* 2. Every other section belongs to a selected plugin or is a reward function. */
    for (int i = 0; i < cfg->n_sections; i++) {
        const config_section_seen *sec = &cfg->sections[i];
        if (is_core_section(sec->name)) continue;
        if (!strncmp(sec->name, "reward.", 7)) {
            if ((st = check_reward_section(cfg, reg, sec))) return st;
            continue;
        }
        const ctrl_plugin *p = NULL;
        if ((st = plugin_section(cfg, reg, &sel, sec, &p))) return st;
        char owner[128];
        snprintf(owner, sizeof owner, "%s '%s'", ctrl_kind_name(p->kind), p->name);
        if ((st = check_section_keys(cfg, sec->name, p->options, NULL, owner))) return st;
    }
    /* 3. Required keys and defaults, core and selected plugins. */
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++)
        if ((st = require_and_fill(cfg, s->name, s->options))) return st;
    if (!config_find(cfg, "run", "output_dir")) {
        /* runs/<config file name without directory and extension> */
        const char *base = strrchr(cfg->path, '/');
        base = base ? base + 1 : cfg->path;
        char stem[256];
        snprintf(stem, sizeof stem, "%s", base);
        char *dot = strrchr(stem, '.');
        if (dot && dot != stem) *dot = '\0';
        char dir[300];
        snprintf(dir, sizeof dir, "runs/%s", stem);
        if ((st = config_put(cfg, "run", "output_dir", dir, "default", 0))) return st;
    }
    const ctrl_plugin *selected[3] = {sel.trainer, sel.optimizer, sel.attention};
    for (int i = 0; i < 3; i++) {
        char section[128];
        if (selected[i]->kind == CTRL_KIND_ATTENTION)
            snprintf(section, sizeof section, "attention.%s", selected[i]->name);
        else
            snprintf(section, sizeof section, "%s", selected[i]->name);
        if ((st = require_and_fill(cfg, section, selected[i]->options))) return st;
    }
    for (int i = 0; i < sel.n_memory; i++)
        if ((st = require_and_fill(cfg, sel.memory[i]->name, sel.memory[i]->options))) return st;
    return CTRL_OK;
}
