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

#include "backend_case.h"
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

static int alloc_budget = -1; /* >= 0: allocations left before they fail (out of device memory) */
static ctrl_status staged_alloc(void **ptr, size_t bytes) {
    if (alloc_budget == 0) return ctrl_error_set(CTRL_ERR_NOMEM, "staged: out of memory (%zu bytes)", bytes);
    if (alloc_budget > 0) alloc_budget--;
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
    /* every field after the header is a function pointer, and the CPU backend has them all but the
     * optimizer kernels (on the CPU the optimizer plugins step host memory themselves) and the
     * device sampler (the engine samples host logits with core/generate/sampling.c itself) and the
     * device's side-stream copies for activation offloading (on the CPU the store is a file) and the
     * device memory mapped piece by piece for ZeRO-3 (on the CPU zero3 hands pages back with madvise)
     * and the products on 2-byte bf16 operands (the CPU's bf16 GEMM rounds as it packs: its
     * linear_*_bf16 convert nothing up front) and the upload stream of offload_optimizer's overlap
     * (nothing to offload on the CPU) */
    const size_t first = offsetof(ctrl_backend_ops, alloc);
    const size_t device_only[] = {
        offsetof(ctrl_backend_ops, adamw_step),         offsetof(ctrl_backend_ops, sample),
        offsetof(ctrl_backend_ops, host_alloc),         offsetof(ctrl_backend_ops, host_free),
        offsetof(ctrl_backend_ops, side_copy),          offsetof(ctrl_backend_ops, side_wait),
        offsetof(ctrl_backend_ops, vm_reserve),         offsetof(ctrl_backend_ops, vm_map),
        offsetof(ctrl_backend_ops, vm_unmap),           offsetof(ctrl_backend_ops, vm_unreserve),
        offsetof(ctrl_backend_ops, linear_forward_b16), offsetof(ctrl_backend_ops, linear_backward_b16),
        offsetof(ctrl_backend_ops, upload_copy),        offsetof(ctrl_backend_ops, upload_wait),
        offsetof(ctrl_backend_ops, host_register),      offsetof(ctrl_backend_ops, host_unregister)};
    CHECK(be->adamw_step == NULL && be->sample == NULL && be->host_alloc == NULL && be->side_copy == NULL &&
          be->vm_reserve == NULL && be->linear_forward_b16 == NULL && be->upload_copy == NULL);
    for (size_t off = first; off < sizeof *be; off += sizeof(void (*)(void))) {
        int skip = 0;
        for (size_t k = 0; k < sizeof device_only / sizeof *device_only; k++) skip |= off == device_only[k];
        if (skip) continue;
        void (*fn)(void);
        memcpy(&fn, (const char *)be + off, sizeof fn);
        CHECK_MSG(fn != NULL, "the CPU backend lacks the op at offset %zu", off);
    }
}

/* The staged backend against the CPU, bit for bit (backend_case.c), and not one pointer outside
 * its memory. */
static void compare_on_staged(const char *arch, const char *attention, int checkpointing) {
    const ctrl_backend_ops *be = staged();
    stray = 0;
    backend_case_check(be, (ctrl_device){CTRL_DEVICE_CPU, 0}, arch, attention, checkpointing, 0, 0);
    CHECK_MSG(stray == 0, "%s/%s: %d pointers handed to the backend's ops were not its memory", arch,
              attention, stray);
    for (int i = 0; i < MAX_BLOCKS; i++) CHECK_MSG(!blocks[i].p, "%s: backend memory left after free", arch);
}

TEST(staged_backend_matches_cpu_llama) { compare_on_staged("llama", "flash", 0); }
TEST(staged_backend_matches_cpu_qwen2_eager) { compare_on_staged("qwen2", "eager", 0); }
TEST(staged_backend_scores_as_the_cpu) {
    const ctrl_backend_ops *be = staged();
    stray = 0;
    backend_score_check(be, (ctrl_device){CTRL_DEVICE_CPU, 0}, "qwen2", 0);
    CHECK_MSG(stray == 0, "score: %d pointers handed to the backend's ops were not its memory", stray);
}
TEST(staged_backend_matches_cpu_with_lora) {
    stray = 0;
    backend_lora_check(staged(), (ctrl_device){CTRL_DEVICE_CPU, 0}, "llama", 0);
    backend_lora_check(staged(), (ctrl_device){CTRL_DEVICE_CPU, 0}, "qwen2", 0);
    backend_lora_check(staged(), (ctrl_device){CTRL_DEVICE_CPU, 0}, "families/phi3_mha", 0);
    backend_lora_check(staged(), (ctrl_device){CTRL_DEVICE_CPU, 0}, "families/qwen3_moe_a", 0);
    CHECK_MSG(stray == 0, "LoRA: %d pointers handed to the backend's ops were not its memory", stray);
}
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

/* A batch of 9 tokens (one sequence) and a forward + backward on it; the status of the first that
 * fails. */
static ctrl_status small_step(ctrl_model *m) {
    int32_t tok[9], pos[9], tg[9], cu[2] = {0, 9};
    for (int t = 0; t < 9; t++) tok[t] = 3 + t, pos[t] = t, tg[t] = t + 1 < 9 ? 4 + t : -100;
    ctrl_batch b = {.T = 9, .B = 1, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
    float lp[9], dl[9];
    for (int t = 0; t < 9; t++) dl[t] = tg[t] >= 0 ? -0.125f : 0.0f;
    ctrl_status st = ctrl_model_forward(m, &b, lp, NULL, NULL);
    return st == CTRL_OK ? ctrl_model_backward(m, dl) : st;
}

/* Out of device memory at every point of placing the model, its forward and its backward: a clear
 * error each time, never a crash, and the model usable once memory is there again (placement
 * leaves it on the CPU; a forward that failed can be run again). */
TEST(out_of_device_memory_is_an_error_at_every_allocation) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/qwen3", CTRL_FIXTURE_DIR);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "eager");
    CHECK(attn != NULL);
    int failures = 0, budget;
    for (budget = 0; attn && budget < 40; budget++) {
        ctrl_model *m;
        CHECK_EQ_INT(ctrl_model_load(dir, attn->plugin->ops, &m), CTRL_OK);
        if (!m) break;
        alloc_budget = budget;
        ctrl_status st = ctrl_model_to_device(m, staged(), (ctrl_device){CTRL_DEVICE_CPU, 0});
        if (st != CTRL_OK) {
            CHECK_EQ_INT(st, CTRL_ERR_NOMEM);
            CHECK_CONTAINS(ctrl_error_message(), "onto staged");
            CHECK(ctrl_model_device(m).type == CTRL_DEVICE_CPU);
            alloc_budget = -1;
            CHECK_MSG(small_step(m) == CTRL_OK, "budget %d: the model left on the CPU: %s", budget,
                      ctrl_error_message());
        } else if ((st = small_step(m)) != CTRL_OK) {
            CHECK_EQ_INT(st, CTRL_ERR_NOMEM);
            CHECK_CONTAINS(ctrl_error_message(), "out of memory");
            alloc_budget = -1;
            CHECK_MSG(small_step(m) == CTRL_OK, "budget %d: the step again: %s", budget,
                      ctrl_error_message());
        } else {
            ctrl_model_free(m);
            break; /* enough memory for everything */
        }
        failures++;
        ctrl_model_free(m);
        for (int i = 0; i < MAX_BLOCKS; i++)
            CHECK_MSG(!blocks[i].p, "budget %d: backend memory leaked", budget);
    }
    alloc_budget = -1;
    CHECK_MSG(failures >= 8 && budget < 40, "%d failing placements/steps, first success at budget %d",
              failures, budget);
    ctrl_registry_destroy(reg);
}

/* A backend built against an older, shorter table is refused by name. */
TEST(an_older_backend_table_is_refused) {
    ctrl_model *m;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/llama", CTRL_FIXTURE_DIR);
    CHECK_EQ_INT(ctrl_model_load(dir, NULL, &m), CTRL_OK);
    if (!m) return;
    ctrl_backend_ops old = *staged();
    old.name = "old", old.size = offsetof(ctrl_backend_ops, head_forward_backward);
    CHECK_EQ_INT(ctrl_model_to_device(m, &old, (ctrl_device){CTRL_DEVICE_CPU, 0}), CTRL_ERR_DEVICE);
    CHECK_CONTAINS(ctrl_error_message(), "old backend");
    ctrl_model_free(m);
}

/* Random initialisation of a model already on a device reaches the device's copy. */
TEST(init_random_on_a_device_is_what_the_forward_sees) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/llama", CTRL_FIXTURE_DIR);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *attn = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "eager");
    CHECK(attn != NULL);
    int32_t tok[9], pos[9], tg[9], cu[2] = {0, 9};
    for (int t = 0; t < 9; t++) tok[t] = 3 + t, pos[t] = t, tg[t] = t + 1 < 9 ? 4 + t : -100;
    ctrl_batch b = {.T = 9, .B = 1, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
    float lp[2][9];
    for (int side = 0; attn && side < 2; side++) {
        ctrl_model *m;
        CHECK_EQ_INT(ctrl_model_load(dir, attn->plugin->ops, &m), CTRL_OK);
        if (!m) break;
        if (side) CHECK_EQ_INT(ctrl_model_to_device(m, staged(), (ctrl_device){CTRL_DEVICE_CPU, 0}), CTRL_OK);
        ctrl_model_init_random(m, 5, 0.02f);
        CHECK_EQ_INT(ctrl_model_forward(m, &b, lp[side], NULL, NULL), CTRL_OK);
        ctrl_model_free(m);
    }
    CHECK_MSG(memcmp(lp[0], lp[1], sizeof lp[0]) == 0, "the device kept the loaded weights");
    ctrl_registry_destroy(reg);
}
