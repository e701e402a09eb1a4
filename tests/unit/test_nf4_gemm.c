/* QLoRA's products with NF4 weights (kernels/cpu/gemm_nf4.c), W dequantized a tile at a time inside
 * the GEMM, against dequantize-the-whole-weight-then-multiply (what the model did before, and what
 * transformers' bitsandbytes Linear4bit does): odd shapes (K not a multiple of 64, partial NF4 blocks
 * at the edges, an odd count of values, more than 256 blocks so the double quantization's second
 * scale is used, weights wider than one band of the fp32 path). The values are bit for bit; the bf16
 * products (the same blocked GEMM, B's panels packed from the nibbles) are bit for bit too where
 * that GEMM runs both (AVX-512 BF16, T > 4, and not decoding's few-row NF4 kernel: T <= 8 on rows
 * that start on blocks of 64, checked on its own within float rounding); the fp32 products
 * (cblas_sgemm a band of rows at a time) and the rest within 1e-6 relative (the order of the sums). And the
 * products' memory: a product with Qwen2.5-0.5B's widest weight (4864 x 896) raises the peak RSS by far less
 * than that weight dequantized (17 MiB). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "model/nf4.h"
#include "test.h"

static float *randn(int64_t n, uint64_t seed, float scale) {
    float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = ((float)(s >> 40) / 16777216.0f - 0.5f) * scale * (i % 53 == 0 ? 6.0f : 1.0f);
    }
    return v;
}

typedef struct case_w {
    ctrl_nf4 q;
    ctrl_nf4_ref ref;
    float *deq; /* the whole weight dequantized, for the reference products */
} case_w;

static void make(case_w *c, int IN, int OUT, uint64_t seed) {
    const int64_t n = (int64_t)IN * OUT;
    float *w = randn(n, seed, 0.2f);
    CHECK_EQ_INT(ctrl_nf4_quantize(w, n, &c->q), CTRL_OK);
    float *absmax = malloc(sizeof(float) * (size_t)((n + 63) / 64));
    c->deq = malloc(sizeof(float) * (size_t)n);
    ctrl_nf4_absmax(&c->q, absmax);
    ctrl_nf4_dequantize(&c->q, absmax, c->deq);
    c->ref = (ctrl_nf4_ref){
        c->q.packed, c->q.qabsmax, c->q.absmax2, c->q.offset, ctrl_nf4_code, ctrl_nf4_dynamic_code, n, 0};
    free(absmax), free(w);
}

static void drop(case_w *c) {
    ctrl_nf4_free(&c->q);
    free(c->deq);
}

/* Any run of values, from any start (odd ones, across blocks of 64 and of 256 blocks). */
TEST(nf4_values_equal_the_whole_dequantization_bit_for_bit) {
    case_w c;
    make(&c, 151, 129, 7); /* 19,479 values: 305 blocks, an odd count */
    const int64_t n = c.ref.n;
    float got[200];
    int bad = 0;
    for (int64_t i = 0; i < n; i += 37)
        for (int len = 1; len <= 200 && i + len <= n; len += 41) {
            ctrl_cpu_nf4_values(&c.ref, i, len, got);
            bad += memcmp(got, c.deq + i, sizeof(float) * (size_t)len) != 0;
        }
    ctrl_cpu_nf4_values(&c.ref, n - 3, 3, got); /* the last, half-filled byte */
    bad += memcmp(got, c.deq + n - 3, sizeof(float) * 3) != 0;
    float *all = malloc(sizeof(float) * (size_t)n); /* the backend op's form */
    CHECK_EQ_INT(ctrl_nf4_dequantize_raw(all, c.q.packed, c.q.qabsmax, c.q.absmax2, c.q.offset, ctrl_nf4_code,
                                         ctrl_nf4_dynamic_code, n),
                 CTRL_OK);
    bad += memcmp(all, c.deq, sizeof(float) * (size_t)n) != 0;
    CHECK_EQ_INT(bad, 0);
    free(all);
    drop(&c);
}

/* the bf16 products bit for bit: the blocked GEMM on both sides (not the 1-4 row path of
 * ctrl_cpu_gemm_bf16, nor the few-row NF4 kernel, whose sums run in other orders) */
static int exact_bf16(int T, int IN) { return ctrl_cpu_has_avx512bf16() && T > 4 && (T > 8 || IN % 64); }

static void check_shape(int T, int IN, int OUT, uint64_t seed) {
    case_w c;
    make(&c, IN, OUT, seed);
    float *x = randn((int64_t)T * IN, seed + 1, 2.0f), *dout = randn((int64_t)T * OUT, seed + 2, 1.0f),
          *bias = randn(OUT, seed + 3, 1.0f);
    float *got = malloc(sizeof(float) * (size_t)T * (IN > OUT ? IN : OUT)),
          *want = malloc(sizeof(float) * (size_t)T * (IN > OUT ? IN : OUT));
    for (int bf16 = 0; bf16 < 2; bf16++) {
        const int exact = bf16 && exact_bf16(T, IN);
        /* forward: x W^T + bias */
        CHECK_EQ_INT(ctrl_cpu_nf4_linear_forward(got, x, &c.ref, bias, T, IN, OUT, bf16), 0);
        if (bf16)
            CHECK_EQ_INT(ctrl_cpu_linear_forward_bf16(want, x, c.deq, bias, T, IN, OUT, 0), 0);
        else
            ctrl_cpu_linear_forward(want, x, c.deq, bias, T, IN, OUT);
        if (exact)
            CHECK_MSG(!memcmp(got, want, sizeof(float) * (size_t)T * OUT), "bf16 forward %dx%dx%d", T, IN,
                      OUT);
        CHECK_REL(got, want, (long)T * OUT, 1e-6);
        /* backward: dout W */
        CHECK_EQ_INT(ctrl_cpu_nf4_linear_backward(got, dout, &c.ref, T, IN, OUT, bf16), 0);
        if (bf16)
            CHECK_EQ_INT(ctrl_cpu_linear_backward_bf16(want, NULL, NULL, dout, x, c.deq, T, IN, OUT, 0), 0);
        else
            ctrl_cpu_linear_backward(want, NULL, NULL, dout, x, c.deq, T, IN, OUT);
        if (exact)
            CHECK_MSG(!memcmp(got, want, sizeof(float) * (size_t)T * IN), "bf16 backward %dx%dx%d", T, IN,
                      OUT);
        CHECK_REL(got, want, (long)T * IN, 1e-6);
    }
    CHECK_EQ_INT(ctrl_cpu_nf4_linear_forward(got, x, &c.ref, NULL, T, IN + 1, OUT, 0),
                 -2); /* not w's shape */
    free(x), free(dout), free(bias), free(got), free(want);
    drop(&c);
}

TEST(nf4_products_equal_dequantize_then_gemm_on_odd_shapes) {
    check_shape(5, 70, 37, 11);     /* K = 70: blocks of 64 straddle rows; a partial last block */
    check_shape(3, 71, 37, 12);     /* an odd count of values (the last byte half used); T <= 4 */
    check_shape(17, 200, 90, 13);   /* 282 blocks: two double-quantization scales */
    check_shape(33, 130, 300, 14);  /* wider than one 48-column panel, several groups of 16 */
    check_shape(9, 700, 500, 15);   /* 350,000 values: more than one 1 MiB band of the fp32 path */
    check_shape(64, 896, 128, 16);  /* Qwen2.5-0.5B's k/v projection, 64 tokens: the vector decoder */
    check_shape(230, 1100, 60, 17); /* rows past a row block (B packed a block at a time, not panel by
                                     * panel), depth past a depth block */
}

/* A row block of a fused weight quantized whole (QLoRA on Phi-3's qkv_proj / gate_up_proj, as
 * bitsandbytes quantizes the one nn.Linear): the products with rows [r0, r0 + rows) read the values
 * from first = r0 IN on, blocks of 64 straddling the block's first and last rows (IN = 70, odd
 * starts), against dequantize-the-whole-tensor-then-multiply-the-rows. */
TEST(nf4_products_of_a_fused_row_block_equal_its_dequantized_rows) {
    static const int blocks[][2] = {{0, 40}, {40, 24}, {64, 13}, {77, 23}}; /* q, k, v, ...: rows 100 */
    const int IN = 70, T = 9;
    case_w c;
    make(&c, IN, 100, 21);
    float *x = randn((int64_t)T * IN, 22, 2.0f), *dout = randn((int64_t)T * 40, 23, 1.0f),
          *got = malloc(sizeof(float) * T * IN), *want = malloc(sizeof(float) * T * IN);
    for (int b = 0; b < 4; b++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const int r0 = blocks[b][0], OUT = blocks[b][1];
            ctrl_nf4_ref r = c.ref;
            r.first = (int64_t)r0 * IN, r.n = (int64_t)OUT * IN;
            const float *rows = c.deq + (size_t)r0 * IN;
            CHECK_EQ_INT(ctrl_cpu_nf4_linear_forward(got, x, &r, NULL, T, IN, OUT, bf16), 0);
            if (bf16)
                CHECK_EQ_INT(ctrl_cpu_linear_forward_bf16(want, x, rows, NULL, T, IN, OUT, 0), 0);
            else
                ctrl_cpu_linear_forward(want, x, rows, NULL, T, IN, OUT);
            CHECK_REL(got, want, (long)T * OUT, 1e-6);
            CHECK_EQ_INT(ctrl_cpu_nf4_linear_backward(got, dout, &r, T, IN, OUT, bf16), 0);
            if (bf16)
                CHECK_EQ_INT(ctrl_cpu_linear_backward_bf16(want, NULL, NULL, dout, x, rows, T, IN, OUT, 0),
                             0);
            else
                ctrl_cpu_linear_backward(want, NULL, NULL, dout, x, rows, T, IN, OUT);
            CHECK_REL(got, want, (long)T * IN, 1e-6);
            float v[70];
            ctrl_cpu_nf4_values(&r, (int64_t)(OUT - 1) * IN, IN, v); /* the block's last row, bit for bit */
            CHECK(!memcmp(v, rows + (size_t)(OUT - 1) * IN, sizeof v));
        }
    free(x), free(dout), free(got), free(want);
    drop(&c);
}

/* Decoding's few rows (T <= 8) in bf16: where W's rows start on blocks of 64 (IN and the row
 * block's first value multiples of 64) the product takes gemm_nf4.c's few-row kernel (no packing;
 * its sums run along IN, so within float rounding of the blocked GEMM's, not bit for bit): every T
 * from 1 to 9 (9: the packed path), an odd number of output rows (the last row alone), a row block of
 * a fused weight that starts on a block (first = 3 x 128), against dequantize-then-multiply. */
TEST(nf4_few_rows_agree_with_dequantize_then_gemm) {
    static const int shapes[][3] = {{64, 37, 0}, {896, 131, 0}, {128, 20, 3}}; /* IN, OUT, first row */
    for (int s = 0; s < 3; s++) {
        const int IN = shapes[s][0], OUT = shapes[s][1], r0 = shapes[s][2];
        case_w c;
        make(&c, IN, OUT + r0, 31 + (uint64_t)s);
        ctrl_nf4_ref r = c.ref;
        r.first = (int64_t)r0 * IN, r.n = (int64_t)OUT * IN;
        float *x = randn((int64_t)9 * IN, 41 + (uint64_t)s, 2.0f), *bias = randn(OUT, 51, 1.0f);
        float *got = malloc(sizeof(float) * 9 * (size_t)OUT), *want = malloc(sizeof(float) * 9 * (size_t)OUT);
        for (int T = 1; T <= 9; T++) {
            CHECK_EQ_INT(ctrl_cpu_nf4_linear_forward(got, x, &r, bias, T, IN, OUT, 1), 0);
            CHECK_EQ_INT(ctrl_cpu_linear_forward_bf16(want, x, c.deq + (size_t)r0 * IN, bias, T, IN, OUT, 0),
                         0);
            CHECK_MSG(test_rel_error_f32(got, want, (long)T * OUT) <= 1e-5, "T %d IN %d OUT %d: rel %.3g", T,
                      IN, OUT, test_rel_error_f32(got, want, (long)T * OUT));
            for (int i = 0; i < T * OUT; i++) /* every element, not the norm alone */
                if (fabsf(got[i] - want[i]) > 1e-4f * (1.0f + fabsf(want[i]))) {
                    CHECK_MSG(0, "T %d IN %d OUT %d: element %d %g vs %g", T, IN, OUT, i, got[i], want[i]);
                    break;
                }
        }
        free(x), free(bias), free(got), free(want);
        drop(&c);
    }
}

/* The peak resident memory a process has had, in KiB (VmHWM), or -1. */
static long peak_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) v = atol(line + 6);
    if (f) fclose(f);
    return v;
}

/* Resets VmHWM to the current RSS (Linux's clear_refs 5); 0 where it cannot. */
static int reset_peak(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    const int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

TEST(nf4_product_never_holds_the_dequantized_weight) {
    if (TEST_UNDER_ASAN) TEST_SKIP("AddressSanitizer's quarantine and shadow memory blur the resident size");
    const int T = 8, IN = 896, OUT = 4864; /* gate_proj: 17 MiB dequantized */
    case_w c;
    make(&c, IN, OUT, 21);
    free(c.deq), c.deq = NULL;
    float *x = randn((int64_t)T * IN, 22, 1.0f), *out = malloc(sizeof(float) * (size_t)T * OUT),
          *dout = randn((int64_t)T * OUT, 23, 1.0f), *dx = malloc(sizeof(float) * (size_t)T * IN);
    for (int bf16 = 0; bf16 < 2; bf16++) { /* once to warm the GEMMs' own buffers (OpenBLAS's) */
        CHECK_EQ_INT(ctrl_cpu_nf4_linear_forward(out, x, &c.ref, NULL, T, IN, OUT, bf16), 0);
        CHECK_EQ_INT(ctrl_cpu_nf4_linear_backward(dx, dout, &c.ref, T, IN, OUT, bf16), 0);
    }
    const long weight_kib = (long)(sizeof(float) * (size_t)IN * OUT / 1024);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        if (!reset_peak()) TEST_SKIP("no /proc/self/clear_refs to reset the peak RSS");
        const long before = peak_kib();
        CHECK_EQ_INT(ctrl_cpu_nf4_linear_forward(out, x, &c.ref, NULL, T, IN, OUT, bf16), 0);
        CHECK_EQ_INT(ctrl_cpu_nf4_linear_backward(dx, dout, &c.ref, T, IN, OUT, bf16), 0);
        const long rise = peak_kib() - before;
        CHECK_MSG(rise < weight_kib / 3, "%s: the peak RSS rose %ld KiB (the weight dequantized: %ld KiB)",
                  bf16 ? "bf16" : "fp32", rise, weight_kib);
    }
    CHECK(ctrl_cpu_nf4_scratch_bytes(T, IN, OUT, 0) <= ((size_t)1 << 20) + 4 * (size_t)IN);
    free(x), free(out), free(dout), free(dx);
    drop(&c);
}
