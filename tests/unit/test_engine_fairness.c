/* One request cannot hold up the others (core/generate/engine_pick.c): with chunked prefill
 * (ctrl_engine_set_prefill_chunk) a short request added while a long prompt is still prefilling
 * draws its first token in the next step rather than after every chunk of the long prompt; with
 * groups, a request added behind thousands of running sequences (more than a step's slots) gets
 * its share of the next step instead of waiting for them. Without either it waits (checked too),
 * and the tokens are the same either way. */
#include <stdlib.h>
#include <string.h>

#include "generate/engine.h"
#include "test_registry.h"
#include "test.h"

static const ctrl_sampling_params greedy = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};

/* Adds a 200-token prompt, steps once, adds a 5-token one and steps once more: the short one's
 * tokens by then in *short_len; then runs both to the end. */
static void run(ctrl_model *m, int chunk, int *short_len, int *long_len, ctrl_gen_output out[2]) {
    ctrl_engine *e = NULL;
    /* 4-token blocks, a 64-token step budget */
    CHECK_EQ_INT(ctrl_engine_create(m, &(ctrl_engine_config){1 << 22, 4, 8, 64, 0, 0, 0, 0}, &e), CTRL_OK);
    if (!e) return;
    ctrl_engine_set_prefill_chunk(e, chunk);
    static int32_t long_prompt[200];
    for (int i = 0; i < 200; i++) long_prompt[i] = (i * 37 + 11) % 128;
    static const int32_t short_prompt[] = {4, 8, 15, 16, 23};
    const ctrl_gen_request lr = {
        .prompt = long_prompt, .prompt_len = 200, .n = 1, .max_tokens = 6, .sampling = greedy};
    const ctrl_gen_request sr = {
        .prompt = short_prompt, .prompt_len = 5, .n = 1, .max_tokens = 6, .sampling = greedy};
    int active = 0;
    CHECK_EQ_INT(ctrl_engine_add(e, &lr, &out[0]), CTRL_OK);
    CHECK_EQ_INT(ctrl_engine_step(e, &active), CTRL_OK);
    CHECK_EQ_INT(ctrl_engine_add(e, &sr, &out[1]), CTRL_OK);
    CHECK_EQ_INT(ctrl_engine_step(e, &active), CTRL_OK);
    *short_len = out[1].len, *long_len = out[0].len;
    while (active) CHECK_EQ_INT(ctrl_engine_step(e, &active), CTRL_OK);
    ctrl_engine_free(e);
}

TEST(a_short_request_does_not_wait_for_a_long_prefill) {
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_load(CTRL_FIXTURE_DIR "/models/qwen2", NULL, &m), CTRL_OK);
    if (!m) return;
    test_attach_paged(m);
    ctrl_gen_output whole[2], chunked[2];
    int short_whole, long_whole, short_chunked, long_chunked;
    run(m, 0, &short_whole, &long_whole, whole);
    run(m, 16, &short_chunked, &long_chunked, chunked);
    /* without a limit the long prompt fills both steps (128 of its 200 tokens): the short one waits */
    CHECK_EQ_INT(short_whole, 0);
    CHECK_EQ_INT(long_whole, 0);
    /* with 16-token chunks the short prompt is prefilled beside the long one's second chunk */
    CHECK_EQ_INT(short_chunked, 1);
    CHECK_EQ_INT(long_chunked, 0);
    for (int k = 0; k < 2; k++) {
        CHECK_MSG(whole[k].len == 6 && chunked[k].len == 6 &&
                      memcmp(whole[k].ids, chunked[k].ids, sizeof(int32_t) * 6) == 0,
                  "request %d: other tokens with chunked prefill", k);
        ctrl_gen_output_free(&whole[k]), ctrl_gen_output_free(&chunked[k]);
    }
    ctrl_model_free(m);
}

/* 16 samples of one request fill the 4 slots of every step; a second request added then is in the
 * next step when it is of another group, and waits when it is of the same one. */
static void run_groups(ctrl_model *m, uint64_t second_group, int *second_len, ctrl_gen_output out[17]) {
    ctrl_engine *e = NULL;
    CHECK_EQ_INT(ctrl_engine_create(m, &(ctrl_engine_config){1 << 22, 4, 4, 64, 0, 0, 0, 0}, &e), CTRL_OK);
    if (!e) return;
    static const int32_t pa[] = {9, 8, 7, 6, 5}, pb[] = {4, 8, 15, 16, 23};
    const ctrl_gen_request a = {
        .prompt = pa, .prompt_len = 5, .n = 16, .max_tokens = 12, .sampling = greedy, .group = 1};
    const ctrl_gen_request b = {
        .prompt = pb, .prompt_len = 5, .n = 1, .max_tokens = 4, .sampling = greedy, .group = second_group};
    int active = 0;
    CHECK_EQ_INT(ctrl_engine_add(e, &a, out), CTRL_OK);
    CHECK_EQ_INT(ctrl_engine_step(e, &active), CTRL_OK); /* a's prompt, then its samples fork */
    CHECK_EQ_INT(ctrl_engine_add(e, &b, &out[16]), CTRL_OK);
    CHECK_EQ_INT(ctrl_engine_step(e, &active), CTRL_OK);
    *second_len = out[16].len;
    while (active) CHECK_EQ_INT(ctrl_engine_step(e, &active), CTRL_OK);
    ctrl_engine_free(e);
}

TEST(a_request_behind_more_sequences_than_slots_gets_its_share) {
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_load(CTRL_FIXTURE_DIR "/models/qwen2", NULL, &m), CTRL_OK);
    if (!m) return;
    test_attach_paged(m);
    ctrl_gen_output same[17], other[17];
    int len_same, len_other;
    run_groups(m, 1, &len_same, same);
    run_groups(m, 2, &len_other, other);
    CHECK_EQ_INT(len_same, 0);  /* one group: arrival order, the 16 samples first */
    CHECK_EQ_INT(len_other, 1); /* its own group: prefilled beside 3 of them, its first token drawn */
    for (int k = 0; k < 17; k++) {
        CHECK_MSG(same[k].len > 0 && same[k].len == other[k].len &&
                      memcmp(same[k].ids, other[k].ids, sizeof(int32_t) * (size_t)same[k].len) == 0,
                  "sequence %d: other tokens with groups", k);
        ctrl_gen_output_free(&same[k]), ctrl_gen_output_free(&other[k]);
    }
    ctrl_model_free(m);
}
