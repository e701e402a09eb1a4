/* Validation of a whole run config before any work: every section and key against the core's
 * tables and the selected plugins' tables; types, ranges, choices, required keys and plugin
 * names. Each message names where the value came from (file:line or --set) and the key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

#define MAX_NAMES 256
#define MAX_MEMORY 32

/* The plugins a config selects, from its values or the defaults. */
typedef struct selection {
    const ctrl_plugin *trainer, *optimizer, *attention;
    const ctrl_plugin *memory[MAX_MEMORY];
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
        ctrl_status st = config_check_value(e, o);
        if (st != CTRL_OK) return st;
    }
    return CTRL_OK;
}

/* Where a section was opened: "file:line", the --set that created it, or the file alone. */
static const char *section_where(const ctrl_config *cfg, const char *section) {
    for (int s = 0; s < cfg->n_sections; s++)
        if (!strcmp(cfg->sections[s].name, section)) return cfg->sections[s].where;
    return cfg->file_name;
}

/* Missing required keys are errors; absent keys with defaults are filled in. A default that fails
 * its own table's checks is the table author's bug, reported as such rather than used. */
static ctrl_status require_and_fill(ctrl_config *cfg, const char *section, const ctrl_option *opts,
                                    const char *owner) {
    for (int i = 0; opts && opts[i].key; i++) {
        const ctrl_option *o = &opts[i];
        if (config_find(cfg, section, o->key)) continue;
        if (o->flags & CTRL_OPT_REQUIRED)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s: required key is missing (%s)",
                                  section_where(cfg, section), section, o->key, o->doc ? o->doc : "");
        if (!o->default_value) continue;
        ctrl_status st = config_put(cfg, section, o->key, o->default_value, "default", 0);
        if (st != CTRL_OK) return st;
        if (config_check_value(config_find(cfg, section, o->key), o) != CTRL_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", ctrl_error_message());
            return ctrl_error_set(CTRL_ERR_PLUGIN, "%s declares an invalid default: %s", owner, why);
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
        size_t digits = strspn(v + 5, "0123456789");
        if (digits >= 1 && digits <= 4 && !v[5 + digits]) return CTRL_OK;
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
    const char *where = where_of(cfg, config_find(cfg, "memory", "strategies"));
    char w[128];
    int r;
    for (const char *pos = list ? list : ""; (r = config_list_next(&pos, w, sizeof w)) != 0;) {
        if (r < 0)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [memory] strategies: a name is too long", where);
        const ctrl_plugin *p = NULL;
        if ((st = check_plugin_name(cfg, reg, CTRL_KIND_MEMORY, "memory", "strategies", w, &p))) return st;
        for (int i = 0; i < sel->n_memory; i++)
            if (sel->memory[i] == p)
                return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [memory] strategies: '%s' is listed twice", where,
                                      w);
        if (sel->n_memory == MAX_MEMORY)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [memory] strategies: more than %d strategies", where,
                                  MAX_MEMORY);
        sel->memory[sel->n_memory++] = p;
    }
    return CTRL_OK;
}

/* Every section name that could be valid with the loaded plugins, for did-you-mean: the core's,
 * each trainer, optimizer and memory strategy by name, and attention.NAME. */
#define MAX_ATTENTION 64
typedef struct section_names {
    const char *names[MAX_NAMES];
    char attention[MAX_ATTENTION][80];
    int n;
} section_names;

static void collect_section_names(const ctrl_registry *reg, section_names *sn) {
    int n_attention = 0;
    sn->n = 0;
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++)
        sn->names[sn->n++] = s->name;
    for (int i = 0; i < ctrl_registry_count(reg) && sn->n < MAX_NAMES; i++) {
        const ctrl_plugin *p = ctrl_registry_at(reg, i)->plugin;
        if (p->kind == CTRL_KIND_ATTENTION) {
            if (n_attention == MAX_ATTENTION) continue;
            snprintf(sn->attention[n_attention], sizeof sn->attention[0], "attention.%s", p->name);
            sn->names[sn->n++] = sn->attention[n_attention++];
        } else if (p->kind != CTRL_KIND_REWARD) {
            sn->names[sn->n++] = p->name;
        }
    }
}

/* "section [dpo] is for trainer 'dpo' but [run] trainer = sft": the user edited a section that the
 * run does not use, most likely the wrong one. */
static ctrl_status not_selected(const ctrl_config *cfg, const char *where, const char *section,
                                ctrl_kind kind, const char *plugin_name) {
    static const struct {
        const char *section, *key;
    } selector[CTRL_KIND_COUNT] = {
        [CTRL_KIND_ATTENTION] = {"model", "attention"},
        [CTRL_KIND_OPTIMIZER] = {"train", "optimizer"},
        [CTRL_KIND_TRAINER] = {"run", "trainer"},
        [CTRL_KIND_MEMORY] = {"memory", "strategies"},
    };
    const char *sel_section = selector[kind].section, *sel_key = selector[kind].key;
    const char *value = value_or_default(cfg, sel_section, core_table(sel_section), sel_key);
    if (kind == CTRL_KIND_MEMORY)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: [%s]: section is for memory strategy '%s' but [memory] strategies = %s "
                              "does not list it",
                              where, section, plugin_name, value && value[0] ? value : "(empty)");
    return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s]: section is for %s '%s' but [%s] %s = %s", where,
                          section, ctrl_kind_name(kind), plugin_name, sel_section, sel_key,
                          value ? value : "(none)");
}

/* The plugin whose options a non-core, non-reward section holds, or an error saying why the
 * section does not belong. */
static ctrl_status plugin_section(const ctrl_config *cfg, const ctrl_registry *reg, const selection *sel,
                                  const config_section_seen *sec, const ctrl_plugin **out) {
    const char *name = sec->name;
    *out = NULL;
    if (!strncmp(name, "attention.", 10)) {
        const char *a = name + 10;
        if (!strcmp(a, sel->attention->name)) {
            *out = sel->attention;
            return CTRL_OK;
        }
        if (ctrl_registry_find(reg, CTRL_KIND_ATTENTION, a))
            return not_selected(cfg, sec->where, name, CTRL_KIND_ATTENTION, a);
    } else {
        if (!strcmp(name, sel->trainer->name)) *out = sel->trainer;
        if (!*out && !strcmp(name, sel->optimizer->name)) *out = sel->optimizer;
        for (int i = 0; !*out && i < sel->n_memory; i++)
            if (!strcmp(name, sel->memory[i]->name)) *out = sel->memory[i];
        if (*out) return CTRL_OK;
        static const ctrl_kind kinds[] = {CTRL_KIND_TRAINER, CTRL_KIND_OPTIMIZER, CTRL_KIND_MEMORY};
        for (int k = 0; k < 3; k++)
            if (ctrl_registry_find(reg, kinds[k], name))
                return not_selected(cfg, sec->where, name, kinds[k], name);
    }
    section_names sn;
    collect_section_names(reg, &sn);
    const char *s = config_suggest(name, sn.names, sn.n);
    char hint[200];
    if (s)
        snprintf(hint, sizeof hint, " (did you mean [%s]?)", s);
    else
        snprintf(hint, sizeof hint,
                 " (no core section or loaded plugin has that name; reward functions go in "
                 "[reward.NAME] sections)");
    return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s]: unknown section%s", sec->where, name, hint);
}

/* [reward.NAME]: plugin = a loaded reward plugin (checked first: it decides which keys are
 * valid), weight, and that plugin's options. */
static ctrl_status check_reward_section(ctrl_config *cfg, const ctrl_registry *reg,
                                        const config_section_seen *sec) {
    const char *name = sec->name;
    if (!name[7])
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [reward.]: the reward needs a name ([reward.NAME])",
                              sec->where);
    config_entry *pe = config_find(cfg, name, "plugin");
    if (!pe) {
        char loaded[1024];
        ctrl_registry_names(reg, CTRL_KIND_REWARD, loaded, sizeof loaded);
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: [%s] plugin: required key is missing (the reward plugin this function "
                              "runs; loaded: %s)",
                              sec->where, name, loaded);
    }
    const ctrl_plugin *plugin = NULL;
    ctrl_status st = check_plugin_name(cfg, reg, CTRL_KIND_REWARD, name, "plugin", pe->value, &plugin);
    if (st != CTRL_OK) return st;
    char owner[128];
    snprintf(owner, sizeof owner, "reward '%s'", plugin->name);
    if ((st = check_section_keys(cfg, name, config_reward_instance_options, plugin->options, owner)))
        return st;
    if ((st = require_and_fill(cfg, name, config_reward_instance_options, "the core"))) return st;
    return require_and_fill(cfg, name, plugin->options, owner);
}

static void owner_text(const ctrl_plugin *p, char *out, size_t cap) {
    snprintf(out, cap, "%s '%s'", ctrl_kind_name(p->kind), p->name);
}

ctrl_status config_validate(ctrl_config *cfg, const ctrl_registry *reg) {
    ctrl_status st;
    char owner[128];
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
        owner_text(p, owner, sizeof owner);
        if ((st = check_section_keys(cfg, sec->name, p->options, NULL, owner))) return st;
    }
    /* 3. Required keys and defaults, core and selected plugins. */
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++)
        if ((st = require_and_fill(cfg, s->name, s->options, "the core"))) return st;
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
        owner_text(selected[i], owner, sizeof owner);
        if ((st = require_and_fill(cfg, section, selected[i]->options, owner))) return st;
    }
    for (int i = 0; i < sel.n_memory; i++) {
        owner_text(sel.memory[i], owner, sizeof owner);
        if ((st = require_and_fill(cfg, sel.memory[i]->name, sel.memory[i]->options, owner))) return st;
    }
    return CTRL_OK;
}
