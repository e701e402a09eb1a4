/* The PNG of a run's curves (loss, grad_norm, learning_rate, token accuracy and entropy against
 * the step), drawn by gnuplot from output_dir/metrics.jsonl at the end of training. */
#ifndef CTRL_CORE_METRICS_PLOT_H
#define CTRL_CORE_METRICS_PLOT_H

#include <ctrl/status.h>

/* Writes `png` from the step lines of `metrics_jsonl`. CTRL_ERR_UNSUPPORTED (with a message saying
 * how to get it) when gnuplot is not installed; the run's results do not depend on the plot. */
ctrl_status ctrl_metrics_plot(const char *metrics_jsonl, const char *png);

#endif
