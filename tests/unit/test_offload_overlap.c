/* offload_optimizer's overlapped host step (core/train/offload_overlap.c) on a "device" that is the
 * CPU kernels behind a table saying host_memory = 0, whose upload stream runs a copy only when the
 * compute stream waits for its event (as the CUDA emulator's side streams): a wait missing or in the
 * wrong place reads the previous step's weights. Three AdamW steps of a fixture model with the
 * overlap (a host thread stepping layer by layer while the next forward runs) give the log-probs of
 * every forward and the weights of the whole-model host step bit for bit; with the test hook that
 * holds the host thread until the next forward has begun, every unit but the embeddings is stepped
 * during that forward, and each forward waits for each unit's upload once. Runs under ASan in CI's
 * sanitizer build (the host thread, its drain on every path). */
#include <stdlib.h>
#include <string.h>

#include <ctrl/optimizer.h>

#include "device/backend.h"
#include "model/model.h"
#include "random_batch.h"
#include "test.h"
#include "test_registry.h"
#include "train/compute.h"
#include "train/offload_overlap.h"

/* ---- the upload stream: copies queued, run when waited for ---- */

#define MAX_COPIES 4096
static struct {
    void *dst;
    const void *src;
    size_t bytes;
} queue[MAX_COPIES];
static int queued, ran;              /* copies queued so far, run so far */
static int mark[CTRL_UPLOAD_EVENTS]; /* event ev: the copies before it */

static ctrl_status fake_upload_copy(void *dst, const void *src, size_t bytes, int ev) {
    if (queued == MAX_COPIES || ev < 0 || ev >= CTRL_UPLOAD_EVENTS)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "fake upload stream: full or bad event %d", ev);
    queue[queued].dst = dst, queue[queued].src = src, queue[queued].bytes = bytes;
    mark[ev] = ++queued;
    return CTRL_OK;
}
static ctrl_status fake_upload_wait(int ev) {
    const int upto = ev < 0 ? queued : mark[ev];
    for (; ran < upto; ran++) memcpy(queue[ran].dst, queue[ran].src, queue[ran].bytes);
    return CTRL_OK;
}

static ctrl_backend_ops fake;
static const ctrl_backend_ops *fake_device(void) {
    fake = *ctrl_backend_cpu();
    fake.name = "fake-device";
    fake.host_memory = 0;
    fake.side_copy = NULL, fake.side_wait = NULL, fake.host_alloc = NULL, fake.host_free = NULL;
    fake.upload_copy = fake_upload_copy, fake.upload_wait = fake_upload_wait;
    return &fake;
}

/* ---- one side: a fixture model on the fake device, AdamW on the host ---- */

enum { T = 40, STEPS = 3 };

typedef struct side {
    ctrl_model *m;
    const ctrl_optimizer_ops *oo;
    ctrl_optimizer *opt;
    ctrl_param_group *groups;
    int n_groups;
    train_offload *ov;
    float logp[STEPS][T];
} side;

static int side_open(side *s, ctrl_registry *reg, int overlap) {
    memset(s, 0, sizeof *s);
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "eager");
    const ctrl_plugin_entry *adamw = ctrl_registry_find(reg, CTRL_KIND_OPTIMIZER, "adamw");
    CHECK(attn && adamw);
    if (!attn || !adamw) return 0;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/qwen2", CTRL_FIXTURE_DIR);
    int ok = ctrl_model_load(dir, attn->plugin->ops, &s->m) == CTRL_OK &&
             ctrl_model_to_device(s->m, fake_device(), (ctrl_device){CTRL_DEVICE_CPU, 0}) == CTRL_OK;
    CHECK_MSG(ok, "%s", ctrl_error_message());
    if (!ok) return 0;
    s->oo = adamw->plugin->ops;
    s->groups = calloc((size_t)ctrl_model_view_count(s->m), sizeof *s->groups);
    s->n_groups = train_param_groups(s->m, ctrl_model_params(s->m, NULL), ctrl_model_grads(s->m, NULL), 0.1f,
                                     s->groups);
    ctrl_config *cfg = test_config_from_text(
        reg, "adamw.ini", "[model]\npath = m\n[data]\ntrain_file = t.jsonl\n[train]\noptimizer = adamw\n");
    ok = cfg && s->oo->create(ctrl_host_table(), cfg, s->groups, s->n_groups,
                              (ctrl_device){CTRL_DEVICE_CPU, 0}, &s->opt) == CTRL_OK;
    ctrl_config_free(cfg);
    CHECK_MSG(ok, "adamw: %s", ctrl_error_message());
    if (ok && overlap) {
        const char *why = NULL;
        ok = train_offload_create(&s->ov, &why, s->m, s->oo, s->opt, s->groups, s->n_groups, NULL) ==
                 CTRL_OK &&
             s->ov;
        CHECK_MSG(ok, "overlap: %s %s", why ? why : "", ctrl_error_message());
    }
    return ok;
}

static void side_close(side *s) {
    train_offload_destroy(s->ov);
    if (s->opt) s->oo->destroy(s->opt);
    free(s->groups);
    ctrl_model_free(s->m);
}

/* STEPS steps: a fused forward (its log-probs kept) and backward, the gradients to the host, the
 * optimizer's step -- whole, or launched layer by layer (train_step.c's two paths) */
static int side_train(side *s) {
    static int32_t tok[T], pos[T], tg[T], cu[3] = {0, 23, T};
    ctrl_batch b;
    random_batch(&b, tok, pos, tg, cu, 2, 4242, ctrl_model_cfg(s->m)->vocab_size);
    float dlogp[T];
    for (int t = 0; t < T; t++) dlogp[t] = b.targets[t] >= 0 ? -1.0f / T : 0.0f;
    for (int k = 0; k < STEPS; k++) {
        int ok = ctrl_model_zero_grad(s->m) == CTRL_OK &&
                 ctrl_model_forward_fused(s->m, &b, dlogp, s->logp[k], NULL, NULL) == CTRL_OK &&
                 ctrl_model_backward(s->m, NULL) == CTRL_OK && train_offload_drain(s->ov) == CTRL_OK &&
                 ctrl_model_grads_to_host(s->m) == CTRL_OK;
        if (ok && s->ov)
            ok = train_offload_launch(s->ov, 1e-2, k + 1) == CTRL_OK;
        else if (ok) {
            ok = s->oo->step(s->opt, s->groups, s->n_groups, 1e-2, k + 1) == CTRL_OK;
            ctrl_model_weights_changed(s->m);
        }
        CHECK_MSG(ok, "step %d: %s", k + 1, ctrl_error_message());
        if (!ok) return 0;
    }
    return train_offload_drain(s->ov) == CTRL_OK;
}

static void check_overlap(int hold) {
    ctrl_registry *reg = test_plugin_registry();
    if (!reg) return;
    if (hold) setenv("CTRL_TEST_OFFLOAD_HOLD", "1", 1);
    side whole = {0}, ov = {0};
    const int ok =
        side_open(&whole, reg, 0) && side_open(&ov, reg, 1) && side_train(&whole) && side_train(&ov);
    unsetenv("CTRL_TEST_OFFLOAD_HOLD");
    if (ok) {
        CHECK_MSG(!memcmp(whole.logp, ov.logp, sizeof ov.logp), "the forwards' log-probs differ");
        size_t n = 0;
        const float *pw = ctrl_model_params(whole.m, &n), *po = ctrl_model_params(ov.m, NULL);
        CHECK_MSG(!memcmp(pw, po, n * sizeof(float)), "the host weights differ");
        CHECK_MSG(!memcmp(po, ctrl_model_device_params(ov.m), n * sizeof(float)),
                  "the device's weights are not the host's after the drain");
        long steps = 0, waits = 0, late = 0;
        train_offload_counts(ov.ov, &steps, &waits, &late);
        const int units = ctrl_model_cfg(ov.m)->n_layers + 2;
        CHECK_EQ_INT((int)steps, STEPS);
        CHECK_EQ_INT((int)waits, STEPS * units);
        if (hold) /* the last step's units are drained, not run during a forward */
            CHECK_EQ_INT((int)late, (STEPS - 1) * (units - 1));
    }
    side_close(&whole);
    side_close(&ov);
    ctrl_registry_destroy(reg);
}

TEST(overlap_is_the_whole_step_bit_for_bit) { check_overlap(0); }
TEST(overlap_steps_layers_during_the_next_forward) { check_overlap(1); }
