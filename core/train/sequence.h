/* The sequence-level kind's arithmetic (kind.h, ctrl_sequence_batch): per-token log-probs to
 * per-sequence sums, and dL/dsum back to dL/dlogp per token. */
#ifndef CTRL_CORE_TRAIN_SEQUENCE_H
#define CTRL_CORE_TRAIN_SEQUENCE_H

#include <stdint.h>

/* sum[s] = sum of logp[t] * weight[t] over sequence s's tokens [cu[s], cu[s+1]), in double (a
 * long completion's sum in float would lose the digits TRL's parity needs); n_tokens[s] (may be
 * NULL) counts its tokens of non-zero weight. */
void train_sequence_sums(int n_seq, const int32_t *cu, const float *logp, const float *weight, double *sum,
                         int *n_tokens);
/* The chain rule of train_sequence_sums: dlogp[t] = dsum[s] * weight[t] for t in sequence s
 * (every token of [0, cu[n_seq]) is written). */
void train_sequence_spread(int n_seq, const int32_t *cu, const float *weight, const double *dsum,
                           float *dlogp);
/* LD-DPO's token weights (TRL's ld_alpha): pairs are sequences i and n_pairs + i; a completion
 * token (weight[t] != 0) keeps its weight while it is among the first min(n_chosen, n_rejected)
 * completion tokens of its sequence, and is multiplied by alpha past them. out[t] = 0 where
 * weight[t] = 0. Summing with these weights gives TRL's shared + ld_alpha * tail log-probs. */
void train_sequence_ld_weights(int n_pairs, const int32_t *cu, const float *weight, double alpha, float *out);

#endif
