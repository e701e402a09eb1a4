/* The paged plugin's CUDA path against its CPU path: the same pools (fp32 and bf16), shuffled block
 * tables (tests/paged_case.c), queries at every position and at the last one of sequences of 1 to 1500
 * tokens, GQA groups of 1, 4 and 8, head_dim 64 and 128, with and without a sliding window; outputs poisoned
 * with NaN before the run; max abs difference <= 1e-4; two of the shapes again with Gemma 2's logit
 * soft-capping. Skips, saying why, without a GPU or a CUDA
 * build. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/attention.h>

#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "paged_case.h"
#include "test.h"
#include "test_registry.h"

#ifdef CTRL_HAVE_CUDA

static void *to_device(const void *h, size_t bytes) {
    void *d = NULL;
    if (ctrl_cuda_malloc(&d, bytes ? bytes : 4) != CTRL_OK) return NULL;
    ctrl_cuda_memcpy_h2d(d, h, bytes);
    return d;
}

static void check_shape(const ctrl_attention_ops *paged, paged_shape sh, float softcap) {
    /* CTRL_TEST_SMALL (compute-sanitizer, the emulator): shorter sequences, still several blocks */
    static const int full[4] = {1, 37, 500, 1500}, small[4] = {1, 37, 70, 130};
    const int *lens = getenv("CTRL_TEST_SMALL") ? small : full;
    paged_case c;
    paged_case_make(&c, sh, lens, 4, 0x2545F4914F6CDD1Dull + (uint64_t)sh.D * sh.H + sh.bf16);
    const int H = sh.H, D = sh.D, n = c.n;
    const size_t out_bytes = sizeof(float) * n * H * D;
    float *want = malloc(out_bytes), *got = malloc(out_bytes);
    c.args.out = want, c.args.softcap = softcap; /* Gemma 2's attn_logit_softcapping when > 0 */
    CHECK_MSG(paged->paged_forward(&c.args) == CTRL_OK, "cpu: %s", ctrl_error_message());
    ctrl_paged_attention_args d = c.args;
    d.device = (ctrl_device){CTRL_DEVICE_CUDA, 0};
    d.q = to_device(c.qs, out_bytes), d.k_cache = to_device(c.kc, c.pool_bytes),
    d.v_cache = to_device(c.vc, c.pool_bytes),
    d.block_tables = to_device(c.tables, sizeof(int32_t) * (size_t)c.B * c.args.max_blocks_per_seq),
    d.seq_of_token = to_device(c.seq_of, sizeof(int32_t) * (size_t)n),
    d.positions = to_device(c.pos, sizeof(int32_t) * (size_t)n);
    void *out = NULL;
    CHECK_EQ_INT(ctrl_cuda_malloc(&out, out_bytes), CTRL_OK);
    ctrl_cuda_memset(out, 0xff, out_bytes); /* NaN */
    d.out = out;
    CHECK_MSG(paged->paged_forward(&d) == CTRL_OK, "cuda: %s", ctrl_error_message());
    CHECK_EQ_INT(ctrl_cuda_synchronize(), CTRL_OK);
    ctrl_cuda_memcpy_d2h(got, out, out_bytes);
    double worst = 0;
    for (int i = 0; i < n * H * D; i++)
        worst = isfinite(got[i]) ? fmax(worst, fabs((double)got[i] - want[i])) : INFINITY;
    CHECK_MSG(worst <= 1e-4, "H %d HK %d D %d window %d block %d last_only %d bf16 %d softcap %g: max error %.3g",
              H, sh.HK, D, sh.window, sh.block, sh.last_only, sh.bf16, (double)softcap, worst);
    printf("  H %2d/%d D %3d window %3d block %2d %s %s cache%s: %d queries, max error %.2g\n", H, sh.HK, D,
           sh.window, sh.block, sh.last_only ? "decode " : "prefill", sh.bf16 ? "bf16" : "fp32",
           softcap > 0 ? ", soft-capped" : "", n, worst);
    ctrl_cuda_free((void *)d.q), ctrl_cuda_free((void *)d.k_cache), ctrl_cuda_free((void *)d.v_cache),
        ctrl_cuda_free((void *)d.block_tables), ctrl_cuda_free((void *)d.seq_of_token),
        ctrl_cuda_free((void *)d.positions), ctrl_cuda_free(out);
    free(want), free(got);
    paged_case_free(&c);
}

TEST(paged_cuda_matches_cpu) {
    if (ctrl_cuda_device_count() <= 0) TEST_SKIP(ctrl_cuda_unavailable_reason());
    atexit(ctrl_cuda_shutdown);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "paged");
    CHECK(e != NULL);
    if (!e) return;
    static const paged_shape shapes[] = {
        {8, 8, 64, 0, 16, 1, 0},    {8, 2, 64, 0, 16, 0, 0}, {32, 4, 128, 0, 16, 1, 0},
        {16, 2, 128, 100, 8, 0, 0}, {8, 2, 64, 0, 16, 1, 1}, {32, 4, 128, 64, 16, 0, 1},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(e->plugin->ops, shapes[i], 0);
    /* Gemma 2's soft-capping (a small cap, so that it bends the scores), prefill and decode */
    check_shape(e->plugin->ops, shapes[1], 0.5f);
    check_shape(e->plugin->ops, shapes[4], 0.5f);
    ctrl_registry_destroy(reg);
}

#else

TEST(paged_cuda) { TEST_SKIP("built without CUDA"); }

#endif
