/* Paged attention on the CPU: every (query token, kv head) pair in parallel; the query heads of a
 * GQA group read each cached K and V row once, block by block through the sequence's table (a bf16
 * cache row is widened to fp32 once for the group; K rows go through a transposed tile). Scores of
 * a group are materialised ([group, context]: decoding contexts are short next to T x T), each
 * head's softmax normalised up front, then applied to V. Built for AVX2+FMA as well as the
 * baseline, chosen at run time (decoding spends a third of its time here). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/exp_approx.h>

#include "paged_cpu.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

/* Row `src` of the pool as fp32: itself, or widened into buf (bf16 is the top half of an fp32). */
static inline const float *row_f32(const void *src, int bf16, float *buf, int D) {
    if (!bf16) return src;
    const uint16_t *h = src;
#pragma omp simd
    for (int i = 0; i < D; i++) {
        const uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&buf[i], &u, sizeof u);
    }
    return buf;
}

/* Block b of a sequence's table holds positions b*bs .. b*bs+bs-1; of those, [*j0, *j1] lie in
 * lo..pos. Returns the offset (in floats) of row *j0 at kv head kvh in a pool. */
static inline size_t block_rows(const ctrl_paged_attention_args *a, const int32_t *table, int b, int kvh,
                                int lo, int pos, int *j0, int *j1) {
    const int bs = a->block_size, first = b * bs, last = first + bs - 1;
    *j0 = first > lo ? first : lo, *j1 = last < pos ? last : pos;
    return ((size_t)table[b] * bs + (size_t)(*j0 - first)) * a->n_kv_head * a->head_dim +
           (size_t)kvh * a->head_dim;
}

enum { RT = 16 }; /* K rows per transposed tile */

CLONES static void attend_group(const ctrl_paged_attention_args *a, int t, int kvh, float *scores,
                                float *buf) {
    const int D = a->head_dim, G = a->n_head / a->n_kv_head, pos = a->positions[t];
    const int lo = ctrl_attention_first_key(a->window, pos), n = pos - lo + 1; /* causal: keys lo..pos */
    const size_t slot = (size_t)a->n_kv_head * D;
    const int32_t *table = a->block_tables + (size_t)a->seq_of_token[t] * a->max_blocks_per_seq;
    const float *qg = (const float *)a->q + ((size_t)t * a->n_head + (size_t)kvh * G) * D;
    const int bf16 = a->cache_dtype == CTRL_BF16;
    const size_t elt = bf16 ? 2 : 4;
    const char *kc = a->k_cache, *vc = a->v_cache;
    /* K rows go through a transposed tile kt[D][RT], so that each head's scores for RT rows are
     * vertical multiply-adds (no horizontal sum per row) */
    for (int b = lo / a->block_size, j0, j1; b <= pos / a->block_size; b++) {
        const char *kr = kc + block_rows(a, table, b, kvh, lo, pos, &j0, &j1) * elt;
        for (int r0 = j0; r0 <= j1; r0 += RT) {
            const int nr = j1 - r0 + 1 < RT ? j1 - r0 + 1 : RT;
            for (int r = 0; r < RT; r++) {
                const float *k =
                    r < nr ? row_f32(kr + (size_t)(r0 - j0 + r) * slot * elt, bf16, buf + (size_t)RT * D, D)
                           : NULL;
                for (int i = 0; i < D; i++) buf[(size_t)i * RT + r] = k ? k[i] : 0.0f;
            }
            for (int g = 0; g < G; g++) {
                const float *qh = qg + (size_t)g * D;
                float acc[RT] = {0};
                for (int i = 0; i < D; i++) {
                    const float qi = qh[i], *kt = buf + (size_t)i * RT;
#pragma omp simd
                    for (int r = 0; r < RT; r++) acc[r] += qi * kt[r];
                }
                for (int r = 0; r < nr; r++) scores[(size_t)g * n + r0 - lo + r] = acc[r] * a->scale;
                if (a->softcap > 0) /* Gemma 2: cap tanh(s / cap) */
                    for (int r = 0; r < nr; r++) {
                        float *s = &scores[(size_t)g * n + r0 - lo + r];
                        *s = a->softcap * tanhf(*s / a->softcap);
                    }
            }
        }
    }
    float *og = (float *)a->out + ((size_t)t * a->n_head + (size_t)kvh * G) * D;
    memset(og, 0, sizeof(float) * (size_t)G * D);
    for (int g = 0; g < G; g++) {
        float *sc = scores + (size_t)g * n, mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < n; j++) mx = sc[j] > mx ? sc[j] : mx;
        double sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < n; j++) sum += sc[j] = ctrl_exp_approx(sc[j] - mx);
        const float inv = (float)(1.0 / sum);
#pragma omp simd
        for (int j = 0; j < n; j++) sc[j] *= inv;
    }
    for (int b = lo / a->block_size, j0, j1; b <= pos / a->block_size; b++) {
        const char *vr = vc + block_rows(a, table, b, kvh, lo, pos, &j0, &j1) * elt;
        for (int j = j0; j <= j1; j++, vr += slot * elt) {
            const float *v = row_f32(vr, bf16, buf, D);
            for (int g = 0; g < G; g++) {
                const float p = scores[(size_t)g * n + j - lo];
                float *o = og + (size_t)g * D;
#pragma omp simd
                for (int i = 0; i < D; i++) o[i] += p * v[i];
            }
        }
    }
}

/* Below this many query-head x position x dimension products (a decoding step of a few short
 * sequences: tens of microseconds) one thread attends: the others' wake-up and barrier (futex calls
 * under OMP_WAIT_POLICY=PASSIVE) cost more than they would share. Each (token, kv head) is computed
 * alike on any thread. */
#define PAGED_PAR_MIN (1L << 20)

ctrl_status paged_cpu_forward(const ctrl_paged_attention_args *a) {
    const int HK = a->n_kv_head, G = a->n_head / a->n_kv_head;
    const long work = (long)a->n_tokens * a->n_head * (a->max_position + 1L) * a->head_dim;
    int failed = 0;
#pragma omp parallel reduction(| : failed) if (work >= PAGED_PAR_MIN)
    {
        float *scores = malloc(sizeof(float) *
                               ((size_t)G * (size_t)(a->max_position + 1) + (size_t)(RT + 1) * a->head_dim));
        failed = scores == NULL;
#pragma omp for schedule(dynamic, 8)
        for (long w = 0; w < (long)a->n_tokens * HK; w++)
            if (scores)
                attend_group(a, (int)(w / HK), (int)(w % HK), scores,
                             scores + (size_t)G * (size_t)(a->max_position + 1));
        free(scores);
    }
    return failed ? ctrl_error_set(CTRL_ERR_NOMEM, "attention paged: no scratch for %d positions",
                                   a->max_position + 1)
                  : CTRL_OK;
}
