/* NF4 quantization and dequantization (see nf4.h), on the host. */
#include "model/nf4.h"

#include "cpu/cpu_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const float ctrl_nf4_code[16] = {-1.0f,         -0.696192801f, -0.525073051f,  -0.394917488f,
                                 -0.284441382f, -0.18477343f,  -0.0910500363f, 0.0f,
                                 0.0795802996f, 0.160930201f,  0.246112302f,   0.337915242f,
                                 0.440709829f,  0.562617004f,  0.722956836f,   1.0f};

/* bitsandbytes.functional.create_dynamic_map(signed=True), sorted */
const float ctrl_nf4_dynamic_code[256] = {
    -0.992968738f,    -0.978906274f,    -0.96484375f,     -0.950781226f,
    -0.936718762f,    -0.922656238f,    -0.908593774f,    -0.89453125f,
    -0.880468726f,    -0.866406262f,    -0.852343738f,    -0.838281274f,
    -0.82421875f,     -0.810156226f,    -0.796093762f,    -0.782031238f,
    -0.767968774f,    -0.75390625f,     -0.739843726f,    -0.725781262f,
    -0.711718798f,    -0.697656274f,    -0.68359375f,     -0.669531226f,
    -0.655468762f,    -0.641406298f,    -0.627343774f,    -0.61328125f,
    -0.599218726f,    -0.585156262f,    -0.571093798f,    -0.557031274f,
    -0.54296875f,     -0.528906226f,    -0.514843702f,    -0.500781238f,
    -0.486718714f,    -0.47265625f,     -0.458593726f,    -0.444531262f,
    -0.430468738f,    -0.416406244f,    -0.40234375f,     -0.388281226f,
    -0.374218762f,    -0.360156238f,    -0.346093744f,    -0.33203125f,
    -0.317968726f,    -0.303906262f,    -0.289843738f,    -0.275781274f,
    -0.26171875f,     -0.247656241f,    -0.233593747f,    -0.219531253f,
    -0.205468744f,    -0.19140625f,     -0.177343756f,    -0.163281247f,
    -0.149218753f,    -0.135156244f,    -0.12109375f,     -0.107031256f,
    -0.0985937491f,   -0.0957812592f,   -0.0929687545f,   -0.0901562497f,
    -0.0873437524f,   -0.0845312476f,   -0.0817187577f,   -0.078906253f,
    -0.0760937482f,   -0.0732812509f,   -0.0704687461f,   -0.0676562563f,
    -0.0648437515f,   -0.0620312504f,   -0.0592187531f,   -0.0564062484f,
    -0.053593751f,    -0.05078125f,     -0.047968749f,    -0.0451562516f,
    -0.0423437469f,   -0.0395312496f,   -0.0367187522f,   -0.0339062512f,
    -0.0310937501f,   -0.028281251f,    -0.0254687499f,   -0.0226562507f,
    -0.0198437516f,   -0.0170312505f,   -0.0142187504f,   -0.0114062503f,
    -0.00971874967f,  -0.00915624946f,  -0.00859375019f,  -0.00803124998f,
    -0.00746874977f,  -0.00690625003f,  -0.00634374982f,  -0.00578125007f,
    -0.00521875033f,  -0.00465624966f,  -0.00409374991f,  -0.00353124971f,
    -0.00296874996f,  -0.00240624999f,  -0.00184375001f,  -0.00128124992f,
    -0.000943750085f, -0.000831249985f, -0.00071875006f,  -0.000606250076f,
    -0.000493750034f, -0.000381250022f, -0.000268750038f, -0.000156250011f,
    -8.87499991e-05f, -6.62500024e-05f, -4.37499984e-05f, -2.12499981e-05f,
    -7.7499999e-06f,  -3.25000019e-06f, -5.50000038e-07f, 0.0f,
    5.50000038e-07f,  3.25000019e-06f,  7.7499999e-06f,   2.12499981e-05f,
    4.37499984e-05f,  6.62500024e-05f,  8.87499991e-05f,  0.000156250011f,
    0.000268750038f,  0.000381250022f,  0.000493750034f,  0.000606250076f,
    0.00071875006f,   0.000831249985f,  0.000943750085f,  0.00128124992f,
    0.00184375001f,   0.00240624999f,   0.00296874996f,   0.00353124971f,
    0.00409374991f,   0.00465624966f,   0.00521875033f,   0.00578125007f,
    0.00634374982f,   0.00690625003f,   0.00746874977f,   0.00803124998f,
    0.00859375019f,   0.00915624946f,   0.00971874967f,   0.0114062503f,
    0.0142187504f,    0.0170312505f,    0.0198437516f,    0.0226562507f,
    0.0254687499f,    0.028281251f,     0.0310937501f,    0.0339062512f,
    0.0367187522f,    0.0395312496f,    0.0423437469f,    0.0451562516f,
    0.047968749f,     0.05078125f,      0.053593751f,     0.0564062484f,
    0.0592187531f,    0.0620312504f,    0.0648437515f,    0.0676562563f,
    0.0704687461f,    0.0732812509f,    0.0760937482f,    0.078906253f,
    0.0817187577f,    0.0845312476f,    0.0873437524f,    0.0901562497f,
    0.0929687545f,    0.0957812592f,    0.0985937491f,    0.107031256f,
    0.12109375f,      0.135156244f,     0.149218753f,     0.163281247f,
    0.177343756f,     0.19140625f,      0.205468744f,     0.219531253f,
    0.233593747f,     0.247656241f,     0.26171875f,      0.275781274f,
    0.289843738f,     0.303906262f,     0.317968726f,     0.33203125f,
    0.346093744f,     0.360156238f,     0.374218762f,     0.388281226f,
    0.40234375f,      0.416406244f,     0.430468738f,     0.444531262f,
    0.458593726f,     0.47265625f,      0.486718714f,     0.500781238f,
    0.514843702f,     0.528906226f,     0.54296875f,      0.557031274f,
    0.571093798f,     0.585156262f,     0.599218726f,     0.61328125f,
    0.627343774f,     0.641406298f,     0.655468762f,     0.669531226f,
    0.68359375f,      0.697656274f,     0.711718798f,     0.725781262f,
    0.739843726f,     0.75390625f,      0.767968774f,     0.782031238f,
    0.796093762f,     0.810156226f,     0.82421875f,      0.838281274f,
    0.852343738f,     0.866406262f,     0.880468726f,     0.89453125f,
    0.908593774f,     0.922656238f,     0.936718762f,     0.950781226f,
    0.96484375f,      0.978906274f,     0.992968738f,     1.0f,
};

static int64_t blocks(int64_t n, int64_t b) { return (n + b - 1) / b; }

void ctrl_nf4_quantize_blocks(const float *w, int64_t n, uint8_t *packed, float *absmax) {
    /* the midpoints between neighbouring codes; a value's code is the count of midpoints below it
     * (one on a midpoint takes the lower code, as torch.bucketize over the midpoints does) */
    float mid[15];
    for (int j = 0; j < 15; j++) mid[j] = (ctrl_nf4_code[j] + ctrl_nf4_code[j + 1]) / 2.0f;
    memset(packed, 0, (size_t)(n + 1) / 2); /* an odd last value pairs with a zero index */
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < blocks(n, CTRL_NF4_BLOCK); b++) { /* blocks of 64 share no byte */
        const int64_t b0 = b * CTRL_NF4_BLOCK, len = b0 + CTRL_NF4_BLOCK < n ? CTRL_NF4_BLOCK : n - b0;
        float m = 0.0f, x[CTRL_NF4_BLOCK];
        uint8_t q[CTRL_NF4_BLOCK];
        for (int64_t i = 0; i < len; i++) { /* the weights are finite (checked as they load) */
            const float a = fabsf(w[b0 + i]);
            m = a > m ? a : m;
        }
        absmax[b] = len < CTRL_NF4_BLOCK ? fmaxf(m, 1e-38f) : m; /* bitsandbytes clamps a partial block's */
        const float inv = 1.0f / fmaxf(m, 1e-38f);
        for (int64_t i = 0; i < len; i++) {
            const float v = w[b0 + i] * inv;
            x[i] = v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
            q[i] = 0;
        }
        for (int j = 0; j < 15; j++) /* branch-free, so vectorised */
            for (int64_t i = 0; i < len; i++) q[i] += x[i] > mid[j];
        for (int64_t i = 0; i < len; i++) /* the first value in the high nibble */
            packed[(b0 + i) / 2] |= (uint8_t)((b0 + i) % 2 ? q[i] : q[i] << 4);
    }
}

/* bitsandbytes' native CPU blockwise quantizer (what its quantize_blockwise runs on the CPU, and so
 * what the double quantization of a QLoRA load gives): [-1, 1] cut into 65535 steps, each step's
 * point mapped to the first code whose upper midpoint is not below it, and a value scaled by
 * 1 / absmax looked up at its nearest step (the same float operations, so the same bytes). */
void ctrl_nf4_quantize_dynamic(const float *x, int64_t n, uint8_t *q, float *scale) {
    enum { STEPS = 65536 };
    static uint8_t lut[STEPS];
    static int built;
    if (!built) { /* the first call builds it (loading is single-threaded) */
        float mid[255];
        for (int i = 0; i < 255; i++)
            mid[i] = 0.5f * (ctrl_nf4_dynamic_code[i] + ctrl_nf4_dynamic_code[i + 1]);
        for (int i = 0, c = 0; i < STEPS; i++) {
            const float v = -1.0f + (2.0f * (float)i) / (float)(STEPS - 1);
            while (c < 255 && mid[c] < v) c++;
            lut[i] = (uint8_t)c;
        }
        built = 1;
    }
    for (int64_t b0 = 0; b0 < n; b0 += CTRL_NF4_BLOCK2) {
        const int64_t b1 = b0 + CTRL_NF4_BLOCK2 < n ? b0 + CTRL_NF4_BLOCK2 : n;
        float m = 0.0f;
        for (int64_t i = b0; i < b1; i++) m = fmaxf(m, fabsf(x[i]));
        scale[b0 / CTRL_NF4_BLOCK2] = m;
        const float inv = m > 0.0f ? 1.0f / m : 0.0f;
        for (int64_t i = b0; i < b1; i++) {
            float v = x[i] * inv;
            v = v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v;
            const float at = (v + 1.0f) * 0.5f * (float)(STEPS - 1) + 0.5f;
            q[i] = m > 0.0f ? lut[(uint16_t)at] : 0;
        }
    }
}

/* The mean of the block scales in double, rounded once (torch's float32 mean can differ from it by
 * an ulp: its vectorised reduction order is its own). */
static float mean(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return (float)(s / (double)n);
}

size_t ctrl_nf4_bytes(int64_t n) {
    const int64_t nb = blocks(n, CTRL_NF4_BLOCK);
    return (size_t)(n + 1) / 2 + (size_t)nb + sizeof(float) * (size_t)blocks(nb, CTRL_NF4_BLOCK2);
}

ctrl_status ctrl_nf4_quantize(const float *w, int64_t n, ctrl_nf4 *out) {
    const int64_t nb = blocks(n, CTRL_NF4_BLOCK), nb2 = blocks(nb, CTRL_NF4_BLOCK2);
    memset(out, 0, sizeof *out);
    out->n = n;
    out->packed = malloc((size_t)(n + 1) / 2 + 1);
    out->qabsmax = malloc((size_t)nb + 1);
    out->absmax2 = malloc(sizeof(float) * (size_t)(nb2 + 1));
    float *absmax = malloc(sizeof(float) * (size_t)(nb + 1));
    if (!out->packed || !out->qabsmax || !out->absmax2 || !absmax) {
        free(absmax);
        ctrl_nf4_free(out);
        return ctrl_error_set(CTRL_ERR_NOMEM, "NF4: %lld values", (long long)n);
    }
    ctrl_nf4_quantize_blocks(w, n, out->packed, absmax);
    out->offset = mean(absmax, nb); /* the mean of the block scales, less which they are quantized */
    for (int64_t b = 0; b < nb; b++) absmax[b] -= out->offset;
    ctrl_nf4_quantize_dynamic(absmax, nb, out->qabsmax, out->absmax2);
    free(absmax);
    return CTRL_OK;
}

void ctrl_nf4_absmax(const ctrl_nf4 *q, float *absmax) {
    const ctrl_nf4_ref w = {
        q->packed, q->qabsmax, q->absmax2, q->offset, ctrl_nf4_code, ctrl_nf4_dynamic_code, q->n, 0};
    const int64_t nb = blocks(q->n, CTRL_NF4_BLOCK);
    for (int64_t b = 0; b < nb; b++) absmax[b] = ctrl_cpu_nf4_block_scale(&w, b); /* torch's two operations */
}

void ctrl_nf4_dequantize(const ctrl_nf4 *q, const float *absmax, float *out) {
    const int64_t nb = blocks(q->n, CTRL_NF4_BLOCK);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nb; b++) { /* a block of 64 values: 32 bytes, two values each */
        const int64_t i1 = (b + 1) * CTRL_NF4_BLOCK < q->n ? (b + 1) * CTRL_NF4_BLOCK : q->n;
        const float s = absmax[b];
        for (int64_t i = b * CTRL_NF4_BLOCK; i < i1; i++) {
            const uint8_t byte = q->packed[i / 2];
            out[i] = ctrl_nf4_code[i % 2 ? byte & 0xF : byte >> 4] * s;
        }
    }
}

ctrl_status ctrl_nf4_dequantize_raw(float *out, const uint8_t *packed, const uint8_t *qabsmax,
                                    const float *absmax2, float offset, const float *code,
                                    const float *dynamic, int64_t n) {
    const ctrl_nf4_ref w = {packed, qabsmax, absmax2, offset, code, dynamic, n, 0};
    const int64_t seg = 64 * 64; /* whole blocks of 64 per call */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i += seg) ctrl_cpu_nf4_values(&w, i, n - i < seg ? n - i : seg, out + i);
    return CTRL_OK;
}

void ctrl_nf4_span(int64_t n, int rank, int size, int64_t *v0, int64_t *v1) {
    const int64_t supers = blocks(n, CTRL_NF4_SUPER), each = supers / size, more = supers % size;
    const int64_t s0 = rank * each + (rank < more ? rank : more), s1 = s0 + each + (rank < more);
    *v0 = s0 * CTRL_NF4_SUPER < n ? s0 * CTRL_NF4_SUPER : n;
    *v1 = s1 * CTRL_NF4_SUPER < n ? s1 * CTRL_NF4_SUPER : n;
}

void ctrl_nf4_part_counts(int64_t v0, int64_t v1, size_t counts[3]) {
    const int64_t n = v1 - v0, nb = blocks(n, CTRL_NF4_BLOCK);
    counts[0] = (size_t)(n + 1) / 2, counts[1] = (size_t)nb;
    counts[2] = sizeof(float) * (size_t)blocks(nb, CTRL_NF4_BLOCK2);
}

ctrl_status ctrl_nf4_slice(const ctrl_nf4 *q, int rank, int size, ctrl_nf4 *out) {
    int64_t v0, v1;
    ctrl_nf4_span(q->n, rank, size, &v0, &v1);
    size_t c[3];
    ctrl_nf4_part_counts(v0, v1, c);
    memset(out, 0, sizeof *out);
    out->n = v1 - v0, out->offset = q->offset;
    out->packed = malloc(c[0] + 1), out->qabsmax = malloc(c[1] + 1),
    out->absmax2 = malloc(c[2] + sizeof(float));
    if (!out->packed || !out->qabsmax || !out->absmax2) {
        ctrl_nf4_free(out);
        return ctrl_error_set(CTRL_ERR_NOMEM, "NF4: a slice of %lld values", (long long)(v1 - v0));
    }
    memcpy(out->packed, q->packed + v0 / 2, c[0]);
    memcpy(out->qabsmax, q->qabsmax + v0 / CTRL_NF4_BLOCK, c[1]);
    memcpy(out->absmax2, q->absmax2 + v0 / CTRL_NF4_SUPER, c[2]);
    return CTRL_OK;
}

void ctrl_nf4_free(ctrl_nf4 *q) {
    free(q->packed), free(q->qabsmax), free(q->absmax2);
    q->packed = q->qabsmax = NULL, q->absmax2 = NULL;
}
