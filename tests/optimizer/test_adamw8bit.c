/* The adamw_8bit plugin against bitsandbytes itself (tests/reference/make_adamw8bit_fixtures.py,
 * bitsandbytes' AdamW8bit stepped on the CPU): its dynamic maps and blockwise quantizer byte for byte,
 * then N steps on tensors above and below min_8bit_size (several blocks, a partial last block, a
 * block whose gradient stays zero, weight decay on and off): the final 8-bit states and absmax equal
 * to bitsandbytes', the parameters after every step within fp32 rounding; and a resume through
 * state_get continuing the same trajectory bit for bit. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/optimizer.h>
#include <ctrl/status.h>

#include "../../plugins/optimizer/adamw_8bit/blockwise8.h"
#include "fixture.h"
#include "optimizer/optimizer_host.h"
#include "test.h"

const ctrl_plugin *const *ctrl_plugins_adamw_8bit(void);

/* The options as a validated config would hold them. */
static test_hp_table hparams_of(double b1, double b2, double eps, double min8) {
    test_hp_table hp = {0};
    test_hp_set(&hp, "adam_beta1", b1);
    test_hp_set(&hp, "adam_beta2", b2);
    test_hp_set(&hp, "adam_epsilon", eps);
    test_hp_set(&hp, "min_8bit_size", min8);
    return hp;
}

static const ctrl_optimizer_ops *plugin_ops(void) {
    const ctrl_plugin *const *list = ctrl_plugins_adamw_8bit();
    CHECK(list && list[0] && list[0]->kind == CTRL_KIND_OPTIMIZER && !strcmp(list[0]->name, "adamw_8bit"));
    if (!list || !list[0]) return NULL;
    CHECK_EQ_INT(list[0]->init(&test_optimizer_host), CTRL_OK);
    return list[0]->ops;
}

static fixture *open_fixture(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/optimizer/%s", CTRL_FIXTURE_DIR, name);
    fixture *f = fixture_load(path);
    CHECK_MSG(f != NULL, "cannot load %s", path);
    return f;
}

/* The script's inputs: integers times powers of two, exact in fp32 (make_adamw8bit_fixtures.py's
 * lattice). */
static void lattice(float *v, int64_t n, int salt, int step, int zero_block) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = (i * 7919 + (int64_t)step * 104729 + (int64_t)salt * 31) % 20001 - 10000;
        const int e = (int)((i / BW8_BLOCK) % 5) - 2;
        v[i] = (float)k * 0x1p-13f * ldexpf(1.0f, e);
        if (zero_block >= 0 && i / BW8_BLOCK == zero_block) v[i] = 0;
    }
}

TEST(dynamic_maps_and_quantizer_are_bitsandbytes) {
    fixture *f = open_fixture("adamw8bit_maps.bin");
    if (!f) return;
    static const char *const kinds[2] = {"unsigned", "signed"};
    for (int s = 0; s < 2; s++) {
        char name[64];
        float map[256];
        static uint8_t lut[BW8_LUT];
        bw8_dynamic_map(s, map);
        bw8_build_lut(map, lut);
        snprintf(name, sizeof name, "map_%s", kinds[s]);
        const float *want = fixture_array(f, name, 256);
        int bad = 0;
        for (int i = 0; want && i < 256; i++) bad += map[i] != want[i];
        CHECK_MSG(want && bad == 0, "%s: %d of 256 values differ from bitsandbytes'", name, bad);
        long n = 0;
        snprintf(name, sizeof name, "q_in_%s", kinds[s]);
        const float *x = fixture_get(f, name, &n);
        snprintf(name, sizeof name, "q_out_%s", kinds[s]);
        const float *q_want = fixture_array(f, name, n);
        snprintf(name, sizeof name, "q_absmax_%s", kinds[s]);
        const float *a_want = fixture_array(f, name, (n + BW8_BLOCK - 1) / BW8_BLOCK);
        if (!x || !q_want || !a_want) continue;
        int qbad = 0, abad = 0;
        for (long b = 0; b * BW8_BLOCK < n; b++) {
            uint8_t q[BW8_BLOCK];
            float a;
            const int len = (int)(n - b * BW8_BLOCK < BW8_BLOCK ? n - b * BW8_BLOCK : BW8_BLOCK);
            bw8_quantize_block(lut, x + b * BW8_BLOCK, len, q, &a);
            abad += a != a_want[b];
            for (int i = 0; i < len; i++) {
                if (q[i] != (uint8_t)q_want[b * BW8_BLOCK + i] && qbad++ < 5)
                    printf("  %s [%ld]: %.9g -> %d, bitsandbytes %d\n", kinds[s], b * BW8_BLOCK + i,
                           (double)x[b * BW8_BLOCK + i], q[i], (int)q_want[b * BW8_BLOCK + i]);
            }
        }
        CHECK_MSG(qbad == 0 && abad == 0, "%s quantize_blockwise: %d indices, %d absmax differ", kinds[s],
                  qbad, abad);
    }
    fixture_free(f);
}

typedef struct run {
    int n;
    ctrl_param_group groups[2];
    float *grads[2];
} run;

static void run_free(run *r) {
    for (int j = 0; j < r->n; j++) free(r->groups[j].param), free(r->grads[j]);
}

/* The case's parameters and groups; the steps' gradients are made per step. */
static void run_init(run *r, const float *sizes, const float *hparams) {
    r->n = 2;
    for (int j = 0; j < 2; j++) {
        const int64_t n = (int64_t)sizes[j];
        r->groups[j] = (ctrl_param_group){
            .param = malloc((size_t)n * sizeof(float)), .numel = n, .weight_decay = hparams[5 + j]};
        r->grads[j] = malloc((size_t)n * sizeof(float));
        lattice(r->groups[j].param, n, 11 + j, 0, -1);
        for (int64_t i = 0; i < n; i++) r->groups[j].param[i] *= 4.0f;
        r->groups[j].grad = r->grads[j];
    }
}

static void make_grads(run *r, int t) {
    for (int j = 0; j < r->n; j++)
        lattice(r->grads[j], r->groups[j].numel, 21 + j, t,
                j == 0 && r->groups[j].numel > 4 * BW8_BLOCK ? 3 : -1);
}

/* Every state buffer of a and b equal byte for byte. */
static int same_state(const ctrl_optimizer_ops *ops, ctrl_optimizer *a, ctrl_optimizer *b) {
    const int n = ops->state_count(a);
    if (n != ops->state_count(b)) return 0;
    for (int i = 0; i < n; i++) {
        const char *na, *nb;
        float *da, *db;
        int64_t ea, eb;
        if (ops->state_get(a, i, &na, &da, &ea) || ops->state_get(b, i, &nb, &db, &eb) || ea != eb) return 0;
        if (memcmp(da, db, (size_t)ea * ctrl_dtype_size(ctrl_optimizer_state_dtype(ops, a, i)))) return 0;
    }
    return 1;
}

static double decimal(float x) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.6g", (double)x);
    return strtod(buf, NULL);
}

static void check_case(const char *file) {
    const ctrl_optimizer_ops *ops = plugin_ops();
    fixture *f = open_fixture(file);
    if (!ops || !f) {
        fixture_free(f);
        return;
    }
    const float *hparams = fixture_array(f, "hparams", 7), *sizes = fixture_array(f, "sizes", 2);
    if (!hparams || !sizes) {
        fixture_free(f);
        return;
    }
    /* the script's decimal hyper-parameters (stored as fp32): their shortest decimal, as Python had them */
    const test_hp_table hp =
        hparams_of(decimal(hparams[0]), decimal(hparams[1]), decimal(hparams[2]), hparams[3]);
    const int steps = (int)hparams[4];
    run r, resumed;
    run_init(&r, sizes, hparams);
    run_init(&resumed, sizes, hparams);
    ctrl_optimizer *opt = NULL, *opt2 = NULL;
    CHECK_EQ_INT(ops->create(&test_optimizer_host, test_hp_config(&hp), r.groups, 2,
                             (ctrl_device){CTRL_DEVICE_CPU, 0}, &opt),
                 CTRL_OK);
    CHECK_EQ_INT(ops->create(&test_optimizer_host, test_hp_config(&hp), resumed.groups, 2,
                             (ctrl_device){CTRL_DEVICE_CPU, 0}, &opt2),
                 CTRL_OK);
    if (!opt || !opt2) goto done;
    double worst = 0;
    for (int t = 1; t <= steps; t++) {
        char name[64];
        snprintf(name, sizeof name, "lr%d", t);
        const float *lr = fixture_array(f, name, 1);
        if (!lr) break;
        make_grads(&r, t);
        CHECK_EQ_INT(ops->step(opt, r.groups, 2, lr[0], t), CTRL_OK);
        for (int j = 0; j < 2; j++) {
            snprintf(name, sizeof name, "param%d_step%d", j, t);
            const float *want = fixture_array(f, name, (long)r.groups[j].numel);
            if (!want) continue;
            const double e = test_rel_error_f32(r.groups[j].param, want, (long)r.groups[j].numel);
            if (e > worst) worst = e;
        }
        if (t == 1) { /* a resume after step 1: the state (as a checkpoint holds it) and the weights copied */
            make_grads(&resumed, 1);
            CHECK_EQ_INT(ops->step(opt2, resumed.groups, 2, lr[0], 1), CTRL_OK);
            ops->destroy(opt2);
            for (int j = 0; j < 2; j++)
                memcpy(resumed.groups[j].param, r.groups[j].param, (size_t)r.groups[j].numel * sizeof(float));
            opt2 = NULL;
            CHECK_EQ_INT(ops->create(&test_optimizer_host, test_hp_config(&hp), resumed.groups, 2,
                                     (ctrl_device){CTRL_DEVICE_CPU, 0}, &opt2),
                         CTRL_OK);
            if (!opt2) break;
            for (int i = 0; i < ops->state_count(opt); i++) {
                const char *na, *nb;
                float *da, *db;
                int64_t ea, eb;
                CHECK_EQ_INT(ops->state_get(opt, i, &na, &da, &ea), CTRL_OK);
                CHECK_EQ_INT(ops->state_get(opt2, i, &nb, &db, &eb), CTRL_OK);
                CHECK(ea == eb && !strcmp(na, nb));
                memcpy(db, da, (size_t)ea * ctrl_dtype_size(ctrl_optimizer_state_dtype(ops, opt, i)));
            }
        } else {
            make_grads(&resumed, t);
            CHECK_EQ_INT(ops->step(opt2, resumed.groups, 2, lr[0], t), CTRL_OK);
        }
    }
    CHECK_MSG(worst <= 2e-6, "%s: parameters' relative error %.3g vs bitsandbytes", file, worst);
    printf("  %-22s %d steps, parameters' worst relative error vs bitsandbytes %.2e\n", file, steps, worst);
    /* the final states: bitsandbytes' bytes and absmax, or its fp32 moments below min_8bit_size */
    int buf = 0;
    for (int j = 0; j < 2; j++) {
        const int is8 = r.groups[j].numel >= (int64_t)hparams[3];
        static const char *const n8[4] = {"state1", "state2", "absmax1", "absmax2"};
        static const char *const n32[2] = {"exp_avg", "exp_avg_sq"};
        for (int k = 0; k < (is8 ? 4 : 2); k++, buf++) {
            const char *name;
            float *data;
            int64_t numel;
            CHECK_EQ_INT(ops->state_get(opt, buf, &name, &data, &numel), CTRL_OK);
            CHECK_STR(name, n8[k]);
            char key[64];
            snprintf(key, sizeof key, "%s_%d", is8 ? n8[k] : n32[k], j);
            const float *want = fixture_array(f, key, (long)numel);
            if (!want) continue;
            const ctrl_dtype dt = ctrl_optimizer_state_dtype(ops, opt, buf);
            CHECK_EQ_INT(dt, is8 && k < 2 ? CTRL_U8 : CTRL_F32);
            long bad = 0;
            double err = 0;
            for (int64_t i = 0; i < numel; i++) {
                if (dt == CTRL_U8) {
                    bad += ((const uint8_t *)(const void *)data)[i] != (uint8_t)want[i];
                } else if (is8) {
                    if (data[i] != want[i] && bad < 3)
                        printf("    %s[%lld] %.9g vs %.9g\n", key, (long long)i, (double)data[i],
                               (double)want[i]);
                    bad += data[i] != want[i];
                } else {
                    const double d = fabs((double)data[i] - want[i]) / (fabs(want[i]) + 1e-12);
                    err = d > err ? d : err;
                }
            }
            CHECK_MSG(bad == 0 && err <= 1e-6, "%s: %s differs from bitsandbytes' (%ld elements, rel %.3g)",
                      file, key, bad, err);
        }
    }
    CHECK_EQ_INT(ops->state_count(opt), buf);
    CHECK_MSG(same_state(ops, opt, opt2), "%s: the resumed run's state differs", file);
    for (int j = 0; j < 2; j++)
        CHECK(!memcmp(r.groups[j].param, resumed.groups[j].param, (size_t)r.groups[j].numel * sizeof(float)));
done:
    if (opt) ops->destroy(opt);
    if (opt2) ops->destroy(opt2);
    run_free(&r);
    run_free(&resumed);
    fixture_free(f);
}

TEST(default_case_is_bitsandbytes) { check_case("adamw8bit_default.bin"); }
TEST(custom_case_is_bitsandbytes) { check_case("adamw8bit_custom.bin"); }

/* On a device it declines (the core steps it on the host); it cannot allocate the impossible. */
TEST(device_declined_and_oom_is_an_error) {
    const ctrl_optimizer_ops *ops = plugin_ops();
    if (!ops) return;
    const test_hp_table hp = hparams_of(0.9, 0.999, 1e-8, 4096);
    float x = 0;
    ctrl_param_group g = {.param = &x, .grad = &x, .numel = 1};
    ctrl_optimizer *opt = NULL;
    CHECK_EQ_INT(ops->create(&test_optimizer_host, test_hp_config(&hp), &g, 1,
                             (ctrl_device){CTRL_DEVICE_CUDA, 0}, &opt),
                 CTRL_ERR_UNSUPPORTED);
    g.numel = (int64_t)1 << 61;
    CHECK_EQ_INT(ops->create(&test_optimizer_host, test_hp_config(&hp), &g, 1,
                             (ctrl_device){CTRL_DEVICE_CPU, 0}, &opt),
                 CTRL_ERR_NOMEM);
    CHECK_CONTAINS(ctrl_error_message(), "out of memory");
}
