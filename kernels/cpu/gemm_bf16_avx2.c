/* Decoding's bf16 product on AVX2 + FMA (no bf16 instructions): gemm_bf16_avx2.h has the contract.
 *
 * Layout: W's N rows (the product's columns) in panels of 16, each panel K2 = (K + 1) / 2 pairs deep:
 * pair k2 of column j of panel p at w[p * K2 * 16 + k2 * 16 + j], the bf16 of W[16 p + j][2 k2] in
 * the low half and of W[16 p + j][2 k2 + 1] in the high half (0 past K and past N). A panel is read
 * front to back once per block of rows; its pairs widen to fp32 with a shift (even k) and a mask (odd
 * k), and each row's two A values are broadcast against them: per pair, acc = fma(a[2k2], w_even,
 * acc), then acc = fma(a[2k2 + 1], w_odd, acc), so every C element is one sum over k in order.
 * Tiles of R rows x G panels (R * G <= 4: 8 accumulators); one row decodes 4 panels at a time so
 * that 8 independent sums hide the FMA latency. A is rounded to bf16 values (kept as fp32) into a
 * scratch first. More than 64 rows (a prefill) take a widened tile instead (below): the same sums.
 * Packing: 8 rows x 16 values rounded in registers, made into 8 pairs each (packus,
 * then a lane permute), transposed 8 x 8 and stored as 8 pairs of 8 columns. */
#include "cpu/gemm_bf16_avx2.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/hugepages.h>

#ifdef _OPENMP
#include <omp.h>
#endif

struct ctrl_cpu_bf16_avx2_panels {
    int N, K, K2, npanels;
    size_t words;
    uint32_t *w;
};

/* round to nearest even, a NaN kept and made quiet: as kernels/cpu/bf16.c rounds */
static inline uint32_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x40u;
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

static inline float bf16_value(float f) {
    const uint32_t u = bf16_bits(f) << 16;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

void ctrl_cpu_bf16_avx2_free(ctrl_cpu_bf16_avx2_panels *p) {
    if (!p) return;
    free(p->w);
    free(p);
}

size_t ctrl_cpu_bf16_avx2_bytes(const ctrl_cpu_bf16_avx2_panels *p) {
    return p ? sizeof(*p) + sizeof(uint32_t) * p->words : 0;
}

int ctrl_cpu_bf16_avx2_shape(const ctrl_cpu_bf16_avx2_panels *p, int *N, int *K) {
    if (!p) return -1;
    *N = p->N, *K = p->K;
    return 0;
}

int ctrl_cpu_bf16_avx2_unpack(const ctrl_cpu_bf16_avx2_panels *p, float *W, int ldw) {
    if (!p) return -1;
    for (int n = 0; n < p->N; n++)
        for (int k = 0; k < p->K; k++) {
            const uint32_t word = p->w[(size_t)(n / 16) * p->K2 * 16 + (size_t)(k / 2) * 16 + n % 16];
            const uint32_t u = (k % 2 ? word >> 16 : word & 0xFFFFu) << 16;
            memcpy(&W[(size_t)n * ldw + k], &u, 4);
        }
    return 0;
}

#if defined(__x86_64__) && (defined(__clang__) || __GNUC__ >= 5)
#include <immintrin.h>

#define TARGET __attribute__((target("avx2,fma")))

int ctrl_cpu_bf16_avx2_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* 8 floats rounded to bf16 (as bf16_bits), each in the low half of its lane */
TARGET static inline __m256i round8(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r =
        _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, quiet, nan);
}

/* 16 floats from src as 8 pairs (pair q: values 2q and 2q + 1) */
TARGET static inline __m256i pairs8(const float *src) {
    const __m256i lo = round8(_mm256_loadu_ps(src)), hi = round8(_mm256_loadu_ps(src + 8));
    /* packus per 128-bit lane: lo 0-3, hi 0-3 | lo 4-7, hi 4-7; the 64-bit quarters put in order */
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
}

/* r[i] lane j <- r[j] lane i */
TARGET static inline void transpose8(__m256i r[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    }
}

/* Panel p of W into dst (K2 * 16 words) */
TARGET static void pack_panel(uint32_t *dst, const float *W, int ldw, int N, int K, int K2, int p) {
    for (int h = 0; h < 2; h++) {
        const int n0 = 16 * p + 8 * h, valid = N - n0 < 0 ? 0 : N - n0 < 8 ? N - n0 : 8;
        int k = 0;
        if (valid == 8)
            for (; k + 16 <= K; k += 16) {
                __m256i r[8];
                for (int i = 0; i < 8; i++) r[i] = pairs8(W + (size_t)(n0 + i) * ldw + k);
                transpose8(r);
                for (int q = 0; q < 8; q++)
                    _mm256_storeu_si256((__m256i *)(dst + (size_t)(k / 2 + q) * 16 + 8 * h), r[q]);
            }
        for (int k2 = k / 2; k2 < K2; k2++)
            for (int i = 0; i < 8; i++) {
                uint32_t word = 0;
                if (i < valid) {
                    const float *row = W + (size_t)(n0 + i) * ldw;
                    word = bf16_bits(row[2 * k2]) | (2 * k2 + 1 < K ? bf16_bits(row[2 * k2 + 1]) << 16 : 0u);
                }
                dst[(size_t)k2 * 16 + 8 * h + i] = word;
            }
    }
}

int ctrl_cpu_bf16_avx2_repack(ctrl_cpu_bf16_avx2_panels *p, const float *W, int ldw) {
    if (!p || !ctrl_cpu_bf16_avx2_available()) return -1;
#pragma omp parallel for schedule(static) if (p->words >= ((size_t)1 << 16))
    for (int q = 0; q < p->npanels; q++)
        pack_panel(p->w + (size_t)q * p->K2 * 16, W, ldw, p->N, p->K, p->K2, q);
    return 0;
}

ctrl_cpu_bf16_avx2_panels *ctrl_cpu_bf16_avx2_pack(int N, int K, const float *W, int ldw) {
    if (N <= 0 || K <= 0 || !ctrl_cpu_bf16_avx2_available()) return NULL;
    ctrl_cpu_bf16_avx2_panels *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->N = N, p->K = K, p->K2 = (K + 1) / 2, p->npanels = (N + 15) / 16;
    p->words = (size_t)p->npanels * p->K2 * 16;
    p->w = aligned_alloc(64, (sizeof(uint32_t) * p->words + 63) / 64 * 64);
    if (!p->w) return free(p), NULL;
    ctrl_advise_huge_pages(p->w, sizeof(uint32_t) * p->words);
    ctrl_cpu_bf16_avx2_repack(p, W, ldw);
    return p;
}

/* c[R rows, 16 G columns] = the rows of a (R rows lda apart, 2 K2 values each) times G panels at b
 * (bs words apart) */
#define UNROLL _Pragma("GCC unroll 8")
#define DEFINE_TILE(R, G)                                                                                    \
    TARGET static void tile_##R##_##G(int K2, const float *a, size_t lda, const uint32_t *b, size_t bs,      \
                                      float *c, size_t ldc) {                                                \
        __m256 acc[R][2 * G];                                                                                \
        UNROLL for (int i = 0; i < R; i++) UNROLL for (int j = 0; j < 2 * G; j++) acc[i][j] =                \
            _mm256_setzero_ps();                                                                             \
        const __m256i odd = _mm256_set1_epi32((int)0xFFFF0000u);                                             \
        for (int k2 = 0; k2 < K2; k2++) {                                                                    \
            UNROLL for (int g = 0; g < G; g++) {                                                             \
                const uint32_t *bp = b + g * bs + (size_t)k2 * 16;                                           \
                const __m256i w0 = _mm256_loadu_si256((const __m256i *)bp),                                  \
                              w1 = _mm256_loadu_si256((const __m256i *)(bp + 8));                            \
                const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)),                            \
                             o0 = _mm256_castsi256_ps(_mm256_and_si256(w0, odd)),                            \
                             e1 = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)),                            \
                             o1 = _mm256_castsi256_ps(_mm256_and_si256(w1, odd));                            \
                UNROLL for (int i = 0; i < R; i++) {                                                         \
                    const __m256 ae = _mm256_broadcast_ss(a + i * lda + 2 * (size_t)k2),                     \
                                 ao = _mm256_broadcast_ss(a + i * lda + 2 * (size_t)k2 + 1);                 \
                    acc[i][2 * g] = _mm256_fmadd_ps(ae, e0, acc[i][2 * g]);                                  \
                    acc[i][2 * g + 1] = _mm256_fmadd_ps(ae, e1, acc[i][2 * g + 1]);                          \
                    acc[i][2 * g] = _mm256_fmadd_ps(ao, o0, acc[i][2 * g]);                                  \
                    acc[i][2 * g + 1] = _mm256_fmadd_ps(ao, o1, acc[i][2 * g + 1]);                          \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        UNROLL for (int i = 0; i < R; i++) UNROLL for (int j = 0; j < 2 * G; j++)                            \
            _mm256_storeu_ps(c + i * ldc + 8 * j, acc[i][j]);                                                \
    }
DEFINE_TILE(1, 1)
DEFINE_TILE(1, 4)
DEFINE_TILE(2, 1)
DEFINE_TILE(2, 2)
DEFINE_TILE(3, 1)
DEFINE_TILE(4, 1)

typedef void (*tile_fn)(int K2, const float *a, size_t lda, const uint32_t *b, size_t bs, float *c,
                        size_t ldc);

static tile_fn tile_of(int R, int G) {
    switch (R * 8 + G) {
    case 9: return tile_1_1;
    case 12: return tile_1_4;
    case 17: return tile_2_1;
    case 18: return tile_2_2;
    case 25: return tile_3_1;
    default: return tile_4_1;
    }
}

/* The rounded rows of A: per-thread scratch kept between calls (decoding calls this hundreds of
 * times a step); rows [r0, r1) of it written (by the threads of a parallel region, in turn) */
static _Thread_local struct {
    float *p;
    size_t n;
} scratch;

static float *scratch_for(size_t want) {
    if (want > scratch.n) {
        free(scratch.p);
        scratch.p = malloc(sizeof(float) * want);
        scratch.n = scratch.p ? want : 0;
    }
    return scratch.p;
}

/* (8 at a time: round8's bits, as bf16_value rounds) */
TARGET static void round_rows(float *dst, int r0, int r1, const float *A, int lda, int K, int K2) {
    for (int i = r0; i < r1; i++) {
        float *d = dst + (size_t)i * 2 * K2;
        const float *s = A + (size_t)i * lda;
        int k = 0;
        for (; k + 8 <= K; k += 8)
            _mm256_storeu_si256((__m256i *)(d + k), _mm256_slli_epi32(round8(_mm256_loadu_ps(s + k)), 16));
        for (; k < K; k++) d[k] = bf16_value(s[k]);
        if (K % 2) d[K] = 0.0f;
    }
}

/* Rows [0, M) times panels [p0, p0 + g) (g <= G), into C or, for a panel past N's last whole one,
 * through a 4 x 64 buffer */
static void item(int M, const float *a, size_t lda, const ctrl_cpu_bf16_avx2_panels *p, int p0, int g, int G,
                 float *C, int ldc) {
    const size_t bs = (size_t)p->K2 * 16;
    const int R = G == 4 ? 1 : G == 2 ? 2 : 4;
    for (int i = 0; i < M; i += R) {
        const int r = M - i < R ? M - i : R;
        const float *ai = a + (size_t)i * lda;
        if (g == G && 16 * (p0 + g) <= p->N) { /* whole panels, the widest tile */
            tile_of(r, r == R ? G : 1)(p->K2, ai, lda, p->w + (size_t)p0 * bs, bs,
                                       C + (size_t)i * ldc + 16 * p0, (size_t)ldc);
            if (r != R || G == 1) /* a narrower tile took panel p0 alone: the others one by one */
                for (int q = 1; q < g; q++)
                    tile_of(r, 1)(p->K2, ai, lda, p->w + (size_t)(p0 + q) * bs, bs,
                                  C + (size_t)i * ldc + 16 * (p0 + q), (size_t)ldc);
            continue;
        }
        for (int q = p0; q < p0 + g; q++) {
            const int cols = p->N - 16 * q < 16 ? p->N - 16 * q : 16;
            if (cols == 16) {
                tile_of(r, 1)(p->K2, ai, lda, p->w + (size_t)q * bs, bs, C + (size_t)i * ldc + 16 * q,
                              (size_t)ldc);
                continue;
            }
            float buf[4 * 16];
            tile_of(r, 1)(p->K2, ai, lda, p->w + (size_t)q * bs, bs, buf, 16);
            for (int k = 0; k < r; k++)
                memcpy(C + (size_t)(i + k) * ldc + 16 * q, buf + 16 * k, sizeof(float) * cols);
        }
    }
}

/* Many rows (more than 64: a prefill): each panel's pairs widened to fp32 once per KC values of k
 * (into a thread's 16 KiB buffer, kept in L1) and used by all rows of a block, through an fp32 tile of
 * up to 6 rows x 16 columns (12 accumulators, no widening in the inner loop). The tile's sums leave
 * through C between blocks of k and come back (fp32 both ways: exact), so each element is still one
 * fp32 sum over k in order, the same bits as the narrow tiles above. Rows are taken CHUNK at a time,
 * rounded by all threads, so that the rounded scratch stays small and a block of rows (256 x 256
 * values, 256 KiB) stays in L2 while the panels stream past it; each chunk widens every panel again.
 * On the Zen3 (one thread, 2026-11-28) this tile is 20-30% faster than the narrow ones at 1024 rows,
 * as fast at 64 and slower at 16-32 (its widening paid for fewer rows): decoding's steps keep the
 * narrow tiles. Against OpenBLAS's SGEMM (the fp32 fallback, W rounded per call) it is faster at 256
 * rows (bench_decode_gemm: 4126 vs 4642 CPU ms a step) but not at 1024 (a 64 x 16-token prefill: 3-5%
 * more CPU in 192-row chunks, 10-25% more in chunks of up to 862 rows that leave L2): model_decode_pack.c
 * sends it calls of up to 256 rows. */
enum { KC = 256, WIDE_ROWS = 65, CHUNK = 256 };

/* b [kc][16] fp32 <- pairs [k2, k2 + kc / 2) of the panel at w */
TARGET static void widen(float *b, const uint32_t *w, int k2, int kc) {
    const __m256i odd = _mm256_set1_epi32((int)0xFFFF0000u);
    for (int q = 0; q < kc / 2; q++) {
        const uint32_t *src = w + (size_t)(k2 + q) * 16;
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(src + 8 * h));
            _mm256_store_si256((__m256i *)(b + (size_t)(2 * q) * 16 + 8 * h), _mm256_slli_epi32(v, 16));
            _mm256_store_si256((__m256i *)(b + (size_t)(2 * q + 1) * 16 + 8 * h), _mm256_and_si256(v, odd));
        }
    }
}

/* c[R rows, 16 columns] (+)= a[R rows, kc] b[kc][16]: first: from 0, else from c; mask: the columns
 * of an edge panel (NULL: all 16) */
#define DEFINE_WIDE(R)                                                                                       \
    TARGET static void wide_##R(int kc, const float *a, size_t lda, const float *b, float *c, size_t ldc,    \
                                int first, const __m256i *mask) {                                            \
        __m256 acc[R][2];                                                                                    \
        UNROLL for (int i = 0; i < R; i++) {                                                                 \
            if (first)                                                                                       \
                acc[i][0] = acc[i][1] = _mm256_setzero_ps();                                                 \
            else if (mask)                                                                                   \
                acc[i][0] = _mm256_maskload_ps(c + i * ldc, mask[0]),                                        \
                acc[i][1] = _mm256_maskload_ps(c + i * ldc + 8, mask[1]);                                    \
            else                                                                                             \
                acc[i][0] = _mm256_loadu_ps(c + i * ldc), acc[i][1] = _mm256_loadu_ps(c + i * ldc + 8);      \
        }                                                                                                    \
        for (int k = 0; k < kc; k++) {                                                                       \
            const __m256 b0 = _mm256_load_ps(b + 16 * k), b1 = _mm256_load_ps(b + 16 * k + 8);               \
            UNROLL for (int i = 0; i < R; i++) {                                                             \
                const __m256 ai = _mm256_broadcast_ss(a + i * lda + k);                                      \
                acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);                                              \
                acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);                                              \
            }                                                                                                \
        }                                                                                                    \
        UNROLL for (int i = 0; i < R; i++) {                                                                 \
            if (mask)                                                                                        \
                _mm256_maskstore_ps(c + i * ldc, mask[0], acc[i][0]),                                        \
                    _mm256_maskstore_ps(c + i * ldc + 8, mask[1], acc[i][1]);                                \
            else                                                                                             \
                _mm256_storeu_ps(c + i * ldc, acc[i][0]), _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);      \
        }                                                                                                    \
    }
DEFINE_WIDE(1)
DEFINE_WIDE(2)
DEFINE_WIDE(3)
DEFINE_WIDE(4)
DEFINE_WIDE(5)
DEFINE_WIDE(6)

typedef void (*wide_fn)(int kc, const float *a, size_t lda, const float *b, float *c, size_t ldc, int first,
                        const __m256i *mask);
static const wide_fn wide_of[7] = {NULL, wide_1, wide_2, wide_3, wide_4, wide_5, wide_6};

/* Rows [r0, r1) of the rounded a times panel q, into C */
TARGET static void wide_item(const float *a, size_t lda, int r0, int r1, const ctrl_cpu_bf16_avx2_panels *p,
                             int q, float *C, int ldc, float *b) {
    const int cols = p->N - 16 * q < 16 ? p->N - 16 * q : 16;
    __m256i mask[2];
    for (int h = 0; h < 2; h++) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        mask[h] = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols - 8 * h), lane);
    }
    const uint32_t *w = p->w + (size_t)q * p->K2 * 16;
    for (int k0 = 0; k0 < 2 * p->K2; k0 += KC) {
        const int kc = 2 * p->K2 - k0 < KC ? 2 * p->K2 - k0 : KC;
        widen(b, w, k0 / 2, kc);
        for (int i = r0; i < r1; i += 6) {
            const int r = r1 - i < 6 ? r1 - i : 6;
            wide_of[r](kc, a + (size_t)i * lda + k0, lda, b, C + (size_t)i * ldc + 16 * q, (size_t)ldc,
                       k0 == 0, cols == 16 ? NULL : mask);
        }
    }
}

static _Thread_local float *widened; /* a thread's KC x 16 buffer, kept */

static int wide(int M, const float *A, int lda, const ctrl_cpu_bf16_avx2_panels *p, float *C, int ldc) {
    const size_t lda2 = 2 * (size_t)p->K2;
    const int chunk = CHUNK;
    float *a = scratch_for((size_t)(M < chunk ? M : chunk) * lda2);
    if (!a) return -1;
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif
    for (int m0 = 0; m0 < M; m0 += chunk) {
        const int m = M - m0 < chunk ? M - m0 : chunk;
        /* item t: panel t / blocks, its rows' block t % blocks; the rows in as few blocks as give
         * every thread about 4 items (one block where the panels alone do) */
        int blocks = (4 * threads + p->npanels - 1) / p->npanels;
        blocks = blocks < 1 ? 1 : blocks > (m + 5) / 6 ? (m + 5) / 6 : blocks;
        const int per = ((m + blocks - 1) / blocks + 5) / 6 * 6, items = blocks * p->npanels;
#pragma omp parallel if ((size_t)m * p->N * p->K >= ((size_t)1 << 19))
        {
#pragma omp for schedule(static)
            for (int i = 0; i < m; i++) round_rows(a, i, i + 1, A + (size_t)m0 * lda, lda, p->K, p->K2);
            if (!widened) widened = aligned_alloc(32, sizeof(float) * KC * 16);
#pragma omp for schedule(static)
            for (int t = 0; t < items; t++) {
                const int r0 = (t % blocks) * per, q = t / blocks, r1 = r0 + per < m ? r0 + per : m;
                float *c = C + (size_t)m0 * ldc;
                if (r0 >= m) continue;
                if (widened)
                    wide_item(a, lda2, r0, r1, p, q, c, ldc, widened);
                else /* no buffer for this thread: the narrow tiles, the same sums, no memory */
                    item(r1 - r0, a + (size_t)r0 * lda2, lda2, p, q, 1, 1, c + (size_t)r0 * ldc, ldc);
            }
        }
    }
    return 0;
}

int ctrl_cpu_bf16_avx2_linear(int M, const float *A, int lda, const ctrl_cpu_bf16_avx2_panels *p, float *C,
                              int ldc) {
    if (!p || M <= 0) return M == 0 && p ? 0 : -1;
    const char *narrow = getenv("CTRL_NO_AVX2_WIDE"); /* 1: the narrow tiles at any M (comparisons, tests) */
    if (M >= WIDE_ROWS && !(narrow && *narrow && strcmp(narrow, "0") != 0)) return wide(M, A, lda, p, C, ldc);
    float *a = scratch_for((size_t)M * 2 * p->K2);
    if (!a) return -1;
    round_rows(a, 0, M, A, lda, p->K, p->K2);
    const size_t lda2 = 2 * (size_t)p->K2;
    const int G = M == 1 ? 4 : M == 2 ? 2 : 1, items = (p->npanels + G - 1) / G;
    /* one parallel region a call, and none for the small projections (a wake-up costs more) */
#pragma omp parallel for schedule(static) if ((size_t)M * p->N * p->K >= ((size_t)1 << 19))
    for (int t = 0; t < items; t++) {
        const int p0 = t * G, g = p->npanels - p0 < G ? p->npanels - p0 : G;
        item(M, a, lda2, p, p0, g, G, C, ldc);
    }
    return 0;
}

#else /* no x86-64 AVX2 code in this build */
int ctrl_cpu_bf16_avx2_available(void) { return 0; }
ctrl_cpu_bf16_avx2_panels *ctrl_cpu_bf16_avx2_pack(int N, int K, const float *W, int ldw) {
    (void)N, (void)K, (void)W, (void)ldw;
    return NULL;
}
int ctrl_cpu_bf16_avx2_repack(ctrl_cpu_bf16_avx2_panels *p, const float *W, int ldw) {
    (void)p, (void)W, (void)ldw;
    return -1;
}
int ctrl_cpu_bf16_avx2_linear(int M, const float *A, int lda, const ctrl_cpu_bf16_avx2_panels *p, float *C,
                              int ldc) {
    (void)M, (void)A, (void)lda, (void)p, (void)C, (void)ldc;
    return -1;
}
#endif
