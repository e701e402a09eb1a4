/* Paged attention on the CPU: every (query token, kv head) pair in parallel; the query heads of a
 * GQA group read each cached K and V row once, through the sequence's block table. Scores of a
 * group are materialised ([group, context]: decoding contexts are short next to T x T), each
 * head's softmax normalised up front, then applied to V. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "paged_cpu.h"

/* Row j of sequence s in a pool [n_blocks, block_size, n_kv_head, head_dim], at kv head kvh. */
static inline const float *cache_row(const ctrl_paged_attention_args *a, const float *pool,
                                     const int32_t *table, int j, int kvh) {
    const size_t slot = (size_t)a->n_kv_head * a->head_dim;
    return pool + ((size_t)table[j / a->block_size] * a->block_size + j % a->block_size) * slot +
           (size_t)kvh * a->head_dim;
}

static void attend_group(const ctrl_paged_attention_args *a, int t, int kvh, float *scores) {
    const int D = a->head_dim, G = a->n_head / a->n_kv_head, pos = a->positions[t];
    const int lo = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0, n = pos - lo + 1;
    const int32_t *table = a->block_tables + (size_t)a->seq_of_token[t] * a->max_blocks_per_seq;
    const float *kc = a->k_cache, *vc = a->v_cache;
    const float *qg = (const float *)a->q + ((size_t)t * a->n_head + (size_t)kvh * G) * D;
    for (int j = lo; j <= pos; j++) {
        const float *k = cache_row(a, kc, table, j, kvh);
        for (int g = 0; g < G; g++) {
            const float *qh = qg + (size_t)g * D;
            float d = 0;
#pragma omp simd reduction(+ : d)
            for (int i = 0; i < D; i++) d += qh[i] * k[i];
            scores[(size_t)g * n + j - lo] = d * a->scale;
        }
    }
    float *og = (float *)a->out + ((size_t)t * a->n_head + (size_t)kvh * G) * D;
    memset(og, 0, sizeof(float) * (size_t)G * D);
    for (int g = 0; g < G; g++) {
        float *sc = scores + (size_t)g * n, mx = -INFINITY;
        for (int j = 0; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
        double sum = 0;
        for (int j = 0; j < n; j++) sum += sc[j] = expf(sc[j] - mx);
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < n; j++) sc[j] *= inv;
    }
    for (int j = lo; j <= pos; j++) {
        const float *v = cache_row(a, vc, table, j, kvh);
        for (int g = 0; g < G; g++) {
            const float p = scores[(size_t)g * n + j - lo];
            float *o = og + (size_t)g * D;
#pragma omp simd
            for (int i = 0; i < D; i++) o[i] += p * v[i];
        }
    }
}

ctrl_status paged_cpu_forward(const ctrl_paged_attention_args *a) {
    const int HK = a->n_kv_head, G = a->n_head / a->n_kv_head;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *scores = malloc(sizeof(float) * (size_t)G * (size_t)(a->max_position + 1));
        failed = scores == NULL;
#pragma omp for schedule(dynamic, 8)
        for (long w = 0; w < (long)a->n_tokens * HK; w++)
            if (scores) attend_group(a, (int)(w / HK), (int)(w % HK), scores);
        free(scores);
    }
    return failed ? CTRL_ERR_NOMEM : CTRL_OK;
}
