/* Per-sequence sums and their gradient (see sequence.h). */
#include "train/sequence.h"

void train_sequence_sums(int n_seq, const int32_t *cu, const float *logp, const float *weight, double *sum,
                         int *n_tokens) {
    for (int s = 0; s < n_seq; s++) {
        double acc = 0;
        int n = 0;
        for (int32_t t = cu[s]; t < cu[s + 1]; t++) acc += (double)logp[t] * weight[t], n += weight[t] != 0;
        sum[s] = acc;
        if (n_tokens) n_tokens[s] = n;
    }
}

void train_sequence_spread(int n_seq, const int32_t *cu, const float *weight, const double *dsum,
                           float *dlogp) {
    for (int s = 0; s < n_seq; s++)
        for (int32_t t = cu[s]; t < cu[s + 1]; t++) dlogp[t] = (float)(dsum[s] * weight[t]);
}

static int completion_tokens(const int32_t *cu, const float *weight, int s) {
    int n = 0;
    for (int32_t t = cu[s]; t < cu[s + 1]; t++) n += weight[t] != 0;
    return n;
}

void train_sequence_ld_weights(int n_pairs, const int32_t *cu, const float *weight, double alpha,
                               float *out) {
    for (int i = 0; i < n_pairs; i++) {
        const int nc = completion_tokens(cu, weight, i), nr = completion_tokens(cu, weight, n_pairs + i);
        const int shared = nc < nr ? nc : nr;
        for (int k = 0; k < 2; k++) {
            const int s = k ? n_pairs + i : i;
            int pos = 0;
            for (int32_t t = cu[s]; t < cu[s + 1]; t++) {
                pos += weight[t] != 0;
                out[t] = weight[t] != 0 ? (float)(weight[t] * (pos <= shared ? 1.0 : alpha)) : 0.0f;
            }
        }
    }
}
