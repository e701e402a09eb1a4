/* [generation] decode_threads (core/generate/decode_threads.c): the decision (a number capped at
 * OpenMP's count; auto: steps of more than 16 tokens and a device's on all threads, smaller ones
 * measured on one thread and on all, alternately, then the faster for a while), the thread count
 * restored after a step, the setting read from the config and refused out of range naming the key,
 * and an engine's sampled tokens and log-probabilities the same bit for bit at 1 and 2 threads and
 * under auto, fp32 and bf16. */
#include <omp.h>
#include <string.h>

#include "gen_case.h"
#include "generate/decode_threads.h"
#include "generate/engine.h"
#include "test_registry.h"
#include "test.h"

TEST(decode_threads_numbers_and_large_steps) {
    const ctrl_decode_tuner fresh = {0};
    /* a number: that many, at most OpenMP's count, whatever the step */
    CHECK_EQ_INT(ctrl_decode_threads_choose(&fresh, 2, 4, 1, 1), 2);
    CHECK_EQ_INT(ctrl_decode_threads_choose(&fresh, 3, 2, 1, 1), 2);
    CHECK_EQ_INT(ctrl_decode_threads_choose(&fresh, 1, 8, 4096, 0), 1);
    /* auto: steps of more than 16 tokens, and a device's, on every thread */
    CHECK_EQ_INT(ctrl_decode_threads_choose(&fresh, 0, 2, 17, 1), 2);
    CHECK_EQ_INT(ctrl_decode_threads_choose(&fresh, 0, 8, 64, 1), 8);
    CHECK_EQ_INT(ctrl_decode_threads_choose(&fresh, 0, 4, 1, 0), 4);
    CHECK_EQ_INT(ctrl_decode_threads_choose(&fresh, 0, 1, 8, 1), 1);
    CHECK_EQ_INT(ctrl_decode_threads_choose(&fresh, 0, 0, 100, 1), 1); /* never fewer than one */
}

/* auto's round on small steps: one thread and all alternately, then the faster by wall clock per
 * token for CTRL_DECODE_RUN_STEPS steps, then another round; large steps are not measured */
static int run_round(ctrl_decode_tuner *t, double one_s, double all_s) {
    for (int i = 0; i < CTRL_DECODE_PROBE_STEPS; i++) {
        const int n = ctrl_decode_threads_choose(t, 0, 2, 8, 1);
        CHECK_EQ_INT(n, i % 2 == 0 ? 1 : 2);
        ctrl_decode_tuner_record(t, 0, 64, 2, 64, 1, 5.0); /* a prefill step between: not counted */
        ctrl_decode_tuner_record(t, 0, n, 2, 8, 1, n == 1 ? one_s : all_s);
    }
    return ctrl_decode_threads_choose(t, 0, 2, 8, 1);
}

TEST(decode_threads_auto_measures_and_takes_the_faster) {
    ctrl_decode_tuner t = {0};
    CHECK_EQ_INT(run_round(&t, 0.045, 0.060), 1); /* busy cores: one thread was faster */
    for (int i = 0; i < CTRL_DECODE_RUN_STEPS; i++) {
        CHECK_EQ_INT(ctrl_decode_threads_choose(&t, 0, 2, 8, 1), 1);
        CHECK_EQ_INT(ctrl_decode_threads_choose(&t, 0, 2, 40, 1), 2); /* large steps: all threads */
        ctrl_decode_tuner_record(&t, 0, 1, 2, 8, 1, 0.045);
    }
    CHECK_EQ_INT(run_round(&t, 0.045, 0.025), 2); /* then idle cores: both threads were faster */
    CHECK_EQ_INT(t.run_left, CTRL_DECODE_RUN_STEPS);
    /* per token: a round of 2-token steps on one thread against 8-token steps on two */
    ctrl_decode_tuner u = {0};
    for (int i = 0; i < CTRL_DECODE_PROBE_STEPS; i++) {
        const int n = ctrl_decode_threads_choose(&u, 0, 2, 8, 1);
        ctrl_decode_tuner_record(&u, 0, n, 2, n == 1 ? 2 : 8, 1, n == 1 ? 0.010 : 0.030);
    }
    CHECK_EQ_INT(ctrl_decode_threads_choose(&u, 0, 2, 8, 1), 2); /* 3.75 ms a token against 5 */
    /* a number or a device: nothing measured */
    ctrl_decode_tuner v = {0};
    ctrl_decode_tuner_record(&v, 2, 2, 2, 8, 1, 0.1);
    ctrl_decode_tuner_record(&v, 0, 2, 2, 8, 0, 0.1);
    CHECK_EQ_INT(v.probing, 0);
}

TEST(decode_threads_are_restored_after_a_step) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(2);
    ctrl_decode_tuner t = {0};
    ctrl_decode_threads d;
    CHECK_EQ_INT(ctrl_decode_threads_enter(&d, &t, 1, 8, 1), 1);
    CHECK_EQ_INT(omp_get_max_threads(), 1);
    int inside = 0;
#pragma omp parallel
    {
#pragma omp single
        inside = omp_get_num_threads();
    }
    CHECK_EQ_INT(inside, 1);
    ctrl_decode_threads_leave(&d, &t, 1, 8, 1);
    CHECK_EQ_INT(omp_get_max_threads(), 2);
    CHECK_EQ_INT(ctrl_decode_threads_enter(&d, &t, 0, 64, 1), 2);
    ctrl_decode_threads_leave(&d, &t, 0, 64, 1);
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
        CHECK_EQ_INT(ec.decode_threads, 0); /* auto */
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
        for (int threads = 2; threads >= 0; threads -= 2) { /* 2, then auto */
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
