/* The training loop (core) and what it is built from: SFT examples from JSONL, flat packed
 * batches, learning-rate schedules. DESIGN §6–§7. */
#ifndef CTRL_CORE_TRAIN_H
#define CTRL_CORE_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include <ctrl/config.h>

#include "model/model.h"
#include "config/config_load.h"
#include "tokenizer/tokenizer.h"

/* One tokenized example: ids and, per position, whether that token is trained (a label). A packed
 * example holds several sequences: seg[0..n_seg) are their lengths (n_seg == 0: one sequence). */
typedef struct ctrl_example {
    int32_t *ids;
    uint8_t *trained;
    int len;
    int *seg, n_seg;
} ctrl_example;

typedef struct ctrl_dataset {
    ctrl_example *ex;
    int n;
    long skipped_bad, dropped_empty, truncated;
    int packed_from; /* examples before packing (0: not packed) */
    /* How ctrl_batch_build lays examples out: padded rows (padding_free = false) end with a pad
     * segment up to the longest row; pad_multiple rounds row lengths (padded) or the batch length
     * (padding-free) up, as TRL's collator does. */
    int padded, pad_multiple;
    int32_t pad_id;
} ctrl_dataset;

/* Reads a JSONL (or JSON array) file in TRL's SFT formats (see train/sft_format.h: text,
 * prompt + completion, messages, ShareGPT conversations, input_ids), tokenizes, applies
 * completion_only_loss / assistant_only_loss / max_length / truncation_mode from [data], drops
 * examples left without a trained token (neither with [data] packing: packing truncates, as TRL).
 * A malformed row is an error naming file:line, or is skipped and counted when [data]
 * skip_bad_rows is true. */
ctrl_status ctrl_dataset_load_sft(const char *path, const ctrl_tokenizer *tok, const ctrl_config *cfg,
                                  ctrl_dataset *out);
/* The train and eval sets of [data]: train_file, then eval_file or an eval_fraction of the train
 * rows held out (seeded with [run] seed), each packed when [data] packing (eval: eval_packing,
 * unset = packing) or else truncated, and laid out as padding_free / pad_to_multiple_of say
 * (padding-free forced with bfd packing, as TRL). */
ctrl_status ctrl_datasets_load(const ctrl_config *cfg, const ctrl_tokenizer *tok, ctrl_dataset *train,
                               ctrl_dataset *eval);
void ctrl_dataset_free(ctrl_dataset *d);

/* The seeded hold-out of [data] eval_fraction over the *n rows of `size` bytes at `rows` (SFT's
 * examples, preference rows): the round(n * fraction) rows (at least 1) the seed picks move, in file
 * order, to *held (malloc'd, *n_held rows); the others close up in order at `rows` (*n their count).
 * CTRL_ERR_CONFIG when no row would be left to train, rows untouched. */
ctrl_status ctrl_hold_out_split(void *rows, size_t size, int *n, double fraction, uint64_t seed, void **held,
                                int *n_held);

/* Packs the examples with TRL's strategies (train/packing.c): "bfd", "bfd_split" or "wrapped". */
ctrl_status ctrl_dataset_pack(ctrl_dataset *d, int seq_length, const char *strategy);
/* Tokens over n * seq_length: how full the packed rows are. */
double ctrl_dataset_fill_rate(const ctrl_dataset *d, int seq_length);

/* Lays examples[idx[0..n)] out as one flat batch: one sequence per segment (positions restart;
 * targets are the next token where it is trained, else -100), pad segments as the dataset's layout
 * asks. Buffers are malloc'd into *b (free with ctrl_batch_free); returns the number of trained
 * targets (-1 when out of memory: the error is set and *b is empty), and in *tokens (may be NULL) what TRL's
 * num_tokens counts: the non-pad tokens of padded rows, the whole flat batch when padding-free. */
long ctrl_batch_build(const ctrl_dataset *d, const int *idx, int n, ctrl_batch *b, long *tokens);
void ctrl_batch_free(ctrl_batch *b);

/* transformers' get_scheduler semantics: the learning rate for optimizer step `step` (0-based). */
double ctrl_lr_at(const char *kind, double lr, long step, long total, long warmup, double min_lr_rate);

/* Runs [run] trainer on a config loaded by ctrl_config_load (its typed settings and the plugins
 * it resolved; the registry they came from must still be loaded): loads the model and tokenizer,
 * the data, the optimizer plugin, trains, logs metrics (terminal + output_dir/metrics.jsonl),
 * saves the model to output_dir. `interrupted` is polled between steps: the run then saves and
 * returns CTRL_ERR_INTERRUPTED. */
ctrl_status ctrl_train_run(const ctrl_config *cfg, int (*interrupted)(void));

#endif
