/* The model families beyond Llama/Qwen/Mistral against transformers (fixtures from
 * tests/reference/make_family_fixtures.py: tiny random models transformers made, ran and generated
 * with): Gemma 2 in two shapes (GQA with head_dim != hidden/heads, tied, the default alternating
 * sliding/full layers; MHA, untied, explicit layer_types, no attention soft-capping), soft-capped
 * attention and final logits bending the values, and Gemma's pad token (padding_idx) in the batch;
 * Gemma 3's text model in two shapes (q/k norms, a RoPE per layer type, the full one linearly scaled;
 * sliding_window_pattern; soft-capping on in one); Phi-3/4 in two (fused qkv_proj / gate_up_proj,
 * longrope on its long factors with partial rotary and GQA; on its short ones, with a sliding window);
 * a Llama 3.2 (llama3 rope scaling, tied embeddings); Qwen3-MoE in two (4 experts, top 2
 * renormalised; 8 experts, top 3 not, a dense layer between sparse ones) and Mixtral (its checkpoint
 * names, always renormalised, a sliding window) and OLMoE (q/k norms over the whole projections).
 *   - a packed batch of three sequences: per-token log-probs, the loss and every parameter's gradient
 *     within 1e-5 relative (fp32) of transformers', with the eager and the flash attention plugins,
 *     with activation checkpointing (the layers recomputed before their backward), and through the
 *     fused forward (dL/dlogp up front, as SFT runs it);
 *   - greedy decoding over the paged KV cache: the logits after each prompt and 12 greedy tokens equal
 *     transformers' generate; and Phi-3 through the engine across its trained context (the cache
 *     dropped and the sequence computed again on the long factors, as Phi3ForCausalLM);
 *   - save and reload: the same weights and the same family fields in config.json (and transformers
 *     loads the saved directories: tests/reference/check_saved_models.py);
 *   - config.json's family keys checked (errors naming the key). */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_text.h"
#include "generate/engine.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/json_file.h"
#include "test.h"
#include "test_registry.h"

#define FAM CTRL_FIXTURE_DIR "/families"

static const ctrl_attention_ops *attention(const char *name) {
    static ctrl_registry *reg;
    if (!reg) reg = test_plugin_registry();
    const ctrl_plugin *p = NULL;
    CHECK_MSG(reg && ctrl_registry_require(reg, CTRL_KIND_ATTENTION, name, &p) == CTRL_OK, "%s",
              ctrl_error_message());
    return p ? p->ops : NULL;
}

/* The relative L2 error of every gradient tensor against grads.safetensors; the worst one's. */
static double worst_grad_error(ctrl_model *m, const char *dir, const char **worst_name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/grads.safetensors", dir);
    ctrl_safetensors *gs = NULL;
    CHECK_MSG(ctrl_safetensors_open(path, &gs) == CTRL_OK, "%s", ctrl_error_message());
    if (!gs) return INFINITY;
    const float *grads = ctrl_model_grads(m, NULL);
    double worst = 0;
    int read = 0;
    for (int v = 0; v < ctrl_model_view_count(m); v++) {
        const ctrl_param_view *pv = ctrl_model_view(m, v);
        float *want = malloc(sizeof(float) * (size_t)pv->numel);
        ctrl_status st = ctrl_safetensors_read_f32(gs, pv->name, want, pv->numel);
        CHECK_MSG(st == CTRL_OK, "%s: %s", path, ctrl_error_message());
        if (st == CTRL_OK) {
            read++;
            const double e = test_rel_error_f32(grads + pv->offset, want, pv->numel);
            if (e > worst) worst = e, *worst_name = pv->name;
        }
        free(want);
    }
    CHECK_EQ_INT(read, ctrl_safetensors_count(gs)); /* every tensor transformers has a gradient for */
    ctrl_safetensors_close(gs);
    return worst;
}

/* Recompute every layer (activation checkpointing): the strategy's one hook. */
static int recompute_all(const ctrl_memory *mem, int layer) {
    (void)mem, (void)layer;
    return 1;
}

/* fused: the forward with dL/dlogp up front (SFT's path: the soft-capped head's backward inside it). */
static void check_training(const char *name, const char *attn_name, int checkpointing, int fused) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, FAM "/%s", name);
    const ctrl_attention_ops *attn = attention(attn_name);
    ctrl_model *m = NULL;
    CHECK_MSG(ctrl_model_load(dir, attn, &m) == CTRL_OK, "%s: %s", name, ctrl_error_message());
    snprintf(path, sizeof path, "%s/batch.json", dir);
    cJSON *root = json_file(path);
    if (!m || !root) return;
    static const ctrl_memory_ops every_layer = {.size = sizeof(ctrl_memory_ops), .recompute = recompute_all};
    if (checkpointing) CHECK_EQ_INT(ctrl_model_set_memory(m, &every_layer, NULL), CTRL_OK);
    int T, nb, np, nt;
    int32_t *tok = json_ints(root, "tokens", &T), *pos = json_ints(root, "positions", &np),
            *tg = json_ints(root, "targets", &nt), *cu = json_ints(root, "cu_seqlens", &nb);
    float *logp = malloc(sizeof(float) * T), *want = malloc(sizeof(float) * T),
          *dlogp = malloc(sizeof(float) * T);
    const cJSON *wl = cJSON_GetObjectItemCaseSensitive(root, "logp");
    for (int t = 0; t < T; t++) want[t] = (float)cJSON_GetArrayItem(wl, t)->valuedouble;
    const ctrl_batch b = {
        .T = T, .B = nb - 1, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
    int n = 0;
    double loss = 0;
    for (int t = 0; t < T; t++) n += tg[t] >= 0;
    for (int t = 0; t < T; t++) dlogp[t] = tg[t] >= 0 ? -1.0f / n : 0.0f;
    ctrl_model_zero_grad(m);
    const ctrl_status fwd = fused ? ctrl_model_forward_fused(m, &b, dlogp, logp, NULL, NULL)
                                  : ctrl_model_forward(m, &b, logp, NULL, NULL);
    CHECK_MSG(fwd == CTRL_OK, "%s", ctrl_error_message());
    for (int t = 0; t < T; t++) loss -= logp[t] / n;
    const double want_loss = cJSON_GetObjectItemCaseSensitive(root, "loss")->valuedouble;
    const double e_logp = test_rel_error_f32(logp, want, T);
    CHECK_MSG(e_logp <= 1e-5, "%s/%s: log-probs relative error %.3g", name, attn_name, e_logp);
    CHECK_MSG(fabs(loss - want_loss) <= 1e-5 * fabs(want_loss), "%s/%s: loss %.8f vs %.8f", name, attn_name,
              loss, want_loss);
    CHECK_MSG(ctrl_model_backward(m, fused ? NULL : dlogp) == CTRL_OK, "%s", ctrl_error_message());
    const char *worst_name = "";
    const double worst = worst_grad_error(m, dir, &worst_name);
    /* 2e-5: a norm weight's gradient sums many products of both signs, and its last bits follow the
     * BLAS's summation order (gemma3_mha's q_norm: 1.06e-5 with OpenBLAS's kernels on an H200 host's
     * Xeon, 3.4e-6 on the development machine's EPYC) */
    CHECK_MSG(worst <= 2e-5, "%s/%s: gradient of %s: relative error %.3g", name, attn_name, worst_name,
              worst);
    printf(
        "  %-10s %-5s%s%s: loss %.7f (transformers %.7f), log-probs rel %.1e, worst gradient rel %.1e (%s)\n",
        name, attn_name, checkpointing ? " recomputed" : "", fused ? " fused" : "", loss, want_loss, e_logp,
        worst, worst_name);
    cJSON_Delete(root);
    free(tok), free(pos), free(tg), free(cu), free(logp), free(want), free(dlogp);
    ctrl_model_free(m);
}

/* Each model with both plugins, activation checkpointing and the fused head. */
static void check_model(const char *name) {
    check_training(name, "eager", 0, 0);
    check_training(name, "flash", 0, 0);
    check_training(name, "flash", 1, 0);
    check_training(name, "eager", 1, 1);
}

TEST(gemma2_gqa_matches_transformers) { check_model("gemma2_gqa"); }
TEST(gemma2_mha_matches_transformers) { check_model("gemma2_mha"); }
TEST(gemma3_gqa_matches_transformers) { check_model("gemma3_gqa"); }
TEST(gemma3_mha_matches_transformers) { check_model("gemma3_mha"); }
TEST(phi3_gqa_matches_transformers) { check_model("phi3_gqa"); }
TEST(phi3_mha_matches_transformers) { check_model("phi3_mha"); }
TEST(llama32_matches_transformers) { check_model("llama32"); }
TEST(qwen3_moe_a_matches_transformers) { check_model("qwen3_moe_a"); }
TEST(qwen3_moe_b_matches_transformers) { check_model("qwen3_moe_b"); }
TEST(mixtral_matches_transformers) { check_model("mixtral"); }
TEST(olmoe_matches_transformers) { check_model("olmoe"); }

static int argmax(const float *x, int n) {
    int a = 0;
    for (int i = 1; i < n; i++) a = x[i] > x[a] ? i : a;
    return a;
}

/* Each prompt prefilled in one call, then 12 greedy steps, as transformers' generate. */
static void check_generation(const char *name) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, FAM "/%s", name);
    snprintf(path, sizeof path, "%s/generation.json", dir);
    cJSON *cases = json_file(path);
    ctrl_model *m = NULL;
    CHECK_MSG(ctrl_model_load(dir, NULL, &m) == CTRL_OK, "%s", ctrl_error_message());
    test_attach_paged(m);
    if (!m || !cases) return;
    const ctrl_model_config *c = ctrl_model_cfg(m);
    const int V = c->vocab_size;
    ctrl_kv_cache *kv = NULL;
    CHECK_EQ_INT(ctrl_kv_cache_create(c->n_layers, c->n_kv_heads, c->head_dim, 4, 1 << 20, CTRL_F32, &kv),
                 CTRL_OK);
    float *logits = malloc(sizeof(float) * V);
    for (int s = 0; kv && s < cJSON_GetArraySize(cases); s++) {
        const cJSON *cs = cJSON_GetArrayItem(cases, s);
        int n = 0, ng = 0;
        int32_t *prompt = json_ints(cs, "prompt", &n), *want = json_ints(cs, "generated", &ng);
        ctrl_kv_seq seq = {0}, *seqs[1] = {&seq};
        CHECK_MSG(ctrl_model_decode(m, kv, seqs, prompt, &n, 1, logits) == CTRL_OK, "%s",
                  ctrl_error_message());
        const cJSON *first = cJSON_GetObjectItem(cs, "first_logits");
        float *fl = malloc(sizeof(float) * V);
        for (int i = 0; i < V; i++) fl[i] = (float)cJSON_GetArrayItem(first, i)->valuedouble;
        const double e = test_rel_error_f32(logits, fl, V);
        CHECK_MSG(e <= 1e-5, "%s prompt %d: logits relative error %.3g", name, s, e);
        int same = 1, one = 1;
        for (int i = 0; i < ng; i++) {
            int32_t next = argmax(logits, V);
            same &= next == want[i];
            if (i + 1 < ng)
                CHECK_MSG(ctrl_model_decode(m, kv, seqs, &next, &one, 1, logits) == CTRL_OK, "%s",
                          ctrl_error_message());
        }
        CHECK_MSG(same, "%s prompt %d: greedy tokens differ from transformers' generate", name, s);
        printf("  %-10s prompt %d: first logits rel %.1e, %d greedy tokens as transformers\n", name, s, e,
               ng);
        ctrl_kv_seq_release(kv, &seq);
        free(prompt), free(want), free(fl);
    }
    free(logits);
    ctrl_kv_cache_free(kv);
    ctrl_model_free(m);
    cJSON_Delete(cases);
}

/* Phi-3 generating past original_max_position_embeddings (32 in phi3_mha): transformers' Phi3ForCausalLM
 * drops its cache when the sequence outgrows the trained context and computes it all again on longrope's
 * long factors; the engine recomputes the sequence there as after a preemption. Its greedy tokens equal
 * transformers' generate (make_family_fixtures.py make_long_generation: a prompt of 26 tokens, 14 new);
 * a decode that keeps the short-factor cache gives transformers' kept-cache tokens instead, which
 * differ (so the fixture tells the two apart). */
TEST(phi3_generation_past_the_trained_context_matches_transformers) {
    const char *dir = FAM "/phi3_mha";
    cJSON *j = json_file(FAM "/phi3_mha/generation_long.json");
    ctrl_model *m = NULL;
    CHECK_MSG(ctrl_model_load(dir, NULL, &m) == CTRL_OK, "%s", ctrl_error_message());
    if (!m || !j) return cJSON_Delete(j), ctrl_model_free(m);
    test_attach_paged(m);
    int n = 0, ng = 0, nk = 0;
    int32_t *prompt = json_ints(j, "prompt", &n), *want = json_ints(j, "generated", &ng),
            *kept = json_ints(j, "kept_cache", &nk);
    CHECK(ng == nk && memcmp(want, kept, sizeof(int32_t) * (size_t)ng) != 0);
    /* the engine */
    ctrl_engine *e = NULL;
    CHECK_EQ_INT(ctrl_engine_create(m, &(ctrl_engine_config){1 << 20, 16, 8, 64, 0, 0, 0, 0}, &e), CTRL_OK);
    const ctrl_gen_request rq = {.prompt = prompt,
                                 .prompt_len = n,
                                 .n = 1,
                                 .max_tokens = ng,
                                 .sampling = {.temperature = 0, .top_p = 1, .repetition_penalty = 1}};
    ctrl_gen_output out = {0};
    CHECK_MSG(e && ctrl_engine_generate(e, &rq, 1, &out, NULL, NULL) == CTRL_OK, "%s", ctrl_error_message());
    CHECK_MSG(out.len == ng && memcmp(out.ids, want, sizeof(int32_t) * (size_t)ng) == 0,
              "phi3_mha: the engine's greedy tokens past the trained context differ from transformers'");
    ctrl_gen_output_free(&out);
    ctrl_engine_free(e);
    /* a plain decode keeping the short-factor cache: transformers' kept-cache tokens */
    const ctrl_model_config *c = ctrl_model_cfg(m);
    ctrl_kv_cache *kv = NULL;
    CHECK_EQ_INT(ctrl_kv_cache_create(c->n_layers, c->n_kv_heads, c->head_dim, 4, 1 << 20, CTRL_F32, &kv),
                 CTRL_OK);
    float *logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    ctrl_kv_seq seq = {0}, *seqs[1] = {&seq};
    int one = 1, same = kv && logits && ctrl_model_decode(m, kv, seqs, prompt, &n, 1, logits) == CTRL_OK;
    for (int i = 0; same && i < nk; i++) {
        int32_t next = argmax(logits, c->vocab_size);
        same = next == kept[i] &&
               (i + 1 == nk || ctrl_model_decode(m, kv, seqs, &next, &one, 1, logits) == CTRL_OK);
    }
    CHECK_MSG(same, "phi3_mha: a decode keeping its cache is not transformers' kept-cache decode");
    printf("  phi3_mha: %d greedy tokens past original_max_position_embeddings as transformers' generate\n",
           ng);
    if (kv) ctrl_kv_seq_release(kv, &seq);
    ctrl_kv_cache_free(kv);
    free(logits), free(prompt), free(want), free(kept);
    ctrl_model_free(m);
    cJSON_Delete(j);
}

TEST(gemma2_greedy_generation_matches_transformers) {
    check_generation("gemma2_gqa");
    check_generation("gemma2_mha");
}

TEST(gemma3_greedy_generation_matches_transformers) {
    check_generation("gemma3_gqa");
    check_generation("gemma3_mha");
}

/* phi3_gqa decodes on longrope's long factors from the first token, phi3_mha on its short ones. */
TEST(phi3_greedy_generation_matches_transformers) {
    check_generation("phi3_gqa");
    check_generation("phi3_mha");
}

/* Llama 3.2: llama3 rope scaling, tied embeddings, GQA 4/1, head_dim != hidden / heads. */
TEST(llama32_greedy_generation_matches_transformers) { check_generation("llama32"); }

/* Qwen3-MoE: routing in decoding through the same layer code. */
TEST(qwen3_moe_greedy_generation_matches_transformers) {
    check_generation("qwen3_moe_a");
    check_generation("qwen3_moe_b");
    check_generation("mixtral");
    check_generation("olmoe");
}

TEST(gemma_save_and_reload) {
    static const char *const names[] = {"gemma2_gqa", "gemma2_mha",  "gemma3_gqa",  "gemma3_mha", "phi3_gqa",
                                        "phi3_mha",   "qwen3_moe_a", "qwen3_moe_b", "mixtral",    "olmoe"};
    for (int i = 0; i < 10; i++) {
        char dir[512], out[] = "/tmp/ctrl-gemma-save-XXXXXX";
        snprintf(dir, sizeof dir, FAM "/%s", names[i]);
        CHECK(mkdtemp(out) != NULL);
        ctrl_model *m = NULL, *back = NULL;
        CHECK_EQ_INT(ctrl_model_load(dir, NULL, &m), CTRL_OK);
        if (!m) continue;
        CHECK_MSG(ctrl_model_save(m, out, CTRL_F32) == CTRL_OK, "%s", ctrl_error_message());
        CHECK_MSG(ctrl_model_load(out, NULL, &back) == CTRL_OK, "%s", ctrl_error_message());
        size_t n1 = 0, n2 = 0;
        const float *p1 = ctrl_model_params(m, &n1), *p2 = back ? ctrl_model_params(back, &n2) : NULL;
        CHECK(back && n1 == n2 && memcmp(p1, p2, n1 * sizeof(float)) == 0);
        const ctrl_model_config *a = ctrl_model_cfg(m), *b = back ? ctrl_model_cfg(back) : a;
        CHECK(a->arch == b->arch && a->norm_plus_one == b->norm_plus_one &&
              a->sandwich_norm == b->sandwich_norm && a->mlp_act == b->mlp_act &&
              a->embed_scale == b->embed_scale && a->attn_scale == b->attn_scale &&
              a->attn_softcap == b->attn_softcap && a->final_softcap == b->final_softcap &&
              a->sliding_window == b->sliding_window && a->tie_word_embeddings == b->tie_word_embeddings &&
              a->head_dim == b->head_dim && a->pad_token_id == b->pad_token_id &&
              a->rope.theta == b->rope.theta && a->qk_norm == b->qk_norm && a->local_rope == b->local_rope &&
              a->rope.kind == b->rope.kind && a->rope.factor == b->rope.factor &&
              a->rope_local.theta == b->rope_local.theta && a->fused_qkv == b->fused_qkv &&
              a->fused_gate_up == b->fused_gate_up && a->rope_dim == b->rope_dim &&
              a->rope.n_factors == b->rope.n_factors &&
              memcmp(a->rope.long_factor, b->rope.long_factor, sizeof a->rope.long_factor) == 0 &&
              memcmp(a->rope.short_factor, b->rope.short_factor, sizeof a->rope.short_factor) == 0 &&
              a->original_max_position_embeddings == b->original_max_position_embeddings &&
              a->n_experts == b->n_experts && a->n_experts_per_tok == b->n_experts_per_tok &&
              a->moe_intermediate_size == b->moe_intermediate_size &&
              a->norm_topk_prob == b->norm_topk_prob &&
              memcmp(a->moe_layer, b->moe_layer, (size_t)a->n_layers) == 0 &&
              memcmp(a->sliding_layer, b->sliding_layer, (size_t)a->n_layers) == 0);
        /* For tests/reference/check_saved_models.py: keep a copy where asked. */
        const char *keep = getenv("CTRL_SAVE_TEST_DIR");
        if (keep) {
            char kept[1024];
            snprintf(kept, sizeof kept, "%s/%s", keep, names[i]);
            CHECK_EQ_INT(ctrl_model_save(m, kept, CTRL_F32), CTRL_OK);
        }
        ctrl_model_free(m), ctrl_model_free(back);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", out);
        CHECK(system(cmd) == 0);
    }
}

/* config.json `base` (the object's fields) with `extra` spliced in, loaded: the status (and the message). */
static ctrl_status load_json(const char *base, const char *extra, ctrl_model_config *c) {
    char path[] = "/tmp/ctrl-family-config-XXXXXX";
    const int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) return CTRL_ERR_IO;
    fprintf(f, "{%s%s}", base, extra);
    fclose(f);
    const ctrl_status st = ctrl_model_config_load(path, c);
    remove(path);
    return st;
}

/* A valid tiny Gemma 2's config.json with `extra`. */
static ctrl_status load_config(const char *extra, ctrl_model_config *c) {
    return load_json("\"model_type\": \"gemma2\", \"hidden_size\": 16, \"intermediate_size\": 32, "
                     "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
                     "\"vocab_size\": 32",
                     extra, c);
}

TEST(gemma2_config_defaults_and_errors) {
    ctrl_model_config c;
    CHECK_EQ_INT(load_config("", &c), CTRL_OK); /* Gemma2Config's defaults */
    CHECK_EQ_INT(c.head_dim, 256);
    CHECK(c.tie_word_embeddings && c.norm_plus_one && c.sandwich_norm && c.mlp_act == CTRL_ACT_GELU_TANH);
    CHECK(c.attn_softcap == 50.0f && c.final_softcap == 30.0f && c.sliding_window == 4096);
    CHECK(c.attn_scale == 0.0625f && c.embed_scale == 4.0f && c.pad_token_id == 0 && c.eos_token_id == 1);
    CHECK(c.sliding_layer[0] == 1 && c.sliding_layer[1] == 0); /* sliding, full, ... */
    CHECK_EQ_INT(ctrl_model_layer_window(&c, 0), 4096);
    CHECK_EQ_INT(ctrl_model_layer_window(&c, 1), 0);
    CHECK_EQ_INT(load_config(", \"attn_logit_softcapping\": null, \"final_logit_softcapping\": null", &c),
                 CTRL_OK);
    CHECK(c.attn_softcap == 0 && c.final_softcap == 0);
    CHECK_EQ_INT(load_config(", \"hidden_activation\": \"relu\"", &c), CTRL_ERR_UNSUPPORTED);
    CHECK_CONTAINS(ctrl_error_message(), "hidden_activation");
    CHECK_EQ_INT(load_config(", \"layer_types\": [\"full_attention\"]", &c), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "layer_types");
    CHECK_EQ_INT(load_config(", \"layer_types\": [\"full_attention\", \"chunked_attention\"]", &c),
                 CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "layer_types[1]");
    CHECK_EQ_INT(load_config(", \"sliding_window\": null", &c), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "sliding_window");
    CHECK_EQ_INT(load_config(", \"use_bidirectional_attention\": true", &c), CTRL_ERR_UNSUPPORTED);
    CHECK_CONTAINS(ctrl_error_message(), "use_bidirectional_attention");
    CHECK_EQ_INT(load_config(", \"final_logit_softcapping\": -1", &c), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "final_logit_softcapping");
}

/* A tiny Phi-3's config.json with `extra`. */
static ctrl_status load_phi3(const char *extra, ctrl_model_config *c) {
    return load_json("\"model_type\": \"phi3\", \"hidden_size\": 32, \"intermediate_size\": 32, "
                     "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"vocab_size\": 40000",
                     extra, c);
}

TEST(phi3_config_defaults_and_errors) {
    ctrl_model_config c;
    CHECK_EQ_INT(load_phi3("", &c), CTRL_OK); /* Phi3Config's defaults */
    CHECK(c.fused_qkv && c.fused_gate_up && c.rms_norm_eps == 1e-5f && !c.tie_word_embeddings);
    CHECK(c.bos_token_id == 1 && c.eos_token_id == 32000 && c.pad_token_id == 32000);
    CHECK(c.original_max_position_embeddings == 4096 && c.rope_dim == 16 && c.sliding_window == 0);
    CHECK_EQ_INT(load_phi3(", \"partial_rotary_factor\": 0.75, \"sliding_window\": 2047", &c), CTRL_OK);
    CHECK(c.rope_dim == 12 && c.sliding_window == 2047); /* Phi-4-mini's top-level factor */
    /* the 4.x spelling: rope_scaling of type su, factors of rotated dims / 2 */
    CHECK_EQ_INT(
        load_phi3(", \"rope_scaling\": {\"type\": \"su\", \"short_factor\": [1, 1, 1, 1, 1, 1, 1, 1], "
                  "\"long_factor\": [2, 2, 2, 2, 2, 2, 2, 3]}, \"max_position_embeddings\": 131072",
                  &c),
        CTRL_OK);
    CHECK(c.rope.kind == CTRL_ROPE_LONGROPE && c.rope.n_factors == 8 && c.rope.long_factor[7] == 3.0f);
    CHECK(c.rope.factor == 32.0 && c.rope.original_max_position == 4096);
    CHECK_EQ_INT(load_phi3(", \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1, 1], "
                           "\"long_factor\": [2, 2]}",
                           &c),
                 CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "short_factor");
    CHECK_EQ_INT(load_phi3(", \"hidden_act\": \"gelu\"", &c), CTRL_ERR_UNSUPPORTED);
    CHECK_CONTAINS(ctrl_error_message(), "hidden_act");
    CHECK_EQ_INT(load_phi3(", \"resid_pdrop\": 0.1", &c), CTRL_ERR_UNSUPPORTED);
    CHECK_CONTAINS(ctrl_error_message(), "resid_pdrop");
    CHECK_EQ_INT(load_phi3(", \"partial_rotary_factor\": 0.2", &c), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "partial_rotary_factor");
}

/* DPO's and WPO's head statistics on a soft-capped head (Gemma 2): the mean logit and log sum p^2 of
 * each token's capped distribution, against the capped logits decoding gives for the same tokens. */
TEST(gemma2_head_stats_with_softcapping) {
    ctrl_model *m = NULL;
    CHECK_MSG(ctrl_model_load(FAM "/gemma2_gqa", attention("eager"), &m) == CTRL_OK, "%s",
              ctrl_error_message());
    test_attach_paged(m);
    if (!m) return;
    const int V = ctrl_model_cfg(m)->vocab_size;
    int32_t tok[6] = {3, 17, 42, 0, 5, 64}, pos[6] = {0, 1, 2, 3, 4, 5}, tg[6] = {17, 42, 0, 5, 64, -100},
            cu[2] = {0, 6};
    const ctrl_batch b = {.T = 6, .B = 1, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
    float lp[6], mean[6], lss[6], *logits = malloc(sizeof(float) * 6 * V);
    CHECK_EQ_INT(ctrl_model_forward(m, &b, lp, NULL, NULL), CTRL_OK);
    CHECK_MSG(ctrl_model_head_stats(m, mean, lss) == CTRL_OK, "%s", ctrl_error_message());
    const ctrl_model_config *c = ctrl_model_cfg(m);
    ctrl_kv_cache *kv = NULL;
    CHECK_EQ_INT(ctrl_kv_cache_create(c->n_layers, c->n_kv_heads, c->head_dim, 4, 1 << 20, CTRL_F32, &kv),
                 CTRL_OK);
    ctrl_kv_seq seq = {0};
    CHECK_MSG(ctrl_model_decode_all(m, kv, &seq, tok, 6, logits) == CTRL_OK, "%s", ctrl_error_message());
    for (int t = 0; t < 5; t++) { /* the last token has no target: 0 there */
        const float *z = logits + (size_t)t * V;
        double s = 0, mx = -INFINITY, se = 0, se2 = 0;
        for (int v = 0; v < V; v++) s += z[v], mx = z[v] > mx ? z[v] : mx;
        for (int v = 0; v < V; v++) se += exp(z[v] - mx), se2 += exp(2 * (z[v] - mx));
        CHECK_NEAR(mean[t], s / V, 1e-5);
        CHECK_NEAR(lss[t], log(se2) - 2 * log(se), 1e-5);
    }
    CHECK(mean[5] == 0 && lss[5] == 0);
    ctrl_kv_seq_release(kv, &seq);
    ctrl_kv_cache_free(kv);
    free(logits);
    ctrl_model_free(m);
}
