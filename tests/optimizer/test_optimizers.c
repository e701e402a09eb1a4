/* The adamw and sgd plugins against torch.optim trajectories (tests/reference/make_optimizer_fixtures.py):
 * two parameter groups (with and without weight decay), a learning rate changing every step,
 * six steps; parameters must match torch to fp32 rounding. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/optimizer.h>
#include <ctrl/status.h>

#include "optimizer/optimizer_host.h"
#include "test.h"

const ctrl_plugin *const *ctrl_plugins_adamw(void);
const ctrl_plugin *const *ctrl_plugins_sgd(void);

static const ctrl_plugin *find_plugin(const char *kind) {
    const ctrl_plugin *const *list = !strcmp(kind, "adamw") ? ctrl_plugins_adamw() : ctrl_plugins_sgd();
    CHECK(list && list[0] && list[0]->kind == CTRL_KIND_OPTIMIZER && !strcmp(list[0]->name, kind));
    if (list && list[0] && list[0]->init) CHECK_EQ_INT(list[0]->init(&test_optimizer_host), CTRL_OK);
    return list ? list[0] : NULL;
}

static float *read_floats(FILE *f, const char *tag, int n) {
    char word[32];
    if (fscanf(f, "%31s", word) != 1 || strcmp(word, tag) != 0) return NULL;
    float *x = malloc((size_t)n * sizeof *x);
    for (int i = 0; i < n; i++)
        if (fscanf(f, "%f", &x[i]) != 1) {
            free(x);
            return NULL;
        }
    return x;
}

TEST(torch_trajectories) {
    char path[1024];
    snprintf(path, sizeof path, "%s/optimizer/optimizers.txt", CTRL_FIXTURE_DIR);
    FILE *f = fopen(path, "r");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    if (!f) return;
    char line[256];
    if (!fgets(line, sizeof line, f)) line[0] = 0; /* comment line */
    int cases = 0;
    char word[32], name[64], kind[16];
    int steps;
    while (fscanf(f, "%31s", word) == 1 && !strcmp(word, "case")) {
        CHECK(fscanf(f, "%63s %15s %d", name, kind, &steps) == 3);
        test_hp_table hp = {0};
        CHECK(fscanf(f, "%31s", word) == 1 && !strcmp(word, "hparams"));
        if (!fgets(line, sizeof line, f)) break;
        for (char *tok = strtok(line, " \n"); tok && hp.n < 8; tok = strtok(NULL, " \n")) {
            char *eq = strchr(tok, '=');
            if (!eq) continue;
            *eq = 0;
            test_hp_set(&hp, tok, atof(eq + 1));
        }
        ctrl_param_group groups[2];
        for (int g = 0; g < 2; g++) {
            int n;
            float wd;
            CHECK(fscanf(f, "%31s %d %f", word, &n, &wd) == 3 && !strcmp(word, "group"));
            groups[g].numel = n;
            groups[g].weight_decay = wd;
            groups[g].grad = NULL;
            groups[g].param = malloc((size_t)n * sizeof(float));
            for (int i = 0; i < n; i++) CHECK(fscanf(f, "%f", &groups[g].param[i]) == 1);
        }
        const ctrl_plugin *plugin = find_plugin(kind);
        if (!plugin) break;
        test_hp_fill_defaults(&hp, plugin);
        const ctrl_optimizer_ops *ops = plugin->ops;
        ctrl_optimizer *opt = NULL;
        CHECK_EQ_INT(ops->create(&test_optimizer_host, test_hp_config(&hp), groups, 2,
                                 (ctrl_device){CTRL_DEVICE_CPU, 0}, &opt),
                     CTRL_OK);
        double worst = 0;
        for (int t = 1; t <= steps; t++) {
            int tt;
            double lr;
            CHECK(fscanf(f, "%31s %d %lf", word, &tt, &lr) == 3 && tt == t);
            float *grads[2], *want[2];
            for (int g = 0; g < 2; g++) grads[g] = read_floats(f, "grad", (int)groups[g].numel);
            for (int g = 0; g < 2; g++) want[g] = read_floats(f, "param", (int)groups[g].numel);
            for (int g = 0; g < 2; g++) groups[g].grad = grads[g];
            CHECK_EQ_INT(ops->step(opt, groups, 2, lr, t), CTRL_OK);
            for (int g = 0; g < 2; g++) {
                double e = test_rel_error_f32(groups[g].param, want[g], groups[g].numel);
                if (e > worst) worst = e;
                free(grads[g]);
                free(want[g]);
            }
        }
        CHECK_MSG(worst <= 1e-6, "%s: relative error %.3g vs torch", name, worst);
        printf("  %-14s %d steps, worst relative error vs torch %.2e\n", name, steps, worst);
        /* The state is exported for checkpoints. */
        int n_state = ops->state_count(opt);
        CHECK(!strcmp(kind, "adamw") ? n_state == 4 : n_state >= 0);
        for (int i = 0; i < n_state; i++) {
            const char *sn;
            float *data;
            int64_t numel;
            CHECK_EQ_INT(ops->state_get(opt, i, &sn, &data, &numel), CTRL_OK);
            int g = !strcmp(kind, "adamw") ? i / 2 : i;
            CHECK(data != NULL && numel == groups[g].numel);
        }
        ops->destroy(opt);
        for (int g = 0; g < 2; g++) free(groups[g].param);
        CHECK(fscanf(f, "%31s", word) == 1 && !strcmp(word, "end"));
        cases++;
    }
    fclose(f);
    CHECK_EQ_INT(cases, 5);
}

/* The torch.optim.AdamW formula as the plugin's scalar loop computed it, one operation a statement
 * (no compiler may fuse a multiply and an add), for the groups' elements in turn. */
static void adamw_scalar(float *p, float *m, float *v, const float *g, int64_t n, double lr, double wd,
                         int64_t t, float scale) {
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float step_size = (float)(lr / (1.0 - pow(0.9, (double)t)));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(0.999, (double)t));
    const float decay = (float)(1.0 - lr * wd);
    for (int64_t i = 0; i < n; i++) {
        const float gi = g[i] * scale;
        p[i] *= decay;
        float a = b1 * m[i], b = (1.0f - b1) * gi;
        m[i] = a + b;
        a = b2 * v[i], b = (1.0f - b2) * gi, b = b * gi;
        v[i] = a + b;
        float denom = sqrtf(v[i]) / bc2_sqrt;
        denom = denom + eps;
        const float upd = step_size * m[i];
        p[i] -= upd / denom;
    }
}

/* The plugin's vectorised update (threads over blocks of 16384 across every group) equals that scalar
 * loop bit for bit on groups past the block edge, an empty one and one shorter than a vector
 * included; step_scaled(s) equals a step on gradients multiplied by s, and leaves them unscaled. */
TEST(adamw_vector_update_is_the_scalar_loop_bit_for_bit) {
    const ctrl_plugin *plugin = find_plugin("adamw");
    if (!plugin) return;
    test_hp_table hp = {0};
    test_hp_fill_defaults(&hp, plugin);
    const ctrl_optimizer_ops *ops = plugin->ops;
    CHECK(ops->size >= offsetof(ctrl_optimizer_ops, step_scaled) + sizeof ops->step_scaled &&
          ops->step_scaled);
    enum { G = 4 };
    const int64_t numel[G] = {7, 0, 16384 * 2 + 5, 50001};
    const float wd[G] = {0.0f, 0.1f, 0.01f, 0.1f};
    ctrl_param_group groups[G];
    float *ref_p[G], *ref_m[G], *ref_v[G], *grad[G], *grad_copy[G];
    uint32_t x = 12345;
    for (int g = 0; g < G; g++) {
        const size_t n = (size_t)numel[g] + 1;
        groups[g] =
            (ctrl_param_group){.param = malloc(n * sizeof(float)), .numel = numel[g], .weight_decay = wd[g]};
        ref_p[g] = malloc(n * sizeof(float)), ref_m[g] = calloc(n, sizeof(float));
        ref_v[g] = calloc(n, sizeof(float)), grad[g] = malloc(n * sizeof(float));
        grad_copy[g] = malloc(n * sizeof(float));
        for (int64_t i = 0; i < numel[g]; i++) {
            x = x * 1664525u + 1013904223u;
            groups[g].param[i] = ref_p[g][i] = (float)((x >> 8) * (1.0 / 16777216.0) - 0.5);
        }
        groups[g].grad = grad[g];
    }
    ctrl_optimizer *opt = NULL;
    CHECK_EQ_INT(ops->create(&test_optimizer_host, test_hp_config(&hp), groups, G,
                             (ctrl_device){CTRL_DEVICE_CPU, 0}, &opt),
                 CTRL_OK);
    if (!opt) return;
    const float scales[4] = {1.0f, 0.37f, 1.0f, 0.0123f};
    for (int t = 1; t <= 4; t++) {
        const double lr = 1e-3 * t;
        for (int g = 0; g < G; g++)
            for (int64_t i = 0; i < numel[g]; i++) {
                x = x * 1664525u + 1013904223u;
                grad[g][i] = (float)(((x >> 8) * (1.0 / 16777216.0) - 0.5) * (t == 2 ? 1e3 : 1.0));
                grad_copy[g][i] = grad[g][i];
            }
        for (int g = 0; g < G; g++)
            adamw_scalar(ref_p[g], ref_m[g], ref_v[g], grad[g], numel[g], lr, wd[g], t, scales[t - 1]);
        CHECK_EQ_INT(t % 2 ? ops->step(opt, groups, G, lr, t)
                           : ops->step_scaled(opt, groups, G, lr, t, scales[t - 1]),
                     CTRL_OK);
        for (int g = 0; g < G; g++) {
            const size_t bytes = (size_t)numel[g] * sizeof(float);
            CHECK_MSG(!memcmp(groups[g].param, ref_p[g], bytes), "step %d group %d: parameters differ", t, g);
            CHECK_MSG(!memcmp(grad[g], grad_copy[g], bytes), "step %d group %d: the gradients changed", t, g);
            const char *name;
            float *m, *v;
            int64_t n;
            CHECK_EQ_INT(ops->state_get(opt, 2 * g, &name, &m, &n), CTRL_OK);
            CHECK_EQ_INT(ops->state_get(opt, 2 * g + 1, &name, &v, &n), CTRL_OK);
            CHECK_MSG(!memcmp(m, ref_m[g], bytes) && !memcmp(v, ref_v[g], bytes),
                      "step %d group %d: state differs", t, g);
        }
    }
    ops->destroy(opt);
    for (int g = 0; g < G; g++)
        free(groups[g].param), free(ref_p[g]), free(ref_m[g]), free(ref_v[g]), free(grad[g]),
            free(grad_copy[g]);
}

/* The first step on the moments as created (zeros) and on moments written through state_get before
 * it (a resumed run's): bit for bit the scalar loop, the first step taken in two pieces (step_groups,
 * the overlapped offload's), the second whole; gradients with -0.0 among them. */
TEST(adamw_first_step_on_fresh_and_loaded_state) {
    const ctrl_plugin *plugin = find_plugin("adamw");
    if (!plugin) return;
    test_hp_table hp = {0};
    test_hp_fill_defaults(&hp, plugin);
    const ctrl_optimizer_ops *ops = plugin->ops;
    enum { G = 3 };
    const int64_t numel[G] = {16384 + 3, 9, 40000};
    for (int loaded = 0; loaded < 2; loaded++) {
        ctrl_param_group groups[G];
        float *ref_p[G], *ref_m[G], *ref_v[G], *grad[G] = {0};
        uint32_t x = 777u + (uint32_t)loaded;
        for (int g = 0; g < G; g++) {
            const size_t n = (size_t)numel[g];
            grad[g] = malloc(n * 4);
            groups[g] = (ctrl_param_group){
                .param = malloc(n * 4), .grad = grad[g], .numel = numel[g], .weight_decay = 0.01f * (float)g};
            ref_p[g] = malloc(n * 4), ref_m[g] = calloc(n, 4), ref_v[g] = calloc(n, 4);
            for (size_t i = 0; i < n; i++) {
                x = x * 1664525u + 1013904223u;
                groups[g].param[i] = ref_p[g][i] = (float)((x >> 8) * (1.0 / 16777216.0) - 0.5);
            }
        }
        ctrl_optimizer *opt = NULL;
        CHECK_EQ_INT(ops->create(&test_optimizer_host, test_hp_config(&hp), groups, G,
                                 (ctrl_device){CTRL_DEVICE_CPU, 0}, &opt),
                     CTRL_OK);
        if (!opt) return;
        if (loaded) /* a resumed run's state, written where state_get points */
            for (int i = 0; i < 2 * G; i++) {
                const char *name;
                float *d;
                int64_t n;
                CHECK_EQ_INT(ops->state_get(opt, i, &name, &d, &n), CTRL_OK);
                for (int64_t k = 0; k < n; k++)
                    d[k] = (i % 2 ? ref_v : ref_m)[i / 2][k] =
                        0.001f * (float)(k % 13) * (i % 2 ? 0.01f : 1.0f);
            }
        for (int t = 1; t <= 2; t++) {
            for (int g = 0; g < G; g++)
                for (int64_t i = 0; i < numel[g]; i++) {
                    x = x * 1664525u + 1013904223u;
                    grad[g][i] = i % 17 == 3 ? -0.0f : (float)((x >> 8) * (1.0 / 16777216.0) - 0.5);
                }
            for (int g = 0; g < G; g++)
                adamw_scalar(ref_p[g], ref_m[g], ref_v[g], groups[g].grad, numel[g], 1e-3,
                             groups[g].weight_decay, t, 1.0f);
            if (t == 1) { /* in two pieces, the later groups first */
                CHECK_EQ_INT(ops->step_groups(opt, groups, G, 1e-3, t, 1, G), CTRL_OK);
                CHECK_EQ_INT(ops->step_groups(opt, groups, G, 1e-3, t, 0, 1), CTRL_OK);
            } else
                CHECK_EQ_INT(ops->step(opt, groups, G, 1e-3, t), CTRL_OK);
            for (int g = 0; g < G; g++) {
                const size_t bytes = (size_t)numel[g] * 4;
                const char *name;
                float *m, *v;
                int64_t n;
                CHECK_MSG(!memcmp(groups[g].param, ref_p[g], bytes), "loaded %d step %d group %d: parameters",
                          loaded, t, g);
                CHECK_EQ_INT(ops->state_get(opt, 2 * g, &name, &m, &n), CTRL_OK);
                CHECK_EQ_INT(ops->state_get(opt, 2 * g + 1, &name, &v, &n), CTRL_OK);
                CHECK_MSG(!memcmp(m, ref_m[g], bytes) && !memcmp(v, ref_v[g], bytes),
                          "loaded %d step %d group %d: state", loaded, t, g);
            }
        }
        ops->destroy(opt);
        for (int g = 0; g < G; g++)
            free(groups[g].param), free(grad[g]), free(ref_p[g]), free(ref_m[g]), free(ref_v[g]);
    }
}

TEST(nesterov_needs_momentum) {
    test_hp_table hp = {0};
    test_hp_set(&hp, "nesterov", 1);
    test_hp_set(&hp, "momentum", 0);
    float p[3] = {0}, g[3] = {0};
    ctrl_param_group grp = {.param = p, .grad = g, .numel = 3};
    ctrl_optimizer *opt = NULL;
    const ctrl_plugin *sgd = find_plugin("sgd");
    if (!sgd) return;
    test_hp_fill_defaults(&hp, sgd);
    CHECK_EQ_INT(((const ctrl_optimizer_ops *)sgd->ops)
                     ->create(&test_optimizer_host, test_hp_config(&hp), &grp, 1,
                              (ctrl_device){CTRL_DEVICE_CPU, 0}, &opt),
                 CTRL_ERR_CONFIG);
    CHECK_CONTAINS(ctrl_error_message(), "nesterov");
}

/* State that cannot be allocated (a group larger than the address space) is CTRL_ERR_NOMEM with a
 * message, and create frees what it had built (the half-built optimizer goes through destroy). */
TEST(state_that_cannot_be_allocated_is_an_error) {
    static const char *const kinds[] = {"adamw", "sgd"};
    for (int k = 0; k < 2; k++) {
        const ctrl_plugin *p = find_plugin(kinds[k]);
        if (!p) return;
        test_hp_table hp = {0};
        test_hp_set(&hp, "momentum", 0.9); /* sgd keeps state only with momentum */
        test_hp_fill_defaults(&hp, p);
        float x = 0;
        ctrl_param_group groups[2] = {{.param = &x, .grad = &x, .numel = 1},
                                      {.param = &x, .grad = &x, .numel = (int64_t)1 << 61}};
        ctrl_optimizer *opt = NULL;
        CHECK_EQ_INT(((const ctrl_optimizer_ops *)p->ops)
                         ->create(&test_optimizer_host, test_hp_config(&hp), groups, 2,
                                  (ctrl_device){CTRL_DEVICE_CPU, 0}, &opt),
                     CTRL_ERR_NOMEM);
        CHECK_CONTAINS(ctrl_error_message(), "out of memory");
    }
}
