/* Finite-difference checks of every CPU kernel's backward (the model families' too, at the end): L = sum(out
 * * R) for a fixed random R, central differences through the kernel's own forward (float32, step 1e-2, so
 * rounding stays far below the O(h^2) truncation error), against the analytic gradient from the backward. */
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

/* ---- RMSNorm (Llama's weight w, and Gemma's 1 + w at the end) ---- */
typedef void (*norm_fwd)(float *out, float *rstd, const float *x, const float *weight, int T, int C,
                         float eps);
typedef void (*norm_bwd)(float *dx, float *dweight, const float *dout, const float *x, const float *weight,
                         const float *rstd, int T, int C);
typedef struct {
    int T, C;
    float *x, *w, *out, *rstd, *R, *dx, *dw;
    norm_fwd fwd;
} rms_ctx;
static double rms_loss(void *p) {
    rms_ctx *c = p;
    c->fwd(c->out, c->rstd, c->x, c->w, c->T, c->C, 1e-6f);
    return dot(c->out, c->R, (size_t)c->T * c->C);
}
/* x [T, C] and R random, the weight random of scale w_scale; bwd's dx and dw against finite
 * differences of fwd. The context keeps them (rms_free). */
static rms_ctx rms_check(norm_fwd fwd, norm_bwd bwd, int T, int C, float w_scale) {
    rms_ctx c = {.T = T, .C = C, .fwd = fwd};
    const size_t n = (size_t)T * C;
    c.x = rand_buf(n, 1), c.w = rand_buf(C, w_scale), c.out = zeros(n), c.rstd = zeros(T),
    c.R = rand_buf(n, 1);
    c.dx = zeros(n), c.dw = zeros(C);
    rms_loss(&c);
    bwd(c.dx, c.dw, c.R, c.x, c.w, c.rstd, T, C);
    CHECK_MSG(fd_check(rms_loss, &c, c.x, c.dx, n, 1) < 1e-3, "dx");
    CHECK_MSG(fd_check(rms_loss, &c, c.w, c.dw, (size_t)C, 1) < 1e-3, "dw");
    return c;
}
static void rms_free(rms_ctx *c) {
    free(c->x), free(c->w), free(c->out), free(c->rstd), free(c->R), free(c->dx), free(c->dw);
}
TEST(rmsnorm_backward) {
    rms_ctx c = rms_check(ctrl_cpu_rmsnorm_forward, ctrl_cpu_rmsnorm_backward, 5, 37, 1);
    float *dx = c.dx, *dw = c.dw;
    /* dw accumulates */
    ctrl_cpu_rmsnorm_backward(dx, dw, c.R, c.x, c.w, c.rstd, c.T, c.C);
    float *dw1 = zeros(c.C);
    ctrl_cpu_rmsnorm_backward(dx, dw1, c.R, c.x, c.w, c.rstd, c.T, c.C);
    for (int i = 0; i < c.C; i++) CHECK_NEAR(dw[i], 2 * dw1[i], 1e-4 * (1 + fabsf(dw1[i])));
    rms_free(&c), free(dw1);
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

/* ---- gated activations: out = act(gate) * up (SwiGLU here, GeGLU at the end) ---- */
typedef void (*gated_fwd)(float *out, const float *gate, const float *up, int64_t n);
typedef void (*gated_bwd)(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                          int64_t n);
typedef struct {
    int64_t n;
    float *g, *u, *out, *R;
    gated_fwd fwd;
} gated_ctx;
static double gated_loss(void *p) {
    gated_ctx *c = p;
    c->fwd(c->out, c->g, c->u, c->n);
    return dot(c->out, c->R, (size_t)c->n);
}
/* n random gates (scale 4) and ups (scale 2): bwd's gradients against finite differences of fwd. */
static void check_gated(gated_fwd fwd, gated_bwd bwd, int64_t n) {
    gated_ctx c = {.n = n, .fwd = fwd};
    c.g = rand_buf(n, 4), c.u = rand_buf(n, 2), c.out = zeros(n), c.R = rand_buf(n, 1);
    float *dg = zeros(n), *du = zeros(n);
    bwd(dg, du, c.R, c.g, c.u, n);
    CHECK_MSG(fd_check(gated_loss, &c, c.g, dg, n, 1) < 1e-3, "dgate");
    CHECK_MSG(fd_check(gated_loss, &c, c.u, du, n, 1) < 1e-3, "dup");
    free(c.g), free(c.u), free(c.out), free(c.R), free(dg), free(du);
}
TEST(swiglu_backward) { check_gated(ctrl_cpu_swiglu_forward, ctrl_cpu_swiglu_backward, 301); }

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

/* One chunking's head outputs (T = 37 tokens). */
typedef struct {
    float logp[37], ent[37], lse[37], *dh, *dw;
    int32_t ok[37];
} head_out;
/* The head of head_chunking_is_invariant at temperature 1.3 with the given chunking. */
static ctrl_head_args chunked_head(const float *h, const float *w, const int32_t *tg, int T, int C, int V,
                                   int chunk_tokens, int chunk_vocab) {
    ctrl_head_args a = {.hidden = h, .w = w, .targets = tg, .T = T, .C = C, .V = V, .temperature = 1.3f};
    a.chunk_tokens = chunk_tokens, a.chunk_vocab = chunk_vocab;
    return a;
}
/* o against ref: log-probs, entropies, LSEs and dhidden within 1e-6, dW within dw_rel, the same flags. */
static void check_same_head(const head_out *o, const head_out *ref, int T, int C, int V, double dw_rel) {
    CHECK_REL(o->logp, ref->logp, T, 1e-6);
    CHECK_REL(o->ent, ref->ent, T, 1e-6);
    CHECK_REL(o->lse, ref->lse, T, 1e-6);
    CHECK_REL(o->dh, ref->dh, (long)T * C, 1e-6);
    CHECK_REL(o->dw, ref->dw, (long)V * C, dw_rel);
    CHECK(memcmp(o->ok, ref->ok, sizeof o->ok) == 0);
}

/* Chunk sizes change the order of sums only: every chunking agrees with one big chunk, and so does
 * the fused forward + backward. */
TEST(head_chunking_is_invariant) {
    const int T = 37, C = 16, V = 301;
    int32_t *tg = malloc(T * 4);
    for (int t = 0; t < T; t++) tg[t] = t % 5 == 4 ? -100 : (t * 37) % V;
    float *h = rand_buf((size_t)T * C, 2), *w = rand_buf((size_t)V * C, 1), *dlogp = rand_buf(T, 1);
    head_out ref = {0};
    static const int chunks[][2] = {{T, V}, {1, 1}, {5, 17}, {64, 100}, {8, 300}};
    for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
        const ctrl_head_args a = chunked_head(h, w, tg, T, C, V, chunks[k][0], chunks[k][1]);
        void *ws = malloc(ctrl_cpu_head_workspace_bytes(&a));
        head_out o = {.dh = zeros((size_t)T * C), .dw = zeros((size_t)V * C)};
        ctrl_cpu_head_forward(&a, o.logp, o.ent, o.lse, o.ok, ws);
        ctrl_cpu_head_backward(&a, o.lse, dlogp, NULL, NULL, o.dh, o.dw, ws);
        free(ws);
        if (k == 0) {
            ref = o; /* keeps its dh and dw */
            continue;
        }
        check_same_head(&o, &ref, T, C, V, 1e-6);
        free(o.dh), free(o.dw);
    }
    /* The fused forward + backward (dlogp known up front) gives the same, with each token chunking
     * and the default one; dw accumulates onto what is there. */
    static const int fused_chunks[] = {0, 1, 5, 36, 64};
    for (size_t k = 0; k < sizeof fused_chunks / sizeof fused_chunks[0]; k++) {
        const ctrl_head_args a = chunked_head(h, w, tg, T, C, V, fused_chunks[k], 0);
        void *ws = malloc(ctrl_cpu_head_fused_workspace_bytes(&a));
        head_out o = {.dh = rand_buf((size_t)T * C, 1) /* overwritten */, .dw = zeros((size_t)V * C)};
        for (int i = 0; i < V * C; i++) o.dw[i] = ref.dw[i];
        ctrl_cpu_head_forward_backward(&a, dlogp, o.logp, o.ent, o.lse, o.ok, o.dh, o.dw, ws);
        for (int i = 0; i < V * C; i++) o.dw[i] -= ref.dw[i];
        check_same_head(&o, &ref, T, C, V, 1e-5);
        free(ws), free(o.dh), free(o.dw);
    }
    free(tg), free(h), free(w), free(dlogp), free(ref.dh), free(ref.dw);
}

/* targets_only (the model's setting): the rows without a target get no logits -- zero logp, entropy,
 * lse, flags and dhidden rows -- and every other output is the full head's (dW within the rounding of
 * summing its tokens in other groups), in the two-pass head and the one-pass one, for chunks that are
 * contiguous in the batch and chunks gathered across its gaps; softcapping too. */
TEST(head_targets_only_skips_the_rows_without_a_target) {
    const int T = 37, C = 16, V = 301;
    int32_t *tg = malloc(T * 4);
    for (int t = 0; t < T; t++) tg[t] = t < 5 || t % 6 == 0 || t == T - 1 ? -100 : (t * 37) % V;
    float *h = rand_buf((size_t)T * C, 2), *w = rand_buf((size_t)V * C, 1), *dlogp = rand_buf(T, 1);
    for (int capped = 0; capped < 2; capped++)
        for (int fused = 0; fused < 2; fused++)
            for (int ct = 0; ct < 8; ct += 3) { /* chunks of the default, 3 and 6 tokens */
                head_out o[2];
                for (int only = 0; only < 2; only++) {
                    ctrl_head_args a = chunked_head(h, w, tg, T, C, V, ct, fused ? 0 : 100);
                    a.targets_only = only, a.softcap = capped ? 2.0f : 0.0f;
                    void *ws = malloc(fused ? ctrl_cpu_head_fused_workspace_bytes(&a)
                                            : ctrl_cpu_head_workspace_bytes(&a));
                    o[only] = (head_out){.dh = rand_buf((size_t)T * C, 1) /* overwritten */,
                                         .dw = zeros((size_t)V * C)};
                    if (fused)
                        ctrl_cpu_head_forward_backward(&a, dlogp, o[only].logp, o[only].ent, o[only].lse,
                                                       o[only].ok, o[only].dh, o[only].dw, ws);
                    else {
                        ctrl_cpu_head_forward(&a, o[only].logp, o[only].ent, o[only].lse, o[only].ok, ws);
                        ctrl_cpu_head_backward(&a, o[only].lse, dlogp, NULL, NULL, o[only].dh, o[only].dw,
                                               ws);
                    }
                    free(ws);
                }
                for (int t = 0; t < T; t++) {
                    if (tg[t] >= 0) continue;
                    CHECK(o[1].logp[t] == 0.0f && o[1].ent[t] == 0.0f && o[1].lse[t] == 0.0f &&
                          o[1].ok[t] == 0);
                    for (int c = 0; c < C; c++) CHECK(o[1].dh[(size_t)t * C + c] == 0.0f);
                    o[0].lse[t] = 0.0f; /* the full head's LSE there: not part of the contract */
                }
                check_same_head(&o[1], &o[0], T, C, V, 1e-5);
                for (int only = 0; only < 2; only++) free(o[only].dh), free(o[only].dw);
            }
    free(tg), free(h), free(w), free(dlogp);
}

/* W's panels in the one-pass bf16 head -- the caller's (ctrl_head_args.w_packed), or packed once by
 * the call for all its chunks (the logits and dhidden = dz W read transposed) -- the same sums as
 * packing W in each chunk's products (CTRL_HEAD_PACK_PER_CHUNK=1), bit for bit, for chunks of more
 * than 4 rows and of 4 or fewer (whose logits do not use them), one chunk and several; a frozen head
 * (no dW) packed once too where forced (CTRL_HEAD_PACK_PER_CHUNK=0). */
TEST(head_on_w_panels_is_bit_for_bit) {
    const int T = 37, C = 40, V = 1000;
    int32_t *tg = malloc(T * 4);
    for (int t = 0; t < T; t++) tg[t] = t % 9 < 2 ? -100 : (t * 31) % V;
    float *h = rand_buf((size_t)T * C, 2), *w = rand_buf((size_t)V * C, 1), *dlogp = rand_buf(T, 1);
    ctrl_cpu_bf16_packed *p = ctrl_cpu_gemm_bf16_pack(1, V, C, w, C);
    if (!p) {
        free(tg), free(h), free(w), free(dlogp);
        TEST_SKIP("no bf16 GEMM on this CPU");
    }
    static const int chunks[] = {0, 3, 16};
    for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
        head_out o[4];
        for (int packed = 0; packed < 4; packed++) { /* per chunk, packed by the call (the head trains;
                                                      * frozen, forced), the caller's */
            ctrl_head_args a = chunked_head(h, w, tg, T, C, V, chunks[k], 0);
            a.bf16 = 1, a.targets_only = 1, a.w_packed = packed == 2 ? p : NULL;
            if (packed == 0) setenv("CTRL_HEAD_PACK_PER_CHUNK", "1", 1);
            if (packed == 3) setenv("CTRL_HEAD_PACK_PER_CHUNK", "0", 1);
            void *ws = malloc(ctrl_cpu_head_fused_workspace_bytes(&a));
            o[packed] = (head_out){.dh = zeros((size_t)T * C), .dw = zeros((size_t)V * C)};
            ctrl_cpu_head_forward_backward(&a, dlogp, o[packed].logp, o[packed].ent, o[packed].lse,
                                           o[packed].ok, o[packed].dh, packed == 3 ? NULL : o[packed].dw, ws);
            unsetenv("CTRL_HEAD_PACK_PER_CHUNK");
            free(ws);
        }
        for (int v = 1; v < 4; v++) {
            CHECK_MSG(memcmp(o[0].logp, o[v].logp, sizeof o[0].logp) == 0, "chunk %d, panels %d: logp",
                      chunks[k], v);
            CHECK(memcmp(o[0].ent, o[v].ent, sizeof o[0].ent) == 0);
            CHECK_MSG(memcmp(o[0].dh, o[v].dh, sizeof(float) * (size_t)T * C) == 0, "chunk %d, panels %d: dh",
                      chunks[k], v);
            if (v < 3) CHECK(memcmp(o[0].dw, o[v].dw, sizeof(float) * (size_t)V * C) == 0);
        }
        for (int i = 0; i < 4; i++) free(o[i].dh), free(o[i].dw);
    }
    ctrl_cpu_gemm_bf16_packed_free(p);
    free(tg), free(h), free(w), free(dlogp);
}

/* A trained head's panels kept by the caller between calls (ctrl_head_args.w_keep, the model's from
 * step to step): the first call packs them into the slot, a later one packs the changed W into the
 * same buffer; each call's outputs bit for bit those of a call packing its own (w_keep NULL). */
TEST(head_keeps_w_panels_between_calls) {
    const int T = 37, C = 40, V = 1000;
    int32_t *tg = malloc(T * 4);
    for (int t = 0; t < T; t++) tg[t] = t % 9 < 2 ? -100 : (t * 31) % V;
    float *h = rand_buf((size_t)T * C, 2), *w = rand_buf((size_t)V * C, 1), *dlogp = rand_buf(T, 1);
    if (ctrl_cpu_gemm_bf16_pack_bytes(V, C) == 0) {
        free(tg), free(h), free(w), free(dlogp);
        TEST_SKIP("no bf16 GEMM on this CPU");
    }
    ctrl_cpu_bf16_packed *keep = NULL, *first = NULL;
    for (int call = 0; call < 3; call++) {
        if (call > 0) /* the weights change between steps */
            for (int i = 0; i < V * C; i++) w[i] = w[i] * 0.75f + 0.01f * (float)(i % 7);
        head_out o[2];
        for (int kept = 0; kept < 2; kept++) {
            ctrl_head_args a = chunked_head(h, w, tg, T, C, V, 16, 0);
            a.bf16 = 1, a.targets_only = 1, a.w_keep = kept ? &keep : NULL;
            void *ws = malloc(ctrl_cpu_head_fused_workspace_bytes(&a));
            o[kept] = (head_out){.dh = zeros((size_t)T * C), .dw = zeros((size_t)V * C)};
            ctrl_cpu_head_forward_backward(&a, dlogp, o[kept].logp, o[kept].ent, o[kept].lse, o[kept].ok,
                                           o[kept].dh, o[kept].dw, ws);
            free(ws);
        }
        CHECK_MSG(keep != NULL, "call %d: no panels kept", call);
        if (call == 0) first = keep;
        CHECK_MSG(keep == first, "call %d: the kept panels were reallocated", call);
        CHECK(ctrl_cpu_gemm_bf16_packed_is(keep, 1, V, C) && !ctrl_cpu_gemm_bf16_packed_is(keep, 0, V, C));
        CHECK_MSG(memcmp(o[0].logp, o[1].logp, sizeof o[0].logp) == 0, "call %d: logp", call);
        CHECK(memcmp(o[0].ent, o[1].ent, sizeof o[0].ent) == 0);
        CHECK(memcmp(o[0].lse, o[1].lse, sizeof o[0].lse) == 0);
        CHECK_MSG(memcmp(o[0].dh, o[1].dh, sizeof(float) * (size_t)T * C) == 0, "call %d: dh", call);
        CHECK_MSG(memcmp(o[0].dw, o[1].dw, sizeof(float) * (size_t)V * C) == 0, "call %d: dw", call);
        for (int i = 0; i < 2; i++) free(o[i].dh), free(o[i].dw);
    }
    /* a slot holding another shape's panels is replaced, not repacked out of bounds */
    ctrl_cpu_gemm_bf16_packed_free(keep);
    keep = ctrl_cpu_gemm_bf16_pack(1, 64, C, w, C);
    ctrl_head_args a = chunked_head(h, w, tg, T, C, V, 16, 0);
    a.bf16 = 1, a.targets_only = 1, a.w_keep = &keep;
    void *ws = malloc(ctrl_cpu_head_fused_workspace_bytes(&a));
    head_out o = {.dh = zeros((size_t)T * C), .dw = zeros((size_t)V * C)};
    ctrl_cpu_head_forward_backward(&a, dlogp, o.logp, o.ent, o.lse, o.ok, o.dh, o.dw, ws);
    CHECK(ctrl_cpu_gemm_bf16_packed_is(keep, 1, V, C));
    ctrl_cpu_bf16_packed *frozen = NULL; /* a frozen head's (no dW) are never kept, even packed once */
    a.w_keep = &frozen;
    setenv("CTRL_HEAD_PACK_PER_CHUNK", "0", 1);
    ctrl_cpu_head_forward_backward(&a, dlogp, o.logp, o.ent, o.lse, o.ok, o.dh, NULL, ws);
    unsetenv("CTRL_HEAD_PACK_PER_CHUNK");
    CHECK(frozen == NULL);
    free(ws), free(o.dh), free(o.dw);
    ctrl_cpu_gemm_bf16_packed_free(keep);
    free(tg), free(h), free(w), free(dlogp);
}

/* ---- The model families' kernels (issue 22): Gemma's (1 + w) RMSNorm and GeGLU (tanh-GELU gate), the
 * LM head with final-logit soft-capping (its backward and its one-pass forward + backward, at
 * temperature 1 and 0.7), Phi-3's partial rotary embedding and longrope tables, and the
 * mixture-of-experts row gather, scatter and dot ---- */
TEST(rmsnorm_1p_backward) {
    rms_ctx c = rms_check(ctrl_cpu_rmsnorm_1p_forward, ctrl_cpu_rmsnorm_1p_backward, 5, 24, 0.3f);
    const size_t n = (size_t)c.T * c.C;
    float *plain = calloc(n, 4), *w1 = malloc(4 * (size_t)c.C);
    /* the same as Llama's RMSNorm with weight 1 + w */
    for (int i = 0; i < c.C; i++) w1[i] = 1.0f + c.w[i];
    ctrl_cpu_rmsnorm_forward(plain, c.rstd, c.x, w1, c.T, c.C, 1e-6f);
    rms_loss(&c);
    CHECK(test_rel_error_f32(c.out, plain, (long)n) < 1e-6);
    rms_free(&c), free(plain), free(w1);
}

TEST(geglu_backward_and_values) {
    check_gated(ctrl_cpu_geglu_forward, ctrl_cpu_geglu_backward, 257);
    /* torch.nn.functional.gelu(x, approximate="tanh") at 1, -2 and 0.5 (times up = 1) */
    const float g3[3] = {1.0f, -2.0f, 0.5f}, u3[3] = {1, 1, 1},
                want[3] = {0.8411920f, -0.0454023f, 0.3457140f};
    float o3[3];
    ctrl_cpu_geglu_forward(o3, g3, u3, 3);
    for (int i = 0; i < 3; i++) CHECK_NEAR(o3[i], want[i], 1e-6);
}

/* The soft-capped head: L = sum_t logp_t R_t. */
typedef struct {
    ctrl_head_args a;
    float *h, *w, *logp, *lse, *R;
    void *ws;
} cap_head_ctx;
static double cap_head_loss(void *p) {
    cap_head_ctx *c = p;
    ctrl_cpu_head_forward(&c->a, c->logp, NULL, c->lse, NULL, c->ws);
    return dot(c->logp, c->R, (size_t)c->a.T);
}

static void check_head(float temperature) {
    enum { T = 6, C = 8, V = 19 };
    int32_t targets[T] = {3, 0, 18, -100, 7, 11};
    cap_head_ctx c = {0};
    c.h = rand_buf(T * C, 2), c.w = rand_buf(V * C, 2), c.logp = calloc(T, 4), c.lse = calloc(T, 4);
    c.R = rand_buf(T, 1);
    c.a = (ctrl_head_args){.hidden = c.h,
                           .w = c.w,
                           .targets = targets,
                           .T = T,
                           .C = C,
                           .V = V,
                           .temperature = temperature,
                           .chunk_tokens = 4, /* several chunks of tokens and of vocabulary */
                           .chunk_vocab = 8,
                           .softcap = 2.5f};
    for (int t = 0; t < T; t++) c.R[t] = targets[t] >= 0 ? c.R[t] : 0.0f;
    c.ws = malloc(ctrl_cpu_head_workspace_bytes(&c.a));
    float *dh = calloc(T * C, 4), *dw = calloc(V * C, 4);
    cap_head_loss(&c);
    ctrl_cpu_head_backward(&c.a, c.lse, c.R, NULL, NULL, dh, dw, c.ws);
    CHECK_MSG(fd_check(cap_head_loss, &c, c.h, dh, T * C, 1) < 1e-3, "dhidden (temperature %g)", temperature);
    CHECK_MSG(fd_check(cap_head_loss, &c, c.w, dw, V * C, 1) < 1e-3, "dw (temperature %g)", temperature);
    cap_head_loss(&c); /* fd_check left the last weight's perturbation's values */
    /* the capped log-probs: log_softmax(2.5 tanh(z / 2.5) / temperature) computed here in double */
    for (int t = 0; t < T; t++) {
        if (targets[t] < 0) continue;
        double z[V], mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) {
            double raw = 0;
            for (int k = 0; k < C; k++) raw += (double)c.h[t * C + k] * c.w[v * C + k];
            z[v] = 2.5 * tanh(raw / 2.5) / temperature, mx = fmax(mx, z[v]);
        }
        for (int v = 0; v < V; v++) s += exp(z[v] - mx);
        CHECK_NEAR(c.logp[t], z[targets[t]] - mx - log(s), 1e-5);
    }
    /* the one-pass head gives the same log-probs and gradients */
    void *fws = malloc(ctrl_cpu_head_fused_workspace_bytes(&c.a));
    float *logp2 = calloc(T, 4), *lse2 = calloc(T, 4), *dh2 = calloc(T * C, 4), *dw2 = calloc(V * C, 4);
    memset(dw, 0, sizeof(float) * V * C);
    ctrl_cpu_head_backward(&c.a, c.lse, c.R, NULL, NULL, dh, dw, c.ws);
    ctrl_cpu_head_forward_backward(&c.a, c.R, logp2, NULL, lse2, NULL, dh2, dw2, fws);
    CHECK(test_rel_error_f32(logp2, c.logp, T) < 1e-6);
    CHECK(test_rel_error_f32(dh2, dh, T * C) < 1e-5);
    CHECK(test_rel_error_f32(dw2, dw, V * C) < 1e-5);
    free(c.h), free(c.w), free(c.logp), free(c.lse), free(c.R), free(c.ws), free(dh), free(dw), free(fws),
        free(logp2), free(lse2), free(dh2), free(dw2);
}

TEST(softcapped_head_backward) {
    check_head(1.0f);
    check_head(0.7f);
}

typedef struct {
    int T, H, D, R;
    float *x, *out, *R_, *cos_tab, *sin_tab;
    int32_t *pos;
} prope_ctx;
static double prope_loss(void *p) {
    prope_ctx *c = p;
    ctrl_cpu_rope_partial_forward(c->out, c->x, c->pos, c->cos_tab, c->sin_tab, c->T, c->H, c->D, c->R);
    return dot(c->out, c->R_, (size_t)c->T * c->H * c->D);
}

/* The first R of D dimensions rotate (pairs i, i + R/2), the rest pass through; the backward is the
 * forward's derivative; R = D is the whole-head RoPE. Longrope's tables: 1 / (factor_i base^(2i/R)),
 * scaled by sqrt(1 + ln(factor) / ln(original)), short or long factors. */
TEST(partial_rope_and_longrope_tables) {
    prope_ctx c = {.T = 5, .H = 3, .D = 16, .R = 8};
    int32_t pos[5] = {0, 1, 2, 0, 9};
    const size_t n = (size_t)c.T * c.H * c.D;
    ctrl_rope_params p = {.kind = CTRL_ROPE_LONGROPE,
                          .theta = 100,
                          .factor = 8,
                          .original_max_position = 4,
                          .partial_rotary_factor = 0.5,
                          .n_factors = 4,
                          .short_factor = {1, 1.5f, 2, 3},
                          .long_factor = {2, 4, 8, 16}};
    c.pos = pos, c.x = rand_buf(n, 1), c.out = calloc(n, 4), c.R_ = rand_buf(n, 1);
    c.cos_tab = malloc(sizeof(float) * 16 * 4), c.sin_tab = malloc(sizeof(float) * 16 * 4);
    ctrl_cpu_rope_tables(c.cos_tab, c.sin_tab, 16, c.R, &p);
    const double scale = sqrt(1 + log(8.0) / log(4.0)); /* attention_factor */
    CHECK_NEAR(c.cos_tab[0], scale, 1e-6);
    CHECK_NEAR(c.sin_tab[9 * 4 + 2], sin(9.0 / (2 * pow(100, 4.0 / 8))) * scale, 1e-5);
    float *dx = calloc(n, 4);
    prope_loss(&c);
    for (int t = 0; t < c.T; t++) /* the pass-through half is the input */
        for (int d = c.R; d < c.D; d++)
            CHECK(c.out[(size_t)t * c.H * c.D + d] == c.x[(size_t)t * c.H * c.D + d]);
    ctrl_cpu_rope_partial_backward(dx, c.R_, c.pos, c.cos_tab, c.sin_tab, c.T, c.H, c.D, c.R);
    CHECK_MSG(fd_check(prope_loss, &c, c.x, dx, n, 1) < 1e-3, "dx");
    p.use_long = 1; /* the long factors */
    ctrl_cpu_rope_tables(c.cos_tab, c.sin_tab, 16, c.R, &p);
    CHECK_NEAR(c.sin_tab[9 * 4 + 3], sin(9.0 / (16 * pow(100, 6.0 / 8))) * scale, 1e-5);
    /* R = D: the whole-head kernel */
    float *full = calloc(n, 4), *ct = malloc(sizeof(float) * 16 * 8), *st = malloc(sizeof(float) * 16 * 8);
    ctrl_rope_params d = {.kind = CTRL_ROPE_DEFAULT, .theta = 100, .factor = 1, .partial_rotary_factor = 1};
    ctrl_cpu_rope_tables(ct, st, 16, c.D, &d);
    ctrl_cpu_rope_forward(full, c.x, pos, ct, st, c.T, c.H, c.D);
    ctrl_cpu_rope_partial_forward(c.out, c.x, pos, ct, st, c.T, c.H, c.D, c.D);
    CHECK(memcmp(full, c.out, n * 4) == 0);
    free(c.x), free(c.out), free(c.R_), free(c.cos_tab), free(c.sin_tab), free(dx), free(full), free(ct),
        free(st);
}

/* The mixture-of-experts row ops: gather (optionally scaled), scatter-add (scaled, accumulating in row
 * order with repeated rows) and the per-row dot product, against plain loops; the scatter is the
 * gather's transpose (<gather(x), y> = <x, scatter(y)>), which makes each the other's backward. */
TEST(moe_row_ops) {
    enum { T = 7, C = 5, N = 11 };
    const int32_t rows[N] = {3, 0, 6, 3, 1, 3, 2, 5, 0, 4, 6};
    float *x = rand_buf(T * C, 1), *y = rand_buf(N * C, 1), *s = rand_buf(N, 1), g[N * C], sc[T * C], d[N];
    ctrl_cpu_gather_rows(g, x, rows, s, N, C);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) CHECK(g[i * C + c] == s[i] * x[rows[i] * C + c]);
    memset(sc, 0, sizeof sc);
    ctrl_cpu_scatter_add_rows(sc, y, rows, s, N, C);
    float want[T * C] = {0};
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) want[rows[i] * C + c] += y[i * C + c] * s[i];
    /* the same sums; a compiler may fuse y * s + acc into one FMA (clang does by default) */
    for (int i = 0; i < T * C; i++) CHECK_NEAR(sc[i], want[i], 1e-6f * (1.0f + fabsf(want[i])));
    CHECK_NEAR(dot(g, y, N * C), dot(x, sc, T * C), 1e-5); /* transposes */
    ctrl_cpu_rows_dot(d, x, rows, y, N, C);
    for (int i = 0; i < N; i++) CHECK_NEAR(d[i], dot(x + rows[i] * C, y + i * C, C), 1e-6);
    free(x), free(y), free(s);
}
