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
/* Every parameter of `m` as one f32 safetensors body (staged in `scratch_path`). */
ctrl_status ctrl_remote_push_weights(const char *url, const char *bearer, ctrl_model *m,
                                     const char *scratch_path);

#endif
