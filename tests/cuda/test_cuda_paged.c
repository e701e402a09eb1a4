/* The paged plugin's CUDA path against its CPU path: the same pools (fp32 and bf16), shuffled block
 * tables, queries at every position and at the last one of sequences of 1 to 1500 tokens, GQA
 * groups of 1, 4 and 8, head_dim 64 and 128, with and without a sliding window; outputs poisoned
 * with NaN before the run; max abs difference <= 1e-4. Skips, saying why, without a GPU or a CUDA
 * build. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/attention.h>

#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "test.h"
#include "test_registry.h"

#ifdef CTRL_HAVE_CUDA

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void *to_device(const void *h, size_t bytes) {
    void *d = NULL;
    if (ctrl_cuda_malloc(&d, bytes ? bytes : 4) != CTRL_OK) return NULL;
    ctrl_cuda_memcpy_h2d(d, h, bytes);
    return d;
}

typedef struct shape {
    int H, HK, D, window, block, last_only, bf16;
} shape;

static void check_shape(const ctrl_attention_ops *paged, shape sh) {
    enum { B = 4 };
    const int lens[B] = {1, 37, 500, 1500}, H = sh.H, HK = sh.HK, D = sh.D, bs = sh.block;
    int max_blocks = 0, n_blocks = 2, n = 0;
    for (int b = 0; b < B; b++) {
        const int nb = (lens[b] + bs - 1) / bs;
        max_blocks = nb > max_blocks ? nb : max_blocks, n_blocks += nb;
        n += sh.last_only ? 1 : lens[b];
    }
    const size_t slot = (size_t)HK * D, pool = (size_t)n_blocks * bs * slot, elt = sh.bf16 ? 2 : 4;
    float *kf = malloc(sizeof(float) * pool), *vf = malloc(sizeof(float) * pool);
    for (size_t i = 0; i < pool; i++) kf[i] = frand(), vf[i] = frand();
    void *kc = malloc(pool * elt), *vc = malloc(pool * elt);
    if (sh.bf16)
        ctrl_cpu_f32_to_bf16(kc, kf, (int64_t)pool), ctrl_cpu_f32_to_bf16(vc, vf, (int64_t)pool);
    else
        memcpy(kc, kf, pool * 4), memcpy(vc, vf, pool * 4);
    int32_t *order = malloc(sizeof(int32_t) * n_blocks), *tables = calloc((size_t)B * max_blocks, 4);
    for (int i = 0; i < n_blocks; i++) order[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        const int j = (int)((frand() + 1.0f) * 0.5f * i), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    int32_t *seq_of = malloc(sizeof(int32_t) * n), *pos = malloc(sizeof(int32_t) * n);
    for (int b = 0, next = 0, t = 0; b < B; b++) {
        for (int i = 0; i < (lens[b] + bs - 1) / bs; i++) tables[b * max_blocks + i] = order[next++];
        for (int p = sh.last_only ? lens[b] - 1 : 0; p < lens[b]; p++, t++) seq_of[t] = b, pos[t] = p;
    }
    float *q = malloc(sizeof(float) * n * H * D), *want = malloc(sizeof(float) * n * H * D),
          *got = malloc(sizeof(float) * n * H * D);
    for (int i = 0; i < n * H * D; i++) q[i] = frand();
    ctrl_paged_attention_args a = {.size = sizeof a,
                                   .device = {CTRL_DEVICE_CPU, 0},
                                   .dtype = CTRL_F32,
                                   .n_tokens = n,
                                   .n_seqs = B,
                                   .n_head = H,
                                   .n_kv_head = HK,
                                   .head_dim = D,
                                   .scale = 1.0f / sqrtf((float)D),
                                   .window = sh.window,
                                   .q = q,
                                   .out = want,
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
    CHECK_MSG(paged->paged_forward(&a) == CTRL_OK, "cpu: %s", ctrl_error_message());
    ctrl_paged_attention_args d = a;
    d.device = (ctrl_device){CTRL_DEVICE_CUDA, 0};
    d.q = to_device(q, sizeof(float) * n * H * D), d.k_cache = to_device(kc, pool * elt),
    d.v_cache = to_device(vc, pool * elt), d.block_tables = to_device(tables, 4 * (size_t)B * max_blocks),
    d.seq_of_token = to_device(seq_of, 4 * (size_t)n), d.positions = to_device(pos, 4 * (size_t)n);
    void *out = NULL;
    CHECK_EQ_INT(ctrl_cuda_malloc(&out, sizeof(float) * n * H * D), CTRL_OK);
    ctrl_cuda_memset(out, 0xff, sizeof(float) * n * H * D); /* NaN */
    d.out = out;
    CHECK_MSG(paged->paged_forward(&d) == CTRL_OK, "cuda: %s", ctrl_error_message());
    CHECK_EQ_INT(ctrl_cuda_synchronize(), CTRL_OK);
    ctrl_cuda_memcpy_d2h(got, out, sizeof(float) * n * H * D);
    double worst = 0;
    for (int i = 0; i < n * H * D; i++)
        worst = isfinite(got[i]) ? fmax(worst, fabs((double)got[i] - want[i])) : INFINITY;
    CHECK_MSG(worst <= 1e-4, "H %d HK %d D %d window %d block %d last_only %d bf16 %d: max error %.3g", H, HK,
              D, sh.window, bs, sh.last_only, sh.bf16, worst);
    printf("  H %2d/%d D %3d window %3d block %2d %s %s cache: %d queries, max error %.2g\n", H, HK, D,
           sh.window, bs, sh.last_only ? "decode " : "prefill", sh.bf16 ? "bf16" : "fp32", n, worst);
    ctrl_cuda_free((void *)d.q), ctrl_cuda_free((void *)d.k_cache), ctrl_cuda_free((void *)d.v_cache),
        ctrl_cuda_free((void *)d.block_tables), ctrl_cuda_free((void *)d.seq_of_token),
        ctrl_cuda_free((void *)d.positions), ctrl_cuda_free(out);
    free(kf), free(vf), free(kc), free(vc), free(order), free(tables), free(seq_of), free(pos), free(q),
        free(want), free(got);
}

TEST(paged_cuda_matches_cpu) {
    if (ctrl_cuda_device_count() <= 0) TEST_SKIP(ctrl_cuda_unavailable_reason());
    atexit(ctrl_cuda_shutdown);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "paged");
    CHECK(e != NULL);
    if (!e) return;
    static const shape shapes[] = {
        {8, 8, 64, 0, 16, 1, 0},    {8, 2, 64, 0, 16, 0, 0}, {32, 4, 128, 0, 16, 1, 0},
        {16, 2, 128, 100, 8, 0, 0}, {8, 2, 64, 0, 16, 1, 1}, {32, 4, 128, 64, 16, 0, 1},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(e->plugin->ops, shapes[i]);
    ctrl_registry_destroy(reg);
}

#else

TEST(paged_cuda) { TEST_SKIP("built without CUDA"); }

#endif
