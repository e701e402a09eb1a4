/* Attention plugins (eager, flash, paged): the kind's vtable. Batches are flat and
 * variable-length: sequence b occupies rows cu_seqlens[b] .. cu_seqlens[b+1]-1. */
#ifndef CTRL_ATTENTION_H
#define CTRL_ATTENTION_H

#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ctrl_attention_args {
    size_t size;                /* sizeof(ctrl_attention_args) as built */
    ctrl_device device;
    ctrl_dtype dtype;           /* of q, k, v, out, dout, dq, dk, dv */
    int n_seqs;                 /* B */
    const int32_t *cu_seqlens;  /* [B+1], on `device` */
    const int32_t *cu_seqlens_host; /* [B+1], the same on the host */
    int total_tokens;           /* T = cu_seqlens[B] */
    int n_head, n_kv_head, head_dim; /* GQA: n_head % n_kv_head == 0 */
    float scale;                /* usually 1/sqrt(head_dim) */
    int causal;                 /* 1 for decoder models */
    int window;                 /* sliding window (keys i-window < j <= i); 0 = none */
    const void *q;              /* [T, n_head, head_dim] */
    const void *k, *v;          /* [T, n_kv_head, head_dim] */
    void *out;                  /* [T, n_head, head_dim] */
    float *lse;                 /* [n_head, T] log-sum-exp of the scaled scores, saved for backward */
    /* backward only */
    const void *dout;
    void *dq, *dk, *dv;         /* written, not accumulated */
    int deterministic;
} ctrl_attention_args;

typedef struct ctrl_attention_ops {
    size_t size;
    /* Optional: 0 when the plugin cannot run these arguments (NULL = supports everything). */
    int (*supports)(const ctrl_attention_args *args);
    /* Bytes of scratch memory forward/backward need for these arguments (NULL = none). */
    size_t (*workspace_bytes)(const ctrl_attention_args *args, int backward);
    ctrl_status (*forward)(const ctrl_attention_args *args, void *workspace);
    ctrl_status (*backward)(const ctrl_attention_args *args, void *workspace);
} ctrl_attention_ops;

#ifdef __cplusplus
}
#endif
#endif
