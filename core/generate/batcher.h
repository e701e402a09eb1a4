/* The request queue in front of an incremental engine (ctrl serve's batcher; no HTTP in it): one
 * worker thread owns the engine; callers queue jobs (one or more requests) and wait. Between
 * engine steps the worker adds every job queued meanwhile to the running generation (continuous
 * batching across callers: a short job that arrives during a long one is handed back as soon as its
 * own requests finish), and hands each job back when its last request finishes. Per-request seeds
 * keep every request's tokens independent of what it ran with. The engine lock is held from the
 * first job of a busy period until the engine is idle again, so whoever takes it (weight updates,
 * sleep, prefix-cache resets) runs between generations, never inside one. */
#ifndef CTRL_CORE_BATCHER_H
#define CTRL_CORE_BATCHER_H

#include <stdatomic.h>

#include "generate/engine.h"

typedef struct ctrl_batcher ctrl_batcher;

typedef struct ctrl_batcher_stats {
    long generations; /* busy periods so far */
    long max_jobs;    /* the most jobs one of them carried */
    long joined;      /* requests added to a generation already running */
} ctrl_batcher_stats;

/* Starts the worker over `e` (which it drives until ctrl_batcher_stop). */
ctrl_status ctrl_batcher_start(ctrl_engine *e, ctrl_batcher **out);
/* Lets the jobs queued or running finish, stops the worker and frees the batcher. */
void ctrl_batcher_stop(ctrl_batcher *b);
/* One job through the queue: blocks until its outputs are in outs (n_req * reqs[0].n entries,
 * request by request, sample by sample). While it runs, `on_step` (may be NULL) is called on the
 * worker thread after every engine step with the outputs so far. Once *cancel (may be NULL) is
 * nonzero — set from another thread, e.g. when the job's client has gone — the job's requests
 * leave the engine before the next step and it fails with CTRL_ERR_INTERRUPTED. The caller frees
 * the outputs (ctrl_gen_output_free) whether it succeeded or not. */
ctrl_status ctrl_batcher_generate(ctrl_batcher *b, const ctrl_gen_request *reqs, int n_req,
                                  ctrl_gen_output *outs,
                                  void (*on_step)(const ctrl_gen_output *live, void *ctx), void *ctx,
                                  const atomic_int *cancel);
/* Fails every job queued or running, and every later one, with `why` (a bounded shutdown). */
void ctrl_batcher_abort(ctrl_batcher *b, const char *why);
/* The engine between generations: blocks while one runs. */
void ctrl_batcher_lock_engine(ctrl_batcher *b);
void ctrl_batcher_unlock_engine(ctrl_batcher *b);
void ctrl_batcher_stats_get(ctrl_batcher *b, ctrl_batcher_stats *out);

#endif
