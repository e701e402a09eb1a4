/* The same examples as a padding-free batch, as padded rows, and padded to a multiple of 8: the
 * model's log-probabilities at the trained targets, the loss (summed over trained targets, divided
 * by their number, as TRL) and every gradient agree up to float rounding, for both attention
 * plugins, for plain examples and for bfd-packed rows (several sequences each). Pads are never
 * trained and never attended by a real token. Model: the TRL-parity fixture (tests/fixtures/trl_sft). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "test_registry.h"
#include "test.h"
#include "train/train.h"

#define MODEL CTRL_FIXTURE_DIR "/trl_sft/model"
#define N_EX 9

/* Nine examples of 3..47 tokens with pseudo-random ids; the first third of each is a prompt (not
 * trained). */
static void make_examples(ctrl_dataset *d, int vocab) {
    memset(d, 0, sizeof *d);
    d->ex = calloc(N_EX, sizeof(ctrl_example));
    uint32_t x = 2024;
    for (int i = 0; i < N_EX; i++) {
        ctrl_example *e = &d->ex[d->n++];
        e->len = 3 + (i * 37) % 45;
        e->ids = malloc(sizeof(int32_t) * (size_t)e->len);
        e->trained = malloc((size_t)e->len);
        for (int k = 0; k < e->len; k++) {
            x = x * 1664525u + 1013904223u;
            e->ids[k] = (int32_t)((x >> 8) % (uint32_t)(vocab - 1)) + 1;
            e->trained[k] = k >= e->len / 3;
        }
    }
}

typedef struct result {
    double loss;
    long trained;
    int T;
    float *grads;
    size_t n;
} result;

static void run_layout(ctrl_model *m, const ctrl_dataset *d, result *r) {
    int idx[N_EX];
    for (int i = 0; i < d->n; i++) idx[i] = i;
    ctrl_batch b;
    r->trained = ctrl_batch_build(d, idx, d->n, &b, NULL);
    r->T = b.T;
    float *lp = calloc((size_t)b.T, sizeof(float)), *dlp = calloc((size_t)b.T, sizeof(float));
    ctrl_model_zero_grad(m);
    CHECK_EQ_INT(ctrl_model_forward(m, &b, lp, NULL, NULL), CTRL_OK);
    double sum = 0;
    for (int t = 0; t < b.T; t++)
        if (b.targets[t] >= 0) sum -= lp[t], dlp[t] = -1.0f / (float)r->trained;
    r->loss = sum / (double)r->trained;
    CHECK_EQ_INT(ctrl_model_backward(m, dlp), CTRL_OK);
    float *g = ctrl_model_grads(m, &r->n);
    r->grads = malloc(sizeof(float) * r->n);
    memcpy(r->grads, g, sizeof(float) * r->n);
    free(lp), free(dlp);
    ctrl_batch_free(&b);
}

/* Largest gradient difference relative to the largest gradient. */
static double grad_error(const result *a, const result *b) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < a->n; i++) {
        diff = fmax(diff, fabs((double)a->grads[i] - b->grads[i]));
        scale = fmax(scale, fabs((double)a->grads[i]));
    }
    return diff / scale;
}

static void compare_layouts(const char *attention, int packed) {
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, attention);
    CHECK(attn != NULL);
    ctrl_model *m = NULL;
    if (attn) CHECK_EQ_INT(ctrl_model_load(MODEL, attn->plugin->ops, &m), CTRL_OK);
    if (!m) return ctrl_registry_destroy(reg);
    ctrl_dataset d;
    make_examples(&d, ctrl_model_cfg(m)->vocab_size);
    if (packed) CHECK_EQ_INT(ctrl_dataset_pack(&d, 64, "bfd"), CTRL_OK);
    d.pad_id = 0;
    /* padding-free, padded rows, padded rows to a multiple of 8, padding-free to a multiple of 8 */
    static const int padded[] = {0, 1, 1, 0}, multiple[] = {0, 0, 8, 8};
    result r[4];
    for (int k = 0; k < 4; k++) {
        d.padded = padded[k], d.pad_multiple = multiple[k];
        run_layout(m, &d, &r[k]);
    }
    for (int k = 1; k < 4; k++) {
        CHECK_EQ_INT(r[k].trained, r[0].trained);
        CHECK(r[k].T > r[0].T); /* the layout does hold pads */
        const double el = fabs(r[k].loss - r[0].loss) / r[0].loss, eg = grad_error(&r[0], &r[k]);
        CHECK_MSG(el <= 1e-6, "%s %s layout %d: loss %.9g vs padding-free %.9g", attention,
                  packed ? "packed" : "plain", k, r[k].loss, r[0].loss);
        CHECK_MSG(eg <= 1e-5, "%s %s layout %d: gradients differ by %.3g (relative to the largest)",
                  attention, packed ? "packed" : "plain", k, eg);
        printf("  %s, %s examples, %s%s: loss %.9g (padding-free %.9g), gradient error %.2g\n", attention,
               packed ? "bfd-packed" : "plain", padded[k] ? "padded rows" : "padding-free",
               multiple[k] ? " to a multiple of 8" : "", r[k].loss, r[0].loss, eg);
    }
    for (int k = 0; k < 4; k++) free(r[k].grads);
    ctrl_dataset_free(&d);
    ctrl_model_free(m);
    ctrl_registry_destroy(reg);
}

TEST(padded_rows_equal_padding_free_eager) { compare_layouts("eager", 0); }
TEST(padded_rows_equal_padding_free_flash) { compare_layouts("flash", 0); }
TEST(padded_packed_rows_equal_padding_free_eager) { compare_layouts("eager", 1); }
TEST(padded_packed_rows_equal_padding_free_flash) { compare_layouts("flash", 1); }
