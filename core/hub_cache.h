/* Models named as the Hugging Face Hub names them ("Qwen/Qwen2.5-0.5B", optionally "@REVISION"),
 * found in the local Hugging Face cache with no network, as transformers does offline: the cache is
 * $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 * ~/.cache/huggingface/hub; models--ORG--NAME/refs/REVISION (main by default) holds a commit hash
 * and snapshots/HASH is the model directory (a revision may also be the hash itself). */
#ifndef CTRL_HUB_CACHE_H
#define CTRL_HUB_CACHE_H

#include <stddef.h>

#include <ctrl/status.h>

/* 1 when `s` has a Hub id's shape: NAME or ORG/NAME (letters, digits, '-', '_', '.'; not starting
 * with '.' or '-'), with an optional @REVISION. */
int ctrl_hub_looks_like_id(const char *s);
/* The snapshot directory of Hub id `id` in the local cache, or CTRL_ERR_IO with a message naming
 * the places looked in. */
ctrl_status ctrl_hub_snapshot(const char *id, char *out, size_t cap);
/* The same for a dataset repository: datasets--ORG--NAME in the same cache. */
ctrl_status ctrl_hub_dataset_snapshot(const char *id, char *out, size_t cap);
/* `path` itself when it exists or is no Hub id; else the cached snapshot written to buf, or `path`
 * (unchanged) when the cache does not have it either -- the loader then says what was looked for. */
const char *ctrl_hub_resolve(const char *path, char *buf, size_t cap);

#endif
