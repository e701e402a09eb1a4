/* Logits processing and seeded draws (see sampling.h). Probabilities are summed in double, each
 * exp taken in fp32 by the vectorisable ctrl_exp_approx (< 2 ulp): a large vocabulary makes these
 * loops a real share of a decode step. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include <ctrl/exp_approx.h>

#include "generate/sampling.h"

void ctrl_rng_seed(ctrl_rng *r, uint64_t seed) { r->state = seed ^ 0x9E3779B97F4A7C15ull; }

double ctrl_rng_uniform(ctrl_rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

/* exp(x) for a log-probability x <= 0 (-inf: 0, which the clamped approximation is not). */
static inline float prob(float x) { return x == -INFINITY ? 0.0f : ctrl_exp_approx(x); }

static float max_of(const float *l, int V) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    return mx;
}

/* log sum exp l; mx: max_of(l, V) */
static double logsumexp_at(const float *l, int V, float mx) {
    if (mx == -INFINITY) return -INFINITY;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < V; i++) s += prob(l[i] - mx);
    return mx + log(s);
}

static double logsumexp(const float *l, int V) { return logsumexp_at(l, V, max_of(l, V)); }

static int float_ascending(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static int by_logit_ascending(const void *a, const void *b, void *ctx) {
    const float *l = ctx;
    float x = l[*(const int *)a], y = l[*(const int *)b];
    return (x > y) - (x < y);
}

/* top-p as transformers' TopPLogitsWarper: sort ascending, drop the entries whose cumulative
 * probability stays <= 1 - top_p, always keep the most likely. */
static int top_p_filter(float *l, int V, float top_p) {
    int *idx = malloc(sizeof(int) * (size_t)V);
    if (!idx) return -2;
    for (int i = 0; i < V; i++) idx[i] = i;
    qsort_r(idx, (size_t)V, sizeof(int), by_logit_ascending, l);
    const double lse = logsumexp(l, V);
    double cum = 0;
    for (int r = 0; r < V - 1; r++) {
        cum += prob((float)((double)l[idx[r]] - lse));
        if (cum <= 1.0 - top_p) l[idx[r]] = -INFINITY;
    }
    free(idx);
    return 0;
}

/* Written so that a NaN fails each test. repetition_penalty must be a normal float: dividing by a
 * subnormal one overflows to inf (and inf - inf is NaN downstream); temperature likewise, or 0. */
int ctrl_sampling_params_valid(const ctrl_sampling_params *p) {
    return (p->temperature == 0 || (p->temperature >= FLT_MIN && p->temperature <= FLT_MAX)) &&
           p->top_p > 0 && p->top_p <= 1 && p->min_p >= 0 && p->min_p <= 1 &&
           p->repetition_penalty >= FLT_MIN && p->repetition_penalty <= FLT_MAX &&
           p->presence_penalty >= -2 && p->presence_penalty <= 2 && p->frequency_penalty >= -2 &&
           p->frequency_penalty <= 2;
}

/* presence and frequency penalties over the completion (out[n_out]); 0, or -2 when out of memory */
static int penalize_output(const ctrl_sampling_params *p, float *l, int V, const int32_t *out, int n_out) {
    if ((p->presence_penalty == 0 && p->frequency_penalty == 0) || n_out <= 0) return 0;
    int *count = calloc((size_t)V, sizeof(int));
    if (!count) return -2;
    for (int i = 0; i < n_out; i++)
        if (out[i] >= 0 && out[i] < V) count[out[i]]++;
    for (int t = 0; t < V; t++)
        if (count[t] > 0 && l[t] != -INFINITY)
            l[t] = fmaxf(fminf(l[t] - p->frequency_penalty * (float)count[t] - p->presence_penalty, FLT_MAX),
                         -FLT_MAX);
    free(count);
    return 0;
}

int ctrl_sampling_process(const ctrl_sampling_params *p, float *l, int V, const int32_t *seen, int n_seen) {
    return ctrl_sampling_process_seq(p, l, V, seen, n_seen, n_seen);
}

int ctrl_sampling_process_seq(const ctrl_sampling_params *p, float *l, int V, const int32_t *seen, int n_seen,
                              int n_prompt) {
    if (!ctrl_sampling_params_valid(p)) return -1;
    if (p->repetition_penalty != 1.0f) { /* each distinct seen token once */
        uint8_t *done = calloc((size_t)V, 1);
        if (!done) return -2;
        for (int i = 0; i < n_seen; i++) {
            int32_t t = seen[i];
            if (t < 0 || t >= V || done[t]) continue;
            done[t] = 1;
            l[t] = l[t] < 0 ? l[t] * p->repetition_penalty : l[t] / p->repetition_penalty;
            if (l[t] > FLT_MAX) l[t] = FLT_MAX; /* a finite logit stays finite: +inf would make NaNs */
        }
        free(done);
    }
    if (n_prompt < 0 || n_prompt > n_seen) n_prompt = n_seen;
    if (n_seen > n_prompt && penalize_output(p, l, V, seen + n_prompt, n_seen - n_prompt) != 0) return -2;
    if (p->temperature > 0 && p->temperature != 1.0f)
        for (int i = 0; i < V; i++) l[i] = fminf(l[i] / p->temperature, FLT_MAX); /* as above */
    if (p->top_k > 0 && p->top_k < V) { /* below the k-th largest value goes; ties with it stay */
        float *sorted = malloc(sizeof(float) * (size_t)V);
        if (!sorted) return -2;
        for (int i = 0; i < V; i++) sorted[i] = l[i];
        qsort(sorted, (size_t)V, sizeof(float), float_ascending);
        const float kth = sorted[V - p->top_k];
        for (int i = 0; i < V; i++)
            if (l[i] < kth) l[i] = -INFINITY;
        free(sorted);
    }
    if (p->top_p < 1.0f && top_p_filter(l, V, p->top_p) != 0) return -2;
    if (p->min_p > 0) { /* drop probabilities below min_p times the largest, keep the largest */
        float mx = -INFINITY;
        for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
        const double cut = log((double)p->min_p); /* p_i < min_p * p_max  <=>  l_i - l_max < log(min_p) */
        for (int i = 0; i < V; i++)
            if ((double)l[i] - mx < cut) l[i] = -INFINITY;
    }
    return 0;
}

int32_t ctrl_sample(const ctrl_sampling_params *p, float *l, int V, const int32_t *seen, int n_seen,
                    ctrl_rng *rng, float *logprob) {
    return ctrl_sample_seq(p, l, V, seen, n_seen, n_seen, rng, logprob);
}

int ctrl_sampling_top(const float *l, int V, int k, int32_t *ids, float *logprobs) {
    const double lse = logsumexp(l, V);
    int n = 0;
    for (int i = 0; i < V && k > 0; i++) { /* insertion into the sorted k best so far */
        if (l[i] == -INFINITY || (n == k && l[i] <= l[ids[n - 1]])) continue;
        int at = n < k ? n++ : k - 1;
        while (at > 0 && l[ids[at - 1]] < l[i]) ids[at] = ids[at - 1], at--;
        ids[at] = i;
    }
    for (int j = 0; j < n; j++) logprobs[j] = (float)((double)l[ids[j]] - lse);
    return n;
}

int32_t ctrl_sample_seq(const ctrl_sampling_params *p, float *l, int V, const int32_t *seen, int n_seen,
                        int n_prompt, ctrl_rng *rng, float *logprob) {
    const int processed = ctrl_sampling_process_seq(p, l, V, seen, n_seen, n_prompt);
    if (processed != 0) return processed;
    const float mx = max_of(l, V);
    const double lse = logsumexp_at(l, V, mx);
    int32_t tok = 0;
    if (p->temperature == 0) { /* greedy: the first maximum (a scan for it, not a chain of compares) */
        int i = 0;
        while (i < V && !(l[i] == mx)) i++;
        tok = i < V ? i : 0; /* none: every logit -inf (a max reduction may start at -FLT_MAX), token 0 */
    } else {
        /* the inverse CDF: whole blocks of 256 summed (vectorised) until the one u falls in */
        const double u = ctrl_rng_uniform(rng);
        double cum = 0;
        tok = -1;
        int i0 = 0;
        for (; i0 + 256 <= V; i0 += 256) {
            double blk = 0;
#pragma omp simd reduction(+ : blk)
            for (int i = i0; i < i0 + 256; i++) blk += prob((float)((double)l[i] - lse));
            if (u < cum + blk) break;
            cum += blk;
            for (int i = i0; i < i0 + 256; i++)
                tok = l[i] == -INFINITY ? tok : i; /* the last possible so far */
        }
        for (int i = i0; i < V; i++) {
            if (l[i] == -INFINITY) continue;
            cum += prob((float)((double)l[i] - lse));
            tok = i;
            if (u < cum) break;
        }
    }
    *logprob = (float)((double)l[tok] - lse);
    return tok;
}
