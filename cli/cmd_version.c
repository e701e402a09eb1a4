/* ctrl version: the version, the plugin ABI and the build's traits. */
#include <stdio.h>

#include "cli.h"

static int run_version(ctrl_cli *cli, int argc, char **argv) {
    (void)cli;
    (void)argv;
    if (argc > 1) return cli_usage_error(&cli_cmd_version, "takes no arguments");
    printf("ctrl %s (plugin ABI %u, signature %s, CUDA %s)\n", ctrl_version(), CTRL_PLUGIN_ABI,
           CTRL_PLUGIN_SIGNATURE,
#ifdef CTRL_HAVE_CUDA
           "built"
#else
           "not built"
#endif
    );
    return 0;
}

const ctrl_command cli_cmd_version = {
    .name = "version",
    .summary = "print the version and the plugin ABI",
    .usage = "usage: ctrl version\n\nPrints the version, the plugin ABI number and signature, and whether\n"
             "the CUDA backend was built.\n",
    .run = run_version,
};
