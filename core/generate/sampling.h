/* Sampling for generation: the logits processors (repetition penalty, temperature, top-k, top-p,
 * min-p, in the order transformers' generate applies them), a per-request seeded generator so that
 * a request draws the same tokens whatever else shares its batch, and each drawn token's
 * log-probability after processing (vLLM's processed_logprobs), which the online trainers use for
 * importance-sampling corrections. */
#ifndef CTRL_CORE_SAMPLING_H
#define CTRL_CORE_SAMPLING_H

#include <stdint.h>

typedef struct ctrl_sampling_params {
    float temperature;        /* 0: greedy */
    int top_k;                /* <= 0: off */
    float top_p;              /* 1: off */
    float min_p;              /* 0: off */
    float repetition_penalty; /* 1: off; over the prompt and the completion so far */
    /* OpenAI's (and vLLM's) additive penalties over the completion so far (the prompt is not
     * counted): a token drawn c > 0 times loses frequency_penalty * c + presence_penalty from its
     * logit, after the repetition penalty and before the temperature. 0: off; both in [-2, 2]. */
    float presence_penalty;
    float frequency_penalty;
} ctrl_sampling_params;

/* A request's generator (splitmix64): seeded once, advanced once per drawn token. */
typedef struct ctrl_rng {
    uint64_t state;
} ctrl_rng;

void ctrl_rng_seed(ctrl_rng *r, uint64_t seed);
double ctrl_rng_uniform(ctrl_rng *r); /* [0, 1) with 53 random bits */

/* 1 when the parameters are usable: temperature 0 or a normal positive float, top_p in (0, 1], min_p
 * in [0, 1], repetition_penalty a normal positive float, presence and frequency penalties in
 * [-2, 2] (no NaN, infinity or subnormal anywhere). */
int ctrl_sampling_params_valid(const ctrl_sampling_params *p);
/* Processes logits[V] in place (filtered entries become -inf); `seen` are the token ids the
 * repetition penalty applies to. Returns 0, -1 when the parameters are invalid, -2 when out of memory. */
int ctrl_sampling_process(const ctrl_sampling_params *p, float *logits, int V, const int32_t *seen,
                          int n_seen);
/* Processes and draws one token; *logprob gets its log-probability under the processed
 * distribution. Returns the token id, -1 on invalid parameters, -2 when out of memory. */
int32_t ctrl_sample(const ctrl_sampling_params *p, float *logits, int V, const int32_t *seen, int n_seen,
                    ctrl_rng *rng, float *logprob);
/* The same for a sequence whose first n_prompt `seen` ids are its prompt and the rest its
 * completion so far (what the presence and frequency penalties count); ctrl_sample is this with
 * n_prompt = n_seen. */
int ctrl_sampling_process_seq(const ctrl_sampling_params *p, float *logits, int V, const int32_t *seen,
                              int n_seen, int n_prompt);
int32_t ctrl_sample_seq(const ctrl_sampling_params *p, float *logits, int V, const int32_t *seen, int n_seen,
                        int n_prompt, ctrl_rng *rng, float *logprob);
/* The k most likely entries of processed logits[V] (as ctrl_sample leaves them), most likely
 * first (ties: the lower id first): ids and log-probabilities under the processed distribution.
 * Fewer than k when fewer are possible; returns how many. */
int ctrl_sampling_top(const float *logits, int V, int k, int32_t *ids, float *logprobs);

#endif
