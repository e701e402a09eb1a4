/* The engine's state, shared by engine.c (life cycle, sleep, the one-call generate) and
 * engine_schedule.c (requests, the scheduler step). Not part of any public API. */
#ifndef CTRL_CORE_ENGINE_INTERNAL_H
#define CTRL_CORE_ENGINE_INTERNAL_H

#include "generate/decode_threads.h"
#include "generate/engine.h"
#include "generate/prefix_cache.h"

enum { WAITING, RUNNING, FORK_PENDING, FINISHED };

/* A request while it runs: the caller's request (its prompt stays the caller's until it finishes). */
typedef struct gen_req {
    ctrl_gen_request r;
    const ctrl_gen_output *outs; /* its r.n outputs, as added (what ctrl_engine_cancel names) */
    int left;                    /* samples not finished */
    int refs;                    /* sequences still pointing here */
} gen_req;

typedef struct gen_seq {
    gen_req *rq;
    int state, forked;
    ctrl_kv_seq kv;
    int32_t *tokens; /* prompt + generated: what a recompute after preemption prefills */
    int n_tokens, cap;
    ctrl_rng rng;
    ctrl_gen_output *out;
    int out_cap; /* tokens out's arrays hold (grown by doubling, not per token) */
    long mark;   /* the step that last picked it (engine_pick.c) */
} gen_seq;

/* A token to draw after a decode step: from `logits`, for `s` (filled in parallel, recorded in order). */
typedef struct gen_draw {
    gen_seq *s;
    const float *logits; /* host sampling: its row of the step's logits */
    int row;             /* that row's index (sampling on the device reads the device's copy) */
    int32_t tok;
    float logprob;
    int32_t *top_ids; /* the request's top_logprobs entries, in the step's scratch */
    float *top_lps;
} gen_draw;

struct ctrl_engine {
    ctrl_model *model;
    ctrl_engine_config cfg;
    ctrl_kv_cache *kv;         /* NULL while asleep */
    ctrl_prefix_cache *prefix; /* NULL unless cfg.prefix_cache */
    int asleep;
    int prefill_chunk; /* ctrl_engine_set_prefill_chunk; 0: none */
    long steps, preemptions, shared_blocks, generated, joined;
    long longrope_recomputes; /* Phi-3 sequences computed again on longrope's long factors */
    long device_draws;        /* tokens drawn on the device (engine_draw_device.c) */
    int threads_logged;       /* [generation] decode_threads said in the log */
    gen_seq *seqs;            /* in arrival order; finished ones leave at the next step */
    int n, cap;
    int stepped; /* a step ran for the requests present (a request added now joins them) */
    /* one step's scratch, for `scratch` sequences */
    gen_seq **batch;
    int *n_new;
    int32_t *tokens;
    ctrl_kv_seq **kvs;
    float *logits;
    int scratch;
    gen_draw *draws; /* one per sequence at most */
    int draws_cap;
};

/* Fills batch / n_new with the step's sequences (engine_pick.c); how many. */
int engine_pick(ctrl_engine *e);
/* Whether the step's draws run on the model's device (its backend has a `sample` op): the logits
 * then stay there (engine_draw_device.c). */
int engine_draws_on_device(const ctrl_engine *e);
/* The draws[n] on the device: each draw's tok, logprob and top entries (engine_draw_device.c). */
ctrl_status engine_draw_device(ctrl_engine *e, gen_draw *draws, int n);

#endif
