/* bitsandbytes' blockwise 8-bit quantization (see blockwise8.h). The map is built with fp32
 * arithmetic as torch evaluates create_dynamic_map: linspace(0.1, 1, k) in float32 (the first half
 * start + step k, the second end - step (k' - 1 - k), each one fused multiply-add, as torch's CPU
 * kernel rounds it), the midpoints of neighbours, times 10^(e) as a float; the values sorted. */
#include "blockwise8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/float_order.h>

void bw8_dynamic_map(int is_signed, float map[256]) {
    int n = 0;
    for (int i = 0; i < 7; i++) { /* exponent 10^(i-6): 2^i (signed) or 2^(i+1) fraction values */
        const int items = (is_signed ? 1 << i : 1 << (i + 1)) + 1;
        const float start = 0.1f, end = 1.0f, step = (end - start) / (float)(items - 1);
        const float scale = (float)pow(10.0, (double)(i - 6));
        float prev = 0;
        for (int k = 0; k < items; k++) { /* torch.linspace's float32 values */
            const float b =
                k < items / 2 ? fmaf(step, (float)k, start) : fmaf(-step, (float)(items - k - 1), end);
            if (k > 0) {
                const float mid = (prev + b) / 2.0f;
                map[n++] = scale * mid;
                if (is_signed) map[n++] = -(scale * mid);
            }
            prev = b;
        }
    }
    map[n++] = 0.0f;
    map[n++] = 1.0f;
    qsort(map, (size_t)n, sizeof *map, ctrl_float_ascending);
}

void bw8_build_lut(const float map[256], uint8_t lut[BW8_LUT]) {
    float mid[255];
    for (int i = 0; i < 255; i++) mid[i] = 0.5f * (map[i] + map[i + 1]);
    int k = 0;
    for (int i = 0; i < BW8_LUT; i++) {
        const float x = -1.0f + (2.0f * (float)i) / (float)(BW8_LUT - 1);
        while (k < 255 && mid[k] < x) k++;
        lut[i] = (uint8_t)k;
    }
}

void bw8_quantize_block(const uint8_t lut[BW8_LUT], const float *x, int n, uint8_t *q, float *absmax) {
    float a = 0.0f;
#pragma omp simd reduction(max : a)
    for (int i = 0; i < n; i++) a = a < fabsf(x[i]) ? fabsf(x[i]) : a; /* std::max's order */
    *absmax = a;
    if (a == 0.0f) {
        memset(q, 0, (size_t)n);
        return;
    }
    const float inv = 1.0f / a;
    int idx[BW8_BLOCK];
#pragma omp simd
    for (int i = 0; i < n; i++) {
        float v = x[i] * inv; /* std::clamp(v, -1, 1) */
        v = v < -1.0f ? -1.0f : 1.0f < v ? 1.0f : v;
        idx[i] = (int)((v + 1.0f) * 0.5f * (float)(BW8_LUT - 1) + 0.5f);
    }
    for (int i = 0; i < n; i++) q[i] = lut[idx[i]];
}
