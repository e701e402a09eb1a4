/* Sampling against transformers' logits processors (fixtures from
 * tests/reference/make_sampling_fixtures.py: repetition penalty, temperature, top-k, top-p, min-p
 * over a grid): the same tokens are filtered and the processed log-probabilities agree; a drawn
 * token is always one that survives, with its processed log-probability; draws follow the processed
 * distribution; the same seed draws the same tokens; greedy takes the argmax. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_text.h"
#include "generate/sampling.h"
#include "test.h"

#define V 64

typedef struct sample_case {
    ctrl_sampling_params p;
    float logits[V];
    int32_t seen[12];
    double want[V]; /* -inf where filtered */
} sample_case;

static int load_cases(sample_case **out) {
    ctrl_status st;
    char *text = ctrl_read_text_file(CTRL_FIXTURE_DIR "/sampling/cases.jsonl", 1 << 22, &st);
    CHECK(text != NULL);
    if (!text) return 0;
    int n = 0;
    sample_case *c = calloc(128, sizeof *c);
    for (char *line = strtok(text, "\n"); line && n < 128; line = strtok(NULL, "\n"), n++) {
        cJSON *o = cJSON_Parse(line), *p = cJSON_GetObjectItem(o, "params");
        c[n].p = (ctrl_sampling_params){
            .temperature = (float)cJSON_GetObjectItem(p, "temperature")->valuedouble,
            .top_k = cJSON_GetObjectItem(p, "top_k")->valueint,
            .top_p = (float)cJSON_GetObjectItem(p, "top_p")->valuedouble,
            .min_p = (float)cJSON_GetObjectItem(p, "min_p")->valuedouble,
            .repetition_penalty = (float)cJSON_GetObjectItem(p, "repetition_penalty")->valuedouble};
        for (int i = 0; i < V; i++) {
            c[n].logits[i] = (float)cJSON_GetArrayItem(cJSON_GetObjectItem(o, "logits"), i)->valuedouble;
            const cJSON *w = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "logprobs"), i);
            c[n].want[i] = cJSON_IsNull(w) ? -INFINITY : w->valuedouble;
        }
        for (int i = 0; i < 12; i++)
            c[n].seen[i] = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "seen"), i)->valueint;
        cJSON_Delete(o);
    }
    free(text);
    *out = c;
    return n;
}

TEST(processing_matches_transformers) {
    sample_case *c;
    int n = load_cases(&c), filtered = 0;
    CHECK_EQ_INT(n, 72);
    for (int k = 0; k < n; k++) {
        float l[V];
        memcpy(l, c[k].logits, sizeof l);
        CHECK_EQ_INT(ctrl_sampling_process(&c[k].p, l, V, c[k].seen, 12), 0);
        double mx = -INFINITY, s = 0;
        for (int i = 0; i < V; i++) mx = fmax(mx, l[i]);
        for (int i = 0; i < V; i++) s += isinf(l[i]) ? 0 : exp(l[i] - mx);
        for (int i = 0; i < V; i++) {
            const double lp = isinf(l[i]) ? -INFINITY : l[i] - mx - log(s);
            CHECK_MSG(!isinf(lp) == !isinf(c[k].want[i]), "case %d token %d: filtered differently", k, i);
            if (!isinf(lp) && !isinf(c[k].want[i])) CHECK_NEAR(lp, c[k].want[i], 1e-5);
            filtered += isinf(lp) != 0;
        }
    }
    CHECK(filtered > 1000); /* the filters did filter */
    free(c);
}

TEST(draws_follow_the_processed_distribution) {
    sample_case *c;
    int n = load_cases(&c);
    for (int k = 0; k < n; k += 7) {
        ctrl_rng rng;
        ctrl_rng_seed(&rng, 1000 + (uint64_t)k);
        int counts[V] = {0};
        const int draws = 20000;
        for (int d = 0; d < draws; d++) {
            float l[V], lp;
            memcpy(l, c[k].logits, sizeof l);
            int32_t t = ctrl_sample(&c[k].p, l, V, c[k].seen, 12, &rng, &lp);
            CHECK(t >= 0 && t < V);
            if (t < 0 || t >= V) break;
            CHECK_MSG(!isinf(c[k].want[t]), "case %d: drew filtered token %d", k, t);
            if (d == 0) CHECK_NEAR(lp, c[k].want[t], 1e-5);
            counts[t]++;
        }
        for (int i = 0; i < V; i++) { /* within 5 standard deviations of the expected count */
            const double p = isinf(c[k].want[i]) ? 0 : exp(c[k].want[i]);
            const double sd = sqrt(draws * p * (1 - p)) + 1;
            CHECK_MSG(fabs(counts[i] - draws * p) <= 5 * sd, "case %d token %d: %d draws, expected %.1f", k,
                      i, counts[i], draws * p);
        }
    }
    free(c);
}

TEST(same_seed_same_tokens_and_greedy_is_argmax) {
    sample_case *c;
    load_cases(&c);
    ctrl_rng a, b;
    ctrl_rng_seed(&a, 7), ctrl_rng_seed(&b, 7);
    for (int d = 0; d < 100; d++) {
        float l1[V], l2[V], lp1, lp2;
        memcpy(l1, c[d % 72].logits, sizeof l1), memcpy(l2, c[d % 72].logits, sizeof l2);
        CHECK_EQ_INT(ctrl_sample(&c[d % 72].p, l1, V, NULL, 0, &a, &lp1),
                     ctrl_sample(&c[d % 72].p, l2, V, NULL, 0, &b, &lp2));
    }
    ctrl_sampling_params greedy = {.temperature = 0, .top_p = 1, .repetition_penalty = 1};
    float l[V], lp;
    memcpy(l, c[0].logits, sizeof l);
    int arg = 0;
    for (int i = 1; i < V; i++) arg = c[0].logits[i] > c[0].logits[arg] ? i : arg;
    CHECK_EQ_INT(ctrl_sample(&greedy, l, V, NULL, 0, &a, &lp), arg);
    /* ties: the first maximum, its log-probability log(1/2) among two equal ones and -inf elsewhere */
    for (int i = 0; i < V; i++) l[i] = i == V / 2 || i == V - 1 ? 2.5f : -INFINITY;
    CHECK_EQ_INT(ctrl_sample(&greedy, l, V, NULL, 0, &a, &lp), V / 2);
    CHECK_NEAR(lp, -logf(2.0f), 1e-6);
    for (int i = 0; i < V; i++) l[i] = -INFINITY; /* nothing possible: token 0, as before */
    CHECK_EQ_INT(ctrl_sample(&greedy, l, V, NULL, 0, &a, &lp), 0);
    ctrl_sampling_params bad = {.temperature = 1, .top_p = 1.5f, .repetition_penalty = 1};
    CHECK_EQ_INT(ctrl_sample(&bad, l, V, NULL, 0, &a, &lp), -1);
    free(c);
}

/* Issue 15: NaN passed every range check written as `x < lo || x > hi`, and a subnormal
 * repetition_penalty divided a positive logit to +inf (then inf - inf = NaN in the softmax). */
TEST(non_finite_and_subnormal_parameters_are_refused) {
    const ctrl_sampling_params ok = {.temperature = 1, .top_p = 1, .min_p = 0, .repetition_penalty = 1};
    CHECK(ctrl_sampling_params_valid(&ok));
    const float bad_values[] = {NAN, INFINITY, -1.0f, 1e-45f, 0.0f};
    for (int k = 0; k < 5; k++) {
        ctrl_sampling_params p = ok;
        p.repetition_penalty = bad_values[k];
        CHECK_MSG(!ctrl_sampling_params_valid(&p), "repetition_penalty %g accepted", (double)bad_values[k]);
        p = ok, p.temperature = bad_values[k];
        CHECK_MSG(!ctrl_sampling_params_valid(&p) == (bad_values[k] != 0.0f), "temperature %g",
                  (double)bad_values[k]);
        p = ok, p.top_p = bad_values[k];
        CHECK_MSG(!ctrl_sampling_params_valid(&p) == !(bad_values[k] > 0 && bad_values[k] <= 1), "top_p %g",
                  (double)bad_values[k]);
        if (bad_values[k] != 0.0f) {
            p = ok, p.min_p = bad_values[k];
            CHECK_MSG(!ctrl_sampling_params_valid(&p) == !(bad_values[k] > 0 && bad_values[k] <= 1),
                      "min_p %g", (double)bad_values[k]);
        }
    }
    /* the smallest normal penalty and temperature: logits overflow no further than FLT_MAX */
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)(i % 7) - 3.0f;
    const int32_t seen[3] = {1, 2, 3};
    ctrl_sampling_params p = ok;
    p.repetition_penalty = 1.1754944e-38f, p.temperature = 1.1754944e-38f;
    ctrl_rng rng;
    ctrl_rng_seed(&rng, 7);
    float lp = 0;
    const int32_t tok = ctrl_sample(&p, l, V, seen, 3, &rng, &lp);
    CHECK(tok >= 0 && tok < V);
    CHECK_MSG(!isnan(lp), "log-probability %g", (double)lp);
    for (int i = 0; i < V; i++) CHECK(!isnan(l[i]) && l[i] < INFINITY);
}

/* OpenAI's presence and frequency penalties as vLLM applies them (apply_penalties in vLLM's
 * model_executor/layers/utils.py): over the completion only (prompt tokens are not counted),
 * logit -= frequency_penalty * count + presence_penalty * (count > 0), after the repetition
 * penalty and before the temperature. */
TEST(presence_and_frequency_penalties_count_the_completion_only) {
    enum { W = 8 };
    const float raw[W] = {1.0f, -0.5f, 2.0f, 0.25f, -1.0f, 0.0f, 3.0f, -2.0f};
    /* prompt: 0 and 6 (not counted); completion: 2, 2, 3, 2 */
    const int32_t seen[6] = {0, 6, 2, 2, 3, 2};
    ctrl_sampling_params p = {.temperature = 0.5f,
                              .top_p = 1,
                              .repetition_penalty = 1.5f,
                              .presence_penalty = 0.7f,
                              .frequency_penalty = -0.3f};
    float l[W];
    memcpy(l, raw, sizeof l);
    CHECK_EQ_INT(ctrl_sampling_process_seq(&p, l, W, seen, 6, 2), 0);
    for (int t = 0; t < W; t++) {
        float want = raw[t];
        const int in_seen = t == 0 || t == 6 || t == 2 || t == 3; /* repetition: prompt and completion */
        if (in_seen) want = want < 0 ? want * 1.5f : want / 1.5f;
        const int count = t == 2 ? 3 : t == 3 ? 1 : 0;
        if (count) want -= -0.3f * (float)count + 0.7f;
        CHECK_NEAR(l[t], want / 0.5f, 1e-5);
    }
    /* ctrl_sample (every seen id a prompt id) leaves them off */
    memcpy(l, raw, sizeof l);
    CHECK_EQ_INT(ctrl_sampling_process(&p, l, W, seen, 6), 0);
    CHECK_NEAR(l[2], raw[2] / 1.5f / 0.5f, 1e-5);
    ctrl_sampling_params out_of_range = p;
    out_of_range.presence_penalty = 2.5f;
    CHECK(!ctrl_sampling_params_valid(&out_of_range));
    out_of_range = p, out_of_range.frequency_penalty = NAN;
    CHECK(!ctrl_sampling_params_valid(&out_of_range));
}

/* The top entries returned with each token (OpenAI's top_logprobs): the k largest processed
 * logits, most likely first, ties by id, log-probabilities normalised over the processed
 * distribution; filtered (-inf) entries never appear. */
TEST(top_entries_are_the_k_most_likely) {
    enum { W = 6 };
    const float l[W] = {0.5f, 2.0f, -INFINITY, 2.0f, 1.0f, -3.0f};
    int32_t ids[W];
    float lps[W];
    double lse = 0;
    for (int i = 0; i < W; i++) lse += isinf(l[i]) ? 0 : exp(l[i]);
    lse = log(lse);
    CHECK_EQ_INT(ctrl_sampling_top(l, W, 3, ids, lps), 3);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_EQ_INT(ids[1], 3);
    CHECK_EQ_INT(ids[2], 4);
    for (int j = 0; j < 3; j++) CHECK_NEAR(lps[j], l[ids[j]] - lse, 1e-6);
    CHECK_EQ_INT(ctrl_sampling_top(l, W, 6, ids, lps), 5); /* the filtered one is not possible */
    CHECK_EQ_INT(ids[4], 5);
}
