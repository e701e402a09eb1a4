/* Encoding and decoding with a loaded tokenizer (see tokenizer.h): added tokens are split out
 * first (leftmost, longest), the text between them is normalized (NFC), cut by the pre-tokenizer
 * regex (matches and the gaps between them are pieces, as behavior "Isolated"), mapped to the
 * byte-level alphabet and run through BPE. Decoding maps the byte-level characters back to bytes
 * and repairs invalid UTF-8 the way Rust's from_utf8_lossy does. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

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
    if (tok_bpe(t, *scratch, k, &out->ids, &out->n, &out->cap) != 0)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: a byte-level character is missing from the vocabulary",
                              t->path);
    return CTRL_OK;
}

/* The Prepend / Replace normalizers, in file order (malloc'd result). */
static char *sp_normalize(const ctrl_tokenizer *t, const char *s, size_t n, size_t *out_n) {
    char *cur = malloc(n + 1);
    memcpy(cur, s, n);
    cur[n] = 0;
    size_t len = n;
    for (int k = 0; k < t->n_norm_ops && cur; k++) {
        const struct tok_norm_op *op = &t->norm_ops[k];
        const size_t la = strlen(op->a), lb = strlen(op->b);
        if (op->kind == 1) { /* Prepend: only to a non-empty string */
            if (len == 0) continue;
            char *p = malloc(len + la + 1);
            memcpy(p, op->a, la), memcpy(p + la, cur, len + 1);
            free(cur), cur = p, len += la;
            continue;
        }
        size_t hits = 0;
        for (size_t i = 0; i + la <= len;) i += memcmp(cur + i, op->a, la) == 0 ? (hits++, la) : 1;
        char *p = malloc(len + hits * lb + 1), *o = p;
        for (size_t i = 0; i < len;) {
            if (i + la <= len && memcmp(cur + i, op->a, la) == 0)
                memcpy(o, op->b, lb), o += lb, i += la;
            else
                *o++ = cur[i++];
        }
        *o = 0;
        free(cur), cur = p, len = (size_t)(o - p);
    }
    *out_n = len;
    return cur;
}

/* Text with no added token in it: normalize, pre-tokenize, BPE. */
static ctrl_status encode_plain(const ctrl_tokenizer *t, const char *s, size_t n, id_buf *out) {
    if (n == 0) return CTRL_OK;
    if (!t->byte_level) { /* SentencePiece-style: the normalized segment is one word */
        size_t m;
        char *norm = sp_normalize(t, s, n, &m);
        if (!norm) return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
        int rc = m ? tok_bpe(t, norm, m, &out->ids, &out->n, &out->cap) : 0;
        free(norm);
        return rc ? ctrl_error_set(CTRL_ERR_FORMAT, "%s: a character has no token, byte token or unk",
                                   t->path)
                  : CTRL_OK;
    }
    size_t m = n;
    char *norm = NULL;
    if (t->nfc) {
        norm = tok_nfc(s, n, &m);
        if (!norm) return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
        s = norm;
    }
    char *scratch = NULL;
    size_t scratch_cap = 0;
    ctrl_status st = CTRL_OK;
    if (!t->split) {
        st = encode_piece(t, s, m, out, &scratch, &scratch_cap);
    } else {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->split, NULL);
        size_t at = 0, gap = 0;
        while (st == CTRL_OK && at < m) {
            int rc = pcre2_match(t->split, (PCRE2_SPTR)s, m, at, 0, md, NULL);
            if (rc < 0) break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t b = ov[0], e = ov[1];
            if (b > gap) st = encode_piece(t, s + gap, b - gap, out, &scratch, &scratch_cap);
            if (st == CTRL_OK && e > b) st = encode_piece(t, s + b, e - b, out, &scratch, &scratch_cap);
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

/* The leftmost, longest added token at or after `from`; start and end include lstrip/rstrip
 * whitespace. Returns the index in t->added or -1. */
static int find_added(const ctrl_tokenizer *t, const char *s, size_t n, size_t from, size_t *start,
                      size_t *end) {
    for (size_t i = from; i < n; i++) {
        if (!t->added_first[(unsigned char)s[i]]) continue;
        int best = -1;
        for (int k = 0; k < t->n_added; k++) {
            const tok_added *a = &t->added[k];
            if (a->content[0] != s[i] || a->len > n - i || memcmp(s + i, a->content, a->len) != 0) continue;
            if (a->single_word && ((i > 0 && is_word_byte((unsigned char)s[i - 1])) ||
                                   (i + a->len < n && is_word_byte((unsigned char)s[i + a->len]))))
                continue;
            if (best < 0 || a->len > t->added[best].len) best = k;
        }
        if (best < 0) continue;
        const tok_added *a = &t->added[best];
        size_t b = i, e = i + a->len;
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
    size_t pos = 0;
    while (st == CTRL_OK && pos < len) {
        size_t b, e;
        int k = find_added(t, text, len, pos, &b, &e);
        if (k < 0) {
            st = encode_plain(t, text + pos, len - pos, &out);
            break;
        }
        st = encode_plain(t, text + pos, b - pos, &out);
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

static int is_special(const ctrl_tokenizer *t, int32_t id) {
    for (int a = 0; a < t->n_added; a++)
        if (t->added[a].id == id) return t->added[a].special;
    return 0;
}

/* SentencePiece decoding: "\u2581" -> " " per token, runs of <0xXX> byte tokens to their bytes when
 * those are valid UTF-8 (else one U+FFFD per byte), all fused, then `strip_start` leading spaces
 * removed. */
static ctrl_status decode_sp(const ctrl_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                             char **text, size_t *len) {
    size_t cap = 64, k = 0, nrun = 0, run_cap = 64;
    char *out = malloc(cap);
    unsigned char *run = malloc(run_cap);
    for (size_t j = 0; j <= n; j++) {
        int byte = -1;
        const char *tok = NULL;
        if (j < n) {
            if (ids[j] < 0 || ids[j] >= t->n_ids || !t->id_to_token[ids[j]]) continue;
            if (skip_special && is_special(t, ids[j])) continue;
            tok = t->id_to_token[ids[j]];
            if (strlen(tok) == 6 && !strncmp(tok, "<0x", 3) && tok[5] == '>') {
                int v = (int)strtol(tok + 3, NULL, 16);
                if (v >= 0 && v < 256 && t->byte_id[v] == ids[j]) byte = v;
            }
        }
        if (byte >= 0) {
            if (nrun == run_cap) run = realloc(run, run_cap *= 2);
            run[nrun++] = (unsigned char)byte;
            continue;
        }
        if (nrun) { /* flush the byte run */
            size_t ok = 0, bad = 0;
            for (size_t i = 0; i < nrun;) {
                size_t v = utf8_valid_len(run + i, nrun - i, &bad);
                if (!v || v > nrun - i) break;
                i += v, ok = i;
            }
            if (k + nrun * 3 + 8 > cap) out = realloc(out, cap = (k + nrun * 3 + 8) * 2);
            if (ok == nrun)
                memcpy(out + k, run, nrun), k += nrun;
            else
                for (size_t i = 0; i < nrun; i++) memcpy(out + k, "\xEF\xBF\xBD", 3), k += 3;
            nrun = 0;
        }
        if (!tok) continue;
        const size_t tl = strlen(tok);
        if (k + tl + 8 > cap) out = realloc(out, cap = (k + tl + 8) * 2);
        for (size_t i = 0; i < tl;) {
            if (i + 3 <= tl && !memcmp(tok + i, "\xE2\x96\x81", 3))
                out[k++] = ' ', i += 3;
            else
                out[k++] = tok[i++];
        }
    }
    size_t skip = 0;
    while ((int)skip < t->strip_start && skip < k && out[skip] == ' ') skip++;
    memmove(out, out + skip, k - skip);
    k -= skip;
    out[k] = 0;
    free(run);
    *text = out, *len = k;
    return CTRL_OK;
}

ctrl_status ctrl_tokenizer_decode(const ctrl_tokenizer *t, const int32_t *ids, size_t n,
                                  int skip_special_tokens, char **text, size_t *len) {
    if (t->sp_decoder) return decode_sp(t, ids, n, skip_special_tokens, text, len);
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
    for (size_t j = 0; j < n; j++) {
        if (ids[j] < 0 || ids[j] >= t->n_ids || !t->id_to_token[ids[j]])
            continue; /* unknown ids decode to nothing */
        const char *tok = t->id_to_token[ids[j]];
        if (skip_special_tokens && is_special(t, ids[j])) continue;
        size_t tl = strlen(tok);
        if (k + tl * 4 + 4 > cap) {
            cap = (k + tl * 4 + 4) * 2;
            bytes = realloc(bytes, cap);
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
