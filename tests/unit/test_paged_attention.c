/* The `paged` attention plugin against the `flash` plugin's forward: the same sequences, their K/V
 * scattered into a block pool through shuffled block tables; queries at every position (a prefill)
 * and at the last one only (a decode step), causal, GQA groups of 1/2/4, head_dim 64 and 128, with
 * and without a sliding window, fp32 and bf16 caches (against flash on the bf16-rounded K/V). Bad tables and
 * plugins without paged decoding are clear errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/attention.h>

#include "cpu/cpu_ops.h"
#include "model/model.h"
#include "paged_case.h"
#include "test.h"
#include "test_registry.h"

static const ctrl_attention_ops *find(ctrl_registry *reg, const char *name) {
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, name);
    CHECK_MSG(e != NULL, "no %s plugin", name);
    return e ? e->plugin->ops : NULL;
}

static void check_shape(const ctrl_attention_ops *paged, const ctrl_attention_ops *flash, paged_shape sh) {
    static const int lens[3] = {1, 23, 40};
    paged_case c;
    paged_case_make(&c, sh, lens, 3, 0x9E3779B97F4A7C15ull + (uint64_t)sh.D * sh.H + sh.bf16);
    const int H = sh.H, D = sh.D, n = c.n;
    float *want = malloc(sizeof(float) * c.T * H * D), *lse = malloc(sizeof(float) * c.T * H),
          *got = malloc(sizeof(float) * n * H * D);
    ctrl_attention_args fa = {.size = sizeof fa,
                              .device = {CTRL_DEVICE_CPU, 0},
                              .dtype = CTRL_F32,
                              .n_seqs = c.B,
                              .cu_seqlens = c.cu,
                              .cu_seqlens_host = c.cu,
                              .total_tokens = c.T,
                              .n_head = H,
                              .n_kv_head = sh.HK,
                              .head_dim = D,
                              .scale = 1.0f / sqrtf((float)D),
                              .causal = 1,
                              .window = sh.window,
                              .q = c.q,
                              .k = c.k,
                              .v = c.v,
                              .out = want,
                              .lse = lse};
    CHECK_EQ_INT(flash->forward(&fa, NULL), CTRL_OK);
    c.args.out = got;
    CHECK_MSG(paged->paged_forward(&c.args) == CTRL_OK, "%s", ctrl_error_message());
    double worst = 0;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < H * D; i++)
            worst = fmax(worst,
                         fabs((double)got[(size_t)t * H * D + i] - want[(size_t)c.query_row[t] * H * D + i]));
    CHECK_MSG(worst <= 1e-5, "H %d HK %d D %d window %d block %d last_only %d bf16 %d: max error %.3g", H,
              sh.HK, D, sh.window, sh.block, sh.last_only, sh.bf16, worst);
    /* a table entry outside the pool is refused, not read */
    int32_t *tables = c.tables;
    const int last = 2 * c.args.max_blocks_per_seq + (lens[2] - 1) / sh.block, saved = tables[last];
    tables[last] = c.args.n_blocks;
    CHECK_EQ_INT(paged->paged_forward(&c.args), CTRL_ERR_RUNTIME);
    CHECK(strstr(ctrl_error_message(), "block table") != NULL);
    tables[last] = saved;
    free(want), free(lse), free(got);
    paged_case_free(&c);
}

TEST(paged_equals_flash_over_shuffled_blocks) {
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_attention_ops *paged = find(reg, "paged"), *flash = find(reg, "flash");
    if (!paged || !flash) return;
    static const paged_shape shapes[] = {
        {4, 4, 64, 0, 16, 0, 0}, {4, 2, 64, 0, 4, 0, 0},   {8, 2, 128, 0, 16, 1, 0},
        {8, 2, 64, 7, 4, 0, 0},  {4, 1, 128, 9, 16, 1, 0}, {2, 2, 64, 0, 1, 0, 0},
        {4, 2, 64, 0, 16, 0, 1}, {8, 2, 128, 7, 4, 1, 1}, /* bf16 caches */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(paged, flash, shapes[i]);
    ctrl_registry_destroy(reg);
}

TEST(plugins_without_the_other_half_are_refused) {
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_attention_ops *paged = find(reg, "paged"), *flash = find(reg, "flash");
    ctrl_model *m = NULL;
    /* paged cannot train; flash cannot decode over a paged cache */
    CHECK_EQ_INT(ctrl_model_load(CTRL_FIXTURE_DIR "/models/qwen2", paged, &m), CTRL_ERR_PLUGIN);
    CHECK(strstr(ctrl_error_message(), "paged") != NULL);
    CHECK_EQ_INT(ctrl_model_load(CTRL_FIXTURE_DIR "/models/qwen2", flash, &m), CTRL_OK);
    if (m) {
        CHECK_EQ_INT(ctrl_model_set_paged_attention(m, flash), CTRL_ERR_PLUGIN);
        CHECK_EQ_INT(ctrl_model_set_paged_attention(m, paged), CTRL_OK);
        ctrl_model_free(m);
    }
    /* bad arguments: a clear error */
    ctrl_paged_attention_args bad = {.size = sizeof bad, .device = {CTRL_DEVICE_CPU, 0}, .dtype = CTRL_BF16};
    CHECK_EQ_INT(paged->paged_forward(&bad), CTRL_ERR_UNSUPPORTED);
    bad.dtype = CTRL_F32, bad.n_head = 3, bad.n_kv_head = 2;
    CHECK_EQ_INT(paged->paged_forward(&bad), CTRL_ERR_RUNTIME);
    ctrl_registry_destroy(reg);
}
