/* Sections that belong to plugins: [NAME] for the selected trainer, optimizer and memory
 * strategies, [attention.NAME] for the selected attention, and [reward.NAME] reward functions.
 * A section for a loaded plugin the run does not select is an error, since editing the wrong
 * section is an easy mistake; a section naming nothing known gets a did-you-mean. */
#include <stdio.h>
#include <string.h>

#include "config/config_internal.h"

#define MAX_NAMES 256
#define MAX_ATTENTION 64

/* Every section name that could be valid with the loaded plugins, for did-you-mean: the core's,
 * each trainer, optimizer and memory strategy by name, and attention.NAME. */
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

/* "section [dpo] is for trainer 'dpo' but [run] trainer = sft". */
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
    const char *value = config_value_or_default(cfg, sel_section, config_core_table(sel_section), sel_key);
    if (kind == CTRL_KIND_MEMORY)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: [%s]: section is for memory strategy '%s' but [memory] strategies = %s "
                              "does not list it",
                              where, section, plugin_name, value && value[0] ? value : "(empty)");
    return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s]: section is for %s '%s' but [%s] %s = %s", where,
                          section, ctrl_kind_name(kind), plugin_name, sel_section, sel_key,
                          value ? value : "(none)");
}

ctrl_status config_plugin_section(const ctrl_config *cfg, const ctrl_registry *reg,
                                  const config_selection *sel, const config_section_seen *sec,
                                  const ctrl_plugin **out) {
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

/* plugin = a loaded reward plugin is checked first: it decides which other keys are valid. */
const ctrl_plugin *config_check_reward_section(const ctrl_config *cfg, const ctrl_registry *reg,
                                               const config_section_seen *sec, config_problems *pr) {
    const char *name = sec->name;
    if (!name[7]) {
        ctrl_error_set(CTRL_ERR_CONFIG, "%s: [reward.]: the reward needs a name ([reward.NAME])", sec->where);
        config_problem_note(pr, CTRL_ERR_CONFIG);
        return NULL;
    }
    config_entry *pe = config_find(cfg, name, "plugin");
    if (!pe) {
        char loaded[1024];
        ctrl_registry_names(reg, CTRL_KIND_REWARD, loaded, sizeof loaded);
        ctrl_error_set(CTRL_ERR_CONFIG,
                       "%s: [%s] plugin: required key is missing (the reward plugin this function runs; "
                       "loaded: %s)",
                       sec->where, name, loaded);
        config_problem_note(pr, CTRL_ERR_CONFIG);
        return NULL;
    }
    const ctrl_plugin *plugin = NULL;
    if (config_check_plugin_name(cfg, reg, CTRL_KIND_REWARD, name, "plugin", pe->value, &plugin) != CTRL_OK) {
        config_problem_note(pr, CTRL_ERR_CONFIG);
        return NULL;
    }
    char owner[128];
    snprintf(owner, sizeof owner, "reward '%s'", plugin->name);
    config_check_section_keys(cfg, name, config_reward_instance_options, plugin->options, owner, pr);
    return plugin;
}
