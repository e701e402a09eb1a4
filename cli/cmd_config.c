/* ctrl config check RUN.ini [--set ...] | ctrl config reference [--out FILE] */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "config/config_load.h"
#include "train/run_files.h"

static int check(ctrl_cli *cli, int argc, char **argv) {
    const char *path;
    ctrl_config *cfg;
    char *args[256];
    int n = 0, files = 1;
    for (int i = 0; i < argc && n < 256; i++) { /* --no-files: the config alone (one for another machine) */
        if (i > 0 && !strcmp(argv[i], "--no-files"))
            files = 0;
        else
            args[n++] = argv[i];
    }
    int rc = cli_load_run_config(cli, &cli_cmd_config, "config check", n, args, &path, &cfg);
    if (rc) return rc;
    ctrl_status st = files ? ctrl_run_files_check(cfg) : CTRL_OK; /* the files it names exist and read */
    if (st != CTRL_OK) {
        ctrl_config_free(cfg);
        return cli_fail(st);
    }
    printf("%s: ok (trainer %s, output_dir %s)\n", path, ctrl_config_get_string(cfg, "run", "trainer"),
           ctrl_config_get_string(cfg, "run", "output_dir"));
    ctrl_config_free(cfg);
    return 0;
}

static int reference(ctrl_cli *cli, int argc, char **argv) {
    const char *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out_path = argv[++i];
        else
            return cli_usage_error(&cli_cmd_config, "config reference: unexpected argument '%s'", argv[i]);
    }
    ctrl_registry *reg;
    ctrl_status st = cli_plugins(cli, &reg);
    if (st != CTRL_OK) return cli_fail(st);
    FILE *out = stdout;
    if (out_path && !(out = fopen(out_path, "w"))) {
        ctrl_error_set(CTRL_ERR_IO, "%s: %s", out_path, strerror(errno));
        return cli_fail(CTRL_ERR_IO);
    }
    st = ctrl_config_reference_write(reg, out);
    if (out != stdout && fclose(out) != 0 && st == CTRL_OK)
        st = ctrl_error_set(CTRL_ERR_IO, "%s: %s", out_path, strerror(errno));
    return st == CTRL_OK ? 0 : cli_fail(st);
}

static int run_config(ctrl_cli *cli, int argc, char **argv) {
    if (argc < 2) return cli_usage_error(&cli_cmd_config, "expected 'check' or 'reference'");
    if (!strcmp(argv[1], "check")) return check(cli, argc - 1, argv + 1);
    if (!strcmp(argv[1], "reference")) return reference(cli, argc - 1, argv + 1);
    return cli_usage_error(&cli_cmd_config, "unknown subcommand '%s' (expected check or reference)", argv[1]);
}

const ctrl_command cli_cmd_config = {
    .name = "config",
    .summary = "validate a run config, or print the config reference",
    .usage = "usage: ctrl config check RUN.ini [--set section.key=value]... [--no-files]\n"
             "       ctrl config reference [--out FILE]\n\n"
             "check: full validation of RUN.ini and the overrides (sections, keys, types, ranges,\n"
             "choices, required keys, plugin names, and each selected plugin's checks of its\n"
             "options) and the files it names (the model's config.json, the data of the chosen\n"
             "split, the chat template, the adapter, the checkpoint) without training; exits 0\n"
             "when valid, 2 with a message naming file:line and the key when not. --no-files\n"
             "checks the config alone (one written for another machine).\n"
             "reference: the Markdown reference of every section and key, core and plugins\n"
             "(docs/config-reference.md is generated with it).\n",
    .run = run_config,
};
