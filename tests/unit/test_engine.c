/* The generation engine: greedy outputs equal transformers' generate (fixtures from
 * tests/reference/make_generation_fixtures.py) however the scheduler cuts the work — one roomy
 * step, prefill in chunks of 4 tokens, or a cache so small that sequences are preempted and
 * recomputed; a sampled request draws the same tokens alone or batched with others; the n samples
 * of a prompt share its blocks; stop ids end a completion and are reported. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "file_text.h"
#include "gen_case.h"
#include "generate/engine.h"
#include "test_registry.h"
#include "test.h"

static ctrl_model *load(const char *arch, gen_case *cases) {
    gen_cases_read(arch, cases);
    char path[512];
    snprintf(path, sizeof path, CTRL_FIXTURE_DIR "/models/%s", arch);
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_load(path, NULL, &m), CTRL_OK);
    test_attach_paged(m);
    return m;
}

static const ctrl_sampling_params greedy = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};

static void greedy_case(const char *arch, ctrl_engine_config cfg, int expect_preemption) {
    gen_case cases[2];
    ctrl_model *m = load(arch, cases);
    if (!m) return;
    ctrl_engine *e;
    CHECK_EQ_INT(ctrl_engine_create(m, &cfg, &e), CTRL_OK);
    ctrl_gen_request reqs[2];
    for (int c = 0; c < 2; c++)
        reqs[c] = (ctrl_gen_request){.prompt = cases[c].prompt,
                                     .prompt_len = cases[c].len,
                                     .n = 1,
                                     .max_tokens = 12,
                                     .sampling = greedy};
    ctrl_gen_output out[2];
    CHECK_MSG(ctrl_engine_generate(e, reqs, 2, out, NULL, NULL) == CTRL_OK, "%s", ctrl_error_message());
    long steps, preempted;
    ctrl_engine_stats(e, &steps, &preempted, NULL);
    for (int c = 0; c < 2; c++) {
        CHECK_EQ_INT(out[c].len, 12);
        CHECK_MSG(out[c].len == 12 && memcmp(out[c].ids, cases[c].want, sizeof cases[c].want) == 0,
                  "%s prompt %d: not transformers' greedy tokens (%ld steps, %ld preemptions)", arch, c,
                  steps, preempted);
        ctrl_gen_output_free(&out[c]);
    }
    if (expect_preemption) CHECK_MSG(preempted > 0, "%s: the small cache did not preempt", arch);
    ctrl_engine_free(e);
    ctrl_model_free(m);
}

/* bytes for `blocks` blocks of 4 tokens of a 2-layer, 2-KV-head, head_dim 16 model */
static size_t pool(const char *arch, int blocks) {
    gen_case cases[2];
    ctrl_model *m = load(arch, cases);
    const ctrl_model_config *c = ctrl_model_cfg(m);
    const size_t per = 2 * sizeof(float) * (size_t)c->n_layers * 4 * c->n_kv_heads * c->head_dim;
    ctrl_model_free(m);
    return per * (size_t)blocks;
}

TEST(greedy_equals_transformers_however_scheduled) {
    static const char *const archs[] = {"llama", "qwen2", "qwen3", "mistral"};
    for (int a = 0; a < 4; a++) {
        greedy_case(archs[a], (ctrl_engine_config){1 << 20, 16, 8, 256, 0, 0, 0, 0}, 0);
        greedy_case(archs[a], (ctrl_engine_config){1 << 20, 4, 8, 4, 0, 0, 0, 0}, 0); /* chunked prefill */
        /* 12 blocks of 4 hold one sequence (prompt 23 + 12) but not both at once (+ 5 + 12) */
        greedy_case(archs[a], (ctrl_engine_config){pool(archs[a], 12), 4, 8, 64, 0, 0, 0, 0}, 1);
    }
}

TEST(same_request_same_tokens_alone_or_batched) {
    gen_case cases[2];
    ctrl_model *m = load("qwen2", cases);
    ctrl_engine *e;
    CHECK_EQ_INT(ctrl_engine_create(m, &(ctrl_engine_config){1 << 20, 16, 8, 64, 0, 0, 0, 0}, &e), CTRL_OK);
    const ctrl_sampling_params warm = {
        .temperature = 1.0f, .top_k = 50, .top_p = 0.95f, .repetition_penalty = 1.1f};
    ctrl_gen_request a = {.prompt = cases[0].prompt,
                          .prompt_len = cases[0].len,
                          .n = 2,
                          .max_tokens = 10,
                          .sampling = warm,
                          .seed = 3};
    ctrl_gen_request both[2] = {{.prompt = cases[1].prompt,
                                 .prompt_len = cases[1].len,
                                 .n = 3,
                                 .max_tokens = 7,
                                 .sampling = warm,
                                 .seed = 9},
                                a};
    ctrl_gen_output alone[2], batched[5];
    CHECK_EQ_INT(ctrl_engine_generate(e, &a, 1, alone, NULL, NULL), CTRL_OK);
    CHECK_EQ_INT(ctrl_engine_generate(e, both, 2, batched, NULL, NULL), CTRL_OK);
    long shared;
    ctrl_engine_stats(e, NULL, NULL, &shared);
    CHECK(shared > 0); /* the samples of the 23-token prompt shared its full blocks */
    for (int k = 0; k < 2; k++) {
        CHECK_EQ_INT(alone[k].len, batched[3 + k].len);
        CHECK(memcmp(alone[k].ids, batched[3 + k].ids, sizeof(int32_t) * (size_t)alone[k].len) == 0);
        /* the log-probabilities agree to rounding (GEMMs over other batch sizes sum in another order) */
        for (int i = 0; i < alone[k].len; i++) {
            CHECK(alone[k].logprobs[i] <= 0);
            CHECK_NEAR(alone[k].logprobs[i], batched[3 + k].logprobs[i], 1e-4);
        }
    }
    CHECK(memcmp(alone[0].ids, alone[1].ids, sizeof(int32_t) * 10) != 0); /* two samples, two draws */
    for (int k = 0; k < 2; k++) ctrl_gen_output_free(&alone[k]);
    for (int k = 0; k < 5; k++) ctrl_gen_output_free(&batched[k]);
    ctrl_engine_free(e);
    ctrl_model_free(m);
}

typedef struct finish_rank {
    int *clock, rank; /* the order in which requests finished */
} finish_rank;
static void note_finish(void *ctx) {
    finish_rank *f = ctx;
    f->rank = (*f->clock)++;
}

/* A request added while another runs joins its generation: it finishes first when it is short, and
 * both get the tokens they get alone. */
TEST(a_request_joins_a_running_generation) {
    gen_case cases[2];
    ctrl_model *m = load("qwen2", cases);
    ctrl_engine *e;
    CHECK_EQ_INT(ctrl_engine_create(m, &(ctrl_engine_config){1 << 20, 16, 8, 64, 0, 0, 0, 0}, &e), CTRL_OK);
    const ctrl_sampling_params warm = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
    ctrl_gen_request longer = {.prompt = cases[0].prompt,
                               .prompt_len = cases[0].len,
                               .n = 2,
                               .max_tokens = 30,
                               .sampling = warm,
                               .seed = 5};
    ctrl_gen_request shorter = {.prompt = cases[1].prompt,
                                .prompt_len = cases[1].len,
                                .n = 1,
                                .max_tokens = 3,
                                .sampling = warm,
                                .seed = 8};
    ctrl_gen_output alone_long[2], alone_short, got_long[2], got_short;
    CHECK_EQ_INT(ctrl_engine_generate(e, &longer, 1, alone_long, NULL, NULL), CTRL_OK);
    CHECK_EQ_INT(ctrl_engine_generate(e, &shorter, 1, &alone_short, NULL, NULL), CTRL_OK);
    CHECK_EQ_INT(ctrl_engine_joined(e), 0);
    int clock = 0;
    finish_rank long_done = {&clock, -1}, short_done = {&clock, -1};
    longer.on_finish = note_finish, longer.finish_ctx = &long_done;
    shorter.on_finish = note_finish, shorter.finish_ctx = &short_done;
    CHECK_EQ_INT(ctrl_engine_add(e, &longer, got_long), CTRL_OK);
    int active = 0;
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(ctrl_engine_step(e, &active), CTRL_OK);
    CHECK(active && got_long[0].len > 0);
    CHECK_EQ_INT(ctrl_engine_add(e, &shorter, &got_short), CTRL_OK);
    CHECK_EQ_INT(ctrl_engine_joined(e), 1);
    CHECK_EQ_INT(ctrl_engine_generate(e, &shorter, 1, &alone_short, NULL, NULL), CTRL_ERR_RUNTIME); /* busy */
    while (active) CHECK_EQ_INT(ctrl_engine_step(e, &active), CTRL_OK);
    CHECK(short_done.rank == 0 && long_done.rank == 1); /* the short one finished first */
    CHECK(got_short.len == alone_short.len &&
          memcmp(got_short.ids, alone_short.ids, sizeof(int32_t) * (size_t)got_short.len) == 0);
    for (int k = 0; k < 2; k++) {
        CHECK(got_long[k].len == alone_long[k].len &&
              memcmp(got_long[k].ids, alone_long[k].ids, sizeof(int32_t) * (size_t)got_long[k].len) == 0);
        ctrl_gen_output_free(&got_long[k]), ctrl_gen_output_free(&alone_long[k]);
    }
    ctrl_gen_output_free(&got_short), ctrl_gen_output_free(&alone_short);
    /* idle again: a one-call generation runs, and an abort drops what was added */
    longer.on_finish = NULL;
    CHECK_EQ_INT(ctrl_engine_add(e, &longer, got_long), CTRL_OK);
    ctrl_engine_abort(e);
    CHECK(got_long[0].ids == NULL);
    CHECK_EQ_INT(ctrl_engine_generate(e, &shorter, 1, &got_short, NULL, NULL), CTRL_OK);
    ctrl_gen_output_free(&got_short);
    ctrl_engine_free(e);
    ctrl_model_free(m);
}

static int stop_at_three(void *ctx, const int32_t *ids, int len) {
    (void)ctx, (void)ids;
    return len == 3;
}

TEST(stop_ids_end_a_completion) {
    gen_case cases[2];
    ctrl_model *m = load("llama", cases);
    ctrl_engine *e;
    CHECK_EQ_INT(ctrl_engine_create(m, &(ctrl_engine_config){1 << 20, 16, 8, 64, 0, 0, 0, 0}, &e), CTRL_OK);
    const int32_t stop = cases[0].want[4]; /* the greedy path reaches it at the 5th token (or earlier) */
    int first = 0;
    while (cases[0].want[first] != stop) first++;
    ctrl_gen_request r = {.prompt = cases[0].prompt,
                          .prompt_len = cases[0].len,
                          .n = 1,
                          .max_tokens = 12,
                          .sampling = greedy,
                          .stop_ids = &stop,
                          .n_stop = 1};
    ctrl_gen_output o;
    CHECK_EQ_INT(ctrl_engine_generate(e, &r, 1, &o, NULL, NULL), CTRL_OK);
    CHECK_EQ_INT(o.len, first + 1);
    CHECK_EQ_INT(o.stopped, 1);
    CHECK_EQ_INT(o.ids[o.len - 1], stop);
    ctrl_gen_output_free(&o);
    /* a stop check (what stop strings use) ends it after the token it sees */
    r.n_stop = 0, r.stop_check = stop_at_three;
    CHECK_EQ_INT(ctrl_engine_generate(e, &r, 1, &o, NULL, NULL), CTRL_OK);
    CHECK_EQ_INT(o.len, 3);
    CHECK_EQ_INT(o.stopped, 1);
    ctrl_gen_output_free(&o);
    ctrl_gen_request bad = r;
    bad.n = 0;
    CHECK_EQ_INT(ctrl_engine_generate(e, &bad, 1, &o, NULL, NULL), CTRL_ERR_CONFIG);
    ctrl_engine_free(e);
    ctrl_model_free(m);
}

/* Co-located generation reads the live weights: after a gradient step on the model, the very next
 * generation (same engine) scores with the updated weights — equal to a new engine's, unlike before. */
TEST(next_generation_after_an_update_uses_the_new_weights) {
    gen_case cases[2];
    ctrl_model *m = load("qwen3", cases);
    ctrl_engine *e;
    CHECK_EQ_INT(ctrl_engine_create(m, &(ctrl_engine_config){1 << 20, 16, 8, 64, 0, 0, 0, 0}, &e), CTRL_OK);
    ctrl_gen_request r = {
        .prompt = cases[1].prompt, .prompt_len = cases[1].len, .n = 1, .max_tokens = 4, .sampling = greedy};
    ctrl_gen_output before, after, fresh;
    CHECK_EQ_INT(ctrl_engine_generate(e, &r, 1, &before, NULL, NULL), CTRL_OK);
    /* one SGD step on the prompt's next-token loss */
    int32_t pos[64], tg[64], cu[2] = {0, cases[1].len};
    for (int t = 0; t < cases[1].len; t++)
        pos[t] = t, tg[t] = t + 1 < cases[1].len ? cases[1].prompt[t + 1] : -100;
    ctrl_batch b = {.T = cases[1].len,
                    .B = 1,
                    .tokens = cases[1].prompt,
                    .positions = pos,
                    .cu_seqlens = cu,
                    .targets = tg};
    ctrl_registry *reg = test_plugin_registry();
    const ctrl_plugin_entry *flash = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash");
    CHECK(flash != NULL);
    if (!flash) return;
    ctrl_model *trainer_view;
    CHECK_EQ_INT(ctrl_model_load(CTRL_FIXTURE_DIR "/models/qwen3", flash->plugin->ops, &trainer_view),
                 CTRL_OK);
    float lp[64], dlp[64];
    CHECK_EQ_INT(ctrl_model_forward(trainer_view, &b, lp, NULL, NULL), CTRL_OK);
    for (int t = 0; t < cases[1].len; t++) dlp[t] = tg[t] >= 0 ? -1.0f : 0.0f;
    CHECK_EQ_INT(ctrl_model_backward(trainer_view, dlp), CTRL_OK);
    size_t n;
    float *p = ctrl_model_params(m, &n), *g = ctrl_model_grads(trainer_view, NULL);
    for (size_t i = 0; i < n; i++) p[i] -= 0.5f * g[i]; /* the step lands in the model the engine serves */
    CHECK_EQ_INT(ctrl_engine_generate(e, &r, 1, &after, NULL, NULL), CTRL_OK);
    ctrl_engine *e2;
    CHECK_EQ_INT(ctrl_engine_create(m, &(ctrl_engine_config){1 << 20, 16, 8, 64, 0, 0, 0, 0}, &e2), CTRL_OK);
    CHECK_EQ_INT(ctrl_engine_generate(e2, &r, 1, &fresh, NULL, NULL), CTRL_OK);
    CHECK(after.logprobs[0] != before.logprobs[0]);
    CHECK(memcmp(after.ids, fresh.ids, sizeof(int32_t) * 4) == 0);
    CHECK(memcmp(after.logprobs, fresh.logprobs, sizeof(float) * 4) == 0);
    ctrl_gen_output_free(&before), ctrl_gen_output_free(&after), ctrl_gen_output_free(&fresh);
    ctrl_engine_free(e), ctrl_engine_free(e2);
    ctrl_model_free(trainer_view), ctrl_model_free(m);
    ctrl_registry_destroy(reg);
}

TEST(sleep_releases_the_pool_and_wake_up_restores_it) {
    gen_case cases[2];
    ctrl_model *m = load("llama", cases);
    ctrl_engine *e;
    CHECK_EQ_INT(ctrl_engine_create(m, &(ctrl_engine_config){1 << 20, 16, 8, 64, 0, 0, 0, 0}, &e), CTRL_OK);
    ctrl_gen_request r = {
        .prompt = cases[0].prompt, .prompt_len = cases[0].len, .n = 1, .max_tokens = 12, .sampling = greedy};
    ctrl_gen_output o;
    for (int level = 1; level <= 2; level++) {
        CHECK_EQ_INT(ctrl_engine_sleep(e, level), CTRL_OK);
        CHECK_EQ_INT(ctrl_engine_generate(e, &r, 1, &o, NULL, NULL), CTRL_ERR_RUNTIME);
        CHECK_CONTAINS(ctrl_error_message(), "asleep");
        CHECK_EQ_INT(ctrl_engine_wake_up(e), CTRL_OK);
        CHECK_EQ_INT(ctrl_engine_generate(e, &r, 1, &o, NULL, NULL), CTRL_OK);
        CHECK(memcmp(o.ids, cases[0].want, sizeof cases[0].want) == 0);
        ctrl_gen_output_free(&o);
    }
    CHECK_EQ_INT(ctrl_engine_sleep(e, 3), CTRL_ERR_CONFIG);
    ctrl_engine_free(e);
    ctrl_model_free(m);
}

TEST(engine_config_from_the_generation_section) {
    ctrl_registry *reg = test_plugin_registry();
    ctrl_config *cfg = test_config_from_text(reg, "engine.ini",
                                             "[model]\npath = m\n[generation]\nkv_cache_bytes = 123456\n"
                                             "block_size = 8\nmax_num_seqs = 5\nmax_num_batched_tokens = 77\n"
                                             "kv_cache_dtype = bf16\n");
    if (!cfg) return;
    ctrl_engine_config ec;
    ctrl_engine_config_from(cfg, &ec);
    CHECK_EQ_INT(ec.kv_cache_bytes, 123456);
    CHECK_EQ_INT(ec.block_size, 8);
    CHECK_EQ_INT(ec.max_num_seqs, 5);
    CHECK_EQ_INT(ec.max_num_batched_tokens, 77);
    CHECK_EQ_INT(ec.kv_cache_dtype, 1);
    ctrl_config_free(cfg);
    /* unset keys: the option table's defaults (auto dtype, a share of the memory for the pool) */
    cfg = test_config_from_text(reg, "engine.ini",
                                "[model]\npath = m\n[generation]\ngpu_memory_utilization = 0.01\n");
    if (cfg) {
        ctrl_engine_config_from(cfg, &ec);
        CHECK_EQ_INT(ec.kv_cache_dtype, -1);
        CHECK_EQ_INT(ec.block_size, 16);
        CHECK_EQ_INT(ec.max_num_seqs, 256);
        CHECK_EQ_INT(ec.max_num_batched_tokens, 8192);
        const double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        CHECK(ec.kv_cache_bytes == (size_t)(0.01 * mem));
        ctrl_config_free(cfg);
    }
    ctrl_registry_destroy(reg);
}

/* Unusable sampling parameters are refused by add, naming the field, for that request alone: the
 * one already added generates what it generates by itself. */
TEST(a_request_with_bad_sampling_is_refused_alone) {
    gen_case cases[2];
    ctrl_model *m = load("qwen2", cases);
    ctrl_engine *e;
    CHECK_EQ_INT(ctrl_engine_create(m, &(ctrl_engine_config){1 << 20, 16, 8, 64, 0, 0, 0, 0}, &e), CTRL_OK);
    const ctrl_sampling_params warm = {.temperature = 0.8f, .top_p = 0.9f, .repetition_penalty = 1.1f};
    const ctrl_gen_request good = {.prompt = cases[0].prompt,
                                   .prompt_len = cases[0].len,
                                   .n = 2,
                                   .max_tokens = 12,
                                   .sampling = warm,
                                   .seed = 3};
    ctrl_gen_output alone[2], got[2], refused = {0};
    CHECK_EQ_INT(ctrl_engine_generate(e, &good, 1, alone, NULL, NULL), CTRL_OK);
    CHECK_EQ_INT(ctrl_engine_add(e, &good, got), CTRL_OK);
    static const struct {
        ctrl_sampling_params p;
        const char *field;
    } bad[] = {{{.temperature = NAN, .top_p = 1, .repetition_penalty = 1}, "temperature"},
               {{.temperature = -1, .top_p = 1, .repetition_penalty = 1}, "temperature"},
               {{.temperature = 1, .top_p = 0, .repetition_penalty = 1}, "top_p"},
               {{.temperature = 1, .top_p = 1, .min_p = 1.5f, .repetition_penalty = 1}, "min_p"},
               {{.temperature = 1, .top_p = 1, .repetition_penalty = 0}, "repetition_penalty"},
               {{.temperature = 1, .top_p = 1, .repetition_penalty = INFINITY}, "repetition_penalty"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ctrl_gen_request r = good;
        r.n = 1, r.sampling = bad[i].p;
        CHECK_EQ_INT(ctrl_engine_add(e, &r, &refused), CTRL_ERR_CONFIG);
        CHECK_MSG(strstr(ctrl_error_message(), bad[i].field), "case %zu: %s", i, ctrl_error_message());
        CHECK(refused.ids == NULL);
    }
    int active = 1;
    while (active) CHECK_EQ_INT(ctrl_engine_step(e, &active), CTRL_OK);
    for (int k = 0; k < 2; k++) {
        CHECK(got[k].len == alone[k].len && got[k].len > 0 &&
              memcmp(got[k].ids, alone[k].ids, sizeof(int32_t) * (size_t)got[k].len) == 0);
        ctrl_gen_output_free(&got[k]), ctrl_gen_output_free(&alone[k]);
    }
    /* a one-call generation with a bad request fails before anything runs, naming it */
    ctrl_gen_request two[2] = {good, good};
    two[1].sampling.top_p = 2;
    ctrl_gen_output outs[4];
    CHECK_EQ_INT(ctrl_engine_generate(e, two, 2, outs, NULL, NULL), CTRL_ERR_CONFIG);
    CHECK_MSG(strstr(ctrl_error_message(), "request 1") && strstr(ctrl_error_message(), "top_p"), "%s",
              ctrl_error_message());
    ctrl_engine_free(e);
    ctrl_model_free(m);
}

static void count_finish(void *ctx) { ++*(int *)ctx; }

/* Cancelling a request stops every one of its samples, also after its first sample has finished
 * and left the engine (the cancel found the request through that sample alone, so the others ran on
 * into outputs their caller had freed: ctrl serve crashed when a streaming client left). */
TEST(cancel_stops_every_sample_after_the_first_has_left) {
    gen_case cases[2];
    ctrl_model *m = load("qwen2", cases);
    ctrl_engine *e;
    CHECK_EQ_INT(ctrl_engine_create(m, &(ctrl_engine_config){1 << 20, 16, 8, 64, 0, 0, 0, 0}, &e), CTRL_OK);
    enum { N = 8 };
    ctrl_gen_request r = {.prompt = cases[0].prompt,
                          .prompt_len = cases[0].len,
                          .n = N,
                          .max_tokens = 12,
                          .sampling = {.temperature = 1, .top_p = 1, .repetition_penalty = 1},
                          .seed = 11};
    ctrl_gen_output alone[N], got[N];
    CHECK_EQ_INT(ctrl_engine_generate(e, &r, 1, alone, NULL, NULL), CTRL_OK);
    /* a stop id that ends sample 0 at its second token while some other sample runs on past it */
    int32_t stop = alone[0].ids[1];
    int other = -1;
    for (int k = 1; k < N && other < 0; k++) {
        int has = 0;
        for (int t = 0; t < alone[k].len; t++) has |= alone[k].ids[t] == stop;
        if (!has) other = k;
    }
    CHECK_MSG(alone[0].ids[0] != stop && other > 0, "no sample runs past sample 0's stop token");
    for (int k = 0; k < N; k++) ctrl_gen_output_free(&alone[k]);
    int finished = 0;
    r.stop_ids = &stop, r.n_stop = 1, r.on_finish = count_finish, r.finish_ctx = &finished;
    CHECK_EQ_INT(ctrl_engine_add(e, &r, got), CTRL_OK);
    int active = 1, steps = 0;
    while (!got[0].stopped && steps++ < 16) CHECK_EQ_INT(ctrl_engine_step(e, &active), CTRL_OK);
    CHECK_EQ_INT(ctrl_engine_step(e, &active), CTRL_OK); /* sample 0 leaves the engine */
    CHECK(got[0].stopped && got[other].len < 12 && active);
    int len[N];
    for (int k = 0; k < N; k++) len[k] = got[k].len;
    ctrl_engine_cancel(e, got);
    CHECK_EQ_INT(finished, 1);
    while (active) CHECK_EQ_INT(ctrl_engine_step(e, &active), CTRL_OK);
    for (int k = 0; k < N; k++) CHECK_MSG(got[k].len == len[k], "sample %d grew after the cancel", k);
    for (int k = 0; k < N; k++) ctrl_gen_output_free(&got[k]);
    ctrl_engine_free(e);
    ctrl_model_free(m);
}
