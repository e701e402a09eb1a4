/* Online training (grpo, rloo, ...; DESIGN §7, §9): prompts are sampled num_generations times by
 * the generation engine from the live weights, scored by the reward plugins, turned into
 * advantages by the trainer plugin, and trained on in micro-batches; the core loop
 * (train_loop.c) owns steps, clipping, the optimizer, logging and checkpoints. */
#ifndef CTRL_CORE_ONLINE_H
#define CTRL_CORE_ONLINE_H

#include <stdint.h>
#include <stdio.h>

#include <ctrl/reward.h>
#include <ctrl/trainer.h>

#include "model/model.h"
#include "config/config_load.h"
#include "tokenizer/tokenizer.h"

/* A prompt dataset: TRL's prompt-only format (`prompt` as text or a message list); every other
 * column goes to the reward functions as JSON text. */
typedef struct ctrl_prompt_set {
    int n, n_cols;
    int32_t **ids;
    int *len;
    char **text;     /* [n] the prompt as the reward functions see it (rendered for messages) */
    char **messages; /* [n] a conversational prompt's message list as JSON text, else NULL */
    char **cols;     /* [n_cols] column names */
    char ***values;  /* [n][n_cols] JSON text, NULL where the row lacks the column */
} ctrl_prompt_set;

/* Reads `path` ([data] prompt_field names the prompt column). Conversational prompts go through the
 * chat template with the generation prompt, text prompts are encoded with special tokens (as TRL).
 * Errors name file:line. */
ctrl_status ctrl_prompt_set_load(const char *path, const ctrl_tokenizer *tok, const ctrl_config *cfg,
                                 ctrl_prompt_set *out);
void ctrl_prompt_set_free(ctrl_prompt_set *p);

/* The [reward.NAME] functions of the config, created from their plugins. */
typedef struct ctrl_reward_set ctrl_reward_set;
ctrl_status ctrl_reward_set_create(const ctrl_config *cfg, const ctrl_run_plugins *plugins,
                                   ctrl_reward_set **out);
int ctrl_reward_set_count(const ctrl_reward_set *r);
const char *ctrl_reward_set_name(const ctrl_reward_set *r, int i);
/* scores[n * count]: function k's score of completion i at [i * count + k]; total[n]: the weighted
 * sum over the functions that applied, NaN where none did (TRL's nansum + unscorable mask). */
ctrl_status ctrl_reward_set_score(ctrl_reward_set *r, const ctrl_reward_batch *b, float *scores,
                                  float *total);
void ctrl_reward_set_free(ctrl_reward_set *r);

typedef struct ctrl_online ctrl_online;

/* Metrics of the logging window: every name reported since the last ctrl_online_log_window, with
 * its mean, written as `"name": value, ` pairs. */
typedef void (*ctrl_online_metric_fn)(void *ctx, const char *name, double value);

/* `ref`: the frozen reference the caller loaded (zero3 on several ranks: sliced as the policy,
 * kind_online.c), borrowed, its forwards collectives that every rank runs alike (completion_logps:
 * the same count of micro-batches on each rank); NULL: loaded here whole when the trainer needs it.
 * `zero3`: zero3 on several ranks (train_kind_env's zero3_frozen: the policy sliced, with LoRA its
 * frozen base): a value model (PPO) on the CPU is sliced too (online_ppo.c), trained in full beside
 * the policy's adapters as TRL's PPO with a peft_config trains it. */
ctrl_status ctrl_online_create(const ctrl_config *cfg, const ctrl_run_plugins *plugins, ctrl_model *model,
                               const ctrl_tokenizer *tok, const ctrl_trainer_ops *ops, ctrl_trainer *trainer,
                               ctrl_model *ref, int zero3, ctrl_online **out);
/* ZeRO-3: the colocated generation reads the whole model, gathered by whole(ctx, 1) before and
 * released by whole(ctx, 0) after (DeepSpeed's ds3_gather_for_generation); server mode's weight
 * push makes it readable with gather (ctrl_remote_server.whole: train_zero_push). NULL: none. */
void ctrl_online_set_whole_weights(ctrl_online *o, ctrl_status (*whole)(void *ctx, int on), void *ctx,
                                   ctrl_status (*gather)(void *ctx, int on), void *gather_ctx);
int ctrl_online_prompt_count(const ctrl_online *o);
/* Completions in a micro-batch of per_device_train_batch_size `bs` (prompts when the trainer counts
 * prompts: bs x num_generations). */
static inline int ctrl_online_micro_batch(const ctrl_online_spec *spec, int bs) {
    return spec->batch_counts_prompts ? bs * spec->num_generations : bs;
}
/* One optimizer step's gradients: `ga` micro-batches of `bs` completions, generating a new batch
 * (prompts taken from order[*cursor ...]) whenever the previous one is used up. Adds the loss
 * and the tokens seen to *loss and *tokens. */
ctrl_status ctrl_online_accumulate(ctrl_online *o, const int *order, long *cursor, int bs, int ga,
                                   double *loss, long *tokens);
/* After each optimizer step: in server mode, pushes the new weights to the server (POST
 * /update_weights), so the next generation uses them; colocated, nothing to do. */
ctrl_status ctrl_online_after_step(ctrl_online *o);
/* Right after the policy's optimizer step at learning rate lr (step counts from 1): a value
 * model's own step (PPO); nothing otherwise. */
ctrl_status ctrl_online_optimizer_step(ctrl_online *o, double lr, long step);
/* Checkpoints: what the online loop trains besides the policy (a value model: its weights and
 * optimizer state) into DIR, a checkpoint being written; and back from one when a run resumes
 * after `step` optimizer steps (a warning when that step falls inside a generation batch: the
 * resumed run samples a new one where the uninterrupted run trained on). Nothing to do for GRPO
 * and RLOO beyond that warning. */
ctrl_status ctrl_online_save_state(ctrl_online *o, const char *dir);
ctrl_status ctrl_online_load_state(ctrl_online *o, const char *dir, long step);
/* Under zero3 with the value model sliced: on every rank but 0, while rank 0 writes the checkpoint
 * (after the policy's optimizer state went), what rank 0's ctrl_online_save_state writes of this
 * rank's (online_value_serve); nothing otherwise. */
ctrl_status ctrl_online_save_serve(ctrl_online *o);
/* Adds a value to the window's metric `name` (logged as the window's mean). */
void ctrl_online_report(ctrl_online *o, const char *name, double value);
/* Data parallel: the metrics reported on every rank since the last call summed into each (call
 * on every rank after each step, before the window is logged). */
ctrl_status ctrl_online_sync_metrics(ctrl_online *o);
/* Writes the window's metrics as JSON members ("name": mean, ...) and resets them. */
void ctrl_online_log_window(ctrl_online *o, FILE *f);
/* num_generations completions of each [data] eval_file prompt, sampled as in training (TRL's
 * evaluation) from a fixed seed stream, scored: a metrics line with eval_reward and
 * eval_rewards/NAME/mean (f: rank 0's; NULL on the others). With N ranks each samples and scores
 * its batches' prompts (per_device_eval_batch_size / num_generations prompts a batch, batch i on
 * rank i % N) and the sums are reduced: one process's values. No eval file: nothing. */
ctrl_status ctrl_online_evaluate(ctrl_online *o, long step, FILE *f);
/* Whether there are eval prompts ([data] eval_file): the same on every rank. */
int ctrl_online_has_eval(const ctrl_online *o);
void ctrl_online_free(ctrl_online *o);

#endif
