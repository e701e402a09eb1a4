/* Encoding and decoding with a loaded tokenizer (see tokenizer.h): added tokens are split out
 * first (leftmost, longest), the text between them is normalized (NFC), cut by the pre-tokenizer
 * regex (matches and the gaps between them are pieces, as behavior "Isolated"), mapped to the
 * byte-level alphabet and run through BPE; SentencePiece-style models take the segments between
 * added tokens to sp_encode.c instead. Byte-level decoding maps the byte-level characters back to
 * bytes and repairs invalid UTF-8 the way Rust's from_utf8_lossy does; other decoders are in
 * decode_chain.c. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "interrupt.h"
#include "tokenizer/tokenizer_internal.h"

typedef struct id_buf {
    int32_t *ids;
    size_t n, cap;
} id_buf;

static int push_id(id_buf *b, int32_t id) {
    if (b->n == b->cap) {
        size_t c = b->cap ? b->cap * 2 : 256;
        int32_t *p = realloc(b->ids, c * sizeof *p);
        if (!p) return -1;
        b->ids = p, b->cap = c;
    }
    b->ids[b->n++] = id;
    return 0;
}

/* One pre-token: bytes -> byte-level characters -> BPE. */
static ctrl_status encode_piece(const ctrl_tokenizer *t, const char *s, size_t n, id_buf *out, char **scratch,
                                size_t *scratch_cap) {
    if (n * 2 + 1 > *scratch_cap) {
        *scratch_cap = n * 2 + 64;
        char *p = realloc(*scratch, *scratch_cap);
        if (!p) return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
        *scratch = p;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        memcpy(*scratch + k, t->byte_char[c], t->byte_char_len[c]);
        k += t->byte_char_len[c];
    }
    const int rc = tok_bpe(t, *scratch, k, &out->ids, &out->n, &out->cap);
    if (rc == -3) return tok_interrupted();
    if (rc != 0)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: a byte-level character is missing from the vocabulary",
                              t->path);
    return CTRL_OK;
}

ctrl_status tok_interrupted(void) { return ctrl_error_set(CTRL_ERR_INTERRUPTED, "tokenizer: interrupted"); }

ctrl_status tok_poll(size_t *pieces) {
    return ++*pieces % TOK_POLL_PIECES == 0 && ctrl_interrupt_requested() ? tok_interrupted() : CTRL_OK;
}

/* Text with no added token in it: normalize, pre-tokenize, BPE. */
static ctrl_status encode_plain(const ctrl_tokenizer *t, const char *s, size_t n, id_buf *out,
                                size_t *pieces) {
    if (n == 0) return CTRL_OK;
    size_t m = n;
    char *norm = NULL;
    if (t->n_norm_ops) {
        norm = tok_normalize(t, s, n, &m);
        if (!norm) return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
        s = norm;
    }
    char *scratch = NULL;
    size_t scratch_cap = 0;
    ctrl_status st = CTRL_OK;
    /* PCRE2 checks a UTF subject's validity from the start offset to the end on every call (which
     * made a line's pre-tokenization quadratic): check it once here, then match without the check.
     * Invalid UTF-8 (which PCRE2 refuses, and Rust strings cannot hold) stays one piece. */
    if (!t->split || !tok_utf8_valid(s, m)) {
        st = encode_piece(t, s, m, out, &scratch, &scratch_cap);
    } else {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->split, NULL);
        if (!md) st = ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
        size_t at = 0, gap = 0;
        while (st == CTRL_OK && at < m) {
            int rc = pcre2_match(t->split, (PCRE2_SPTR)s, m, at, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) { /* e.g. the match limit: a regex from the file that backtracks without end */
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(rc, msg, sizeof msg);
                st = ctrl_error_set(CTRL_ERR_FORMAT,
                                    "%s: the pre-tokenizer regex failed at byte %zu of a text: %s", t->path,
                                    at, (const char *)msg);
                break;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t b = ov[0], e = ov[1];
            if (b > gap) st = encode_piece(t, s + gap, b - gap, out, &scratch, &scratch_cap);
            if (st == CTRL_OK && e > b) st = encode_piece(t, s + b, e - b, out, &scratch, &scratch_cap);
            if (st == CTRL_OK) st = tok_poll(pieces);
            if (e == b) { /* an empty match: step over one character */
                size_t next = b;
                tok_utf8_decode(s, m, &next);
                e = next;
                gap = b;
            } else {
                gap = e;
            }
            at = e;
        }
        if (st == CTRL_OK && gap < m) st = encode_piece(t, s + gap, m - gap, out, &scratch, &scratch_cap);
        pcre2_match_data_free(md);
    }
    free(scratch);
    free(norm);
    return st;
}

static int is_word_byte(unsigned char c) { return isalnum(c) || c == '_' || c >= 0x80; }

int tok_find_added(const ctrl_tokenizer *t, const char *s, size_t n, size_t from, int normalized,
                   size_t *start, size_t *end) {
    if (normalized && !t->n_norm_added) return -1;
    for (size_t i = from; i < n; i++) {
        if (!t->added_first[normalized][(unsigned char)s[i]]) continue;
        int best = -1;
        size_t best_len = 0;
        for (int k = 0; k < t->n_added; k++) {
            const tok_added *a = &t->added[k];
            if (!a->norm_content != !normalized) continue;
            const char *c = normalized ? a->norm_content : a->content;
            const size_t len = normalized ? a->norm_len : a->len;
            if (c[0] != s[i] || len > n - i || memcmp(s + i, c, len) != 0) continue;
            if (a->single_word && ((i > 0 && is_word_byte((unsigned char)s[i - 1])) ||
                                   (i + len < n && is_word_byte((unsigned char)s[i + len]))))
                continue;
            if (best < 0 || len > best_len) best = k, best_len = len;
        }
        if (best < 0) continue;
        const tok_added *a = &t->added[best];
        size_t b = i, e = i + best_len;
        if (a->lstrip)
            while (b > from && isspace((unsigned char)s[b - 1])) b--;
        if (a->rstrip)
            while (e < n && isspace((unsigned char)s[e])) e++;
        *start = b, *end = e;
        return best;
    }
    return -1;
}

ctrl_status ctrl_tokenizer_encode(const ctrl_tokenizer *t, const char *text, size_t len,
                                  int add_special_tokens, int32_t **ids, size_t *n_ids) {
    id_buf out = {0};
    ctrl_status st = CTRL_OK;
    if (add_special_tokens && t->add_bos && push_id(&out, t->bos_id) != 0) st = CTRL_ERR_NOMEM;
    size_t pos = 0, pieces = 0;
    while (st == CTRL_OK && pos < len) {
        size_t b, e;
        int k = tok_find_added(t, text, len, pos, 0, &b, &e);
        const size_t end = k < 0 ? len : b;
        st = t->byte_level
                 ? encode_plain(t, text + pos, end - pos, &out, &pieces)
                 : tok_encode_sp(t, text + pos, end - pos, pos == 0, &out.ids, &out.n, &out.cap, &pieces);
        if (st == CTRL_OK) st = tok_poll(&pieces);
        if (k < 0) break;
        if (st == CTRL_OK && push_id(&out, t->added[k].id) != 0) st = CTRL_ERR_NOMEM;
        pos = e;
    }
    if (st != CTRL_OK) {
        free(out.ids);
        if (st == CTRL_ERR_NOMEM) return ctrl_error_set(st, "tokenizer: out of memory");
        return st;
    }
    *ids = out.ids ? out.ids : malloc(sizeof(int32_t));
    *n_ids = out.n;
    return CTRL_OK;
}

/* Length of the valid UTF-8 sequence at s (0 when the first byte cannot start one); *bad gets
 * the length of the maximal invalid prefix otherwise (Rust's from_utf8_lossy unit of repair). */
static size_t utf8_valid_len(const unsigned char *s, size_t n, size_t *bad) {
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c >= 0xE0 && c <= 0xEF)
        need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else {
        *bad = 1;
        return 0;
    }
    size_t k = 1;
    for (; k <= need; k++) {
        if (k >= n) break;
        unsigned char lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xBF;
        if (s[k] < lo_k || s[k] > hi_k) break;
    }
    if (k == need + 1) return need + 1;
    *bad = k;
    return 0;
}

int tok_is_special(const ctrl_tokenizer *t, int32_t id) {
    for (int a = 0; a < t->n_added; a++)
        if (t->added[a].id == id) return t->added[a].special;
    return 0;
}

ctrl_status ctrl_tokenizer_decode(const ctrl_tokenizer *t, const int32_t *ids, size_t n,
                                  int skip_special_tokens, char **text, size_t *len) {
    if (t->decoder_chain) return tok_decode_chain(t, ids, n, skip_special_tokens, text, len);
    /* Byte-level characters back to bytes: code points below 324 cover the whole alphabet. */
    int16_t char_byte[324];
    for (int i = 0; i < 324; i++) char_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        size_t i = 0;
        uint32_t cp = tok_utf8_decode(t->byte_char[b], t->byte_char_len[b], &i);
        char_byte[cp] = (int16_t)b;
    }
    size_t cap = 64, k = 0;
    unsigned char *bytes = malloc(cap);
    if (!bytes) return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t j = 0; j < n; j++) {
        if (ids[j] < 0 || ids[j] >= t->n_ids || !t->id_to_token[ids[j]])
            continue; /* unknown ids decode to nothing */
        const char *tok = t->id_to_token[ids[j]];
        if (skip_special_tokens && tok_is_special(t, ids[j])) continue;
        size_t tl = strlen(tok);
        if (k + tl * 4 + 4 > cap) {
            cap = (k + tl * 4 + 4) * 2;
            unsigned char *p = realloc(bytes, cap);
            if (!p) {
                free(bytes);
                return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
            }
            bytes = p;
        }
        /* Each character through the alphabet; a token with a character outside it is kept raw. */
        size_t start = k, i = 0;
        int raw = 0;
        while (i < tl) {
            uint32_t cp = tok_utf8_decode(tok, tl, &i);
            if (cp >= 324 || char_byte[cp] < 0) {
                raw = 1;
                break;
            }
            bytes[k++] = (unsigned char)char_byte[cp];
        }
        if (raw) {
            k = start;
            memcpy(bytes + k, tok, tl);
            k += tl;
        }
    }
    /* Lossy UTF-8: each maximal invalid prefix becomes U+FFFD. */
    char *out = malloc(k * 3 + 1);
    if (!out) {
        free(bytes);
        return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t o = 0;
    for (size_t i = 0; i < k;) {
        size_t bad = 0, v = utf8_valid_len(bytes + i, k - i, &bad);
        if (v) {
            memcpy(out + o, bytes + i, v);
            o += v, i += v;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3, i += bad;
        }
    }
    out[o] = '\0';
    free(bytes);
    *text = out;
    *len = o;
    return CTRL_OK;
}

int ctrl_tokenizer_vocab_size(const ctrl_tokenizer *t) { return t->n_ids; }

int32_t ctrl_tokenizer_token_to_id(const ctrl_tokenizer *t, const char *token) {
    for (int i = 0; i < t->n_added; i++)
        if (!strcmp(t->added[i].content, token)) return t->added[i].id;
    return tok_map_get(&t->vocab, token, strlen(token));
}

const char *ctrl_tokenizer_id_to_token(const ctrl_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids ? t->id_to_token[id] : NULL;
}

int32_t ctrl_tokenizer_bos_id(const ctrl_tokenizer *t) { return t->bos_id; }
int32_t ctrl_tokenizer_eos_id(const ctrl_tokenizer *t) { return t->eos_id; }
int32_t ctrl_tokenizer_pad_id(const ctrl_tokenizer *t) { return t->pad_id; }
const char *ctrl_tokenizer_chat_template(const ctrl_tokenizer *t) { return t->chat_template; }
