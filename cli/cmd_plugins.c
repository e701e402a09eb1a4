/* ctrl plugins [describe KIND/NAME]: what is loaded, and each plugin's options. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "config/config_load.h"

static int list_plugins(ctrl_registry *reg) {
    int n = ctrl_registry_count(reg);
    if (n == 0) {
        printf("no plugins loaded (use --plugin-dir DIR or CTRL_PLUGIN_PATH)\n");
        return 0;
    }
    printf("%-10s %-14s %-8s %-40s %s\n", "KIND", "NAME", "VERSION", "FILE", "SUMMARY");
    for (int i = 0; i < n; i++) {
        const ctrl_plugin_entry *e = ctrl_registry_at(reg, i);
        const ctrl_plugin *p = e->plugin;
        printf("%-10s %-14s %-8s %-40s %s\n", ctrl_kind_name(p->kind), p->name, p->version ? p->version : "-",
               e->file, p->summary ? p->summary : "");
    }
    return 0;
}

static int describe(ctrl_registry *reg, const char *spec) {
    const ctrl_plugin_entry *found = NULL;
    const char *slash = strchr(spec, '/');
    if (slash) {
        char kind[32];
        size_t len = (size_t)(slash - spec);
        if (len >= sizeof kind) len = sizeof kind - 1;
        memcpy(kind, spec, len);
        kind[len] = '\0';
        int k = ctrl_kind_parse(kind);
        if (k < 0) {
            ctrl_error_set(CTRL_ERR_USAGE,
                           "plugins describe: unknown kind '%s' (kinds: attention, optimizer, trainer, "
                           "memory, reward)",
                           kind);
            return cli_fail(CTRL_ERR_USAGE);
        }
        found = ctrl_registry_find(reg, (ctrl_kind)k, slash + 1);
    } else {
        int matches = 0;
        for (int k = 0; k < CTRL_KIND_COUNT; k++) {
            const ctrl_plugin_entry *e = ctrl_registry_find(reg, (ctrl_kind)k, spec);
            if (e) {
                found = e;
                matches++;
            }
        }
        if (matches > 1) {
            ctrl_error_set(CTRL_ERR_USAGE,
                           "plugins describe: '%s' names plugins of several kinds; write KIND/%s", spec,
                           spec);
            return cli_fail(CTRL_ERR_USAGE);
        }
    }
    if (!found) {
        ctrl_error_set(CTRL_ERR_USAGE, "plugins describe: no plugin '%s' is loaded (see 'ctrl plugins')",
                       spec);
        return cli_fail(CTRL_ERR_USAGE);
    }
    const ctrl_plugin *p = found->plugin;
    printf("%s/%s %s\n  %s\n  file: %s\n\n", ctrl_kind_name(p->kind), p->name, p->version ? p->version : "",
           p->summary ? p->summary : "", found->file);
    if (!p->options || !p->options[0].key) {
        printf("No options.\n");
        return 0;
    }
    if (p->kind == CTRL_KIND_REWARD)
        printf("Options (in each [reward.NAME] section with plugin = %s):\n", p->name);
    else if (p->kind == CTRL_KIND_ATTENTION)
        printf("Options (section [attention.%s]):\n", p->name);
    else
        printf("Options (section [%s]):\n", p->name);
    ctrl_option_table_print(stdout, p->options);
    return 0;
}

static int run_plugins(ctrl_cli *cli, int argc, char **argv) {
    if (argc > 3 || (argc >= 2 && strcmp(argv[1], "describe") != 0))
        return cli_usage_error(&cli_cmd_plugins, "unexpected argument '%s'", argv[argc > 3 ? 3 : 1]);
    if (argc == 2) return cli_usage_error(&cli_cmd_plugins, "describe needs KIND/NAME");
    ctrl_registry *reg;
    ctrl_status st = cli_plugins(cli, &reg);
    if (st != CTRL_OK) return cli_fail(st);
    return argc == 3 ? describe(reg, argv[2]) : list_plugins(reg);
}

const ctrl_command cli_cmd_plugins = {
    .name = "plugins",
    .summary = "list loaded plugins, or describe one's options",
    .usage = "usage: ctrl plugins\n"
             "       ctrl plugins describe KIND/NAME\n\n"
             "Lists every loaded plugin (kind, name, version, file, summary), or prints one\n"
             "plugin's options with type, default, range and doc. KIND is attention, optimizer,\n"
             "trainer, memory or reward; NAME alone works when it is unique.\n",
    .run = run_plugins,
};
