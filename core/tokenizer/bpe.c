/* Byte-pair encoding of one pre-token: start from its characters' ids and repeatedly merge the
 * adjacent pair of lowest merge rank (leftmost first among equals), as the `tokenizers` library's
 * BPE model does without dropout. With ignore_merges (Llama-3), a word that is itself in the
 * vocabulary is taken whole. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_internal.h"

static int push(int32_t **ids, size_t *n, size_t *cap, int32_t id) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        int32_t *p = realloc(*ids, c * sizeof *p);
        if (!p) return -1;
        *ids = p, *cap = c;
    }
    (*ids)[(*n)++] = id;
    return 0;
}

static int32_t merge_rank(const ctrl_tokenizer *t, int32_t a, int32_t b) {
    int32_t key[2] = {a, b};
    return tok_map_get(&t->merges, (const char *)key, sizeof key);
}

int tok_bpe(const ctrl_tokenizer *t, const char *word, size_t len, int32_t **ids, size_t *n, size_t *cap) {
    if (t->ignore_merges) {
        int32_t whole = tok_map_get(&t->vocab, word, len);
        if (whole >= 0) return push(ids, n, cap, whole);
    }
    /* at most one symbol per byte (byte fallback) */
    int32_t local[64], *sym = len <= 64 ? local : malloc(sizeof(int32_t) * len);
    if (!sym) return -1;
    size_t k = 0;
    int prev_unk = 0;
    for (size_t i = 0; i < len;) {
        size_t start = i;
        tok_utf8_decode(word, len, &i);
        int32_t id = tok_map_get(&t->vocab, word + start, i - start);
        int ok = id >= 0;
        if (!ok && t->byte_fallback) { /* one <0xXX> token per byte, when all exist (as `tokenizers`) */
            ok = 1;
            for (size_t b = start; b < i; b++) ok &= t->byte_id[(unsigned char)word[b]] >= 0;
            for (size_t b = start; ok && b < i; b++) sym[k++] = t->byte_id[(unsigned char)word[b]];
            if (ok) {
                prev_unk = 0;
                continue;
            }
        }
        if (!ok && t->unk_id >= 0) {
            if (!(t->fuse_unk && prev_unk)) sym[k++] = t->unk_id;
            prev_unk = 1;
            continue;
        }
        if (!ok) {
            if (sym != local) free(sym);
            return -1;
        }
        sym[k++] = id, prev_unk = 0;
    }
    while (k > 1) {
        int32_t best = INT32_MAX;
        size_t at = 0;
        for (size_t i = 0; i + 1 < k; i++) {
            int32_t r = merge_rank(t, sym[i], sym[i + 1]);
            if (r >= 0 && r < best) best = r, at = i;
        }
        if (best == INT32_MAX) break;
        sym[at] = t->merge_result[best];
        memmove(sym + at + 1, sym + at + 2, sizeof(int32_t) * (k - at - 2));
        k--;
    }
    int rc = 0;
    for (size_t i = 0; i < k && rc == 0; i++) rc = push(ids, n, cap, sym[i]);
    if (sym != local) free(sym);
    return rc;
}
