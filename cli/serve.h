/* ctrl serve's parts (cmd_serve.c: the daemon, routing, auth, draining; serve_generate.c: the
 * generation endpoints and SSE streaming; serve_weights.c: /update_weights). */
#ifndef CTRL_CLI_SERVE_H
#define CTRL_CLI_SERVE_H

#include <cJSON.h>
#include <microhttpd.h>
#include <pthread.h>

#include "generate/engine.h"
#include "template/chat.h"
#include "tokenizer/tokenizer.h"

typedef struct serve_job serve_job;

/* Requests wait in a queue for the generation worker, which adds them to the running generation
 * between engine steps, so concurrent clients are batched together and a request that arrives
 * during a generation joins it (serve_batch.c). */
typedef struct serve_batcher {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    serve_job *head, *tail;
    int stop;
    pthread_t thread;
    long batches, max_jobs; /* generations (busy periods) so far; the most requests one of them carried */
    long period_jobs;       /* requests in the current one */
    long joined;            /* requests added to a generation already running */
} serve_batcher;

typedef struct server {
    ctrl_model *model;
    ctrl_tokenizer *tok;
    ctrl_template *chat; /* NULL when the tokenizer has no chat template */
    ctrl_engine *eng;
    pthread_mutex_t engine_lock; /* one generation, sleep or weight update at a time */
    const char *name;
    size_t max_body;
    int32_t stops[16];
    int n_stop;
    serve_batcher batch;
} server;

/* One request's generation through the batcher: blocks until its outputs are in outs (n_req *
 * reqs[0].n entries). While it runs, `on_step` (may be NULL) is called after every engine step
 * with the outputs so far. */
ctrl_status serve_batch_generate(server *s, const ctrl_gen_request *reqs, int n_req, ctrl_gen_output *outs,
                                 void (*on_step)(const ctrl_gen_output *live, void *ctx), void *ctx);
ctrl_status serve_batch_start(server *s);
void serve_batch_stop(server *s);

enum { SERVE_TRL, SERVE_COMPLETIONS, SERVE_CHAT };

enum MHD_Result serve_reply(struct MHD_Connection *c, unsigned code, cJSON *o);
enum MHD_Result serve_error(struct MHD_Connection *c, unsigned code, const char *msg);
/* POST /generate (SERVE_TRL), /v1/completions, /v1/chat/completions; `stream` answers with SSE. */
enum MHD_Result serve_generate(server *s, struct MHD_Connection *c, const cJSON *in, int kind);

#endif
