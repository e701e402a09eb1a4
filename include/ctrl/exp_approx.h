/* exp(x) for fp32 kernels, in the core and in plugins, in a form compilers vectorise (no libm
 * call, no branches): Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, Cephes' degree-6
 * polynomial for e^r, and 2^n built in the exponent bits. Relative error below 2 ulp over
 * [-87.3, 88.37]; inputs outside are clamped (so exp of a very negative x is ~1e-38, not 0 — for
 * sums and scales, not for exact zeros; -inf gives that too, +inf the largest value). A NaN gives a
 * NaN: n is read from the bits of the rounded float rather than converted (converting a NaN to an
 * integer is undefined behaviour), and the NaN propagates through the polynomial. GCC vectorises
 * loops over it with -fno-trapping-math (the project builds with it), which lets it if-convert the
 * clamps. */
#ifndef CTRL_EXP_APPROX_H
#define CTRL_EXP_APPROX_H

#include <stdint.h>
#include <string.h>

static inline float ctrl_exp_approx(float x) {
    x = x < -87.33654f ? -87.33654f : x;
    x = x > 88.37626f ? 88.37626f : x; /* n <= 127: 2^n stays a finite float */
    /* n = round(x / ln2): adding 1.5 * 2^23 rounds to the nearest integer, which the low mantissa
     * bits of the sum then hold (0x4B400000 + n for |n| < 2^22) */
    const float shifted = x * 1.44269504088896341f + 12582912.0f, n = shifted - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits;
    memcpy(&bits, &shifted, sizeof bits);
    bits = (bits - 0x4B400000u + 127u) << 23; /* unsigned: any bits of a NaN are defined */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#endif
