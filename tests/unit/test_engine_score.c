/* Scoring a sequence (ctrl_engine_score: OpenAI's prompt_logprobs and echo, TRL's
 * get_sequence_logprobs) gives the log-probabilities and top entries the generation reported for
 * the tokens it drew, across more than one scoring chunk. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "generate/engine.h"
#include "test.h"
#include "test_registry.h"

static ctrl_model *tiny(void) {
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_load(CTRL_FIXTURE_DIR "/models/qwen3", NULL, &m), CTRL_OK);
    if (m) test_attach_paged(m);
    return m;
}

static const ctrl_engine_config cfg = {
    .kv_cache_bytes = 4 << 20, .block_size = 4, .max_num_seqs = 16, .max_num_batched_tokens = 256};

TEST(scores_equal_the_generated_logprobs_with_ranks_and_top_entries) {
    ctrl_model *m = tiny();
    if (!m) return;
    ctrl_engine *e = NULL;
    CHECK_EQ_INT(ctrl_engine_create(m, &cfg, &e), CTRL_OK);
    if (!e) return ctrl_model_free(m);
    const int32_t prompt[5] = {1, 2, 3, 4, 5};
    /* temperature 0.7 and top-k 3: the generation's (processed) log-probabilities come from the
     * same temperature; scoring has no top-k, so it is compared where the drawn token ranks */
    ctrl_gen_request r = {.prompt = prompt,
                          .prompt_len = 5,
                          .n = 1,
                          .max_tokens = 70,
                          .seed = 2,
                          .top_logprobs = 3,
                          .sampling = {.temperature = 0.7f, .top_p = 1, .repetition_penalty = 1}};
    ctrl_gen_output g;
    CHECK_EQ_INT(ctrl_engine_generate(e, &r, 1, &g, NULL, NULL), CTRL_OK);
    CHECK_EQ_INT(g.len, 70);
    CHECK_EQ_INT(g.top_k, 3);
    const int n = 5 + g.len; /* more than a scoring chunk of 64 tokens */
    int32_t *seq = malloc(sizeof(int32_t) * n), *rank = malloc(sizeof(int32_t) * n),
            *top = malloc(sizeof(int32_t) * n * 3);
    float *lp = malloc(sizeof(float) * n), *top_lp = malloc(sizeof(float) * n * 3);
    memcpy(seq, prompt, sizeof prompt), memcpy(seq + 5, g.ids, sizeof(int32_t) * g.len);
    CHECK_EQ_INT(ctrl_engine_score(e, seq, n, 0.7f, 3, lp, rank, top, top_lp), CTRL_OK);
    for (int t = 0; t < g.len; t++) {
        const int p = 5 + t;
        CHECK_NEAR(lp[p], g.logprobs[t],
                   1e-4); /* top_p 1, no top_k: the processed distribution is the raw one */
        CHECK(rank[p] >= 1);
        for (int j = 0; j < 3; j++) { /* the generation's top entries are the scorer's */
            CHECK_EQ_INT(top[p * 3 + j], g.top_ids[t * 3 + j]);
            CHECK_NEAR(top_lp[p * 3 + j], g.top_logprobs[t * 3 + j], 1e-4);
        }
        CHECK(rank[p] != 1 || top[p * 3] == seq[p]);
        CHECK(top_lp[p * 3] >= top_lp[p * 3 + 1] && top_lp[p * 3 + 1] >= top_lp[p * 3 + 2]);
    }
    free(seq), free(rank), free(top), free(lp), free(top_lp);
    ctrl_gen_output_free(&g);
    ctrl_engine_free(e);
    ctrl_model_free(m);
}
