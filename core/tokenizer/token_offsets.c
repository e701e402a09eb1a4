/* Token offsets for byte-level BPE: every character of the byte-level alphabet stands for one byte
 * of the text, and added tokens stand for their content. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/token_offsets.h"
#include "tokenizer/tokenizer_internal.h"

ctrl_status ctrl_tokenizer_token_starts(const ctrl_tokenizer *t, const int32_t *ids, size_t n,
                                        size_t *starts) {
    if (!t->byte_level || t->n_norm_ops > t->nfc) /* NFC is the one normalizer mapped back */
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "%s: token offsets (assistant masks) need a byte-level BPE tokenizer with no "
                              "normalizer but NFC",
                              t->path);
    size_t at = 0;
    for (size_t k = 0; k < n; k++) {
        starts[k] = at;
        if (ids[k] < 0 || ids[k] >= t->n_ids || !t->id_to_token[ids[k]])
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: token id %d is not in the vocabulary", t->path,
                                  ids[k]);
        const char *s = t->id_to_token[ids[k]];
        size_t len = strlen(s), bytes = 0;
        int added = 0;
        for (int a = 0; a < t->n_added && !added; a++) added = t->added[a].id == ids[k];
        if (added) {
            bytes = len;
        } else {
            for (size_t i = 0; i < len; i++) bytes += ((unsigned char)s[i] & 0xC0) != 0x80;
        }
        at += bytes;
    }
    starts[n] = at;
    return CTRL_OK;
}

size_t ctrl_tokenizer_normalized_offset(const ctrl_tokenizer *t, const char *text, size_t at) {
    if (!t->nfc) return at;
    size_t n;
    char *norm = tok_nfc(text, at, &n);
    if (!norm) return at; /* out of memory: the unnormalized offset */
    free(norm);
    return n;
}
