/* Helpers shared by the commands: plugin loading, error printing, --set collection, signals. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "config/config_load.h"
#include "interrupt.h"

ctrl_status cli_plugins(ctrl_cli *cli, ctrl_registry **out) {
    if (!cli->reg) {
        ctrl_status st = ctrl_registry_create(&cli->reg);
        if (st != CTRL_OK) return st;
        st = ctrl_registry_load_standard(cli->reg, cli->plugin_dirs, cli->n_plugin_dirs);
        if (st != CTRL_OK) return st;
    }
    *out = cli->reg;
    return CTRL_OK;
}

int cli_fail(ctrl_status st) {
    const char *msg = ctrl_error_message();
    fprintf(stderr, "ctrl: error: %s\n", msg[0] ? msg : ctrl_status_name(st));
    return ctrl_status_exit_code(st);
}

int cli_fail_config(ctrl_status st) {
    int rc = cli_fail(st);
    return st == CTRL_ERR_NOMEM ? rc : 2;
}

int cli_usage_error(const ctrl_command *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ctrl %s: error: ", cmd->name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry 'ctrl %s --help'.\n", cmd->name);
    va_end(ap);
    return 2;
}

int cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) return 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    }
    return 0;
}

int cli_split_sets(const ctrl_command *cmd, int argc, char **argv, const char **sets, int *n_sets,
                   const char **positional, int *n_positional, int cap) {
    *n_sets = 0;
    *n_positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        if (!strcmp(a, "--set")) {
            if (i + 1 >= argc) return cli_usage_error(cmd, "--set needs section.key=value");
            val = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            val = a + 6;
        } else if (a[0] == '-' && a[1]) {
            return cli_usage_error(cmd, "unknown option '%s'", a);
        } else {
            if (*n_positional == cap) return cli_usage_error(cmd, "too many arguments");
            positional[(*n_positional)++] = a;
            continue;
        }
        if (*n_sets == cap) return cli_usage_error(cmd, "too many --set options (at most %d)", cap);
        sets[(*n_sets)++] = val;
    }
    return 0;
}

#define MAX_ARGS 256

int cli_load_run_config(ctrl_cli *cli, const ctrl_command *cmd, const char *what, int argc, char **argv,
                        const char **path, ctrl_config **cfg) {
    const char *sets[MAX_ARGS], *pos[MAX_ARGS];
    int n_sets, n_pos;
    int rc = cli_split_sets(cmd, argc, argv, sets, &n_sets, pos, &n_pos, MAX_ARGS);
    if (rc) return rc;
    if (n_pos != 1) return cli_usage_error(cmd, "%s needs exactly one RUN.ini", what);
    ctrl_registry *reg;
    ctrl_status st = cli_plugins(cli, &reg);
    if (st != CTRL_OK) return cli_fail(st);
    st = ctrl_config_load(pos[0], sets, n_sets, reg, cfg);
    if (st != CTRL_OK) return cli_fail_config(st);
    *path = pos[0];
    return 0;
}

static volatile sig_atomic_t interrupted;

static void on_signal(int sig) {
    /* A second signal while the first is being handled means "stop now". */
    if (interrupted) {
        signal(sig, SIG_DFL);
        raise(sig);
    }
    interrupted = 1;
}

int cli_interrupted(void) { return interrupted != 0; }

void cli_install_signal_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    ctrl_interrupt_set_source(cli_interrupted); /* long work in core polls it (interrupt.h) */
}
