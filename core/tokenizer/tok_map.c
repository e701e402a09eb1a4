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
