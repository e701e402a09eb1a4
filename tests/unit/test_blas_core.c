/* OpenBLAS's kernel choice against the CPU (kernels/cpu/blas_core.c): kernels older than AVX2 on a
 * CPU with AVX2 + FMA are replaced (SkylakeX with AVX-512, else Haswell); modern choices, and CPUs
 * without AVX2, are left alone; the loaded OpenBLAS on this machine is asked for its name. The
 * restart itself (cli/blas_restart.c) is tested end to end by tests/cli/test_blas_restart.sh. */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "test.h"

TEST(kernels_older_than_avx2_are_replaced) {
    CHECK(!strcmp(ctrl_cpu_blas_better_core("Prescott", 1, 1), "SkylakeX"));
    CHECK(!strcmp(ctrl_cpu_blas_better_core("prescott", 1, 0), "Haswell"));
    CHECK(!strcmp(ctrl_cpu_blas_better_core("Nehalem", 1, 1), "SkylakeX"));
    CHECK(!strcmp(ctrl_cpu_blas_better_core("Sandybridge", 1, 0), "Haswell"));
    CHECK(!strcmp(ctrl_cpu_blas_better_core("unknown", 1, 1), "SkylakeX"));
}

TEST(modern_kernels_and_old_cpus_are_left_alone) {
    const char *fine[] = {"Haswell", "SkylakeX", "Cooperlake", "Zen", "SapphireRapids", NULL};
    for (int i = 0; fine[i]; i++) CHECK(ctrl_cpu_blas_better_core(fine[i], 1, 1) == NULL);
    CHECK(ctrl_cpu_blas_better_core("Prescott", 0, 0) == NULL); /* nothing better to run */
    CHECK(ctrl_cpu_blas_better_core(NULL, 1, 1) == NULL);
}

TEST(the_loaded_openblas_is_asked) {
    unsetenv("CTRL_TEST_BLAS_CORENAME");
    const char *current = NULL;
    (void)ctrl_cpu_blas_core_advice(&current);
    CHECK(current && current[0]);
    printf("  OpenBLAS chose %s here\n", current);
    setenv("CTRL_TEST_BLAS_CORENAME", "Prescott", 1);
    const char *better = ctrl_cpu_blas_core_advice(&current);
    CHECK(!strcmp(current, "Prescott"));
    CHECK(better == NULL || !strcmp(better, "SkylakeX") || !strcmp(better, "Haswell"));
    unsetenv("CTRL_TEST_BLAS_CORENAME");
}
