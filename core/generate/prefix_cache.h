/* A prefix cache across requests (vLLM's automatic prefix caching): the full KV blocks of finished
 * prompts stay in the pool, found again by a hash of the whole token prefix they end, so a later
 * request with the same prefix (a system prompt, a few-shot header, a repeated prompt) skips their
 * prefill. The cache holds one reference per block; least recently used blocks go first when the
 * pool runs out. Entries are valid for the weights they were computed with: reset it when the
 * weights change. */
#ifndef CTRL_CORE_PREFIX_CACHE_H
#define CTRL_CORE_PREFIX_CACHE_H

#include <stdint.h>

#include "model/kv_cache.h"

typedef struct ctrl_prefix_cache ctrl_prefix_cache;

ctrl_prefix_cache *ctrl_prefix_cache_create(void);
void ctrl_prefix_cache_free(ctrl_prefix_cache *p, ctrl_kv_cache *kv);
/* `s` (empty) takes the cached blocks of the longest cached prefix of prompt[0, len) — whole
 * blocks, leaving at least one token to prefill; returns the tokens they hold (s->len). */
int ctrl_prefix_cache_attach(ctrl_prefix_cache *p, ctrl_kv_cache *kv, const int32_t *prompt, int len,
                             ctrl_kv_seq *s);
/* Records the full blocks of s's prompt (its first `len` tokens are cached). */
void ctrl_prefix_cache_insert(ctrl_prefix_cache *p, ctrl_kv_cache *kv, const int32_t *prompt, int len,
                              const ctrl_kv_seq *s);
/* Drops least recently used entries no sequence uses until `want` blocks are free; returns how many
 * it freed. */
int ctrl_prefix_cache_evict(ctrl_prefix_cache *p, ctrl_kv_cache *kv, int want);
void ctrl_prefix_cache_reset(ctrl_prefix_cache *p, ctrl_kv_cache *kv);
long ctrl_prefix_cache_hits(const ctrl_prefix_cache *p); /* blocks reused so far */

#endif
