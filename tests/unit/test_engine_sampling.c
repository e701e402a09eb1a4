/* Sampling through the whole engine: (1) the n samples of a prompt give identical tokens and
 * log-probabilities with prefix sharing on (forked prompt blocks) and off (each sample prefills
 * its own prompt); (2) the first token drawn at temperature 1 follows the model's own next-token
 * distribution: 6000 one-token samples of a prompt on the tiny Qwen2 (vocabulary 128) against
 * softmax of the logits of a full forward, by Pearson's chi-square (127 degrees of freedom, cells
 * with expected count < 5 pooled; critical value for p = 0.001), and each draw's reported
 * log-probability equals the model's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate/engine.h"
#include "test.h"
#include "test_registry.h"

static ctrl_model *tiny(void) {
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_load(CTRL_FIXTURE_DIR "/models/qwen2", NULL, &m), CTRL_OK);
    test_attach_paged(m);
    return m;
}

static const int32_t prompt[21] = {5,  17, 33, 2,  90, 41, 7,  7,  64,  101, 3,
                                   12, 88, 19, 27, 45, 60, 71, 99, 110, 8};

TEST(samples_equal_with_and_without_prefix_sharing) {
    ctrl_model *m = tiny();
    if (!m) return;
    ctrl_gen_output out[2][6];
    long shared[2];
    for (int off = 0; off < 2; off++) {
        ctrl_engine_config cfg = {.kv_cache_bytes = 4 << 20,
                                  .block_size = 4,
                                  .max_num_seqs = 64,
                                  .max_num_batched_tokens = 256,
                                  .no_prefix_sharing = off};
        ctrl_engine *e;
        CHECK_EQ_INT(ctrl_engine_create(m, &cfg, &e), CTRL_OK);
        ctrl_gen_request r = {.prompt = prompt,
                              .prompt_len = 21,
                              .n = 6,
                              .max_tokens = 10,
                              .seed = 77,
                              .sampling = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f}};
        CHECK_EQ_INT(ctrl_engine_generate(e, &r, 1, out[off], NULL, NULL), CTRL_OK);
        ctrl_engine_stats(e, NULL, NULL, &shared[off]);
        ctrl_engine_free(e);
    }
    CHECK_MSG(shared[0] > 0 && shared[1] == 0, "shared blocks: %ld with sharing, %ld without", shared[0],
              shared[1]);
    for (int k = 0; k < 6; k++) {
        CHECK_EQ_INT(out[0][k].len, out[1][k].len);
        CHECK_MSG(out[0][k].len == out[1][k].len &&
                      !memcmp(out[0][k].ids, out[1][k].ids, sizeof(int32_t) * out[0][k].len),
                  "sample %d differs with prefix sharing off", k);
        for (int t = 0; t < out[0][k].len && t < out[1][k].len; t++)
            CHECK_NEAR(out[0][k].logprobs[t], out[1][k].logprobs[t], 1e-5);
        ctrl_gen_output_free(&out[0][k]), ctrl_gen_output_free(&out[1][k]);
    }
    ctrl_model_free(m);
}

TEST(first_token_follows_the_model_distribution) {
    /* the training forward (flash attention), not the decode path the engine samples through */
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *fe = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash");
    ctrl_model *m = NULL;
    CHECK(fe != NULL);
    if (fe) CHECK_EQ_INT(ctrl_model_load(CTRL_FIXTURE_DIR "/models/qwen2", fe->plugin->ops, &m), CTRL_OK);
    if (!m) return;
    test_attach_paged(m);
    const int V = ctrl_model_cfg(m)->vocab_size, draws = 6000;
    /* the model's next-token log-probabilities after the prompt: every target of a full forward */
    int32_t pos[21], cu[2] = {0, 21};
    double *want = malloc(sizeof(double) * V);
    for (int i = 0; i < 21; i++) pos[i] = i;
    for (int v = 0; v < V; v++) { /* the log-probability of each candidate as the last target */
        int32_t g2[21];
        for (int i = 0; i < 21; i++) g2[i] = i < 20 ? prompt[i + 1] : v;
        float lp[21];
        ctrl_batch b = {.T = 21, .B = 1, .tokens = prompt, .positions = pos, .cu_seqlens = cu, .targets = g2};
        CHECK_EQ_INT(ctrl_model_forward(m, &b, lp, NULL, NULL), CTRL_OK);
        want[v] = lp[20];
    }
    ctrl_engine_config cfg = {
        .kv_cache_bytes = 64 << 20, .block_size = 16, .max_num_seqs = 512, .max_num_batched_tokens = 4096};
    ctrl_engine *e;
    CHECK_EQ_INT(ctrl_engine_create(m, &cfg, &e), CTRL_OK);
    ctrl_gen_request r = {.prompt = prompt,
                          .prompt_len = 21,
                          .n = draws,
                          .max_tokens = 1,
                          .seed = 2024,
                          .sampling = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f}};
    ctrl_gen_output *out = calloc((size_t)draws, sizeof *out);
    CHECK_EQ_INT(ctrl_engine_generate(e, &r, 1, out, NULL, NULL), CTRL_OK);
    int *count = calloc((size_t)V, sizeof(int));
    double worst_lp = 0;
    for (int d = 0; d < draws; d++) {
        if (out[d].len != 1) continue;
        count[out[d].ids[0]]++;
        worst_lp = fmax(worst_lp, fabs(out[d].logprobs[0] - want[out[d].ids[0]]));
        ctrl_gen_output_free(&out[d]);
    }
    /* Pearson's chi-square with cells of expected count < 5 pooled into one */
    double chi2 = 0, pooled_obs = 0, pooled_exp = 0;
    int cells = 0;
    for (int v = 0; v < V; v++) {
        const double ex = draws * exp(want[v]);
        if (ex < 5) {
            pooled_obs += count[v], pooled_exp += ex;
            continue;
        }
        chi2 += (count[v] - ex) * (count[v] - ex) / ex, cells++;
    }
    if (pooled_exp > 0) chi2 += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / pooled_exp, cells++;
    const int df = cells - 1;
    /* the chi-square quantile at p = 0.001 (Wilson-Hilferty) */
    const double z = 3.090, crit = df * pow(1 - 2.0 / (9 * df) + z * sqrt(2.0 / (9 * df)), 3);
    printf("  %d draws over %d cells: chi-square %.1f, critical %.1f (df %d); worst logprob error %.1e\n",
           draws, cells, chi2, crit, df, worst_lp);
    CHECK_MSG(chi2 < crit, "chi-square %.1f >= %.1f: the draws do not follow the model", chi2, crit);
    CHECK_MSG(worst_lp < 1e-4, "reported log-probabilities differ from the model's by %.2g", worst_lp);
    free(count), free(out), free(want);
    ctrl_engine_free(e);
    ctrl_model_free(m);
    ctrl_registry_destroy(reg);
}

/* The prefix cache across requests: a repeated prompt reuses its cached blocks and gets the same
 * tokens as without the cache (greedy and seeded sampling); a reset empties it; a pool too small
 * for everything evicts cached blocks instead of failing. */
TEST(prefix_cache_reuses_blocks_and_changes_nothing) {
    ctrl_model *m = tiny();
    if (!m) return;
    int32_t longer[40];
    for (int i = 0; i < 40; i++) longer[i] = prompt[i % 21] + i % 3;
    const ctrl_sampling_params warm = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
    const ctrl_sampling_params greedy = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};
    ctrl_gen_request r[2] = {
        {.prompt = longer, .prompt_len = 40, .n = 3, .max_tokens = 6, .seed = 5, .sampling = warm},
        {.prompt = longer, .prompt_len = 33, .n = 1, .max_tokens = 6, .sampling = greedy}};
    ctrl_gen_output want[4], got[4];
    ctrl_engine *plain, *cached;
    ctrl_engine_config cfg = {
        .kv_cache_bytes = 4 << 20, .block_size = 4, .max_num_seqs = 64, .max_num_batched_tokens = 256};
    CHECK_EQ_INT(ctrl_engine_create(m, &cfg, &plain), CTRL_OK);
    cfg.prefix_cache = 1;
    CHECK_EQ_INT(ctrl_engine_create(m, &cfg, &cached), CTRL_OK);
    CHECK_EQ_INT(ctrl_engine_generate(plain, r, 2, want, NULL, NULL), CTRL_OK);
    for (int round = 0; round < 3; round++) { /* cold, warm, after a reset */
        if (round == 2) ctrl_engine_reset_prefix_cache(cached);
        const long before = ctrl_engine_prefix_hits(cached);
        CHECK_EQ_INT(ctrl_engine_generate(cached, r, 2, got, NULL, NULL), CTRL_OK);
        const long hits = ctrl_engine_prefix_hits(cached) - before;
        /* warm: 9 blocks of the 40-token prompt (one token left to prefill) and 8 of the 33-token one */
        CHECK_MSG(round == 1 ? hits == 9 + 8 : hits == 0, "round %d: %ld blocks from the cache", round, hits);
        for (int i = 0; i < 4; i++) {
            CHECK_MSG(got[i].len == want[i].len &&
                          !memcmp(got[i].ids, want[i].ids, sizeof(int32_t) * got[i].len),
                      "round %d output %d differs with the prefix cache", round, i);
            ctrl_gen_output_free(&got[i]);
        }
    }
    for (int i = 0; i < 4; i++) ctrl_gen_output_free(&want[i]);
    ctrl_engine_free(plain), ctrl_engine_free(cached);
    /* a pool of 20 blocks of 4: the cached prompts must give way to new ones */
    const ctrl_model_config *c = ctrl_model_cfg(m);
    cfg.kv_cache_bytes = 20 * 2 * sizeof(float) * (size_t)c->n_layers * 4 * c->n_kv_heads * c->head_dim;
    CHECK_EQ_INT(ctrl_engine_create(m, &cfg, &cached), CTRL_OK);
    for (int k = 0; k < 6; k++) { /* six different 40-token prompts, one after the other */
        int32_t p[40];
        for (int i = 0; i < 40; i++) p[i] = (prompt[i % 21] + 7 * k + i) % 128;
        ctrl_gen_request q = {.prompt = p, .prompt_len = 40, .n = 1, .max_tokens = 4, .sampling = greedy};
        ctrl_gen_output o;
        CHECK_MSG(ctrl_engine_generate(cached, &q, 1, &o, NULL, NULL) == CTRL_OK, "prompt %d: %s", k,
                  ctrl_error_message());
        ctrl_gen_output_free(&o);
    }
    ctrl_engine_free(cached);
    ctrl_model_free(m);
}
