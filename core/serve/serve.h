/* ctrl serve as a module: HTTP (libmicrohttpd, a thread per connection) over the generation
 * engine and its request queue (generate/batcher.h). The CLI parses its flags into
 * ctrl_serve_options and calls ctrl_serve_run; nothing here parses argv. Layout:
 *   server.c   life cycle: model, engine, batcher, daemon, the bounded drain
 *   daemon.c   the daemon's callbacks: request bodies, route lookup, API key, upload deadline
 *   deadline.c the header deadline: a watchdog closes connections that trickle their headers
 *   routes.c   the route table {method, path, auth, handler} and the small endpoints
 *   request.c  a generation request's fields, validated (every bad field a 400 naming it)
 *   generate.c /generate, /v1/completions, /v1/chat/completions (whole responses)
 *   stream.c   Server-Sent Events for the OpenAI endpoints
 *   weights.c  /update_weights: the whole body validated before any weight changes
 *   weight_transfer*.c  vLLM's NCCL weight-transfer engine (weight_transfer.h)
 *   lora.c     the LoRA adapters served (--lora, and loaded / unloaded at run time)
 *   reply.c    JSON responses and errors */
#ifndef CTRL_CORE_SERVE_H
#define CTRL_CORE_SERVE_H

#include <stddef.h>

#include "registry/registry.h"

#define CTRL_SERVE_MAX_LORA 64

typedef struct ctrl_serve_options {
    const char *model_dir;
    const char *host; /* an IPv4 address */
    int port;
    size_t kv_cache_bytes;
    int kv_cache_dtype;  /* 0 fp32, 1 bf16, -1 the compute dtype's */
    int bf16;            /* --dtype bf16 (vLLM's --dtype bfloat16): the linear layers compute in bf16 */
    size_t max_body;     /* bytes of a JSON body (a weights body may be as large as the model in f32) */
    const char *api_key; /* NULL: none */
    int max_seqs;        /* prompts x n of one request */
    int max_queued;      /* sequences of all requests queued or running (more: 503) */
    int prefill_chunk;   /* the most prompt tokens one sequence prefills per engine step */
    int timeout_s;       /* an idle connection, and a request's whole upload */
    int max_connections; /* in all */
    int max_per_ip;      /* from one address (0: no limit) */
    int drain_s;         /* after SIGINT/SIGTERM: how long requests in flight may still run */
    /* LoRA adapters served over the base (--lora NAME=DIR, vLLM's --lora-modules): a request's
     * "model" naming one runs under it; requests for different adapters share engine steps. */
    int n_lora;
    const char *lora_name[CTRL_SERVE_MAX_LORA], *lora_dir[CTRL_SERVE_MAX_LORA];
    /* POST /v1/load_lora_adapter and /v1/unload_lora_adapter answer (vLLM's routes under
     * VLLM_ALLOW_RUNTIME_LORA_UPDATING; --allow-runtime-lora-updating); 0: they answer 404. */
    int runtime_lora;
    /* Where the model runs: "cpu" (the default), "cuda" (device 0; CUDA_VISIBLE_DEVICES picks the
     * GPU) or "auto" (--device). vLLM's NCCL weight-transfer engine needs "cuda". */
    const char *device;
    int weight_transfer_timeout_s; /* joining the trainer's group, and the most an NCCL update waits
                                      without data (--weight-transfer-timeout-s) */
} ctrl_serve_options;

/* The defaults (the CLI's flags start from them). */
void ctrl_serve_options_default(ctrl_serve_options *o);
/* Loads the model, serves until stop() returns non-zero, drains (at most drain_s; what is still
 * running then is answered 503) and returns. `reg` gives the attention plugin. */
ctrl_status ctrl_serve_run(const ctrl_serve_options *o, const ctrl_registry *reg, int (*stop)(void));

#endif
