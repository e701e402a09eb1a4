/* bf16 on the CPU: conversions (round to nearest even, as torch's .to(torch.bfloat16)), the CPU
 * feature checks and the choice of path, and the linear layer as torch.autocast runs it (inputs
 * rounded to bf16, products accumulated in fp32). Where the CPU has AMX or AVX-512 BF16 (checked at
 * run time; CTRL_NO_AMX, CTRL_NO_AVX512BF16 turn them off) the products go through the blocked GEMM
 * of gemm_bf16.c, which rounds its inputs as it packs them; elsewhere SGEMM multiplies fp32 copies
 * rounded to bf16 values (bf16 x bf16 is exact in fp32, so the products are the same, at SGEMM's
 * speed). */
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "cpu/gemm_bf16_kernel.h"
#include "cpu/par_min.h"

/* The bits of f rounded to bf16 (to nearest, ties to even; a NaN stays NaN, made quiet) in the high half,
 * the low half zero. Branch-free, so that the loops below vectorise (AVX2: 8 values an instruction;
 * the branch on NaN kept them scalar, ~6x slower, where the bf16 fallback rounds every projection's
 * inputs). */
static inline uint32_t round_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t nearest = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    const uint32_t quiet = (u | 0x00400000u) & 0xFFFF0000u;
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? quiet : nearest;
}

static inline uint16_t to_bf16(float f) { return (uint16_t)(round_bits(f) >> 16); }

static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void ctrl_cpu_f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
/* a parallel region costs more than a few thousand conversions; simd: -O2 does not vectorise it alone */
#pragma omp parallel for simd schedule(static) if (n >= 16384)
    for (int64_t i = 0; i < n; i++) dst[i] = to_bf16(src[i]);
}

void ctrl_cpu_bf16_to_f32(float *dst, const uint16_t *src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= 16384)
    for (int64_t i = 0; i < n; i++) dst[i] = from_bf16(src[i]);
}

static void gemm_nt_portable(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K,
                             int accumulate) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float s = 0;
            const uint16_t *a = A + (size_t)i * K, *b = B + (size_t)j * K;
            for (int k = 0; k < K; k++) s += from_bf16(a[k]) * from_bf16(b[k]);
            C[(size_t)i * N + j] = accumulate ? C[(size_t)i * N + j] + s : s;
        }
}

/* AVX-512 BF16, asked of the CPU (cpuid leaf 7: AVX512F, AVX512BW, AVX512_BF16) and of the OS (XCR0:
 * the ZMM and opmask state is saved), the same under gcc and clang. (The kernels were once compiled
 * for gcc only, so clang builds, the sanitizer build among them, said "no AVX-512 BF16".) */
static int cpu_has_avx512bf16(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xE6u) != 0xE6u) return 0; /* XMM, YMM, opmask, ZMM state enabled by the OS */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 16)) || !(b & (1u << 30)) || a < 1)
        return 0; /* AVX512F, AVX512BW; leaf 7 has sub-leaf 1 */
    __get_cpuid_count(7, 1, &a, &b, &c, &d);
    return (a >> 5) & 1u; /* AVX512_BF16 */
#else
    return 0;
#endif
}

int ctrl_cpu_has_avx512bf16(void) {
    static int cpu = -1; /* the CPU does not change; the switch is read each time (tests flip it) */
    if (cpu < 0) cpu = ctrl_cpu_gemm_bf16_compiled() && cpu_has_avx512bf16();
    return cpu && !getenv("CTRL_NO_AVX512BF16");
}

/* AMX with bf16, asked of the CPU (cpuid leaf 7: AMX-TILE, AMX-BF16; leaf 0x1D palette 1 with 8
 * tiles of 16 rows of 64 bytes; leaf 0x1E: the multiplier takes 16 x 64 bytes), of the OS (XCR0:
 * XTILECFG and XTILEDATA state enabled) and of Linux, which hands the 8 KiB tile state to a
 * process only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA; without it the first
 * tile instruction faults). *why says what was missing. */
static int cpu_has_amx(const char **why) {
#if defined(__x86_64__) && defined(__linux__)
    static char refused[96];
    unsigned a, b, c, d;
    *why = "this CPU has no AMX";
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return 0;
    if (__get_cpuid_max(0, NULL) < 0x1E) return 0;
    *why = "the OS has not enabled the AMX tile state (XCR0)";
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0x60000u) != 0x60000u) return 0; /* XTILECFG (bit 17), XTILEDATA (bit 18) */
    *why = "this CPU's AMX palette is not 8 tiles of 16 x 64 bytes";
    __get_cpuid_count(0x1D, 0, &a, &b, &c, &d);
    if (a < 1) return 0; /* highest palette */
    __get_cpuid_count(0x1D, 1, &a, &b, &c, &d);
    if ((b & 0xFFFFu) < 64 || (b >> 16) < 8 || (c & 0xFFFFu) < 16) return 0; /* bytes a row, names, rows */
    __get_cpuid_count(0x1E, 0, &a, &b, &c, &d);
    if ((b & 0xFFu) < 16 || ((b >> 8) & 0xFFFFu) < 64) return 0; /* tmul_maxk, tmul_maxn */
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0) {
        snprintf(refused, sizeof refused, "Linux refused the AMX tile state (arch_prctl: errno %d)", errno);
        *why = refused;
        return 0;
    }
    *why = NULL;
    return 1;
#else
    *why = "AMX is detected on x86-64 Linux only";
    return 0;
#endif
}

static const char *amx_missing; /* why not, once asked */

/* Asked once (the answer is stored atomically: the first callers may be several threads; asking
 * twice is harmless, arch_prctl grants the same permission again). */
int ctrl_cpu_has_amx(void) {
    static int cpu = -1;
    int v = __atomic_load_n(&cpu, __ATOMIC_ACQUIRE);
    if (v < 0) {
        const char *why = "this build has no AMX kernel (its compiler lacks the AMX intrinsics)";
        v = ctrl_bf16_amx_kernel.tile != NULL && ctrl_cpu_gemm_bf16_compiled() && cpu_has_amx(&why);
        __atomic_store_n(&amx_missing, why, __ATOMIC_RELAXED);
        __atomic_store_n(&cpu, v, __ATOMIC_RELEASE);
    }
    return v;
}

static int env_on(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

ctrl_cpu_bf16_kind ctrl_cpu_bf16_kind_now(void) {
    if (!ctrl_cpu_has_avx512bf16()) return CTRL_CPU_BF16_FP32;
    if (getenv("CTRL_NO_AMX")) return CTRL_CPU_BF16_AVX512;
    if (env_on("CTRL_AMX_EMULATE")) return CTRL_CPU_BF16_AMX_EMULATED;
    return ctrl_cpu_has_amx() ? CTRL_CPU_BF16_AMX : CTRL_CPU_BF16_AVX512;
}

void ctrl_cpu_gemm_bf16_nt(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K,
                           int accumulate) {
    if (ctrl_cpu_gemm_bf16_nt_avx512(C, A, B, M, N, K, accumulate) == 0) return;
    gemm_nt_portable(C, A, B, M, N, K, accumulate);
}

void ctrl_cpu_round_to_bf16(float *dst, const float *src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= 16384)
    for (int64_t i = 0; i < n; i++) {
        const uint32_t u = round_bits(src[i]);
        memcpy(&dst[i], &u, 4);
    }
}

/* fp32 copy of src[n] rounded to bf16 values: where the CPU has no bf16 dot products, bf16
 * inputs times bf16 inputs are exact in fp32, so SGEMM on rounded copies gives the same products
 * with fp32 accumulation at SGEMM's speed. The copies live in per-thread scratch kept between calls
 * (slot 0: x, 1: dout, 2: w): they are as big as a layer's activations, and fresh ones in every
 * projection cost page faults that made this path slower than fp32. */
static _Thread_local struct {
    float *p;
    size_t n;
} scratch[3];

static float *rounded_f32(int slot, const float *src, int64_t n) {
    const size_t want = (size_t)(n ? n : 1);
    if (want > scratch[slot].n) {
        free(scratch[slot].p);
        scratch[slot].p = malloc(sizeof(float) * want);
        scratch[slot].n = scratch[slot].p ? want : 0;
        if (!scratch[slot].p) return NULL;
    }
    ctrl_cpu_round_to_bf16(scratch[slot].p, src, n);
    return scratch[slot].p;
}

static void add_bias(float *out, const float *bias, int T, int OUT) {
    if (!bias) return;
#pragma omp parallel for schedule(static) if ((size_t)T * OUT >= CTRL_CPU_PAR_MIN)
    for (int t = 0; t < T; t++)
        for (int o = 0; o < OUT; o++) out[(size_t)t * OUT + o] += bias[o];
}

/* db[o] += column sums of dout (unrounded, on every path) */
static void bias_grad(float *dbias, const float *dout, int T, int OUT) {
    if (!dbias) return;
#pragma omp parallel for schedule(static) if ((size_t)T * OUT >= CTRL_CPU_PAR_MIN)
    for (int o = 0; o < OUT; o++) {
        float s = 0;
        for (int t = 0; t < T; t++) s += dout[(size_t)t * OUT + o];
        dbias[o] += s;
    }
}

const char *ctrl_cpu_bf16_path(int *fast) {
    static char avx[160];
    const ctrl_cpu_bf16_kind kind = ctrl_cpu_bf16_kind_now();
    *fast = kind == CTRL_CPU_BF16_AMX || kind == CTRL_CPU_BF16_AVX512; /* the emulation is slower than fp32 */
    switch (kind) {
    case CTRL_CPU_BF16_AMX: return "AMX tiles (tdpbf16ps, blocked GEMM)";
    case CTRL_CPU_BF16_AMX_EMULATED:
        return "AMX tiles emulated in software (CTRL_AMX_EMULATE: for tests, slow; tdpbf16ps as the "
               "Intel SDM defines it)";
    case CTRL_CPU_BF16_AVX512:
        if (ctrl_cpu_has_amx()) /* then CTRL_NO_AMX chose this */
            return "AVX-512 BF16 (vdpbf16ps, blocked GEMM; AMX turned off by CTRL_NO_AMX)";
        snprintf(avx, sizeof avx, "AVX-512 BF16 (vdpbf16ps, blocked GEMM; no AMX: %s)",
                 __atomic_load_n(&amx_missing, __ATOMIC_RELAXED));
        return avx;
    default: break;
    }
    static char fp32[128];
    snprintf(fp32, sizeof fp32, "fp32 SGEMM on bf16-rounded inputs (%s)", ctrl_cpu_bf16_no_kernel_why());
    return fp32;
}

const char *ctrl_cpu_bf16_no_kernel_why(void) {
    if (ctrl_cpu_bf16_kind_now() != CTRL_CPU_BF16_FP32) return NULL;
    if (getenv("CTRL_NO_AVX512BF16") && ctrl_cpu_gemm_bf16_compiled() && cpu_has_avx512bf16())
        return "AVX-512 BF16 and AMX turned off by CTRL_NO_AVX512BF16";
    return ctrl_cpu_gemm_bf16_compiled() ? "this CPU has no AVX-512 BF16" : "built without AVX-512 BF16 code";
}

int ctrl_cpu_linear_forward_bf16(float *out, const float *x, const float *w, const float *bias, int T, int IN,
                                 int OUT, int w_rounded) {
    if (ctrl_cpu_gemm_bf16(0, 1, T, OUT, IN, x, IN, w, IN, out, OUT, 0) == 0)
        return add_bias(out, bias, T, OUT), 0;
    float *xr = rounded_f32(0, x, (int64_t)T * IN),
          *wr = w_rounded ? NULL : rounded_f32(2, w, (int64_t)OUT * IN);
    const int rc = xr && (wr || w_rounded) ? 0 : -1;
    if (rc == 0) ctrl_cpu_linear_forward(out, xr, wr ? wr : w, bias, T, IN, OUT);
    return rc;
}

int ctrl_cpu_linear_backward_bf16(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                                  const float *w, int T, int IN, int OUT, int w_rounded) {
    /* dx[T, IN] = dout[T, OUT] W[OUT, IN];  dW[OUT, IN] += dout^T x */
    if ((!dx || ctrl_cpu_gemm_bf16(0, 0, T, IN, OUT, dout, OUT, w, IN, dx, IN, 0) == 0) &&
        (!dw || ctrl_cpu_gemm_bf16(1, 0, OUT, IN, T, dout, OUT, x, IN, dw, IN, 1) == 0))
        return bias_grad(dbias, dout, T, OUT), 0;
    /* x only for dW: a frozen weight (dw NULL: LoRA's base) has its x left alone (it was rounded for
     * nothing: T x IN values a projection, read and written) */
    float *dr = rounded_f32(1, dout, (int64_t)T * OUT), *xr = dw ? rounded_f32(0, x, (int64_t)T * IN) : NULL,
          *wr = dx && !w_rounded ? rounded_f32(2, w, (int64_t)OUT * IN) : NULL;
    const int rc = dr && (xr || !dw) && (wr || !dx || w_rounded) ? 0 : -1;
    if (rc == 0) ctrl_cpu_linear_backward(dx, dw, NULL, dr, xr, wr ? wr : w, T, IN, OUT);
    if (rc == 0) bias_grad(dbias, dout, T, OUT);
    return rc;
}
