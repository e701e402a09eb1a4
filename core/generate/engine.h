/* The generation engine (DESIGN §9): requests become sequences (n samples each), scheduled with
 * continuous batching over the paged KV cache — every step decodes the running sequences and fills
 * the rest of a token budget with prefill chunks of waiting ones; when blocks run out, the newest
 * running sequence is preempted and later recomputed. The n samples of a prompt share its cached
 * blocks (the last partial block is copied). Each sample draws from its own seeded generator, so
 * a request gives the same tokens whatever else is in the batch. */
#ifndef CTRL_CORE_ENGINE_H
#define CTRL_CORE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include <ctrl/config.h>
#include <ctrl/plugin.h>

#include "generate/sampling.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

typedef struct ctrl_gen_request {
    const int32_t *prompt;
    int prompt_len;
    int n; /* samples */
    int max_tokens;
    ctrl_sampling_params sampling;
    uint64_t seed;
    const int32_t *stop_ids; /* e.g. the EOS ids of generation_config.json */
    int n_stop;
    /* Optional, e.g. stop strings: called after each drawn token with the completion so far;
     * non-zero ends it (finish reason "stop"). */
    int (*stop_check)(void *ctx, const int32_t *ids, int len);
    void *stop_ctx;
    /* Optional: called (from inside ctrl_engine_step) when the request's last sample finishes. */
    void (*on_finish)(void *ctx);
    void *finish_ctx;
    /* Requests of one caller (ctrl serve: one HTTP request) share a group; when more sequences
     * want a step than it has slots, each group gets an equal share first (0 for all: arrival
     * order). Requests of a group are added one after another. */
    uint64_t group;
    /* The most likely tokens to record with each drawn token (0: none): the top_logprobs entries
     * of its output. */
    int top_logprobs;
    /* OpenAI's logit_bias: bias[i] added to the logit of token bias_ids[i] before any processing
     * (NULL / 0: none). */
    const int32_t *bias_ids;
    const float *bias;
    int n_bias;
    /* vLLM's min_tokens: until the completion has this many tokens its stop ids cannot be drawn
     * and stop_check is not asked. */
    int min_tokens;
    /* The LoRA adapter it runs under (ctrl_model_add_adapter's id; 0: the base model). Requests
     * under different adapters share steps. */
    int adapter;
} ctrl_gen_request;

typedef struct ctrl_gen_output {
    int32_t *ids;    /* malloc'd; the stop token, when one ended it, is included */
    float *logprobs; /* processed log-probability of each token */
    int len;
    int stopped; /* 1: a stop id ended it; 0: max_tokens */
    /* With the request's top_logprobs = k: for token i, its k most likely alternatives under the
     * processed distribution at top_ids[i * k ...] / top_logprobs[i * k ...], most likely first
     * (-1 and -inf past the possible ones). */
    int32_t *top_ids;
    float *top_logprobs;
    int top_k;
} ctrl_gen_output;

typedef struct ctrl_engine_config {
    size_t kv_cache_bytes;
    int block_size;             /* 16 */
    int max_num_seqs;           /* running sequences per step */
    int max_num_batched_tokens; /* tokens per step (decode + prefill chunks) */
    int no_prefix_sharing;      /* 1: every sample prefills its own prompt (for comparisons) */
    int prefix_cache;           /* 1: keep finished prompts' full blocks for later requests */
    int kv_cache_dtype;         /* 0: fp32 (zero-initialised configs), 1: bf16, -1: the model's
                                   compute dtype ([generation] kv_cache_dtype = auto) */
    int decode_threads;         /* OpenMP threads of a step: 0 all (generate/decode_threads.h) */
} ctrl_engine_config;

typedef struct ctrl_engine ctrl_engine;

/* The model must have its paged attention (ctrl_engine_attach_attention). */
ctrl_status ctrl_engine_create(ctrl_model *m, const ctrl_engine_config *cfg, ctrl_engine **out);
/* Gives the model the paged attention plugin to decode with (`[generation] attention`, resolved
 * once by the config: ctrl_config_plugins()->decoder, or ctrl_registry_require for commands
 * without a run config); NULL is the error that it is not loaded. */
ctrl_status ctrl_engine_attach_attention(ctrl_model *m, const ctrl_plugin *paged);
/* The [generation] section, from the config's typed settings (ctrl_config_settings): kv_cache_bytes
 * (0: gpu_memory_utilization of this machine's memory on the CPU), kv_cache_dtype, block_size,
 * max_num_seqs, max_num_batched_tokens, decode_threads. */
void ctrl_engine_config_from(const ctrl_config *cfg, ctrl_engine_config *out);
/* The same for an engine over `m`: for a model on a device, kv_cache_bytes = 0 takes
 * gpu_memory_utilization of the device's memory (at most half of what is free there now). */
ctrl_status ctrl_engine_config_for(const ctrl_config *cfg, const ctrl_model *m, ctrl_engine_config *out);
/* Co-located use between training phases: level 1 returns the KV pool's memory (cached prompts
 * are lost), level 2 also the inference-only buffers (the engine's step scratch — the logits of
 * every running sequence — and the model's decode scratch); on a device the memory goes back to
 * the driver (the caching allocator's free blocks are released), not only to the allocator's
 * cache; wake_up restores the pool (the rest comes back on first use). The model's weights are never copied:
 * generation after wake_up reads the weights as they are then. Generating while asleep is an error. */
ctrl_status ctrl_engine_sleep(ctrl_engine *e, int level);
ctrl_status ctrl_engine_wake_up(ctrl_engine *e);
void ctrl_engine_free(ctrl_engine *e);
/* Generates every request; outputs are laid out request by request, sample by sample
 * (sum of n entries). `progress` (may be NULL) is called after each step with tokens generated so
 * far. ctrl_engine_stats: steps, preemptions and shared prompt blocks since the engine was made. */
ctrl_status ctrl_engine_generate(ctrl_engine *e, const ctrl_gen_request *reqs, int n_req,
                                 ctrl_gen_output *outs, void (*progress)(long generated, void *ctx),
                                 void *ctx);
void ctrl_engine_stats(const ctrl_engine *e, long *steps, long *preemptions, long *shared_blocks);
/* Incremental use (ctrl serve): requests join a generation that is already running. `add` queues
 * a request; the engine writes its n outputs into outs (zeroed now), and the caller keeps outs and
 * the prompt until the request's on_finish. `step` runs one scheduler step over every request
 * queued or running (*active: whether anything is left). After a failed step (or to stop), `abort`
 * drops every request, freeing the outputs of unfinished ones. ctrl_engine_generate is add, step
 * until done; it refuses to run while added requests are. */
ctrl_status ctrl_engine_add(ctrl_engine *e, const ctrl_gen_request *r, ctrl_gen_output *outs);
/* What add refuses a request for (CTRL_ERR_CONFIG naming the field, the engine untouched): no
 * prompt, n or max_tokens < 1, sampling parameters the sampler cannot use. */
ctrl_status ctrl_gen_request_check(const ctrl_gen_request *r);
ctrl_status ctrl_engine_step(ctrl_engine *e, int *active);
void ctrl_engine_abort(ctrl_engine *e);
/* Drops the one request whose first output is `outs` (as given to add): its unfinished samples
 * stop, their blocks are released, and its on_finish runs; the outputs keep what was generated.
 * No effect when no such request runs. */
void ctrl_engine_cancel(ctrl_engine *e, const ctrl_gen_output *outs);

/* The most prompt tokens one sequence prefills in a step (0, the default: no limit but
 * max_num_batched_tokens). With a limit a long prompt takes a slice of every step instead of
 * whole steps, so the requests behind it start, and the running ones decode, meanwhile. */
void ctrl_engine_set_prefill_chunk(ctrl_engine *e, int tokens);
/* The most tokens one sequence can hold in the KV pool (0 while asleep). */
long ctrl_engine_capacity_tokens(const ctrl_engine *e);
/* Requests added while others were running, so far. */
long ctrl_engine_joined(const ctrl_engine *e);
/* Tokens drawn on the model's device so far (sampling on the device: only ids and log-probabilities
 * left it); 0 on the CPU. */
long ctrl_engine_device_draws(const ctrl_engine *e);
/* With cfg.prefix_cache: drops every cached prompt block (after a weight update the cached K/V are
 * stale); the blocks reused from the cache so far. */
void ctrl_engine_reset_prefix_cache(ctrl_engine *e);
long ctrl_engine_prefix_hits(const ctrl_engine *e);
void ctrl_gen_output_free(ctrl_gen_output *o);
/* Scores a token sequence without generating (the OpenAI prompt_logprobs / echo): for every
 * position i >= 1, the log-probability of ids[i] after ids[0..i) under softmax(logits /
 * temperature) (temperature 0: 1), its rank (1: the most likely), and the k most likely tokens
 * there (ids and log-probabilities, most likely first). Outputs are [n] (position 0 unused) and
 * [n * k]. Runs the model on the engine's KV pool: the caller holds the engine between generations
 * (ctrl_batcher_lock_engine). */
ctrl_status ctrl_engine_score(ctrl_engine *e, const int32_t *ids, int n, float temperature, int k,
                              float *logprob, int32_t *rank, int32_t *top_ids, float *top_logprobs);
/* The same under LoRA adapter `adapter` (0: the base; see ctrl_gen_request.adapter). */
ctrl_status ctrl_engine_score_adapter(ctrl_engine *e, int adapter, const int32_t *ids, int n,
                                      float temperature, int k, float *logprob, int32_t *rank,
                                      int32_t *top_ids, float *top_logprobs);
/* The ids that end a completion: generation_config.json's eos_token_id (a number or a list) in
 * model_dir, else the tokenizer's EOS. Returns how many were written (at most cap). */
int ctrl_generation_stop_ids(const char *model_dir, const ctrl_tokenizer *tok, int32_t *ids, int cap);
/* A trainer's sampling parameters: [generation] top_k, top_p, min_p and repetition_penalty of the
 * run's settings (config/config_load.h) at `temperature` (the online kinds' [generation]
 * temperature, GKD's own). */
struct ctrl_run_settings;
ctrl_sampling_params ctrl_generation_sampling(const struct ctrl_run_settings *s, double temperature);

#endif
