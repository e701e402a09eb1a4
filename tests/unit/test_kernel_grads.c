/* Finite-difference checks of every CPU kernel's backward: L = sum(out * R) for a fixed random R,
 * central differences through the kernel's own forward (float32, step 1e-2, so rounding stays far
 * below the O(h^2) truncation error), against the analytic gradient from the backward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "test.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}
static float *rand_buf(size_t n, float scale) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
    return x;
}
static float *zeros(size_t n) { return calloc(n, sizeof(float)); }

/* The loss closure: recompute the forward with the current inputs, return sum(out * R). */
typedef double (*loss_fn)(void *ctx);

/* Relative L2 error ||fd - g|| / ||g|| over every `stride`-th element of x. Norm-wise, because
 * the float32 forward's rounding makes single small entries of fd noisy (~1e-4 absolute). */
static double fd_check(loss_fn f, void *ctx, float *x, const float *g, size_t n, size_t stride) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i += stride) {
        const float h = 1e-2f, x0 = x[i];
        x[i] = x0 + h;
        double lp = f(ctx);
        x[i] = x0 - h;
        double lm = f(ctx);
        x[i] = x0;
        double fd = (lp - lm) / (2.0 * h);
        num += (fd - g[i]) * (fd - g[i]);
        den += (double)g[i] * g[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double dot(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* ---- RMSNorm ---- */
typedef struct {
    int T, C;
    float *x, *w, *out, *rstd, *R;
} rms_ctx;
static double rms_loss(void *p) {
    rms_ctx *c = p;
    ctrl_cpu_rmsnorm_forward(c->out, c->rstd, c->x, c->w, c->T, c->C, 1e-6f);
    return dot(c->out, c->R, (size_t)c->T * c->C);
}
TEST(rmsnorm_backward) {
    rms_ctx c = {.T = 5, .C = 37};
    size_t n = (size_t)c.T * c.C;
    c.x = rand_buf(n, 1), c.w = rand_buf(c.C, 1), c.out = zeros(n), c.rstd = zeros(c.T), c.R = rand_buf(n, 1);
    float *dx = zeros(n), *dw = zeros(c.C);
    rms_loss(&c);
    ctrl_cpu_rmsnorm_backward(dx, dw, c.R, c.x, c.w, c.rstd, c.T, c.C);
    CHECK_MSG(fd_check(rms_loss, &c, c.x, dx, n, 1) < 1e-3, "dx");
    CHECK_MSG(fd_check(rms_loss, &c, c.w, dw, c.C, 1) < 1e-3, "dw");
    /* dw accumulates */
    ctrl_cpu_rmsnorm_backward(dx, dw, c.R, c.x, c.w, c.rstd, c.T, c.C);
    float *dw1 = zeros(c.C);
    ctrl_cpu_rmsnorm_backward(dx, dw1, c.R, c.x, c.w, c.rstd, c.T, c.C);
    for (int i = 0; i < c.C; i++) CHECK_NEAR(dw[i], 2 * dw1[i], 1e-4 * (1 + fabsf(dw1[i])));
    free(c.x), free(c.w), free(c.out), free(c.rstd), free(c.R), free(dx), free(dw), free(dw1);
}

/* ---- Linear ---- */
typedef struct {
    int T, IN, OUT;
    float *x, *w, *b, *out, *R;
} lin_ctx;
static double lin_loss(void *p) {
    lin_ctx *c = p;
    ctrl_cpu_linear_forward(c->out, c->x, c->w, c->b, c->T, c->IN, c->OUT);
    return dot(c->out, c->R, (size_t)c->T * c->OUT);
}
TEST(linear_backward) {
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        lin_ctx c = {.T = 7, .IN = 13, .OUT = 11};
        size_t nx = (size_t)c.T * c.IN, nw = (size_t)c.OUT * c.IN, no = (size_t)c.T * c.OUT;
        c.x = rand_buf(nx, 1), c.w = rand_buf(nw, 1), c.b = with_bias ? rand_buf(c.OUT, 1) : NULL;
        c.out = zeros(no), c.R = rand_buf(no, 1);
        float *dx = zeros(nx), *dw = zeros(nw), *db = zeros(c.OUT);
        ctrl_cpu_linear_backward(dx, dw, with_bias ? db : NULL, c.R, c.x, c.w, c.T, c.IN, c.OUT);
        CHECK_MSG(fd_check(lin_loss, &c, c.x, dx, nx, 1) < 1e-3, "dx (bias %d)", with_bias);
        CHECK_MSG(fd_check(lin_loss, &c, c.w, dw, nw, 1) < 1e-3, "dw (bias %d)", with_bias);
        if (with_bias) CHECK_MSG(fd_check(lin_loss, &c, c.b, db, c.OUT, 1) < 1e-3, "dbias");
        /* dx may be NULL; dw still accumulates */
        float *dw2 = zeros(nw);
        memcpy(dw2, dw, nw * 4);
        ctrl_cpu_linear_backward(NULL, dw2, NULL, c.R, c.x, c.w, c.T, c.IN, c.OUT);
        for (size_t i = 0; i < nw; i++) CHECK_NEAR(dw2[i], 2 * dw[i], 1e-4 * (1 + fabsf(dw[i])));
        free(c.x), free(c.w), free(c.b), free(c.out), free(c.R), free(dx), free(dw), free(db), free(dw2);
    }
}

/* ---- SwiGLU ---- */
typedef struct {
    int64_t n;
    float *g, *u, *out, *R;
} swi_ctx;
static double swi_loss(void *p) {
    swi_ctx *c = p;
    ctrl_cpu_swiglu_forward(c->out, c->g, c->u, c->n);
    return dot(c->out, c->R, (size_t)c->n);
}
TEST(swiglu_backward) {
    swi_ctx c = {.n = 301};
    c.g = rand_buf(c.n, 4), c.u = rand_buf(c.n, 2), c.out = zeros(c.n), c.R = rand_buf(c.n, 1);
    float *dg = zeros(c.n), *du = zeros(c.n);
    ctrl_cpu_swiglu_backward(dg, du, c.R, c.g, c.u, c.n);
    CHECK_MSG(fd_check(swi_loss, &c, c.g, dg, c.n, 1) < 1e-3, "dgate");
    CHECK_MSG(fd_check(swi_loss, &c, c.u, du, c.n, 1) < 1e-3, "dup");
    free(c.g), free(c.u), free(c.out), free(c.R), free(dg), free(du);
}

/* ---- RoPE ---- */
typedef struct {
    int T, H, D;
    float *x, *out, *R, *cos_tab, *sin_tab;
    int32_t *pos;
} rope_ctx;
static double rope_loss(void *p) {
    rope_ctx *c = p;
    ctrl_cpu_rope_forward(c->out, c->x, c->pos, c->cos_tab, c->sin_tab, c->T, c->H, c->D);
    return dot(c->out, c->R, (size_t)c->T * c->H * c->D);
}
TEST(rope_backward_and_rotation) {
    rope_ctx c = {.T = 9, .H = 3, .D = 16};
    int32_t pos[9] = {0, 1, 2, 3, 0, 1, 2, 0, 700}; /* restarts, as in packed batches */
    c.pos = pos;
    c.cos_tab = zeros(1024 * 8), c.sin_tab = zeros(1024 * 8);
    ctrl_rope_params p = {.kind = CTRL_ROPE_DEFAULT, .theta = 10000, .factor = 1};
    ctrl_cpu_rope_tables(c.cos_tab, c.sin_tab, 1024, c.D, &p);
    size_t n = (size_t)c.T * c.H * c.D;
    c.x = rand_buf(n, 1), c.out = zeros(n), c.R = rand_buf(n, 1);
    float *dx = zeros(n);
    ctrl_cpu_rope_backward(dx, c.R, c.pos, c.cos_tab, c.sin_tab, c.T, c.H, c.D);
    CHECK_MSG(fd_check(rope_loss, &c, c.x, dx, n, 1) < 1e-3, "dx");
    /* A rotation keeps norms; position 0 is the identity; in place works. */
    rope_loss(&c);
    for (int t = 0; t < c.T; t++) {
        size_t o = (size_t)t * c.H * c.D;
        CHECK_NEAR(dot(c.out + o, c.out + o, c.H * c.D), dot(c.x + o, c.x + o, c.H * c.D), 1e-4);
    }
    for (int i = 0; i < c.H * c.D; i++) CHECK(c.out[i] == c.x[i]);
    float *inplace = malloc(n * 4);
    memcpy(inplace, c.x, n * 4);
    ctrl_cpu_rope_forward(inplace, inplace, c.pos, c.cos_tab, c.sin_tab, c.T, c.H, c.D);
    CHECK(memcmp(inplace, c.out, n * 4) == 0);
    free(inplace), free(c.x), free(c.out), free(c.R), free(c.cos_tab), free(c.sin_tab), free(dx);
}

/* ---- Embedding and residual ---- */
TEST(embedding_and_residual_backward) {
    const int T = 6, C = 5, V = 4;
    int32_t tok[6] = {2, 0, 2, 3, 2, 1}; /* repeated ids accumulate */
    float *wte = rand_buf((size_t)V * C, 1), *out = zeros((size_t)T * C), *dout = rand_buf((size_t)T * C, 1);
    float *dwte = zeros((size_t)V * C);
    ctrl_cpu_embedding_forward(out, tok, wte, T, C);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) CHECK(out[t * C + c] == wte[tok[t] * C + c]);
    ctrl_cpu_embedding_backward(dwte, dout, tok, T, C);
    for (int v = 0; v < V; v++)
        for (int c = 0; c < C; c++) {
            double want = 0;
            for (int t = 0; t < T; t++)
                if (tok[t] == v) want += dout[t * C + c];
            CHECK_NEAR(dwte[v * C + c], want, 1e-6);
        }
    float a[3] = {1, 2, 3}, b[3] = {10, 20, 30}, o[3], da[3] = {1, 1, 1}, db[3] = {0}, g[3] = {0.5f, -1, 2};
    ctrl_cpu_residual_forward(o, a, b, 3);
    CHECK(o[0] == 11 && o[1] == 22 && o[2] == 33);
    ctrl_cpu_residual_backward(da, db, g, 3);
    CHECK(da[0] == 1.5f && da[1] == 0 && da[2] == 3 && db[0] == 0.5f && db[1] == -1 && db[2] == 2);
    float big[5] = {1, -2, 3, -4, 5};
    CHECK_NEAR(ctrl_cpu_sum_squares(big, 5), 55, 1e-9);
    ctrl_cpu_scale(big, 0.5f, 5);
    CHECK(big[4] == 2.5f);
    free(wte), free(out), free(dout), free(dwte);
}

/* ---- The fused head ---- */
typedef struct {
    ctrl_head_args a;
    float *logp, *ent, *lse, *R, *RE;
    void *ws;
} head_ctx;
static double head_loss(void *p) {
    head_ctx *c = p;
    ctrl_cpu_head_forward(&c->a, c->logp, c->ent, c->lse, NULL, c->ws);
    return dot(c->logp, c->R, c->a.T) + dot(c->ent, c->RE, c->a.T);
}
TEST(head_backward_with_entropy_and_temperature) {
    head_ctx c = {.a = {.T = 11, .C = 9, .V = 23, .temperature = 0.7f, .chunk_tokens = 4, .chunk_vocab = 6}};
    int32_t tg[11] = {0, 5, -100, 22, 7, 7, 1, -1, 13, 2, 21};
    c.a.targets = tg;
    float *h = rand_buf((size_t)c.a.T * c.a.C, 1), *w = rand_buf((size_t)c.a.V * c.a.C, 1);
    c.a.hidden = h, c.a.w = w;
    c.logp = zeros(c.a.T), c.ent = zeros(c.a.T), c.lse = zeros(c.a.T);
    c.R = rand_buf(c.a.T, 1), c.RE = rand_buf(c.a.T, 1);
    c.ws = malloc(ctrl_cpu_head_workspace_bytes(&c.a));
    float *dh = rand_buf((size_t)c.a.T * c.a.C, 1) /* must be overwritten */,
          *dw = zeros((size_t)c.a.V * c.a.C);
    head_loss(&c);
    ctrl_cpu_head_backward(&c.a, c.lse, c.R, c.ent, c.RE, dh, dw, c.ws);
    CHECK_MSG(fd_check(head_loss, &c, h, dh, (size_t)c.a.T * c.a.C, 1) < 1e-3, "dhidden");
    double ew = fd_check(head_loss, &c, w, dw, (size_t)c.a.V * c.a.C, 1);
    CHECK_MSG(ew < 1e-3, "dw: %.3g", ew);
    printf("  head: finite-difference relative error of dW %.2e\n", ew);
    for (int t = 0; t < c.a.T; t++)
        if (tg[t] < 0) CHECK(c.logp[t] == 0 && c.ent[t] == 0);
    free(h), free(w), free(c.logp), free(c.ent), free(c.lse), free(c.R), free(c.RE), free(c.ws), free(dh),
        free(dw);
}

/* Chunk sizes change the order of sums only: every chunking agrees with one big chunk, and so does
 * the fused forward + backward. */
TEST(head_chunking_is_invariant) {
    const int T = 37, C = 16, V = 301;
    int32_t *tg = malloc(T * 4);
    for (int t = 0; t < T; t++) tg[t] = t % 5 == 4 ? -100 : (t * 37) % V;
    float *h = rand_buf((size_t)T * C, 2), *w = rand_buf((size_t)V * C, 1), *dlogp = rand_buf(T, 1);
    float ref_logp[37], ref_ent[37], ref_lse[37], *ref_dh = zeros((size_t)T * C),
                                                  *ref_dw = zeros((size_t)V * C);
    int32_t ref_ok[37];
    static const int chunks[][2] = {{T, V}, {1, 1}, {5, 17}, {64, 100}, {8, 300}};
    for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
        ctrl_head_args a = {.hidden = h,
                            .w = w,
                            .targets = tg,
                            .T = T,
                            .C = C,
                            .V = V,
                            .temperature = 1.3f,
                            .chunk_tokens = chunks[k][0],
                            .chunk_vocab = chunks[k][1]};
        void *ws = malloc(ctrl_cpu_head_workspace_bytes(&a));
        float logp[37], ent[37], lse[37], *dh = zeros((size_t)T * C), *dw = zeros((size_t)V * C);
        int32_t ok[37];
        ctrl_cpu_head_forward(&a, logp, ent, lse, ok, ws);
        ctrl_cpu_head_backward(&a, lse, dlogp, NULL, NULL, dh, dw, ws);
        if (k == 0) {
            memcpy(ref_logp, logp, sizeof logp), memcpy(ref_ent, ent, sizeof ent),
                memcpy(ref_lse, lse, sizeof lse);
            memcpy(ref_ok, ok, sizeof ok), memcpy(ref_dh, dh, (size_t)T * C * 4),
                memcpy(ref_dw, dw, (size_t)V * C * 4);
        } else {
            CHECK_REL(logp, ref_logp, T, 1e-6);
            CHECK_REL(ent, ref_ent, T, 1e-6);
            CHECK_REL(lse, ref_lse, T, 1e-6);
            CHECK_REL(dh, ref_dh, (long)T * C, 1e-6);
            CHECK_REL(dw, ref_dw, (long)V * C, 1e-6);
            CHECK(memcmp(ok, ref_ok, sizeof ok) == 0);
        }
        free(ws), free(dh), free(dw);
    }
    /* The fused forward + backward (dlogp known up front) gives the same, with each token chunking
     * and the default one; dw accumulates onto what is there. */
    static const int fused_chunks[] = {0, 1, 5, 36, 64};
    for (size_t k = 0; k < sizeof fused_chunks / sizeof fused_chunks[0]; k++) {
        ctrl_head_args a = {.hidden = h,
                            .w = w,
                            .targets = tg,
                            .T = T,
                            .C = C,
                            .V = V,
                            .temperature = 1.3f,
                            .chunk_tokens = fused_chunks[k]};
        void *ws = malloc(ctrl_cpu_head_fused_workspace_bytes(&a));
        float logp[37], ent[37], lse[37], *dh = rand_buf((size_t)T * C, 1) /* overwritten */,
                                          *dw = zeros((size_t)V * C);
        for (int i = 0; i < V * C; i++) dw[i] = ref_dw[i];
        int32_t ok[37];
        ctrl_cpu_head_forward_backward(&a, dlogp, logp, ent, lse, ok, dh, dw, ws);
        for (int i = 0; i < V * C; i++) dw[i] -= ref_dw[i];
        CHECK_REL(logp, ref_logp, T, 1e-6);
        CHECK_REL(ent, ref_ent, T, 1e-6);
        CHECK_REL(lse, ref_lse, T, 1e-6);
        CHECK_REL(dh, ref_dh, (long)T * C, 1e-6);
        CHECK_REL(dw, ref_dw, (long)V * C, 1e-5);
        CHECK(memcmp(ok, ref_ok, sizeof ok) == 0);
        free(ws), free(dh), free(dw);
    }
    free(tg), free(h), free(w), free(dlogp), free(ref_dh), free(ref_dw);
}
