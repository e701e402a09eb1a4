/* Encoding for SentencePiece-style BPE models (Llama-2, Mistral), one segment between raw-matched
 * added tokens at a time, in the `tokenizers` library's order: the normalizers (Llama-2: Prepend
 * "\u2581", Replace " " by "\u2581"), then the normalized=true added tokens split out of the
 * normalized text, then the Metaspace pre-tokenizer when there is one, then BPE with byte fallback
 * on each piece (without a pre-tokenizer a whole segment is one piece). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_internal.h"

static ctrl_status bpe_piece(const ctrl_tokenizer *t, const char *s, size_t n, int32_t **ids, size_t *n_ids,
                             size_t *cap) {
    if (n == 0) return CTRL_OK;
    int rc = tok_bpe(t, s, n, ids, n_ids, cap);
    if (rc == -3) return tok_interrupted();
    if (rc == -2)
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "%s: unk_token is not in the vocabulary (needed for a character outside it)",
                              t->path);
    return rc ? ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory") : CTRL_OK;
}

/* Metaspace: spaces become the meta character, which is prepended (scheme "always", or "first"
 * for the piece at the start of the text) unless already there; with split, the text is cut
 * before each meta character (MergedWithNext). */
static ctrl_status metaspace(const ctrl_tokenizer *t, const char *s, size_t n, int at_start, int32_t **ids,
                             size_t *n_ids, size_t *cap, size_t *pieces) {
    if (n == 0) return CTRL_OK;
    const size_t ml = strlen(t->meta);
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    char *buf = malloc(n + (spaces + 1) * ml + 1), *o = buf;
    if (!buf) return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
    const int starts_meta = n >= ml && !memcmp(s, t->meta, ml);
    const int starts_space = s[0] == ' ';
    if (!starts_meta && !starts_space &&
        (t->meta_prepend == TOK_META_ALWAYS || (t->meta_prepend == TOK_META_FIRST && at_start)))
        memcpy(o, t->meta, ml), o += ml;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ')
            memcpy(o, t->meta, ml), o += ml;
        else
            *o++ = s[i];
    }
    const size_t m = (size_t)(o - buf);
    ctrl_status st = CTRL_OK;
    if (!t->meta_split) {
        st = bpe_piece(t, buf, m, ids, n_ids, cap);
    } else {
        size_t piece = 0;
        for (size_t i = 1; i + ml <= m && st == CTRL_OK; i++)
            if (!memcmp(buf + i, t->meta, ml)) {
                st = bpe_piece(t, buf + piece, i - piece, ids, n_ids, cap), piece = i;
                if (st == CTRL_OK) st = tok_poll(pieces);
            }
        if (st == CTRL_OK) st = bpe_piece(t, buf + piece, m - piece, ids, n_ids, cap);
    }
    free(buf);
    return st;
}

static ctrl_status pre_tokenize(const ctrl_tokenizer *t, const char *s, size_t n, int at_start, int32_t **ids,
                                size_t *n_ids, size_t *cap, size_t *pieces) {
    return t->metaspace ? metaspace(t, s, n, at_start, ids, n_ids, cap, pieces)
                        : bpe_piece(t, s, n, ids, n_ids, cap);
}

ctrl_status tok_encode_sp(const ctrl_tokenizer *t, const char *s, size_t n, int at_start, int32_t **ids,
                          size_t *n_ids, size_t *cap, size_t *pieces) {
    if (n == 0) return CTRL_OK;
    size_t m;
    char *norm = tok_normalize(t, s, n, &m);
    if (!norm) return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
    ctrl_status st = CTRL_OK;
    size_t pos = 0;
    while (st == CTRL_OK && pos < m) {
        size_t b, e;
        int k = tok_find_added(t, norm, m, pos, 1, &b, &e);
        if (k < 0) {
            st = pre_tokenize(t, norm + pos, m - pos, at_start && pos == 0, ids, n_ids, cap, pieces);
            break;
        }
        st = pre_tokenize(t, norm + pos, b - pos, at_start && pos == 0, ids, n_ids, cap, pieces);
        if (st == CTRL_OK) st = tok_poll(pieces);
        if (st == CTRL_OK && *n_ids == *cap) {
            size_t c = *cap ? *cap * 2 : 64;
            int32_t *p = realloc(*ids, c * sizeof *p);
            if (!p) st = ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
            if (p) *ids = p, *cap = c;
        }
        if (st == CTRL_OK) (*ids)[(*n_ids)++] = t->added[k].id;
        pos = e;
    }
    free(norm);
    return st;
}
