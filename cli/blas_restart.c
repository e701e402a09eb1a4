/* ctrl restarts itself with OPENBLAS_CORETYPE set where OpenBLAS chose kernels older than the CPU
 * (kernels/cpu/blas_core.c says when and why): first thing in main, the process executes itself
 * again -- the same pid, name and arguments, so mpirun and srun see nothing change -- with the variable
 * set, which OpenBLAS reads only when it loads. A user's own OPENBLAS_CORETYPE is left alone. */
#include <stdlib.h>
#include <unistd.h>

#include <ctrl/log.h>

#include "cli.h"
#include "cpu/cpu_ops.h"

#define RESTARTED "CTRL_BLAS_RESTARTED" /* set for the restarted process: OpenBLAS's first choice */

static const char *failed_core, *failed_better; /* the restart failed: said by cli_blas_restart_note */

void cli_blas_restart(char **argv) {
    if (getenv("OPENBLAS_CORETYPE")) return;
    const char *current, *better = ctrl_cpu_blas_core_advice(&current);
    if (!better) return;
    if (setenv("OPENBLAS_CORETYPE", better, 1) == 0 && setenv(RESTARTED, current, 1) == 0) {
        /* the binary's own path, so that the process keeps its name (ps, pgrep, killall: "exe"
         * through /proc/self/exe); that link where the path is gone. execv returns only on failure. */
        char self[4096];
        const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0) self[n] = 0, execv(self, argv);
        execv("/proc/self/exe", argv);
    }
    unsetenv("OPENBLAS_CORETYPE"), unsetenv(RESTARTED);
    failed_core = current, failed_better = better;
}

void cli_blas_restart_note(void) {
    const char *was = getenv(RESTARTED), *now = getenv("OPENBLAS_CORETYPE");
    if (was && now)
        ctrl_log(CTRL_LOG_INFO,
                 "cpu: OpenBLAS chose its %s kernels, older than this CPU; ctrl restarted itself with "
                 "OPENBLAS_CORETYPE=%s (set OPENBLAS_CORETYPE yourself to choose)",
                 was, now);
    else if (failed_core)
        ctrl_log(CTRL_LOG_WARN,
                 "cpu: OpenBLAS chose its %s kernels, older than this CPU, and ctrl could not restart "
                 "itself: set OPENBLAS_CORETYPE=%s for products several times faster",
                 failed_core, failed_better);
    unsetenv(RESTARTED); /* programs ctrl starts decide for themselves */
}
