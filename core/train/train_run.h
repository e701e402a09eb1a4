/* What the training run's files share (train_loop.c, train_setup.c, train_optimizer.c,
 * train_step.c, train_eval_save.c, train_run_memory.c): the run's state and the pieces of the run
 * each file owns. Internal to core/train. */
#ifndef CTRL_CORE_TRAIN_RUN_H
#define CTRL_CORE_TRAIN_RUN_H

#include <ctrl/memory.h>
#include <ctrl/optimizer.h>
#include <ctrl/trainer.h>

#include "train/checkpoint.h"
#include "train/data_parallel.h"
#include "train/memory_report.h"
#include "train/metrics_log.h"
#include "train/health.h"
#include "train/kind.h"
#include "train/train.h"
#include "train/zero.h"
#include "train/zero_generate.h"

typedef struct run_state {
    const ctrl_config *cfg; /* for the plugins' create() and the kind's data */
    const ctrl_run_settings *s;
    ctrl_model *model;
    ctrl_tokenizer *tok;
    const ctrl_trainer_ops *trainer_ops;
    ctrl_trainer *trainer;
    const ctrl_optimizer_ops *opt_ops;
    ctrl_optimizer *opt;
    ctrl_param_group *groups;
    int n_groups;
    int opt_on_device; /* the optimizer steps the model's device buffers (ctrl_model_device_params) */
    train_metrics_log metrics;
    train_compute comp;
    const train_kind_ops *kind_ops; /* what kind of trainer: its rows, micro-batches, evaluation */
    train_kind *kind;
    train_health health;
    train_dp dp; /* this rank's share of each step (data_parallel.h); root: writes the run's files */
    int root;
    train_zero zero;          /* ZeRO stage 1/2 (zero.h): this rank's slice of the optimizer state */
    train_zero_gen zgen;      /* zero3's generation phases (zero_generate.h) */
    train_memory mem;         /* the process's memory at the edges of the first step (memory_report.h) */
    struct train_offload *ov; /* offload_optimizer's host step overlapped (offload_overlap.h; NULL: not) */
} run_state;

/* train_setup.c: the plugins, the model, the tokenizer, the kind's data, the optimizer (whose
 * weights from `weights_dir` when resuming); teardown frees what setup made. */
ctrl_status train_run_setup(run_state *r, const char *weights_dir);
void train_run_teardown(run_state *r);

/* train_optimizer.c: the parameter groups and the optimizer, where it steps (the device, the host,
 * offload_optimizer, this rank's ZeRO slices); `offload` bit 0: offload_optimizer. */
ctrl_status train_run_optimizer_create(run_state *r, int offload);

/* train_step.c: one optimizer step over `ga` micro-batches of `bs` rows from order[*cursor...]. */
ctrl_status train_run_step(run_state *r, const int *order, long *cursor, int bs, int ga, double lr, long step,
                           train_step_stats *out, double *grad_norm);

/* train_eval_save.c: the logging window, evaluation, checkpoints, interruption. */
ctrl_status train_run_log_window(run_state *r, ctrl_train_state *ts, long total, double lr, double rate);
ctrl_status train_run_evaluate(run_state *r, int has_eval, long step);
ctrl_status train_run_save_checkpoint(run_state *r, const char *out_dir, const ctrl_train_state *ts);
ctrl_status train_run_save_interrupted(run_state *r, const char *out_dir, const ctrl_train_state *ts,
                                       const char *when);
void train_run_name_last_checkpoint(ctrl_status st, const char *out_dir);

/* train_run_memory.c: what each rank holds in memory, logged after loading and after the first step. */
ctrl_status train_run_report_load_memory(const run_state *r, int sliced);
ctrl_status train_run_report_resident(run_state *r);
void train_run_report_offload(const run_state *r);

#endif
