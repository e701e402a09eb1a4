/* A string -> int32 hash map (FNV-1a, linear probing) for vocabularies of a few 100k entries. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_internal.h"

static uint64_t hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

int tok_map_init(tok_map *m, size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap *= 2;
    m->keys = calloc(cap, sizeof *m->keys);
    m->key_lens = calloc(cap, sizeof *m->key_lens);
    m->values = calloc(cap, sizeof *m->values);
    m->cap = cap;
    m->count = 0;
    return m->keys && m->key_lens && m->values ? 0 : -1;
}

void tok_map_free(tok_map *m) {
    for (size_t i = 0; m->keys && i < m->cap; i++) free(m->keys[i]);
    free(m->keys), free(m->key_lens), free(m->values);
    memset(m, 0, sizeof *m);
}

static int grow(tok_map *m) {
    tok_map bigger;
    if (tok_map_init(&bigger, m->cap) != 0) return -1;
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i]) {
            size_t j = hash(m->keys[i], m->key_lens[i]) & (bigger.cap - 1);
            while (bigger.keys[j]) j = (j + 1) & (bigger.cap - 1);
            bigger.keys[j] = m->keys[i], bigger.key_lens[j] = m->key_lens[i], bigger.values[j] = m->values[i];
            bigger.count++;
        }
    free(m->keys), free(m->key_lens), free(m->values);
    *m = bigger;
    return 0;
}

int tok_map_put(tok_map *m, const char *key, size_t len, int32_t value) {
    if ((m->count + 1) * 2 > m->cap && grow(m) != 0) return -1;
    size_t j = hash(key, len) & (m->cap - 1);
    while (m->keys[j]) {
        if (m->key_lens[j] == len && !memcmp(m->keys[j], key, len)) {
            m->values[j] = value;
            return 0;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->keys[j] = malloc(len + 1);
    if (!m->keys[j]) return -1;
    memcpy(m->keys[j], key, len);
    m->keys[j][len] = '\0';
    m->key_lens[j] = len;
    m->values[j] = value;
    m->count++;
    return 0;
}

int32_t tok_map_get(const tok_map *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    size_t j = hash(key, len) & (m->cap - 1);
    while (m->keys[j]) {
        if (m->key_lens[j] == len && !memcmp(m->keys[j], key, len)) return m->values[j];
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

/* Merge pairs: (id a, id b) -> rank, keys packed in 64 bits (no string compare), Fibonacci hashing
 * on the high bits; an all-ones key marks an empty slot (ids are non-negative). */
static size_t pair_slot(const tok_pair_map *m, uint64_t key) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - m->bits));
}

int tok_pairs_init(tok_pair_map *m, size_t expected) {
    m->bits = 4;
    while (((size_t)1 << m->bits) < expected * 2) m->bits++;
    m->cap = (size_t)1 << m->bits;
    m->keys = malloc(m->cap * sizeof *m->keys);
    m->values = malloc(m->cap * sizeof *m->values);
    if (!m->keys || !m->values) return -1;
    memset(m->keys, 0xFF, m->cap * sizeof *m->keys);
    return 0;
}

void tok_pairs_free(tok_pair_map *m) {
    free(m->keys), free(m->values);
    memset(m, 0, sizeof *m);
}

void tok_pairs_put(tok_pair_map *m, int32_t a, int32_t b, int32_t value) { /* capacity from init */
    const uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t j = pair_slot(m, key);
    while (m->keys[j] != UINT64_MAX && m->keys[j] != key) j = (j + 1) & (m->cap - 1);
    m->keys[j] = key, m->values[j] = value;
}

int32_t tok_pairs_get(const tok_pair_map *m, int32_t a, int32_t b) {
    const uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t j = pair_slot(m, key);; j = (j + 1) & (m->cap - 1)) {
        if (m->keys[j] == key) return m->values[j];
        if (m->keys[j] == UINT64_MAX) return -1;
    }
}
