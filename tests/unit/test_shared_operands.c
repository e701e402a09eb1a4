/* A layer's operands shared by several bf16 products, packed once (core/model/model_share.c over
 * kernels/cpu/gemm_bf16.c's ctrl_cpu_gemm_bf16_share, whose products tests/kernels/
 * test_gemm_bf16_shared.c checks bit for bit): a forward + backward of the tiny Qwen2 in bf16 gives
 * the same log-probs and gradients bit for bit with the sharing on and off (CTRL_NO_SHARED_OPERANDS=1),
 * and the products did read the shared operands (_share_stats): for a full fine-tune with every layer
 * recomputed (ln1 by q, k and v, ln2 by gate and up, forward and recompute; ln1 and ln2 as the B of
 * the weight gradients), and for LoRA on attention and MLP over a base held as panels (x by the base
 * and the adapter's A too, dL/dout by the base's dX and the adapter's dY B). Where no bf16 GEMM kernel
 * runs nothing is shared and the numbers are those of the other path anyway. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/attention.h>

#include "cpu/cpu_ops.h"
#include "model/model.h"
#include "model/peft.h"
#include "model/json_file.h"
#include "registry/registry.h"
#include "test.h"
#include "test_registry.h"

/* One forward + backward of b, sharing on or off: log-probs into lp, gradients into g; how many
 * products read a shared operand, returned. */
static size_t pass(ctrl_model *m, const ctrl_batch *b, const float *dlogp, int shared, float *lp, float *g) {
    if (!shared) setenv("CTRL_NO_SHARED_OPERANDS", "1", 1);
    size_t p0, r0, p1, r1, ng = 0;
    ctrl_cpu_gemm_bf16_share_stats(&p0, &r0);
    ctrl_model_set_training(m, 1, 1);
    CHECK_EQ_INT(ctrl_model_zero_grad(m), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_forward_fused(m, b, dlogp, lp, NULL, NULL), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_backward(m, NULL), CTRL_OK);
    ctrl_cpu_gemm_bf16_share_stats(&p1, &r1);
    /* (the size read before the copy: memcpy's arguments are evaluated in no fixed order) */
    const float *grads = ctrl_model_grads(m, &ng);
    memcpy(g, grads, sizeof(float) * ng);
    unsetenv("CTRL_NO_SHARED_OPERANDS");
    return r1 - r0;
}

typedef ctrl_model *(*make_fn)(ctrl_registry *reg);

/* Two fresh models from make, one pass each, sharing off and on: bit for bit; at least `want` reads
 * of shared operands per layer. */
static void compare(make_fn make, const char *what, int want) {
    ctrl_registry *reg = test_plugin_registry();
    ctrl_model *m[2] = {make(reg), make(reg)};
    /* the fixture's batch */
    char path[512];
    snprintf(path, sizeof path, "%s/models/qwen2/batch.json", CTRL_FIXTURE_DIR);
    cJSON *root = json_file(path);
    int T = 0, n = 0, n_cu = 0;
    int32_t *tok = json_ints(root, "tokens", &T), *pos = json_ints(root, "positions", &n),
            *tg = json_ints(root, "targets", &n), *cu = json_ints(root, "cu_seqlens", &n_cu);
    cJSON_Delete(root);
    CHECK(T > 4); /* (1-4 rows take the unpacked path) */
    if (m[0] && m[1] && T > 4) {
        const ctrl_batch b = {
            .T = T, .B = n_cu - 1, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
        float *dlogp = malloc(sizeof(float) * T),
              *lp[2] = {malloc(sizeof(float) * T), malloc(sizeof(float) * T)};
        for (int t = 0; t < T; t++) dlogp[t] = tg[t] >= 0 ? -0.05f : 0.0f;
        size_t ng = 0;
        ctrl_model_grads(m[0], &ng);
        const int L = ctrl_model_cfg(m[0])->n_layers;
        float *g[2] = {malloc(sizeof(float) * ng), malloc(sizeof(float) * ng)};
        const size_t off = pass(m[0], &b, dlogp, 0, lp[0], g[0]), on = pass(m[1], &b, dlogp, 1, lp[1], g[1]);
        const int fast = ctrl_cpu_bf16_kind_now() != CTRL_CPU_BF16_FP32;
        CHECK_MSG(off == 0, "%s: %zu shared reads with the sharing off", what, off);
        CHECK_MSG(fast ? on >= (size_t)(want * L) : on == 0,
                  "%s: %zu shared reads over %d layers, want >= %d a layer", what, on, L, fast ? want : 0);
        CHECK_MSG(!memcmp(lp[0], lp[1], sizeof(float) * T), "%s: log-probs differ", what);
        /* every trainable tensor's gradient (the views: not the padding between them), which the
         * backward did write */
        const size_t off0 = ctrl_model_trainable_offset(m[0]);
        size_t nonzero = 0;
        for (size_t i = 0; i < ng; i++) nonzero += g[0][i] != 0.0f;
        CHECK_MSG(nonzero > ng / 2, "%s: %zu of %zu gradients nonzero", what, nonzero, ng);
        for (int v = 0; v < ctrl_model_view_count(m[0]); v++) {
            const ctrl_param_view *pv = ctrl_model_view(m[0], v);
            if (pv->offset < off0) continue;
            const size_t o = pv->offset - off0;
            CHECK_MSG(!memcmp(g[0] + o, g[1] + o, sizeof(float) * (size_t)pv->numel),
                      "%s: %s's gradient differs (rel %.3g)", what, pv->name,
                      test_rel_error_f32(g[0] + o, g[1] + o, (long)pv->numel));
        }
        printf("  %s: %zu products read a shared operand (%d layers), log-probs and gradients bit for bit\n",
               what, on, L);
        free(g[0]), free(g[1]), free(lp[0]), free(lp[1]), free(dlogp);
    }
    free(tok), free(pos), free(tg), free(cu);
    ctrl_model_free(m[0]), ctrl_model_free(m[1]);
    ctrl_registry_destroy(reg);
}

static ctrl_model *full_finetune(ctrl_registry *reg) {
    ctrl_model *m = test_tiny_qwen2(reg);
    if (!m) return NULL;
    CHECK_EQ_INT(ctrl_model_set_compute_dtype(m, CTRL_BF16), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_set_recompute_all(m), CTRL_OK);
    return m;
}

static ctrl_model *lora(ctrl_registry *reg) {
    char adapter[1024], base[512], dir[1600];
    snprintf(adapter, sizeof adapter, "%s/lora/qwen2_attn_mlp", CTRL_FIXTURE_DIR);
    ctrl_lora_config lc;
    ctrl_model *m = NULL;
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash");
    ctrl_status st = e ? ctrl_peft_read_config(adapter, &lc, base, sizeof base) : CTRL_ERR_RUNTIME;
    if (st == CTRL_OK) snprintf(dir, sizeof dir, "%s/%s", CTRL_FIXTURE_DIR, base);
    lc.bf16_base = 1; /* the base as panels where a bf16 GEMM kernel runs */
    if (st == CTRL_OK) st = ctrl_model_load_lora(dir, e->plugin->ops, &lc, &m);
    if (st == CTRL_OK) st = ctrl_peft_load_weights(m, adapter);
    CHECK_MSG(st == CTRL_OK, "%s", ctrl_error_message());
    if (st != CTRL_OK) return ctrl_model_free(m), NULL;
    CHECK_EQ_INT(ctrl_model_set_compute_dtype(m, CTRL_BF16), CTRL_OK);
    CHECK(lc.lora_dropout == 0); /* else the adapters multiply dropout(x), not x */
    return m;
}

/* forward and recompute: k, v on q's ln1, up on gate's ln2 (3 each); backward: ln1 and ln2 as the B
 * of the weight gradients (2 + 1) */
TEST(full_finetune_shares_ln1_and_ln2_bit_for_bit) {
    compare(full_finetune, "full fine-tune, every layer recomputed", 9);
}

/* forward: ln1 by q, k, v and their A (5 reads), att and h by the adapter (1 + 1), ln2 (3); backward:
 * dL/dout of each of the 7 projections by its adapter, ln1 and ln2 as B (2 + 1) */
TEST(lora_shares_x_with_the_base_bit_for_bit) {
    compare(lora, "LoRA on attention and MLP, base as panels", 20);
}
