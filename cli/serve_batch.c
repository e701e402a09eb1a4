/* ctrl serve's batcher (see serve.h): one worker thread owns the engine; handlers queue jobs and
 * wait. Between engine steps the worker adds every job queued meanwhile to the running generation
 * (continuous batching across requests: a short request that arrives during a long one is done
 * as soon as its own tokens are), and hands each job back when its last request finishes.
 * Per-request seeds keep every request's tokens independent of what it ran with. The engine lock
 * is held from the first job of a busy period until the engine is idle again, so weight updates,
 * sleep and prefix-cache resets happen between generations, never during one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

struct serve_job {
    const ctrl_gen_request *reqs;
    int n_req, n_out;
    ctrl_gen_output *outs; /* written by the engine while the job runs */
    void (*on_step)(const ctrl_gen_output *live, void *ctx);
    void *ctx;
    ctrl_gen_request *mine; /* the requests as added: with on_finish */
    int left;               /* requests not finished (the worker's) */
    ctrl_status status;
    char error[512];
    int done;
    pthread_cond_t finished;
    serve_job *next;
};

typedef struct running {
    serve_job **jobs;
    int n, cap;
} running;

static void request_finished(void *ctx) { ((serve_job *)ctx)->left--; }

/* Hands the job back to its handler thread. */
static void finish(server *s, serve_job *j, ctrl_status st, const char *error) {
    free(j->mine);
    pthread_mutex_lock(&s->batch.lock);
    j->status = st;
    if (st != CTRL_OK) snprintf(j->error, sizeof j->error, "%s", error);
    j->done = 1;
    pthread_cond_signal(&j->finished);
    pthread_mutex_unlock(&s->batch.lock);
}

/* Every running job fails with the current error (the engine dropped all requests). */
static void fail_all(server *s, running *rn, ctrl_status st) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ctrl_error_message());
    ctrl_engine_abort(s->eng);
    for (int i = 0; i < rn->n; i++) finish(s, rn->jobs[i], st, msg);
    rn->n = 0;
}

/* Adds a job's requests to the engine. A job none of whose requests got in fails alone; one that
 * got in partly takes the whole generation down with it (its outputs are being written). */
static void add_job(server *s, running *rn, serve_job *j) {
    j->mine = malloc(sizeof *j->mine * (size_t)j->n_req);
    if (rn->n == rn->cap) {
        serve_job **p = realloc(rn->jobs, sizeof *p * (size_t)(rn->cap * 2 + 16));
        if (p) rn->jobs = p, rn->cap = rn->cap * 2 + 16;
    }
    if (!j->mine || rn->n == rn->cap) return finish(s, j, CTRL_ERR_NOMEM, "serve: out of memory");
    j->left = j->n_req;
    for (int r = 0, o = 0; r < j->n_req; o += j->reqs[r++].n) {
        j->mine[r] = j->reqs[r];
        j->mine[r].on_finish = request_finished, j->mine[r].finish_ctx = j;
        ctrl_status st = ctrl_engine_add(s->eng, &j->mine[r], j->outs + o);
        if (st == CTRL_OK) continue;
        if (r == 0) return finish(s, j, st, ctrl_error_message());
        rn->jobs[rn->n++] = j;
        return fail_all(s, rn, st);
    }
    rn->jobs[rn->n++] = j;
    pthread_mutex_lock(&s->batch.lock);
    if (++s->batch.period_jobs > s->batch.max_jobs) s->batch.max_jobs = s->batch.period_jobs;
    s->batch.joined = ctrl_engine_joined(s->eng);
    pthread_mutex_unlock(&s->batch.lock);
}

/* One engine step for everything running; finished jobs go back to their handlers. */
static void step(server *s, running *rn) {
    int active = 0;
    const ctrl_status st = ctrl_engine_step(s->eng, &active);
    for (int i = 0; i < rn->n; i++)
        if (rn->jobs[i]->on_step) rn->jobs[i]->on_step(rn->jobs[i]->outs, rn->jobs[i]->ctx);
    if (st != CTRL_OK) return fail_all(s, rn, st);
    int n = 0;
    for (int i = 0; i < rn->n; i++)
        if (rn->jobs[i]->left == 0)
            finish(s, rn->jobs[i], CTRL_OK, NULL);
        else
            rn->jobs[n++] = rn->jobs[i];
    rn->n = n;
}

static void *worker(void *arg) {
    server *s = arg;
    serve_batcher *b = &s->batch;
    running rn = {0};
    for (;;) {
        pthread_mutex_lock(&b->lock);
        while (!b->head && rn.n == 0 && !b->stop) pthread_cond_wait(&b->wake, &b->lock);
        serve_job *queued = b->head;
        b->head = b->tail = NULL;
        if (queued && rn.n == 0) b->batches++, b->period_jobs = 0; /* a generation starts */
        pthread_mutex_unlock(&b->lock);
        if (!queued && rn.n == 0) break; /* stopping, and idle */
        if (queued && rn.n == 0) pthread_mutex_lock(&s->engine_lock);
        for (serve_job *j = queued, *next; j; j = next) {
            next = j->next; /* the job may be handed back (and gone) inside add_job */
            add_job(s, &rn, j);
        }
        if (rn.n > 0) step(s, &rn);
        if (rn.n == 0) pthread_mutex_unlock(&s->engine_lock); /* idle: between generations */
    }
    free(rn.jobs);
    return NULL;
}

ctrl_status serve_batch_generate(server *s, const ctrl_gen_request *reqs, int n_req, ctrl_gen_output *outs,
                                 void (*on_step)(const ctrl_gen_output *live, void *ctx), void *ctx) {
    serve_job job = {.reqs = reqs,
                     .n_req = n_req,
                     .n_out = n_req * reqs[0].n,
                     .outs = outs,
                     .on_step = on_step,
                     .ctx = ctx};
    pthread_cond_init(&job.finished, NULL);
    serve_batcher *b = &s->batch;
    pthread_mutex_lock(&b->lock);
    if (b->tail)
        b->tail->next = &job;
    else
        b->head = &job;
    b->tail = &job;
    pthread_cond_signal(&b->wake);
    while (!job.done) pthread_cond_wait(&job.finished, &b->lock);
    pthread_mutex_unlock(&b->lock);
    pthread_cond_destroy(&job.finished);
    if (job.status != CTRL_OK) return ctrl_error_set(job.status, "%s", job.error);
    return CTRL_OK;
}

ctrl_status serve_batch_start(server *s) {
    pthread_mutex_init(&s->batch.lock, NULL);
    pthread_cond_init(&s->batch.wake, NULL);
    if (pthread_create(&s->batch.thread, NULL, worker, s) != 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "serve: cannot start the generation thread");
    return CTRL_OK;
}

void serve_batch_stop(server *s) {
    pthread_mutex_lock(&s->batch.lock);
    s->batch.stop = 1;
    pthread_cond_signal(&s->batch.wake);
    pthread_mutex_unlock(&s->batch.lock);
    pthread_join(s->batch.thread, NULL);
}
