/* The selected plugins' own checks of their options (ctrl_plugin.check_options): the combinations
 * of keys an option table cannot declare, run while a run config is validated so that `ctrl config
 * check` refuses what a run would refuse at its start. Each refusal is located: its message starts
 * with "[section] key", and the key's place (file:line, --set, or the file for a default) is put
 * in front, as for the core's own checks. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "config/config_internal.h"

/* Where the "[section] key" a message starts with was set; the file itself when the message names
 * no key, or the key holds its default. */
static const char *message_where(const ctrl_config *cfg, const char *msg) {
    char section[128], key[128];
    if (msg[0] != '[') return cfg->file_name;
    size_t n = strcspn(msg + 1, "]");
    if (n == 0 || n >= sizeof section || msg[1 + n] != ']') return cfg->file_name;
    memcpy(section, msg + 1, n);
    section[n] = '\0';
    const char *k = msg + 2 + n;
    k += strspn(k, " ");
    size_t kn = strspn(k, "abcdefghijklmnopqrstuvwxyz0123456789_");
    if (kn == 0 || kn >= sizeof key) return cfg->file_name;
    memcpy(key, k, kn);
    key[kn] = '\0';
    const config_entry *e = config_find(cfg, section, key);
    return (e && e->line > 0) || (e && strncmp(e->where, "--set", 5) == 0) ? e->where : cfg->file_name;
}

static void check_one(const ctrl_config *cfg, const ctrl_plugin *p, const char *section,
                      config_problems *pr) {
    if (!p || p->size < offsetof(ctrl_plugin, check_options) + sizeof(void *) || !p->check_options) return;
    ctrl_status st = p->check_options(cfg, section);
    if (st == CTRL_OK) return;
    if (st == CTRL_ERR_CONFIG) {
        ctrl_error_wrap(st, "%s", message_where(cfg, ctrl_error_message()));
    } else {
        ctrl_error_wrap(st, "%s: %s '%s' checking its options", cfg->file_name, ctrl_kind_name(p->kind),
                        p->name);
    }
    config_problem_note(pr, st);
}

void config_check_plugin_options(const ctrl_config *cfg, const config_selection *sel, config_problems *pr) {
    char section[160];
    const ctrl_plugin *named[] = {sel->trainer, sel->optimizer};
    for (size_t i = 0; i < sizeof named / sizeof *named; i++)
        if (named[i]) check_one(cfg, named[i], named[i]->name, pr);
    if (sel->attention) {
        snprintf(section, sizeof section, "attention.%s", sel->attention->name);
        check_one(cfg, sel->attention, section, pr);
    }
    for (int i = 0; i < sel->n_memory; i++) check_one(cfg, sel->memory[i], sel->memory[i]->name, pr);
    for (int i = 0; i < sel->n_rewards; i++)
        check_one(cfg, sel->reward[i].plugin, sel->reward[i].section, pr);
}
