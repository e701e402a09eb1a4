/* ctrl serve's batcher (see serve.h): one worker thread owns the engine's generations; handlers
 * queue jobs and wait. Each engine call takes every job queued at that moment, so N concurrent
 * requests cost about one generation, not N in a row. Per-request seeds keep every request's
 * tokens independent of what it was batched with. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

struct serve_job {
    const ctrl_gen_request *reqs;
    int n_req, n_out;
    ctrl_gen_output *outs;
    void (*on_step)(const ctrl_gen_output *live, void *ctx);
    void *ctx;
    const ctrl_gen_output *live; /* its outputs inside the running generation */
    ctrl_status status;
    char error[512];
    int done;
    pthread_cond_t finished;
    serve_job *next;
};

typedef struct running {
    serve_job **jobs;
    int n;
} running;

static void step_all(long generated, void *ctx) {
    (void)generated;
    const running *r = ctx;
    for (int j = 0; j < r->n; j++)
        if (r->jobs[j]->on_step) r->jobs[j]->on_step(r->jobs[j]->live, r->jobs[j]->ctx);
}

/* One engine call for the jobs taken from the queue. */
static void run_jobs(server *s, serve_job **jobs, int n) {
    int n_req = 0, n_out = 0;
    for (int j = 0; j < n; j++) n_req += jobs[j]->n_req, n_out += jobs[j]->n_out;
    ctrl_gen_request *reqs = malloc(sizeof *reqs * (size_t)n_req);
    ctrl_gen_output *outs = calloc((size_t)n_out, sizeof *outs);
    for (int j = 0, r = 0, o = 0; j < n; j++) {
        memcpy(reqs + r, jobs[j]->reqs, sizeof *reqs * (size_t)jobs[j]->n_req);
        jobs[j]->live = outs + o;
        r += jobs[j]->n_req, o += jobs[j]->n_out;
    }
    running rn = {jobs, n};
    pthread_mutex_lock(&s->engine_lock);
    const ctrl_status st = ctrl_engine_generate(s->eng, reqs, n_req, outs, step_all, &rn);
    pthread_mutex_unlock(&s->engine_lock);
    pthread_mutex_lock(&s->batch.lock);
    s->batch.batches++;
    if (n > s->batch.max_jobs) s->batch.max_jobs = n;
    for (int j = 0, o = 0; j < n; j++) { /* each job takes over its slice of the outputs */
        serve_job *job = jobs[j];
        memcpy(job->outs, outs + o, sizeof *outs * (size_t)job->n_out);
        o += job->n_out;
        job->status = st;
        if (st != CTRL_OK) snprintf(job->error, sizeof job->error, "%s", ctrl_error_message());
        job->done = 1;
        pthread_cond_signal(&job->finished);
    }
    pthread_mutex_unlock(&s->batch.lock);
    free(reqs), free(outs);
}

static void *worker(void *arg) {
    server *s = arg;
    serve_batcher *b = &s->batch;
    for (;;) {
        pthread_mutex_lock(&b->lock);
        while (!b->head && !b->stop) pthread_cond_wait(&b->wake, &b->lock);
        if (!b->head) {
            pthread_mutex_unlock(&b->lock);
            return NULL;
        }
        int n = 0;
        for (serve_job *j = b->head; j; j = j->next) n++;
        serve_job **jobs = malloc(sizeof *jobs * (size_t)n);
        n = 0;
        for (serve_job *j = b->head; j; j = j->next) jobs[n++] = j;
        b->head = b->tail = NULL;
        pthread_mutex_unlock(&b->lock);
        run_jobs(s, jobs, n);
        free(jobs);
    }
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
