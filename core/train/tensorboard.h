/* TensorBoard event files (`[train] report_to = tensorboard`): TFRecord framing (length, masked
 * CRC32C of the length, the record, masked CRC32C of the record) around Event protocol buffers --
 * first the file_version "brain.Event:2", then one Event per step holding Summary.Value{tag,
 * simple_value} scalars, as torch.utils.tensorboard.SummaryWriter.add_scalar writes them. */
#ifndef CTRL_TRAIN_TENSORBOARD_H
#define CTRL_TRAIN_TENSORBOARD_H

#include <stddef.h>
#include <stdint.h>

#include <ctrl/status.h>

typedef struct ctrl_tb_writer ctrl_tb_writer;

/* CRC-32C (Castagnoli) of n bytes, and the TFRecord mask over it. */
uint32_t ctrl_crc32c(const void *data, size_t n);
uint32_t ctrl_tb_masked_crc(uint32_t crc);

/* Opens `path` for writing and writes the file_version event stamped `wall_time` (seconds). */
ctrl_status ctrl_tb_open_file(const char *path, double wall_time, ctrl_tb_writer **out);
/* Creates `logdir` and an events.out.tfevents.<time>.<host>.<pid>.0 file in it, stamped now. */
ctrl_status ctrl_tb_open(const char *logdir, ctrl_tb_writer **out);
/* One Event at `step` holding the n scalars (tags[i], values[i]). */
ctrl_status ctrl_tb_scalars(ctrl_tb_writer *w, double wall_time, int64_t step, const char *const *tags,
                            const float *values, int n);
/* The metrics of one metrics.jsonl line: every number but "step" as a scalar at that step, tagged as
 * the HF Trainer's TensorBoard callback tags them (eval_x -> eval/x, x -> train/x). */
ctrl_status ctrl_tb_metrics_line(ctrl_tb_writer *w, double wall_time, const char *json_line);
ctrl_status ctrl_tb_close(ctrl_tb_writer *w); /* flushes; NULL does nothing */

#endif
