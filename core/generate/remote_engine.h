/* Generation through a running `ctrl serve` (the online trainers' `[generation] mode = server`):
 * the same requests and outputs as the in-process engine, sent to POST /generate; and the
 * trainer's new weights pushed to POST /update_weights after each optimizer step. */
#ifndef CTRL_CORE_REMOTE_ENGINE_H
#define CTRL_CORE_REMOTE_ENGINE_H

#include "generate/engine.h"

/* Waits up to wait_s for GET /health to answer 200 (a server that is still loading). */
ctrl_status ctrl_remote_wait_ready(const char *url, int wait_s);
/* As ctrl_engine_generate, outputs request by request, sample by sample; `stopped` is set when
 * the last token is one of the request's stop ids. Each request's seed is sent as it is. */
ctrl_status ctrl_remote_generate(const char *url, const char *bearer, const ctrl_gen_request *reqs, int n_req,
                                 ctrl_gen_output *outs);
/* Every parameter of `m` as one f32 safetensors body (staged in `scratch_path`); with LoRA the
 * adapters folded into the base weights (ctrl_peft_save_merged_weights), as TRL pushes a PEFT model. */
ctrl_status ctrl_remote_push_weights(const char *url, const char *bearer, ctrl_model *m,
                                     const char *scratch_path);

/* A trainer's `ctrl serve` (the online and distillation kinds' [generation] mode = server): its
 * URL, the bearer token ($CTRL_API_KEY when set and not empty, else none) and where the pushed
 * weights are staged (output_dir/.weights-push.safetensors). All NULL: no server. */
typedef struct ctrl_remote_server {
    char *url, *bearer, *push_path;
    /* ZeRO-3 (may be NULL): the weights made readable around a push, whole(ctx, 1) before and
     * whole(ctx, 0) after it on every rank (rank 0 after its push, the others at once): the run's
     * train_zero_push -- each layer gathered to rank 0 as the writer reaches it, or the whole model
     * gathered on every rank */
    ctrl_status (*whole)(void *ctx, int on);
    void *whole_ctx;
    /* the trainer's weights not pushed yet since the start (ctrl_remote_server_sync pushes them) */
    int stale;
} ctrl_remote_server;

/* Fills *r for `url` (NULL: http://127.0.0.1:8000) and the run's output_dir, stale; nothing is sent. */
ctrl_status ctrl_remote_server_init(ctrl_remote_server *r, const char *url, const char *output_dir);
/* The model's weights to r's server, called by every rank after each optimizer step: (zero3: the
 * weights made readable first, r->whole, and released after) rank 0 pushes them
 * (ctrl_remote_push_weights) and every rank waits at a barrier, so no rank generates from the old
 * weights and the server gets one push a step. r->url NULL: nothing. */
ctrl_status ctrl_remote_server_push(ctrl_remote_server *r, ctrl_model *m);
/* Before each generation through the server, by every rank: the weights pushed if they have not
 * been since the start (the first generation; a step's push clears it too). The start's push waits
 * for this: under zero3 the model the trainer's kind is made beside holds only this rank's slices,
 * its gathers not hooked yet. */
ctrl_status ctrl_remote_server_sync(ctrl_remote_server *r, ctrl_model *m);
void ctrl_remote_server_free(ctrl_remote_server *r);

#endif
