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
typedef struct serve_wt serve_wt;
struct ctrl_cuda_backend;

/* A LoRA adapter served over the base (lora.c): --lora's, or one /v1/load_lora_adapter loaded. */
typedef struct serve_adapter {
    char *name, *dir;
    int id;      /* the model's bank id (ctrl_model_add_adapter) */
    int refs;    /* generation requests admitted under it and not yet answered */
    int retired; /* unloaded: no longer listed nor chosen; its weights go when refs reaches 0 */
} serve_adapter;

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
    pthread_mutex_t lock; /* in_flight, draining, shutting_down, asleep, rng, weight_updates */
    int in_flight;        /* POST requests being answered (what the drain waits for) */
    long weight_updates;  /* safetensors bodies POST /update_weights applied (/health says) */
    long seqs;            /* sequences of the generation requests admitted and not answered */
    int draining;         /* a stop signal came: /health answers 503, new generations are refused */
    int shutting_down;    /* the drain's deadline passed: generations are aborted */
    int asleep;           /* after /sleep until /wake_up: generations fail with 503 */
    uint64_t rng;         /* the server's generator: seeds of requests without one, response ids */
    serve_adapter adapters[CTRL_SERVE_MAX_LORA]; /* under lock; live and retired-but-running */
    int n_adapters;
    pthread_mutex_t lora_lock;            /* one load or unload at a time */
    const struct ctrl_cuda_backend *cuda; /* --device cuda: the CUDA backend (NULL on the CPU) */
    serve_wt *wt; /* the NCCL weight-transfer engine (weight_transfer.c), made on first use */
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
/* An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}. `param` is the field
 * the message names first (messages about a field start with it: "temperature: ...",
 * "prompt[1]: ...", "unknown field 'x'"), null otherwise; `type` follows the status. */
enum MHD_Result serve_error(struct MHD_Connection *c, unsigned code, const char *msg);
cJSON *serve_error_object(unsigned code, const char *msg);
/* The next value of the server's generator (splitmix64 under the server's lock). */
uint64_t serve_random(ctrl_server *s);

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

typedef struct serve_stops serve_stops;

/* A generation request, validated: the sampling fields in `base`, the prompts as token ids, and
 * what the response carries (the OpenAI and vLLM options). */
typedef struct serve_input {
    ctrl_gen_request base;
    int stream, include_usage; /* stream_options.include_usage */
    int n;                     /* prompts */
    int32_t **ids;             /* n prompts */
    int *lens;
    int logprobs;        /* -1: none; else the alternatives per token (completions' logprobs, chat's
                            top_logprobs) */
    int prompt_logprobs; /* -1: none; else the alternatives per prompt position */
    int echo;            /* completions: the prompt before the completion */
    int token_ids;       /* return_token_ids: prompt_token_ids and token_ids in the response */
    int tokens_as_ids;   /* return_tokens_as_token_ids: logprob tokens as "token_id:ID" */
    int skip_special;    /* skip_special_tokens (default 1) */
    int include_stop;    /* include_stop_str_in_output */
    int chat_logprobs;   /* chat's logprobs (-1: not given) and top_logprobs, settled into logprobs */
    int chat_top;
    int32_t *bias_ids; /* logit_bias */
    float *bias;
    int n_bias;
    int min_tokens;
    serve_stops *stops; /* stop strings (NULL: none); heap: the requests point at it */
    int32_t *stop_ids;  /* the ids ending a completion: the model's (unless ignore_eos) + stop_token_ids */
    int n_stop_ids;
    char id[48];                     /* the response's id */
    struct ctrl_server *lora_server; /* set while the request holds a reference to base.adapter */
} serve_input;

/* The completion's text: decoded (skip_special), cut at the first stop string (after it with
 * include_stop); *by_string: whether a stop string ended it. malloc'd. */
char *serve_completion_text(ctrl_server *s, const serve_input *in, const ctrl_gen_output *g, int final,
                            int *by_string);
/* request_options.c: one OpenAI / vLLM field beyond sampling into out: 0, -1 (a 400: msg names the
 * field), 1 (not one of them). finish_options settles them once every field is read. */
int serve_option_field(ctrl_server *s, int kind, const cJSON *f, serve_input *out, int *ignore_eos, char *msg,
                       size_t cap);
int serve_input_finish_options(serve_input *in, char *msg, size_t cap);
void serve_stops_attach(const serve_input *in, ctrl_gen_request *r);
void serve_stops_free(serve_stops *st);
/* The longest stop string in bytes (0: none): streamed text holds back one less than this. */
size_t serve_stops_longest(const serve_input *in);

/* Reads a generation body of `kind`; 0, or the HTTP status (400) with the reason in msg naming
 * the field. */
unsigned serve_input_parse(ctrl_server *s, const cJSON *in, int kind, serve_input *out, char *msg,
                           size_t cap);
void serve_input_free(serve_input *in);
/* A chat request's messages rendered into out->ids[0] (messages.c); 0 or the HTTP status. */
unsigned serve_chat_prompt(ctrl_server *s, const cJSON *in, serve_input *out, char *msg, size_t cap);
/* The request per prompt (its stop ids and strings, seed + prompt index); NULL when out of memory. */
ctrl_gen_request *serve_input_requests(ctrl_server *s, const serve_input *in);

enum MHD_Result serve_generate(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, int kind);
/* Streams the generation of reqs as SSE; takes reqs and in's prompts. */
enum MHD_Result serve_stream(ctrl_server *s, struct MHD_Connection *c, int kind, ctrl_gen_request *reqs,
                             serve_input *in);
/* Admits a request of n sequences while the server holds fewer than max_queued (else 0: a 503);
 * release gives them back once it is answered. */
int serve_admit(ctrl_server *s, long n);
void serve_release(ctrl_server *s, long n);
/* The HTTP status of a failed generation: 503 once the server is shutting down or while it is
 * asleep, else 500. */
unsigned serve_generation_failed(ctrl_server *s);
/* Records /sleep (1) and /wake_up (0) for serve_generation_failed. */
void serve_set_asleep(ctrl_server *s, int asleep);
/* Whether the server is draining (new generations are refused with 503). */
int serve_draining(ctrl_server *s);

/* OpenAI objects, shared by whole and streamed responses (generate.c). */
cJSON *serve_openai_object(ctrl_server *s, const serve_input *in, int kind, int chunk);
cJSON *serve_openai_choice(int kind, int index, const char *text, const char *finish, int delta);
cJSON *serve_usage(const serve_input *in, const ctrl_gen_output *outs);
/* Logprobs of completion tokens [from, to) of g (logprobs.c): completions' {tokens,
 * token_logprobs, top_logprobs, text_offset} or chat's {content: [...]}; *offset carries the text
 * offset on. */
cJSON *serve_logprobs(ctrl_server *s, const serve_input *in, int kind, const ctrl_gen_output *g, int from,
                      int to, long *offset);
/* A prompt scored (prompt_logprobs, echo with logprobs): per position, log-probability, rank and
 * top entries; filled by serve_score_prompts. */
typedef struct serve_scored {
    float *logprob;
    int32_t *rank, *top_ids;
    float *top_lps;
    int k;
} serve_scored;
/* Scores every prompt of `in` with k alternatives (the engine held between generations); 0, or
 * the HTTP status with msg. */
unsigned serve_score_prompts(ctrl_server *s, const serve_input *in, int k, serve_scored *out, char *msg,
                             size_t cap);
void serve_scored_free(serve_scored *sc, int n);
/* vLLM's prompt_logprobs list: null, then {"ID": {logprob, rank, decoded_token}} per position. */
cJSON *serve_prompt_logprobs(ctrl_server *s, const serve_input *in, const int32_t *ids, int len,
                             const serve_scored *sc);
/* Completions' echo with logprobs: the prompt's tokens as completion logprobs, prepended. */
void serve_logprobs_prepend_prompt(ctrl_server *s, const serve_input *in, cJSON *lp, const int32_t *ids,
                                   int len, const serve_scored *sc);
char *serve_decoded(ctrl_server *s, const ctrl_gen_output *g);

/* The LoRA adapters (lora.c): --lora's loaded at start (serve_lora_start) and freed at the end;
 * serve_lora_acquire gives the id of the live adapter NAME (0: none) and holds it until
 * serve_lora_release, so that an unload while it runs frees its weights only after it; whether a
 * request's "model" must name the base or an adapter (some are served, or may be loaded);
 * /v1/models' adapter entries; the load and unload routes. */
ctrl_status serve_lora_start(ctrl_server *s);
void serve_lora_stop(ctrl_server *s);
int serve_lora_acquire(ctrl_server *s, const char *name);
void serve_lora_release(ctrl_server *s, int id);
/* The name of adapter `id`, which the caller holds (its string lives while it is held). */
const char *serve_lora_name(ctrl_server *s, int id);
int serve_lora_checks_model(ctrl_server *s);
void serve_lora_list(ctrl_server *s, cJSON *data);
enum MHD_Result serve_lora_load(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                                size_t n);
enum MHD_Result serve_lora_unload(ctrl_server *s, struct MHD_Connection *c, const cJSON *in, const char *b,
                                  size_t n);

/* vLLM's NCCL weight-transfer engine (weight_transfer.c; serve/weight_transfer.h): the routes
 * /init_weight_transfer_engine, /start_weight_update, /finish_weight_update (parsed bodies), and
 * /update_weights with a JSON {"update_info": ...} body (the raw bytes); server_info's
 * weight_transfer_config ({"backend": "nccl"} on a CUDA device, null on the CPU); the engine freed
 * at the end (its group closed). */
enum MHD_Result serve_wt_init(ctrl_server *s, struct MHD_Connection *c, const cJSON *in);
enum MHD_Result serve_wt_start(ctrl_server *s, struct MHD_Connection *c, const cJSON *in);
enum MHD_Result serve_wt_finish(ctrl_server *s, struct MHD_Connection *c, const cJSON *in);
enum MHD_Result serve_wt_update(ctrl_server *s, struct MHD_Connection *c, const char *body, size_t len);
cJSON *serve_wt_config(ctrl_server *s);
void serve_wt_free(ctrl_server *s);

/* Applies a safetensors body to the model; the number of tensors updated, or -1 with a message in
 * err and no weight changed. */
int serve_update_weights(ctrl_model *m, const char *data, size_t len, char *err, size_t errcap);

#endif
