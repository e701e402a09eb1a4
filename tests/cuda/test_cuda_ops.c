/* Every CUDA op against its CPU reference (kernels/cpu), on fresh random inputs, outputs poisoned
 * with NaN before each run so that unwritten elements fail. fp32 tolerance: relative L2 error
 * <= 1e-5. Sizes include non-multiples of the block shapes. CTRL_TEST_SMALL=1 shrinks them for
 * compute-sanitizer runs. Skips, saying why, without a GPU or a CUDA build. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "device/cuda_backend.h"
#include "test.h"

#ifdef CTRL_HAVE_CUDA

static uint64_t rng;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static float *hrand(size_t n, float scale) {
    float *x = malloc(n * 4);
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}
static void *dev_copy(const void *h, size_t bytes) {
    void *d = NULL;
    if (ctrl_cuda_malloc(&d, bytes) != CTRL_OK) return NULL;
    ctrl_cuda_memcpy_h2d(d, h, bytes);
    return d;
}
static void *dev_poisoned(size_t bytes) {
    void *d = NULL;
    if (ctrl_cuda_malloc(&d, bytes) != CTRL_OK) return NULL;
    ctrl_cuda_memset(d, 0xff, bytes);
    return d;
}
static float *host_of(const void *d, size_t n) {
    float *h = malloc(n * 4);
    if (ctrl_cuda_memcpy_d2h(h, d, n * 4) != CTRL_OK) memset(h, 0xff, n * 4);
    return h;
}
static int small(void) { return getenv("CTRL_TEST_SMALL") != NULL; }

/* The cache and library handles go back before the runtime's own teardown (atexit runs in reverse
 * order, and the runtime registers its teardown at its first call), so the sanitizer's leak check
 * sees only real leaks. */
static int need_gpu(void) {
    static int state = -1;
    if (state < 0) {
        state = ctrl_cuda_device_count() > 0;
        if (state) atexit(ctrl_cuda_shutdown);
    }
    return state;
}
#define NEED_GPU()                                                                                           \
    do {                                                                                                     \
        if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());                                          \
    } while (0)

/* Compares a device result with a host reference; frees the downloaded copy. */
#define EXPECT_DEV(dptr, ref, n, tol, what)                                                                  \
    do {                                                                                                     \
        float *h_ = host_of((dptr), (n));                                                                    \
        double e_ = test_rel_error_f32(h_, (ref), (long)(n));                                                \
        CHECK_MSG(e_ <= (tol), "%s: relative error %.3g vs CPU", (what), e_);                                \
        free(h_);                                                                                            \
    } while (0)

TEST(rmsnorm) {
    NEED_GPU();
    static const int shapes[][2] = {{37, 896}, {300, 130}, {1, 4864}};
    for (int s = 0; s < 3; s++) {
        int T = shapes[s][0], C = shapes[s][1];
        size_t n = (size_t)T * C;
        float *x = hrand(n, 2), *w = hrand(C, 1), *dy = hrand(n, 1), *dw0 = hrand(C, 1);
        float *out = malloc(n * 4), *rstd = malloc(T * 4), *dx = malloc(n * 4), *dw = malloc(C * 4);
        memcpy(dw, dw0, C * 4);
        ctrl_cpu_rmsnorm_forward(out, rstd, x, w, T, C, 1e-6f);
        ctrl_cpu_rmsnorm_backward(dx, dw, dy, x, w, rstd, T, C);
        float *d_x = dev_copy(x, n * 4), *d_w = dev_copy(w, C * 4), *d_dy = dev_copy(dy, n * 4);
        float *d_dw = dev_copy(dw0, C * 4), *d_out = dev_poisoned(n * 4), *d_rstd = dev_poisoned(T * 4);
        float *d_dx = dev_poisoned(n * 4);
        CHECK_EQ_INT(ctrl_cuda_rmsnorm_forward(d_out, d_rstd, d_x, d_w, T, C, 1e-6f), CTRL_OK);
        CHECK_EQ_INT(ctrl_cuda_rmsnorm_backward(d_dx, d_dw, d_dy, d_x, d_w, d_rstd, T, C), CTRL_OK);
        EXPECT_DEV(d_out, out, n, 1e-5, "rmsnorm out");
        EXPECT_DEV(d_rstd, rstd, T, 1e-5, "rmsnorm rstd");
        EXPECT_DEV(d_dx, dx, n, 1e-5, "rmsnorm dx");
        EXPECT_DEV(d_dw, dw, C, 1e-5, "rmsnorm dw (accumulated)");
        ctrl_cuda_free(d_x), ctrl_cuda_free(d_w), ctrl_cuda_free(d_dy), ctrl_cuda_free(d_dw);
        ctrl_cuda_free(d_out), ctrl_cuda_free(d_rstd), ctrl_cuda_free(d_dx);
        free(x), free(w), free(dy), free(dw0), free(out), free(rstd), free(dx), free(dw);
    }
}

TEST(linear_backward_and_gemm) {
    NEED_GPU();
    static const int shapes[][3] = {{37, 130, 96}, {129, 896, 4864}, {5, 4864, 896}};
    for (int s = 0; s < 3; s++) {
        int T = shapes[s][0], IN = shapes[s][1], OUT = shapes[s][2];
        size_t nx = (size_t)T * IN, nw = (size_t)OUT * IN, no = (size_t)T * OUT;
        float *x = hrand(nx, 1), *w = hrand(nw, 0.05f), *dy = hrand(no, 1), *dw0 = hrand(nw, 1),
              *db0 = hrand(OUT, 1);
        float *dx = malloc(nx * 4), *dw = malloc(nw * 4), *db = malloc(OUT * 4);
        memcpy(dw, dw0, nw * 4), memcpy(db, db0, OUT * 4);
        ctrl_cpu_linear_backward(dx, dw, db, dy, x, w, T, IN, OUT);
        float *d_x = dev_copy(x, nx * 4), *d_w = dev_copy(w, nw * 4), *d_dy = dev_copy(dy, no * 4);
        float *d_dw = dev_copy(dw0, nw * 4), *d_db = dev_copy(db0, OUT * 4), *d_dx = dev_poisoned(nx * 4);
        CHECK_MSG(ctrl_cuda_linear_backward_f32(d_dx, d_dw, d_db, d_dy, d_x, d_w, T, IN, OUT) == CTRL_OK,
                  "%s", ctrl_error_message());
        EXPECT_DEV(d_dx, dx, nx, 1e-5, "linear dx");
        EXPECT_DEV(d_dw, dw, nw, 1e-5, "linear dw (accumulated)");
        EXPECT_DEV(d_db, db, OUT, 1e-5, "linear dbias (accumulated)");
        ctrl_cuda_free(d_x), ctrl_cuda_free(d_w), ctrl_cuda_free(d_dy), ctrl_cuda_free(d_dw),
            ctrl_cuda_free(d_db);
        ctrl_cuda_free(d_dx);
        free(x), free(w), free(dy), free(dw0), free(db0), free(dx), free(dw), free(db);
    }
}

TEST(swiglu_residual_scale_sum_squares) {
    NEED_GPU();
    const int64_t n = small() ? 1001 : 1000003;
    float *g = hrand(n, 4), *u = hrand(n, 2), *dy = hrand(n, 1), *a0 = hrand(n, 1), *b0 = hrand(n, 1);
    float *out = malloc(n * 4), *dg = malloc(n * 4), *du = malloc(n * 4), *ra = malloc(n * 4),
          *rb = malloc(n * 4);
    ctrl_cpu_swiglu_forward(out, g, u, n);
    ctrl_cpu_swiglu_backward(dg, du, dy, g, u, n);
    float *d_g = dev_copy(g, n * 4), *d_u = dev_copy(u, n * 4), *d_dy = dev_copy(dy, n * 4);
    float *d_out = dev_poisoned(n * 4), *d_dg = dev_poisoned(n * 4), *d_du = dev_poisoned(n * 4);
    CHECK_EQ_INT(ctrl_cuda_swiglu_forward(d_out, d_g, d_u, n), CTRL_OK);
    CHECK_EQ_INT(ctrl_cuda_swiglu_backward(d_dg, d_du, d_dy, d_g, d_u, n), CTRL_OK);
    EXPECT_DEV(d_out, out, n, 1e-5, "swiglu out");
    EXPECT_DEV(d_dg, dg, n, 1e-5, "swiglu dgate");
    EXPECT_DEV(d_du, du, n, 1e-5, "swiglu dup");
    /* residual: forward into a poisoned buffer, backward accumulates into both branches */
    memcpy(ra, a0, n * 4), memcpy(rb, b0, n * 4);
    ctrl_cpu_residual_forward(out, g, u, n);
    ctrl_cpu_residual_backward(ra, rb, dy, n);
    float *d_a = dev_copy(a0, n * 4), *d_b = dev_copy(b0, n * 4);
    ctrl_cuda_memset(d_out, 0xff, n * 4);
    CHECK_EQ_INT(ctrl_cuda_residual_forward(d_out, d_g, d_u, n), CTRL_OK);
    CHECK_EQ_INT(ctrl_cuda_residual_backward(d_a, d_b, d_dy, n), CTRL_OK);
    EXPECT_DEV(d_out, out, n, 1e-6, "residual out");
    EXPECT_DEV(d_a, ra, n, 1e-6, "residual da");
    EXPECT_DEV(d_b, rb, n, 1e-6, "residual db");
    double want = ctrl_cpu_sum_squares(g, n), got = -1;
    CHECK_EQ_INT(ctrl_cuda_sum_squares(d_g, n, &got), CTRL_OK);
    CHECK_MSG(fabs(got - want) <= 1e-9 * want, "sum of squares %.17g vs %.17g", got, want);
    ctrl_cpu_scale(g, 0.37f, n);
    CHECK_EQ_INT(ctrl_cuda_scale(d_g, 0.37f, n), CTRL_OK);
    EXPECT_DEV(d_g, g, n, 1e-7, "scale");
    ctrl_cuda_free(d_g), ctrl_cuda_free(d_u), ctrl_cuda_free(d_dy), ctrl_cuda_free(d_out),
        ctrl_cuda_free(d_dg);
    ctrl_cuda_free(d_du), ctrl_cuda_free(d_a), ctrl_cuda_free(d_b);
    free(g), free(u), free(dy), free(a0), free(b0), free(out), free(dg), free(du), free(ra), free(rb);
}

/* DoRA's per-row ops (kernels/cuda/dora.cu): the norms of W + s B A and the scalings magnitude / norm,
 * the output's combination with and without a dropped-out base and a bias, and the magnitude's
 * gradient with the in-place scaled upstream gradients; OUT not a multiple of the 8 rows a block. */
TEST(dora_rows) {
    NEED_GPU();
    const int T = small() ? 7 : 300, OUT = small() ? 37 : 1003, IN = small() ? 45 : 777, r = 5;
    const size_t n = (size_t)T * OUT;
    float *W = hrand((size_t)OUT * IN, 0.3f), *B = hrand((size_t)OUT * r, 0.5f),
          *A = hrand((size_t)r * IN, 0.3f), *mag = hrand(OUT, 1), *bias = hrand(OUT, 1);
    float *WA = calloc((size_t)OUT * r, 4), *AA = calloc((size_t)r * r, 4), *BG = calloc((size_t)OUT * r, 4);
    ctrl_cpu_linear_forward(WA, W, A, NULL, OUT, IN, r); /* W A^T, A A^T, B (A A^T): what dora.c passes */
    ctrl_cpu_linear_forward(AA, A, A, NULL, r, IN, r);
    ctrl_cpu_linear_forward(BG, B, AA, NULL, OUT, r, r);
    float *norm = malloc(OUT * 4), *g = malloc(OUT * 4);
    ctrl_cpu_dora_norm(norm, g, W, B, WA, BG, mag, 1.7f, OUT, IN, r);
    float *d_W = dev_copy(W, (size_t)OUT * IN * 4), *d_B = dev_copy(B, (size_t)OUT * r * 4),
          *d_WA = dev_copy(WA, (size_t)OUT * r * 4), *d_BG = dev_copy(BG, (size_t)OUT * r * 4),
          *d_mag = dev_copy(mag, OUT * 4), *d_bias = dev_copy(bias, OUT * 4);
    float *d_norm = dev_poisoned(OUT * 4), *d_g = dev_poisoned(OUT * 4);
    CHECK_EQ_INT(ctrl_cuda_dora_norm(d_norm, d_g, d_W, d_B, d_WA, d_BG, d_mag, 1.7f, OUT, IN, r), CTRL_OK);
    EXPECT_DEV(d_norm, norm, OUT, 1e-6, "dora norm");
    EXPECT_DEV(d_g, g, OUT, 1e-6, "dora magnitude / norm");
    for (int j = 0; j < OUT; j++) mag[j] *= 2, g[j] = mag[j] / norm[j]; /* the norms kept, scalings only */
    ctrl_cuda_memcpy_h2d(d_mag, mag, OUT * 4);
    CHECK_EQ_INT(ctrl_cuda_dora_norm(d_norm, d_g, NULL, NULL, NULL, NULL, d_mag, 0, OUT, IN, r), CTRL_OK);
    EXPECT_DEV(d_g, g, OUT, 1e-6, "dora scalings over held norms");
    float *out = hrand(n, 1), *yl = hrand(n, 1), *yb = hrand(n, 1), *dout = hrand(n, 1),
          *dmag = hrand(OUT, 1);
    float *d_yl = dev_copy(yl, n * 4), *d_yb = dev_copy(yb, n * 4), *d_dout = dev_copy(dout, n * 4);
    for (int with = 0; with < 3; with++) { /* dropped-out base; out - bias; out */
        float *o = malloc(n * 4);
        memcpy(o, out, n * 4);
        float *d_out = dev_copy(out, n * 4);
        ctrl_cpu_dora_combine(o, yl, with == 0 ? yb : NULL, with == 1 ? bias : NULL, g, T, OUT);
        CHECK_EQ_INT(ctrl_cuda_dora_combine(d_out, d_yl, with == 0 ? d_yb : NULL, with == 1 ? d_bias : NULL,
                                            d_g, T, OUT),
                     CTRL_OK);
        EXPECT_DEV(d_out, o, n, 1e-6, "dora combine");
        ctrl_cuda_free(d_out), free(o);
    }
    float *d_dmag = dev_copy(dmag, OUT * 4);
    ctrl_cpu_dora_backward(dmag, yl, yb, dout, norm, g, T, OUT);
    CHECK_EQ_INT(ctrl_cuda_dora_backward(d_dmag, d_yl, d_yb, d_dout, d_norm, d_g, T, OUT), CTRL_OK);
    EXPECT_DEV(d_dmag, dmag, OUT, 1e-6, "dora magnitude gradient");
    EXPECT_DEV(d_yl, yl, n, 1e-6, "dora g dout");
    EXPECT_DEV(d_yb, yb, n, 1e-6, "dora (g - 1) dout");
    float *fs[] = {d_W, d_B, d_WA, d_BG, d_mag, d_bias, d_norm, d_g, d_yl, d_yb, d_dout, d_dmag};
    for (size_t i = 0; i < sizeof fs / sizeof *fs; i++) ctrl_cuda_free(fs[i]);
    free(W), free(B), free(A), free(AA), free(WA), free(BG), free(mag), free(bias), free(norm), free(g),
        free(out), free(yl), free(yb), free(dout), free(dmag);
}

TEST(embedding_and_rope) {
    NEED_GPU();
    const int T = 37, C = 130, V = 50, H = 3, D = 64, max_pos = 4096;
    int32_t tok[37], pos[37];
    for (int t = 0; t < T; t++)
        tok[t] = (int32_t)((t * 7) % 11), pos[t] = t < 20 ? t : (t - 20) * 97; /* repeats, restarts */
    float *wte = hrand((size_t)V * C, 1), *dy = hrand((size_t)T * C, 1), *dwte0 = hrand((size_t)V * C, 1);
    float *out = malloc((size_t)T * C * 4), *dwte = malloc((size_t)V * C * 4);
    memcpy(dwte, dwte0, (size_t)V * C * 4);
    ctrl_cpu_embedding_forward(out, tok, wte, T, C);
    ctrl_cpu_embedding_backward(dwte, dy, tok, T, C);
    int32_t *d_tok = dev_copy(tok, sizeof tok);
    float *d_wte = dev_copy(wte, (size_t)V * C * 4), *d_dy = dev_copy(dy, (size_t)T * C * 4);
    float *d_dwte = dev_copy(dwte0, (size_t)V * C * 4), *d_out = dev_poisoned((size_t)T * C * 4);
    CHECK_EQ_INT(ctrl_cuda_embedding_forward(d_out, d_tok, d_wte, T, C), CTRL_OK);
    CHECK_EQ_INT(ctrl_cuda_embedding_backward(d_dwte, d_dy, d_tok, T, C), CTRL_OK);
    EXPECT_DEV(d_out, out, (size_t)T * C, 0, "embedding out (exact)");
    EXPECT_DEV(d_dwte, dwte, (size_t)V * C, 1e-6, "embedding dwte (accumulated)");
    /* RoPE with llama3 tables built on the host */
    ctrl_rope_params p = {.kind = CTRL_ROPE_LLAMA3,
                          .theta = 500000,
                          .factor = 8,
                          .low_freq_factor = 1,
                          .high_freq_factor = 4,
                          .original_max_position = 8192,
                          .partial_rotary_factor = 1};
    float *ct = malloc((size_t)max_pos * D / 2 * 4), *st = malloc((size_t)max_pos * D / 2 * 4);
    ctrl_cpu_rope_tables(ct, st, max_pos, D, &p);
    size_t n = (size_t)T * H * D;
    float *x = hrand(n, 1), *g = hrand(n, 1), *ro = malloc(n * 4), *rd = malloc(n * 4);
    ctrl_cpu_rope_forward(ro, x, pos, ct, st, T, H, D);
    ctrl_cpu_rope_backward(rd, g, pos, ct, st, T, H, D);
    int32_t *d_pos = dev_copy(pos, sizeof pos);
    float *d_ct = dev_copy(ct, (size_t)max_pos * D / 2 * 4),
          *d_st = dev_copy(st, (size_t)max_pos * D / 2 * 4);
    float *d_x = dev_copy(x, n * 4), *d_g = dev_copy(g, n * 4), *d_ro = dev_poisoned(n * 4),
          *d_rd = dev_poisoned(n * 4);
    CHECK_EQ_INT(ctrl_cuda_rope_forward(d_ro, d_x, d_pos, d_ct, d_st, T, H, D), CTRL_OK);
    CHECK_EQ_INT(ctrl_cuda_rope_backward(d_rd, d_g, d_pos, d_ct, d_st, T, H, D), CTRL_OK);
    EXPECT_DEV(d_ro, ro, n, 1e-6, "rope out");
    EXPECT_DEV(d_rd, rd, n, 1e-6, "rope dx");
    /* in place */
    CHECK_EQ_INT(ctrl_cuda_rope_forward(d_x, d_x, d_pos, d_ct, d_st, T, H, D), CTRL_OK);
    EXPECT_DEV(d_x, ro, n, 1e-6, "rope in place");
    ctrl_cuda_free(d_tok), ctrl_cuda_free(d_wte), ctrl_cuda_free(d_dy), ctrl_cuda_free(d_dwte),
        ctrl_cuda_free(d_out);
    ctrl_cuda_free(d_pos), ctrl_cuda_free(d_ct), ctrl_cuda_free(d_st), ctrl_cuda_free(d_x),
        ctrl_cuda_free(d_g);
    ctrl_cuda_free(d_ro), ctrl_cuda_free(d_rd);
    free(wte), free(dy), free(dwte0), free(out), free(dwte), free(ct), free(st), free(x), free(g), free(ro),
        free(rd);
}

/* The fused head on the device against the CPU's, in fp32 and (bf16 = 1) with every product on bf16
 * operands: the CPU reference for that is its bf16 head, which runs where the CPU has AVX-512 BF16. */
static void fused_head_case(int bf16) {
    static const int shapes[][5] = {/* T, C, V, chunk_tokens, chunk_vocab */
                                    {37, 130, 1000, 16, 300},
                                    {64, 896, 32003, 0, 0},
                                    {129, 896, 32003, 50, 4096}};
    int n_shapes = small() ? 1 : 3;
    const double tol = bf16 ? 1e-4 : 1e-5; /* bf16: the same products, summed in another order */
    for (int s = 0; s < n_shapes; s++) {
        int T = shapes[s][0], C = shapes[s][1], V = shapes[s][2];
        ctrl_head_args a = {.T = T,
                            .C = C,
                            .V = V,
                            .temperature = 0.9f,
                            .chunk_tokens = shapes[s][3],
                            .chunk_vocab = shapes[s][4],
                            .bf16 = bf16};
        float *h = hrand((size_t)T * C, 1), *w = hrand((size_t)V * C, 0.1f), *dl = hrand(T, 1),
              *de = hrand(T, 1);
        float *dw0 = hrand((size_t)V * C, 0.01f);
        int32_t *tg = malloc(T * 4);
        for (int t = 0; t < T; t++) tg[t] = t % 7 == 3 ? -100 : (int32_t)((t * 7919u) % (unsigned)V);
        a.hidden = h, a.w = w, a.targets = tg;
        float *logp = malloc(T * 4), *ent = malloc(T * 4), *lse = malloc(T * 4),
              *dh = malloc((size_t)T * C * 4);
        float *dw = malloc((size_t)V * C * 4), *okf = malloc(T * 4);
        int32_t *ok = malloc(T * 4);
        memcpy(dw, dw0, (size_t)V * C * 4);
        void *ws = malloc(ctrl_cpu_head_workspace_bytes(&a));
        ctrl_cpu_head_forward(&a, logp, ent, lse, ok, ws);
        ctrl_cpu_head_backward(&a, lse, dl, ent, de, dh, dw, ws);
        for (int t = 0; t < T; t++) okf[t] = (float)ok[t];
        ctrl_head_args d = a;
        d.hidden = dev_copy(h, (size_t)T * C * 4), d.w = dev_copy(w, (size_t)V * C * 4),
        d.targets = dev_copy(tg, T * 4);
        float *d_logp = dev_poisoned(T * 4), *d_ent = dev_poisoned(T * 4), *d_lse = dev_poisoned(T * 4);
        int32_t *d_ok = dev_poisoned(T * 4);
        float *d_dl = dev_copy(dl, T * 4), *d_de = dev_copy(de, T * 4),
              *d_dh = dev_poisoned((size_t)T * C * 4);
        float *d_dw = dev_copy(dw0, (size_t)V * C * 4);
        void *d_ws = NULL;
        CHECK_EQ_INT(ctrl_cuda_malloc(&d_ws, ctrl_cuda_head_workspace_bytes(&d)), CTRL_OK);
        CHECK_MSG(ctrl_cuda_head_forward(&d, d_logp, d_ent, d_lse, d_ok, d_ws) == CTRL_OK, "%s",
                  ctrl_error_message());
        CHECK_MSG(ctrl_cuda_head_backward(&d, d_lse, d_dl, d_ent, d_de, d_dh, d_dw, d_ws) == CTRL_OK, "%s",
                  ctrl_error_message());
        EXPECT_DEV(d_logp, logp, T, tol, bf16 ? "head bf16 logp" : "head logp");
        EXPECT_DEV(d_ent, ent, T, tol, bf16 ? "head bf16 entropy" : "head entropy");
        EXPECT_DEV(d_lse, lse, T, tol, bf16 ? "head bf16 lse" : "head lse");
        EXPECT_DEV(d_dh, dh, (size_t)T * C, tol, bf16 ? "head bf16 dhidden" : "head dhidden");
        EXPECT_DEV(d_dw, dw, (size_t)V * C, tol,
                   bf16 ? "head bf16 dw (accumulated)" : "head dw (accumulated)");
        int32_t *gok = malloc(T * 4);
        ctrl_cuda_memcpy_d2h(gok, d_ok, T * 4);
        int mism = 0;
        for (int t = 0; t < T; t++) mism += gok[t] != ok[t];
        CHECK_MSG(mism <= (bf16 ? T / 20 : 0), "head correct flags: %d mismatches",
                  mism); /* bf16: near ties */
        printf("  head%s T=%d C=%d V=%d: ok\n", bf16 ? " bf16" : "", T, C, V);
        ctrl_cuda_free((void *)d.hidden), ctrl_cuda_free((void *)d.w), ctrl_cuda_free((void *)d.targets);
        ctrl_cuda_free(d_logp), ctrl_cuda_free(d_ent), ctrl_cuda_free(d_lse), ctrl_cuda_free(d_ok);
        ctrl_cuda_free(d_dl), ctrl_cuda_free(d_de), ctrl_cuda_free(d_dh), ctrl_cuda_free(d_dw),
            ctrl_cuda_free(d_ws);
        free(h), free(w), free(dl), free(de), free(dw0), free(tg), free(logp), free(ent), free(lse), free(dh);
        free(dw), free(okf), free(ok), free(ws), free(gok);
    }
}

TEST(fused_head) {
    NEED_GPU();
    fused_head_case(0);
    if (ctrl_cpu_has_avx512bf16())
        fused_head_case(1);
    else
        printf("  head bf16: not compared (the CPU reference computes it in bf16 only with AVX-512 BF16)\n");
}

/* torch.optim.AdamW's formula on the host in float, exactly as the adamw plugin computes it. */
TEST(adamw_fused) {
    NEED_GPU();
    const int64_t n = small() ? 4099 : 1000003;
    float *p = hrand(n, 1), *m = calloc(n, 4), *v = calloc(n, 4);
    float *d_p = dev_copy(p, n * 4), *d_m = dev_copy(m, n * 4), *d_v = dev_copy(v, n * 4), *d_g = NULL;
    uint16_t *d_p16 = dev_poisoned(n * 2);
    CHECK_EQ_INT(ctrl_cuda_malloc((void **)&d_g, n * 4), CTRL_OK);
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f;
    for (int step = 1; step <= 3; step++) {
        float *g = hrand(n, 1);
        ctrl_cuda_memcpy_h2d(d_g, g, n * 4);
        const float lr = 1e-3f * step;
        const float step_size = (float)(lr / (1.0 - pow(b1, step))), bc2 = (float)sqrt(1.0 - pow(b2, step));
        const float decay = (float)(1.0 - (double)lr * wd);
        for (int64_t i = 0; i < n; i++) {
            p[i] *= decay;
            m[i] = b1 * m[i] + (1 - b1) * g[i];
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
            p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2 + eps);
        }
        CHECK_EQ_INT(ctrl_cuda_adamw_step(d_p, d_g, d_m, d_v, d_p16, n, lr, b1, b2, eps, wd, step), CTRL_OK);
        free(g);
    }
    EXPECT_DEV(d_p, p, n, 1e-6, "adamw params");
    EXPECT_DEV(d_m, m, n, 1e-6, "adamw exp_avg");
    EXPECT_DEV(d_v, v, n, 1e-6, "adamw exp_avg_sq");
    float *from16 = NULL;
    CHECK_EQ_INT(ctrl_cuda_malloc((void **)&from16, n * 4), CTRL_OK);
    ctrl_cuda_bf16_to_f32(from16, d_p16, n);
    EXPECT_DEV(from16, p, n, 5e-3, "adamw bf16 copy");
    ctrl_cuda_free(d_p), ctrl_cuda_free(d_m), ctrl_cuda_free(d_v), ctrl_cuda_free(d_g), ctrl_cuda_free(d_p16);
    ctrl_cuda_free(from16);
    free(p), free(m), free(v);
}

__attribute__((constructor)) static void seed(void) { rng = test_fresh_seed(); }

/* bf16 compute through the backend table (cuda_backend_ops.c: operands converted to bf16, cuBLASLt's
 * bf16 GEMM, fp32 accumulation) against the CPU's bf16 linear (kernels/cpu/bf16.c): both multiply
 * the same bf16 values exactly and add in fp32, so only the order of the sums differs. */
TEST(linear_bf16) {
    NEED_GPU();
    const ctrl_backend_ops *be = ctrl_cuda_backend_ops();
    CHECK(be && ctrl_backend_has(be, linear_forward_bf16) && ctrl_backend_has(be, round_to_bf16));
    if (!be || !be->linear_forward_bf16) return;
    static const int shapes[][3] = {{37, 96, 130}, {5, 200, 64}, {64, 64, 300}};
    for (int s = 0; s < 3; s++) {
        const int T = shapes[s][0], IN = shapes[s][1], OUT = shapes[s][2];
        const size_t nx = (size_t)T * IN, nw = (size_t)OUT * IN, no = (size_t)T * OUT;
        float *x = hrand(nx, 1), *w = hrand(nw, 0.5f), *b = hrand(OUT, 1), *dout = hrand(no, 1);
        float *dw0 = hrand(nw, 0.1f), *db0 = hrand(OUT, 0.1f);
        float *out = malloc(no * 4), *dx = malloc(nx * 4), *dw = malloc(nw * 4), *db = malloc(OUT * 4);
        float *wr = malloc(nw * 4);
        memcpy(dw, dw0, nw * 4), memcpy(db, db0, OUT * 4);
        CHECK_EQ_INT(ctrl_cpu_linear_forward_bf16(out, x, w, b, T, IN, OUT, 0), 0);
        CHECK_EQ_INT(ctrl_cpu_linear_backward_bf16(dx, dw, db, dout, x, w, T, IN, OUT, 0), 0);
        ctrl_cpu_round_to_bf16(wr, w, (int64_t)nw);
        float *d_x = dev_copy(x, nx * 4), *d_w = dev_copy(w, nw * 4), *d_b = dev_copy(b, OUT * 4);
        float *d_dout = dev_copy(dout, no * 4), *d_dw = dev_copy(dw0, nw * 4), *d_db = dev_copy(db0, OUT * 4);
        float *d_out = dev_poisoned(no * 4), *d_dx = dev_poisoned(nx * 4), *d_wr = dev_poisoned(nw * 4);
        CHECK_EQ_INT(be->round_to_bf16(d_wr, d_w, (int64_t)nw), CTRL_OK);
        EXPECT_DEV(d_wr, wr, nw, 0, "round_to_bf16");
        CHECK_EQ_INT(be->linear_forward_bf16(d_out, d_x, d_wr, d_b, T, IN, OUT, 1), CTRL_OK);
        CHECK_EQ_INT(be->linear_backward_bf16(d_dx, d_dw, d_db, d_dout, d_x, d_wr, T, IN, OUT, 1), CTRL_OK);
        EXPECT_DEV(d_out, out, no, 1e-5, "linear_forward_bf16");
        EXPECT_DEV(d_dx, dx, nx, 1e-5, "linear_backward_bf16 dx");
        EXPECT_DEV(d_dw, dw, nw, 1e-5, "linear_backward_bf16 dW");
        EXPECT_DEV(d_db, db, OUT, 1e-5, "linear_backward_bf16 dbias");
        void *dev[] = {d_x, d_w, d_b, d_dout, d_dw, d_db, d_out, d_dx, d_wr};
        for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) ctrl_cuda_free(dev[i]);
        free(x), free(w), free(b), free(dout), free(dw0), free(db0), free(out), free(dx), free(dw), free(db),
            free(wr);
    }
}

/* The backend's typed GEMM (lent to attention plugins) against the CPU backend's: every operand /
 * result type pair, both transposes, and operands that start 2 bytes into a buffer (a bf16 row
 * view at an odd offset: cuBLASLt must be told, gemm.cu's alignment_of). */
TEST(gemm_typed) {
    NEED_GPU();
    const ctrl_backend_ops *be = ctrl_cuda_backend_ops(), *cpu = ctrl_backend_cpu();
    CHECK(be && ctrl_backend_has(be, gemm) && ctrl_backend_has(cpu, gemm));
    if (!be || !ctrl_backend_has(be, gemm)) return;
    static const struct {
        ctrl_dtype ab, c;
    } types[] = {{CTRL_F32, CTRL_F32}, {CTRL_BF16, CTRL_F32}, {CTRL_BF16, CTRL_BF16}};
    const int M = 37, N = 57, K = 64, off = 1; /* off: elements into each buffer */
    for (int ty = 0; ty < 3; ty++)
        for (int tr = 0; tr < 4; tr++) {
            const int ta = tr & 1, tb = tr >> 1, lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 5;
            const size_t na = (size_t)(ta ? K : M) * lda + off, nb = (size_t)(tb ? N : K) * ldb + off,
                         nc = (size_t)M * ldc + off, ea = types[ty].ab == CTRL_BF16 ? 2 : 4,
                         ec = types[ty].c == CTRL_BF16 ? 2 : 4;
            float *fa = hrand(na, 1), *fb = hrand(nb, 1), *fc = hrand(nc, 1);
            /* host buffers in the operand types */
            void *ha = malloc(na * ea), *hb = malloc(nb * ea), *hc = malloc(nc * ec),
                 *hc_dev = malloc(nc * ec);
            if (ea == 2)
                ctrl_cpu_f32_to_bf16(ha, fa, (int64_t)na), ctrl_cpu_f32_to_bf16(hb, fb, (int64_t)nb);
            else
                memcpy(ha, fa, na * 4), memcpy(hb, fb, nb * 4);
            if (ec == 2)
                ctrl_cpu_f32_to_bf16(hc, fc, (int64_t)nc);
            else
                memcpy(hc, fc, nc * 4);
            void *da = dev_copy(ha, na * ea), *db = dev_copy(hb, nb * ea), *dc = dev_copy(hc, nc * ec);
            const float alpha = 0.75f, beta = tr == 3 ? 0.5f : 0.0f;
            CHECK_EQ_INT(be->gemm(ta, tb, M, N, K, alpha, (char *)da + off * ea, lda, (char *)db + off * ea,
                                  ldb, beta, (char *)dc + off * ec, ldc, types[ty].ab, types[ty].c),
                         CTRL_OK);
            CHECK_EQ_INT(cpu->gemm(ta, tb, M, N, K, alpha, (char *)ha + off * ea, lda, (char *)hb + off * ea,
                                   ldb, beta, (char *)hc + off * ec, ldc, types[ty].ab, types[ty].c),
                         CTRL_OK);
            /* the same problem again: cuBLASLt's heuristic is not asked again (gemm.cu's cache) */
            const long queries = ctrl_cuda_gemm_heuristic_queries();
            CHECK_EQ_INT(be->gemm(ta, tb, M, N, K, alpha, (char *)da + off * ea, lda, (char *)db + off * ea,
                                  ldb, beta, (char *)dc + off * ec, ldc, types[ty].ab, types[ty].c),
                         CTRL_OK);
            CHECK_EQ_INT(ctrl_cuda_gemm_heuristic_queries(), queries);
            if (beta != 0.0f) /* C accumulated twice on the device: once more on the host */
                CHECK_EQ_INT(cpu->gemm(ta, tb, M, N, K, alpha, (char *)ha + off * ea, lda,
                                       (char *)hb + off * ea, ldb, beta, (char *)hc + off * ec, ldc,
                                       types[ty].ab, types[ty].c),
                             CTRL_OK);
            ctrl_cuda_memcpy_d2h(hc_dev, dc, nc * ec);
            float *got = malloc(nc * 4), *want = malloc(nc * 4);
            if (ec == 2)
                ctrl_cpu_bf16_to_f32(got, hc_dev, (int64_t)nc), ctrl_cpu_bf16_to_f32(want, hc, (int64_t)nc);
            else
                memcpy(got, hc_dev, nc * 4), memcpy(want, hc, nc * 4);
            /* fp32 results: the same products in another order (1e-5); a bf16 result may round one
             * ulp apart where the fp32 sums straddle a rounding boundary */
            const double e = test_rel_error_f32(got, want, (long)nc);
            CHECK_MSG(e <= (ec == 2 ? 4e-3 : 1e-5), "gemm %s->%s ta %d tb %d: relative error %.3g",
                      ctrl_dtype_name(types[ty].ab), ctrl_dtype_name(types[ty].c), ta, tb, e);
            ctrl_cuda_free(da), ctrl_cuda_free(db), ctrl_cuda_free(dc);
            free(fa), free(fb), free(fc), free(ha), free(hb), free(hc), free(hc_dev), free(got), free(want);
        }
}

#else

TEST(cuda_ops) { TEST_SKIP("built without CUDA"); }

#endif
