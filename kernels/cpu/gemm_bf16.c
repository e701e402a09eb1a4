/* The blocked bf16 GEMM: C[M,N] (+)= op(A)[M,K] op(B)[K,N] with the inputs rounded to bf16 as they
 * are packed (fp32 sources, or bf16 ones) and fp32 accumulation, on the best micro-kernel the CPU
 * has (picked at run time, bf16.c: ctrl_cpu_bf16_kind): AMX tiles (gemm_amx.c), or the AVX-512
 * BF16 register tile below.
 *
 * Blocking in the usual way for a packed-panel GEMM: for each block of nc columns and kc of the
 * depth, B[kc, nc] is rounded and packed into panels of nr columns, each a run of (k, k+1) pairs
 * (gemm_bf16_kernel.h has the layouts); then each block of mc rows of A is packed, and the
 * kernel's tile walks the depth against one B panel after another. AVX-512 BF16: kc = 1024, mc =
 * 192, panels of 48 columns; an 8 x 48 register tile (24 accumulators) takes per pair of k 3 loads
 * of B, 8 broadcasts of A's pairs, 24 vdpbf16ps. The B panel (96 KiB) and the A block (384 KiB) are
 * read from L2 (the hardware prefetchers keep up: 9 bytes a cycle); the tile's rows of C are
 * prefetched as it starts. The deep block amortises each tile's start and its stores of C: on a
 * Zen4, a 64-sequence decoding step's products (M = 64) took 7% less time than with kc = 384 (an
 * L1-sized B panel), 8 rows 13% less, the training shapes the same (docs/performance.md, session
 * #20). Packing goes 16 rows at a time: rows along K are rounded, narrowed and transposed 16 x 16 in
 * registers; rows along M or N (the transposed operands) are read two source rows at a time; AMX's A
 * tiles (rows of pairs) are the same 16 x 16 blocks untransposed. K odd or not a multiple of kc: the
 * last pair is padded with zero; edges of M and N: the tile is computed whole on padding and stored
 * under masks. op(X) is X or X^T as stored row-major, so the three products a linear layer needs
 * (x W^T, dout W, dout^T x) run without transposed copies. */
#include <immintrin.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/hugepages.h>

#include "cpu/cpu_ops.h"
#include "cpu/gemm_bf16_kernel.h"
#include "cpu/par_min.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) &&                                                                                   \
    ((defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 11))
#define MR 8 /* the AVX-512 register tile */
#define NR 48
#define FEW_ROWS 4 /* up to this many rows of A, x W^T runs without packing (gemm_few) */

#define TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

typedef struct operand {
    const void *p; /* fp32 or bf16 (uint16_t) values */
    int bf16;      /* 1: p holds bf16 */
    int k_contig;  /* 1: element (r, k) at p[r * ld + k]; 0: at p[k * ld + r] */
    size_t ld;
    ctrl_cpu_gemm_source src; /* non-NULL: bf16 values made by src(src_ctx, ...), p unused (pack_source) */
    const void *src_ctx;
    /* non-NULL: B read from another product's packed panels (pack_panels), p unused; panels_t: as
     * the transpose of the op(B) they hold */
    const struct ctrl_cpu_bf16_packed *panels;
    int panels_t;
} operand;

struct ctrl_cpu_bf16_packed {
    int trans_b, N, K;
    int nr, kc, nc, kpad; /* the layout: the kernel's that packed it */
    size_t words;
    uint32_t *w;
};

/* 16 floats rounded to bf16 (round to nearest even, NaN kept quiet), each in the
 * low half of its 32-bit lane. */
TARGET static inline __m512i round16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                  _mm512_set1_epi32(0x7F800000));
    return _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

/* 32 floats rounded to bf16 by vcvtne2ps2bf16 (round to nearest even, NaN kept quiet, as round16;
 * but denormals become signed zeros, which every bf16 product here -- vdpbf16ps, tdpbf16ps -- reads
 * them as anyway): bf16 j of the result is lo[j] for j < 16, hi[j - 16] after: as 32-bit lanes, the
 * pairs (lo[2j], lo[2j + 1]) then (hi[2j], hi[2j + 1]). One instruction where round16 takes eight
 * and a narrowing: packing rows along K (rows16) 11% faster here. (Pairing two rows this way, a
 * vpermw after it, was 40% slower than round16's shift and or on the development EPYC: not used.) */
TARGET static inline __m512i cvt32(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }

/* 16 x 16 transpose of 32-bit lanes: r[i] lane j <- r[j] lane i. */
TARGET static void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* r[4a + b], 128-bit lane L: rows 4a..4a+3 of column 4L + b; gather the four lanes L of each b */
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);     /* lanes 0, 2 of each */
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xDD); /* lanes 1, 3 */
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xDD);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xDD);
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xDD);
    }
}

/* The packed layout of a block of rows (W rows per panel, panels kp x W apart): pair k2 of block
 * row r at dst[(r / W) * kp * W + k2 * W + r % W]. A group of 16 rows is two halves of 8 (W is a
 * multiple of 8), each within one panel: where each half's pair 0 goes, NULL past the last panel
 * (alloc rows). */
typedef struct halves {
    uint32_t *d[2];
    int W;
} halves;

static halves halves_of(uint32_t *dst, int W, int kp, int r, int alloc) {
    halves h = {{NULL, NULL}, W};
    for (int i = 0; i < 2; i++, r += 8)
        if (r < alloc) h.d[i] = dst + (size_t)(r / W) * kp * W + r % W;
    return h;
}

/* 16 rows' pair k2 (lanes) stored into the two halves */
TARGET static inline void store16(const halves *h, int k2, __m512i v) {
    _mm256_storeu_si256((__m256i *)(h->d[0] + (size_t)k2 * h->W), _mm512_castsi512_si256(v));
    if (h->d[1])
        _mm256_storeu_si256((__m256i *)(h->d[1] + (size_t)k2 * h->W), _mm512_extracti64x4_epi64(v, 1));
}

/* Values [k, k + 32) (those < kend; 0 past it) of 16 rows of a fp32 operand whose rows are
 * contiguous (k_contig), the rows from `row` on (n of them; 0 after), rounded: v[i] = row i's 16
 * pairs. */
TARGET static void rows16(__m512i v[16], const operand *o, int row, int n, int k, int kend) {
    const int left = kend - k;
    const __mmask16 m0 = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1u);
    const __mmask16 m1 = left >= 32 ? 0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1u) : 0;
    for (int i = 0; i < 16; i++) {
        if (i >= n) {
            v[i] = _mm512_setzero_si512();
            continue;
        }
        const float *src = (const float *)o->p + (size_t)(row + i) * o->ld + k;
        /* 16 rows far apart: the hardware prefetcher does not keep up; fetch two chunks ahead */
        _mm_prefetch((const char *)(src + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(src + 80), _MM_HINT_T0);
        v[i] = cvt32(_mm512_maskz_loadu_ps(m0, src), _mm512_maskz_loadu_ps(m1, src + 16));
    }
}

/* 16 bf16 values (those of `rows` set; zeros after) */
TARGET static inline __m256i load16(__mmask16 rows, const uint16_t *p) {
    return _mm512_castsi512_si256(_mm512_maskz_loadu_epi16((__mmask32)rows, p));
}

/* Packs block rows [r, r + 16) (n of them valid, zeros after) of depth [k0, k0 + kc) into the layout
 * above, panels kp pairs deep (pairs past the depth: 0); the block's row 0 is operand row r0. */
TARGET static void pack16(uint32_t *dst, int W, int alloc, const operand *o, int r0, int r, int n, int k0,
                          int kc, int kp) {
    const int kc2 = (kc + 1) / 2;
    const __mmask16 rows = n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1u);
    const halves h = halves_of(dst, W, kp, r, alloc);
    for (int k2 = kc2; k2 < kp; k2++) store16(&h, k2, _mm512_setzero_si512());
    if (o->bf16) {
        const uint16_t *p = o->p;
        if (o->k_contig) /* a row's 32 values are its 16 pairs as they lie; 16 rows transposed */
            for (int k = 0; k < kc; k += 32) {
                const int left = kc - k, np = left >= 32 ? 16 : (left + 1) / 2;
                const __mmask32 m = left >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << left) - 1u);
                __m512i v[16];
                for (int i = 0; i < 16; i++)
                    v[i] = i < n ? _mm512_maskz_loadu_epi16(m, p + (size_t)(r0 + r + i) * o->ld + k0 + k)
                                 : _mm512_setzero_si512();
                transpose16(v);
                for (int q = 0; q < np; q++) store16(&h, k / 2 + q, v[q]);
            }
        else /* rows k and k + 1 hold the 16 rows' values side by side: widened and interleaved */
            for (int k2 = 0; k2 < kc2; k2++) {
                const uint16_t *lo = p + (size_t)(k0 + 2 * k2) * o->ld + r0 + r;
                __m512i v = _mm512_cvtepu16_epi32(load16(rows, lo));
                if (2 * k2 + 1 < kc)
                    v = _mm512_or_si512(
                        v, _mm512_slli_epi32(_mm512_cvtepu16_epi32(load16(rows, lo + o->ld)), 16));
                store16(&h, k2, v);
            }
        return;
    }
    const float *p = o->p;
    if (!o->k_contig) { /* rows k and k + 1 of the source hold the 16 rows' values side by side */
        for (int k2 = 0; k2 < kc2; k2++) {
            const float *lo = p + (size_t)(k0 + 2 * k2) * o->ld + r0 + r;
            _mm_prefetch((const char *)(lo + 4 * o->ld), _MM_HINT_T0);
            _mm_prefetch((const char *)(lo + 5 * o->ld), _MM_HINT_T0);
            __m512i v = round16(_mm512_maskz_loadu_ps(rows, lo));
            if (2 * k2 + 1 < kc)
                v = _mm512_or_si512(v,
                                    _mm512_slli_epi32(round16(_mm512_maskz_loadu_ps(rows, lo + o->ld)), 16));
            store16(&h, k2, v);
        }
        return;
    }
    /* each row's values are contiguous: 32 of them make 16 pairs; 16 rows of those, transposed */
    for (int k = 0; k < kc; k += 32) {
        __m512i v[16];
        rows16(v, o, r0 + r, n, k0 + k, k0 + kc);
        transpose16(v);
        const int left = kc - k, np = left >= 32 ? 16 : (left + 1) / 2;
        for (int q = 0; q < np; q++) store16(&h, k / 2 + q, v[q]);
    }
}

TARGET static void pack_source(uint32_t *dst, int W, const operand *o, int r0, int n, int k0, int kc, int kp,
                               int g0, int g1);
TARGET static void pack_panels(uint32_t *dst, int W, const operand *o, int r0, int n, int k0, int kc, int kp,
                               int g0, int g1);

/* Block rows [0, n) packed into panels of W (alloc = n rounded up to W) kp pairs deep, the groups of
 * 16 rows in [g0, g1). Where the rows lie side by side in the source (k_contig = 0), the source
 * rows are read whole, all groups at once, pair by pair. */
TARGET static void pack_block(uint32_t *dst, int W, const operand *o, int r0, int n, int k0, int kc, int kp,
                              int g0, int g1) {
    if (o->src) {
        pack_source(dst, W, o, r0, n, k0, kc, kp, g0, g1);
        return;
    }
    if (o->panels) {
        pack_panels(dst, W, o, r0, n, k0, kc, kp, g0, g1);
        return;
    }
    const int alloc = (n + W - 1) / W * W, kc2 = (kc + 1) / 2;
    if (o->k_contig || o->bf16 || g1 - g0 > CTRL_BF16_NC_MAX / 16) {
        for (int g = g0; g < g1; g++) {
            const int r = 16 * g;
            pack16(dst, W, alloc, o, r0, r, n - r < 16 ? n - r : 16, k0, kc, kp);
        }
        return;
    }
    halves hs[CTRL_BF16_NC_MAX / 16];
    for (int g = g0; g < g1; g++) {
        hs[g - g0] = halves_of(dst, W, kp, 16 * g, alloc);
        for (int k2 = kc2; k2 < kp; k2++) store16(&hs[g - g0], k2, _mm512_setzero_si512());
    }
    const float *p = o->p;
    for (int k2 = 0; k2 < kc2; k2++) {
        const float *lo = p + (size_t)(k0 + 2 * k2) * o->ld + r0, *hi = 2 * k2 + 1 < kc ? lo + o->ld : NULL;
        for (int g = g0; g < g1; g++) {
            const int r = 16 * g, left = n - r;
            const __mmask16 m = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1u);
            __m512i v = round16(_mm512_maskz_loadu_ps(m, lo + r));
            if (hi) v = _mm512_or_si512(v, _mm512_slli_epi32(round16(_mm512_maskz_loadu_ps(m, hi + r)), 16));
            store16(&hs[g - g0], k2, v);
            if (2 * k2 + 3 < kc) { /* the next pair of rows, one line each */
                _mm_prefetch((const char *)(lo + 2 * o->ld + r), _MM_HINT_T0);
                _mm_prefetch((const char *)(lo + 3 * o->ld + r), _MM_HINT_T0);
            }
        }
    }
}

/* A source operand (QLoRA's NF4 weights, gemm_nf4.c): a few groups of 16 block rows at a time, their
 * bf16 values over the depth block made into a small scratch (at most SOURCE_VALUES, in L2) by the
 * source, one call per source row run, then packed from it as a bf16 operand in memory. */
#define SOURCE_VALUES 65536
TARGET static void pack_source(uint32_t *dst, int W, const operand *o, int r0, int n, int k0, int kc, int kp,
                               int g0, int g1) {
    const int per = SOURCE_VALUES / (16 * kc) > 0 ? SOURCE_VALUES / (16 * kc) : 1; /* groups per batch */
    uint16_t *buf = malloc(sizeof(uint16_t) * (size_t)per * 16 * (size_t)kc);
    if (!buf) return; /* cannot happen in practice (128 KiB); the product is then wrong, not a crash */
    for (int ga = g0; ga < g1; ga += per) {
        const int gb = ga + per < g1 ? ga + per : g1, lo = 16 * ga, hi = 16 * gb < n ? 16 * gb : n;
        /* the batch's element (r, k) at buf[(r - lo) * kc + k] (k_contig) or buf[k * (hi - lo) + r - lo] */
        const operand m = {buf, 1, o->k_contig, (size_t)(o->k_contig ? kc : hi - lo), NULL, NULL, NULL, 0};
        if (o->k_contig)
            for (int r = lo; r < hi; r++)
                o->src(o->src_ctx, (size_t)(r0 + r) * o->ld + (size_t)k0, kc, buf + (size_t)(r - lo) * kc);
        else
            for (int k = 0; k < kc; k++)
                o->src(o->src_ctx, (size_t)(k0 + k) * o->ld + (size_t)(r0 + lo), hi - lo,
                       buf + (size_t)k * (size_t)(hi - lo));
        pack_block(dst, W, &m, -lo, n, 0, kc, kp, ga, gb);
    }
    free(buf);
}

/* A depth block of kc values as pairs, padded to a multiple of kpad. */
static inline int pairs_padded(int kc, int kpad) { return ((kc + 1) / 2 + kpad - 1) / kpad * kpad; }

/* Where p holds the pair (k, k + 1) of op(B)'s column n (k even, n a multiple of 16: the start of 16
 * columns' pairs side by side, the pair k + 2 r of the same columns at + r * p->nr while k + 2 r stays
 * in k's depth block; the layouts need nr, kc and nc multiples of 16, as every kernel's are). */
static const uint32_t *panel_at(const ctrl_cpu_bf16_packed *p, int n, int k) {
    const int jc = n / p->nc * p->nc, pc = k / p->kc * p->kc, nr = p->nr;
    const int ncj = p->N - jc < p->nc ? p->N - jc : p->nc, ncpad = (ncj + nr - 1) / nr * nr;
    const int full_nc = (p->nc + nr - 1) / nr * nr, kfull = pairs_padded(p->kc, p->kpad);
    const int klast = p->K % p->kc ? pairs_padded(p->K % p->kc, p->kpad) : 0;
    const size_t per_jc =
        (size_t)full_nc * ((size_t)(p->K / p->kc) * kfull + klast); /* a full column block */
    const int kpb = p->K - pc < p->kc ? pairs_padded(p->K - pc, p->kpad) : kfull;
    return p->w + (size_t)(jc / p->nc) * per_jc + (size_t)(pc / p->kc) * kfull * ncpad +
           (size_t)((n - jc) / nr) * kpb * nr + (size_t)((k - pc) / 2) * nr + (size_t)((n - jc) % nr);
}

/* 8 rows of p's words, 16 columns each (src, the rows nr apart; those from `rows` on read as zeros),
 * re-paired into 8 pairs of the other index for the 16 columns: each row's adjacent words have
 * their halves swapped (vpshufb: words (c, k), (c, k+1) | (c+1, k), (c+1, k+1) become (c, k),
 * (c+1, k) | (c, k+1), (c+1, k+1)), then the 64-bit lanes are transposed 8 x 8 in registers; pair q
 * is stored at k2 = q0 + q of the halves (nq of them). */
TARGET static inline void repair8(const uint32_t *src, size_t nr, int rows, const halves *h, int q0, int nq) {
    const __m512i swap = _mm512_set4_epi32(0x0F0E0B0A, 0x0D0C0908, 0x07060302, 0x05040100);
    __m512i t[8];
    if (rows == 8) {
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            t[r] = _mm512_shuffle_epi8(_mm512_loadu_si512(src + (size_t)r * nr), swap);
    } else
        for (int r = 0; r < 8; r++)
            t[r] = r < rows ? _mm512_shuffle_epi8(_mm512_loadu_si512(src + (size_t)r * nr), swap)
                            : _mm512_setzero_si512();
    /* 128-bit lane L of x[r]: (t[r] q 2L, t[r + 1] q 2L) for r even, (t[r - 1] q 2L+1, t[r] q 2L+1) odd */
    const __m512i x0 = _mm512_unpacklo_epi64(t[0], t[1]), x1 = _mm512_unpackhi_epi64(t[0], t[1]);
    const __m512i x2 = _mm512_unpacklo_epi64(t[2], t[3]), x3 = _mm512_unpackhi_epi64(t[2], t[3]);
    const __m512i x4 = _mm512_unpacklo_epi64(t[4], t[5]), x5 = _mm512_unpackhi_epi64(t[4], t[5]);
    const __m512i x6 = _mm512_unpacklo_epi64(t[6], t[7]), x7 = _mm512_unpackhi_epi64(t[6], t[7]);
    const __m512i y0 = _mm512_shuffle_i64x2(x0, x2, 0x88), y2 = _mm512_shuffle_i64x2(x0, x2, 0xDD);
    const __m512i y1 = _mm512_shuffle_i64x2(x1, x3, 0x88), y3 = _mm512_shuffle_i64x2(x1, x3, 0xDD);
    const __m512i y4 = _mm512_shuffle_i64x2(x4, x6, 0x88), y6 = _mm512_shuffle_i64x2(x4, x6, 0xDD);
    const __m512i y5 = _mm512_shuffle_i64x2(x5, x7, 0x88), y7 = _mm512_shuffle_i64x2(x5, x7, 0xDD);
    const __m512i z[8] = {_mm512_shuffle_i64x2(y0, y4, 0x88), _mm512_shuffle_i64x2(y1, y5, 0x88),
                          _mm512_shuffle_i64x2(y2, y6, 0x88), _mm512_shuffle_i64x2(y3, y7, 0x88),
                          _mm512_shuffle_i64x2(y0, y4, 0xDD), _mm512_shuffle_i64x2(y1, y5, 0xDD),
                          _mm512_shuffle_i64x2(y2, y6, 0xDD), _mm512_shuffle_i64x2(y3, y7, 0xDD)};
    if (nq == 8) {
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++) store16(h, q0 + q, z[q]);
    } else
        for (int q = 0; q < nq; q++) store16(h, q0 + q, z[q]);
}

/* B read from panels p packed for another product (ctrl_cpu_gemm_bf16_pack): block rows [0, n) from
 * r0 on and depth [k0, k0 + kc) (k0 and r0 multiples of 16, as every kernel's blocks are), groups
 * [g0, g1) of 16 rows, into this kernel's layout. Untransposed (p's op(B); a kernel of another
 * layout than p's): a pair of 16 columns is 16 words side by side in p, copied. Transposed (B = p's
 * op(B)^T: dX = dY W on the forward's x W^T panels): p pairs the other index, so 16 x 16 blocks are
 * re-paired (repair8), 8 pairs of this depth (16 of p's columns) at a time. 2 bytes read a value,
 * nothing rounded: the values are those the panels hold. */
TARGET static void pack_panels(uint32_t *dst, int W, const operand *o, int r0, int n, int k0, int kc, int kp,
                               int g0, int g1) {
    const ctrl_cpu_bf16_packed *p = o->panels;
    const int alloc = (n + W - 1) / W * W, kc2 = (kc + 1) / 2;
    for (int g = g0; g < g1; g++) {
        const halves h = halves_of(dst, W, kp, 16 * g, alloc);
        for (int k2 = kc2; k2 < kp; k2++) store16(&h, k2, _mm512_setzero_si512());
        if (!o->panels_t)
            for (int k2 = 0; k2 < kc2; k2++)
                store16(&h, k2, _mm512_loadu_si512(panel_at(p, r0 + 16 * g, k0 + 2 * k2)));
    }
    if (!o->panels_t) return;
    /* a panel of p's at a time (nr / 2 pairs of this depth) for each group in turn, so that p is read
     * in order, whole rows after whole rows; where a group's rows start in p is found once per panel
     * and stepped from there (8 pairs on: 16 words on; a group on: 8 rows on) */
    const int span = p->nr / 2;
    for (int qa = 0; qa < kc2; qa += span) {
        const int whole = (k0 + 2 * qa) % p->nr == 0; /* qa starts a panel of p (same layouts: always) */
        const uint32_t *base = NULL;
        for (int g = g0; g < g1; g++) {
            const int c0 = r0 + 16 * g;                                         /* p's depth */
            const int rows = (p->K - c0 + 1) / 2 < 8 ? (p->K - c0 + 1) / 2 : 8; /* its pairs with values */
            base = base && c0 % p->kc ? base + 8 * (size_t)p->nr : panel_at(p, k0 + 2 * qa, c0);
            const halves h = halves_of(dst, W, kp, 16 * g, alloc);
            for (int q0 = qa; q0 < qa + span && q0 < kc2; q0 += 8)
                repair8(whole ? base + 2 * (q0 - qa) : panel_at(p, k0 + 2 * q0, c0), (size_t)p->nr, rows, &h,
                        q0, kc2 - q0 < 8 ? kc2 - q0 : 8);
        }
    }
}

/* Block rows [0, n) as AMX's A tiles (a_rows in gemm_bf16_kernel.h): groups of 16 rows, each kp / 16
 * tiles of 16 rows x 16 pairs, up to n rounded up to 32 rows (the groups past n: zeros). A fp32
 * operand with contiguous rows is rounded straight into rows of pairs; the others are packed as
 * pairs of rows (pack16) and each 16 x 16 tile transposed in place. */
TARGET static void pack_rows(uint32_t *dst, const operand *o, int r0, int n, int k0, int kc, int kp) {
    const int groups = (n + 31) / 32 * 2;
    for (int g = 0; g < groups; g++) {
        const int r = 16 * g, valid = n - r < 16 ? n - r : 16;
        uint32_t *d = dst + (size_t)r * kp;
        if (valid <= 0) {
            memset(d, 0, sizeof(uint32_t) * 16 * (size_t)kp);
            continue;
        }
        __m512i v[16];
        if (!o->bf16 && o->k_contig) {
            for (int s = 0; s < kp / 16; s++) {
                rows16(v, o, r0 + r, valid, k0 + 32 * s, k0 + kc);
                for (int i = 0; i < 16; i++) _mm512_storeu_si512(d + 256 * s + 16 * i, v[i]);
            }
            continue;
        }
        pack16(dst, 16, (n + 15) / 16 * 16, o, r0, r, valid, k0, kc, kp);
        for (int s = 0; s < kp / 16; s++) {
            for (int j = 0; j < 16; j++) v[j] = _mm512_loadu_si512(d + 256 * s + 16 * j);
            transpose16(v);
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(d + 256 * s + 16 * i, v[i]);
        }
    }
}

/* c[mr, nr] (+)= the 8 x (16 nv) tile of a (kc2 pairs x MR) times b (kc2 pairs x NR): the first nv of
 * the panel's three 16-column vectors (nv = 3: the whole 48; fewer at N's right edge, where the rest
 * would be zero columns -- an edge of 32 or 16 columns costs 2/3 or 1/3 of the FMAs, not all). Each
 * column's sum is the same whatever nv (the same order over k). */
TARGET static inline __attribute__((always_inline)) void tile_nv(int kc2, const uint32_t *a,
                                                                 const uint32_t *b, float *c, size_t ldc,
                                                                 int mr, int nr, int accumulate,
                                                                 const int nv) {
    __m512 acc[MR][3];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 3
        for (int j = 0; j < 3; j++) acc[i][j] = _mm512_setzero_ps();
    for (int i = 0; i < mr; i++) /* C's rows arrive while the products run */
        for (int j = 0; j < nr; j += 16) _mm_prefetch((const char *)(c + (size_t)i * ldc + j), _MM_HINT_T0);
    for (int k2 = 0; k2 < kc2; k2++, a += MR, b += NR) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
        const __m512bh b1 = nv > 1 ? (__m512bh)_mm512_loadu_si512(b + 16) : b0;
        const __m512bh b2 = nv > 2 ? (__m512bh)_mm512_loadu_si512(b + 32) : b0;
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[i]);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
            if (nv > 1) acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
            if (nv > 2) acc[i][2] = _mm512_dpbf16_ps(acc[i][2], av, b2);
        }
    }
    if (mr == MR && nr == NR) {
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++)
#pragma GCC unroll 3
            for (int j = 0; j < 3; j++) {
                float *cp = c + (size_t)i * ldc + 16 * j;
                _mm512_storeu_ps(cp, accumulate ? _mm512_add_ps(acc[i][j], _mm512_loadu_ps(cp)) : acc[i][j]);
            }
        return;
    }
    for (int i = 0; i < MR; i++) {
        if (i >= mr) break;
        for (int j = 0; j < nv && 16 * j < nr; j++) {
            const int n = nr - 16 * j;
            const __mmask16 m = n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1u);
            float *cp = c + (size_t)i * ldc + 16 * j;
            const __m512 v = accumulate ? _mm512_add_ps(acc[i][j], _mm512_maskz_loadu_ps(m, cp)) : acc[i][j];
            _mm512_mask_storeu_ps(cp, m, v);
        }
    }
}

TARGET static void tile(int kc2, const uint32_t *a, const uint32_t *b, float *c, size_t ldc, int mr, int nr,
                        int accumulate) {
    if (nr > 32)
        tile_nv(kc2, a, b, c, ldc, mr, nr, accumulate, 3);
    else if (nr > 16)
        tile_nv(kc2, a, b, c, ldc, mr, nr, accumulate, 2);
    else
        tile_nv(kc2, a, b, c, ldc, mr, nr, accumulate, 1);
}

static const ctrl_bf16_kernel avx512_kernel = {
    .mr = MR, .nr = NR, .kc = 1024, .mc = 192, .nc = 8160, .kpad = 1, .a_rows = 0, .tile = tile};

/* A depth block's panel depth in pairs, and the words of a packed block of B (nc columns, kc deep). */
static int kp_of(const ctrl_bf16_kernel *kk, int kc) {
    return ((kc + 1) / 2 + kk->kpad - 1) / kk->kpad * kk->kpad;
}
static size_t block_words(const ctrl_bf16_kernel *kk, int nc, int kc) {
    return (size_t)kp_of(kk, kc) * (size_t)((nc + kk->nr - 1) / kk->nr * kk->nr);
}

/* CTRL_BF16_BLOCK_PACK=1: few rows run as many do (B packed here a whole block at a time, the work
 * split and a barrier after each block; the form before panel by panel, for comparisons) */
static int block_packing_forced(void) {
    static int forced = -1;
    if (forced < 0) {
        const char *v = getenv("CTRL_BF16_BLOCK_PACK");
        forced = v && *v && strcmp(v, "0") != 0;
    }
    return forced;
}

/* bpre: B packed beforehand (ctrl_cpu_gemm_bf16_pack: the blocks in this loop's order, jc outer, pc
 * inner, each block_words long), or NULL: B is packed here, block by block. Where A has one block of
 * rows (few rows: decoding) the threads share out B's panels instead, each thread the same panels
 * (the same columns of C) in every depth block, so no barrier runs between blocks; a B packed here
 * is then packed panel by panel, each into the thread's own buffer right before its tiles read it
 * (in L2: a whole block's panels, up to 16 MiB, would be written out to memory and read back for a
 * handful of rows). */
static int gemm_blocked(const ctrl_bf16_kernel *kk, int M, int N, int K, const operand *A, const operand *B,
                        float *C, size_t ldc, int accumulate, const uint32_t *bpre, const uint32_t *apre) {
    const int kr = kk->mr, kn = kk->nr, KC = kk->kc, MC = kk->mc, NC = kk->nc;
    const int kpmax = kp_of(kk, KC);
    const int ncmax = N < NC ? (N + kn - 1) / kn * kn : NC;
    const int by_panel = M <= MC && !block_packing_forced();
    uint32_t *bp = bpre || by_panel ? NULL : aligned_alloc(64, sizeof(uint32_t) * (size_t)kpmax * ncmax);
    if (!bpre && !by_panel && !bp) return -1;
    int failed = 0;
#pragma omp parallel if (CTRL_CPU_GEMM_PARALLEL(M, N, K))
    {
        uint32_t *ap = apre ? NULL : aligned_alloc(64, sizeof(uint32_t) * (size_t)kpmax * MC);
        uint32_t *bq = by_panel && !bpre ? aligned_alloc(64, sizeof(uint32_t) * (size_t)kpmax * kn) : NULL;
        if ((!ap && !apre) || (by_panel && !bpre && !bq)) {
#pragma omp atomic write
            failed = 1;
        }
#ifdef _OPENMP
        const int nth = omp_get_num_threads();
#else
        const int nth = 1;
#endif
        if (kk->begin) kk->begin();
        size_t boff = 0; /* where block (jc, pc) starts in bpre */
        for (int jc = 0; jc < N; jc += NC) {
            const int nc = N - jc < NC ? N - jc : NC, npanels = (nc + kn - 1) / kn;
            for (int pc = 0; pc < K; pc += KC) {
                const int kc = K - pc < KC ? K - pc : KC, kp = kp_of(kk, kc);
                const int ngroups = (nc + 15) / 16;
                const uint32_t *bb = bpre ? bpre + boff : bp;
                boff += block_words(kk, nc, kc);
                if (by_panel) {
                    /* no barrier between depth blocks: a static schedule gives each thread the same
                     * panels (the same columns of C) in every one, and A's copy is its own */
                    const uint32_t *ab = ap;
                    if (apre)
                        ab = apre + (size_t)(pc / KC) * kpmax * MC;
                    else if (ap && kk->a_rows)
                        pack_rows(ap, A, 0, M, pc, kc, kp);
                    else if (ap)
                        pack_block(ap, kr, A, 0, M, pc, kc, kp, 0, (M + 15) / 16);
#pragma omp for schedule(static) nowait
                    for (int p = 0; p < npanels; p++) {
                        if (!ab || (!bpre && !bq)) continue;
                        const int n = nc - p * kn < kn ? nc - p * kn : kn;
                        const uint32_t *panel = bpre ? bb + (size_t)p * kp * kn : bq;
                        if (!bpre) pack_block(bq, kn, B, jc + p * kn, n, pc, kc, kp, 0, (n + 15) / 16);
                        for (int i = 0; i < M; i += kr)
                            kk->tile(kp, ab + (size_t)i * kp, panel, C + (size_t)i * ldc + jc + p * kn, ldc,
                                     M - i < kr ? M - i : kr, n, accumulate || pc > 0);
                    }
                    continue;
                }
                if (!bpre) {
#pragma omp for schedule(static)
                    for (int t = 0; t < nth; t++)
                        pack_block(bp, kn, B, jc, nc, pc, kc, kp, ngroups * t / nth, ngroups * (t + 1) / nth);
                }
                /* work items: blocks of MC rows, each split across the columns when there are
                 * fewer blocks than threads */
                const int mblocks = (M + MC - 1) / MC;
                const int nsplit = mblocks >= nth ? 1 : (npanels < nth ? npanels : nth);
#pragma omp for schedule(dynamic, 1)
                for (int w = 0; w < mblocks * nsplit; w++) {
                    if (!ap && !apre) continue;
                    const int ic = (w / nsplit) * MC, s = w % nsplit, mc = M - ic < MC ? M - ic : MC;
                    const int p0 = npanels * s / nsplit, p1 = npanels * (s + 1) / nsplit;
                    const uint32_t *ab = ap;
                    if (apre) /* packed beforehand (apack_all): block (ic, pc) */
                        ab = apre + ((size_t)(pc / KC) * mblocks + (size_t)(ic / MC)) * kpmax * MC;
                    else if (kk->a_rows)
                        pack_rows(ap, A, ic, mc, pc, kc, kp);
                    else
                        pack_block(ap, kr, A, ic, mc, pc, kc, kp, 0, (mc + 15) / 16);
                    for (int p = p0; p < p1; p++) {
                        const int n = nc - p * kn < kn ? nc - p * kn : kn;
                        for (int i = 0; i < mc; i += kr)
                            kk->tile(kp, ab + (size_t)i * kp, bb + (size_t)p * kp * kn,
                                     C + (size_t)(ic + i) * ldc + jc + p * kn, ldc, mc - i < kr ? mc - i : kr,
                                     n, accumulate || pc > 0);
                    }
                }
            }
        }
        if (kk->end) kk->end();
        free(ap), free(bq);
    }
    free(bp);
    return failed ? -1 : 0;
}

/* The AMX kernel's blocking and tile variant by the product's shape (N columns, depth K; not M, so
 * that B's panels packed for a shape are in the layout its products use): the first rule whose
 * ranges hold N and K (inclusive; the last holds every shape). Chosen from the AMX host's sweeps
 * (docs/performance.md, issue 21's AMX subsection; bench/scale/amx_sweep.sh). */
typedef struct amx_rule {
    int nlo, nhi, klo, khi;
    int kc, mc, nc, tile; /* tile: the variant's index in ctrl_bf16_amx_tiles */
} amx_rule;
static const amx_rule amx_rules[] = {
    {0, INT_MAX, 0, INT_MAX, 1024, 256, 1024, 7},
};
#define AMX_RULES ((int)(sizeof amx_rules / sizeof amx_rules[0]))

/* The AMX kernels as run, per rule: the hardware's [0][r] and the emulated [1][r]. The tuning switches
 * (read once, for sweeps: bench/scale/amx_sweep.sh) replace every rule's values:
 *   CTRL_AMX_BLOCKS="kc,mc,nc"  depth, rows of A, columns of B per block (multiples of 32; kc and mc
 *                               at most 4096, nc at most CTRL_BF16_NC_MAX)
 *   CTRL_AMX_TILE=v             the tile's variant (gemm_bf16_kernel.h: 0 the kernel's own, +1
 *                               interleaved loads, +2 C prefetched, +4 A prefetched)
 * A value out of range is refused on stderr, naming the variable, and the rules run. */
static ctrl_bf16_kernel amx_tuned[2][AMX_RULES];
static pthread_once_t amx_tuned_once = PTHREAD_ONCE_INIT;

static void amx_set(int r, int kc, int mc, int nc, int tile) {
    amx_tuned[0][r] = ctrl_bf16_amx_kernel, amx_tuned[1][r] = ctrl_bf16_amx_emu_kernel;
    for (int i = 0; i < 2; i++) amx_tuned[i][r].kc = kc, amx_tuned[i][r].mc = mc, amx_tuned[i][r].nc = nc;
    if (ctrl_bf16_amx_tiles[tile]) amx_tuned[0][r].tile = ctrl_bf16_amx_tiles[tile];
    if (ctrl_bf16_amx_emu_tiles[tile]) amx_tuned[1][r].tile = ctrl_bf16_amx_emu_tiles[tile];
}

static void amx_tune(void) {
    for (int r = 0; r < AMX_RULES; r++) {
        const amx_rule *u = &amx_rules[r];
        amx_set(r, u->kc, u->mc, u->nc, u->tile);
    }
    const char *blocks = getenv("CTRL_AMX_BLOCKS"), *tile = getenv("CTRL_AMX_TILE");
    int kc = -1, mc = 0, nc = 0, v = -1;
    if (blocks && *blocks) {
        int end = 0;
        if (!(sscanf(blocks, "%d,%d,%d%n", &kc, &mc, &nc, &end) == 3 && blocks[end] == 0 && kc >= 32 &&
              kc <= 4096 && kc % 32 == 0 && mc >= 32 && mc <= 4096 && mc % 32 == 0 && nc >= 32 &&
              nc <= CTRL_BF16_NC_MAX && nc % 32 == 0)) {
            fprintf(
                stderr,
                "ctrl: CTRL_AMX_BLOCKS=\"%s\" refused (want \"kc,mc,nc\", each a multiple of 32, kc and mc "
                "at most 4096, nc at most %d); the AMX kernel's own blocking runs\n",
                blocks, CTRL_BF16_NC_MAX);
            kc = -1;
        }
    }
    if (tile && *tile) {
        char *end = NULL;
        const long t = strtol(tile, &end, 10);
        if (*end == 0 && t >= 0 && t < CTRL_AMX_TILE_VARIANTS)
            v = (int)t;
        else
            fprintf(stderr,
                    "ctrl: CTRL_AMX_TILE=\"%s\" refused (want 0 to %d); the AMX kernel's own tile runs\n",
                    tile, CTRL_AMX_TILE_VARIANTS - 1);
    }
    for (int r = 0; r < AMX_RULES; r++) {
        const amx_rule *u = &amx_rules[r];
        if (kc > 0 || v >= 0)
            amx_set(r, kc > 0 ? kc : u->kc, kc > 0 ? mc : u->mc, kc > 0 ? nc : u->nc, v >= 0 ? v : u->tile);
    }
}

int ctrl_cpu_gemm_bf16_amx_tune(int kc, int mc, int nc, int tile) {
    pthread_once(&amx_tuned_once, amx_tune);
    if ((kc > 0 && !(kc <= 4096 && kc % 32 == 0 && mc >= 32 && mc <= 4096 && mc % 32 == 0 && nc >= 32 &&
                     nc <= CTRL_BF16_NC_MAX && nc % 32 == 0)) ||
        tile >= CTRL_AMX_TILE_VARIANTS)
        return -1;
    for (int r = 0; r < AMX_RULES; r++) {
        const amx_rule *u = &amx_rules[r];
        amx_set(r, kc > 0 ? kc : u->kc, kc > 0 ? mc : u->mc, kc > 0 ? nc : u->nc, tile >= 0 ? tile : u->tile);
    }
    return 0;
}

static int amx_rule_of(int N, int K) {
    for (int r = 0; r < AMX_RULES - 1; r++)
        if (N >= amx_rules[r].nlo && N <= amx_rules[r].nhi && K >= amx_rules[r].klo && K <= amx_rules[r].khi)
            return r;
    return AMX_RULES - 1;
}

/* The micro-kernel ctrl_cpu_gemm_bf16 runs now for a product of N columns and depth K (NULL: none,
 * the caller falls back to fp32). */
static const ctrl_bf16_kernel *kernel_for(int N, int K) {
    switch (ctrl_cpu_bf16_kind_now()) {
    case CTRL_CPU_BF16_AMX: return pthread_once(&amx_tuned_once, amx_tune), &amx_tuned[0][amx_rule_of(N, K)];
    case CTRL_CPU_BF16_AMX_EMULATED:
        return pthread_once(&amx_tuned_once, amx_tune), &amx_tuned[1][amx_rule_of(N, K)];
    case CTRL_CPU_BF16_AVX512: return &avx512_kernel;
    default: return NULL;
    }
}

/* Few rows of A against B stored [N, K] (decoding: a handful of tokens through a linear layer):
 * C[M, N] (+)= A B^T with B read once, 4 of its rows at a time, rounded in registers (vcvtne2ps2bf16
 * rounds to nearest even, as round16) instead of packed: packing would cost more than the
 * products. A's rows are rounded into a small buffer first (Kp: K padded to 32, zeros). */
TARGET static void few_round_a(uint16_t *a, int M, int K, int Kp, const float *A, size_t lda) {
    for (int i = 0; i < M; i++)
        for (int k = 0; k < Kp; k += 16) {
            const int left = K - k;
            const __mmask16 m = left >= 16 ? 0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1u) : 0;
            const __m512i r = round16(_mm512_maskz_loadu_ps(m, A + (size_t)i * lda + k));
            _mm256_store_si256((__m256i *)(a + (size_t)i * Kp + k), _mm512_cvtepi32_epi16(r));
        }
}

/* columns [n0, n0 + nn) (nn <= 4) of C */
TARGET static void few_cols(const uint16_t *a, int M, int K, int Kp, const float *B, size_t ldb, float *C,
                            size_t ldc, int n0, int nn, int accumulate) {
    __m512 acc[FEW_ROWS][4];
#pragma GCC unroll 4
    for (int i = 0; i < FEW_ROWS; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
    for (int k = 0; k < Kp; k += 32) {
        const int left = K - k;
        const __mmask16 m0 = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1u);
        const __mmask16 m1 = left >= 32 ? 0xFFFF : left > 16 ? (__mmask16)((1u << (left - 16)) - 1u) : 0;
        __m512bh b[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const float *row = B + (size_t)(n0 + (j < nn ? j : 0)) * ldb + k;
            b[j] = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, row + 16), _mm512_maskz_loadu_ps(m0, row));
        }
#pragma GCC unroll 4
        for (int i = 0; i < FEW_ROWS; i++) {
            if (i >= M) break;
            const __m512bh av = (__m512bh)_mm512_load_si512(a + (size_t)i * Kp + k);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, b[j]);
        }
    }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < nn; j++) {
            float *c = C + (size_t)i * ldc + n0 + j;
            const float s = _mm512_reduce_add_ps(acc[i][j]);
            *c = accumulate ? *c + s : s;
        }
}

static int gemm_few(int M, int N, int K, const float *A, size_t lda, const float *B, size_t ldb, float *C,
                    size_t ldc, int accumulate) {
    const int Kp = (K + 31) / 32 * 32;
    uint16_t *a = aligned_alloc(64, sizeof(uint16_t) * FEW_ROWS * (size_t)Kp);
    if (!a) return -1;
    few_round_a(a, M, K, Kp, A, lda);
#pragma omp parallel for schedule(static) if (CTRL_CPU_GEMM_PARALLEL(M, N, K))
    for (int n0 = 0; n0 < N; n0 += 4)
        few_cols(a, M, K, Kp, B, ldb, C, ldc, n0, N - n0 < 4 ? N - n0 : 4, accumulate);
    free(a);
    return 0;
}

/* Operands shared by several products (ctrl_cpu_gemm_bf16_share, cpu_ops.h), per calling thread:
 * each packed whole by the first product that reads it, in the layout of that product's kernel (A:
 * its row blocks as gemm_blocked packs them, every depth block; B: panels as ctrl_cpu_gemm_bf16_pack
 * makes them), and read as packed by the later products whose kernel has the same layout. The same
 * packing functions on the same values: the products are bit for bit those packing per call. */
#define SHARE_SLOTS 2
typedef struct shared_op {
    const float *p; /* NULL: the slot is free */
    int as_b, trans, rows, K, ld;
    int packed;
    ctrl_bf16_kernel lay;   /* A: the kernel whose layout w holds */
    uint32_t *w;            /* A's row blocks, block (ic, pc) at ((pc / kc) * mblocks + ic / mc) * kp * mc */
    size_t cap;             /* words at w */
    ctrl_cpu_bf16_packed b; /* B's panels */
} shared_op;
static _Thread_local shared_op shares[SHARE_SLOTS];
static _Thread_local size_t share_packs, share_reads;

/* A thread's shared operands' memory is freed when it exits (a serving engine's worker thread decodes
 * with them too): a key whose value is the thread's slots, set when it first shares. */
static pthread_key_t shares_key;
static int shares_key_made;
static pthread_once_t shares_key_once = PTHREAD_ONCE_INIT;
static void shares_free(void *slots) {
    shared_op *sh = slots;
    for (int i = 0; i < SHARE_SLOTS; i++) {
        free(sh[i].w), free(sh[i].b.w);
        memset(&sh[i], 0, sizeof sh[i]);
    }
}
static void shares_key_make(void) { shares_key_made = pthread_key_create(&shares_key, shares_free) == 0; }
static void shares_track(void) {
    pthread_once(&shares_key_once, shares_key_make);
    if (shares_key_made && !pthread_getspecific(shares_key)) pthread_setspecific(shares_key, shares);
}

static size_t apack_words(const ctrl_bf16_kernel *kk, int M, int K) {
    const size_t w = (size_t)((K + kk->kc - 1) / kk->kc) * (size_t)((M + kk->mc - 1) / kk->mc) *
                     (size_t)kp_of(kk, kk->kc) * (size_t)kk->mc;
    return (w + 15) / 16 * 16;
}

/* Every (row block, depth block) of A packed as gemm_blocked would pack it. */
static void apack_all(uint32_t *dst, const ctrl_bf16_kernel *kk, const operand *A, int M, int K) {
    const int MC = kk->mc, KC = kk->kc, kpmax = kp_of(kk, KC), mblocks = (M + MC - 1) / MC;
    const int items = mblocks * ((K + KC - 1) / KC);
#pragma omp parallel for schedule(dynamic, 1) if (items > 1)
    for (int w = 0; w < items; w++) {
        const int pc = w / mblocks * KC, ic = w % mblocks * MC;
        const int kc = K - pc < KC ? K - pc : KC, mc = M - ic < MC ? M - ic : MC, kp = kp_of(kk, kc);
        uint32_t *ap = dst + (size_t)w * kpmax * MC;
        if (kk->a_rows)
            pack_rows(ap, A, ic, mc, pc, kc, kp);
        else
            pack_block(ap, kk->mr, A, ic, mc, pc, kc, kp, 0, (mc + 15) / 16);
    }
}

static int same_a_layout(const ctrl_bf16_kernel *a, const ctrl_bf16_kernel *b) {
    return a->mr == b->mr && a->mc == b->mc && a->kc == b->kc && a->kpad == b->kpad && a->a_rows == b->a_rows;
}

/* The shared A of op(A)[M,K] (A stored as the product reads it) packed for kk, or NULL: not shared. */
static const uint32_t *share_a(const ctrl_bf16_kernel *kk, const float *A, int trans_a, int M, int K,
                               int lda) {
    for (int i = 0; i < SHARE_SLOTS; i++) {
        shared_op *s = &shares[i];
        if (!s->p || s->p != A || s->as_b || s->trans != trans_a || s->rows != M || s->K != K || s->ld != lda)
            continue;
        if (s->packed) return same_a_layout(&s->lay, kk) ? (share_reads++, s->w) : NULL;
        const size_t words = apack_words(kk, M, K);
        if (words > s->cap) {
            uint32_t *w = aligned_alloc(64, sizeof(uint32_t) * words);
            if (!w) return NULL; /* packed per call */
            ctrl_advise_huge_pages(w, sizeof(uint32_t) * words);
            free(s->w);
            s->w = w, s->cap = words;
        }
        const operand a = {A, 0, !trans_a, (size_t)lda, NULL, NULL, NULL, 0};
        apack_all(s->w, kk, &a, M, K);
        s->packed = 1, s->lay = *kk, share_packs++;
        return s->w;
    }
    return NULL;
}

static int pack_all(ctrl_cpu_bf16_packed *p, const ctrl_bf16_kernel *kk, const float *B, int ldb);
static int same_layout(const ctrl_cpu_bf16_packed *p, const ctrl_bf16_kernel *kk);

/* The shared B of op(B)[K,N] packed for kk (ctrl_cpu_gemm_bf16_pack's layout), or NULL. */
static const uint32_t *share_b(const ctrl_bf16_kernel *kk, const float *B, int trans_b, int N, int K,
                               int ldb) {
    for (int i = 0; i < SHARE_SLOTS; i++) {
        shared_op *s = &shares[i];
        if (!s->p || s->p != B || !s->as_b || s->trans != trans_b || s->rows != N || s->K != K ||
            s->ld != ldb)
            continue;
        if (s->packed) return same_layout(&s->b, kk) ? (share_reads++, s->b.w) : NULL;
        if (pack_all(&s->b, kk, B, ldb) != 0) return NULL;
        s->packed = 1, share_packs++;
        return s->b.w;
    }
    return NULL;
}
#define CTRL_HAVE_BLOCKED 1
#endif

int ctrl_cpu_gemm_bf16(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda, const float *B,
                       int ldb, float *C, int ldc, int accumulate) {
#ifdef CTRL_HAVE_BLOCKED
    const ctrl_bf16_kernel *kk = kernel_for(N, K);
    if (!kk) return -1;
    if (M <= 0 || N <= 0) return 0;
    const operand a = {A, 0, !trans_a, (size_t)lda, NULL, NULL, NULL, 0},
                  b = {B, 0, trans_b, (size_t)ldb, NULL, NULL, NULL, 0};
    if (K <= 0) { /* an empty sum */
        for (int i = 0; i < M; i++)
            if (!accumulate) memset(C + (size_t)i * ldc, 0, sizeof(float) * (size_t)N);
        return 0;
    }
    if (M <= FEW_ROWS && !trans_a && trans_b)
        return gemm_few(M, N, K, A, (size_t)lda, B, (size_t)ldb, C, (size_t)ldc, accumulate);
    return gemm_blocked(kk, M, N, K, &a, &b, C, (size_t)ldc, accumulate, share_b(kk, B, trans_b, N, K, ldb),
                        share_a(kk, A, trans_a, M, K, lda));
#else
    (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)C;
    (void)ldc, (void)accumulate;
    return -1;
#endif
}

int ctrl_cpu_gemm_bf16_depth_block(int N, int K) {
#ifdef CTRL_HAVE_BLOCKED
    const ctrl_bf16_kernel *kk = kernel_for(N, K);
    return kk ? kk->kc : 0;
#else
    (void)N, (void)K;
    return 0;
#endif
}

int ctrl_cpu_gemm_bf16_source(int trans_a, int trans_b, int M, int N, int K, const float *A, int lda,
                              ctrl_cpu_gemm_source b_src, const void *b_ctx, int ldb, float *C, int ldc,
                              int accumulate) {
#ifdef CTRL_HAVE_BLOCKED
    const ctrl_bf16_kernel *kk = kernel_for(N, K);
    if (!kk) return -1;
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) return ctrl_cpu_gemm_bf16(trans_a, trans_b, M, N, K, A, lda, NULL, ldb, C, ldc, accumulate);
    const operand a = {A, 0, !trans_a, (size_t)lda, NULL, NULL, NULL, 0},
                  b = {NULL, 0, trans_b, (size_t)ldb, b_src, b_ctx, NULL, 0};
    return gemm_blocked(kk, M, N, K, &a, &b, C, (size_t)ldc, accumulate, NULL,
                        share_a(kk, A, trans_a, M, K, lda));
#else
    (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)b_src, (void)b_ctx;
    (void)ldb, (void)C, (void)ldc, (void)accumulate;
    return -1;
#endif
}

int ctrl_cpu_gemm_bf16_nt_avx512(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K,
                                 int accumulate) {
#ifdef CTRL_HAVE_BLOCKED
    const ctrl_bf16_kernel *kk = kernel_for(N, K);
    if (!kk) return -1;
    if (M <= 0 || N <= 0 || K <= 0) return -1;
    const operand a = {A, 1, 1, (size_t)K, NULL, NULL, NULL, 0},
                  b = {B, 1, 1, (size_t)K, NULL, NULL, NULL, 0};
    return gemm_blocked(kk, M, N, K, &a, &b, C, (size_t)N, accumulate, NULL, NULL);
#else
    (void)C, (void)A, (void)B, (void)M, (void)N, (void)K, (void)accumulate;
    return -1;
#endif
}

#ifdef CTRL_HAVE_BLOCKED
static int same_layout(const ctrl_cpu_bf16_packed *p, const ctrl_bf16_kernel *kk) {
    return p->nr == kk->nr && p->kc == kk->kc && p->nc == kk->nc && p->kpad == kk->kpad;
}

/* B's blocks packed for kk (reallocated where the layout changed); 0 or -1 (out of memory). */
static int pack_all(ctrl_cpu_bf16_packed *p, const ctrl_bf16_kernel *kk, const float *B, int ldb) {
    if (!p->w || !same_layout(p, kk)) {
        size_t words = 0;
        for (int jc = 0; jc < p->N; jc += kk->nc)
            for (int pc = 0; pc < p->K; pc += kk->kc)
                words += block_words(kk, p->N - jc < kk->nc ? p->N - jc : kk->nc,
                                     p->K - pc < kk->kc ? p->K - pc : kk->kc);
        uint32_t *w = aligned_alloc(64, sizeof(uint32_t) * words);
        if (!w) return -1;
        ctrl_advise_huge_pages(w, sizeof(uint32_t) * words); /* kept, read by every later product */
        free(p->w);
        p->w = w, p->words = words;
        p->nr = kk->nr, p->kc = kk->kc, p->nc = kk->nc, p->kpad = kk->kpad;
    }
    const operand b = {B, 0, p->trans_b, (size_t)ldb, NULL, NULL, NULL, 0};
    size_t off = 0;
    for (int jc = 0; jc < p->N; jc += kk->nc) {
        const int nc = p->N - jc < kk->nc ? p->N - jc : kk->nc, ngroups = (nc + 15) / 16;
        for (int pc = 0; pc < p->K; pc += kk->kc) {
            const int kc = p->K - pc < kk->kc ? p->K - pc : kk->kc;
            uint32_t *dst = p->w + off;
#pragma omp parallel
            {
#ifdef _OPENMP
                const int nth = omp_get_num_threads(), t = omp_get_thread_num();
#else
                const int nth = 1, t = 0;
#endif
                pack_block(dst, kk->nr, &b, jc, nc, pc, kc, kp_of(kk, kc), ngroups * t / nth,
                           ngroups * (t + 1) / nth);
            }
            off += block_words(kk, nc, kc);
        }
    }
    return 0;
}
#endif

ctrl_cpu_bf16_packed *ctrl_cpu_gemm_bf16_pack(int trans_b, int N, int K, const float *B, int ldb) {
#ifdef CTRL_HAVE_BLOCKED
    const ctrl_bf16_kernel *kk = kernel_for(N, K);
    if (!kk || N <= 0 || K <= 0) return NULL;
    ctrl_cpu_bf16_packed *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->trans_b = trans_b, p->N = N, p->K = K;
    if (pack_all(p, kk, B, ldb) != 0) {
        free(p);
        return NULL;
    }
    return p;
#else
    (void)trans_b, (void)N, (void)K, (void)B, (void)ldb;
    return NULL;
#endif
}

int ctrl_cpu_gemm_bf16_repack(ctrl_cpu_bf16_packed *p, const float *B, int ldb) {
#ifdef CTRL_HAVE_BLOCKED
    const ctrl_bf16_kernel *kk = kernel_for(p ? p->N : 0, p ? p->K : 0);
    return p && kk ? pack_all(p, kk, B, ldb) : -1;
#else
    (void)p, (void)B, (void)ldb;
    return -1;
#endif
}

int ctrl_cpu_gemm_bf16_packed_is(const ctrl_cpu_bf16_packed *p, int trans_b, int N, int K) {
    return p && p->trans_b == trans_b && p->N == N && p->K == K;
}

int ctrl_cpu_gemm_bf16_packed(int trans_a, int M, const float *A, int lda, const ctrl_cpu_bf16_packed *p,
                              float *C, int ldc, int accumulate) {
#ifdef CTRL_HAVE_BLOCKED
    const ctrl_bf16_kernel *kk = kernel_for(p ? p->N : 0, p ? p->K : 0);
    if (!p || !kk) return -1;
    if (M <= 0) return 0;
    const operand a = {A, 0, !trans_a, (size_t)lda, NULL, NULL, NULL, 0};
    if (same_layout(p, kk))
        return gemm_blocked(kk, M, p->N, p->K, &a, NULL, C, (size_t)ldc, accumulate, p->w,
                            share_a(kk, A, trans_a, M, p->K, lda));
    const operand b = {NULL, 0, 0, 0, NULL, NULL, p, 0}; /* another kernel's layout (CTRL_NO_AMX flipped) */
    return gemm_blocked(kk, M, p->N, p->K, &a, &b, C, (size_t)ldc, accumulate, NULL,
                        share_a(kk, A, trans_a, M, p->K, lda));
#else
    (void)trans_a, (void)M, (void)A, (void)lda, (void)p, (void)C, (void)ldc, (void)accumulate;
    return -1;
#endif
}

int ctrl_cpu_gemm_bf16_packed_t(int trans_a, int M, const float *A, int lda, const ctrl_cpu_bf16_packed *p,
                                float *C, int ldc, int accumulate) {
#ifdef CTRL_HAVE_BLOCKED
    const ctrl_bf16_kernel *kk = kernel_for(p ? p->K : 0, p ? p->N : 0);
    if (!p || !kk) return -1;
    if (M <= 0) return 0;
    const operand a = {A, 0, !trans_a, (size_t)lda, NULL, NULL, NULL, 0},
                  b = {NULL, 0, 0, 0, NULL, NULL, p, 1};
    return gemm_blocked(kk, M, p->K, p->N, &a, &b, C, (size_t)ldc, accumulate, NULL,
                        share_a(kk, A, trans_a, M, p->N, lda));
#else
    (void)trans_a, (void)M, (void)A, (void)lda, (void)p, (void)C, (void)ldc, (void)accumulate;
    return -1;
#endif
}

#ifdef CTRL_HAVE_BLOCKED
/* Words of one whole column block (nc columns, every depth block) of p's layout (as panel_at counts). */
static size_t block_col_words(const ctrl_cpu_bf16_packed *p) {
    const int nr = p->nr, full_nc = (p->nc + nr - 1) / nr * nr, kfull = pairs_padded(p->kc, p->kpad);
    const int klast = p->K % p->kc ? pairs_padded(p->K % p->kc, p->kpad) : 0;
    return (size_t)full_nc * ((size_t)(p->K / p->kc) * kfull + klast);
}

/* *v: p's columns [n0, n0 + n) of op(B) as panels of their own (their words are p's: nothing copied),
 * where n0 starts a column block and the range ends at one or at N; 0, or -1 otherwise. */
static int column_view(const ctrl_cpu_bf16_packed *p, int n0, int n, ctrl_cpu_bf16_packed *v) {
    if (!p || !p->trans_b || n <= 0 || n0 < 0 || n0 % p->nc || n0 + n > p->N || (n % p->nc && n0 + n != p->N))
        return -1;
    *v = *p;
    v->N = n, v->w = p->w + (size_t)(n0 / p->nc) * block_col_words(p);
    v->words = 0; /* (a view: never freed or repacked) */
    return 0;
}
#endif

int ctrl_cpu_gemm_bf16_packed_block(const ctrl_cpu_bf16_packed *p) {
#ifdef CTRL_HAVE_BLOCKED
    return p && p->trans_b ? p->nc : 0;
#else
    (void)p;
    return 0;
#endif
}

int ctrl_cpu_gemm_bf16_packed_cols(int transposed, int M, const float *A, int lda,
                                   const ctrl_cpu_bf16_packed *p, int n0, int n, float *C, int ldc,
                                   int accumulate) {
#ifdef CTRL_HAVE_BLOCKED
    ctrl_cpu_bf16_packed v;
    if (column_view(p, n0, n, &v) != 0) return -1;
    if (M <= 0) return 0;
    const operand a = {A, 0, 1, (size_t)lda, NULL, NULL, NULL, 0};
    if (!transposed) { /* the whole panels' kernel: the view is in its layout */
        const ctrl_bf16_kernel *kk = kernel_for(p->N, p->K);
        if (!kk) return -1;
        if (same_layout(p, kk))
            return gemm_blocked(kk, M, n, p->K, &a, NULL, C, (size_t)ldc, accumulate, v.w,
                                share_a(kk, A, 0, M, p->K, lda));
        const operand b = {NULL, 0, 0, 0, NULL, NULL, &v, 0};
        return gemm_blocked(kk, M, n, p->K, &a, &b, C, (size_t)ldc, accumulate, NULL,
                            share_a(kk, A, 0, M, p->K, lda));
    }
    const ctrl_bf16_kernel *kk = kernel_for(p->K, n);
    if (!kk) return -1;
    const operand b = {NULL, 0, 0, 0, NULL, NULL, &v, 1};
    return gemm_blocked(kk, M, p->K, n, &a, &b, C, (size_t)ldc, accumulate, NULL,
                        share_a(kk, A, 0, M, n, lda));
#else
    (void)transposed, (void)M, (void)A, (void)lda, (void)p, (void)n0, (void)n, (void)C, (void)ldc,
        (void)accumulate;
    return -1;
#endif
}

int ctrl_cpu_gemm_bf16_packed_rows(const ctrl_cpu_bf16_packed *p, const int32_t *rows, int n, float *out,
                                   int ldo) {
#ifdef CTRL_HAVE_BLOCKED
    if (!p || !p->trans_b) return -1;
    for (int i = 0; i < n; i++)
        if (rows[i] < 0 || rows[i] >= p->N) return -1;
#pragma omp parallel for schedule(static) if (n > 16)
    for (int i = 0; i < n; i++) {
        float *o = out + (size_t)i * ldo;
        for (int pc = 0; pc < p->K; pc += p->kc) { /* a depth block's pairs lie nr words apart */
            const uint32_t *w = panel_at(p, rows[i], pc);
            const int kend = pc + p->kc < p->K ? pc + p->kc : p->K;
            for (int k = pc; k < kend; k += 2, w += p->nr) {
                const uint32_t lo = *w << 16, hi = *w & 0xFFFF0000u;
                memcpy(o + k, &lo, 4);
                if (k + 1 < kend) memcpy(o + k + 1, &hi, 4);
            }
        }
    }
    return 0;
#else
    (void)p, (void)rows, (void)n, (void)out, (void)ldo;
    return -1;
#endif
}

int ctrl_cpu_gemm_bf16_packed_unpack(const ctrl_cpu_bf16_packed *p, float *B, int ldb) {
#ifdef CTRL_HAVE_BLOCKED
    if (!p) return -1;
    for (int n0 = 0; n0 < p->N; n0 += 16)
        for (int k = 0; k < p->K; k += 2) {
            const uint32_t *w = panel_at(p, n0, k);
            for (int j = 0; j < 16 && n0 + j < p->N; j++)
                for (int h = 0; h < 2 && k + h < p->K; h++) {
                    const uint32_t u = (w[j] >> (16 * h) & 0xFFFFu) << 16;
                    float f;
                    memcpy(&f, &u, 4);
                    B[p->trans_b ? (size_t)(n0 + j) * ldb + k + h : (size_t)(k + h) * ldb + n0 + j] = f;
                }
        }
    return 0;
#else
    (void)p, (void)B, (void)ldb;
    return -1;
#endif
}

size_t ctrl_cpu_gemm_bf16_pack_bytes(int N, int K) {
#ifdef CTRL_HAVE_BLOCKED
    const ctrl_bf16_kernel *kk = kernel_for(N, K);
    if (!kk || N <= 0 || K <= 0) return 0;
    size_t words = 0;
    for (int jc = 0; jc < N; jc += kk->nc)
        for (int pc = 0; pc < K; pc += kk->kc)
            words += block_words(kk, N - jc < kk->nc ? N - jc : kk->nc, K - pc < kk->kc ? K - pc : kk->kc);
    return sizeof(ctrl_cpu_bf16_packed) + sizeof(uint32_t) * words;
#else
    (void)N, (void)K;
    return 0;
#endif
}

size_t ctrl_cpu_gemm_bf16_packed_bytes(const ctrl_cpu_bf16_packed *p) {
    return p ? sizeof *p + sizeof(uint32_t) * p->words : 0;
}

void ctrl_cpu_gemm_bf16_packed_free(ctrl_cpu_bf16_packed *p) {
    if (p) free(p->w);
    free(p);
}

int ctrl_cpu_gemm_bf16_compiled(void) {
#ifdef CTRL_HAVE_BLOCKED
    return 1;
#else
    return 0;
#endif
}

int ctrl_cpu_gemm_bf16_share(int slot, int as_b, int trans, int rows, int K, const float *X, int ld) {
#ifdef CTRL_HAVE_BLOCKED
    if (slot < 0 || slot >= SHARE_SLOTS) return -1;
    shared_op *s = &shares[slot];
    s->p = NULL, s->packed = 0;
    if (!X || rows <= 0 || K <= 0) return 0;
    shares_track();
    if (s->b.w && (s->b.N != rows || s->b.K != K)) /* its panels are sized for their shape */
        free(s->b.w), s->b.w = NULL, s->b.words = 0;
    s->p = X, s->as_b = as_b, s->trans = trans, s->rows = rows, s->K = K, s->ld = ld;
    s->b.trans_b = trans, s->b.N = rows, s->b.K = K;
    return 0;
#else
    (void)slot, (void)as_b, (void)trans, (void)rows, (void)K, (void)X, (void)ld;
    return -1;
#endif
}

void ctrl_cpu_gemm_bf16_share_release(void) {
#ifdef CTRL_HAVE_BLOCKED
    shares_free(shares);
#endif
}

void ctrl_cpu_gemm_bf16_share_stats(size_t *packed, size_t *read) {
#ifdef CTRL_HAVE_BLOCKED
    *packed = share_packs, *read = share_reads;
#else
    *packed = 0, *read = 0;
#endif
}
