/* ctrl_exp_approx (include/ctrl/exp_approx.h, used by the head, SwiGLU, flash attention, the paged
 * plugin and sampling) against libm's exp in double: relative error below 2 ulp of fp32 over the
 * whole clamped range, exact 1 at 0, finite and monotone at the ends; the same values from a
 * vectorised loop as from scalar calls; NaN in, NaN out, without undefined behaviour (this test is
 * built with UBSan's float-cast-overflow and shift checks, tests/unit/tests.cmake: converting the
 * NaN's n to an integer used to be one). */
#include <math.h>
#include <stdlib.h>

#include <ctrl/exp_approx.h>

#include "test.h"

TEST(within_two_ulp_of_exp) {
    double worst = 0;
    float at = 0;
    for (float x = -87.0f; x < 88.37f; x += 1.0f / 4096) {
        const double e = exp((double)x), rel = fabs((double)ctrl_exp_approx(x) - e) / e;
        if (rel > worst) worst = rel, at = x;
    }
    printf("  worst relative error %.3g (%.2f ulp) at %g\n", worst, worst / 5.96e-8, at);
    CHECK_MSG(worst < 2 * 5.96e-8, "relative error %.3g at %g", worst, at);
    CHECK(ctrl_exp_approx(0.0f) == 1.0f);
}

TEST(clamped_ends_are_finite_and_monotone) {
    /* below the range: the smallest normal scale, not 0 (callers map -inf to 0 themselves) */
    const float lo = ctrl_exp_approx(-1000.0f), hi = ctrl_exp_approx(1000.0f);
    CHECK(lo > 0 && lo < 1e-37f && isfinite(hi) && hi > 1e38f);
    CHECK(ctrl_exp_approx(-INFINITY) == lo);
    float prev = 0;
    for (float x = -100.0f; x < 100.0f; x += 0.01f) {
        const float y = ctrl_exp_approx(x);
        CHECK_MSG(y >= prev, "not monotone at %g", x);
        prev = y;
    }
}

TEST(vectorised_loop_equals_scalar_calls) {
    enum { N = 4099 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) x[i] = -80.0f + 160.0f * (float)i / N;
#pragma omp simd
    for (int i = 0; i < N; i++) y[i] = ctrl_exp_approx(x[i]);
    int same = 1;
    for (int i = 0; i < N; i++) {
        volatile float xi = x[i];
        same &= y[i] == ctrl_exp_approx(xi);
    }
    CHECK(same);
    free(x), free(y);
}

TEST(nan_gives_nan_and_infinities_clamp) {
    volatile float nan = NAN;
    CHECK(isnan(ctrl_exp_approx(nan)));
    CHECK(isnan(ctrl_exp_approx(-nan)));
    CHECK(ctrl_exp_approx(INFINITY) == ctrl_exp_approx(1000.0f));
    CHECK(ctrl_exp_approx(-INFINITY) == ctrl_exp_approx(-1000.0f));
    enum { N = 1027 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) x[i] = i % 3 == 0 ? nan : i % 3 == 1 ? INFINITY : -50.0f + (float)i / 10;
#pragma omp simd
    for (int i = 0; i < N; i++) y[i] = ctrl_exp_approx(x[i]);
    int ok = 1;
    for (int i = 0; i < N; i++) {
        volatile float xi = x[i];
        const float want = ctrl_exp_approx(xi);
        ok &= isnan(x[i]) ? isnan(y[i]) : y[i] == want && isfinite(y[i]);
    }
    CHECK(ok);
    free(x), free(y);
}
