/* The sequence-level kind's reduction (train/sequence.c): per-sequence sums of the trained tokens'
 * log-probs, and the chain rule that spreads dL/dsum back to the tokens -- checked against a
 * finite-difference gradient of a DPO-shaped loss computed from the tokens directly. */
#include <math.h>

#include "test.h"
#include "train/sequence.h"

/* Two pairs laid out as the kind lays them: chosen 0, 1 then rejected 2, 3; prompt tokens have
 * weight 0. */
static const int32_t cu[] = {0, 4, 7, 12, 14};
static const float weight[14] = {0, 1, 1, 1, 0, 0, 1, 0, 0, 1, 1, 1, 0, 1};
static const float logp0[14] = {-9, -0.5f, -1.25f, -2, -7, -3, -0.75f, -4, -1, -1.5f, -0.25f, -3, -8, -2.5f};

TEST(sums_count_only_trained_tokens) {
    double sum[4];
    int n[4];
    train_sequence_sums(4, cu, logp0, weight, sum, n);
    /* by hand: -0.5-1.25-2, -0.75, -1.5-0.25-3, -2.5 */
    CHECK_NEAR(sum[0], -3.75, 1e-12);
    CHECK_NEAR(sum[1], -0.75, 1e-12);
    CHECK_NEAR(sum[2], -4.75, 1e-12);
    CHECK_NEAR(sum[3], -2.5, 1e-12);
    CHECK_EQ_INT(n[0], 3);
    CHECK_EQ_INT(n[1], 1);
    CHECK_EQ_INT(n[2], 3);
    CHECK_EQ_INT(n[3], 1);
}

/* -mean over pairs of log sigmoid(beta * ((c - ref_c) - (r - ref_r))), from the tokens. */
static const double ref[4] = {-3.5, -1.0, -4.0, -2.0};
static double dpo_loss(const float *logp, double beta) {
    double s[4];
    train_sequence_sums(4, cu, logp, weight, s, NULL);
    double l = 0;
    for (int i = 0; i < 2; i++) {
        const double z = beta * ((s[i] - ref[i]) - (s[2 + i] - ref[2 + i]));
        l += log1p(exp(-z)) / 2;
    }
    return l;
}

TEST(spread_is_the_gradient_of_a_loss_of_the_sums) {
    const double beta = 0.5;
    double s[4], dsum[4];
    train_sequence_sums(4, cu, logp0, weight, s, NULL);
    for (int i = 0; i < 2; i++) { /* d/dz log1p(exp(-z)) = -sigmoid(-z) */
        const double z = beta * ((s[i] - ref[i]) - (s[2 + i] - ref[2 + i]));
        const double g = -1 / (1 + exp(z)) * beta / 2;
        dsum[i] = g, dsum[2 + i] = -g;
    }
    float dlogp[14];
    for (int t = 0; t < 14; t++) dlogp[t] = NAN;
    train_sequence_spread(4, cu, weight, dsum, dlogp);
    for (int t = 0; t < 14; t++) {
        float lp[14];
        for (int k = 0; k < 14; k++) lp[k] = logp0[k];
        const float h = 1.0f / 64; /* exact in float: the difference quotient has no rounding in x */
        lp[t] = logp0[t] + h;
        const double up = dpo_loss(lp, beta);
        lp[t] = logp0[t] - h;
        const double down = dpo_loss(lp, beta);
        const double fd = (up - down) / (2 * h);
        CHECK_MSG(fabs(dlogp[t] - fd) < 1e-4, "token %d: spread %g, finite difference %g", t, dlogp[t], fd);
        if (weight[t] == 0) CHECK(dlogp[t] == 0.0f);
    }
}
