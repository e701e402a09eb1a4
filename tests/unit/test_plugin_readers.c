/* No declared plugin key without a reader (issue 23 item 9, the plugins' half of test_config_readers):
 * for every built plugin, a config that selects it is loaded (the core's typed settings and the
 * plugin's check_options read what they read), the plugin is created from it as a run creates it, and
 * every key of its option table must have been asked for by someone. A declared key nothing reads is
 * accepted and silently ignored: the worst thing a config can do to a user. */
#include <stdio.h>
#include <string.h>

#include <ctrl/ctrl.h>

#include "config/config_internal.h"
#include "test.h"
#include "test_registry.h"

/* A value for a required key: the few that must be real to create the plugin, else by type. */
static const char *required_value(const ctrl_option *o) {
    static const char *const known[][2] = {
        {"command", "cat"},                   /* reward command: a program that answers (cat echoes) */
        {"url", "http://127.0.0.1:9/reward"}, /* reward http */
    };
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (!strcmp(o->key, known[i][0])) return known[i][1];
    switch (o->type) {
    case CTRL_OPT_INT:
    case CTRL_OPT_FLOAT: return "1";
    case CTRL_OPT_BOOL: return "false";
    default: return "x";
    }
}

/* The config that selects plugin `p` (its required keys given), and the section its options live in. */
static void selecting_ini(const ctrl_plugin *p, char *ini, size_t cap, char *section, size_t scap) {
    const char *base = "[model]\npath = m\n[data]\ntrain_file = t.jsonl\n";
    snprintf(section, scap, "%s", p->name);
    int n = 0;
    switch (p->kind) {
    case CTRL_KIND_TRAINER:
        n = snprintf(ini, cap, "%s%s[run]\ntrainer = %s\n", base,
                     !strcmp(p->name, "gkd") ? "[teacher]\npath = teacher\n" : "", p->name);
        break;
    case CTRL_KIND_OPTIMIZER: n = snprintf(ini, cap, "%s[train]\noptimizer = %s\n", base, p->name); break;
    case CTRL_KIND_MEMORY: n = snprintf(ini, cap, "%s[memory]\nstrategies = %s\n", base, p->name); break;
    case CTRL_KIND_ATTENTION: n = snprintf(ini, cap, "[model]\npath = m\nattention = %s\n", p->name); break;
    case CTRL_KIND_REWARD:
        snprintf(section, scap, "reward.r");
        n = snprintf(ini, cap, "%s[run]\ntrainer = grpo\n[reward.r]\nplugin = %s\n", base, p->name);
        break;
    default: ini[0] = 0; return;
    }
    if (p->kind != CTRL_KIND_REWARD && p->kind != CTRL_KIND_ATTENTION)
        n += snprintf(ini + n, cap - (size_t)n, "[%s]\n", section);
    for (const ctrl_option *o = p->options; o->key && (size_t)n < cap; o++)
        if (o->flags & CTRL_OPT_REQUIRED)
            n += snprintf(ini + n, cap - (size_t)n, "%s = %s\n", o->key, required_value(o));
}

/* Creates the plugin from the config as a run does (its create() reads its options), then frees it. */
static ctrl_status create_and_free(const ctrl_plugin *p, const ctrl_config *cfg, const char *section) {
    const ctrl_host *host = ctrl_host_table();
    ctrl_status st = CTRL_OK;
    switch (p->kind) {
    case CTRL_KIND_TRAINER: {
        const ctrl_trainer_ops *ops = p->ops;
        ctrl_trainer *t = NULL;
        if ((st = ops->create(host, cfg, &t)) == CTRL_OK) ops->destroy(t);
        break;
    }
    case CTRL_KIND_OPTIMIZER: {
        const ctrl_optimizer_ops *ops = p->ops;
        float w[4] = {0}, g[4] = {0};
        const ctrl_param_group group = {.param = w, .grad = g, .numel = 4, .weight_decay = 0};
        ctrl_optimizer *o = NULL;
        if ((st = ops->create(host, cfg, &group, 1, (ctrl_device){CTRL_DEVICE_CPU, 0}, &o)) == CTRL_OK)
            ops->destroy(o);
        break;
    }
    case CTRL_KIND_MEMORY: {
        const ctrl_memory_ops *ops = p->ops;
        ctrl_memory *m = NULL;
        if ((st = ops->create(host, cfg, 2, &m)) == CTRL_OK) ops->destroy(m);
        break;
    }
    case CTRL_KIND_REWARD: {
        const ctrl_reward_ops *ops = p->ops;
        ctrl_reward *r = NULL;
        if ((st = ops->create(host, cfg, section, &r)) == CTRL_OK) ops->destroy(r);
        break;
    }
    default: break;
    }
    return st;
}

TEST(every_plugin_key_is_read) {
    ctrl_registry *reg = test_plugin_registry();
    if (!reg) return;
    int keys = 0, plugins = 0;
    for (int i = 0; i < ctrl_registry_count(reg); i++) {
        const ctrl_plugin *p = ctrl_registry_at(reg, i)->plugin;
        if (!p->options || !p->options[0].key) continue;
        char ini[2048], section[64], name[96];
        selecting_ini(p, ini, sizeof ini, section, sizeof section);
        snprintf(name, sizeof name, "select_%s.ini", p->name);
        ctrl_config *cfg = test_config_from_text(reg, name, ini);
        if (!cfg) continue;
        const ctrl_status st = create_and_free(p, cfg, section);
        if (st != CTRL_OK)
            printf("  %s: create() said: %s (keys read before that still count)\n", p->name,
                   ctrl_error_message());
        plugins++;
        for (const ctrl_option *o = p->options; o->key; o++, keys++)
            CHECK_MSG(config_was_read(cfg, section, o->key),
                      "[%s] %s (plugin %s): declared, but nothing reads it", section, o->key, p->name);
        ctrl_config_free(cfg);
    }
    printf("  %d keys of %d plugins\n", keys, plugins);
    ctrl_registry_destroy(reg);
}
