/* One decode step's draws on a device (the backend's `sample` op; kernels/cuda/sampling.cu): the
 * logits processing and the draw of core/generate/sampling.c, row by row, from logits that stay in
 * device memory; only each row's token and log-probability (and its top log-probabilities when
 * asked) come back. The host prepares what is cheap there and small to send: the uniform draw of
 * the sequence's own generator, log(min_p), the logit bias and the suppressed stop ids, and the
 * distinct ids the penalties apply to with their counts in the completion. */
#ifndef CTRL_CORE_DEVICE_SAMPLE_BATCH_H
#define CTRL_CORE_DEVICE_SAMPLE_BATCH_H

#include <stdint.h>

typedef struct ctrl_sample_row {
    double u;         /* the uniform draw in [0, 1) (ctrl_rng_uniform) when temperature > 0 */
    double min_p_log; /* log((double)min_p) when min_p > 0 */
    float temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
    int32_t top_k;
    int32_t src;             /* the logits row it draws from (forked samples share one) */
    int32_t edit_at, n_edit; /* ids/vals[edit_at ..]: added to the logits in order (-inf: a stop id
                              * suppressed before min_tokens) */
    int32_t seen_at, n_seen; /* ids[seen_at ..]: distinct ids seen (the repetition penalty's; only the
                              * completion's when it is off), vals: times each is in the completion */
    int32_t n_top, top_at;   /* top log-probabilities: out[n_rows + top_at ..], n_top of them */
} ctrl_sample_row;

typedef struct ctrl_sample_out {
    int32_t id; /* -1: none (a top entry beyond the possible ones) */
    float logprob;
} ctrl_sample_out;

typedef struct ctrl_sample_batch {
    const float *logits; /* [rows of V] in the backend's memory; read only */
    int V, n_rows;
    float softcap;               /* > 0: cap * tanh(l / cap) first (final_logit_softcapping) */
    const ctrl_sample_row *rows; /* [n_rows], backend memory */
    const int32_t *ids;          /* the edits' and seen lists' ids, backend memory */
    const float *vals;           /* their values, backend memory */
    ctrl_sample_out *out;        /* [n_rows + the tops], backend memory */
} ctrl_sample_batch;

#endif
