/* The ctrl command-line program: shared state and helpers of the commands (cli/cmd_*.c). */
#ifndef CTRL_CLI_H
#define CTRL_CLI_H

#include <ctrl/ctrl.h>

#include "registry/registry.h"

#define CTRL_CLI_MAX_PLUGIN_DIRS 64

typedef struct ctrl_cli {
    const char *plugin_dirs[CTRL_CLI_MAX_PLUGIN_DIRS]; /* --plugin-dir, in order */
    int n_plugin_dirs;
    ctrl_registry *reg; /* loaded on first use by cli_plugins() */
    int log_level_set;  /* --log-level given: it wins over a run config's [run] log_level */
} ctrl_cli;

typedef struct ctrl_command {
    const char *name;
    const char *summary;
    const char *usage;                                /* full --help text */
    int (*run)(ctrl_cli *cli, int argc, char **argv); /* argv[0] is the command name */
} ctrl_command;

/* Loads the plugins once (the --plugin-dir list, then CTRL_PLUGIN_PATH, then the install dir).
 * A plugin that fails to load is an error: the message names the file. */
ctrl_status cli_plugins(ctrl_cli *cli, ctrl_registry **out);

/* Prints "ctrl: error: <message>" for the current error and returns the exit code for `st`. */
int cli_fail(ctrl_status st);
/* The same for a failure to load the run config: a missing or unreadable INI file is the user's
 * config error too, so everything but out-of-memory exits 2. */
int cli_fail_config(ctrl_status st);

/* Prints "ctrl CMD: <message>" and a hint to --help; returns 2. */
int cli_usage_error(const ctrl_command *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* 1 when argv holds -h or --help (before any "--"). */
int cli_wants_help(int argc, char **argv);

/* Collects "--set section.key=value" / "--set=section.key=value" pairs from argv[first..];
 * other arguments go to `positional`. Returns 0, or prints a usage error and returns 2. */
int cli_split_sets(const ctrl_command *cmd, int argc, char **argv, const char **sets, int *n_sets,
                   const char **positional, int *n_positional, int cap);

/* The shared front of `train` and `config check`: argv is "CMD RUN.ini [--set s.k=v]..."; loads
 * the plugins and the validated config. Returns 0 with *cfg set, or the exit code after printing
 * the error. `what` names the command in the usage message ("config check"). */
int cli_load_run_config(ctrl_cli *cli, const ctrl_command *cmd, const char *what, int argc, char **argv,
                        const char **path, ctrl_config **cfg);

/* Set by SIGINT/SIGTERM; long work polls it, finishes its step, saves, and exits 130. */
int cli_interrupted(void);
void cli_install_signal_handlers(void);
/* OpenBLAS's kernels older than the CPU (cli/blas_restart.c): cli_blas_restart, first in main,
 * executes ctrl again with OPENBLAS_CORETYPE set; cli_blas_restart_note logs what it did, once the
 * log level is known. */
void cli_blas_restart(char **argv);
void cli_blas_restart_note(void);

extern const ctrl_command cli_cmd_train, cli_cmd_plugins, cli_cmd_config, cli_cmd_version, cli_cmd_model,
    cli_cmd_tokenize, cli_cmd_generate, cli_cmd_serve;

#endif
