/* ctrl serve's parts (see serve.h), shared between its files; not part of any public API. */
#ifndef CTRL_CORE_SERVE_INTERNAL_H
#define CTRL_CORE_SERVE_INTERNAL_H

#include <cJSON.h>
#include <microhttpd.h>
#include <pthread.h>

#include "generate/batcher.h"
#include "generate/engine.h"
#include "serve/serve.h"
#include "template/chat.h"
#include "tokenizer/tokenizer.h"

typedef struct serve_deadline serve_deadline;

typedef struct ctrl_server {
    const ctrl_serve_options *opt;
    ctrl_model *model;
    ctrl_tokenizer *tok;
    ctrl_template *chat; /* NULL when the tokenizer has no chat template */
    ctrl_engine *eng;
    ctrl_batcher *batch;
    serve_deadline *deadline; /* the header deadline's watchdog */
    int32_t stops[16];
    int n_stop;
    int context;          /* the most tokens one sequence may hold (prompt + completion) */
    int context_from_kv;  /* 1: the KV pool bounds it, 0: the model's max_position_embeddings */
    size_t weights_body;  /* the largest /update_weights body */
    pthread_mutex_t lock; /* in_flight, shutting_down */
    int in_flight;
    long seqs;         /* sequences of the generation requests admitted and not answered */
    int shutting_down; /* the drain's deadline passed: generations are aborted */
} ctrl_server;

/* A route: `json` handlers get the body parsed (an object; otherwise 400 before the handler),
 * the others the raw bytes. `auth`: wants the API key when the server has one. */
typedef enum MHD_Result (*serve_handler)(ctrl_server *s, struct MHD_Connection *c, const cJSON *in,
                                         const char *body, size_t len);
typedef struct serve_route {
    const char *method, *path;
    int auth, json, large_body;
    serve_handler fn;
} serve_route;

/* The route for method + path; NULL with *status 404 (no such path) or 405 (another method). */
const serve_route *serve_route_find(const char *method, const char *path, unsigned *status);
/* The paths, for the start-up log line. */
void serve_route_list(char *out, size_t cap);

enum MHD_Result serve_reply(struct MHD_Connection *c, unsigned code, cJSON *o);
enum MHD_Result serve_error(struct MHD_Connection *c, unsigned code, const char *msg);

/* The header deadline (deadline.c): a connection's next request's headers must be in within
 * timeout_s. `notify` is the daemon's MHD_OPTION_NOTIFY_CONNECTION callback (cls: the deadline);
 * `request` marks a request's headers in (started 1) and its end (0). */
serve_deadline *serve_deadline_start(int timeout_s);
void serve_deadline_stop(serve_deadline *w);
void serve_deadline_notify(void *cls, struct MHD_Connection *connection, void **socket_context,
                           enum MHD_ConnectionNotificationCode toe);
void serve_deadline_request(serve_deadline *w, struct MHD_Connection *connection, int started);

/* The MHD daemon over s (daemon.c); NULL when it cannot listen. */
struct MHD_Daemon *serve_daemon_start(ctrl_server *s);

enum { SERVE_TRL, SERVE_COMPLETIONS, SERVE_CHAT };

/* A generation request, validated: the sampling fields in `base`, the prompts as token ids. */
typedef struct serve_input {
    ctrl_gen_request base;
    int stream;
    int n;         /* prompts */
    int32_t **ids; /* n prompts */
    int *lens;
} serve_input;

/* Reads a generation body of `kind`; 0, or the HTTP status (400) with the reason in msg naming
 * the field. */
unsigned serve_input_parse(ctrl_server *s, const cJSON *in, int kind, serve_input *out, char *msg,
                           size_t cap);
void serve_input_free(serve_input *in);
/* The request per prompt (the server's stop ids, seed + prompt index); NULL when out of memory. */
ctrl_gen_request *serve_input_requests(ctrl_server *s, const serve_input *in);

enum MHD_Result serve_generate(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, int kind);
/* Streams the generation of reqs as SSE; takes reqs and in's prompts. */
enum MHD_Result serve_stream(ctrl_server *s, struct MHD_Connection *c, int kind, ctrl_gen_request *reqs,
                             serve_input *in);
/* Admits a request of n sequences while the server holds fewer than max_queued (else 0: a 503);
 * release gives them back once it is answered. */
int serve_admit(ctrl_server *s, long n);
void serve_release(ctrl_server *s, long n);
/* The HTTP status of a failed generation: 503 once the server is shutting down, else 500. */
unsigned serve_generation_failed(ctrl_server *s);

/* OpenAI objects, shared by whole and streamed responses (generate.c). */
cJSON *serve_openai_object(ctrl_server *s, int kind, int chunk);
cJSON *serve_openai_choice(int kind, int index, const char *text, const char *finish, int delta);
char *serve_decoded(ctrl_server *s, const ctrl_gen_output *g);

/* Applies a safetensors body to the model; the number of tensors updated, or -1 with a message in
 * err and no weight changed. */
int serve_update_weights(ctrl_model *m, const char *data, size_t len, char *err, size_t errcap);

#endif
