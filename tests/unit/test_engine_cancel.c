/* Cancelling a request (ctrl_engine_cancel, what ctrl serve does when a client disconnects) stops
 * every one of its samples — also after its first sample has finished and left the engine (it
 * was looked up by that sample's output, so the others ran on into freed outputs) — and scoring
 * a sequence (ctrl_engine_score, OpenAI's prompt_logprobs) gives the log-probabilities the
 * generation reported for the tokens it drew. */
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

TEST(cancel_stops_every_sample_after_the_first_finished) {
    ctrl_model *m = tiny();
    if (!m) return;
    ctrl_engine *e;
    CHECK_EQ_INT(ctrl_engine_create(m, &cfg, &e), CTRL_OK);
    const int32_t prompt[4] = {3, 9, 27, 81};
    ctrl_gen_request r = {.prompt = prompt,
                          .prompt_len = 4,
                          .n = 4,
                          .max_tokens = 40,
                          .seed = 5,
                          .sampling = {.temperature = 1, .top_p = 1, .repetition_penalty = 1}};
    ctrl_gen_output pilot[4];
    CHECK_EQ_INT(ctrl_engine_generate(e, &r, 1, pilot, NULL, NULL), CTRL_OK);
    /* sample 0's first token ends sample 0 at once; the others go on (unless they draw it first) */
    int32_t stop = pilot[0].ids[0];
    int others_first = 0;
    for (int k = 1; k < 4; k++) others_first += pilot[k].ids[0] == stop;
    CHECK_EQ_INT(others_first, 0);
    for (int k = 0; k < 4; k++) ctrl_gen_output_free(&pilot[k]);
    r.stop_ids = &stop, r.n_stop = 1;
    ctrl_gen_output outs[4];
    CHECK_EQ_INT(ctrl_engine_add(e, &r, outs), CTRL_OK);
    int active = 1;
    for (int i = 0; i < 3 && active; i++) CHECK_EQ_INT(ctrl_engine_step(e, &active), CTRL_OK);
    CHECK(outs[0].stopped && outs[0].len == 1); /* finished, and gone from the engine at the 3rd step */
    ctrl_engine_cancel(e, outs);
    int lens[4];
    for (int k = 0; k < 4; k++) lens[k] = outs[k].len;
    CHECK_EQ_INT(ctrl_engine_step(e, &active), CTRL_OK);
    CHECK_EQ_INT(active, 0);
    for (int k = 1; k < 4; k++)
        CHECK_MSG(outs[k].len == lens[k] && lens[k] < 40, "sample %d: %d -> %d tokens", k, lens[k],
                  outs[k].len);
    for (int k = 0; k < 4; k++) ctrl_gen_output_free(&outs[k]);
    ctrl_engine_free(e);
    ctrl_model_free(m);
}

TEST(scores_equal_the_generated_logprobs_with_ranks_and_top_entries) {
    ctrl_model *m = tiny();
    if (!m) return;
    ctrl_engine *e;
    CHECK_EQ_INT(ctrl_engine_create(m, &cfg, &e), CTRL_OK);
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
