/* The paged KV cache's block pool and block tables. */
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"
#include "model/kv_cache.h"

ctrl_status ctrl_kv_cache_create(int n_layers, int n_kv_heads, int head_dim, int block_size, size_t bytes,
                                 ctrl_dtype dtype, ctrl_kv_cache **out) {
    return ctrl_kv_cache_create_on(NULL, n_layers, n_kv_heads, head_dim, block_size, bytes, dtype, out);
}

ctrl_status ctrl_kv_cache_create_on(const ctrl_backend_ops *be, int n_layers, int n_kv_heads, int head_dim,
                                    int block_size, size_t bytes, ctrl_dtype dtype, ctrl_kv_cache **out) {
    if (be && be->host_memory) be = NULL;
    if (dtype != CTRL_F32 && dtype != CTRL_BF16)
        return ctrl_error_set(CTRL_ERR_CONFIG, "kv cache: dtype %s (fp32 or bf16)", ctrl_dtype_name(dtype));
    const size_t elt = ctrl_dtype_size(dtype);
    const size_t per_block = 2 * elt * (size_t)n_layers * block_size * n_kv_heads * head_dim;
    size_t n = bytes / per_block;
    if (n < 1) n = 1;
    if (n > 1 << 24) return ctrl_error_set(CTRL_ERR_CONFIG, "kv cache: %zu blocks is too many", n);
    ctrl_kv_cache *c = calloc(1, sizeof *c);
    const size_t floats = (size_t)n_layers * n * block_size * n_kv_heads * head_dim;
    if (c) {
        *c = (ctrl_kv_cache){.be = be,
                             .n_layers = n_layers,
                             .n_kv_heads = n_kv_heads,
                             .head_dim = head_dim,
                             .block_size = block_size,
                             .n_blocks = (int)n,
                             .dtype = dtype,
                             .elt = elt};
        if (be) { /* a device's pools; a failure leaves NULL for ctrl_kv_cache_free */
            if (be->alloc(&c->k, elt * floats) != CTRL_OK) c->k = NULL;
            if (c->k && be->alloc(&c->v, elt * floats) != CTRL_OK) c->v = NULL;
        } else {
            c->k = malloc(elt * floats), c->v = malloc(elt * floats);
        }
        c->refcount = calloc(n, sizeof(int)), c->free_list = malloc(sizeof(int) * n);
    }
    if (!c || !c->k || !c->v || !c->refcount || !c->free_list) {
        ctrl_kv_cache_free(c);
        return ctrl_error_set(CTRL_ERR_NOMEM, "kv cache: %zu blocks of %d tokens (%zu bytes) on %s", n,
                              block_size, 2 * elt * floats, be ? be->name : "the host");
    }
    for (int b = (int)n - 1; b >= 0; b--) c->free_list[c->n_free++] = b; /* block 0 handed out first */
    *out = c;
    return CTRL_OK;
}

void ctrl_kv_cache_free(ctrl_kv_cache *c) {
    if (!c) return;
    if (c->be)
        c->be->free(c->k), c->be->free(c->v);
    else
        free(c->k), free(c->v);
    free(c->refcount), free(c->free_list);
    free(c);
}

ctrl_status ctrl_kv_seq_reserve(ctrl_kv_cache *c, ctrl_kv_seq *s, int len) {
    const int need = (len + c->block_size - 1) / c->block_size;
    if (need - s->n_blocks > c->n_free)
        return ctrl_error_set(CTRL_ERR_NOMEM, "kv cache: %d blocks needed, %d free", need - s->n_blocks,
                              c->n_free);
    if (need > s->cap) {
        int cap = s->cap ? s->cap : 4;
        while (cap < need) cap *= 2;
        int *b = realloc(s->blocks, sizeof(int) * (size_t)cap);
        if (!b) return ctrl_error_set(CTRL_ERR_NOMEM, "kv cache: block table");
        s->blocks = b, s->cap = cap;
    }
    while (s->n_blocks < need) {
        const int b = c->free_list[--c->n_free];
        c->refcount[b] = 1;
        s->blocks[s->n_blocks++] = b;
    }
    return CTRL_OK;
}

ctrl_status ctrl_kv_seq_reserve_shared(ctrl_kv_cache *c, ctrl_kv_seq *s, int block) {
    if (s->n_blocks == s->cap) {
        int cap = s->cap ? 2 * s->cap : 4;
        int *b = realloc(s->blocks, sizeof(int) * (size_t)cap);
        if (!b) return ctrl_error_set(CTRL_ERR_NOMEM, "kv cache: block table");
        s->blocks = b, s->cap = cap;
    }
    c->refcount[block]++;
    s->blocks[s->n_blocks++] = block;
    return CTRL_OK;
}

void ctrl_kv_seq_release(ctrl_kv_cache *c, ctrl_kv_seq *s) {
    for (int i = 0; i < s->n_blocks; i++)
        if (--c->refcount[s->blocks[i]] == 0) c->free_list[c->n_free++] = s->blocks[i];
    free(s->blocks);
    *s = (ctrl_kv_seq){0};
}

void *ctrl_kv_at(const ctrl_kv_cache *c, int v, int layer, const ctrl_kv_seq *s, int pos) {
    const size_t slot = (size_t)c->n_kv_heads * c->head_dim;
    const size_t block = s->blocks[pos / c->block_size];
    const size_t off = (((size_t)layer * c->n_blocks + block) * c->block_size + pos % c->block_size) * slot;
    return (char *)(v ? c->v : c->k) + off * c->elt;
}

int ctrl_kv_slot(const ctrl_kv_cache *c, const ctrl_kv_seq *s, int pos) {
    return s->blocks[pos / c->block_size] * c->block_size + pos % c->block_size;
}

void *ctrl_kv_layer(const ctrl_kv_cache *c, int v, int layer) {
    const size_t per_layer = (size_t)c->n_blocks * c->block_size * c->n_kv_heads * c->head_dim;
    return (char *)(v ? c->v : c->k) + (size_t)layer * per_layer * c->elt;
}

ctrl_status ctrl_kv_seq_fork(ctrl_kv_cache *c, const ctrl_kv_seq *src, ctrl_kv_seq *dst, int *shared) {
    const int full = src->len / c->block_size, partial = src->len % c->block_size != 0;
    if (partial && c->n_free == 0) return ctrl_error_set(CTRL_ERR_NOMEM, "kv cache: no block to fork into");
    dst->cap = src->n_blocks > 4 ? src->n_blocks : 4;
    dst->blocks = malloc(sizeof(int) * (size_t)dst->cap);
    if (!dst->blocks) return ctrl_error_set(CTRL_ERR_NOMEM, "kv cache: block table");
    for (int i = 0; i < full; i++) dst->blocks[i] = src->blocks[i], c->refcount[src->blocks[i]]++;
    dst->n_blocks = full, dst->len = src->len;
    if (partial) { /* copy-on-fork of the block both would append to */
        const int b = c->free_list[--c->n_free], from = src->blocks[full];
        c->refcount[b] = 1;
        dst->blocks[dst->n_blocks++] = b;
        const size_t block = (size_t)c->block_size * c->n_kv_heads * c->head_dim * c->elt;
        for (int l = 0; l < c->n_layers; l++)
            for (int kv = 0; kv < 2; kv++) {
                char *pool = ctrl_kv_layer(c, kv, l);
                if (c->be) { /* on the device: a device-to-device copy */
                    const ctrl_status st =
                        c->be->copy(pool + (size_t)b * block, pool + (size_t)from * block, block);
                    if (st != CTRL_OK) {
                        ctrl_kv_seq_release(c, dst); /* its blocks back to the pool */
                        return ctrl_error_wrap(st, "kv cache: copying a block on %s", c->be->name);
                    }
                } else {
                    memcpy(pool + (size_t)b * block, pool + (size_t)from * block, block);
                }
            }
    }
    if (shared) *shared = full;
    return CTRL_OK;
}
