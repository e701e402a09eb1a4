/* See prefix_cache.h. Entries are few (one per cached block), so lookups scan a flat array. */
#include <stdlib.h>
#include <string.h>

#include "generate/prefix_cache.h"

typedef struct entry {
    uint64_t hash; /* of every token up to the end of this block */
    int block;
    long used; /* tick of the last lookup that hit it */
} entry;

struct ctrl_prefix_cache {
    entry *e;
    int n, cap;
    long tick, hits;
};

/* FNV-1a over a block's tokens, chained from the previous block's hash. */
static uint64_t chain(uint64_t h, const int32_t *t, int n) {
    for (int i = 0; i < n; i++) {
        uint32_t x = (uint32_t)t[i];
        for (int b = 0; b < 4; b++) h = (h ^ ((x >> (8 * b)) & 0xff)) * 1099511628211ull;
    }
    return h;
}

static entry *find(ctrl_prefix_cache *p, uint64_t h) {
    for (int i = 0; i < p->n; i++)
        if (p->e[i].hash == h) return &p->e[i];
    return NULL;
}

ctrl_prefix_cache *ctrl_prefix_cache_create(void) { return calloc(1, sizeof(ctrl_prefix_cache)); }

int ctrl_prefix_cache_attach(ctrl_prefix_cache *p, ctrl_kv_cache *kv, const int32_t *prompt, int len,
                             ctrl_kv_seq *s) {
    const int bs = kv->block_size, max_blocks = (len - 1) / bs; /* one token is always prefilled */
    uint64_t h = 14695981039346656037ull;
    int n = 0;
    p->tick++;
    for (; n < max_blocks; n++) {
        h = chain(h, prompt + (size_t)n * bs, bs);
        entry *e = find(p, h);
        if (!e) break;
        if (ctrl_kv_seq_reserve_shared(kv, s, e->block) != CTRL_OK) break;
        e->used = p->tick;
    }
    p->hits += n;
    s->len = n * bs;
    return s->len;
}

void ctrl_prefix_cache_insert(ctrl_prefix_cache *p, ctrl_kv_cache *kv, const int32_t *prompt, int len,
                              const ctrl_kv_seq *s) {
    const int bs = kv->block_size, full = len / bs;
    uint64_t h = 14695981039346656037ull;
    p->tick++;
    for (int b = 0; b < full && b < s->n_blocks; b++) {
        h = chain(h, prompt + (size_t)b * bs, bs);
        entry *e = find(p, h);
        if (e) {
            e->used = p->tick;
            continue;
        }
        if (p->n == p->cap) {
            entry *g = realloc(p->e, sizeof *g * (size_t)(p->cap = p->cap ? 2 * p->cap : 64));
            if (!g) return;
            p->e = g;
        }
        kv->refcount[s->blocks[b]]++; /* the cache's own reference */
        p->e[p->n++] = (entry){.hash = h, .block = s->blocks[b], .used = p->tick};
    }
}

static void drop(ctrl_prefix_cache *p, ctrl_kv_cache *kv, int i) {
    const int b = p->e[i].block;
    if (--kv->refcount[b] == 0) kv->free_list[kv->n_free++] = b;
    p->e[i] = p->e[--p->n];
}

int ctrl_prefix_cache_evict(ctrl_prefix_cache *p, ctrl_kv_cache *kv, int want) {
    int freed = 0;
    while (kv->n_free < want) {
        int lru = -1;
        for (int i = 0; i < p->n; i++) /* only blocks no running sequence shares */
            if (kv->refcount[p->e[i].block] == 1 && (lru < 0 || p->e[i].used < p->e[lru].used)) lru = i;
        if (lru < 0) break;
        drop(p, kv, lru);
        freed++;
    }
    return freed;
}

void ctrl_prefix_cache_reset(ctrl_prefix_cache *p, ctrl_kv_cache *kv) {
    while (p->n > 0) {
        if (kv)
            drop(p, kv, p->n - 1);
        else
            p->n--;
    }
}

void ctrl_prefix_cache_free(ctrl_prefix_cache *p, ctrl_kv_cache *kv) {
    if (!p) return;
    ctrl_prefix_cache_reset(p, kv);
    free(p->e);
    free(p);
}

long ctrl_prefix_cache_hits(const ctrl_prefix_cache *p) { return p ? p->hits : 0; }
