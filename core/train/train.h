/* The training loop (core) and what it is built from: SFT examples from JSONL, flat packed
 * batches, learning-rate schedules. DESIGN §6–§7. */
#ifndef CTRL_CORE_TRAIN_H
#define CTRL_CORE_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include <ctrl/config.h>

#include "model/model.h"
#include "registry.h"
#include "tokenizer/tokenizer.h"

/* One tokenized example: ids and, per position, whether that token is trained (a label). */
typedef struct ctrl_example {
    int32_t *ids;
    uint8_t *trained;
    int len;
} ctrl_example;

typedef struct ctrl_dataset {
    ctrl_example *ex;
    int n;
    long skipped_bad, dropped_empty, truncated;
} ctrl_dataset;

/* Reads a JSONL (or JSON array) file in TRL's SFT formats (see train/sft_format.h: text,
 * prompt + completion, messages, ShareGPT conversations, input_ids), tokenizes, applies
 * completion_only_loss / assistant_only_loss / max_length / truncation_mode from [data], drops
 * examples left without a trained token. A malformed row is an error naming file:line, or is
 * skipped and counted when [data] skip_bad_rows is true. */
ctrl_status ctrl_dataset_load_sft(const char *path, const ctrl_tokenizer *tok, const ctrl_config *cfg,
                                  ctrl_dataset *out);
void ctrl_dataset_free(ctrl_dataset *d);

/* Packs examples[idx[0..n)] into one flat batch (positions restart per example; targets are the
 * next token where it is trained, else -100). Buffers are malloc'd into *b (free with
 * ctrl_batch_free); returns the number of trained targets. */
long ctrl_batch_build(const ctrl_dataset *d, const int *idx, int n, ctrl_batch *b);
void ctrl_batch_free(ctrl_batch *b);

/* transformers' get_scheduler semantics: the learning rate for optimizer step `step` (0-based). */
double ctrl_lr_at(const char *kind, double lr, long step, long total, long warmup, double min_lr_rate);

/* Runs [run] trainer on the validated config: loads the model and tokenizer, the data, the
 * optimizer plugin, trains, logs metrics (terminal + output_dir/metrics.jsonl), saves the model to
 * output_dir. `interrupted` is polled between steps: the run then saves and returns
 * CTRL_ERR_INTERRUPTED. */
ctrl_status ctrl_train_run(const ctrl_config *cfg, const ctrl_registry *reg, int (*interrupted)(void));

#endif
