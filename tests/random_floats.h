/* Seeded uniform floats in [-1, 1) for kernel tests: a 32-bit linear congruential step, 16 bits of
 * it scaled; the same seed gives the same values on every machine. */
#ifndef CTRL_TEST_RANDOM_FLOATS_H
#define CTRL_TEST_RANDOM_FLOATS_H

#include <stdlib.h>

static inline float frand(unsigned *s) {
    return (float)((*s = *s * 1103515245u + 12345u) >> 8 & 0xFFFF) / 32768.0f - 1;
}

/* n such floats in a new buffer (the caller frees it) */
static inline float *rnd(size_t n, unsigned *seed) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; x && i < n; i++) x[i] = frand(seed);
    return x;
}

#endif
