/* Decoding over the paged KV cache against transformers' greedy generate (fixtures from
 * tests/reference/make_generation_fixtures.py) for Llama, Qwen2, Qwen3 and Mistral: the logits after
 * the prompt match, and 12 greedy steps give transformers' tokens — with both prompts in one batch,
 * prefilled in one chunk or in chunks of 3, on blocks of 4 tokens so that sequences span several
 * blocks — with an fp32 cache and a bf16 one (logits within 1e-2; the greedy tokens equal on these
 * fixtures). A pool too small is a clear error; released blocks return to the pool; a bf16 pool
 * holds twice the blocks of an fp32 one in the same bytes. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_text.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "test.h"
#include "test_registry.h"

static int argmax(const float *x, int n) {
    int a = 0;
    for (int i = 1; i < n; i++) a = x[i] > x[a] ? i : a;
    return a;
}

/* kv: the cache's dtype; a bf16 cache holds the K/V rounded, so the logits agree to bf16's precision. */
static void check_arch_kv(const char *arch, int chunk, ctrl_dtype kv_dtype) {
    char path[512];
    snprintf(path, sizeof path, CTRL_FIXTURE_DIR "/generation/%s.json", arch);
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 1 << 20, &st);
    cJSON *cases = text ? cJSON_Parse(text) : NULL;
    free(text);
    snprintf(path, sizeof path, CTRL_FIXTURE_DIR "/models/%s", arch);
    ctrl_model *m;
    CHECK_EQ_INT(ctrl_model_load(path, NULL, &m), CTRL_OK);
    test_attach_paged(m);
    if (!m || !cases) return;
    const ctrl_model_config *c = ctrl_model_cfg(m);
    const int V = c->vocab_size, n = cJSON_GetArraySize(cases);
    ctrl_kv_cache *kv;
    CHECK_EQ_INT(ctrl_kv_cache_create(c->n_layers, c->n_kv_heads, c->head_dim, 4, 1 << 20, kv_dtype, &kv),
                 CTRL_OK);
    ctrl_kv_seq seq[2] = {{0}}, *seqs[2] = {&seq[0], &seq[1]};
    int len[2], done[2] = {0}, n_new[2];
    const cJSON *prompt[2];
    for (int s = 0; s < n; s++) {
        prompt[s] = cJSON_GetObjectItem(cJSON_GetArrayItem(cases, s), "prompt");
        len[s] = cJSON_GetArraySize(prompt[s]);
    }
    float *logits = malloc(sizeof(float) * 2 * V);
    int32_t tokens[64];
    /* prefill, `chunk` tokens per sequence per call (both sequences in each call while both have some) */
    while (done[0] < len[0] || done[1] < len[1]) {
        int t = 0, k = 0;
        ctrl_kv_seq *active[2];
        for (int s = 0; s < n; s++) {
            if (done[s] == len[s]) continue;
            n_new[k] = len[s] - done[s] < chunk ? len[s] - done[s] : chunk;
            for (int i = 0; i < n_new[k]; i++)
                tokens[t++] = cJSON_GetArrayItem(prompt[s], done[s] + i)->valueint;
            done[s] += n_new[k];
            active[k++] = seqs[s];
        }
        CHECK_EQ_INT(ctrl_model_decode(m, kv, active, tokens, n_new, k, logits), CTRL_OK);
        for (int j = 0; j < k; j++) { /* the logits after the whole prompt */
            const int s = active[j] == seqs[0] ? 0 : 1;
            if (done[s] != len[s] || seq[s].len != len[s]) continue;
            const cJSON *want = cJSON_GetObjectItem(cJSON_GetArrayItem(cases, s), "first_logits");
            double err = 0, norm = 0;
            for (int i = 0; i < V; i++) {
                const double d = logits[(size_t)j * V + i] - cJSON_GetArrayItem(want, i)->valuedouble;
                err += d * d, norm += cJSON_GetArrayItem(want, i)->valuedouble *
                                      cJSON_GetArrayItem(want, i)->valuedouble;
            }
            CHECK_MSG(sqrt(err / norm) < (kv_dtype == CTRL_BF16 ? 1e-2 : 1e-5),
                      "%s prompt %d (%s cache): logits differ (%.2g relative)", arch, s,
                      ctrl_dtype_name(kv_dtype), sqrt(err / norm));
            tokens[32 + s] = argmax(logits + (size_t)j * V, V); /* the first generated token */
        }
    }
    /* 12 greedy steps for both sequences in one batch */
    int32_t gen[2][12];
    for (int step = 0; step < 12; step++) {
        int32_t next[2] = {tokens[32], tokens[33]};
        gen[0][step] = next[0], gen[1][step] = next[1];
        if (step == 11) break;
        n_new[0] = n_new[1] = 1;
        CHECK_EQ_INT(ctrl_model_decode(m, kv, seqs, next, n_new, 2, logits), CTRL_OK);
        tokens[32] = argmax(logits, V), tokens[33] = argmax(logits + V, V);
    }
    for (int s = 0; s < n; s++) {
        const cJSON *want = cJSON_GetObjectItem(cJSON_GetArrayItem(cases, s), "generated");
        int same = 1;
        for (int i = 0; i < 12; i++) same &= gen[s][i] == cJSON_GetArrayItem(want, i)->valueint;
        CHECK_MSG(same, "%s prompt %d (chunk %d, %s cache): greedy tokens differ from transformers", arch, s,
                  chunk, ctrl_dtype_name(kv_dtype));
    }
    const int free_before = kv->n_free;
    ctrl_kv_seq_release(kv, &seq[0]), ctrl_kv_seq_release(kv, &seq[1]);
    CHECK_EQ_INT(kv->n_free, kv->n_blocks);
    CHECK(free_before < kv->n_blocks);
    free(logits);
    ctrl_kv_cache_free(kv);
    ctrl_model_free(m);
    cJSON_Delete(cases);
}

static void check_arch(const char *arch, int chunk) {
    check_arch_kv(arch, chunk, CTRL_F32);
    check_arch_kv(arch, chunk, CTRL_BF16);
}

TEST(llama_greedy_matches_transformers) { check_arch("llama", 1000), check_arch("llama", 3); }
TEST(qwen2_greedy_matches_transformers) { check_arch("qwen2", 1000), check_arch("qwen2", 3); }
TEST(qwen3_greedy_matches_transformers) { check_arch("qwen3", 1000), check_arch("qwen3", 3); }
TEST(mistral_greedy_matches_transformers) { check_arch("mistral", 1000), check_arch("mistral", 3); }

TEST(full_pool_is_an_error) {
    ctrl_kv_cache *kv;
    CHECK_EQ_INT(ctrl_kv_cache_create(1, 1, 4, 16, 1, CTRL_F32, &kv), CTRL_OK); /* one block */
    ctrl_kv_seq s = {0};
    CHECK_EQ_INT(ctrl_kv_seq_reserve(kv, &s, 16), CTRL_OK);
    CHECK_EQ_INT(ctrl_kv_seq_reserve(kv, &s, 17), CTRL_ERR_NOMEM);
    CHECK_CONTAINS(ctrl_error_message(), "kv cache");
    ctrl_kv_seq_release(kv, &s);
    CHECK_EQ_INT(kv->n_free, 1);
    ctrl_kv_cache_free(kv);
    const size_t four = 4 * 2 * 16 * 4 * sizeof(float); /* four fp32 blocks of 16 tokens (K and V) */
    CHECK_EQ_INT(ctrl_kv_cache_create(1, 1, 4, 16, four, CTRL_F32, &kv), CTRL_OK);
    CHECK_EQ_INT(kv->n_blocks, 4);
    ctrl_kv_cache_free(kv);
    CHECK_EQ_INT(ctrl_kv_cache_create(1, 1, 4, 16, four, CTRL_BF16, &kv), CTRL_OK);
    CHECK_EQ_INT(kv->n_blocks, 8);
    ctrl_kv_cache_free(kv);
    CHECK_EQ_INT(ctrl_kv_cache_create(1, 1, 4, 16, four, CTRL_F16, &kv), CTRL_ERR_CONFIG);
}
