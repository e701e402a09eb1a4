/* Attention plugins (eager, flash, paged): the kind's vtable. Batches are flat and
 * variable-length: sequence b occupies rows cu_seqlens[b] .. cu_seqlens[b+1]-1. */
#ifndef CTRL_ATTENTION_H
#define CTRL_ATTENTION_H

#include "attention_mask.h"
#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ctrl_attention_args {
    size_t size; /* sizeof(ctrl_attention_args) as built */
    ctrl_device device;
    ctrl_dtype dtype;                /* of q, k, v, out, dout, dq, dk, dv */
    int n_seqs;                      /* B */
    const int32_t *cu_seqlens;       /* [B+1], on `device` */
    const int32_t *cu_seqlens_host;  /* [B+1], the same on the host */
    int total_tokens;                /* T = cu_seqlens[B] */
    int n_head, n_kv_head, head_dim; /* GQA: n_head % n_kv_head == 0 */
    float scale;                     /* usually 1/sqrt(head_dim) */
    int causal;                      /* 1 for decoder models (the rule: attention_mask.h) */
    int window;                      /* sliding window (keys i-window < j <= i); 0 = none */
    const void *q;                   /* [T, n_head, head_dim] */
    const void *k, *v;               /* [T, n_kv_head, head_dim] */
    void *out;                       /* [T, n_head, head_dim] */
    float *lse;                      /* [n_head, T] log-sum-exp of the scaled scores, saved for backward */
    /* backward only */
    const void *dout;
    void *dq, *dk, *dv; /* written, not accumulated */
    int deterministic;
    /* Appended (Gemma 2's attn_logit_softcapping): the scaled scores s become softcap * tanh(s / softcap)
     * before the mask and the softmax; 0 = none. Only for a plugin whose ops set
     * CTRL_ATTENTION_SOFTCAP in `features` (the model refuses the others). `window` is per layer:
     * the model passes each layer's own (0 on a full-attention layer of an alternating model). */
    float softcap;
    /* Appended (check `size`): 1 when the caller computes in bf16 as torch.autocast does -- a plugin
     * may then round q, k, v and the probabilities to bf16 inside its matrix products (fp32
     * accumulation); the tensors keep `dtype`. 0: products in `dtype`. */
    int compute_bf16;
} ctrl_attention_args;

/* Decoding over a paged KV cache (the `paged` plugin; vLLM's paged attention): T query tokens of
 * n_seqs sequences, each attending over its sequence's cached keys through a block table. The
 * caller has already written the new tokens' K/V into the cache (a token sees itself). */
typedef struct ctrl_paged_attention_args {
    size_t size; /* sizeof(ctrl_paged_attention_args) as built */
    ctrl_device device;
    ctrl_dtype dtype; /* of q and out */
    int n_tokens;     /* T */
    int n_seqs;
    int n_head, n_kv_head, head_dim; /* GQA: n_head % n_kv_head == 0 */
    float scale;
    int window;          /* sliding window (keys p-window < j <= p); 0 = none */
    const void *q;       /* [T, n_head, head_dim] */
    void *out;           /* [T, n_head, head_dim] */
    const void *k_cache; /* this layer's pool [n_blocks, block_size, n_kv_head, head_dim] */
    const void *v_cache; /* the same for V */
    int n_blocks, block_size;
    const int32_t
        *block_tables; /* [n_seqs, max_blocks_per_seq]: position j of sequence s is slot
                          j % block_size of block block_tables[s * max_blocks_per_seq + j / block_size] */
    int max_blocks_per_seq;
    const int32_t *seq_of_token; /* [T] */
    const int32_t *positions;    /* [T] the query's position: it sees its sequence's keys 0..position */
    int max_position;            /* largest positions[t] (scratch sizing) */
    ctrl_dtype cache_dtype;      /* of k_cache and v_cache (fp32 or bf16 on the CPU) */
    float softcap;               /* appended: as ctrl_attention_args.softcap */
} ctrl_paged_attention_args;

typedef struct ctrl_attention_ops {
    size_t size;
    /* Optional: 0 when the plugin cannot run these arguments (NULL = supports everything). */
    int (*supports)(const ctrl_attention_args *args);
    /* Bytes of scratch memory forward/backward need for these arguments (NULL = none). */
    size_t (*workspace_bytes)(const ctrl_attention_args *args, int backward);
    ctrl_status (*forward)(const ctrl_attention_args *args, void *workspace);
    ctrl_status (*backward)(const ctrl_attention_args *args, void *workspace);
    /* Optional (check `size` covers it): decoding over a paged KV cache; the plugin allocates
     * its own scratch. */
    ctrl_status (*paged_forward)(const ctrl_paged_attention_args *args);
    /* Appended: what the plugin honours beyond the first version's arguments (CTRL_ATTENTION_*
     * bits; check `size` covers it, ctrl_attention_has). */
    unsigned features;
} ctrl_attention_ops;

#define CTRL_ATTENTION_SOFTCAP 1u /* ctrl_attention_args.softcap (and the paged args') */

/* Whether the plugin `ops` declares the CTRL_ATTENTION_* bit `feature`. */
static inline int ctrl_attention_has(const ctrl_attention_ops *ops, unsigned feature) {
    return ops->size >= offsetof(ctrl_attention_ops, features) + sizeof ops->features &&
           (ops->features & feature) != 0;
}

#ifdef __cplusplus
}
#endif
#endif
