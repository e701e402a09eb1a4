/* Eager attention on the CPU, fp32: for each sequence and head, the full score matrix
 * S = scale * Q K^T under the causal (and sliding-window) mask, P = softmax(S), O = P V.
 * Backward recomputes P from the saved log-sum-exp:
 *   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),  dQ = scale dS K,  dK = scale dS^T Q.
 * With soft-capping (Gemma 2) S = cap tanh(scale Q K^T / cap), and dS takes the factor 1 - tanh^2.
 * Work is split over (sequence, kv head) so that the query heads of a GQA group, which share
 * K and V, accumulate dK and dV without races. */
#include "eager_cpu.h"

#include "../attention_plugin_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Key j is visible from query i (both relative to the sequence start; attention_mask.h). */
static inline int visible(const ctrl_attention_args *a, int i, int j) {
    return ctrl_attention_visible(a->causal, a->window, i, j);
}

/* Scores of one (sequence, head) into S [L, L]; masked entries are -inf. Returns row maxima. */
static void scores(const ctrl_attention_args *a, int start, int L, int h, int kvh, float *S) {
    const int D = a->head_dim, H = a->n_head, HK = a->n_kv_head;
    const float *q = a->q, *k = a->k;
    for (int i = 0; i < L; i++) {
        const float *qi = q + ((size_t)(start + i) * H + h) * D;
        for (int j = 0; j < L; j++) {
            if (!visible(a, i, j)) {
                S[(size_t)i * L + j] = -INFINITY;
                continue;
            }
            const float *kj = k + ((size_t)(start + j) * HK + kvh) * D;
            float s = 0;
#pragma omp simd reduction(+ : s)
            for (int d = 0; d < D; d++) s += qi[d] * kj[d];
            S[(size_t)i * L + j] =
                a->softcap > 0 ? attention_softcap(s * a->scale, a->softcap) : s * a->scale;
        }
    }
}

static int max_len(const ctrl_attention_args *a) {
    int m = 0;
    for (int b = 0; b < a->n_seqs; b++) {
        int L = a->cu_seqlens_host[b + 1] - a->cu_seqlens_host[b];
        if (L > m) m = L;
    }
    return m;
}

/* The calling thread's Lmax x Lmax score matrix, or NULL with *failed set (inside a parallel region). */
static float *thread_scores(int Lmax, int *failed) {
    float *S = malloc(sizeof(float) * (size_t)Lmax * (size_t)(Lmax ? Lmax : 1));
    if (!S) {
#pragma omp atomic write
        *failed = 1;
    }
    return S;
}

static ctrl_status scores_status(int failed, int Lmax) {
    if (failed)
        return ctrl_error_set(CTRL_ERR_NOMEM, "attention eager: no memory for a %d x %d score matrix", Lmax,
                              Lmax);
    return CTRL_OK;
}

ctrl_status eager_cpu_forward(const ctrl_attention_args *a) {
    const int D = a->head_dim, H = a->n_head, HK = a->n_kv_head, group = H / HK;
    const int Lmax = max_len(a);
    const float *v = a->v;
    float *out = a->out;
    int failed = 0;
#pragma omp parallel
    {
        float *S = thread_scores(Lmax, &failed);
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < a->n_seqs; b++)
            for (int h = 0; h < H; h++) {
                if (!S) continue;
                const int start = a->cu_seqlens_host[b], L = a->cu_seqlens_host[b + 1] - start,
                          kvh = h / group;
                scores(a, start, L, h, kvh, S);
                for (int i = 0; i < L; i++) {
                    float *row = S + (size_t)i * L;
                    float m = -INFINITY;
                    for (int j = 0; j < L; j++) m = fmaxf(m, row[j]);
                    double sum = 0;
                    for (int j = 0; j < L; j++) {
                        row[j] = row[j] == -INFINITY ? 0.0f : expf(row[j] - m);
                        sum += row[j];
                    }
                    /* A fully masked row (impossible with causal masks, where j = i is always
                     * visible) would give 0/0: define its output as 0 and its lse as -inf. */
                    float inv = sum > 0 ? (float)(1.0 / sum) : 0.0f;
                    float *oi = out + ((size_t)(start + i) * H + h) * D;
                    for (int d = 0; d < D; d++) oi[d] = 0;
                    for (int j = 0; j < L; j++) {
                        float p = row[j] * inv;
                        if (p == 0) continue;
                        const float *vj = v + ((size_t)(start + j) * HK + kvh) * D;
                        for (int d = 0; d < D; d++) oi[d] += p * vj[d];
                    }
                    if (a->lse)
                        a->lse[(size_t)h * a->total_tokens + start + i] =
                            sum > 0 ? m + (float)log(sum) : -INFINITY;
                }
            }
        free(S);
    }
    return scores_status(failed, Lmax);
}

ctrl_status eager_cpu_backward(const ctrl_attention_args *a) {
    const int D = a->head_dim, H = a->n_head, HK = a->n_kv_head, group = H / HK;
    const int Lmax = max_len(a), T = a->total_tokens;
    const float *q = a->q, *k = a->k, *v = a->v, *o = a->out, *dout = a->dout;
    float *dq = a->dq, *dk = a->dk, *dv = a->dv;
    memset(dq, 0, sizeof(float) * (size_t)T * H * D);
    memset(dk, 0, sizeof(float) * (size_t)T * HK * D);
    memset(dv, 0, sizeof(float) * (size_t)T * HK * D);
    int failed = 0;
#pragma omp parallel
    {
        float *S = thread_scores(Lmax, &failed);
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < a->n_seqs; b++)
            for (int kvh = 0; kvh < HK; kvh++) {
                if (!S) continue;
                const int start = a->cu_seqlens_host[b], L = a->cu_seqlens_host[b + 1] - start;
                for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                    scores(a, start, L, h, kvh, S);
                    for (int i = 0; i < L; i++) {
                        const size_t qi_off = ((size_t)(start + i) * H + h) * D;
                        const float lse = a->lse[(size_t)h * T + start + i];
                        float *row = S + (size_t)i * L;
                        /* D_i = dO_i . O_i */
                        float Di = 0;
                        for (int d = 0; d < D; d++) Di += dout[qi_off + d] * o[qi_off + d];
                        for (int j = 0; j < L; j++) {
                            if (row[j] == -INFINITY) continue;
                            const float p = expf(row[j] - lse);
                            const size_t kj_off = ((size_t)(start + j) * HK + kvh) * D;
                            /* soft-capping: dS times 1 - tanh^2, folded into the scale */
                            const float sc = a->softcap > 0
                                                 ? a->scale * attention_softcap_grad(row[j], a->softcap)
                                                 : a->scale;
                            attention_backward_pair(p, Di, sc, dout + qi_off, q + qi_off, k + kj_off,
                                                    v + kj_off, dq + qi_off, dk + kj_off, dv + kj_off, D);
                        }
                    }
                }
            }
        free(S);
    }
    return scores_status(failed, Lmax);
}
