/* Activation checkpointing (the `checkpointing` memory plugin): on a packed batch, for the
 * TRL-parity model and the Llama, Mistral (sliding window), Qwen2 (q/k/v bias) and Qwen3 (q/k
 * norms) fixture models, log-probabilities and every gradient are bit-identical with and without
 * it, for both attention plugins and for recomputing every layer or every other one, and with
 * keep_mlp (selective: the recompute skips gate/up, kept from the forward); the activations the
 * model holds are fewer with it (with keep_mlp more than without, fewer than keeping all). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "model/model.h"
#include "test_registry.h"
#include "test.h"
#include "random_batch.h"

/* Three sequences of 40, 17 and 64 tokens with pseudo-random ids. */
static void make_batch(ctrl_batch *b, int vocab) {
    static int32_t tok[121], pos[121], tg[121], cu[4] = {0, 40, 57, 121};
    random_batch(b, tok, pos, tg, cu, 3, 12345, vocab);
}

typedef struct run {
    float logp[121], *grads;
    size_t n, act_bytes;
} run;

static void forward_backward(const char *model, const ctrl_plugin_entry *attn, const ctrl_memory_ops *mops,
                             ctrl_memory *mem, run *r) {
    ctrl_model *m;
    CHECK_EQ_INT(ctrl_model_load(model, attn->plugin->ops, &m), CTRL_OK);
    if (!m) return;
    if (mops) ctrl_model_set_memory(m, mops, mem);
    ctrl_batch b;
    make_batch(&b, ctrl_model_cfg(m)->vocab_size);
    float dlogp[121];
    for (int t = 0; t < 121; t++) dlogp[t] = b.targets[t] >= 0 ? -1.0f / 100 : 0.0f;
    CHECK_EQ_INT(ctrl_model_forward(m, &b, r->logp, NULL, NULL), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_backward(m, dlogp), CTRL_OK);
    float *g = ctrl_model_grads(m, &r->n);
    r->grads = malloc(sizeof(float) * r->n);
    memcpy(r->grads, g, sizeof(float) * r->n);
    r->act_bytes = ctrl_model_activation_bytes(m);
    ctrl_model_free(m);
}

/* The checkpointing plugin made from "[checkpointing] every = EVERY, keep_mlp = KEEP" (NULL: failed). */
static ctrl_config *plugin_config(ctrl_registry *reg, const char *dir, long every, int keep_mlp) {
    char ini[1200];
    snprintf(ini, sizeof ini, "[model]\npath = %s\n[checkpointing]\nevery = %ld\nkeep_mlp = %s\n", dir, every,
             keep_mlp ? "true" : "false");
    return test_config_from_text(reg, "checkpointing.ini", ini);
}

static void compare_keep(const char *model, const char *attention, long every, int keep_mlp) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", CTRL_FIXTURE_DIR, model);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, attention);
    const ctrl_plugin_entry *ckpt = ctrl_registry_find(reg, CTRL_KIND_MEMORY, "checkpointing");
    CHECK(attn && ckpt);
    /* the plugin reads [checkpointing] every and keep_mlp from a config */
    ctrl_memory *mem;
    ctrl_config *cfg = attn && ckpt ? plugin_config(reg, dir, every, keep_mlp) : NULL;
    if (!cfg) {
        ctrl_registry_destroy(reg);
        return;
    }
    const ctrl_memory_ops *mops = ckpt->plugin->ops;
    CHECK_EQ_INT(mops->create(ctrl_host_table(), cfg, 2, &mem), CTRL_OK);
    run plain = {0}, recomputed = {0};
    forward_backward(dir, attn, NULL, NULL, &plain);
    forward_backward(dir, attn, mops, mem, &recomputed);
    CHECK_EQ_INT(plain.n, recomputed.n);
    CHECK_MSG(memcmp(plain.logp, recomputed.logp, sizeof plain.logp) == 0, "%s/%s every %ld: logp differ",
              model, attention, every);
    CHECK_MSG(plain.grads && recomputed.grads &&
                  memcmp(plain.grads, recomputed.grads, sizeof(float) * plain.n) == 0,
              "%s/%s every %ld keep_mlp %d: gradients differ with checkpointing", model, attention, every,
              keep_mlp);
    /* all layers recomputed: one set of internals instead of one per layer (every 2 on this 2-layer
     * model keeps one layer's and the shared set: no saving, but no loss either; with keep_mlp there
     * the recomputed layer's gate/up besides: checked below) */
    CHECK_MSG(every == 1 ? recomputed.act_bytes < plain.act_bytes
              : keep_mlp ? 1
                         : recomputed.act_bytes <= plain.act_bytes,
              "%s/%s: activations %zu with, %zu without", model, attention, recomputed.act_bytes,
              plain.act_bytes);
    printf("  %s, %s, every %ld layer(s)%s: activations %zu -> %zu bytes for 121 tokens\n", model, attention,
           every, keep_mlp ? ", keep_mlp" : "", plain.act_bytes, recomputed.act_bytes);
    if (keep_mlp) { /* exactly gate's and up's outputs more per recomputed layer than without keep_mlp */
        ctrl_config *cfg2 = plugin_config(reg, dir, every, 0);
        ctrl_memory *mem2 = NULL;
        run bare = {0};
        if (cfg2 && mops->create(ctrl_host_table(), cfg2, 2, &mem2) == CTRL_OK) {
            forward_backward(dir, attn, mops, mem2, &bare);
            ctrl_model *m = NULL;
            CHECK_EQ_INT(ctrl_model_load(dir, attn->plugin->ops, &m), CTRL_OK);
            const ctrl_model_config *mc = m ? ctrl_model_cfg(m) : NULL;
            const size_t layers = mc ? (size_t)(mc->n_layers + every - 1) / (size_t)every : 0;
            const size_t extra = mc ? sizeof(float) * 121 * 2 * (size_t)mc->intermediate_size * layers : 0;
            CHECK_MSG(mc && recomputed.act_bytes == bare.act_bytes + extra,
                      "%s: activations %zu with keep_mlp, %zu without (+%zu expected)", model,
                      recomputed.act_bytes, bare.act_bytes, extra);
            ctrl_model_free(m);
            free(bare.grads);
            mops->destroy(mem2);
        }
        CHECK(cfg2 && mem2);
        ctrl_config_free(cfg2);
    }
    free(plain.grads), free(recomputed.grads);
    mops->destroy(mem);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

static void compare(const char *model, const char *attention, long every) {
    compare_keep(model, attention, every, 0);
}

static const char *const models[] = {"trl_sft/model", "models/llama", "models/mistral", "models/qwen2",
                                     "models/qwen3"};

TEST(identical_with_flash) {
    for (int i = 0; i < 5; i++) compare(models[i], "flash", 1);
}
TEST(identical_with_eager) {
    for (int i = 0; i < 5; i++) compare(models[i], "eager", 1);
}
TEST(identical_every_other_layer) {
    compare("trl_sft/model", "flash", 2);
    compare("models/qwen3", "eager", 2);
}

/* Selective checkpointing ([checkpointing] keep_mlp): the recompute skips gate/up, the numbers
 * stay bit for bit, the activations grow by exactly gate's and up's outputs per recomputed layer. */
TEST(identical_keeping_the_mlp) {
    compare_keep("models/qwen2", "flash", 1, 1);
    compare_keep("models/llama", "eager", 1, 1);
    compare_keep("trl_sft/model", "flash", 2, 1);
}

/* A frozen reference (the sequence kind's): every layer recomputed without a plugin
 * (ctrl_model_set_recompute_all) gives the same log-probs from fewer activations, and so does a
 * forward after its scratch was released (ctrl_model_release_scratch); a backward then needs a new
 * forward, and after one it equals the plain model's gradients. */
TEST(reference_recompute_all_and_release_scratch) {
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash");
    CHECK(attn != NULL);
    if (!attn) return;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/qwen3", CTRL_FIXTURE_DIR);
    run plain = {0};
    forward_backward(dir, attn, NULL, NULL, &plain);
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_load(dir, attn->plugin->ops, &m), CTRL_OK);
    if (!m) return;
    CHECK_EQ_INT(ctrl_model_set_recompute_all(m), CTRL_OK);
    ctrl_batch b;
    make_batch(&b, ctrl_model_cfg(m)->vocab_size);
    float logp[121], dlogp[121];
    for (int t = 0; t < 121; t++) dlogp[t] = b.targets[t] >= 0 ? -1.0f / 100 : 0.0f;
    for (int pass = 0; pass < 2; pass++) {
        CHECK_EQ_INT(ctrl_model_forward(m, &b, logp, NULL, NULL), CTRL_OK);
        CHECK_MSG(memcmp(plain.logp, logp, sizeof logp) == 0, "pass %d: logp differ", pass);
        CHECK_MSG(ctrl_model_activation_bytes(m) < plain.act_bytes, "activations %zu, plain %zu",
                  ctrl_model_activation_bytes(m), plain.act_bytes);
        ctrl_model_release_scratch(m);
        CHECK_EQ_INT(ctrl_model_activation_bytes(m), 0);
    }
    CHECK(ctrl_model_backward(m, dlogp) != CTRL_OK); /* released: no forward to go back through */
    CHECK_EQ_INT(ctrl_model_forward(m, &b, logp, NULL, NULL), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_backward(m, dlogp), CTRL_OK);
    size_t n = 0;
    const float *g = ctrl_model_grads(m, &n);
    CHECK(n == plain.n && memcmp(g, plain.grads, sizeof(float) * n) == 0);
    free(plain.grads);
    ctrl_model_free(m);
    ctrl_registry_destroy(reg);
}

/* A strategy that records its hook calls: each layer's forward hooks in order, then its backward
 * hooks in reverse order, every layer recomputed. */
struct ctrl_memory {
    char log[256];
    size_t len;
};
static void note(ctrl_memory *m, const char *what, int layer) {
    m->len += (size_t)snprintf(m->log + m->len, sizeof m->log - m->len, "%s%d ", what, layer);
}
static ctrl_status hook_bf(ctrl_memory *m, int l) { return note(m, "bf", l), CTRL_OK; }
static ctrl_status hook_af(ctrl_memory *m, int l) { return note(m, "af", l), CTRL_OK; }
static ctrl_status hook_bb(ctrl_memory *m, int l) { return note(m, "bb", l), CTRL_OK; }
static ctrl_status hook_ab(ctrl_memory *m, int l) { return note(m, "ab", l), CTRL_OK; }
static int every_layer(const ctrl_memory *m, int l) { return (void)m, (void)l, 1; }

TEST(hooks_run_around_each_layer) {
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash");
    CHECK(attn != NULL);
    if (!attn) return;
    const ctrl_memory_ops ops = {.size = sizeof ops,
                                 .before_forward = hook_bf,
                                 .after_forward = hook_af,
                                 .before_backward = hook_bb,
                                 .after_backward = hook_ab,
                                 .recompute = every_layer};
    ctrl_memory log = {0};
    run plain = {0}, hooked = {0};
    forward_backward(CTRL_FIXTURE_DIR "/models/qwen2", attn, NULL, NULL, &plain);
    forward_backward(CTRL_FIXTURE_DIR "/models/qwen2", attn, &ops, &log, &hooked);
    CHECK_MSG(!strcmp(log.log, "bf0 af0 bf1 af1 bb1 ab1 bb0 ab0 "), "hooks: %s", log.log);
    CHECK(plain.grads && hooked.grads && memcmp(plain.grads, hooked.grads, sizeof(float) * plain.n) == 0);
    CHECK(hooked.act_bytes < plain.act_bytes);
    free(plain.grads), free(hooked.grads);
    ctrl_registry_destroy(reg);
}
