/* OpenBLAS's choice of kernels against what the CPU can run. A dynamic-arch OpenBLAS (Debian's)
 * picks its kernels from the CPU's model number when it loads; a CPU newer than the OpenBLAS build,
 * or a virtual machine that reports a generic model, gets the SSE3 "Prescott" kernels. Measured on a
 * lent GPU host (an Intel Xeon VM with AVX-512 and AMX, OpenBLAS 0.3.21): SGEMM ~4x slower than the
 * SkylakeX kernels, 19% of a bf16 SFT step in the attention's products alone. The remedy is
 * OPENBLAS_CORETYPE, read only at load: cli/blas_restart.c restarts ctrl with it set. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "cpu/cpu_ops.h"

char *openblas_get_corename(void);

/* OpenBLAS's names (lower case, as openblas_get_corename gives them) of kernels older than AVX2 */
static const char *const before_avx2[] = {"unknown",    "prescott",   "core2",     "penryn", "dunnington",
                                          "nehalem",    "atom",       "katmai",    "banias", "northwood",
                                          "coppermine", "opteron",    "barcelona", "bobcat", "sandybridge",
                                          "bulldozer",  "piledriver", NULL};

const char *ctrl_cpu_blas_better_core(const char *current, int avx2_fma, int avx512) {
    if (!current || !avx2_fma) return NULL;
    for (int i = 0; before_avx2[i]; i++)
        if (!strcasecmp(current, before_avx2[i])) return avx512 ? "SkylakeX" : "Haswell";
    return NULL;
}

/* AVX2 + FMA (and AVX-512 F/BW/DQ/VL) asked of the CPU and of the OS (XCR0's YMM / ZMM state) */
static void cpu_vector_isa(int *avx2_fma, int *avx512) {
    *avx2_fma = *avx512 = 0;
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27)) || !(c & (1u << 12))) return;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0x6u) != 0x6u || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return; /* XMM, YMM state */
    *avx2_fma = (b >> 5) & 1u;                                                   /* AVX2 */
    const unsigned f_dq_bw_vl = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
    *avx512 = *avx2_fma && (lo & 0xE0u) == 0xE0u && (b & f_dq_bw_vl) == f_dq_bw_vl;
#endif
}

const char *ctrl_cpu_blas_core_advice(const char **current) {
    const char *test = getenv("CTRL_TEST_BLAS_CORENAME"); /* tests: pretend OpenBLAS chose this */
    *current = test && test[0] ? test : openblas_get_corename();
    int avx2_fma, avx512;
    cpu_vector_isa(&avx2_fma, &avx512);
    return ctrl_cpu_blas_better_core(*current, avx2_fma, avx512);
}
