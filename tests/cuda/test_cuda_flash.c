/* The flash plugin's CUDA paths (the fused tensor-core kernels, the GEMM path, the tiled SIMT
 * kernels, each forced by CTRL_FLASH_PATH) against its CPU path (fp32) on fresh random inputs over
 * a grid of shapes: sequence lengths from 1 to 1000 (non-multiples of every tile), several sequences per
 * batch, GQA ratios 1, 4 and 8, head_dim 16, 64 and 128, causal with and without a sliding window.
 * fp32 <= 1e-5 relative; bf16 (inputs rounded to bf16, the CPU reference run on the same rounded
 * values) <= 1e-2; outputs, lse and gradients poisoned with NaN before each run. Forward and the
 * whole backward (dq, dk, dv). Skips, saying why, without a GPU or a CUDA build. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ctrl/attention.h>

#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "device/cuda_backend.h"
#include "registry/registry.h"
#include "test.h"
#include "test_registry.h"

#ifdef CTRL_HAVE_CUDA

static uint64_t rng;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* Host fp32 data as the device dtype: fp32 as is, bf16 rounded (and *h rounded in place, so the
 * CPU reference sees the same values). */
static void *upload(float *h, size_t n, ctrl_dtype dt) {
    void *d = NULL;
    const size_t esz = dt == CTRL_BF16 ? 2 : 4;
    if (ctrl_cuda_malloc(&d, n * esz) != CTRL_OK) return NULL;
    if (dt == CTRL_BF16) {
        uint16_t *b = malloc(n * 2);
        ctrl_cpu_f32_to_bf16(b, h, (int64_t)n);
        ctrl_cpu_bf16_to_f32(h, b, (int64_t)n);
        ctrl_cuda_memcpy_h2d(d, b, n * 2);
        free(b);
    } else {
        ctrl_cuda_memcpy_h2d(d, h, n * 4);
    }
    return d;
}
static void *poisoned(size_t bytes) {
    void *d = NULL;
    if (ctrl_cuda_malloc(&d, bytes) != CTRL_OK) return NULL;
    ctrl_cuda_memset(d, 0xff, bytes);
    return d;
}
static float *download(const void *d, size_t n, ctrl_dtype dt) {
    float *h = malloc(n * 4);
    if (dt == CTRL_BF16) {
        uint16_t *b = malloc(n * 2);
        ctrl_cuda_memcpy_d2h(b, d, n * 2);
        ctrl_cpu_bf16_to_f32(h, b, (int64_t)n);
        free(b);
    } else {
        ctrl_cuda_memcpy_d2h(h, d, n * 4);
    }
    return h;
}

typedef struct shape {
    int n_seqs, lens[4], H, HK, D, window;
} shape;

/* compute_bf16: fp32 tensors whose products the plugin may take in bf16 (the model's autocast). */
static void run(const ctrl_attention_ops *ops, const shape *s, ctrl_dtype dt, int compute_bf16) {
    int32_t cu[5] = {0};
    for (int b = 0; b < s->n_seqs; b++) cu[b + 1] = cu[b] + s->lens[b];
    const int T = cu[s->n_seqs], H = s->H, HK = s->HK, D = s->D;
    const size_t nq = (size_t)T * H * D, nk = (size_t)T * HK * D, esz = dt == CTRL_BF16 ? 2 : 4;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    for (size_t i = 0; i < nq; i++) q[i] = frand(), dout[i] = frand();
    for (size_t i = 0; i < nk; i++) k[i] = frand(), v[i] = frand();
    void *dq_in = upload(q, nq, dt), *dk_in = upload(k, nk, dt), *dv_in = upload(v, nk, dt);
    void *ddout = upload(dout, nq, dt);
    int32_t *dcu = NULL;
    ctrl_cuda_malloc((void **)&dcu, sizeof cu);
    ctrl_cuda_memcpy_h2d(dcu, cu, sizeof cu);
    void *dout_ = poisoned(nq * esz), *dgq = poisoned(nq * esz), *dgk = poisoned(nk * esz),
         *dgv = poisoned(nk * esz);
    float *dlse = poisoned((size_t)H * T * 4);
    ctrl_attention_args a = {.size = sizeof a,
                             .device = {CTRL_DEVICE_CUDA, 0},
                             .dtype = dt,
                             .n_seqs = s->n_seqs,
                             .cu_seqlens = dcu,
                             .cu_seqlens_host = cu,
                             .total_tokens = T,
                             .n_head = H,
                             .n_kv_head = HK,
                             .head_dim = D,
                             .scale = 1.0f / sqrtf((float)D),
                             .causal = 1,
                             .window = s->window,
                             .q = dq_in,
                             .k = dk_in,
                             .v = dv_in,
                             .out = dout_,
                             .lse = dlse,
                             .dout = ddout,
                             .dq = dgq,
                             .dk = dgk,
                             .dv = dgv,
                             .deterministic = 1,
                             .compute_bf16 = compute_bf16};
    CHECK_EQ_INT(ops->forward(&a, NULL), CTRL_OK);
    CHECK_EQ_INT(ops->backward(&a, NULL), CTRL_OK);
    CHECK_EQ_INT(ctrl_cuda_synchronize(), CTRL_OK);
    /* the CPU path on the same (rounded) values */
    float *o = malloc(nq * 4), *lse = malloc((size_t)H * T * 4), *gq = malloc(nq * 4), *gk = malloc(nk * 4),
          *gv = malloc(nk * 4);
    ctrl_attention_args c = a;
    c.device = (ctrl_device){CTRL_DEVICE_CPU, 0}, c.dtype = CTRL_F32, c.cu_seqlens = cu;
    c.q = q, c.k = k, c.v = v, c.out = o, c.lse = lse, c.dout = dout, c.dq = gq, c.dk = gk, c.dv = gv;
    CHECK_EQ_INT(ops->forward(&c, NULL), CTRL_OK);
    CHECK_EQ_INT(ops->backward(&c, NULL), CTRL_OK);
    const double tol = dt == CTRL_BF16 || compute_bf16 ? 1e-2 : 1e-5;
    struct {
        const char *name;
        const void *dev;
        const float *ref;
        size_t n;
        ctrl_dtype dt;
    } outs[] = {{"out", dout_, o, nq, dt},
                {"lse", dlse, lse, (size_t)H * T, CTRL_F32},
                {"dq", dgq, gq, nq, dt},
                {"dk", dgk, gk, nk, dt},
                {"dv", dgv, gv, nk, dt}};
    for (int i = 0; i < 5; i++) {
        float *h = download(outs[i].dev, outs[i].n, outs[i].dt);
        const double e = test_rel_error_f32(h, outs[i].ref, (long)outs[i].n);
        /* A gradient that is zero in exact arithmetic (dq and dk when each query sees one key: the
         * softmax is constant) is rounding noise in the reference (~1e-7), so a relative error
         * means nothing there: such outputs pass when they are within 1e-6 absolutely. */
        double worst = 0;
        for (size_t z = 0; z < outs[i].n; z++) worst = fmax(worst, fabs((double)h[z] - outs[i].ref[z]));
        CHECK_MSG(e <= tol || worst <= 1e-6,
                  "%s%s %s: T %d (%d seqs) H %d/%d D %d window %d: relative error %.3g (worst abs %.3g)",
                  ctrl_dtype_name(dt), compute_bf16 ? " (bf16 products)" : "", outs[i].name, T, s->n_seqs, H,
                  HK, D, s->window, e, worst);
        free(h);
    }
    ctrl_cuda_free(dq_in), ctrl_cuda_free(dk_in), ctrl_cuda_free(dv_in), ctrl_cuda_free(ddout),
        ctrl_cuda_free(dcu);
    ctrl_cuda_free(dout_), ctrl_cuda_free(dgq), ctrl_cuda_free(dgk), ctrl_cuda_free(dgv),
        ctrl_cuda_free(dlse);
    free(q), free(k), free(v), free(dout), free(o), free(lse), free(gq), free(gk), free(gv);
}

TEST(flash_cuda_matches_cpu) {
    if (ctrl_cuda_device_count() <= 0) TEST_SKIP(ctrl_cuda_unavailable_reason());
    atexit(ctrl_cuda_shutdown);
    /* selected as a run selects it, so that the host lends the plugin the device GEMM */
    ctrl_device dev;
    const ctrl_cuda_backend *backend;
    CHECK_EQ_INT(ctrl_device_select("cuda", &dev, &backend), CTRL_OK);
    const ctrl_device_kernels *k = ctrl_host_table()->device_kernels(dev);
    CHECK(k != NULL && k->gemm != NULL);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash");
    CHECK(e != NULL);
    if (!e) return;
    static const shape shapes[] = {
        {1, {1}, 4, 4, 64, 0},          {1, {97}, 8, 2, 128, 0},
        {3, {1, 65, 200}, 8, 1, 64, 0}, {2, {300, 17}, 4, 4, 128, 0},
        {2, {129, 64}, 8, 8, 16, 0},    {1, {1000}, 8, 1, 128, 0},
        {2, {250, 90}, 4, 1, 64, 37},   {4, {33, 2, 511, 5}, 16, 2, 64, 0},
    };
    const int small = getenv("CTRL_TEST_SMALL") != NULL, n_all = (int)(sizeof shapes / sizeof shapes[0]);
    /* every CUDA path, forced by CTRL_FLASH_PATH: the fused tensor-core kernels (bf16 products at
     * head_dim 64 and 128: the default there), the GEMM path (the default elsewhere when the core
     * lends a GEMM), the tiled SIMT kernels */
    static const char *paths[] = {"mma", "gemm", "tiled"};
    for (int pi = 0; pi < 3; pi++) {
        const int mma = pi == 0;
        setenv("CTRL_FLASH_PATH", paths[pi], 1);
        int ran = 0;
        for (int i = 0; i < n_all; i++) {
            /* small (the emulator): the first three shapes, and for mma also the windowed GQA one */
            if (small && i >= 3 && !(mma && shapes[i].window > 0)) continue;
            if (mma && shapes[i].D != 64 && shapes[i].D != 128) continue;
            if (!mma) run(e->plugin->ops, &shapes[i], CTRL_F32, 0);
            run(e->plugin->ops, &shapes[i], CTRL_F32, 1);
            run(e->plugin->ops, &shapes[i], CTRL_BF16, 0);
            ran++;
        }
        printf(
            "  %s path: %d shapes x {%sfp32 with bf16 products, bf16}: out, lse, dq, dk, dv against the CPU "
            "path\n",
            paths[pi], ran, mma ? "" : "fp32, ");
    }
    unsetenv("CTRL_FLASH_PATH");
    ctrl_registry_destroy(reg);
}

/* CTRL_FLASH_PATH=mma where the tensor-core kernels cannot run (fp32 products, head_dim 16) is
 * refused with an error naming the variable and the reason, not silently run another way; an
 * unknown value is refused too. */
TEST(flash_cuda_path_switch_refuses) {
    if (ctrl_cuda_device_count() <= 0) TEST_SKIP(ctrl_cuda_unavailable_reason());
    ctrl_device dev;
    const ctrl_cuda_backend *backend;
    CHECK_EQ_INT(ctrl_device_select("cuda", &dev, &backend), CTRL_OK);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash");
    CHECK(e != NULL);
    if (!e) return;
    const ctrl_attention_ops *ops = e->plugin->ops;
    int32_t cu[2] = {0, 4}, *dcu = NULL;
    ctrl_cuda_malloc((void **)&dcu, sizeof cu);
    ctrl_cuda_memcpy_h2d(dcu, cu, sizeof cu);
    void *buf = poisoned(4 * 2 * 64 * 4);
    float *lse = poisoned(2 * 4 * 4);
    ctrl_attention_args a = {.size = sizeof a,
                             .device = {CTRL_DEVICE_CUDA, 0},
                             .dtype = CTRL_F32,
                             .n_seqs = 1,
                             .cu_seqlens = dcu,
                             .cu_seqlens_host = cu,
                             .total_tokens = 4,
                             .n_head = 2,
                             .n_kv_head = 2,
                             .head_dim = 64,
                             .scale = 0.125f,
                             .causal = 1,
                             .q = buf,
                             .k = buf,
                             .v = buf,
                             .out = buf,
                             .lse = lse};
    setenv("CTRL_FLASH_PATH", "mma", 1);
    CHECK_EQ_INT(ops->forward(&a, NULL), CTRL_ERR_UNSUPPORTED);
    CHECK(strstr(ctrl_error_message(), "CTRL_FLASH_PATH=mma") != NULL);
    CHECK(strstr(ctrl_error_message(), "bf16") != NULL);
    a.dtype = CTRL_BF16, a.head_dim = 16;
    CHECK_EQ_INT(ops->forward(&a, NULL), CTRL_ERR_UNSUPPORTED);
    CHECK(strstr(ctrl_error_message(), "head_dim") != NULL);
    setenv("CTRL_FLASH_PATH", "fastest", 1);
    CHECK_EQ_INT(ops->forward(&a, NULL), CTRL_ERR_CONFIG);
    CHECK(strstr(ctrl_error_message(), "CTRL_FLASH_PATH=fastest") != NULL);
    unsetenv("CTRL_FLASH_PATH");
    ctrl_cuda_free(dcu), ctrl_cuda_free(buf), ctrl_cuda_free(lse);
    ctrl_registry_destroy(reg);
}

/* The forward's output under CTRL_FLASH_PATH=path (NULL: unset, the automatic choice), as raw
 * bytes (out then lse), for a bf16 or fp32 batch at head_dim D. */
static unsigned char *forward_bytes(const ctrl_attention_ops *ops, const char *path, ctrl_dtype dt, int D,
                                    size_t *bytes) {
    int32_t cu[3] = {0, 70, 103}, *dcu = NULL;
    const int T = 103, H = 4, HK = 2;
    const size_t nq = (size_t)T * H * D, nk = (size_t)T * HK * D, esz = dt == CTRL_BF16 ? 2 : 4;
    const uint64_t saved = rng; /* the same inputs for every path; the seeded sequence goes on after */
    rng = 0x1234567u;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
    for (size_t i = 0; i < nq; i++) q[i] = frand();
    for (size_t i = 0; i < nk; i++) k[i] = frand(), v[i] = frand();
    void *dq = upload(q, nq, dt), *dk = upload(k, nk, dt), *dv = upload(v, nk, dt),
         *dout = poisoned(nq * esz);
    float *dlse = poisoned((size_t)H * T * 4);
    ctrl_cuda_malloc((void **)&dcu, sizeof cu);
    ctrl_cuda_memcpy_h2d(dcu, cu, sizeof cu);
    ctrl_attention_args a = {.size = sizeof a,
                             .device = {CTRL_DEVICE_CUDA, 0},
                             .dtype = dt,
                             .n_seqs = 2,
                             .cu_seqlens = dcu,
                             .cu_seqlens_host = cu,
                             .total_tokens = T,
                             .n_head = H,
                             .n_kv_head = HK,
                             .head_dim = D,
                             .scale = 1.0f / sqrtf((float)D),
                             .causal = 1,
                             .q = dq,
                             .k = dk,
                             .v = dv,
                             .out = dout,
                             .lse = dlse};
    if (path)
        setenv("CTRL_FLASH_PATH", path, 1);
    else
        unsetenv("CTRL_FLASH_PATH");
    CHECK_EQ_INT(ops->forward(&a, NULL), CTRL_OK);
    unsetenv("CTRL_FLASH_PATH");
    *bytes = nq * esz + (size_t)H * T * 4;
    unsigned char *h = malloc(*bytes);
    ctrl_cuda_memcpy_d2h(h, dout, nq * esz);
    ctrl_cuda_memcpy_d2h(h + nq * esz, dlse, (size_t)H * T * 4);
    ctrl_cuda_free(dq), ctrl_cuda_free(dk), ctrl_cuda_free(dv), ctrl_cuda_free(dout), ctrl_cuda_free(dlse),
        ctrl_cuda_free(dcu);
    free(q), free(k), free(v);
    rng = saved;
    return h;
}

/* With CTRL_FLASH_PATH unset, bf16 at head_dim 64 runs the tensor-core kernels (bit for bit what
 * CTRL_FLASH_PATH=mma gives, and not what the GEMM path gives), and head_dim 16, which they cannot
 * run, the GEMM path. */
TEST(flash_cuda_default_path) {
    if (ctrl_cuda_device_count() <= 0) TEST_SKIP(ctrl_cuda_unavailable_reason());
    ctrl_device dev;
    const ctrl_cuda_backend *backend;
    CHECK_EQ_INT(ctrl_device_select("cuda", &dev, &backend), CTRL_OK);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash");
    CHECK(e != NULL);
    if (!e) return;
    const ctrl_attention_ops *ops = e->plugin->ops;
    size_t n1, n2, n3;
    unsigned char *dflt = forward_bytes(ops, NULL, CTRL_BF16, 64, &n1),
                  *mma = forward_bytes(ops, "mma", CTRL_BF16, 64, &n2),
                  *gemm = forward_bytes(ops, "gemm", CTRL_BF16, 64, &n3);
    CHECK(n1 == n2 && memcmp(dflt, mma, n1) == 0);
    CHECK_MSG(memcmp(dflt, gemm, n1) != 0, "bf16 at head_dim 64 ran the GEMM path by default");
    free(dflt), free(mma), free(gemm);
    dflt = forward_bytes(ops, NULL, CTRL_BF16, 16, &n1),
    gemm = forward_bytes(ops, "gemm", CTRL_BF16, 16, &n2);
    CHECK(n1 == n2 && memcmp(dflt, gemm, n1) == 0);
    free(dflt), free(gemm);
    ctrl_registry_destroy(reg);
}

__attribute__((constructor)) static void seed(void) {
    rng = (uint64_t)time(NULL) * 6364136223846793005ull | 1;
    printf("  seed %llu\n", (unsigned long long)rng);
}

#else

TEST(flash_cuda) { TEST_SKIP("built without CUDA"); }

#endif
