/* A flat batch of random tokens for model tests: n_seq sequences laid out by cu (n_seq + 1 offsets),
 * positions restarting per sequence, each token's target the next token of its sequence (-100 at
 * the end). The caller owns the arrays (cu[n_seq] entries each); the same seed gives the same batch. */
#ifndef CTRL_TEST_RANDOM_BATCH_H
#define CTRL_TEST_RANDOM_BATCH_H

#include <stdint.h>

#include "model/model.h"

static inline void random_batch(ctrl_batch *b, int32_t *tok, int32_t *pos, int32_t *tg, int32_t *cu,
                                int n_seq, uint32_t seed, int vocab) {
    uint32_t x = seed;
    for (int s = 0; s < n_seq; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++) {
            x = x * 1664525u + 1013904223u;
            tok[t] = (int32_t)((x >> 8) % (uint32_t)vocab), pos[t] = t - cu[s];
        }
    for (int s = 0; s < n_seq; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++) tg[t] = t + 1 < cu[s + 1] ? tok[t + 1] : -100;
    *b = (ctrl_batch){
        .T = cu[n_seq], .B = n_seq, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
}

#endif
