/* Generation with LoRA adapters applied live (no merge): decoding over the paged KV cache, one
 * token at a time, gives the log-probs the training forward gives under the same adapter (PEFT's
 * fixture adapters, tests/fixtures/lora), with dropout never applied while decoding (a model left
 * in training mode decodes as in evaluation), and with the adapters switched off the base's. Several
 * adapters over one base (ctrl serve --lora): one decode call, and the engine's steps, mix them;
 * MoE expert adapters (PEFT's target_parameters) too, whose greedy generation in a mixed batch is
 * PEFT's own (tests/reference/make_lora_generation.py) and the merged model's. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/cpu_ops.h"
#include "generate/engine.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/peft.h"
#include "model/json_file.h"
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
    snprintf(base, sizeof base, "%s/%s%s", CTRL_FIXTURE_DIR, strchr(arch, '/') ? "" : "models/", arch);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin *eager = NULL;
    CHECK_EQ_INT(ctrl_registry_require(reg, CTRL_KIND_ATTENTION, "eager", &eager), CTRL_OK);
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_peft_load(base, a, eager ? eager->ops : NULL, &m), CTRL_OK);
    test_attach_paged(m);
    if (m) {
        static const int32_t some[] = {3, 17, 42, 99, 5, 64, 11, 23, 88, 7, 120, 45, 2};
        const int n = (int)(sizeof some / sizeof *some);
        int32_t tokens[16]; /* within the vocabulary (Phi-3's fixture has 80 tokens) */
        for (int i = 0; i < n; i++) tokens[i] = some[i] % ctrl_model_cfg(m)->vocab_size;
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
    check("llama_all_rslora", "llama");                 /* lora_dropout 0.1, modules_to_save lm_head */
    check("qwen2_dora_all_rslora", "qwen2");            /* DoRA, biases, lora_dropout 0.05 */
    check("phi3_all_dora", "families/phi3_mha");        /* Phi-3's fused qkv_proj / gate_up_proj, DoRA */
    check("qwen3_moe_experts", "families/qwen3_moe_a"); /* MoE experts (target_parameters), nested */
    check("qwen2_rank_alpha_pattern", "qwen2");         /* rank_pattern, alpha_pattern, exclude_modules */
    check("llama_layers_rslora", "llama"); /* layers_to_transform, rsLoRA over a pattern's rank */
    check("qwen2_pissa", "qwen2");         /* PiSSA: over the base's residual */
    check("qwen2_lora_bias", "qwen2");     /* lora_bias */
    /* trainable_token_indices: rows of a tied table (the head reads them too) and of an untied one, the
     * adapters' off: the base's rows written back */
    check("qwen2_trainable_tokens", "qwen2");
    check("llama_trainable_tokens_dict", "llama");
    check("llama_trainable_tokens_head", "llama"); /* rows of the untied head too */
}

/* Each sequence's next-token logits after its whole prompt, decoded in one call ([n] sequences,
 * prompts flat in `tokens`), under the given adapters (NULL: none set). */
static void decode_batch(ctrl_model *m, const int32_t *tokens, const int *lens, int n, const int *adapters,
                         float *logits) {
    const ctrl_model_config *c = ctrl_model_cfg(m);
    ctrl_kv_cache *kv = NULL;
    CHECK_EQ_INT(ctrl_kv_cache_create(c->n_layers, c->n_kv_heads, c->head_dim, 4, 1 << 20, CTRL_F32, &kv),
                 CTRL_OK);
    if (!kv) return;
    ctrl_kv_seq seq[4] = {{0}}, *seqs[4] = {&seq[0], &seq[1], &seq[2], &seq[3]};
    ctrl_model_set_decode_adapters(m, adapters);
    CHECK_EQ_INT(ctrl_model_decode(m, kv, seqs, tokens, lens, n, logits), CTRL_OK);
    for (int s = 0; s < n; s++) ctrl_kv_seq_release(kv, &seq[s]);
    ctrl_kv_cache_free(kv);
}

/* Writes into the fresh directory made from `dir` (mkdtemp's template) the adapter `src` over `base`
 * with every lora_B scaled by f: a second adapter for the same base. */
/* ctrl_peft_load_bf16 (generate --adapter --dtype bf16): the base held as panels layer by layer as it
 * loads gives the decoded logits of ctrl_peft_load + bf16 compute + ctrl_model_hold_panels bit for bit,
 * with the same parameter bytes (where no bf16 GEMM kernel runs neither holds: bf16 compute on the fp32
 * base); a trained head (modules_to_save lm_head) is not held. */
static void check_bf16_load(const char *adapter, const char *arch) {
    char a[512], base[512];
    snprintf(a, sizeof a, "%s/lora/%s", CTRL_FIXTURE_DIR, adapter);
    snprintf(base, sizeof base, "%s/models/%s", CTRL_FIXTURE_DIR, arch);
    ctrl_model *m = NULL, *after = NULL;
    CHECK_EQ_INT(ctrl_peft_load_bf16(base, a, NULL, &m), CTRL_OK);
    CHECK_EQ_INT(ctrl_peft_load(base, a, NULL, &after), CTRL_OK);
    if (!m || !after) goto done;
    test_attach_paged(m), test_attach_paged(after);
    CHECK(ctrl_model_compute_dtype(m) == CTRL_BF16);
    CHECK_EQ_INT(ctrl_model_set_compute_dtype(after, CTRL_BF16), CTRL_OK);
    if (ctrl_model_hold_panels(after) != CTRL_OK) ctrl_error_clear();
    const int fast = ctrl_cpu_gemm_bf16_pack_bytes(16, 16) != 0;
    CHECK(ctrl_model_base_in_panels(m) == fast && ctrl_model_base_in_panels(after) == fast);
    CHECK_MSG(ctrl_model_param_bytes(m) == ctrl_model_param_bytes(after),
              "%s: %zu parameter bytes, %zu held after", adapter, ctrl_model_param_bytes(m),
              ctrl_model_param_bytes(after));
    const int V = ctrl_model_cfg(m)->vocab_size;
    static const int32_t tokens[] = {3, 17, 42, 99, 5, 64, 11};
    const int lens[2] = {4, 3};
    float *x = malloc(sizeof(float) * 2 * V), *y = malloc(sizeof(float) * 2 * V);
    decode_batch(m, tokens, lens, 2, NULL, x);
    decode_batch(after, tokens, lens, 2, NULL, y);
    CHECK_MSG(!memcmp(x, y, sizeof(float) * 2 * V), "%s: logits held as it loads differ (rel %.3g)", adapter,
              test_rel_error_f32(x, y, 2L * V));
    printf("  %-18s held as it loads: %zu parameter bytes, base in panels %d\n", adapter,
           ctrl_model_param_bytes(m), ctrl_model_base_in_panels(m));
    free(x), free(y);
done:
    ctrl_model_free(m), ctrl_model_free(after);
}

TEST(lora_base_held_as_it_loads_for_inference) {
    check_bf16_load("qwen2_attn_mlp", "qwen2");
    check_bf16_load("llama_all_rslora", "llama"); /* modules_to_save lm_head: trained, not held */
}

/* trainable_token_indices in bf16 inference (ctrl_peft_load_bf16: the base held as panels as it loads,
 * a head held as panels -- not one whose rows train, which the adapters rewrite): decoded log-probs are
 * the fp32 adapter's within bf16's rounding, far from the base rows'. */
static void check_tokens_bf16(const char *adapter, const char *arch) {
    char a[512], base[512];
    snprintf(a, sizeof a, "%s/lora/%s", CTRL_FIXTURE_DIR, adapter);
    snprintf(base, sizeof base, "%s/models/%s", CTRL_FIXTURE_DIR, arch);
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin *eager = NULL;
    CHECK_EQ_INT(ctrl_registry_require(reg, CTRL_KIND_ATTENTION, "eager", &eager), CTRL_OK);
    ctrl_model *m = NULL, *ref = NULL;
    CHECK_EQ_INT(ctrl_peft_load_bf16(base, a, eager ? eager->ops : NULL, &m), CTRL_OK);
    CHECK_EQ_INT(ctrl_peft_load(base, a, eager ? eager->ops : NULL, &ref), CTRL_OK);
    if (m && ref) {
        test_attach_paged(m), test_attach_paged(ref);
        static const int32_t tokens[] = {57, 62, 3, 100, 7, 5, 116, 11, 62, 57}; /* the trained ones */
        const int n = 10;
        float got[16], on[16], off[16];
        decode_logp(m, tokens, n, got);
        forward_logp(ref, tokens, n, on);
        ctrl_model_set_adapters_enabled(ref, 0);
        forward_logp(ref, tokens, n, off);
        const double e_on = test_rel_error_f32(got, on, n - 1), e_off = test_rel_error_f32(got, off, n - 1);
        CHECK_MSG(e_on <= 3e-2 && e_on < e_off / 4,
                  "%s in bf16: %.3g from the adapter's, %.3g from the base's", adapter, e_on, e_off);
        printf("  %-27s bf16 decoding: %.1e from the fp32 adapter's log-probs, %.1e from the base's\n",
               adapter, e_on, e_off);
    }
    ctrl_model_free(m), ctrl_model_free(ref);
    ctrl_registry_destroy(reg);
}

TEST(trainable_tokens_decode_in_bf16_as_loaded_for_inference) {
    check_tokens_bf16("qwen2_trainable_tokens", "qwen2");      /* the tied table */
    check_tokens_bf16("llama_trainable_tokens_head", "llama"); /* the untied table and head */
}

static int scaled_adapter(const char *base, const char *src, float f, char *dir) {
    CHECK(mkdtemp(dir) != NULL);
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_peft_load(base, src, NULL, &m), CTRL_OK);
    if (!m) return 0;
    float *p = ctrl_model_params(m, NULL);
    for (int v = 0; v < ctrl_model_view_count(m); v++) {
        const ctrl_param_view *pv = ctrl_model_view(m, v);
        for (int64_t k = 0; strstr(pv->name, "lora_B") && k < pv->numel; k++) p[pv->offset + k] *= f;
    }
    const ctrl_status st = ctrl_peft_save(m, dir, "models/llama");
    CHECK_EQ_INT(st, CTRL_OK);
    ctrl_model_free(m);
    return st == CTRL_OK;
}

static void remove_adapter(const char *dir) {
    char path[200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir), unlink(path);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir), unlink(path);
    rmdir(dir);
}

/* Each of n sequences decoded alone from base under its adapter (dirs[id - 1]; 0: the base) against
 * its row of `mixed` [n, V] (one decode call mixing them): the worst relative error (<= 1e-6). */
static double each_alone(const char *base, const char *const *dirs, const int32_t *tokens, const int *lens,
                         int n, const int *adapters, const float *mixed, int V) {
    float *alone = malloc(sizeof(float) * V);
    double worst = 0;
    for (int s = 0, at = 0; s < n; at += lens[s++]) {
        ctrl_model *one = NULL;
        CHECK_EQ_INT(adapters[s] ? ctrl_peft_load(base, dirs[adapters[s] - 1], NULL, &one)
                                 : ctrl_model_load(base, NULL, &one),
                     CTRL_OK);
        test_attach_paged(one);
        if (one) decode_batch(one, tokens + at, &lens[s], 1, NULL, alone);
        const double e = test_rel_error_f32(mixed + (size_t)s * V, alone, V);
        CHECK_MSG(e <= 1e-6, "sequence %d (adapter %d): logits relative error %.3g", s, adapters[s], e);
        worst = fmax(worst, e);
        ctrl_model_free(one);
    }
    free(alone);
    return worst;
}

/* ctrl serve --lora's model side: adapters added to a plain base (ctrl_model_add_adapter) and one
 * decode call mixing them per sequence (base, A, B, A) gives each sequence the logits its own
 * adapter gives alone (ctrl_peft_load, as ctrl generate --adapter); what cannot be served side by
 * side (DoRA, modules_to_save) is refused naming the key. */
TEST(lora_bank_mixes_adapters_in_one_decode_call) {
    static const char base[] = CTRL_FIXTURE_DIR "/models/llama", a1[] = CTRL_FIXTURE_DIR "/lora/llama_qv";
    char a2[] = "/tmp/ctrl_lora_bank_XXXXXX"; /* a second adapter: llama_qv with B scaled by -2 */
    if (!scaled_adapter(base, a1, -2.0f, a2)) return;

    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_load(base, NULL, &m), CTRL_OK);
    test_attach_paged(m);
    int id1 = 0, id2 = 0;
    CHECK_EQ_INT(ctrl_model_add_adapter(m, a1, &id1), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_add_adapter(m, a2, &id2), CTRL_OK);
    CHECK(id1 == 1 && id2 == 2 && ctrl_model_adapter_count(m) == 2);
    CHECK(ctrl_model_add_adapter(m, CTRL_FIXTURE_DIR "/lora/llama_all_rslora", &id1) != CTRL_OK);
    CHECK_CONTAINS(ctrl_error_message(), "modules_to_save");
    ctrl_model *q = NULL;
    CHECK_EQ_INT(ctrl_model_load(CTRL_FIXTURE_DIR "/models/qwen2", NULL, &q), CTRL_OK);
    if (q) CHECK(ctrl_model_add_adapter(q, CTRL_FIXTURE_DIR "/lora/qwen2_dora_all_rslora", &id1) != CTRL_OK);
    CHECK_CONTAINS(ctrl_error_message(), "use_dora");
    if (q) CHECK(ctrl_model_add_adapter(q, CTRL_FIXTURE_DIR "/lora/qwen2_pissa", &id1) != CTRL_OK);
    CHECK_CONTAINS(ctrl_error_message(), "init_lora_weights");
    ctrl_model_free(q);

    static const int32_t tokens[] = {3, 17, 42, 99, 5, 64, 11, 23, 88, 7, 120, 45, 2, 9};
    static const int lens[4] = {3, 5, 4, 2}, adapters[4] = {1, 0, 2, 1};
    const int V = m ? ctrl_model_cfg(m)->vocab_size : 1;
    float *mixed = malloc(sizeof(float) * 4 * V);
    if (m) decode_batch(m, tokens, lens, 4, adapters, mixed);
    const char *const dirs[2] = {a1, a2};
    const double worst = m ? each_alone(base, dirs, tokens, lens, 4, adapters, mixed, V) : 0;
    if (m) { /* and the adapters do differ */
        float *plain = malloc(sizeof(float) * 4 * V);
        decode_batch(m, tokens, lens, 4, NULL, plain);
        CHECK(test_rel_error_f32(mixed, plain, V) > 1e-4 &&
              test_rel_error_f32(mixed + 2 * V, plain + 2 * V, V) > 1e-4);
        CHECK_REL(mixed + V, plain + V, V, 0.0);
        free(plain);
    }
    printf("  base + 2 adapters in one decode call: each sequence vs its adapter alone: logits rel %.1e\n",
           worst);
    free(mixed);
    ctrl_model_free(m);
    remove_adapter(a2);
}

/* A Phi-3 adapter in the bank (one lora_A / lora_B over each fused qkv_proj / gate_up_proj): a
 * decode call mixing it with the base gives each sequence what it gets alone. */
TEST(lora_bank_serves_fused_phi3_adapters) {
    static const char base[] = CTRL_FIXTURE_DIR "/families/phi3_gqa",
                      a1[] = CTRL_FIXTURE_DIR "/lora/phi3_qkv_gate_up";
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_load(base, NULL, &m), CTRL_OK);
    if (!m) return;
    test_attach_paged(m);
    int id = 0;
    CHECK_EQ_INT(ctrl_model_add_adapter(m, a1, &id), CTRL_OK);
    static const int32_t tokens[] = {3, 17, 42, 9, 5, 64, 11};
    static const int lens[2] = {4, 3}, adapters[2] = {1, 0};
    const int V = ctrl_model_cfg(m)->vocab_size;
    float *mixed = malloc(sizeof(float) * 2 * V);
    decode_batch(m, tokens, lens, 2, adapters, mixed);
    const char *const dirs[1] = {a1};
    each_alone(base, dirs, tokens, lens, 2, adapters, mixed, V);
    float *plain = malloc(sizeof(float) * 2 * V);
    decode_batch(m, tokens, lens, 2, NULL, plain);
    CHECK(test_rel_error_f32(mixed, plain, V) > 1e-4); /* the adapter changes the first sequence's */
    free(mixed), free(plain);
    ctrl_model_free(m);
}

/* Adapters whose modules have ranks and alphas of their own (rank_pattern, alpha_pattern; exclude_modules),
 * one with lora_bias, in the bank beside one of a single rank, and Phi-3's fused projections so: one decode
 * call mixing them with the base gives each sequence what its adapter gives alone. */
TEST(lora_bank_serves_adapters_with_per_module_ranks) {
    static const char base[] = CTRL_FIXTURE_DIR "/models/qwen2",
                      a1[] = CTRL_FIXTURE_DIR "/lora/qwen2_rank_alpha_pattern",
                      a2[] = CTRL_FIXTURE_DIR "/lora/qwen2_attn_mlp",
                      a3[] = CTRL_FIXTURE_DIR "/lora/qwen2_lora_bias";
    ctrl_model *m = NULL;
    int id = 0;
    CHECK_EQ_INT(ctrl_model_load(base, NULL, &m), CTRL_OK);
    if (!m) return;
    test_attach_paged(m);
    CHECK_EQ_INT(ctrl_model_add_adapter(m, a1, &id), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_add_adapter(m, a2, &id), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_add_adapter(m, a3, &id), CTRL_OK);
    static const int32_t tokens[] = {3, 17, 42, 99, 5, 64, 11, 23, 88, 7, 120, 45, 2, 9};
    static const int lens[4] = {3, 5, 4, 2}, adapters[4] = {1, 3, 2, 1};
    const int V = ctrl_model_cfg(m)->vocab_size;
    float *mixed = malloc(sizeof(float) * 4 * V), *plain = malloc(sizeof(float) * 4 * V);
    decode_batch(m, tokens, lens, 4, adapters, mixed);
    const char *const dirs[3] = {a1, a2, a3};
    const double worst = each_alone(base, dirs, tokens, lens, 4, adapters, mixed, V);
    decode_batch(m, tokens, lens, 4, NULL, plain);
    CHECK(test_rel_error_f32(mixed, plain, V) > 1e-4);         /* the patterned adapter changes the first's */
    CHECK(test_rel_error_f32(mixed + V, plain + V, V) > 1e-4); /* and lora_bias's the second's */
    printf("  per-module ranks beside a single rank in one decode call: logits rel %.1e\n", worst);
    free(mixed), free(plain);
    ctrl_model_free(m);

    static const char pbase[] = CTRL_FIXTURE_DIR "/families/phi3_gqa",
                      p1[] = CTRL_FIXTURE_DIR "/lora/phi3_fused_rank_pattern";
    CHECK_EQ_INT(ctrl_model_load(pbase, NULL, &m), CTRL_OK);
    if (!m) return;
    test_attach_paged(m);
    CHECK_EQ_INT(ctrl_model_add_adapter(m, p1, &id), CTRL_OK);
    static const int32_t ptokens[] = {3, 17, 42, 9, 5, 64, 11};
    static const int plens[2] = {4, 3}, padapters[2] = {1, 0};
    const int PV = ctrl_model_cfg(m)->vocab_size;
    mixed = malloc(sizeof(float) * 2 * PV);
    decode_batch(m, ptokens, plens, 2, padapters, mixed);
    const char *const pdirs[1] = {p1};
    each_alone(pbase, pdirs, ptokens, plens, 2, padapters, mixed, PV);
    free(mixed);
    ctrl_model_free(m);
}

/* The plain base with adapters a1 (id 1) and a2 (id 2) in its bank, and its paged attention. */
static ctrl_model *bank_of(const char *base, const char *a1, const char *a2) {
    ctrl_model *m = NULL;
    int id = 0;
    CHECK_EQ_INT(ctrl_model_load(base, NULL, &m), CTRL_OK);
    test_attach_paged(m);
    if (m) CHECK_EQ_INT(ctrl_model_add_adapter(m, a1, &id), CTRL_OK);
    if (m) CHECK_EQ_INT(ctrl_model_add_adapter(m, a2, &id), CTRL_OK);
    CHECK_EQ_INT(id, 2);
    return m;
}

/* MoE expert adapters in the bank (target_parameters: the experts' gate_up_proj and down_proj, with
 * attention adapters; PEFT's fixture and a second adapter, its B scaled by -2): one decode call
 * mixing them with the base (base, A, B, A) gives each sequence what its adapter gives alone
 * (ctrl_peft_load, as ctrl generate --adapter), though the experts' routed rows interleave the
 * sequences; an expert adapter on a dense model is refused, as PEFT refuses it. */
TEST(lora_bank_serves_moe_expert_adapters) {
    static const char base[] = CTRL_FIXTURE_DIR "/families/qwen3_moe_a",
                      a1[] = CTRL_FIXTURE_DIR "/lora/qwen3_moe_experts";
    char a2[] = "/tmp/ctrl_lora_moe_bank_XXXXXX";
    if (!scaled_adapter(base, a1, -2.0f, a2)) return;
    ctrl_model *m = bank_of(base, a1, a2);
    int id = 0;
    ctrl_model *d = NULL; /* target_parameters over a dense model: nothing to wrap */
    CHECK_EQ_INT(ctrl_model_load(CTRL_FIXTURE_DIR "/models/qwen2", NULL, &d), CTRL_OK);
    if (d) CHECK(ctrl_model_add_adapter(d, CTRL_FIXTURE_DIR "/lora/mixtral_experts_down", &id) != CTRL_OK);
    CHECK_CONTAINS(ctrl_error_message(), "target_parameters");
    ctrl_model_free(d);
    static const int32_t tokens[] = {3, 17, 42, 90, 5, 64, 11, 23, 88, 7, 60, 45, 2, 9, 31, 8}; /* < 96 */
    static const int lens[4] = {3, 5, 4, 4}, adapters[4] = {0, 1, 2, 1};
    const int V = m ? ctrl_model_cfg(m)->vocab_size : 1;
    float *mixed = malloc(sizeof(float) * 4 * V), *plain = malloc(sizeof(float) * 4 * V);
    if (m) {
        decode_batch(m, tokens, lens, 4, adapters, mixed);
        const char *const dirs[2] = {a1, a2};
        const double worst = each_alone(base, dirs, tokens, lens, 4, adapters, mixed, V);
        decode_batch(m, tokens, lens, 4, NULL, plain);
        /* the base's sequence (not bit for bit: its experts' GEMMs run over other rows beside it) */
        CHECK_REL(mixed, plain, V, 1e-6);
        for (int s = 1; s < 4; s++)
            CHECK(test_rel_error_f32(mixed + (size_t)s * V, plain + (size_t)s * V, V) > 1e-4);
        printf(
            "  MoE base + 2 expert adapters in one decode call: each vs its adapter alone: logits rel %.1e\n",
            worst);
    }
    free(mixed), free(plain);
    ctrl_model_free(m);
    remove_adapter(a2);
}

/* An engine over `m` generating reqs [n] together (greedy), into out. */
static void engine_run(ctrl_model *m, const ctrl_gen_request *reqs, int n, ctrl_gen_output *out) {
    ctrl_engine *e = NULL;
    CHECK_EQ_INT(ctrl_engine_create(m, &(ctrl_engine_config){1 << 20, 4, 8, 64, 0, 0, 0, 0}, &e), CTRL_OK);
    if (e) CHECK_EQ_INT(ctrl_engine_generate(e, reqs, n, out, NULL, NULL), CTRL_OK);
    ctrl_engine_free(e);
}

/* ctrl serve --lora with an MoE expert adapter (PEFT's fixture adapters over Qwen3-MoE, nested
 * gate_up/down, and over Mixtral, down_proj alone, rsLoRA): PEFT's greedy generation from its two
 * prompts (PeftModel.generate, make_lora_generation.py), generated in one engine batch with a base
 * request beside each, gives PEFT's tokens and their log-probs (within 1e-4: fp32 over 12 steps), and
 * the same as the adapter merged into the experts (ctrl_peft_merge, what ctrl model merge writes). */
static void moe_adapter_generates_as_peft(const char *adapter) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/lora/%s", CTRL_FIXTURE_DIR, adapter);
    snprintf(path, sizeof path, "%s/batch.json", dir);
    cJSON *bj = json_file(path);
    snprintf(path, sizeof path, "%s/generation.json", dir);
    cJSON *gj = json_file(path);
    const cJSON *bn = cJSON_GetObjectItemCaseSensitive(bj, "base"),
                *cases = cJSON_GetObjectItemCaseSensitive(gj, "cases");
    CHECK(cJSON_IsString(bn) && cJSON_GetArraySize(cases) == 2);
    if (!cJSON_IsString(bn) || cJSON_GetArraySize(cases) != 2) {
        cJSON_Delete(bj), cJSON_Delete(gj);
        return;
    }
    char base[600];
    snprintf(base, sizeof base, "%s/%s", CTRL_FIXTURE_DIR, bn->valuestring);
    const ctrl_sampling_params greedy = {.temperature = 0, .top_p = 1, .top_k = -1, .repetition_penalty = 1};
    int32_t prompts[2][16], want[2][16];
    float want_lp[2][16];
    ctrl_gen_request reqs[4];
    for (int c = 0; c < 2; c++) {
        const cJSON *o = cJSON_GetArrayItem(cases, c), *p = cJSON_GetObjectItemCaseSensitive(o, "prompt"),
                    *g = cJSON_GetObjectItemCaseSensitive(o, "generated"),
                    *lp = cJSON_GetObjectItemCaseSensitive(o, "logprobs");
        int n = 0;
        for (const cJSON *x = p->child; x && n < 16; x = x->next) prompts[c][n++] = (int32_t)x->valuedouble;
        int k = 0;
        for (const cJSON *x = g->child, *y = lp->child; x && y && k < 16; x = x->next, y = y->next)
            want[c][k] = (int32_t)x->valuedouble, want_lp[c][k++] = (float)y->valuedouble;
        CHECK_EQ_INT(k, 12);
        /* the adapter's request, and the same prompt under the base beside it (a mixed batch) */
        reqs[2 * c] = (ctrl_gen_request){.prompt = prompts[c],
                                         .prompt_len = n,
                                         .n = 1,
                                         .max_tokens = 12,
                                         .sampling = greedy,
                                         .adapter = 1};
        reqs[2 * c + 1] = reqs[2 * c], reqs[2 * c + 1].adapter = 0;
    }
    ctrl_model *m = NULL, *merged = NULL;
    int id = 0;
    CHECK_EQ_INT(ctrl_model_load(base, NULL, &m), CTRL_OK);
    test_attach_paged(m);
    if (m) CHECK_EQ_INT(ctrl_model_add_adapter(m, dir, &id), CTRL_OK);
    CHECK_EQ_INT(ctrl_peft_load(base, dir, NULL, &merged), CTRL_OK);
    test_attach_paged(merged);
    if (merged) CHECK_EQ_INT(ctrl_peft_merge(merged), CTRL_OK);
    ctrl_gen_output out[4] = {{0}}, mout[4] = {{0}};
    if (m && merged) {
        engine_run(m, reqs, 4, out);
        ctrl_gen_request solo[2] = {reqs[0], reqs[2]};
        solo[0].adapter = solo[1].adapter = 0;
        engine_run(merged, solo, 2, mout);
    }
    double worst = 0, worst_merged = 0;
    for (int c = 0; m && merged && c < 2; c++) {
        const ctrl_gen_output *o = &out[2 * c], *mo = &mout[c];
        CHECK_MSG(o->len == 12 && !memcmp(o->ids, want[c], sizeof(int32_t) * 12),
                  "%s prompt %d: the served adapter's greedy tokens differ from PEFT's", adapter, c);
        CHECK_MSG(mo->len == 12 && !memcmp(mo->ids, want[c], sizeof(int32_t) * 12),
                  "%s prompt %d: the merged model's greedy tokens differ from PEFT's", adapter, c);
        for (int k = 0; k < 12 && o->len == 12 && mo->len == 12; k++) {
            worst = fmax(worst, fabs((double)o->logprobs[k] - want_lp[c][k]));
            worst_merged = fmax(worst_merged, fabs((double)o->logprobs[k] - mo->logprobs[k]));
        }
        CHECK(out[2 * c + 1].len == 12 && memcmp(out[2 * c + 1].ids, want[c], sizeof(int32_t) * 12) != 0);
    }
    CHECK_MSG(worst <= 1e-4, "%s: log-probs %.3g from PEFT's", adapter, worst);
    CHECK_MSG(worst_merged <= 1e-4, "%s: log-probs %.3g from the merged model's", adapter, worst_merged);
    printf("  %-20s served in a mixed batch: PEFT's greedy tokens, log-probs within %.1e of PEFT's, %.1e of "
           "the merged model's\n",
           adapter, worst, worst_merged);
    for (int i = 0; i < 4; i++) ctrl_gen_output_free(&out[i]), ctrl_gen_output_free(&mout[i]);
    ctrl_model_free(m), ctrl_model_free(merged);
    cJSON_Delete(bj), cJSON_Delete(gj);
}

TEST(lora_bank_moe_adapter_generates_as_peft_and_as_merged) {
    moe_adapter_generates_as_peft("qwen3_moe_experts");
    moe_adapter_generates_as_peft("mixtral_experts_down");
}

/* The engine with a bank: requests under adapter 1, the base, adapter 2 and adapter 1 again (n = 2)
 * generated together (so they share every step: a mixed batch) give each request the tokens it gets
 * alone from the base under its adapter (ctrl_peft_load, as ctrl generate --adapter). */
static void generate_alone(const char *base, const char *adapter, const ctrl_gen_request *r,
                           ctrl_gen_output *o) {
    ctrl_model *m = NULL;
    CHECK_EQ_INT(adapter ? ctrl_peft_load(base, adapter, NULL, &m) : ctrl_model_load(base, NULL, &m),
                 CTRL_OK);
    test_attach_paged(m);
    ctrl_engine *e = NULL;
    CHECK_EQ_INT(ctrl_engine_create(m, &(ctrl_engine_config){1 << 20, 4, 8, 64, 0, 0, 0, 0}, &e), CTRL_OK);
    ctrl_gen_request one = *r;
    one.adapter = 0;
    one.n = 1; /* greedy: the caller copies the one sample for n > 1 (and frees it once) */
    if (e) CHECK_EQ_INT(ctrl_engine_generate(e, &one, 1, o, NULL, NULL), CTRL_OK);
    ctrl_engine_free(e);
    ctrl_model_free(m);
}

TEST(lora_bank_engine_batches_requests_for_different_adapters) {
    static const char base[] = CTRL_FIXTURE_DIR "/models/llama", a1[] = CTRL_FIXTURE_DIR "/lora/llama_qv";
    char b2[] = "/tmp/ctrl_lora_eng_XXXXXX"; /* a second llama adapter: llama_qv with B tripled */
    if (!scaled_adapter(base, a1, 3.0f, b2)) return;
    ctrl_model *m = bank_of(base, a1, b2);
    ctrl_engine *e = NULL;
    CHECK_EQ_INT(ctrl_engine_create(m, &(ctrl_engine_config){1 << 20, 4, 8, 64, 0, 1, 0, 0}, &e), CTRL_OK);
    static const int32_t p0[] = {3, 17, 42, 99, 5}, p1[] = {64, 11, 23}, p2[] = {88, 7, 120, 45, 2, 9};
    const ctrl_sampling_params greedy = {.temperature = 0, .top_p = 1, .top_k = -1, .repetition_penalty = 1};
    ctrl_gen_request reqs[4] = {
        {.prompt = p0, .prompt_len = 5, .n = 1, .max_tokens = 6, .sampling = greedy, .adapter = 1},
        {.prompt = p1, .prompt_len = 3, .n = 1, .max_tokens = 6, .sampling = greedy, .adapter = 0},
        {.prompt = p2, .prompt_len = 6, .n = 1, .max_tokens = 6, .sampling = greedy, .adapter = 2},
        {.prompt = p1, .prompt_len = 3, .n = 2, .max_tokens = 6, .sampling = greedy, .adapter = 1}};
    ctrl_gen_output out[5], alone[5];
    if (e) CHECK_EQ_INT(ctrl_engine_generate(e, reqs, 4, out, NULL, NULL), CTRL_OK);
    ctrl_gen_request bad = reqs[0];
    bad.adapter = 3;
    if (e) CHECK(ctrl_engine_add(e, &bad, alone) != CTRL_OK);
    int differs = 0;
    for (int r = 0, o = 0; e && r < 4; o += reqs[r++].n) {
        generate_alone(base,
                       reqs[r].adapter == 1   ? a1
                       : reqs[r].adapter == 2 ? b2
                                              : NULL,
                       &reqs[r], &alone[o]);
        if (reqs[r].n == 2) alone[o + 1] = alone[o]; /* greedy: both samples are the same */
        for (int k = 0; k < reqs[r].n; k++) {
            CHECK_EQ_INT(out[o + k].len, alone[o].len);
            CHECK_MSG(out[o + k].len == alone[o].len &&
                          !memcmp(out[o + k].ids, alone[o].ids, sizeof(int32_t) * (size_t)alone[o].len),
                      "request %d (adapter %d): the mixed batch's tokens differ from its adapter alone's", r,
                      reqs[r].adapter);
        }
        differs +=
            r > 0 && (out[o].len != out[1].len || memcmp(out[o].ids, out[1].ids, 4 * (size_t)out[1].len));
    }
    CHECK(differs >= 1); /* the adapters change what is generated */
    for (int o = 0; e && o < 5; o++) ctrl_gen_output_free(&out[o]);
    for (int o = 0; e && o < 4; o++) ctrl_gen_output_free(&alone[o]);
    ctrl_engine_free(e);
    ctrl_model_free(m);
    remove_adapter(b2);
}
