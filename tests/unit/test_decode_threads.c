/* [generation] decode_threads (core/generate/decode_threads.c): the choice (0 every thread, a number
 * capped at OpenMP's count), the thread count restored after a step, the setting read from the
 * config and refused out of range naming the key, and an engine's sampled tokens and
 * log-probabilities the same bit for bit at 1 and 2 threads and by default, fp32 and bf16. */
#include <omp.h>
#include <string.h>

#include "gen_case.h"
#include "generate/decode_threads.h"
#include "generate/engine.h"
#include "test_registry.h"
#include "test.h"

TEST(decode_threads_choice) {
    CHECK_EQ_INT(ctrl_decode_threads_choose(0, 2), 2); /* default: every thread */
    CHECK_EQ_INT(ctrl_decode_threads_choose(0, 8), 8);
    CHECK_EQ_INT(ctrl_decode_threads_choose(1, 2), 1);
    CHECK_EQ_INT(ctrl_decode_threads_choose(2, 4), 2);
    CHECK_EQ_INT(ctrl_decode_threads_choose(3, 2), 2); /* at most OpenMP's count */
    CHECK_EQ_INT(ctrl_decode_threads_choose(0, 0), 1); /* never fewer than one */
}

TEST(decode_threads_are_restored_after_a_step) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(2);
    ctrl_decode_threads d;
    int logged = 0;
    CHECK_EQ_INT(ctrl_decode_threads_enter(&d, 1, &logged), 1);
    CHECK_EQ_INT(logged, 1);
    CHECK_EQ_INT(omp_get_max_threads(), 1);
    int inside = 0;
#pragma omp parallel
    {
#pragma omp single
        inside = omp_get_num_threads();
    }
    CHECK_EQ_INT(inside, 1);
    ctrl_decode_threads_leave(&d);
    CHECK_EQ_INT(omp_get_max_threads(), 2);
    CHECK_EQ_INT(ctrl_decode_threads_enter(&d, 0, &logged), 2);
    ctrl_decode_threads_leave(&d);
    CHECK_EQ_INT(omp_get_max_threads(), 2);
    omp_set_num_threads(before);
}

TEST(decode_threads_from_the_generation_section) {
    ctrl_registry *reg = test_plugin_registry();
    ctrl_config *cfg =
        test_config_from_text(reg, "dt.ini", "[model]\npath = m\n[generation]\ndecode_threads = 3\n");
    ctrl_engine_config ec;
    if (cfg) {
        ctrl_engine_config_from(cfg, &ec);
        CHECK_EQ_INT(ec.decode_threads, 3);
        ctrl_config_free(cfg);
    }
    cfg = test_config_from_text(reg, "dt.ini", "[model]\npath = m\n");
    if (cfg) {
        ctrl_engine_config_from(cfg, &ec);
        CHECK_EQ_INT(ec.decode_threads, 0); /* every thread */
        ctrl_config_free(cfg);
    }
    test_config_refused(reg, "dt.ini", "[model]\npath = m\n[generation]\ndecode_threads = -1\n",
                        "dt.ini:4: [generation] decode_threads");
    test_config_refused(reg, "dt.ini", "[model]\npath = m\n[generation]\ndecode_threads = two\n",
                        "dt.ini:4: [generation] decode_threads");
    ctrl_registry_destroy(reg);
}

/* 8 sampled completions of 2 prompts (GRPO's shape of a step) at `threads` decode threads */
static void sample_at(ctrl_model *m, const gen_case *cases, int threads, ctrl_gen_output *out) {
    ctrl_engine *e = NULL;
    const ctrl_engine_config ec = {.kv_cache_bytes = 1 << 20,
                                   .block_size = 16,
                                   .max_num_seqs = 64,
                                   .max_num_batched_tokens = 256,
                                   .kv_cache_dtype = -1,
                                   .decode_threads = threads};
    CHECK_EQ_INT(ctrl_engine_create(m, &ec, &e), CTRL_OK);
    if (!e) return;
    const ctrl_sampling_params warm = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
    ctrl_gen_request r[2];
    for (int c = 0; c < 2; c++)
        r[c] = (ctrl_gen_request){.prompt = cases[c].prompt,
                                  .prompt_len = cases[c].len,
                                  .n = 4,
                                  .max_tokens = 12,
                                  .sampling = warm,
                                  .seed = 5 + (uint64_t)c};
    CHECK_MSG(ctrl_engine_generate(e, r, 2, out, NULL, NULL) == CTRL_OK, "%s", ctrl_error_message());
    ctrl_engine_free(e);
}

TEST(decode_threads_change_no_token_or_logprob) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(2);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        gen_case cases[2];
        gen_cases_read("qwen2", cases);
        ctrl_model *m = NULL;
        CHECK_EQ_INT(ctrl_model_load(CTRL_FIXTURE_DIR "/models/qwen2", NULL, &m), CTRL_OK);
        if (!m) break;
        test_attach_paged(m);
        if (bf16) CHECK_EQ_INT(ctrl_model_set_compute_dtype(m, CTRL_BF16), CTRL_OK);
        ctrl_gen_output one[8], other[8];
        memset(one, 0, sizeof one);
        sample_at(m, cases, 1, one);
        for (int threads = 2; threads >= 0; threads -= 2) { /* 2, then the default */
            memset(other, 0, sizeof other);
            sample_at(m, cases, threads, other);
            for (int k = 0; k < 8; k++) {
                CHECK_MSG(one[k].len == other[k].len && one[k].len > 0,
                          "%s, %d threads, sample %d: %d vs %d tokens", bf16 ? "bf16" : "fp32", threads, k,
                          one[k].len, other[k].len);
                if (one[k].len != other[k].len) continue;
                CHECK(memcmp(one[k].ids, other[k].ids, sizeof(int32_t) * (size_t)one[k].len) == 0);
                CHECK(memcmp(one[k].logprobs, other[k].logprobs, sizeof(float) * (size_t)one[k].len) == 0);
            }
            for (int k = 0; k < 8; k++) ctrl_gen_output_free(&other[k]);
        }
        CHECK(one[0].len > 0 && memcmp(one[0].ids, one[1].ids, sizeof(int32_t) * (size_t)one[0].len) != 0);
        for (int k = 0; k < 8; k++) ctrl_gen_output_free(&one[k]);
        ctrl_model_free(m);
    }
    CHECK_EQ_INT(omp_get_max_threads(), 2);
    omp_set_num_threads(before);
}
