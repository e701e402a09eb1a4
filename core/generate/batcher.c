/* The request queue in front of the engine (see batcher.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate/batcher.h"

typedef struct job {
    const ctrl_gen_request *reqs;
    int n_req;
    ctrl_gen_output *outs; /* written by the engine while the job runs */
    void (*on_step)(const ctrl_gen_output *live, void *ctx);
    void *ctx;
    const atomic_int *cancel;
    ctrl_gen_request *mine; /* the requests as added: with on_finish */
    int left;               /* requests not finished (the worker's) */
    ctrl_status status;
    char error[512];
    int done;
    pthread_cond_t finished;
    struct job *next;
} job;

struct ctrl_batcher {
    ctrl_engine *eng;
    pthread_mutex_t engine_lock; /* one generation, sleep or weight update at a time */
    pthread_mutex_t lock;        /* the queue, the flags and the counters */
    pthread_cond_t wake;
    job *head, *tail;
    int stop, aborted;
    char why[256]; /* the abort's message */
    pthread_t thread;
    ctrl_batcher_stats stats;
    long period_jobs;    /* jobs in the current generation */
    uint64_t jobs_added; /* the worker's: numbers each job's group */
    /* the worker's own: the jobs in the running generation */
    job **running;
    int n_running, cap_running;
};

static void request_finished(void *ctx) { ((job *)ctx)->left--; }

/* Hands the job back to its caller. */
static void finish(ctrl_batcher *b, job *j, ctrl_status st, const char *error) {
    free(j->mine);
    j->mine = NULL;
    pthread_mutex_lock(&b->lock);
    j->status = st;
    if (st != CTRL_OK) snprintf(j->error, sizeof j->error, "%s", error);
    j->done = 1;
    pthread_cond_signal(&j->finished);
    pthread_mutex_unlock(&b->lock);
}

/* Every running job fails with `msg` (the engine drops all its requests). */
static void fail_running(ctrl_batcher *b, ctrl_status st, const char *msg) {
    ctrl_engine_abort(b->eng);
    for (int i = 0; i < b->n_running; i++) finish(b, b->running[i], st, msg);
    b->n_running = 0;
}

static void fail_engine(ctrl_batcher *b, ctrl_status st) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ctrl_error_message());
    fail_running(b, st, msg);
}

/* Adds a job's requests to the engine. A job none of whose requests got in fails alone; one that
 * got in partly takes the whole generation down with it (its outputs are being written). */
static void add_job(ctrl_batcher *b, job *j) {
    j->mine = malloc(sizeof *j->mine * (size_t)j->n_req);
    if (b->n_running == b->cap_running) {
        job **p = realloc(b->running, sizeof *p * (size_t)(b->cap_running * 2 + 16));
        if (p) b->running = p, b->cap_running = b->cap_running * 2 + 16;
    }
    if (!j->mine || b->n_running == b->cap_running) return finish(b, j, CTRL_ERR_NOMEM, "out of memory");
    for (int r = 0; r < j->n_req; r++) { /* a bad request fails its job alone, before any of it runs */
        ctrl_status st = ctrl_gen_request_check(&j->reqs[r]);
        if (st != CTRL_OK) return finish(b, j, ctrl_error_wrap(st, "request %d", r), ctrl_error_message());
    }
    j->left = j->n_req;
    b->jobs_added++;
    for (int r = 0, o = 0; r < j->n_req; o += j->reqs[r++].n) {
        j->mine[r] = j->reqs[r];
        j->mine[r].on_finish = request_finished, j->mine[r].finish_ctx = j;
        j->mine[r].group = b->jobs_added; /* a job's requests share the step's slots fairly with others' */
        ctrl_status st = ctrl_engine_add(b->eng, &j->mine[r], j->outs + o);
        if (st == CTRL_OK) continue;
        if (r == 0) return finish(b, j, st, ctrl_error_message());
        b->running[b->n_running++] = j;
        return fail_engine(b, st);
    }
    b->running[b->n_running++] = j;
    pthread_mutex_lock(&b->lock);
    if (++b->period_jobs > b->stats.max_jobs) b->stats.max_jobs = b->period_jobs;
    b->stats.joined = ctrl_engine_joined(b->eng);
    pthread_mutex_unlock(&b->lock);
}

/* Jobs whose callers cancelled them leave the engine and go back failed. */
static void drop_cancelled(ctrl_batcher *b) {
    int n = 0;
    for (int i = 0; i < b->n_running; i++) {
        job *j = b->running[i];
        if (!j->cancel || !atomic_load(j->cancel)) {
            b->running[n++] = j;
            continue;
        }
        for (int r = 0, o = 0; r < j->n_req; o += j->reqs[r++].n) ctrl_engine_cancel(b->eng, j->outs + o);
        finish(b, j, CTRL_ERR_INTERRUPTED, "cancelled");
    }
    b->n_running = n;
}

/* One engine step for everything running; finished jobs go back to their callers. */
static void step(ctrl_batcher *b) {
    drop_cancelled(b); /* then the step tidies their sequences away even when nothing else runs */
    int active = 0;
    const ctrl_status st = ctrl_engine_step(b->eng, &active);
    for (int i = 0; i < b->n_running; i++)
        if (b->running[i]->on_step) b->running[i]->on_step(b->running[i]->outs, b->running[i]->ctx);
    if (st != CTRL_OK) return fail_engine(b, st);
    int n = 0;
    for (int i = 0; i < b->n_running; i++)
        if (b->running[i]->left == 0)
            finish(b, b->running[i], CTRL_OK, NULL);
        else
            b->running[n++] = b->running[i];
    b->n_running = n;
}

static void *worker(void *arg) {
    ctrl_batcher *b = arg;
    for (;;) {
        pthread_mutex_lock(&b->lock);
        while (!b->head && b->n_running == 0 && !b->stop) pthread_cond_wait(&b->wake, &b->lock);
        job *queued = b->head;
        b->head = b->tail = NULL;
        const int aborted = b->aborted;
        char why[sizeof b->why];
        memcpy(why, b->why, sizeof why);
        if (queued && b->n_running == 0 && !aborted) b->stats.generations++, b->period_jobs = 0;
        pthread_mutex_unlock(&b->lock);
        if (!queued && b->n_running == 0) break; /* stopping, and idle */
        if (aborted) {
            for (job *j = queued, *next; j; j = next) next = j->next, finish(b, j, CTRL_ERR_RUNTIME, why);
            if (b->n_running > 0) {
                fail_running(b, CTRL_ERR_RUNTIME, why);
                pthread_mutex_unlock(&b->engine_lock);
            }
            continue;
        }
        if (queued && b->n_running == 0) pthread_mutex_lock(&b->engine_lock);
        for (job *j = queued, *next; j; j = next) {
            next = j->next; /* the job may be handed back (and gone) inside add_job */
            add_job(b, j);
        }
        if (b->n_running > 0) step(b);
        if (b->n_running == 0) pthread_mutex_unlock(&b->engine_lock); /* idle: between generations */
    }
    return NULL;
}

ctrl_status ctrl_batcher_generate(ctrl_batcher *b, const ctrl_gen_request *reqs, int n_req,
                                  ctrl_gen_output *outs,
                                  void (*on_step)(const ctrl_gen_output *live, void *ctx), void *ctx,
                                  const atomic_int *cancel) {
    job j = {.reqs = reqs, .n_req = n_req, .outs = outs, .on_step = on_step, .ctx = ctx, .cancel = cancel};
    pthread_cond_init(&j.finished, NULL);
    pthread_mutex_lock(&b->lock);
    if (b->aborted) {
        j.done = 1, j.status = CTRL_ERR_RUNTIME;
        snprintf(j.error, sizeof j.error, "%s", b->why);
    } else if (b->tail) {
        b->tail->next = &j;
    } else {
        b->head = &j;
    }
    if (!j.done) {
        b->tail = &j;
        pthread_cond_signal(&b->wake);
    }
    while (!j.done) pthread_cond_wait(&j.finished, &b->lock);
    pthread_mutex_unlock(&b->lock);
    pthread_cond_destroy(&j.finished);
    if (j.status != CTRL_OK) return ctrl_error_set(j.status, "%s", j.error);
    return CTRL_OK;
}

void ctrl_batcher_abort(ctrl_batcher *b, const char *why) {
    pthread_mutex_lock(&b->lock);
    if (!b->aborted) snprintf(b->why, sizeof b->why, "%s", why);
    b->aborted = 1;
    pthread_cond_signal(&b->wake);
    pthread_mutex_unlock(&b->lock);
}

ctrl_status ctrl_batcher_start(ctrl_engine *e, ctrl_batcher **out) {
    *out = NULL;
    ctrl_batcher *b = calloc(1, sizeof *b);
    if (!b) return ctrl_error_set(CTRL_ERR_NOMEM, "batcher: out of memory");
    b->eng = e;
    pthread_mutex_init(&b->engine_lock, NULL);
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->wake, NULL);
    if (pthread_create(&b->thread, NULL, worker, b) != 0) {
        free(b);
        return ctrl_error_set(CTRL_ERR_RUNTIME, "batcher: cannot start the generation thread");
    }
    *out = b;
    return CTRL_OK;
}

void ctrl_batcher_stop(ctrl_batcher *b) {
    if (!b) return;
    pthread_mutex_lock(&b->lock);
    b->stop = 1;
    pthread_cond_signal(&b->wake);
    pthread_mutex_unlock(&b->lock);
    pthread_join(b->thread, NULL);
    pthread_mutex_destroy(&b->engine_lock), pthread_mutex_destroy(&b->lock), pthread_cond_destroy(&b->wake);
    free(b->running);
    free(b);
}

void ctrl_batcher_lock_engine(ctrl_batcher *b) { pthread_mutex_lock(&b->engine_lock); }
void ctrl_batcher_unlock_engine(ctrl_batcher *b) { pthread_mutex_unlock(&b->engine_lock); }

void ctrl_batcher_stats_get(ctrl_batcher *b, ctrl_batcher_stats *out) {
    pthread_mutex_lock(&b->lock);
    *out = b->stats;
    pthread_mutex_unlock(&b->lock);
}
