/* QLoRA's products on the CPU with the frozen weight W [OUT, IN] held in NF4 (core/model/nf4.h:
 * bitsandbytes' 16 code values, blocks of 64 along the flat row-major index, block scales
 * double-quantized in blocks of 256), dequantized a tile at a time inside the product, never whole:
 *
 *   - bf16 compute on AVX-512 BF16: the blocked GEMM (gemm_bf16.c) packs its B panels from
 *     nf4_source, which decodes the row runs each packing step asks for straight from the nibbles to
 *     bf16 (ctrl_cpu_gemm_bf16_source; a small bf16 scratch, then the panels): what exists of W at
 *     any time is that scratch and the GEMM's own bf16 panel (KC x NC values per block);
 *   - decoding (bf16, at most FEW_ROWS rows of x, W's rows on blocks of 64): no panels at all; each
 *     row of W decoded into registers and dotted with the few rows of x (few_forward below);
 *   - fp32 compute (or bf16 without AVX-512 BF16): OpenBLAS cannot take a packing callback, so W is
 *     dequantized CHUNK_FLOATS values at a time (a band of whole rows: 1 MiB) and each band
 *     multiplied by cblas_sgemm (forward: the band's output columns; backward: the band's share of
 *     dX, accumulated).
 *
 * The values are those of ctrl_nf4_absmax + ctrl_nf4_dequantize bit for bit (absmax_b =
 * dynamic[q_b] * absmax2[b / 256] + offset, each operation rounded; value = code[nibble] * absmax_b),
 * so a bf16 product equals the one over the dequantized weight exactly (the same GEMM, the same
 * panels), the few-row one and an fp32 one up to the order of their sums (tests/unit/test_nf4_gemm.c). */
#include <cblas.h>
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "cpu/par_min.h"

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

/* v rounded to bf16, to nearest even (v finite) */
static inline uint16_t bf16_of(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline float value_at(const ctrl_nf4_ref *w, int64_t i, float s) {
    const uint8_t byte = w->packed[i / 2];
    return w->code[i % 2 ? byte & 0xF : byte >> 4] * s;
}

#if defined(__x86_64__) && (defined(__clang__) || __GNUC__ >= 9)
#define VECTOR 1
#define TARGET __attribute__((target("avx512f,avx512bw")))
#define TARGET16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
/* 16 values of one block from 8 bytes (the first value in the high nibble of the first byte) */
TARGET static inline __m512 decode16(const uint8_t *bytes, __m512 codes, __m512 s) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)bytes), low4 = _mm_set1_epi8(0x0F);
    const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), low4), _mm_and_si128(b, low4));
    return _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(nib), codes), s);
}

/* A block's 16 code values times its scale s rounded to bf16, twice over (32 words: a vpermw table
 * whose index bit 4 does not matter). */
TARGET16 static inline __m512i table_of(__m512 code16, float s) {
    const __m512 v = _mm512_mul_ps(code16, _mm512_set1_ps(s));
    return (__m512i)_mm512_cvtne2ps_pbh(v, v);
}

/* The same values rounded to bf16, 32 at a time: each block's table (table_of; vcvtne2ps2bf16 rounds
 * to nearest even; the values are finite, and a denormal one -- never made by a code value times a
 * block's scale in practice -- would become a zero, which the bf16 products read it as anyway); 16
 * bytes become 32 word indices (the high nibble, then the byte itself: vpermw reads an index's low 5
 * bits, the low nibble and a bit the doubled table ignores) and one vpermw looks them all up. */
TARGET16 static void bf16_vec(const ctrl_nf4_ref *w, int64_t i, int64_t n, uint16_t *dst) {
    const __m512 code16 = _mm512_loadu_ps(w->code);
    while (n > 0) {
        const int64_t b = i / 64, end = (b + 1) * 64 < i + n ? (b + 1) * 64 : i + n;
        const float s = scale_of(w, b);
        const __m512i table = table_of(code16, s);
        for (; i < end && i % 2; i++, n--) *dst++ = bf16_of(value_at(w, i, s));
        while (end - i >= 2) { /* whole bytes, up to 16 at a time (a shorter run masked) */
            const int cnt = end - i >= 32 ? 32 : (int)((end - i) & ~(int64_t)1);
            const __mmask16 bytes = (__mmask16)((1u << (cnt / 2)) - 1u);
            const __mmask32 words = cnt == 32 ? 0xFFFFFFFFu : (__mmask32)((1u << cnt) - 1u);
            const __m512i d = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(bytes, w->packed + i / 2));
            const __m512i idx = _mm512_or_si512(_mm512_srli_epi32(d, 4), _mm512_slli_epi32(d, 16));
            _mm512_mask_storeu_epi16(dst, words, _mm512_permutexvar_epi16(idx, table));
            i += cnt, n -= cnt, dst += cnt;
        }
        for (; i < end; i++, n--) *dst++ = bf16_of(value_at(w, i, s));
    }
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

/* Decoding's products, x [T, IN] W^T for T <= FEW_ROWS (a handful of sequences), with no packing at
 * all: packing W's panels costs more than these few rows' products. Each row of W is decoded a block
 * of 64 values at a time into two registers (the block's table, as bf16_vec's) and dotted with the T
 * rows of x (rounded to bf16 once, xb [T, IN]) by vdpbf16ps, two rows of W at once so that each load
 * of x serves both; a row's 16 lanes are summed at its end. W's rows must start on blocks of 64 (IN and
 * first multiples of 64: every projection of the models here). The sums run in another order than
 * the blocked GEMM's (lanes along IN, not along the output): the products agree within float
 * rounding, not bit for bit, as ctrl_cpu_gemm_bf16's own few-row path. */
#define FEW_ROWS 8

/* rows [n, n + nw) of W (nw 1 or 2) against T rows of xb: out[m * OUT + n + r]. A block's 32 bytes
 * widen to 32 words (byte i: the values 2i in its high nibble, 2i + 1 in its low one); the words
 * shifted right by 4 look up the even values, the words as they are the odd ones (vpermw reads an
 * index's low 5 bits: the low nibble and a bit the doubled table ignores), and xb holds each block's
 * 64 values of x in that order (deinterleaved: even positions, then odd ones). */
TARGET16 static inline __attribute__((always_inline)) void
few_rows(float *out, const uint16_t *xb, const ctrl_nf4_ref *w, int T, int IN, int OUT, int n, int nw) {
    const __m512 code16 = _mm512_loadu_ps(w->code);
    __m512 acc[2][FEW_ROWS];
    for (int r = 0; r < 2; r++)
        for (int m = 0; m < FEW_ROWS; m++) acc[r][m] = _mm512_setzero_ps();
    const int64_t base0 = w->first + (int64_t)n * IN, base1 = base0 + (nw > 1 ? IN : 0);
    for (int k = 0; k < IN; k += 64) {
        const __m512i z0 =
            _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(w->packed + (base0 + k) / 2)));
        const __m512i t0 = table_of(code16, scale_of(w, (base0 + k) / 64));
        const __m512bh e0 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(z0, 4), t0),
                       o0 = (__m512bh)_mm512_permutexvar_epi16(z0, t0);
        __m512bh e1 = e0, o1 = o0;
        if (nw > 1) {
            const __m512i z1 =
                _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(w->packed + (base1 + k) / 2)));
            const __m512i t1 = table_of(code16, scale_of(w, (base1 + k) / 64));
            e1 = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(z1, 4), t1);
            o1 = (__m512bh)_mm512_permutexvar_epi16(z1, t1);
        }
        for (int m = 0; m < T; m++) {
            const uint16_t *xm = xb + (size_t)m * IN + k;
            const __m512bh xe = (__m512bh)_mm512_loadu_si512(xm), xo = (__m512bh)_mm512_loadu_si512(xm + 32);
            acc[0][m] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[0][m], xe, e0), xo, o0);
            if (nw > 1) acc[1][m] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[1][m], xe, e1), xo, o1);
        }
    }
    for (int m = 0; m < T; m++)
        for (int r = 0; r < nw; r++) out[(size_t)m * OUT + n + r] = _mm512_reduce_add_ps(acc[r][m]);
}

/* the kernel with T a constant (the loops over x's rows unrolled, the accumulators in registers) */
#define FEW_CASE(TT)                                                                                         \
    case TT:                                                                                                 \
        for (int n = n0; n < n1; n += 2) few_rows(out, xb, w, TT, IN, OUT, n, n1 - n < 2 ? 1 : 2);           \
        break;
TARGET16 static void few_range(float *out, const uint16_t *xb, const ctrl_nf4_ref *w, int T, int IN, int OUT,
                               int n0, int n1) {
    switch (T) {
        FEW_CASE(1) FEW_CASE(2) FEW_CASE(3) FEW_CASE(4) FEW_CASE(5) FEW_CASE(6) FEW_CASE(7) FEW_CASE(8)
    }
}

/* x [n] (n a multiple of 64) rounded to bf16 into xb, each block of 64 deinterleaved: its 32 values
 * at even positions, then its 32 at odd ones (few_rows' order) */
TARGET16 static void round_rows(uint16_t *xb, const float *x, int64_t n) {
    const __m512i even = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30,
                                          28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi16(even, _mm512_set1_epi16(1));
    for (int64_t i = 0; i < n; i += 64) {
        const __m512i a = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i)),
                      b = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 48),
                                                       _mm512_loadu_ps(x + i + 32));
        _mm512_storeu_si512(xb + i, _mm512_permutex2var_epi16(a, even, b));
        _mm512_storeu_si512(xb + i + 32, _mm512_permutex2var_epi16(a, odd, b));
    }
}

static int few_forward(float *out, const float *x, const ctrl_nf4_ref *w, int T, int IN, int OUT) {
    uint16_t *xb = malloc(sizeof(uint16_t) * (size_t)T * (size_t)IN);
    if (!xb) return -1;
    round_rows(xb, x, (int64_t)T * IN);
#pragma omp parallel for schedule(static) if (CTRL_CPU_GEMM_PARALLEL(T, OUT, IN))
    for (int n = 0; n < OUT; n += 2) few_range(out, xb, w, T, IN, OUT, n, n + 2 < OUT ? n + 2 : OUT);
    free(xb);
    return 0;
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
    if (ok < 0)
        ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
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

/* The vector decoders run: AVX-512 (F, BW, VL) and BF16, not turned off by CTRL_NO_AVX512BF16 (read
 * at each product: tests flip it). */
static int bf16_vector(void) { return vector_ok() && ctrl_cpu_has_avx512bf16(); }

#if VECTOR
/* the few-row kernel runs (where the vector decoders do): few rows, blocks of 64 aligned with W's
 * rows, not turned off by CTRL_NF4_PACK_FEW=1 (which packs for any rows: for comparisons) */
static int few_ok(const ctrl_nf4_ref *w, int T, int IN) {
    static int off = -1;
    if (off < 0) {
        const char *v = getenv("CTRL_NF4_PACK_FEW");
        off = v && *v && strcmp(v, "0") != 0;
    }
    return !off && T <= FEW_ROWS && IN % 64 == 0 && w->first % 64 == 0;
}
#endif

/* The packing step's source (ctrl_cpu_gemm_source; ctx: a source_ctx): W's values [i, i + n) as
 * bf16, by the vector decoder where the product found it runs (AVX-512 BF16; AMX CPUs have it too)
 * and one by one elsewhere (the emulated AMX kernel on another CPU). */
typedef struct source_ctx {
    const ctrl_nf4_ref *w;
    int vec;
} source_ctx;

static void nf4_source(const void *ctx, size_t at, int n, uint16_t *dst) {
    const source_ctx *c = ctx;
    const ctrl_nf4_ref *w = c->w;
    int64_t i = (int64_t)at + w->first;
#if VECTOR
    if (c->vec) {
        bf16_vec(w, i, n, dst);
        return;
    }
#endif
    while (n > 0) {
        const int64_t b = i / 64, end = (b + 1) * 64 < i + n ? (b + 1) * 64 : i + n;
        const float s = scale_of(w, b);
        for (; i < end; i++, n--) *dst++ = bf16_of(value_at(w, i, s));
    }
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
    const source_ctx src = {w, bf16 && bf16_vector()};
#if VECTOR
    const int few = src.vec && few_ok(w, T, IN) && few_forward(out, x, w, T, IN, OUT) == 0;
#else
    const int few = 0;
#endif
    if (!few &&
        (!bf16 || ctrl_cpu_gemm_bf16_source(0, 1, T, OUT, IN, x, IN, nf4_source, &src, IN, out, OUT, 0) != 0))
        if (banded(out, x, w, T, IN, OUT, 0, bf16) != 0) return -1;
    if (bias) {
#pragma omp parallel for schedule(static) if ((size_t)T * OUT >= CTRL_CPU_PAR_MIN)
        for (int t = 0; t < T; t++)
            for (int o = 0; o < OUT; o++) out[(size_t)t * OUT + o] += bias[o];
    }
    return 0;
}

int ctrl_cpu_nf4_linear_backward(float *dx, const float *dout, const ctrl_nf4_ref *w, int T, int IN, int OUT,
                                 int bf16) {
    if (T <= 0 || IN <= 0) return 0;
    if (OUT <= 0 || (int64_t)IN * OUT != w->n) return -2;
    const source_ctx src = {w, bf16 && bf16_vector()};
    if (bf16 && ctrl_cpu_gemm_bf16_source(0, 0, T, IN, OUT, dout, OUT, nf4_source, &src, IN, dx, IN, 0) == 0)
        return 0;
    return banded(dx, dout, w, T, IN, OUT, 1, bf16);
}

size_t ctrl_cpu_nf4_scratch_bytes(int T, int IN, int OUT, int bf16) {
    const int rows = CHUNK_FLOATS / IN < 1 ? 1 : CHUNK_FLOATS / IN > OUT ? OUT : CHUNK_FLOATS / IN;
    const size_t in = bf16 ? sizeof(float) * (size_t)T * (size_t)(IN > OUT ? IN : OUT) : 0;
    return sizeof(float) * (size_t)rows * (size_t)IN + in;
}
