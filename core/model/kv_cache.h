/* A paged KV cache (DESIGN §9): one pool of fixed-size blocks (16 tokens by default) per layer for K
 * and V, fp32 or bf16 (half the bytes: twice the tokens in the same budget), a free list with
 * reference counts, and a block table per sequence mapping its logical blocks to pool blocks. The
 * pools are host memory, or a backend's (device/backend.h: a model on a GPU decodes into a pool in
 * device memory); the block tables and the free list are always host memory. */
#ifndef CTRL_CORE_KV_CACHE_H
#define CTRL_CORE_KV_CACHE_H

#include <stddef.h>

#include <ctrl/status.h>
#include <ctrl/tensor.h>

struct ctrl_backend_ops;

typedef struct ctrl_kv_cache {
    const struct ctrl_backend_ops *be; /* where k and v are: NULL for host memory */
    int n_layers, n_kv_heads, head_dim, block_size, n_blocks;
    ctrl_dtype dtype; /* CTRL_F32 or CTRL_BF16 */
    size_t elt;       /* bytes per value */
    void *k, *v;      /* [n_layers][n_blocks][block_size][n_kv_heads][head_dim] */
    int *refcount, *free_list, n_free;
} ctrl_kv_cache;

typedef struct ctrl_kv_seq {
    int *blocks; /* block table */
    int n_blocks, cap;
    int len; /* tokens cached */
} ctrl_kv_seq;

/* A pool of `dtype` values as large as fits in `bytes` (at least one block), in host memory. */
ctrl_status ctrl_kv_cache_create(int n_layers, int n_kv_heads, int head_dim, int block_size, size_t bytes,
                                 ctrl_dtype dtype, ctrl_kv_cache **out);
/* The same with the pools in `be`'s memory (NULL or a host-memory backend: host memory). */
ctrl_status ctrl_kv_cache_create_on(const struct ctrl_backend_ops *be, int n_layers, int n_kv_heads,
                                    int head_dim, int block_size, size_t bytes, ctrl_dtype dtype,
                                    ctrl_kv_cache **out);
void ctrl_kv_cache_free(ctrl_kv_cache *c);
/* Blocks for positions [0, len) of `s`; CTRL_ERR_NOMEM (nothing changed) when the pool is out. */
ctrl_status ctrl_kv_seq_reserve(ctrl_kv_cache *c, ctrl_kv_seq *s, int len);
/* `dst` (empty) shares the full blocks of `src` (reference counted) and gets a copy of its last
 * partial block, so that both can append without touching what the other sees (prefix sharing of a
 * prompt's n samples). Returns the number of blocks shared. */
ctrl_status ctrl_kv_seq_fork(ctrl_kv_cache *c, const ctrl_kv_seq *src, ctrl_kv_seq *dst, int *shared);
/* Appends an existing block to s's table, shared (reference counted): a cached prefix block. */
ctrl_status ctrl_kv_seq_reserve_shared(ctrl_kv_cache *c, ctrl_kv_seq *s, int block);
/* Returns the sequence's blocks to the pool (shared blocks when their last user goes). */
void ctrl_kv_seq_release(ctrl_kv_cache *c, ctrl_kv_seq *s);
/* K (or V) of token `pos` of `s` in `layer`: n_kv_heads * head_dim values of the cache's dtype
 * (in the pools' memory: a device pointer for a device's cache). */
void *ctrl_kv_at(const ctrl_kv_cache *c, int v, int layer, const ctrl_kv_seq *s, int pos);
/* One layer's K (or V) pool: [n_blocks][block_size][n_kv_heads][head_dim]. */
void *ctrl_kv_layer(const ctrl_kv_cache *c, int v, int layer);
/* The row of token `pos` of `s` in a layer's pool (block * block_size + pos % block_size). */
int ctrl_kv_slot(const ctrl_kv_cache *c, const ctrl_kv_seq *s, int pos);

#endif
