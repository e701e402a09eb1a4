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
} server;

enum { SERVE_TRL, SERVE_COMPLETIONS, SERVE_CHAT };

enum MHD_Result serve_reply(struct MHD_Connection *c, unsigned code, cJSON *o);
enum MHD_Result serve_error(struct MHD_Connection *c, unsigned code, const char *msg);
/* POST /generate (SERVE_TRL), /v1/completions, /v1/chat/completions; `stream` answers with SSE. */
enum MHD_Result serve_generate(server *s, struct MHD_Connection *c, const cJSON *in, int kind);

#endif
