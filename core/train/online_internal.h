/* The online loop's internals, shared by online_loop.c (generation batches, micro-batches,
 * evaluation) and online_metrics.c (rewards, TRL's generation metrics, the logging window). */
#ifndef CTRL_CORE_ONLINE_INTERNAL_H
#define CTRL_CORE_ONLINE_INTERNAL_H

#include <stdio.h>

#include "generate/engine.h"
#include "generate/remote_engine.h"
#include "train/online.h"

#define MAX_METRICS 64

typedef struct online_value online_value; /* a token-level trainer's value model (online_ppo.c) */

struct ctrl_online {
    const ctrl_config *cfg;
    ctrl_model *model, *ref;
    int ref_borrowed; /* ref is the caller's (kind_online.c's sliced reference): not freed here */
    int zero3;        /* zero3 on several ranks (ctrl_online_create) */
    const ctrl_tokenizer *tok;
    const ctrl_trainer_ops *ops;
    ctrl_trainer *trainer;
    ctrl_online_spec spec;
    ctrl_prompt_set train, eval;
    ctrl_reward_set *rewards;
    ctrl_engine *engine; /* colocate */
    int sleep_level;
    ctrl_remote_server server; /* mode = server (url NULL: colocate) */
    FILE *completions;         /* log_completions */
    long batches;              /* generation batches so far (for the log) */
    ctrl_sampling_params sampling;
    int32_t stops[16];
    int n_stop;
    uint64_t seed;
    /* the current generation batch */
    int gn, used;
    int *gprompt, *trained;
    ctrl_gen_output *gout;
    float *adv, **old, **ref_lp;
    double gen_items;
    /* metrics of the logging window */
    char *mname[MAX_METRICS];
    double msum[MAX_METRICS];
    long mcount[MAX_METRICS];
    int n_metrics;
    /* data parallel (online_ranks.c): the per-device batch, and the window as last agreed */
    int bs;
    double msynced[MAX_METRICS];
    long csynced[MAX_METRICS];
    int sync_warned;
    online_value *value; /* spec.value_model (PPO), else NULL */
    /* the colocated engine's generation reads the whole model: gathered around it (ZeRO-3) */
    ctrl_status (*whole_weights)(void *ctx, int on);
    void *whole_ctx;
};

/* Completions [c0, c0 + n) of the generation batch as one flat batch: each sequence is its prompt
 * and completion, and the positions predicting completion token j are at[i] + j. */
typedef struct online_flat {
    ctrl_batch b;
    int32_t *tok, *pos, *tg, *cu;
    int *at;
} online_flat;
ctrl_status online_flat_build(const ctrl_online *o, const ctrl_prompt_set *ps, int c0, int n, online_flat *f);
void online_flat_free(online_flat *f);

/* The value model of a token-level trainer (PPO, online_ppo.c). create: loads it ([TRAINER]
 * value_model, default the policy's weights under a fresh value head) and its optimizer. rollout:
 * after the old and reference log-probs, the values of the generation batch and the trainer's
 * token_rollout (total: the rewards' weighted sums). batch: the micro-batch's value forward and
 * per-token targets into tb (the policy weights `w` become the trainer's policy mask); backward
 * (run = 0: only frees them) after the loss. shuffle: permutes the generation batch (each pass).
 * step: the value model's optimizer step after the policy's. */
ctrl_status online_value_create(ctrl_online *o, const ctrl_run_plugins *plugins);
ctrl_status online_value_rollout(ctrl_online *o, const float *total, int bs);
ctrl_status online_value_batch(ctrl_online *o, int c0, int n, const online_flat *f, float *w,
                               ctrl_trainer_batch *tb);
ctrl_status online_value_backward(ctrl_online *o, ctrl_trainer_batch *tb, int run);
void online_value_shuffle(ctrl_online *o);
ctrl_status online_value_zero_grad(ctrl_online *o);
ctrl_status online_value_step(ctrl_online *o, double lr, long step);
/* Checkpoints: its weights and optimizer state into DIR; back from DIR when resuming after `step`
 * optimizer steps (the shuffle stream where it was). */
ctrl_status online_value_save(ctrl_online *o, const char *dir);
ctrl_status online_value_load(ctrl_online *o, const char *dir, long step);
/* zero3 (the value model sliced): on each rank but 0 while rank 0 is in online_value_save, its slices
 * of the weights and its optimizer state sent to rank 0; nothing otherwise. */
ctrl_status online_value_serve(ctrl_online *o);
void online_value_free(ctrl_online *o);

/* The trainer plugins' metrics callback (ctx: the ctrl_online). */
void online_report(void *ctx, const char *name, double value);
/* Scores completions [c0, c0 + n) of the generation batch: rewards per function into *scores
 * ([gn][functions]), weighted totals into *total (malloc'd for the whole batch, 0 elsewhere). */
ctrl_status online_score(ctrl_online *o, const ctrl_prompt_set *ps, int c0, int n, float **scores,
                         float **total);
/* Mean of x[0], x[stride], ... ignoring NaN; *std (may be NULL) the Bessel-corrected std. */
double online_nanmean(const float *x, int n, int stride, double *std);
void online_generation_metrics(ctrl_online *o, const float *scores, const float *total);
void online_log_completions(ctrl_online *o, const float *scores);
void online_write_metric(FILE *f, const char *name, double v);

/* Data parallel (online_ranks.c; each a no-op or the identity on one rank). Of a generation batch
 * of N x bs x steps_per_generation completions, rank r trains micro-batch u on completions
 * [(u N + r) bs, + bs), the part of one process's micro-batch u of N x bs that is its, and samples
 * and scores a block of the prompts; online_gather then gives every rank the whole batch, so that
 * advantages are over whole groups and the generation metrics are the batch's, as TRL's gather. */
int online_mine(const ctrl_online *o, int c);  /* completion c is one this rank trains on */
int online_slice(const ctrl_online *o, int u); /* the first completion of micro-batch u */
ctrl_status online_gather(ctrl_online *o, int c0, int n, float *scores, float *total);
/* Each completion's KL sum and token count from the rank that trains on it. */
ctrl_status online_gather_kl(ctrl_online *o, float *kl, int *ntok);
/* Per-token rows of every completion (rows[i]: gout[i].len values), each computed by the rank that
 * trains completion i (NULL elsewhere): given to every rank (PPO's rollout reads the whole batch). */
ctrl_status online_gather_rows(ctrl_online *o, float **rows);

#endif
