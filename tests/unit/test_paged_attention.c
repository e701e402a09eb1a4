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
#include "test.h"
#include "test_registry.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

typedef struct shape {
    int H, HK, D, window, block, last_only, bf16; /* bf16: the cache holds bf16 */
} shape;

static const ctrl_attention_ops *find(ctrl_registry *reg, const char *name) {
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, name);
    CHECK_MSG(e != NULL, "no %s plugin", name);
    return e ? e->plugin->ops : NULL;
}

static void check_shape(const ctrl_attention_ops *paged, const ctrl_attention_ops *flash, shape sh) {
    enum { B = 3 };
    const int lens[B] = {1, 23, 40}, H = sh.H, HK = sh.HK, D = sh.D, bs = sh.block;
    int cu[B + 1] = {0}, max_blocks = 0, n_blocks = 0;
    for (int b = 0; b < B; b++) {
        cu[b + 1] = cu[b] + lens[b];
        const int nb = (lens[b] + bs - 1) / bs;
        max_blocks = nb > max_blocks ? nb : max_blocks, n_blocks += nb;
    }
    n_blocks += 3; /* unused blocks in the pool */
    const int T = cu[B];
    float *q = malloc(sizeof(float) * T * H * D), *k = malloc(sizeof(float) * T * HK * D),
          *v = malloc(sizeof(float) * T * HK * D), *want = malloc(sizeof(float) * T * H * D),
          *lse = malloc(sizeof(float) * T * H);
    for (int i = 0; i < T * H * D; i++) q[i] = frand();
    for (int i = 0; i < T * HK * D; i++) k[i] = frand(), v[i] = frand();
    if (sh.bf16) /* the reference sees the values the cache holds */
        ctrl_cpu_round_to_bf16(k, k, (int64_t)T * HK * D), ctrl_cpu_round_to_bf16(v, v, (int64_t)T * HK * D);
    ctrl_attention_args fa = {.size = sizeof fa,
                              .device = {CTRL_DEVICE_CPU, 0},
                              .dtype = CTRL_F32,
                              .n_seqs = B,
                              .cu_seqlens = cu,
                              .cu_seqlens_host = cu,
                              .total_tokens = T,
                              .n_head = H,
                              .n_kv_head = HK,
                              .head_dim = D,
                              .scale = 1.0f / sqrtf((float)D),
                              .causal = 1,
                              .window = sh.window,
                              .q = q,
                              .k = k,
                              .v = v,
                              .out = want,
                              .lse = lse};
    CHECK_EQ_INT(flash->forward(&fa, NULL), CTRL_OK);
    /* the pool: blocks handed out in a shuffled order */
    int32_t *order = malloc(sizeof(int32_t) * n_blocks),
            *tables = calloc((size_t)B * max_blocks, sizeof(int32_t));
    for (int i = 0; i < n_blocks; i++) order[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        const int j = (int)((frand() + 1.0f) * 0.5f * i), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    const size_t slot = (size_t)HK * D, elt = sh.bf16 ? 2 : 4;
    /* rows no sequence owns are NaN (all ones, in fp32 and bf16): a stray read shows */
    char *kc = malloc((size_t)n_blocks * bs * slot * elt), *vc = malloc((size_t)n_blocks * bs * slot * elt);
    memset(kc, 0xff, (size_t)n_blocks * bs * slot * elt),
        memset(vc, 0xff, (size_t)n_blocks * bs * slot * elt);
    for (int b = 0, next = 0; b < B; b++)
        for (int p = 0; p < lens[b]; p++) {
            if (p % bs == 0) tables[b * max_blocks + p / bs] = order[next++];
            const size_t at = ((size_t)tables[b * max_blocks + p / bs] * bs + p % bs) * slot;
            const float *kr = k + (size_t)(cu[b] + p) * slot, *vr = v + (size_t)(cu[b] + p) * slot;
            if (sh.bf16) {
                ctrl_cpu_f32_to_bf16((uint16_t *)kc + at, kr, (int64_t)slot);
                ctrl_cpu_f32_to_bf16((uint16_t *)vc + at, vr, (int64_t)slot);
            } else {
                memcpy((float *)kc + at, kr, sizeof(float) * slot),
                    memcpy((float *)vc + at, vr, sizeof(float) * slot);
            }
        }
    /* queries: every position, or each sequence's last */
    int32_t *seq_of = malloc(sizeof(int32_t) * T), *pos = malloc(sizeof(int32_t) * T);
    float *qs = malloc(sizeof(float) * T * H * D), *got = malloc(sizeof(float) * T * H * D),
          *ref = malloc(sizeof(float) * T * H * D);
    int n = 0;
    for (int b = 0; b < B; b++)
        for (int p = sh.last_only ? lens[b] - 1 : 0; p < lens[b]; p++, n++) {
            seq_of[n] = b, pos[n] = p;
            memcpy(qs + (size_t)n * H * D, q + (size_t)(cu[b] + p) * H * D, sizeof(float) * H * D);
            memcpy(ref + (size_t)n * H * D, want + (size_t)(cu[b] + p) * H * D, sizeof(float) * H * D);
        }
    ctrl_paged_attention_args pa = {.size = sizeof pa,
                                    .device = {CTRL_DEVICE_CPU, 0},
                                    .dtype = CTRL_F32,
                                    .n_tokens = n,
                                    .n_seqs = B,
                                    .n_head = H,
                                    .n_kv_head = HK,
                                    .head_dim = D,
                                    .scale = 1.0f / sqrtf((float)D),
                                    .window = sh.window,
                                    .q = qs,
                                    .out = got,
                                    .k_cache = kc,
                                    .v_cache = vc,
                                    .n_blocks = n_blocks,
                                    .block_size = bs,
                                    .block_tables = tables,
                                    .max_blocks_per_seq = max_blocks,
                                    .seq_of_token = seq_of,
                                    .positions = pos,
                                    .max_position = lens[B - 1] - 1,
                                    .cache_dtype = sh.bf16 ? CTRL_BF16 : CTRL_F32};
    CHECK_MSG(paged->paged_forward(&pa) == CTRL_OK, "%s", ctrl_error_message());
    double worst = 0;
    for (int i = 0; i < n * H * D; i++) worst = fmax(worst, fabs((double)got[i] - ref[i]));
    CHECK_MSG(worst <= 1e-5, "H %d HK %d D %d window %d block %d last_only %d bf16 %d: max error %.3g", H, HK,
              D, sh.window, bs, sh.last_only, sh.bf16, worst);
    /* a table entry outside the pool is refused, not read */
    const int last = 2 * max_blocks + (lens[2] - 1) / bs, saved = tables[last];
    tables[last] = n_blocks;
    CHECK_EQ_INT(paged->paged_forward(&pa), CTRL_ERR_RUNTIME);
    CHECK(strstr(ctrl_error_message(), "block table") != NULL);
    tables[last] = saved;
    free(q), free(k), free(v), free(want), free(lse), free(order), free(tables), free(kc), free(vc),
        free(seq_of), free(pos), free(qs), free(got), free(ref);
}

TEST(paged_equals_flash_over_shuffled_blocks) {
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_attention_ops *paged = find(reg, "paged"), *flash = find(reg, "flash");
    if (!paged || !flash) return;
    static const shape shapes[] = {
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
