/* Sampling on the device (kernels/cuda/sampling.cu, the backend's `sample` op) against the host
 * sampler (core/generate/sampling.c) on the same logits and the same seeds: greedy, temperature,
 * top-k (with tied values at the k-th), top-p, min-p, the repetition, presence and frequency
 * penalties, a logit bias and suppressed stop ids, the final soft-capping, top log-probabilities,
 * forked rows drawing from one logits row; at a vocabulary smaller than a block's threads and at one
 * of several chunks a thread. Every row's token must be the host's, its log-probability within 2e-5
 * and its top entries the host's. Then the distribution: 1000 seeded top-p draws from one row give
 * the host's tokens and frequencies near the processed probabilities. Skips without a GPU or a
 * CUDA build; under the emulator it is test_cuda_sampling_emu. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_ops.h"
#include "device/sample_batch.h"
#include "generate/sampling.h"
#include "test.h"
#include "test_registry.h"

#ifdef CTRL_HAVE_CUDA

typedef struct sample_case {
    const char *name;
    ctrl_sampling_params p;
    int n_top;
    float softcap;
    int edits; /* a bias and two suppressed stop ids */
} sample_case;

static uint64_t lcg(uint64_t *s) { return (*s = *s * 6364136223846793005ull + 1442695040888963407ull) >> 33; }

/* random logits in [-8, 8) with some exact ties (every 7th value copies an earlier one) */
static void make_logits(float *l, int V, uint64_t seed) {
    for (int i = 0; i < V; i++) l[i] = (float)((double)lcg(&seed) / 2147483648.0 * 16.0 - 8.0);
    for (int i = 7; i < V; i += 7) l[i] = l[i / 2];
}

static void *up(const void *h, size_t bytes) {
    void *d = NULL;
    if (ctrl_cuda_malloc(&d, bytes ? bytes : 8) != CTRL_OK) return NULL;
    if (h && bytes) ctrl_cuda_memcpy_h2d(d, h, bytes);
    return d;
}

enum { N_SRC = 2, N_ROWS = 6, N_SEEN = 40, N_PROMPT = 25 };

/* The seen tokens of row r (a prompt of N_PROMPT, the rest a completion with repeats). */
static void seen_tokens(int32_t *t, int r, int V) {
    uint64_t s = 99 + (uint64_t)r;
    for (int i = 0; i < N_SEEN; i++) /* a third of the completion repeats an earlier token of it */
        t[i] = (int32_t)(i <= N_PROMPT || lcg(&s) % 3 ? lcg(&s) % V
                                                      : (uint64_t)t[N_PROMPT + lcg(&s) % (i - N_PROMPT)]);
}

static void run_case(const sample_case *c, int V) {
    float *logits = malloc(sizeof(float) * N_SRC * V), *l = malloc(sizeof(float) * V);
    for (int s = 0; s < N_SRC; s++)
        make_logits(logits + (size_t)s * V, V, 1234 + 17 * (uint64_t)s + (uint64_t)V);
    ctrl_sample_row rows[N_ROWS];
    int32_t ids[N_ROWS * (3 + N_SEEN)];
    float vals[N_ROWS * (3 + N_SEEN)];
    int n_ids = 0;
    int32_t want_tok[N_ROWS], want_top[N_ROWS][8];
    float want_lp[N_ROWS], want_top_lp[N_ROWS][8];
    for (int r = 0; r < N_ROWS; r++) {
        const int src = r % N_SRC; /* rows 0, 2, 4 share source row 0 (forked samples) */
        int32_t seen[N_SEEN];
        seen_tokens(seen, r, V);
        ctrl_sample_row *row = &rows[r];
        *row = (ctrl_sample_row){.temperature = c->p.temperature,
                                 .top_p = c->p.top_p,
                                 .min_p = c->p.min_p,
                                 .repetition_penalty = c->p.repetition_penalty,
                                 .presence_penalty = c->p.presence_penalty,
                                 .frequency_penalty = c->p.frequency_penalty,
                                 .top_k = c->p.top_k,
                                 .src = src,
                                 .edit_at = n_ids,
                                 .n_top = c->n_top,
                                 .top_at = r * c->n_top};
        if (c->p.min_p > 0) row->min_p_log = log((double)c->p.min_p);
        /* the host: soft-capping, the edits, then ctrl_sample_seq with the row's own generator */
        for (int i = 0; i < V; i++) {
            const float x = logits[(size_t)src * V + i];
            l[i] = c->softcap > 0 ? c->softcap * tanhf(x / c->softcap) : x;
        }
        if (c->edits) {
            const int32_t e_ids[3] = {(int32_t)(5 + r) % V, (int32_t)(11 * r + 3) % V, (int32_t)(V - 1)};
            const float e_vals[3] = {4.5f, -INFINITY, -INFINITY};
            for (int e = 0; e < 3; e++)
                ids[n_ids] = e_ids[e], vals[n_ids++] = e_vals[e], l[e_ids[e]] += e_vals[e];
        }
        row->n_edit = n_ids - row->edit_at, row->seen_at = n_ids;
        /* the distinct seen ids with their completion counts (what engine_draw_device.c sends) */
        for (int i = 0; i < N_SEEN; i++) {
            int dup = 0, count = 0;
            for (int j = 0; j < i; j++) dup |= seen[j] == seen[i];
            if (dup) continue;
            for (int j = N_PROMPT; j < N_SEEN; j++) count += seen[j] == seen[i];
            ids[n_ids] = seen[i], vals[n_ids++] = (float)count;
        }
        row->n_seen = n_ids - row->seen_at;
        ctrl_rng host_rng, dev_rng;
        ctrl_rng_seed(&host_rng, 1000 + (uint64_t)r), ctrl_rng_seed(&dev_rng, 1000 + (uint64_t)r);
        if (c->p.temperature > 0) row->u = ctrl_rng_uniform(&dev_rng);
        want_tok[r] = ctrl_sample_seq(&c->p, l, V, seen, N_SEEN, N_PROMPT, &host_rng, &want_lp[r]);
        const int got = ctrl_sampling_top(l, V, c->n_top, want_top[r], want_top_lp[r]);
        for (int j = got; j < c->n_top; j++) want_top[r][j] = -1, want_top_lp[r][j] = -INFINITY;
    }
    const int n_out = N_ROWS + N_ROWS * c->n_top;
    ctrl_sample_batch b = {.logits = up(logits, sizeof(float) * N_SRC * V),
                           .V = V,
                           .n_rows = N_ROWS,
                           .softcap = c->softcap,
                           .rows = up(rows, sizeof rows),
                           .ids = up(ids, sizeof(int32_t) * n_ids),
                           .vals = up(vals, sizeof(float) * n_ids),
                           .out = up(NULL, sizeof(ctrl_sample_out) * n_out)};
    ctrl_sample_out out[N_ROWS * 9];
    CHECK_MSG(ctrl_cuda_sample(&b) == CTRL_OK, "%s: %s", c->name, ctrl_error_message());
    CHECK_EQ_INT(ctrl_cuda_memcpy_d2h(out, b.out, sizeof(ctrl_sample_out) * n_out), CTRL_OK);
    double worst = 0;
    for (int r = 0; r < N_ROWS; r++) {
        CHECK_MSG(out[r].id == want_tok[r], "%s V %d row %d: token %d, the host's %d", c->name, V, r,
                  out[r].id, want_tok[r]);
        worst = fmax(worst, fabs((double)out[r].logprob - want_lp[r]));
        for (int j = 0; j < c->n_top; j++) {
            const ctrl_sample_out o = out[N_ROWS + r * c->n_top + j];
            CHECK_MSG(o.id == want_top[r][j], "%s V %d row %d top %d: %d, the host's %d", c->name, V, r, j,
                      o.id, want_top[r][j]);
            if (o.id >= 0) worst = fmax(worst, fabs((double)o.logprob - want_top_lp[r][j]));
        }
    }
    CHECK_MSG(worst <= 2e-5, "%s V %d: log-probabilities differ by %.3g", c->name, V, worst);
    printf("  %-28s V %5d: %d rows, the host's tokens, log-probabilities within %.2g\n", c->name, V, N_ROWS,
           worst);
    ctrl_cuda_free((void *)b.logits), ctrl_cuda_free((void *)b.rows), ctrl_cuda_free((void *)b.ids),
        ctrl_cuda_free((void *)b.vals), ctrl_cuda_free(b.out);
    free(logits), free(l);
}

TEST(sampling_on_device_matches_host) {
    if (ctrl_cuda_device_count() <= 0) TEST_SKIP(ctrl_cuda_unavailable_reason());
    atexit(ctrl_cuda_shutdown);
    static const sample_case cases[] = {
        {"greedy", {.temperature = 0, .top_p = 1, .repetition_penalty = 1}, 3, 0, 0},
        {"temperature 0.7", {.temperature = 0.7f, .top_p = 1, .repetition_penalty = 1}, 0, 0, 0},
        {"top_k 7 (ties)", {.temperature = 1, .top_k = 7, .top_p = 1, .repetition_penalty = 1}, 4, 0, 0},
        {"top_p 0.8", {.temperature = 1, .top_p = 0.8f, .repetition_penalty = 1}, 2, 0, 0},
        {"min_p 0.1", {.temperature = 1, .top_p = 1, .min_p = 0.1f, .repetition_penalty = 1}, 0, 0, 0},
        {"penalties",
         {.temperature = 1,
          .top_p = 1,
          .repetition_penalty = 1.3f,
          .presence_penalty = 0.5f,
          .frequency_penalty = 0.7f},
         0,
         0,
         0},
        {"all, bias, stops, softcap",
         {.temperature = 0.8f,
          .top_k = 50,
          .top_p = 0.95f,
          .min_p = 0.02f,
          .repetition_penalty = 1.2f,
          .presence_penalty = -0.4f,
          .frequency_penalty = 0.3f},
         5,
         6.0f,
         1},
        {"greedy, penalties, bias",
         {.temperature = 0, .top_p = 1, .repetition_penalty = 1.5f, .frequency_penalty = 1},
         8,
         0,
         1},
    };
    static const int vocab[] = {37, 3001};
    for (size_t v = 0; v < sizeof vocab / sizeof vocab[0]; v++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], vocab[v]);
}

/* 1000 seeded top-p draws from one row of 50 values: the host's token every time, and frequencies
 * within 4 standard deviations (plus 1e-3) of the processed probabilities. */
TEST(sampling_on_device_distribution) {
    if (ctrl_cuda_device_count() <= 0) TEST_SKIP(ctrl_cuda_unavailable_reason());
    enum { V = 50, N = 1000 };
    float logits[V], l[V];
    make_logits(logits, V, 7);
    for (int i = 0; i < V; i++) logits[i] *= 0.4f; /* a flatter row: many tokens possible */
    const ctrl_sampling_params p = {.temperature = 1, .top_p = 0.9f, .repetition_penalty = 1};
    ctrl_sample_row *rows = calloc(N, sizeof *rows);
    int32_t *want = malloc(sizeof(int32_t) * N);
    for (int r = 0; r < N; r++) {
        ctrl_rng rng;
        ctrl_rng_seed(&rng, 77 + (uint64_t)r);
        rows[r] = (ctrl_sample_row){.temperature = 1, .top_p = 0.9f, .repetition_penalty = 1, .u = 0};
        ctrl_rng copy = rng;
        rows[r].u = ctrl_rng_uniform(&copy);
        memcpy(l, logits, sizeof l);
        float lp;
        want[r] = ctrl_sample(&p, l, V, NULL, 0, &rng, &lp);
    }
    float probs[V];
    memcpy(l, logits, sizeof l);
    CHECK_EQ_INT(ctrl_sampling_process(&p, l, V, NULL, 0), 0);
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, l[i]);
    for (int i = 0; i < V; i++) z += exp(l[i] - mx);
    for (int i = 0; i < V; i++) probs[i] = (float)(exp(l[i] - mx) / z);
    ctrl_sample_out *out = malloc(sizeof *out * N);
    ctrl_sample_batch b = {.logits = up(logits, sizeof logits),
                           .V = V,
                           .n_rows = N,
                           .rows = up(rows, sizeof *rows * N),
                           .ids = up(NULL, 0),
                           .vals = up(NULL, 0),
                           .out = up(NULL, sizeof *out * N)};
    CHECK_MSG(ctrl_cuda_sample(&b) == CTRL_OK, "%s", ctrl_error_message());
    CHECK_EQ_INT(ctrl_cuda_memcpy_d2h(out, b.out, sizeof *out * N), CTRL_OK);
    int same = 0, count[V] = {0};
    for (int r = 0; r < N; r++)
        same += out[r].id == want[r], count[out[r].id >= 0 && out[r].id < V ? out[r].id : 0]++;
    CHECK_MSG(same == N, "%d of %d draws are the host's", same, N);
    double worst = 0;
    for (int i = 0; i < V; i++) {
        const double f = (double)count[i] / N, sd = sqrt(probs[i] * (1 - probs[i]) / N);
        CHECK_MSG(fabs(f - probs[i]) <= 4 * sd + 1e-3, "token %d: frequency %.4f, probability %.4f", i, f,
                  probs[i]);
        CHECK_MSG(probs[i] > 0 || count[i] == 0, "token %d was filtered out but drawn %d times", i, count[i]);
        worst = fmax(worst, fabs(f - probs[i]));
    }
    printf("  top_p 0.9: %d of %d draws the host's, frequencies within %.3f of the probabilities\n", same, N,
           worst);
    ctrl_cuda_free((void *)b.logits), ctrl_cuda_free((void *)b.rows), ctrl_cuda_free((void *)b.ids),
        ctrl_cuda_free((void *)b.vals), ctrl_cuda_free(b.out);
    free(rows), free(want), free(out);
}

#else

TEST(sampling_cuda) { TEST_SKIP("built without CUDA"); }

#endif
