/* Training checkpoints: output_dir/checkpoint-STEP/ holds an HF model directory (config.json,
 * model.safetensors, tokenizer files), optimizer.safetensors (the optimizer's state buffers by name;
 * with ZeRO one optimizer.rank-R.safetensors per rank, each rank's slice) and trainer_state.json (step, data
 * position, seed, token count, the open logging window). It is written into checkpoint-STEP.tmp-PID, every
 * file fsynced, then renamed: a kill at any moment leaves either the previous checkpoints or the complete new
 * one. Directories that go (beyond save_total_limit, or replaced by a newer save of the same step) are first
 * renamed to a temporary name, so a checkpoint-STEP directory is always complete.
 *
 * The optimizer's step count is not part of its state: the loop passes it to every step() call,
 * so the buffers state_get exposes are all a plugin needs restored. */
#ifndef CTRL_CORE_CHECKPOINT_H
#define CTRL_CORE_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include <ctrl/optimizer.h>

#include "model/model.h"

/* Everything besides weights and optimizer buffers that a resumed run needs to continue the
 * same loss curve. */
typedef struct ctrl_train_state {
    long step;   /* optimizer steps done */
    long cursor; /* training examples consumed (the data position; the epoch is cursor / n) */
    long num_tokens;
    long n_examples;    /* the training set's size: the order is a function of (seed, cursor / n) */
    long max_steps;     /* written for readers (trainer_state.json), not restored */
    char optimizer[64]; /* the optimizer plugin whose buffers optimizer.safetensors holds */
    uint64_t seed;
    double win_loss, win_acc, win_norm, win_ent; /* sums over the logging window not yet written */
    int win;
    int world_size;       /* the data-parallel ranks that made it (1 in checkpoints from before) */
    int zero_stage;       /* ZeRO (core/train/zero.h): 0, or 1/2 with the optimizer state in per-rank files */
    uint64_t zero_layout; /* ZeRO: a hash of how the slices are cut (train_zero_layout; 0: not said) */
} ctrl_train_state;

/* A run whose optimizer state is sharded over `n` ranks (ZeRO): rank 0, saving, writes its own
 * state to optimizer.rank-0.safetensors and calls write(user, r, path) for each other rank's
 * optimizer.rank-R.safetensors. model_written (NULL: none), if set, is called once right after the
 * model's files, whatever their save returned (zero3's streamed save: the other ranks stop
 * serving layers before they send their optimizer slices); its error is kept if the save's was OK. */
typedef struct ctrl_checkpoint_shards {
    int n;
    ctrl_status (*write)(void *user, int rank, const char *path);
    void *user;
    ctrl_status (*model_written)(void *user);
} ctrl_checkpoint_shards;

/* What the run trains besides the model (a value model, core/train/online_ppo.c): save(user, dir)
 * writes its files into the checkpoint directory being made, before trainer_state.json marks it
 * complete. */
typedef struct ctrl_checkpoint_extra {
    ctrl_status (*save)(void *user, const char *dir);
    void *user;
} ctrl_checkpoint_extra;

/* The name of optimizer state buffer i in the optimizer files ("000003.exp_avg_sq"). */
void ctrl_checkpoint_state_key(char *key, size_t cap, int i, const char *name);

/* Copies file a to b (fsynced); with `missing`, a file a that does not exist is no error: 1 in
 * *missing, nothing done (without, it is one). */
ctrl_status ctrl_copy_file(const char *a, const char *b, int *missing);
/* Copies the tokenizer files present in FROM: tokenizer.json, tokenizer_config.json,
 * special_tokens_map.json, chat_template.jinja, added_tokens.json, vocab.json, merges.txt,
 * tokenizer.model. */
ctrl_status ctrl_copy_tokenizer_files(const char *from, const char *to);
/* [data] chat_template_path's template written as TO/chat_template.jinja: the saved model's chat
 * template (ahead of tokenizer_config.json's, for transformers and ctrl), as TRL saves the
 * tokenizer it set the template on. */
ctrl_status ctrl_save_chat_template(const char *template_path, const char *to);

/* Writes output_dir/checkpoint-<step> atomically, then removes the oldest checkpoints beyond
 * `keep` (0 keeps all). `extra` (may be NULL) adds its files. *written (may be NULL) receives the
 * directory. */
ctrl_status ctrl_checkpoint_save(const char *out_dir, ctrl_model *m, const char *tokenizer_dir,
                                 const ctrl_optimizer_ops *ops, ctrl_optimizer *opt,
                                 const ctrl_train_state *s, const ctrl_checkpoint_shards *shards,
                                 const ctrl_checkpoint_extra *extra, int keep, char *written, size_t cap);
/* An optimizer's state buffers (state_get, brought from its device by state_sync) into one
 * safetensors file at PATH, by ctrl_checkpoint_state_key; and back from one, onto its device. A
 * file with other buffers is an error. */
ctrl_status ctrl_checkpoint_save_optimizer(const char *path, const ctrl_optimizer_ops *ops,
                                           ctrl_optimizer *opt);
ctrl_status ctrl_checkpoint_load_optimizer(const char *path, const ctrl_optimizer_ops *ops,
                                           ctrl_optimizer *opt);
/* `spec` is a checkpoint directory or "last" (the newest complete checkpoint in out_dir). */
ctrl_status ctrl_checkpoint_resolve(const char *out_dir, const char *spec, char *path, size_t cap);
/* The newest complete checkpoint in out_dir into path, or 0 when there is none. */
int ctrl_checkpoint_last(const char *out_dir, char *path, size_t cap);
/* Restores the optimizer buffers and the trainer state (the weights load with ctrl_model_load).
 * A checkpoint made with another optimizer than `optimizer`, or with other buffers, is an error.
 * `zero_stage` is this run's (0: none): with a stage, this rank's optimizer.rank-R.safetensors
 * (R = `rank`) is read; a checkpoint sharded when the run is not, or the reverse, is an error. On
 * entry s->world_size is this run's number of ranks: a checkpoint made by another is an error;
 * s->zero_layout this run's slices: a checkpoint whose slices were cut otherwise is an error. */
ctrl_status ctrl_checkpoint_load_state(const char *dir, const char *optimizer, const ctrl_optimizer_ops *ops,
                                       ctrl_optimizer *opt, int zero_stage, int rank, ctrl_train_state *s);

#endif
