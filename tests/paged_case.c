/* See paged_case.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "paged_case.h"

static float frand(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (float)((*s >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

void paged_case_make(paged_case *c, paged_shape sh, const int *lens, int B, uint64_t seed) {
    memset(c, 0, sizeof *c);
    const int H = sh.H, HK = sh.HK, D = sh.D, bs = sh.block;
    int max_blocks = 0, n_blocks = 3; /* three blocks no sequence owns */
    c->B = B;
    for (int b = 0; b < B; b++) {
        c->cu[b + 1] = c->cu[b] + lens[b];
        const int nb = (lens[b] + bs - 1) / bs;
        max_blocks = nb > max_blocks ? nb : max_blocks, n_blocks += nb;
        c->n += sh.last_only ? 1 : lens[b];
    }
    const int T = c->T = c->cu[B];
    const size_t slot = (size_t)HK * D, elt = sh.bf16 ? 2 : 4;
    c->q = malloc(sizeof(float) * T * H * D), c->k = malloc(sizeof(float) * T * slot);
    c->v = malloc(sizeof(float) * T * slot);
    for (int i = 0; i < T * H * D; i++) c->q[i] = frand(&seed);
    for (size_t i = 0; i < (size_t)T * slot; i++) c->k[i] = frand(&seed), c->v[i] = frand(&seed);
    if (sh.bf16) /* a reference over the contiguous rows sees the values the cache holds */
        ctrl_cpu_round_to_bf16(c->k, c->k, (int64_t)T * slot),
            ctrl_cpu_round_to_bf16(c->v, c->v, (int64_t)T * slot);
    /* the pools: blocks handed out in a shuffled order; rows nobody owns are NaN (all ones) */
    int32_t *order = malloc(sizeof(int32_t) * n_blocks);
    for (int i = 0; i < n_blocks; i++) order[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        const int j = (int)((frand(&seed) + 1.0f) * 0.5f * i), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    c->pool_bytes = (size_t)n_blocks * bs * slot * elt;
    c->kc = malloc(c->pool_bytes), c->vc = malloc(c->pool_bytes);
    memset(c->kc, 0xff, c->pool_bytes), memset(c->vc, 0xff, c->pool_bytes);
    c->tables = calloc((size_t)B * max_blocks, sizeof(int32_t));
    for (int b = 0, next = 0; b < B; b++)
        for (int p = 0; p < lens[b]; p++) {
            if (p % bs == 0) c->tables[b * max_blocks + p / bs] = order[next++];
            const size_t at = ((size_t)c->tables[b * max_blocks + p / bs] * bs + p % bs) * slot;
            const float *kr = c->k + (size_t)(c->cu[b] + p) * slot,
                        *vr = c->v + (size_t)(c->cu[b] + p) * slot;
            if (sh.bf16) {
                ctrl_cpu_f32_to_bf16((uint16_t *)c->kc + at, kr, (int64_t)slot);
                ctrl_cpu_f32_to_bf16((uint16_t *)c->vc + at, vr, (int64_t)slot);
            } else {
                memcpy((float *)c->kc + at, kr, sizeof(float) * slot);
                memcpy((float *)c->vc + at, vr, sizeof(float) * slot);
            }
        }
    free(order);
    c->seq_of = malloc(sizeof(int32_t) * c->n), c->pos = malloc(sizeof(int32_t) * c->n);
    c->query_row = malloc(sizeof(int32_t) * c->n), c->qs = malloc(sizeof(float) * c->n * H * D);
    int max_pos = 0;
    for (int b = 0, t = 0; b < B; b++)
        for (int p = sh.last_only ? lens[b] - 1 : 0; p < lens[b]; p++, t++) {
            c->seq_of[t] = b, c->pos[t] = p, c->query_row[t] = c->cu[b] + p;
            memcpy(c->qs + (size_t)t * H * D, c->q + (size_t)(c->cu[b] + p) * H * D, sizeof(float) * H * D);
            max_pos = p > max_pos ? p : max_pos;
        }
    c->args = (ctrl_paged_attention_args){.size = sizeof c->args,
                                          .device = {CTRL_DEVICE_CPU, 0},
                                          .dtype = CTRL_F32,
                                          .n_tokens = c->n,
                                          .n_seqs = B,
                                          .n_head = H,
                                          .n_kv_head = HK,
                                          .head_dim = D,
                                          .scale = 1.0f / sqrtf((float)D),
                                          .window = sh.window,
                                          .q = c->qs,
                                          .k_cache = c->kc,
                                          .v_cache = c->vc,
                                          .n_blocks = n_blocks,
                                          .block_size = bs,
                                          .block_tables = c->tables,
                                          .max_blocks_per_seq = max_blocks,
                                          .seq_of_token = c->seq_of,
                                          .positions = c->pos,
                                          .max_position = max_pos,
                                          .cache_dtype = sh.bf16 ? CTRL_BF16 : CTRL_F32};
}

void paged_case_free(paged_case *c) {
    free(c->q), free(c->k), free(c->v), free(c->query_row), free(c->qs), free(c->kc), free(c->vc);
    free(c->tables), free(c->seq_of), free(c->pos);
    memset(c, 0, sizeof *c);
}
