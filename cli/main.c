/* ctrl [--plugin-dir DIR]... [--log-level LEVEL] COMMAND ...
 * Global options, dispatch to cli/cmd_*.c, and the exit-code contract:
 * 0 ok, 1 run-time error, 2 usage or config error, 130 interrupted. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static const ctrl_command *const commands[] = {&cli_cmd_train, &cli_cmd_plugins,  &cli_cmd_config,
                                               &cli_cmd_model, &cli_cmd_tokenize, &cli_cmd_generate,
                                               &cli_cmd_serve, &cli_cmd_version,  NULL};

static void print_main_help(FILE *out) {
    fprintf(out, "usage: ctrl [--plugin-dir DIR]... [--log-level LEVEL] COMMAND [ARGS]...\n\n"
                 "LLM post-training (SFT, DPO, GRPO, ...) in one native program.\n\n"
                 "Commands:\n");
    for (int i = 0; commands[i]; i++) fprintf(out, "  %-10s %s\n", commands[i]->name, commands[i]->summary);
    fprintf(out,
            "\nGlobal options:\n"
            "  --plugin-dir DIR   load every plugin .so in DIR (repeatable; searched first)\n"
            "  --log-level LEVEL  trace|debug|info|warn|error|off (default info)\n"
            "  -h, --help         this text; `ctrl COMMAND --help` for a command's own\n"
            "  --version          print the version\n\n"
            "Plugins are also loaded from CTRL_PLUGIN_PATH (colon-separated) and the install\n"
            "directory. Exit codes: 0 ok, 1 run-time error, 2 usage or config error, 130 interrupted.\n");
}

static int main_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int main_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ctrl: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry 'ctrl --help'.\n");
    va_end(ap);
    return 2;
}

int main(int argc, char **argv) {
    cli_blas_restart(argv);
    ctrl_cli cli = {0};
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') break;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            print_main_help(stdout);
            return 0;
        }
        if (!strcmp(a, "--version")) return cli_cmd_version.run(&cli, 1, argv + i);
        const char *val = NULL;
        if (!strcmp(a, "--plugin-dir") || !strcmp(a, "--log-level")) {
            if (i + 1 >= argc) return main_usage_error("%s needs a value", a);
            val = argv[++i];
        } else if (!strncmp(a, "--plugin-dir=", 13)) {
            val = a + 13;
        } else if (!strncmp(a, "--log-level=", 12)) {
            val = a + 12;
        } else {
            return main_usage_error("unknown option '%s'", a);
        }
        if (!strncmp(a, "--plugin-dir", 12)) {
            if (!val[0]) return main_usage_error("--plugin-dir needs a directory");
            struct stat sb;
            if (stat(val, &sb) != 0) return main_usage_error("--plugin-dir %s: %s", val, strerror(errno));
            if (!S_ISDIR(sb.st_mode)) return main_usage_error("--plugin-dir %s: not a directory", val);
            if (cli.n_plugin_dirs == CTRL_CLI_MAX_PLUGIN_DIRS)
                return main_usage_error("too many --plugin-dir options (at most %d)",
                                        CTRL_CLI_MAX_PLUGIN_DIRS);
            cli.plugin_dirs[cli.n_plugin_dirs++] = val;
        } else {
            ctrl_log_level level;
            if (ctrl_log_level_parse(val, &level) != 0)
                return main_usage_error("--log-level '%s': expected trace|debug|info|warn|error|off", val);
            ctrl_log_set_level(level);
            cli.log_level_set = 1;
        }
    }
    if (i >= argc) {
        print_main_help(stderr);
        return 2;
    }
    const ctrl_command *cmd = NULL;
    for (int c = 0; commands[c]; c++)
        if (!strcmp(argv[i], commands[c]->name)) cmd = commands[c];
    if (!cmd) return main_usage_error("unknown command '%s'", argv[i]);
    if (cli_wants_help(argc - i, argv + i)) {
        fputs(cmd->usage, stdout);
        return 0;
    }
    if (cmd != &cli_cmd_train) cli_blas_restart_note(); /* train: once its [run] log_level is set */
    cli_install_signal_handlers();
    int rc = cmd->run(&cli, argc - i, argv + i);
    if (cli.reg) ctrl_registry_destroy(cli.reg);
    return rc;
}
