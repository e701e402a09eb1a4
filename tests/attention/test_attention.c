/* The attention parity suite, run on every attention plugin linked in: PyTorch fixtures
 * (scaled_dot_product_attention in float64, tests/reference/make_attention_fixtures.py), a grid of
 * random cases against a float64 reference written here, and finite differences of the backward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/attention.h>

#include "fixture.h"
#include "registry/registry.h"
#include "test.h"

const ctrl_plugin *const *ctrl_plugins_eager(void);
const ctrl_plugin *const *ctrl_plugins_flash(void);

typedef const ctrl_plugin *const *(*entry_fn)(void);
static const entry_fn plugins[] = {ctrl_plugins_eager, ctrl_plugins_flash};
#define N_PLUGINS (int)(sizeof plugins / sizeof plugins[0])

static const ctrl_attention_ops *plugin_ops(int i, const char **name) {
    const ctrl_plugin *p = plugins[i]()[0];
    if (p->init) p->init(ctrl_host_table());
    *name = p->name;
    return p->ops;
}

typedef struct attn_case {
    int B, T, H, HK, D, window;
    float scale;
    float softcap; /* Gemma 2's attention soft-capping; 0: none */
    int32_t cu[16];
    float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
} attn_case;

static ctrl_attention_args make_args(attn_case *c) {
    ctrl_attention_args a = {.size = sizeof a,
                             .device = {CTRL_DEVICE_CPU, 0},
                             .dtype = CTRL_F32,
                             .n_seqs = c->B,
                             .cu_seqlens = c->cu,
                             .cu_seqlens_host = c->cu,
                             .total_tokens = c->T,
                             .n_head = c->H,
                             .n_kv_head = c->HK,
                             .head_dim = c->D,
                             .scale = c->scale,
                             .causal = 1,
                             .window = c->window,
                             .q = c->q,
                             .k = c->k,
                             .v = c->v,
                             .out = c->out,
                             .lse = c->lse,
                             .dout = c->dout,
                             .dq = c->dq,
                             .dk = c->dk,
                             .dv = c->dv,
                             .softcap = c->softcap};
    return a;
}

static void alloc_case(attn_case *c) {
    size_t nq = (size_t)c->T * c->H * c->D, nk = (size_t)c->T * c->HK * c->D;
    c->q = malloc(nq * 4), c->dout = malloc(nq * 4), c->out = malloc(nq * 4), c->dq = malloc(nq * 4);
    c->k = malloc(nk * 4), c->v = malloc(nk * 4), c->dk = malloc(nk * 4), c->dv = malloc(nk * 4);
    c->lse = malloc((size_t)c->H * c->T * 4);
}

static void free_case(attn_case *c) {
    free(c->q), free(c->k), free(c->v), free(c->dout), free(c->out), free(c->lse);
    free(c->dq), free(c->dk), free(c->dv);
}

/* Outputs are poisoned with NaN before each call: every element must be written. */
static void poison(attn_case *c) {
    size_t nq = (size_t)c->T * c->H * c->D, nk = (size_t)c->T * c->HK * c->D;
    memset(c->out, 0xff, nq * 4), memset(c->dq, 0xff, nq * 4);
    memset(c->dk, 0xff, nk * 4), memset(c->dv, 0xff, nk * 4);
    memset(c->lse, 0xff, (size_t)c->H * c->T * 4);
}

/* float64 reference: out, lse and the gradients of sum(out * dout). */
static void reference(const attn_case *c, double *out, double *lse, double *dq, double *dk, double *dv) {
    const int H = c->H, HK = c->HK, D = c->D, T = c->T, g = H / HK;
    memset(dq, 0, sizeof(double) * T * H * D);
    memset(dk, 0, sizeof(double) * T * HK * D);
    memset(dv, 0, sizeof(double) * T * HK * D);
    double *p = malloc(sizeof(double) * T), *cap = malloc(sizeof(double) * T);
    for (int b = 0; b < c->B; b++) {
        int s0 = c->cu[b], L = c->cu[b + 1] - s0;
        for (int h = 0; h < H; h++) {
            int kh = h / g;
            for (int i = 0; i < L; i++) {
                const float *qi = c->q + ((size_t)(s0 + i) * H + h) * D;
                double m = -INFINITY;
                for (int j = 0; j < L; j++) {
                    int vis = j <= i && (c->window == 0 || j > i - c->window);
                    if (!vis) {
                        p[j] = -INFINITY;
                        continue;
                    }
                    const float *kj = c->k + ((size_t)(s0 + j) * HK + kh) * D;
                    double s = 0;
                    for (int d = 0; d < D; d++) s += (double)qi[d] * kj[d];
                    p[j] = s * c->scale;
                    if (c->softcap > 0) p[j] = c->softcap * tanh(p[j] / c->softcap);
                    cap[j] = c->softcap > 0 ? 1 - (p[j] / c->softcap) * (p[j] / c->softcap) : 1;
                    if (p[j] > m) m = p[j];
                }
                double sum = 0;
                for (int j = 0; j < L; j++) sum += p[j] == -INFINITY ? 0 : exp(p[j] - m);
                lse[(size_t)h * T + s0 + i] = m + log(sum);
                for (int j = 0; j < L; j++) p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - m) / sum;
                double *oi = out + ((size_t)(s0 + i) * H + h) * D;
                const float *doi = c->dout + ((size_t)(s0 + i) * H + h) * D;
                for (int d = 0; d < D; d++) oi[d] = 0;
                for (int j = 0; j < L; j++)
                    for (int d = 0; d < D; d++) oi[d] += p[j] * c->v[((size_t)(s0 + j) * HK + kh) * D + d];
                double Di = 0;
                for (int d = 0; d < D; d++) Di += doi[d] * oi[d];
                for (int j = 0; j < L; j++) {
                    if (p[j] == 0) continue;
                    size_t ko = ((size_t)(s0 + j) * HK + kh) * D;
                    double dp = 0;
                    for (int d = 0; d < D; d++) {
                        dv[ko + d] += p[j] * doi[d];
                        dp += doi[d] * c->v[ko + d];
                    }
                    double ds = p[j] * (dp - Di) * c->scale * cap[j];
                    for (int d = 0; d < D; d++) {
                        dq[((size_t)(s0 + i) * H + h) * D + d] += ds * c->k[ko + d];
                        dk[ko + d] += ds * qi[d];
                    }
                }
            }
        }
    }
    free(p), free(cap);
}

static double rel_f32_f64(const float *a, const double *b, long n) {
    double num = 0, den = 0;
    for (long i = 0; i < n; i++) {
        if (isnan(a[i])) return INFINITY;
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static unsigned long long rng_state = 88172645463325252ull;
static float frand(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void check_case(const ctrl_attention_ops *ops, const char *pname, attn_case *c, const char *label) {
    ctrl_attention_args a = make_args(c);
    poison(c);
    CHECK_EQ_INT(ops->forward(&a, NULL), CTRL_OK);
    CHECK_EQ_INT(ops->backward(&a, NULL), CTRL_OK);
    size_t nq = (size_t)c->T * c->H * c->D, nk = (size_t)c->T * c->HK * c->D;
    double *out = malloc(nq * 8), *lse = malloc((size_t)c->H * c->T * 8), *dq = malloc(nq * 8);
    double *dk = malloc(nk * 8), *dv = malloc(nk * 8);
    reference(c, out, lse, dq, dk, dv);
    double e[5] = {rel_f32_f64(c->out, out, (long)nq), rel_f32_f64(c->lse, lse, (long)c->H * c->T),
                   rel_f32_f64(c->dq, dq, (long)nq), rel_f32_f64(c->dk, dk, (long)nk),
                   rel_f32_f64(c->dv, dv, (long)nk)};
    const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++)
        CHECK_MSG(e[i] <= 1e-5, "%s %s: %s relative error %.3g vs float64", pname, label, names[i], e[i]);
    free(out), free(lse), free(dq), free(dk), free(dv);
}

TEST(random_grid_vs_float64) {
    static const struct {
        int lens[5], n, H, HK, D, window;
    } grid[] = {
        {{1, 7, 64}, 3, 4, 4, 64, 0},      {{129}, 1, 8, 2, 64, 0},      {{300}, 1, 8, 1, 64, 0},
        {{7, 64, 1}, 3, 8, 8, 128, 0},     {{129, 5}, 2, 4, 1, 128, 16}, {{64, 300}, 2, 8, 4, 64, 32},
        {{33, 1, 17, 2}, 4, 16, 2, 64, 5},
    };
    for (int pi = 0; pi < N_PLUGINS; pi++) {
        const char *pname;
        const ctrl_attention_ops *ops = plugin_ops(pi, &pname);
        for (size_t g = 0; g < sizeof grid / sizeof grid[0]; g++) {
            attn_case c = {
                .B = grid[g].n, .H = grid[g].H, .HK = grid[g].HK, .D = grid[g].D, .window = grid[g].window};
            c.scale = 1.0f / sqrtf((float)c.D);
            c.cu[0] = 0;
            for (int b = 0; b < c.B; b++) c.cu[b + 1] = c.cu[b] + grid[g].lens[b];
            c.T = c.cu[c.B];
            alloc_case(&c);
            for (size_t i = 0; i < (size_t)c.T * c.H * c.D; i++) c.q[i] = frand(), c.dout[i] = frand();
            for (size_t i = 0; i < (size_t)c.T * c.HK * c.D; i++) c.k[i] = frand(), c.v[i] = frand();
            char label[64];
            snprintf(label, sizeof label, "grid case %zu", g);
            check_case(ops, pname, &c, label);
            free_case(&c);
        }
    }
}

TEST(pytorch_fixtures) {
    static const char *const names[] = {"packed_gqa", "mqa_window", "mha_scale"};
    for (int pi = 0; pi < N_PLUGINS; pi++) {
        const char *pname;
        const ctrl_attention_ops *ops = plugin_ops(pi, &pname);
        for (int f = 0; f < 3; f++) {
            char path[1024];
            snprintf(path, sizeof path, "%s/attention/%s.bin", CTRL_FIXTURE_DIR, names[f]);
            fixture *fx = fixture_load(path);
            CHECK_MSG(fx != NULL, "missing fixture %s", path);
            if (!fx) continue;
            long n;
            const float *shape = fixture_get(fx, "shape", &n), *cu = fixture_get(fx, "cu_seqlens", NULL);
            attn_case c = {.B = (int)shape[0],
                           .T = (int)shape[1],
                           .H = (int)shape[2],
                           .HK = (int)shape[3],
                           .D = (int)shape[4],
                           .window = (int)shape[5],
                           .scale = shape[6]};
            for (int b = 0; b <= c.B; b++) c.cu[b] = (int32_t)cu[b];
            alloc_case(&c);
            size_t nq = (size_t)c.T * c.H * c.D, nk = (size_t)c.T * c.HK * c.D;
            memcpy(c.q, fixture_get(fx, "q", NULL), nq * 4);
            memcpy(c.k, fixture_get(fx, "k", NULL), nk * 4);
            memcpy(c.v, fixture_get(fx, "v", NULL), nk * 4);
            memcpy(c.dout, fixture_get(fx, "dout", NULL), nq * 4);
            ctrl_attention_args a = make_args(&c);
            poison(&c);
            CHECK_EQ_INT(ops->forward(&a, NULL), CTRL_OK);
            CHECK_EQ_INT(ops->backward(&a, NULL), CTRL_OK);
            struct {
                const char *name;
                const float *got;
                long n;
            } cmp[] = {{"out", c.out, (long)nq},
                       {"lse", c.lse, (long)c.H * c.T},
                       {"dq", c.dq, (long)nq},
                       {"dk", c.dk, (long)nk},
                       {"dv", c.dv, (long)nk}};
            for (int i = 0; i < 5; i++) {
                double e = test_rel_error_f32(cmp[i].got, fixture_get(fx, cmp[i].name, NULL), cmp[i].n);
                CHECK_MSG(e <= 1e-5, "%s %s: %s relative error %.3g vs torch", pname, names[f], cmp[i].name,
                          e);
            }
            free_case(&c);
            fixture_free(fx);
        }
    }
}

/* Finite differences of L = sum(out * dout) through the plugin's own forward, in float32 with a
 * step large enough for float32 rounding: checks the backward is the derivative of the forward. */
static void finite_differences(float softcap) {
    for (int pi = 0; pi < N_PLUGINS; pi++) {
        const char *pname;
        const ctrl_attention_ops *ops = plugin_ops(pi, &pname);
        attn_case c = {.B = 2, .H = 4, .HK = 2, .D = 8, .window = 3, .scale = 0.35f, .softcap = softcap};
        c.cu[0] = 0, c.cu[1] = 5, c.cu[2] = 9;
        c.T = 9;
        alloc_case(&c);
        size_t nq = (size_t)c.T * c.H * c.D, nk = (size_t)c.T * c.HK * c.D;
        for (size_t i = 0; i < nq; i++) c.q[i] = frand(), c.dout[i] = frand();
        for (size_t i = 0; i < nk; i++) c.k[i] = frand(), c.v[i] = frand();
        ctrl_attention_args a = make_args(&c);
        CHECK_EQ_INT(ops->forward(&a, NULL), CTRL_OK);
        CHECK_EQ_INT(ops->backward(&a, NULL), CTRL_OK);
        float *grads[3] = {c.dq, c.dk, c.dv}, *inputs[3] = {c.q, c.k, c.v};
        size_t counts[3] = {nq, nk, nk};
        float *saved = malloc(nq * 4);
        double worst = 0;
        for (int t = 0; t < 3; t++) {
            float *g = malloc(counts[t] * 4);
            memcpy(g, grads[t], counts[t] * 4);
            for (size_t i = 0; i < counts[t]; i += 7) {
                const float h = 1e-2f, x0 = inputs[t][i];
                double lp = 0, lm = 0;
                inputs[t][i] = x0 + h;
                ops->forward(&a, NULL);
                for (size_t j = 0; j < nq; j++) lp += (double)c.out[j] * c.dout[j];
                inputs[t][i] = x0 - h;
                ops->forward(&a, NULL);
                for (size_t j = 0; j < nq; j++) lm += (double)c.out[j] * c.dout[j];
                inputs[t][i] = x0;
                double fd = (lp - lm) / (2 * h), err = fabs(fd - g[i]) / (1e-2 + fabs(fd));
                if (err > worst) worst = err;
            }
            free(g);
        }
        CHECK_MSG(worst < 2e-3, "%s (softcap %g): finite-difference mismatch %.3g", pname, softcap, worst);
        free(saved);
        free_case(&c);
    }
}

TEST(backward_finite_differences) { finite_differences(0); }

/* Gemma 2's attention logit soft-capping (cap 1.5 bends scores of a few units): against float64, and
 * the backward against finite differences, for every plugin that declares it. */
TEST(softcap_vs_float64_and_finite_differences) {
    for (int pi = 0; pi < N_PLUGINS; pi++) {
        const char *pname;
        const ctrl_attention_ops *ops = plugin_ops(pi, &pname);
        CHECK_MSG(ctrl_attention_has(ops, CTRL_ATTENTION_SOFTCAP), "%s does not declare soft-capping", pname);
        attn_case c = {.B = 3, .H = 4, .HK = 2, .D = 16, .window = 5, .scale = 0.7f, .softcap = 1.5f};
        c.cu[0] = 0, c.cu[1] = 7, c.cu[2] = 19, c.cu[3] = 90; /* 71 tokens: flash's tiles of 64 split */
        c.T = 90;
        alloc_case(&c);
        size_t nq = (size_t)c.T * c.H * c.D, nk = (size_t)c.T * c.HK * c.D;
        for (size_t i = 0; i < nq; i++) c.q[i] = 2 * frand(), c.dout[i] = frand();
        for (size_t i = 0; i < nk; i++) c.k[i] = 2 * frand(), c.v[i] = frand();
        check_case(ops, pname, &c, "softcap 1.5 window 5");
        c.window = 0;
        check_case(ops, pname, &c, "softcap 1.5");
        free_case(&c);
    }
    finite_differences(1.5f);
}

TEST(rejects_what_it_cannot_run) {
    for (int pi = 0; pi < N_PLUGINS; pi++) {
        const char *pname;
        const ctrl_attention_ops *ops = plugin_ops(pi, &pname);
        attn_case c = {.B = 1, .T = 4, .H = 3, .HK = 2, .D = 8, .scale = 1};
        c.cu[1] = 4;
        ctrl_attention_args a = make_args(&c);
        CHECK(ops->supports && !ops->supports(&a)); /* 3 heads over 2 kv heads */
        CHECK_EQ_INT(ops->forward(&a, NULL), CTRL_ERR_UNSUPPORTED);
        CHECK_CONTAINS(ctrl_error_message(), pname);
    }
}
