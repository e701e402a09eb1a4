/* The model written once over the backend ops table (core/device/backend.h): the CPU backend's
 * table is complete, and a model placed with ctrl_model_to_device on a backend whose memory is not
 * the host's computes what the CPU model computes, bit for bit. That backend ("staged") is the CPU
 * kernels behind a table that says host_memory = 0 and checks that every pointer the model hands
 * to an op lies in memory the backend allocated: a host buffer passed where the device's belongs
 * (a missed upload or download) fails here rather than on a GPU. Covered: the plain forward and
 * backward, the fused forward (SFT's), gradient accumulation, a temperature, a parameter change
 * announced with ctrl_model_weights_changed, and a memory strategy (checkpointing). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"
#include "model/model.h"
#include "test.h"
#include "test_registry.h"

/* ---- the staged backend ---- */

#define MAX_BLOCKS 256
static struct {
    char *p;
    size_t n;
} blocks[MAX_BLOCKS];
static int stray; /* pointers seen outside the backend's memory */
static const ctrl_backend_ops *cpu;

static int on_device(const void *p) {
    if (!p) return 1;
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (blocks[i].p && (const char *)p >= blocks[i].p && (const char *)p < blocks[i].p + blocks[i].n)
            return 1;
    return 0;
}
#define DEV(p) (stray += !on_device(p))

static ctrl_status staged_alloc(void **ptr, size_t bytes) {
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (!blocks[i].p) {
            blocks[i].p = malloc(bytes ? bytes : 1), blocks[i].n = bytes ? bytes : 1;
            memset(blocks[i].p, 0xff, blocks[i].n); /* NaN-filled: reading what was never written shows */
            *ptr = blocks[i].p;
            return CTRL_OK;
        }
    return ctrl_error_set(CTRL_ERR_NOMEM, "staged: too many blocks");
}
static void staged_free(void *ptr) {
    for (int i = 0; ptr && i < MAX_BLOCKS; i++)
        if (blocks[i].p == ptr) free(blocks[i].p), blocks[i].p = NULL;
}
static ctrl_status staged_to_device(void *dst, const void *src, size_t bytes) {
    DEV(dst);
    return cpu->to_device(dst, src, bytes);
}
static ctrl_status staged_to_host(void *dst, const void *src, size_t bytes) {
    DEV(src);
    return cpu->to_host(dst, src, bytes);
}
static ctrl_status staged_embedding_forward(float *out, const int32_t *tokens, const float *wte, int T,
                                            int C) {
    DEV(out), DEV(tokens), DEV(wte);
    return cpu->embedding_forward(out, tokens, wte, T, C);
}
static ctrl_status staged_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int T,
                                             int C) {
    DEV(dwte), DEV(dout), DEV(tokens);
    return cpu->embedding_backward(dwte, dout, tokens, T, C);
}
static ctrl_status staged_linear_forward(float *out, const float *x, const float *w, const float *bias, int T,
                                         int IN, int OUT) {
    DEV(out), DEV(x), DEV(w), DEV(bias);
    return cpu->linear_forward(out, x, w, bias, T, IN, OUT);
}
static ctrl_status staged_linear_backward(float *dx, float *dw, float *dbias, const float *dout,
                                          const float *x, const float *w, int T, int IN, int OUT) {
    DEV(dx), DEV(dw), DEV(dbias), DEV(dout), DEV(x), DEV(w);
    return cpu->linear_backward(dx, dw, dbias, dout, x, w, T, IN, OUT);
}
static ctrl_status staged_rope_forward(float *out, const float *x, const int32_t *pos, const float *cos_tab,
                                       const float *sin_tab, int T, int n_head, int head_dim) {
    DEV(out), DEV(x), DEV(pos), DEV(cos_tab), DEV(sin_tab);
    return cpu->rope_forward(out, x, pos, cos_tab, sin_tab, T, n_head, head_dim);
}
static ctrl_status staged_head_forward(const ctrl_head_args *a, float *logp, float *entropy, float *lse,
                                       int32_t *correct, void *ws) {
    DEV(a->hidden), DEV(a->w), DEV(a->targets), DEV(logp), DEV(entropy), DEV(lse), DEV(correct), DEV(ws);
    return cpu->head_forward(a, logp, entropy, lse, correct, ws);
}
static ctrl_status staged_head_backward(const ctrl_head_args *a, const float *lse, const float *dlogp,
                                        const float *entropy, const float *dentropy, float *dhidden,
                                        float *dw, void *ws) {
    DEV(a->hidden), DEV(a->w), DEV(a->targets), DEV(lse), DEV(dlogp), DEV(dhidden), DEV(dw), DEV(ws);
    return cpu->head_backward(a, lse, dlogp, entropy, dentropy, dhidden, dw, ws);
}
static ctrl_status staged_head_forward_backward(const ctrl_head_args *a, const float *dlogp, float *logp,
                                                float *entropy, float *lse, int32_t *correct, float *dhidden,
                                                float *dw, void *ws) {
    DEV(a->hidden), DEV(a->w), DEV(a->targets), DEV(dlogp), DEV(logp), DEV(entropy), DEV(lse), DEV(correct);
    DEV(dhidden), DEV(dw), DEV(ws);
    return cpu->head_forward_backward(a, dlogp, logp, entropy, lse, correct, dhidden, dw, ws);
}

static const ctrl_backend_ops *staged(void) {
    static ctrl_backend_ops ops;
    cpu = ctrl_backend_cpu();
    ops = *cpu;
    ops.name = "staged", ops.host_memory = 0;
    ops.alloc = staged_alloc, ops.free = staged_free;
    ops.to_device = staged_to_device, ops.to_host = staged_to_host;
    ops.embedding_forward = staged_embedding_forward, ops.embedding_backward = staged_embedding_backward;
    ops.linear_forward = staged_linear_forward, ops.linear_backward = staged_linear_backward;
    ops.rope_forward = staged_rope_forward;
    ops.head_forward = staged_head_forward, ops.head_backward = staged_head_backward;
    ops.head_forward_backward = staged_head_forward_backward;
    return &ops;
}

/* ---- the cases ---- */

TEST(cpu_backend_table_is_complete) {
    const ctrl_backend_ops *be = ctrl_backend_cpu();
    CHECK_EQ_INT(be->size, sizeof(ctrl_backend_ops));
    CHECK(be->host_memory && be->device_type == CTRL_DEVICE_CPU);
    /* every field after the header is a function pointer, and the CPU backend has them all */
    const size_t first = offsetof(ctrl_backend_ops, alloc);
    for (size_t off = first; off < sizeof *be; off += sizeof(void (*)(void))) {
        void (*fn)(void);
        memcpy(&fn, (const char *)be + off, sizeof fn);
        CHECK_MSG(fn != NULL, "the CPU backend lacks the op at offset %zu", off);
    }
}

/* Three packed sequences from the model's vocabulary. */
static void make_batch(ctrl_batch *b, int vocab) {
    static int32_t tok[57], pos[57], tg[57], cu[4] = {0, 20, 37, 57};
    uint32_t x = 777;
    for (int s = 0; s < 3; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++) {
            x = x * 1664525u + 1013904223u;
            tok[t] = (int32_t)((x >> 8) % (uint32_t)vocab), pos[t] = t - cu[s];
        }
    for (int s = 0; s < 3; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++) tg[t] = t + 1 < cu[s + 1] ? tok[t + 1] : -100;
    *b = (ctrl_batch){.T = 57, .B = 3, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
}

typedef struct outputs {
    float logp[3][57], ent[57], *grads;
    int32_t correct[57];
    size_t n;
} outputs;

/* Two plain steps and a fused one at temperature 0.7, the parameters nudged in between, and the
 * gradients of all three accumulated. */
static void run(ctrl_model *m, outputs *o) {
    ctrl_batch b;
    make_batch(&b, ctrl_model_cfg(m)->vocab_size);
    float dlogp[57];
    for (int t = 0; t < 57; t++) dlogp[t] = b.targets[t] >= 0 ? -1.0f / 50 : 0.0f;
    CHECK_EQ_INT(ctrl_model_zero_grad(m), CTRL_OK);
    CHECK_MSG(ctrl_model_forward(m, &b, o->logp[0], o->ent, o->correct) == CTRL_OK, "%s",
              ctrl_error_message());
    CHECK_MSG(ctrl_model_backward(m, dlogp) == CTRL_OK, "%s", ctrl_error_message());
    size_t n;
    float *p = ctrl_model_params(m, &n);
    for (size_t i = 0; i < n; i += 7) p[i] *= 0.99f;
    ctrl_model_weights_changed(m);
    CHECK_EQ_INT(ctrl_model_forward(m, &b, o->logp[1], NULL, NULL), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_backward(m, dlogp), CTRL_OK);
    ctrl_model_set_temperature(m, 0.7f);
    CHECK_EQ_INT(ctrl_model_forward_fused(m, &b, dlogp, o->logp[2], NULL, NULL), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_backward(m, NULL), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_grads_to_host(m), CTRL_OK);
    float *g = ctrl_model_grads(m, &o->n);
    o->grads = malloc(sizeof(float) * o->n);
    memcpy(o->grads, g, sizeof(float) * o->n);
}

static void compare_on_staged(const char *arch, const char *attention, int checkpointing) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", CTRL_FIXTURE_DIR, arch);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, attention);
    const ctrl_plugin_entry *ckpt = ctrl_registry_find(reg, CTRL_KIND_MEMORY, "checkpointing");
    CHECK(attn && ckpt);
    if (!attn || !ckpt) return;
    ctrl_memory *mem = NULL;
    const ctrl_memory_ops *mops = ckpt->plugin->ops;
    if (checkpointing) { /* every layer recomputed */
        char ini[1200];
        snprintf(ini, sizeof ini, "[model]\npath = %s\n[checkpointing]\nevery = 1\n", dir);
        ctrl_config *cfg = test_config_from_text(reg, "checkpointing.ini", ini);
        CHECK(cfg && mops->create(ctrl_host_table(), cfg, 2, &mem) == CTRL_OK);
        ctrl_config_free(cfg);
    }
    outputs host = {0}, dev = {0};
    for (int side = 0; side < 2; side++) {
        ctrl_model *m;
        CHECK_EQ_INT(ctrl_model_load(dir, attn->plugin->ops, &m), CTRL_OK);
        if (!m) break;
        if (mem) ctrl_model_set_memory(m, mops, mem);
        if (side == 1) {
            CHECK_MSG(ctrl_model_to_device(m, staged(), (ctrl_device){CTRL_DEVICE_CPU, 0}) == CTRL_OK, "%s",
                      ctrl_error_message());
            /* the host gradients stay as they were until brought back */
            CHECK(ctrl_model_device(m).type == CTRL_DEVICE_CPU);
        }
        stray = 0;
        run(m, side ? &dev : &host);
        CHECK_MSG(stray == 0, "%s/%s: %d pointers handed to the backend's ops were not its memory", arch,
                  attention, stray);
        ctrl_model_free(m);
    }
    for (int i = 0; i < MAX_BLOCKS; i++) CHECK_MSG(!blocks[i].p, "%s: backend memory left after free", arch);
    CHECK_MSG(memcmp(host.logp, dev.logp, sizeof host.logp) == 0, "%s/%s: logp differ on the staged backend",
              arch, attention);
    CHECK_MSG(memcmp(host.ent, dev.ent, sizeof host.ent) == 0, "%s: entropies differ", arch);
    CHECK_MSG(memcmp(host.correct, dev.correct, sizeof host.correct) == 0, "%s: accuracy flags differ", arch);
    CHECK_MSG(host.n == dev.n && memcmp(host.grads, dev.grads, sizeof(float) * host.n) == 0,
              "%s/%s: gradients differ on the staged backend", arch, attention);
    /* the temperature and the nudged parameters did change the log-probs */
    CHECK(memcmp(host.logp[0], host.logp[1], sizeof host.logp[0]) != 0);
    CHECK(memcmp(host.logp[1], host.logp[2], sizeof host.logp[1]) != 0);
    free(host.grads), free(dev.grads);
    if (mem) mops->destroy(mem);
    ctrl_registry_destroy(reg);
}

TEST(staged_backend_matches_cpu_llama) { compare_on_staged("llama", "flash", 0); }
TEST(staged_backend_matches_cpu_qwen2_eager) { compare_on_staged("qwen2", "eager", 0); }
TEST(staged_backend_matches_cpu_qwen3_checkpointing) { compare_on_staged("qwen3", "flash", 1); }
TEST(staged_backend_matches_cpu_mistral) { compare_on_staged("mistral", "eager", 1); }

TEST(bf16_on_a_backend_without_it_is_refused) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/llama", CTRL_FIXTURE_DIR);
    ctrl_model *m;
    CHECK_EQ_INT(ctrl_model_load(dir, NULL, &m), CTRL_OK);
    if (!m) return;
    static ctrl_backend_ops no_bf16;
    no_bf16 = *staged();
    no_bf16.name = "nobf16", no_bf16.linear_forward_bf16 = NULL;
    CHECK_EQ_INT(ctrl_model_to_device(m, &no_bf16, (ctrl_device){CTRL_DEVICE_CPU, 0}), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_set_compute_dtype(m, CTRL_BF16), CTRL_ERR_UNSUPPORTED);
    CHECK_CONTAINS(ctrl_error_message(), "nobf16");
    /* and a bf16 model does not move onto it */
    CHECK_EQ_INT(ctrl_model_to_device(m, ctrl_backend_cpu(), (ctrl_device){CTRL_DEVICE_CPU, 0}), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_set_compute_dtype(m, CTRL_BF16), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_to_device(m, &no_bf16, (ctrl_device){CTRL_DEVICE_CPU, 0}), CTRL_ERR_UNSUPPORTED);
    ctrl_model_free(m);
}
