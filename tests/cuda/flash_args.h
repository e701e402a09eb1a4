/* The flash plugin's CUDA arguments over device buffers, as tests/cuda/test_cuda_flash.c and
 * bench/cuda/bench_flash.c build them: one flat batch of n_seqs sequences (cu[n_seqs + 1], host),
 * H query heads and HK KV heads of head_dim D, causal (window 0: none), tensors of dtype dt. */
#ifndef CTRL_TEST_FLASH_ARGS_H
#define CTRL_TEST_FLASH_ARGS_H

#include <math.h>
#include <stdint.h>

#include <ctrl/attention.h>

#include "cuda/cuda_ops.h"

typedef struct flash_bufs {
    int32_t *cu; /* cu_seqlens on the device */
    void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float *lse;
} flash_bufs;

static inline void flash_bufs_free(flash_bufs *b) {
    void *p[] = {b->cu, b->q, b->k, b->v, b->out, b->dout, b->dq, b->dk, b->dv, b->lse};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) ctrl_cuda_free(p[i]);
    *b = (flash_bufs){0};
}

/* Every buffer on the device, filled with 0xff bytes (NaN: a result never written shows), and the
 * sequence offsets copied there. CTRL_OK, or the failed call's status (nothing left allocated). */
static inline ctrl_status flash_bufs_alloc(flash_bufs *b, const int32_t *cu, int n_seqs, int H, int HK, int D,
                                           ctrl_dtype dt) {
    const size_t T = (size_t)cu[n_seqs], esz = dt == CTRL_BF16 ? 2 : 4, nq = T * H * D * esz,
                 nk = T * HK * D * esz;
    *b = (flash_bufs){0};
    void **p[] = {(void **)&b->cu, &b->q,  &b->k,  &b->v,  &b->out,
                  &b->dout,        &b->dq, &b->dk, &b->dv, (void **)&b->lse};
    const size_t bytes[] = {
        sizeof(int32_t) * (size_t)(n_seqs + 1), nq, nk, nk, nq, nq, nq, nk, nk, T * H * 4};
    ctrl_status st = CTRL_OK;
    for (size_t i = 0; i < sizeof p / sizeof p[0] && st == CTRL_OK; i++) {
        st = ctrl_cuda_malloc(p[i], bytes[i] ? bytes[i] : 4);
        if (st == CTRL_OK) st = ctrl_cuda_memset(*p[i], 0xff, bytes[i]);
    }
    if (st == CTRL_OK) st = ctrl_cuda_memcpy_h2d(b->cu, cu, bytes[0]);
    if (st != CTRL_OK) flash_bufs_free(b);
    return st;
}

static inline ctrl_attention_args flash_args(const flash_bufs *b, const int32_t *cu, int n_seqs, int H,
                                             int HK, int D, ctrl_dtype dt, int window) {
    return (ctrl_attention_args){.size = sizeof(ctrl_attention_args),
                                 .device = {CTRL_DEVICE_CUDA, 0},
                                 .dtype = dt,
                                 .n_seqs = n_seqs,
                                 .cu_seqlens = b->cu,
                                 .cu_seqlens_host = cu,
                                 .total_tokens = cu[n_seqs],
                                 .n_head = H,
                                 .n_kv_head = HK,
                                 .head_dim = D,
                                 .scale = 1.0f / sqrtf((float)D),
                                 .causal = 1,
                                 .window = window,
                                 .q = b->q,
                                 .k = b->k,
                                 .v = b->v,
                                 .out = b->out,
                                 .lse = b->lse,
                                 .dout = b->dout,
                                 .dq = b->dq,
                                 .dk = b->dk,
                                 .dv = b->dv,
                                 .deterministic = 1};
}

#endif
