/* Where the loop's logged metrics go: output_dir/metrics.jsonl always, and TensorBoard event files
 * in output_dir/runs/ with `[train] report_to = tensorboard`. The kinds write a logging window's or
 * an evaluation's JSON lines to the stage; commit moves them to every sink, so each sink sees the
 * same records. */
#ifndef CTRL_TRAIN_METRICS_LOG_H
#define CTRL_TRAIN_METRICS_LOG_H

#include <stdio.h>

#include <ctrl/status.h>

#include "train/tensorboard.h"

typedef struct train_metrics_log {
    FILE *file;  /* output_dir/metrics.jsonl */
    FILE *stage; /* open_memstream over stage_buf */
    char *stage_buf;
    size_t stage_len;
    ctrl_tb_writer *tb; /* NULL without report_to = tensorboard */
} train_metrics_log;

/* metrics.jsonl new, or on resume its lines up to resume_step kept (a killed run may have logged
 * past it) and appended to; with `tensorboard` a new event file in output_dir/runs/. */
ctrl_status train_metrics_open(train_metrics_log *m, const char *out_dir, long resume_step, int tensorboard);
/* The stream the kinds write lines to; NULL when not open (the ranks but the root). */
FILE *train_metrics_stage(train_metrics_log *m);
/* The staged lines to metrics.jsonl and the event file. */
ctrl_status train_metrics_commit(train_metrics_log *m);
void train_metrics_close(train_metrics_log *m);

#endif
