/* CPU kernels against PyTorch / transformers (tests/reference/make_kernel_fixtures.py), float32:
 * relative L2 error <= 1e-5 per op, outputs and gradients. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "fixture.h"
#include "test.h"

static fixture *load(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/kernels/%s.bin", CTRL_FIXTURE_DIR, name);
    fixture *f = fixture_load(path);
    CHECK_MSG(f != NULL, "fixture %s", path);
    return f;
}
#define GET(f, name) fixture_get((f), (name), NULL)
#define EXPECT_REL(got, f, name, n, tol)                                                                     \
    do {                                                                                                     \
        double e_ = test_rel_error_f32((got), GET(f, name), (n));                                            \
        CHECK_MSG(e_ <= (tol), "%s: relative error %.3g vs torch", name, e_);                                \
    } while (0)

TEST(rmsnorm_vs_llama_rmsnorm) {
    fixture *f = load("rmsnorm");
    if (!f) return;
    const float *s = GET(f, "shape");
    int T = (int)s[0], C = (int)s[1];
    float *out = malloc(sizeof(float) * T * C), *rstd = malloc(sizeof(float) * T),
          *dx = malloc(sizeof(float) * T * C);
    float *dw = calloc(C, sizeof(float));
    ctrl_cpu_rmsnorm_forward(out, rstd, GET(f, "x"), GET(f, "weight"), T, C, s[2]);
    ctrl_cpu_rmsnorm_backward(dx, dw, GET(f, "dout"), GET(f, "x"), GET(f, "weight"), rstd, T, C);
    EXPECT_REL(out, f, "out", T * C, 1e-5);
    EXPECT_REL(dx, f, "dx", T * C, 1e-5);
    EXPECT_REL(dw, f, "dweight", C, 1e-5);
    free(out), free(rstd), free(dx), free(dw), fixture_free(f);
}

TEST(linear_vs_torch) {
    fixture *f = load("linear");
    if (!f) return;
    const float *s = GET(f, "shape");
    int T = (int)s[0], IN = (int)s[1], OUT = (int)s[2];
    float *out = malloc(sizeof(float) * T * OUT), *dx = malloc(sizeof(float) * T * IN);
    float *dw = calloc((size_t)OUT * IN, sizeof(float)), *db = calloc(OUT, sizeof(float));
    ctrl_cpu_linear_forward(out, GET(f, "x"), GET(f, "w"), GET(f, "b"), T, IN, OUT);
    ctrl_cpu_linear_backward(dx, dw, db, GET(f, "dout"), GET(f, "x"), GET(f, "w"), T, IN, OUT);
    EXPECT_REL(out, f, "out", T * OUT, 1e-5);
    EXPECT_REL(dx, f, "dx", T * IN, 1e-5);
    EXPECT_REL(dw, f, "dw", OUT * IN, 1e-5);
    EXPECT_REL(db, f, "db", OUT, 1e-5);
    free(out), free(dx), free(dw), free(db), fixture_free(f);
}

TEST(swiglu_vs_torch) {
    fixture *f = load("swiglu");
    if (!f) return;
    int n = (int)GET(f, "shape")[0];
    float *out = malloc(sizeof(float) * n), *dg = malloc(sizeof(float) * n), *du = malloc(sizeof(float) * n);
    ctrl_cpu_swiglu_forward(out, GET(f, "gate"), GET(f, "up"), n);
    ctrl_cpu_swiglu_backward(dg, du, GET(f, "dout"), GET(f, "gate"), GET(f, "up"), n);
    EXPECT_REL(out, f, "out", n, 1e-5);
    EXPECT_REL(dg, f, "dgate", n, 1e-5);
    EXPECT_REL(du, f, "dup", n, 1e-5);
    free(out), free(dg), free(du), fixture_free(f);
}

TEST(rope_every_kind_vs_transformers) {
    static const char *const kinds[] = {"default", "linear", "llama3", "yarn", "dynamic"};
    for (int k = 0; k < 5; k++) {
        char name[64];
        snprintf(name, sizeof name, "rope_%s", kinds[k]);
        fixture *f = load(name);
        if (!f) continue;
        const float *s = GET(f, "shape");
        int T = (int)s[0], H = (int)s[1], D = (int)s[2];
        ctrl_rope_params p = {.kind = (ctrl_rope_kind)(int)s[3],
                              .theta = s[4],
                              .factor = s[5],
                              .low_freq_factor = s[6],
                              .high_freq_factor = s[7],
                              .original_max_position = (int)s[8],
                              .partial_rotary_factor = 1};
        const int max_pos = 2048;
        float *cos_tab = malloc(sizeof(float) * max_pos * D / 2),
              *sin_tab = malloc(sizeof(float) * max_pos * D / 2);
        ctrl_cpu_rope_tables(cos_tab, sin_tab, max_pos, D, &p);
        int32_t pos[64];
        const float *pf = GET(f, "positions");
        float *c = malloc(sizeof(float) * T * D / 2), *sn = malloc(sizeof(float) * T * D / 2);
        for (int t = 0; t < T; t++) {
            pos[t] = (int32_t)pf[t];
            memcpy(c + t * D / 2, cos_tab + (size_t)pos[t] * D / 2, sizeof(float) * D / 2);
            memcpy(sn + t * D / 2, sin_tab + (size_t)pos[t] * D / 2, sizeof(float) * D / 2);
        }
        double ec = test_rel_error_f32(c, GET(f, "cos"), T * D / 2),
               es = test_rel_error_f32(sn, GET(f, "sin"), T * D / 2);
        CHECK_MSG(ec <= 1e-5 && es <= 1e-5, "rope %s: cos %.3g, sin %.3g vs transformers", kinds[k], ec, es);
        size_t n = (size_t)T * H * D;
        float *out = malloc(n * 4), *dx = malloc(n * 4);
        ctrl_cpu_rope_forward(out, GET(f, "x"), pos, cos_tab, sin_tab, T, H, D);
        ctrl_cpu_rope_backward(dx, GET(f, "dout"), pos, cos_tab, sin_tab, T, H, D);
        double eo = test_rel_error_f32(out, GET(f, "out"), (long)n),
               ed = test_rel_error_f32(dx, GET(f, "dx"), (long)n);
        CHECK_MSG(eo <= 1e-5 && ed <= 1e-5, "rope %s: out %.3g, dx %.3g vs transformers", kinds[k], eo, ed);
        printf("  rope %-8s cos %.1e sin %.1e out %.1e dx %.1e\n", kinds[k], ec, es, eo, ed);
        free(cos_tab), free(sin_tab), free(c), free(sn), free(out), free(dx), fixture_free(f);
    }
}

TEST(head_vs_log_softmax) {
    fixture *f = load("head");
    if (!f) return;
    const float *s = GET(f, "shape");
    int T = (int)s[0], C = (int)s[1], V = (int)s[2];
    int32_t *tg = malloc(sizeof(int32_t) * T);
    for (int t = 0; t < T; t++) tg[t] = (int32_t)GET(f, "targets")[t];
    for (int chunked = 0; chunked < 2; chunked++) {
        ctrl_head_args a = {.hidden = GET(f, "hidden"),
                            .w = GET(f, "w"),
                            .targets = tg,
                            .T = T,
                            .C = C,
                            .V = V,
                            .temperature = s[3],
                            .chunk_tokens = chunked ? 4 : 0,
                            .chunk_vocab = chunked ? 128 : 0};
        void *ws = malloc(ctrl_cpu_head_workspace_bytes(&a));
        float *logp = malloc(4 * T), *ent = malloc(4 * T), *lse = malloc(4 * T), *okf = malloc(4 * T);
        int32_t *ok = malloc(4 * T);
        float *dh = malloc(sizeof(float) * T * C), *dw = calloc((size_t)V * C, sizeof(float));
        ctrl_cpu_head_forward(&a, logp, ent, lse, ok, ws);
        ctrl_cpu_head_backward(&a, lse, GET(f, "dlogp"), ent, GET(f, "dentropy"), dh, dw, ws);
        for (int t = 0; t < T; t++) okf[t] = (float)ok[t];
        EXPECT_REL(logp, f, "logp", T, 1e-5);
        EXPECT_REL(ent, f, "entropy", T, 1e-5);
        EXPECT_REL(lse, f, "lse", T, 1e-5);
        CHECK(memcmp(okf, GET(f, "correct"), 4 * T) == 0);
        EXPECT_REL(dh, f, "dhidden", T * C, 1e-5);
        EXPECT_REL(dw, f, "dw", V * C, 1e-5);
        free(ws), free(logp), free(ent), free(lse), free(okf), free(ok), free(dh), free(dw);
    }
    free(tg), fixture_free(f);
}
