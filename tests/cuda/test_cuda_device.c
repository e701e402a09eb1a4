/* The CUDA device layer and first kernels against CPU references, on fresh random inputs with
 * outputs poisoned (NaN) before each run. Skips, saying why, where no GPU or no CUDA build exists. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_ops.h"
#include "test.h"

static int have_gpu(void) {
    static int checked = -1;
    if (checked < 0) {
        checked = ctrl_cuda_device_count() > 0;
        if (checked) {
            /* After the runtime's first call: our shutdown then runs before its teardown. */
            atexit(ctrl_cuda_shutdown);
            char name[256];
            ctrl_cuda_device_name(0, name, sizeof name);
            printf("  device 0: %s\n", name);
        }
    }
    return checked;
}

#define NEED_GPU()                                                                                           \
    do {                                                                                                     \
        if (!have_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());                                          \
    } while (0)

static uint64_t rng;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* bf16 round to nearest even, as __float2bfloat16_rn (finite inputs). */
static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float f32_of(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

TEST(allocator_caches_and_counts) {
    NEED_GPU();
    ctrl_cuda_mem_stats s0, s1, s2;
    ctrl_cuda_empty_cache();
    ctrl_cuda_mem_stats_get(&s0);
    void *a, *b, *c;
    CHECK_EQ_INT(ctrl_cuda_malloc(&a, 1000), CTRL_OK);
    CHECK_EQ_INT(ctrl_cuda_malloc(&b, 3u << 20), CTRL_OK);
    ctrl_cuda_mem_stats_get(&s1);
    CHECK(s1.current - s0.current == 1024 + (4u << 20)); /* size classes: 512 B, then 2 MiB */
    CHECK(s1.driver_allocs == s0.driver_allocs + 2);
    ctrl_cuda_free(a);
    ctrl_cuda_free(b);
    /* The same sizes again: served from the cache, no new driver allocation. */
    for (int step = 0; step < 10; step++) {
        CHECK_EQ_INT(ctrl_cuda_malloc(&a, 1000), CTRL_OK);
        CHECK_EQ_INT(ctrl_cuda_malloc(&b, 3u << 20), CTRL_OK);
        CHECK_EQ_INT(ctrl_cuda_malloc(&c, 900), CTRL_OK); /* same class as 1000, but a is in use */
        ctrl_cuda_free(c);
        ctrl_cuda_free(b);
        ctrl_cuda_free(a);
    }
    ctrl_cuda_mem_stats_get(&s2);
    CHECK_EQ_INT(s2.driver_allocs, s1.driver_allocs + 1); /* only c's first allocation */
    CHECK_EQ_INT(s2.current, s0.current);
    CHECK(s2.peak >= s0.current + 1024 * 2 + (4u << 20));
    ctrl_cuda_empty_cache();
    ctrl_cuda_mem_stats_get(&s2);
    CHECK_EQ_INT(s2.reserved, s2.current);
}

TEST(bf16_conversion_matches_cpu_rounding) {
    NEED_GPU();
    const int64_t n = 100003;
    float *h = malloc(n * 4), *back = malloc(n * 4);
    uint16_t *hb = malloc(n * 2);
    for (int64_t i = 0; i < n; i++) h[i] = frand() * 100.0f;
    float *d;
    uint16_t *db;
    CHECK_EQ_INT(ctrl_cuda_malloc((void **)&d, n * 4), CTRL_OK);
    CHECK_EQ_INT(ctrl_cuda_malloc((void **)&db, n * 2), CTRL_OK);
    CHECK_EQ_INT(ctrl_cuda_memcpy_h2d(d, h, n * 4), CTRL_OK);
    CHECK_EQ_INT(ctrl_cuda_memset(db, 0xff, n * 2), CTRL_OK);
    CHECK_EQ_INT(ctrl_cuda_f32_to_bf16(db, d, n), CTRL_OK);
    CHECK_EQ_INT(ctrl_cuda_memcpy_d2h(hb, db, n * 2), CTRL_OK);
    long mismatches = 0;
    for (int64_t i = 0; i < n; i++) mismatches += hb[i] != bf16_of(h[i]);
    CHECK_EQ_INT(mismatches, 0);
    CHECK_EQ_INT(ctrl_cuda_memset(d, 0xff, n * 4), CTRL_OK);
    CHECK_EQ_INT(ctrl_cuda_bf16_to_f32(d, db, n), CTRL_OK);
    CHECK_EQ_INT(ctrl_cuda_memcpy_d2h(back, d, n * 4), CTRL_OK);
    mismatches = 0;
    for (int64_t i = 0; i < n; i++) mismatches += back[i] != f32_of(hb[i]);
    CHECK_EQ_INT(mismatches, 0);
    ctrl_cuda_free(d);
    ctrl_cuda_free(db);
    free(h), free(back), free(hb);
}

/* out = x W^T + b in double, the reference for both precisions. */
static void linear_ref(double *out, const float *x, const float *w, const float *bias, int T, int IN,
                       int OUT) {
    for (int t = 0; t < T; t++)
        for (int o = 0; o < OUT; o++) {
            double s = bias ? bias[o] : 0;
            for (int i = 0; i < IN; i++) s += (double)x[(size_t)t * IN + i] * w[(size_t)o * IN + i];
            out[(size_t)t * OUT + o] = s;
        }
}

static double rel(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i])) return INFINITY;
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / den);
}

TEST(linear_fp32_and_bf16_vs_reference) {
    NEED_GPU();
    static const int shapes[][3] = {{37, 130, 96}, {64, 896, 1000}, {5, 896, 4864}, {129, 4864, 896}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int T = shapes[s][0], IN = shapes[s][1], OUT = shapes[s][2];
        size_t nx = (size_t)T * IN, nw = (size_t)OUT * IN, no = (size_t)T * OUT;
        float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc(OUT * 4), *out = malloc(no * 4);
        double *ref = malloc(no * 8);
        for (size_t i = 0; i < nx; i++) x[i] = frand();
        for (size_t i = 0; i < nw; i++) w[i] = frand() * 0.05f;
        for (int i = 0; i < OUT; i++) b[i] = frand();
        float *dx, *dw, *db, *dout;
        CHECK_EQ_INT(ctrl_cuda_malloc((void **)&dx, nx * 4), CTRL_OK);
        CHECK_EQ_INT(ctrl_cuda_malloc((void **)&dw, nw * 4), CTRL_OK);
        CHECK_EQ_INT(ctrl_cuda_malloc((void **)&db, OUT * 4), CTRL_OK);
        CHECK_EQ_INT(ctrl_cuda_malloc((void **)&dout, no * 4), CTRL_OK);
        ctrl_cuda_memcpy_h2d(dx, x, nx * 4);
        ctrl_cuda_memcpy_h2d(dw, w, nw * 4);
        ctrl_cuda_memcpy_h2d(db, b, OUT * 4);
        /* fp32 with bias */
        ctrl_cuda_memset(dout, 0xff, no * 4);
        CHECK_MSG(ctrl_cuda_linear_forward_f32(dout, dx, dw, db, T, IN, OUT) == CTRL_OK, "%s",
                  ctrl_error_message());
        CHECK_EQ_INT(ctrl_cuda_memcpy_d2h(out, dout, no * 4), CTRL_OK);
        linear_ref(ref, x, w, b, T, IN, OUT);
        double e32 = rel(out, ref, no);
        CHECK_MSG(e32 <= 1e-5, "fp32 linear %dx%dx%d: rel error %.3g", T, IN, OUT, e32);
        /* bf16: inputs rounded to bf16, reference on the rounded values, output rounded once */
        uint16_t *bx, *bw, *bo;
        CHECK_EQ_INT(ctrl_cuda_malloc((void **)&bx, nx * 2), CTRL_OK);
        CHECK_EQ_INT(ctrl_cuda_malloc((void **)&bw, nw * 2), CTRL_OK);
        CHECK_EQ_INT(ctrl_cuda_malloc((void **)&bo, no * 2), CTRL_OK);
        ctrl_cuda_f32_to_bf16(bx, dx, (int64_t)nx);
        ctrl_cuda_f32_to_bf16(bw, dw, (int64_t)nw);
        ctrl_cuda_memset(bo, 0xff, no * 2);
        CHECK_MSG(ctrl_cuda_linear_forward_bf16(bo, bx, bw, T, IN, OUT) == CTRL_OK, "%s",
                  ctrl_error_message());
        ctrl_cuda_memset(dout, 0xff, no * 4);
        ctrl_cuda_bf16_to_f32(dout, bo, (int64_t)no);
        CHECK_EQ_INT(ctrl_cuda_memcpy_d2h(out, dout, no * 4), CTRL_OK);
        for (size_t i = 0; i < nx; i++) x[i] = f32_of(bf16_of(x[i]));
        for (size_t i = 0; i < nw; i++) w[i] = f32_of(bf16_of(w[i]));
        linear_ref(ref, x, w, NULL, T, IN, OUT);
        double e16 = rel(out, ref, no);
        CHECK_MSG(e16 <= 1e-2, "bf16 linear %dx%dx%d: rel error %.3g", T, IN, OUT, e16);
        printf("  linear T=%d IN=%d OUT=%d: fp32 rel %.2e, bf16 rel %.2e\n", T, IN, OUT, e32, e16);
        ctrl_cuda_free(dx), ctrl_cuda_free(dw), ctrl_cuda_free(db), ctrl_cuda_free(dout);
        ctrl_cuda_free(bx), ctrl_cuda_free(bw), ctrl_cuda_free(bo);
        free(x), free(w), free(b), free(out), free(ref);
    }
}

TEST(no_device_is_a_clear_error) {
    if (have_gpu()) {
        CHECK_EQ_INT(ctrl_cuda_set_device(ctrl_cuda_device_count()), CTRL_ERR_DEVICE);
        CHECK_CONTAINS(ctrl_error_message(), "CUDA device");
    } else {
        void *p;
        CHECK(ctrl_cuda_malloc(&p, 16) != CTRL_OK);
        CHECK(ctrl_cuda_set_device(0) != CTRL_OK);
        CHECK(ctrl_cuda_unavailable_reason()[0] != '\0');
        printf("  no GPU here: %s\n", ctrl_cuda_unavailable_reason());
    }
}

__attribute__((constructor)) static void seed(void) { rng = test_fresh_seed(); }
