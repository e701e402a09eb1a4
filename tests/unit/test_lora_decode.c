/* Generation with LoRA adapters applied live (no merge): decoding over the paged KV cache, one
 * token at a time, gives the log-probs the training forward gives under the same adapter (PEFT's
 * fixture adapters, tests/fixtures/lora), with dropout never applied while decoding (a model left
 * in training mode decodes as in evaluation), and with the adapters switched off the base's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/kv_cache.h"
#include "model/model.h"
#include "model/peft.h"
#include "test.h"
#include "test_registry.h"

/* log p(tokens[i+1] | tokens[..i]) for i < n-1, by decoding token by token. */
static void decode_logp(ctrl_model *m, const int32_t *tokens, int n, float *out) {
    const ctrl_model_config *c = ctrl_model_cfg(m);
    const int V = c->vocab_size;
    ctrl_kv_cache *kv = NULL;
    CHECK_EQ_INT(ctrl_kv_cache_create(c->n_layers, c->n_kv_heads, c->head_dim, 4, 1 << 20, CTRL_F32, &kv),
                 CTRL_OK);
    if (!kv) return;
    ctrl_kv_seq seq = {0}, *seqs[1] = {&seq};
    float *logits = malloc(sizeof(float) * V);
    for (int i = 0; i + 1 < n; i++) {
        int one = 1;
        CHECK_EQ_INT(ctrl_model_decode(m, kv, seqs, tokens + i, &one, 1, logits), CTRL_OK);
        double mx = -INFINITY, s = 0;
        for (int v = 0; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
        for (int v = 0; v < V; v++) s += exp(logits[v] - mx);
        out[i] = (float)(logits[tokens[i + 1]] - mx - log(s));
    }
    ctrl_kv_seq_release(kv, &seq);
    ctrl_kv_cache_free(kv);
    free(logits);
}

static void forward_logp(ctrl_model *m, const int32_t *tokens, int n, float *out) {
    int32_t pos[64], tg[64], cu[2] = {0, n};
    for (int i = 0; i < n; i++) pos[i] = i, tg[i] = i + 1 < n ? tokens[i + 1] : -100;
    const ctrl_batch b = {
        .T = n, .B = 1, .tokens = tokens, .positions = pos, .cu_seqlens = cu, .targets = tg};
    CHECK_EQ_INT(ctrl_model_forward(m, &b, out, NULL, NULL), CTRL_OK);
}

static void check(const char *adapter, const char *arch) {
    char a[512], base[512];
    snprintf(a, sizeof a, "%s/lora/%s", CTRL_FIXTURE_DIR, adapter);
    snprintf(base, sizeof base, "%s/models/%s", CTRL_FIXTURE_DIR, arch);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin *eager = NULL;
    CHECK_EQ_INT(ctrl_registry_require(reg, CTRL_KIND_ATTENTION, "eager", &eager), CTRL_OK);
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_peft_load(base, a, eager ? eager->ops : NULL, &m), CTRL_OK);
    test_attach_paged(m);
    if (m) {
        static const int32_t tokens[] = {3, 17, 42, 99, 5, 64, 11, 23, 88, 7, 120, 45, 2};
        const int n = (int)(sizeof tokens / sizeof *tokens);
        float want[16], got[16], base_want[16], base_got[16];
        forward_logp(m, tokens, n, want);
        ctrl_model_set_training(m, 1, 2); /* dropout (where the adapter has it) is the trainer's only */
        decode_logp(m, tokens, n, got);
        ctrl_model_set_training(m, 0, 0);
        const double e = test_rel_error_f32(got, want, n - 1);
        CHECK_MSG(e <= 1e-5, "%s: decoded log-probs relative error %.3g", adapter, e);
        ctrl_model_set_adapters_enabled(m, 0);
        forward_logp(m, tokens, n, base_want);
        decode_logp(m, tokens, n, base_got);
        const double eb = test_rel_error_f32(base_got, base_want, n - 1);
        CHECK_MSG(eb <= 1e-5, "%s: decoded base log-probs relative error %.3g", adapter, eb);
        CHECK(test_rel_error_f32(want, base_want, n - 1) > 1e-4); /* the adapter changes them */
        printf("  %-18s decode vs forward: with the adapter %.1e, adapters off %.1e\n", adapter, e, eb);
    }
    ctrl_model_free(m);
    ctrl_registry_destroy(reg);
}

TEST(lora_decoding_applies_the_adapters_live) {
    check("qwen2_attn_mlp", "qwen2");
    check("llama_all_rslora", "llama"); /* lora_dropout 0.1, modules_to_save lm_head */
    check("qwen2_dora_all_rslora", "qwen2"); /* DoRA, biases, lora_dropout 0.05 */
}
