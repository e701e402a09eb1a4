/* ctrl train RUN.ini [--set section.key=value]... */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "collective/collective.h"
#include "config/config_load.h"
#include "train/data_parallel.h"
#include "train/train.h"

/* mkdir -p */
static ctrl_status make_dirs(const char *path) {
    char buf[4096];
    if (strlen(path) >= sizeof buf) return ctrl_error_set(CTRL_ERR_IO, "%s: path too long", path);
    strcpy(buf, path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return ctrl_error_set(CTRL_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return ctrl_error_set(CTRL_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
    return CTRL_OK;
}

static int train_ranked(const char *ini, ctrl_config *cfg) {
    const char *out_dir = ctrl_config_get_string(cfg, "run", "output_dir");
    char path[4096];
    ctrl_status st = train_dp_agree_config(cfg); /* every rank runs rank 0's config */
    if (st == CTRL_OK && ctrl_collective_is_root()) {
        snprintf(path, sizeof path, "%s/config.ini", out_dir);
        st = ctrl_config_write_effective(cfg, path);
    }
    if (st == CTRL_OK) {
        /* the plugins the config resolved stay loaded in cli's registry for the run */
        if (ctrl_collective_is_root()) CTRL_INFO("%s: effective config written to %s", ini, path);
        st = ctrl_train_run(cfg, cli_interrupted);
    }
    if (st != CTRL_OK && ctrl_collective_size() > 1)
        st = ctrl_error_wrap(st, "rank %d", ctrl_collective_rank());
    return st == CTRL_OK ? 0 : cli_fail(st);
}

/* Several ranks on one node, OMP_NUM_THREADS unset: OpenMP's default (every core a rank may use)
 * in each would oversubscribe the node, so each takes its part of the cores it sees. */
static void share_cores(void) {
    const ctrl_collective_info *ci = ctrl_collective_info_get();
    if (ci->local_size < 2 || getenv("OMP_NUM_THREADS")) return;
    const int procs = omp_get_num_procs(), threads = procs / ci->local_size > 1 ? procs / ci->local_size : 1;
    omp_set_num_threads(threads);
    if (ctrl_collective_is_root())
        CTRL_INFO("%d ranks on this node, OMP_NUM_THREADS unset: %d OpenMP thread(s) each (%d cores seen)",
                  ci->local_size, threads, procs);
}

/* Under mpirun or srun, one rank of a data-parallel run (core/collective/): rank 0 alone writes
 * the effective config, metrics, checkpoints and the model; the others log warnings and errors
 * only (with their rank before each line). Every rank reads the config before MPI starts, so that
 * [train] ddp_timeout watches MPI_Init too (a rank that never arrives is named, not waited for),
 * and the ranks then check that they run the same one. A rank that fails ends the whole job
 * (MPI_Abort), so that none is left waiting in a collective. */
static int run_train(ctrl_cli *cli, int argc, char **argv) {
    ctrl_collective_detect();
    if (!ctrl_collective_is_root() && ctrl_log_get_level() < CTRL_LOG_WARN) ctrl_log_set_level(CTRL_LOG_WARN);
    const char *ini;
    ctrl_config *cfg;
    int rc = cli_load_run_config(cli, &cli_cmd_train, "train", argc, argv, &ini, &cfg);
    if (rc) return rc;
    ctrl_log_level level; /* [run] log_level, unless --log-level said otherwise; ranks but 0 warn at most */
    if (!cli->log_level_set && ctrl_log_level_parse(ctrl_config_settings(cfg)->run.log_level, &level) == 0)
        ctrl_log_set_level(ctrl_collective_is_root() || level >= CTRL_LOG_WARN ? level : CTRL_LOG_WARN);
    cli_blas_restart_note();
    const char *out_dir = ctrl_config_get_string(cfg, "run", "output_dir");
    ctrl_status st = make_dirs(out_dir);
    ctrl_collective_set_timeout(ctrl_config_settings(cfg)->train.ddp_timeout);
    ctrl_collective_set_start_dir(out_dir);
    if (st == CTRL_OK) st = ctrl_collective_init();
    if (st != CTRL_OK) {
        ctrl_config_free(cfg);
        return cli_fail(st);
    }
    share_cores();
    rc = train_ranked(ini, cfg);
    ctrl_config_free(cfg);
    ctrl_collective_finalize(rc != 0 && rc != 130, rc);
    return rc;
}

const ctrl_command cli_cmd_train = {
    .name = "train",
    .summary = "run a training job described by an INI file",
    .usage = "usage: ctrl train RUN.ini [--set section.key=value]...\n\n"
             "Validates RUN.ini and the overrides in full, writes the effective config to\n"
             "output_dir/config.ini, then trains with the trainer named by [run] trainer.\n"
             "SIGINT/SIGTERM finish the current step, save a checkpoint and exit 130.\n\n"
             "Data parallel: `mpirun -np N ctrl train RUN.ini` (or srun) runs N ranks, each on its\n"
             "share of every batch (effective batch = per_device_train_batch_size x N x\n"
             "gradient_accumulation_steps); `[run] device = cuda` takes each rank's local GPU.\n",
    .run = run_train,
};
