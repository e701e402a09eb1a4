/* The flash plugin's CUDA paths (the fused tensor-core kernels, the GEMM path, the tiled SIMT
 * kernels, each forced by CTRL_FLASH_PATH) against its CPU path (fp32) on fresh random inputs over
 * a grid of shapes: sequence lengths from 1 to 1000 (non-multiples of every tile), several sequences per
 * batch, GQA ratios 1, 4 and 8, head_dim 16, 64 and 128, causal with and without a sliding window.
 * fp32 <= 1e-5 relative; bf16 (inputs rounded to bf16, the CPU reference run on the same rounded
 * values) <= 1e-2; outputs, lse and gradients poisoned with NaN before each run. Forward and the
 * whole backward (dq, dk, dv). Each path again with Gemma 2's logit soft-capping against the CPU's
 * eager attention. Skips, saying why, without a GPU or a CUDA build. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/attention.h>

#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "device/cuda_backend.h"
#include "flash_args.h"
#include "registry/registry.h"
#include "test.h"
#include "test_registry.h"

#ifdef CTRL_HAVE_CUDA

static uint64_t rng;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* Host fp32 data into device buffer d as the device dtype: fp32 as is, bf16 rounded (and *h rounded
 * in place, so the CPU reference sees the same values). */
static void put(void *d, float *h, size_t n, ctrl_dtype dt) {
    if (dt == CTRL_BF16) {
        uint16_t *b = malloc(n * 2);
        ctrl_cpu_f32_to_bf16(b, h, (int64_t)n);
        ctrl_cpu_bf16_to_f32(h, b, (int64_t)n);
        ctrl_cuda_memcpy_h2d(d, b, n * 2);
        free(b);
    } else {
        ctrl_cuda_memcpy_h2d(d, h, n * 4);
    }
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

/* compute_bf16: fp32 tensors whose products the plugin may take in bf16 (the model's autocast);
 * softcap: Gemma 2's attn_logit_softcapping (0: none), the reference then `ref`'s CPU path (eager). */
static void run_capped(const ctrl_attention_ops *ops, const shape *s, ctrl_dtype dt, int compute_bf16,
                       float softcap, const ctrl_attention_ops *ref) {
    int32_t cu[5] = {0};
    for (int b = 0; b < s->n_seqs; b++) cu[b + 1] = cu[b] + s->lens[b];
    const int T = cu[s->n_seqs], H = s->H, HK = s->HK, D = s->D;
    const size_t nq = (size_t)T * H * D, nk = (size_t)T * HK * D;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    for (size_t i = 0; i < nq; i++) q[i] = frand(), dout[i] = frand();
    for (size_t i = 0; i < nk; i++) k[i] = frand(), v[i] = frand();
    flash_bufs b;
    CHECK_EQ_INT(flash_bufs_alloc(&b, cu, s->n_seqs, H, HK, D, dt), CTRL_OK);
    put(b.q, q, nq, dt), put(b.k, k, nk, dt), put(b.v, v, nk, dt), put(b.dout, dout, nq, dt);
    ctrl_attention_args a = flash_args(&b, cu, s->n_seqs, H, HK, D, dt, s->window);
    a.compute_bf16 = compute_bf16, a.softcap = softcap;
    CHECK_EQ_INT(ops->forward(&a, NULL), CTRL_OK);
    CHECK_EQ_INT(ops->backward(&a, NULL), CTRL_OK);
    CHECK_EQ_INT(ctrl_cuda_synchronize(), CTRL_OK);
    /* the CPU path on the same (rounded) values */
    float *o = malloc(nq * 4), *lse = malloc((size_t)H * T * 4), *gq = malloc(nq * 4), *gk = malloc(nk * 4),
          *gv = malloc(nk * 4);
    ctrl_attention_args c = a;
    c.device = (ctrl_device){CTRL_DEVICE_CPU, 0}, c.dtype = CTRL_F32, c.cu_seqlens = cu;
    c.q = q, c.k = k, c.v = v, c.out = o, c.lse = lse, c.dout = dout, c.dq = gq, c.dk = gk, c.dv = gv;
    CHECK_EQ_INT(ref->forward(&c, NULL), CTRL_OK);
    CHECK_EQ_INT(ref->backward(&c, NULL), CTRL_OK);
    const double tol = dt == CTRL_BF16 || compute_bf16 ? 1e-2 : 1e-5;
    struct {
        const char *name;
        const void *dev;
        const float *ref;
        size_t n;
        ctrl_dtype dt;
    } outs[] = {{"out", b.out, o, nq, dt},
                {"lse", b.lse, lse, (size_t)H * T, CTRL_F32},
                {"dq", b.dq, gq, nq, dt},
                {"dk", b.dk, gk, nk, dt},
                {"dv", b.dv, gv, nk, dt}};
    for (int i = 0; i < 5; i++) {
        float *h = download(outs[i].dev, outs[i].n, outs[i].dt);
        const double e = test_rel_error_f32(h, outs[i].ref, (long)outs[i].n);
        /* A gradient that is zero in exact arithmetic (dq and dk when each query sees one key: the
         * softmax is constant) is rounding noise in the reference (~1e-7), so a relative error
         * means nothing there: such outputs pass when they are within 1e-6 absolutely. The lse is a
         * logarithm: an error d in it is a relative error d in the softmax's normaliser, so it passes
         * within tol absolutely too (with one key per query it is a single score, often near zero,
         * where a relative error over a few heads is the bf16 rounding of q.k divided by chance). */
        double worst = 0;
        for (size_t z = 0; z < outs[i].n; z++) worst = fmax(worst, fabs((double)h[z] - outs[i].ref[z]));
        const int is_lse = outs[i].ref == lse;
        CHECK_MSG(e <= tol || worst <= 1e-6 || (is_lse && worst <= tol),
                  "%s%s %s: T %d (%d seqs) H %d/%d D %d window %d softcap %g: relative error %.3g (worst abs "
                  "%.3g)",
                  ctrl_dtype_name(dt), compute_bf16 ? " (bf16 products)" : "", outs[i].name, T, s->n_seqs, H,
                  HK, D, s->window, (double)softcap, e, worst);
        free(h);
    }
    flash_bufs_free(&b);
    free(q), free(k), free(v), free(dout), free(o), free(lse), free(gq), free(gk), free(gv);
}

static void run(const ctrl_attention_ops *ops, const shape *s, ctrl_dtype dt, int compute_bf16) {
    run_capped(ops, s, dt, compute_bf16, 0, ops);
}

/* The attention plugin `name` from the test registry, with the CUDA device selected as a run selects
 * it (so that the host lends the plugin the device GEMM); NULL (a failed check) when missing. */
static const ctrl_attention_ops *plugin_on_device(ctrl_registry *reg, const char *name) {
    ctrl_device dev;
    const ctrl_cuda_backend *backend;
    CHECK_EQ_INT(ctrl_device_select("cuda", &dev, &backend), CTRL_OK);
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, name);
    CHECK_MSG(e != NULL, "no %s plugin", name);
    return e ? e->plugin->ops : NULL;
}

TEST(flash_cuda_matches_cpu) {
    if (ctrl_cuda_device_count() <= 0) TEST_SKIP(ctrl_cuda_unavailable_reason());
    atexit(ctrl_cuda_shutdown);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_attention_ops *ops = plugin_on_device(reg, "flash");
    const ctrl_device_kernels *k = ctrl_host_table()->device_kernels((ctrl_device){CTRL_DEVICE_CUDA, 0});
    CHECK(k != NULL && k->gemm != NULL);
    if (!ops) return;
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
            if (!mma) run(ops, &shapes[i], CTRL_F32, 0);
            run(ops, &shapes[i], CTRL_F32, 1);
            run(ops, &shapes[i], CTRL_BF16, 0);
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

/* Gemma 2's logit soft-capping on every CUDA path (cap 0.5, so that it bends these scores) against
 * the eager plugin's CPU path with the same cap (whose backward the CPU's finite differences check,
 * tests/attention/test_attention.c): forward, lse and the whole backward, fp32 (where the path
 * takes fp32 products), fp32 with bf16 products and bf16, at two small shapes (GQA, several
 * sequences, a sliding window). */
TEST(flash_cuda_softcap_matches_cpu_eager) {
    if (ctrl_cuda_device_count() <= 0) TEST_SKIP(ctrl_cuda_unavailable_reason());
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_attention_ops *ops = plugin_on_device(reg, "flash"), *eager = plugin_on_device(reg, "eager");
    if (!ops || !eager) return;
    static const shape shapes[] = {{3, {1, 65, 90}, 8, 2, 64, 0}, {2, {70, 33}, 4, 1, 128, 37}};
    static const char *paths[] = {"mma", "gemm", "tiled"};
    for (int pi = 0; pi < 3; pi++) {
        setenv("CTRL_FLASH_PATH", paths[pi], 1);
        for (int i = 0; i < 2; i++) {
            if (pi > 0) run_capped(ops, &shapes[i], CTRL_F32, 0, 0.5f, eager);
            run_capped(ops, &shapes[i], CTRL_F32, 1, 0.5f, eager);
            run_capped(ops, &shapes[i], CTRL_BF16, 0, 0.5f, eager);
        }
        printf("  %s path, soft-capped (0.5): 2 shapes, out, lse, dq, dk, dv against the CPU's eager\n",
               paths[pi]);
    }
    unsetenv("CTRL_FLASH_PATH");
    ctrl_registry_destroy(reg);
}

/* CTRL_FLASH_PATH=mma where the tensor-core kernels cannot run (fp32 products, head_dim 16) is
 * refused with an error naming the variable and the reason, not silently run another way; an
 * unknown value is refused too. */
TEST(flash_cuda_path_switch_refuses) {
    if (ctrl_cuda_device_count() <= 0) TEST_SKIP(ctrl_cuda_unavailable_reason());
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_attention_ops *ops = plugin_on_device(reg, "flash");
    if (!ops) return;
    const int32_t cu[2] = {0, 4};
    flash_bufs b;
    CHECK_EQ_INT(flash_bufs_alloc(&b, cu, 1, 2, 2, 64, CTRL_F32), CTRL_OK);
    ctrl_attention_args a = flash_args(&b, cu, 1, 2, 2, 64, CTRL_F32, 0);
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
    flash_bufs_free(&b);
    ctrl_registry_destroy(reg);
}

/* The forward's output under CTRL_FLASH_PATH=path (NULL: unset, the automatic choice), as raw
 * bytes (out then lse), for a bf16 or fp32 batch at head_dim D. */
static unsigned char *forward_bytes(const ctrl_attention_ops *ops, const char *path, ctrl_dtype dt, int D,
                                    size_t *bytes) {
    const int32_t cu[3] = {0, 70, 103};
    const int T = 103, H = 4, HK = 2;
    const size_t nq = (size_t)T * H * D, nk = (size_t)T * HK * D, esz = dt == CTRL_BF16 ? 2 : 4;
    const uint64_t saved = rng; /* the same inputs for every path; the seeded sequence goes on after */
    rng = 0x1234567u;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
    for (size_t i = 0; i < nq; i++) q[i] = frand();
    for (size_t i = 0; i < nk; i++) k[i] = frand(), v[i] = frand();
    flash_bufs b;
    CHECK_EQ_INT(flash_bufs_alloc(&b, cu, 2, H, HK, D, dt), CTRL_OK);
    put(b.q, q, nq, dt), put(b.k, k, nk, dt), put(b.v, v, nk, dt);
    const ctrl_attention_args a = flash_args(&b, cu, 2, H, HK, D, dt, 0);
    if (path)
        setenv("CTRL_FLASH_PATH", path, 1);
    else
        unsetenv("CTRL_FLASH_PATH");
    CHECK_EQ_INT(ops->forward(&a, NULL), CTRL_OK);
    unsetenv("CTRL_FLASH_PATH");
    *bytes = nq * esz + (size_t)H * T * 4;
    unsigned char *h = malloc(*bytes);
    ctrl_cuda_memcpy_d2h(h, b.out, nq * esz);
    ctrl_cuda_memcpy_d2h(h + nq * esz, b.lse, (size_t)H * T * 4);
    flash_bufs_free(&b);
    free(q), free(k), free(v);
    rng = saved;
    return h;
}

/* With CTRL_FLASH_PATH unset, bf16 at head_dim 64 runs the tensor-core kernels (bit for bit what
 * CTRL_FLASH_PATH=mma gives, and not what the GEMM path gives), and head_dim 16, which they cannot
 * run, the GEMM path. */
TEST(flash_cuda_default_path) {
    if (ctrl_cuda_device_count() <= 0) TEST_SKIP(ctrl_cuda_unavailable_reason());
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_attention_ops *ops = plugin_on_device(reg, "flash");
    if (!ops) return;
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

__attribute__((constructor)) static void seed(void) { rng = test_fresh_seed(); }

#else

TEST(flash_cuda) { TEST_SKIP("built without CUDA"); }

#endif
