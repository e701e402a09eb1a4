/* QLoRA's products on the CPU with the frozen weight W [OUT, IN] held in NF4 (core/model/nf4.h:
 * bitsandbytes' 16 code values, blocks of 64 along the flat row-major index, block scales
 * double-quantized in blocks of 256), dequantized a tile at a time inside the product, never whole:
 *
 *   - bf16 compute on AVX-512 BF16: the blocked GEMM (gemm_bf16.c) packs its B panels from
 *     nf4_source, which decodes the 16 or 32 values each packing step asks for straight from the
 *     nibbles (ctrl_cpu_gemm_bf16_source): what exists of W at any time is the GEMM's own bf16 panel
 *     (KC x NC values per block), as for an fp32 weight;
 *   - fp32 compute (or bf16 without AVX-512 BF16): OpenBLAS cannot take a packing callback, so W is
 *     dequantized CHUNK_FLOATS values at a time (a band of whole rows: 1 MiB) and each band
 *     multiplied by cblas_sgemm (forward: the band's output columns; backward: the band's share of
 *     dX, accumulated).
 *
 * The values are those of ctrl_nf4_absmax + ctrl_nf4_dequantize bit for bit (absmax_b =
 * dynamic[q_b] * absmax2[b / 256] + offset, each operation rounded; value = code[nibble] * absmax_b),
 * so a bf16 product equals the one over the dequantized weight exactly (the same GEMM, the same
 * panels) and an fp32 one up to the order of sgemm's sums (tests/unit/test_nf4_gemm.c). */
#include <cblas.h>
#include <immintrin.h>
#include <stdlib.h>

#include "cpu/cpu_ops.h"

#define CHUNK_FLOATS (1 << 18)

/* v rounded to float as an operation of its own (no contraction into a following add: the scale's
 * two operations round as torch's do). */
static inline float rounded(float v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __asm__("" : "+x"(v));
#elif defined(__GNUC__)
    __asm__("" : "+r"(v));
#endif
    return v;
}

static inline float scale_of(const ctrl_nf4_ref *w, int64_t b) {
    return rounded(w->dynamic[w->qabsmax[b]] * w->absmax2[b / 256]) + w->offset;
}

float ctrl_cpu_nf4_block_scale(const ctrl_nf4_ref *w, int64_t b) { return scale_of(w, b); }

static inline float value_at(const ctrl_nf4_ref *w, int64_t i, float s) {
    const uint8_t byte = w->packed[i / 2];
    return w->code[i % 2 ? byte & 0xF : byte >> 4] * s;
}

#if defined(__x86_64__) && (defined(__clang__) || __GNUC__ >= 9)
#define VECTOR 1
#define TARGET __attribute__((target("avx512f,avx512bw")))
/* 16 values of one block from 8 bytes (the first value in the high nibble of the first byte) */
TARGET static inline __m512 decode16(const uint8_t *bytes, __m512 codes, __m512 s) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)bytes), low4 = _mm_set1_epi8(0x0F);
    const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), low4), _mm_and_si128(b, low4));
    return _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(nib), codes), s);
}

TARGET static void values_vec(const ctrl_nf4_ref *w, int64_t i, int64_t n, float *dst) {
    const __m512 codes = _mm512_loadu_ps(w->code);
    while (n > 0) {
        const int64_t b = i / 64, end = (b + 1) * 64 < i + n ? (b + 1) * 64 : i + n;
        const float s = scale_of(w, b);
        const __m512 sv = _mm512_set1_ps(s);
        for (; i < end && i % 2; i++, n--) *dst++ = value_at(w, i, s);
        for (; i + 16 <= end; i += 16, n -= 16, dst += 16)
            _mm512_storeu_ps(dst, decode16(w->packed + i / 2, codes, sv));
        for (; i < end; i++, n--) *dst++ = value_at(w, i, s);
    }
}
#else
#define VECTOR 0
#endif

static void values_scalar(const ctrl_nf4_ref *w, int64_t i, int64_t n, float *dst) {
    while (n > 0) {
        const int64_t b = i / 64, end = (b + 1) * 64 < i + n ? (b + 1) * 64 : i + n;
        const float s = scale_of(w, b);
        for (; i < end; i++, n--) *dst++ = value_at(w, i, s);
    }
}

static int vector_ok(void) {
#if VECTOR
    static int ok = -1;
    if (ok < 0) ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    return ok;
#else
    return 0;
#endif
}

void ctrl_cpu_nf4_values(const ctrl_nf4_ref *w, int64_t i, int64_t n, float *dst) {
    i += w->first; /* the weight's index into the quantized tensor's */
#if VECTOR
    if (vector_ok()) {
        values_vec(w, i, n, dst);
        return;
    }
#endif
    values_scalar(w, i, n, dst);
}

/* The packing step's source (ctrl_cpu_gemm_source). */
static void nf4_source(const void *ctx, size_t i, int n, float *dst) {
    ctrl_cpu_nf4_values(ctx, (int64_t)i, n, dst);
}

/* W's values [i, i + n) into dst, across the threads (blocks of 64 never split between two). */
static void values_parallel(const ctrl_nf4_ref *w, int64_t i, int64_t n, float *dst) {
    const int64_t seg = 64 * 64, first = (i / 64 + 1) * 64 - i < n ? (i / 64 + 1) * 64 - i : n;
    ctrl_cpu_nf4_values(w, i, first, dst); /* up to the first block boundary */
#pragma omp parallel for schedule(static)
    for (int64_t s = first; s < n; s += seg)
        ctrl_cpu_nf4_values(w, i + s, n - s < seg ? n - s : seg, dst + s);
}

/* The band path (see the top): forward out[T, OUT] = in W^T, else dx[T, IN] = in[T, OUT] W; bf16:
 * in and W rounded to bf16 first (the portable bf16 path's arithmetic). */
static int banded(float *out, const float *in, const ctrl_nf4_ref *w, int T, int IN, int OUT, int backward,
                  int bf16) {
    int rows = CHUNK_FLOATS / IN;
    rows = rows < 1 ? 1 : rows > OUT ? OUT : rows;
    float *band = malloc(sizeof(float) * (size_t)rows * (size_t)IN);
    const int64_t nin = (int64_t)T * (backward ? OUT : IN);
    float *rin = bf16 ? malloc(sizeof(float) * (size_t)nin) : NULL;
    if (!band || (bf16 && !rin)) {
        free(band), free(rin);
        return -1;
    }
    if (rin) ctrl_cpu_round_to_bf16(rin, in, nin), in = rin;
    for (int o0 = 0; o0 < OUT; o0 += rows) {
        const int nb = OUT - o0 < rows ? OUT - o0 : rows;
        values_parallel(w, (int64_t)o0 * IN, (int64_t)nb * IN, band);
        if (bf16) ctrl_cpu_round_to_bf16(band, band, (int64_t)nb * IN);
        if (!backward)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, nb, IN, 1.0f, in, IN, band, IN, 0.0f,
                        out + o0, OUT);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, IN, nb, 1.0f, in + o0, OUT, band, IN,
                        o0 ? 1.0f : 0.0f, out, IN);
    }
    free(band), free(rin);
    return 0;
}

int ctrl_cpu_nf4_linear_forward(float *out, const float *x, const ctrl_nf4_ref *w, const float *bias, int T,
                                int IN, int OUT, int bf16) {
    if (T <= 0 || OUT <= 0) return 0;
    if (IN <= 0 || (int64_t)IN * OUT != w->n) return -2;
    if (!bf16 || ctrl_cpu_gemm_bf16_source(0, 1, T, OUT, IN, x, IN, nf4_source, w, IN, out, OUT, 0) != 0)
        if (banded(out, x, w, T, IN, OUT, 0, bf16) != 0) return -1;
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int t = 0; t < T; t++)
            for (int o = 0; o < OUT; o++) out[(size_t)t * OUT + o] += bias[o];
    }
    return 0;
}

int ctrl_cpu_nf4_linear_backward(float *dx, const float *dout, const ctrl_nf4_ref *w, int T, int IN, int OUT,
                                 int bf16) {
    if (T <= 0 || IN <= 0) return 0;
    if (OUT <= 0 || (int64_t)IN * OUT != w->n) return -2;
    if (bf16 && ctrl_cpu_gemm_bf16_source(0, 0, T, IN, OUT, dout, OUT, nf4_source, w, IN, dx, IN, 0) == 0)
        return 0;
    return banded(dx, dout, w, T, IN, OUT, 1, bf16);
}

size_t ctrl_cpu_nf4_scratch_bytes(int T, int IN, int OUT, int bf16) {
    const int rows = CHUNK_FLOATS / IN < 1 ? 1 : CHUNK_FLOATS / IN > OUT ? OUT : CHUNK_FLOATS / IN;
    const size_t in = bf16 ? sizeof(float) * (size_t)T * (size_t)(IN > OUT ? IN : OUT) : 0;
    return sizeof(float) * (size_t)rows * (size_t)IN + in;
}
