/* Decoders other than ByteLevel, as the `tokenizers` library chains them over the list of token
 * strings (then joined with nothing): Replace of a literal string in each token, ByteFallback
 * (runs of <0xXX> tokens become their bytes when those are valid UTF-8, else one U+FFFD per
 * token), Fuse (all tokens into one), Strip (up to `start` leading and `stop` trailing copies of a
 * character, per token) and Metaspace (the meta character becomes a space, and is dropped from the
 * first token unless prepend_scheme is "never"). Llama-2's decoder is Sequence [Replace "\u2581"
 * by " ", ByteFallback, Fuse, Strip(" ", 1, 0)]. Without a decoder the tokens are joined with
 * spaces, as the library does. Normalized added tokens enter the chain in their normalized form
 * (the library's normalized_cache). */
#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "hex_digit.h"
#include "tokenizer/tokenizer_internal.h"

/* One UTF-8 character (what Rust's `char` fields hold). */
static int one_char(const char *s) {
    if (!s || !s[0]) return 0;
    size_t i = 0, n = strlen(s);
    tok_utf8_decode(s, n, &i);
    return i == n;
}

static ctrl_status add_op(ctrl_tokenizer *t, struct tok_dec_op op) {
    if (t->n_dec_ops == (int)(sizeof t->dec_ops / sizeof t->dec_ops[0])) {
        free(op.a), free(op.b);
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: decoder: too many parts", t->path);
    }
    t->dec_ops[t->n_dec_ops++] = op;
    return CTRL_OK;
}

ctrl_status tok_load_decoder_chain(ctrl_tokenizer *t, const cJSON *d) {
    const char *type = tok_json_str(d, "type");
    t->decoder_chain = 1;
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        if (!cJSON_IsArray(list))
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: decoder Sequence without a decoders list", t->path);
        for (const cJSON *e = list->child; e; e = e->next) {
            ctrl_status st = tok_load_decoder_chain(t, e);
            if (st != CTRL_OK) return st;
        }
        return CTRL_OK;
    }
    if (type && !strcmp(type, "Replace")) {
        const char *from = tok_json_str(cJSON_GetObjectItemCaseSensitive(d, "pattern"), "String");
        const char *to = tok_json_str(d, "content");
        if (!from || !from[0] || !to)
            return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                                  "%s: decoder Replace: only a literal String pattern is supported", t->path);
        return add_op(t, (struct tok_dec_op){TOK_DEC_REPLACE, strdup(from), strdup(to), 0, 0});
    }
    if (type && !strcmp(type, "ByteFallback"))
        return add_op(t, (struct tok_dec_op){TOK_DEC_BYTE_FALLBACK, NULL, NULL, 0, 0});
    if (type && !strcmp(type, "Fuse")) return add_op(t, (struct tok_dec_op){TOK_DEC_FUSE, NULL, NULL, 0, 0});
    if (type && !strcmp(type, "Strip")) {
        const char *content = tok_json_str(d, "content");
        const cJSON *start = cJSON_GetObjectItemCaseSensitive(d, "start"),
                    *stop = cJSON_GetObjectItemCaseSensitive(d, "stop");
        if (!one_char(content) || !cJSON_IsNumber(start) || !cJSON_IsNumber(stop) || start->valuedouble < 0 ||
            stop->valuedouble < 0 || start->valuedouble > 1e6 || stop->valuedouble > 1e6)
            return ctrl_error_set(CTRL_ERR_FORMAT,
                                  "%s: decoder Strip needs a one-character content, start, stop", t->path);
        return add_op(
            t, (struct tok_dec_op){TOK_DEC_STRIP, strdup(content), NULL, start->valueint, stop->valueint});
    }
    if (type && !strcmp(type, "Metaspace")) {
        int scheme, split;
        char meta[5];
        ctrl_status st = tok_load_meta(t, d, &scheme, &split, meta);
        if (st != CTRL_OK) return st;
        return add_op(t, (struct tok_dec_op){TOK_DEC_METASPACE, strdup(meta), NULL, scheme, 0});
    }
    return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                          "%s: decoder '%s' is not supported (ByteLevel alone; Replace, ByteFallback, Fuse, "
                          "Strip, Metaspace, alone or in a Sequence)",
                          t->path, type ? type : "?");
}

/* A list of strings in one buffer: token k is buf[off[k] .. off[k + 1]). */
typedef struct tok_list {
    char *buf;
    size_t len, cap, *off, n, off_cap;
    int oom;
} tok_list;

static void tl_bytes(tok_list *l, const char *s, size_t n) {
    if (l->len + n + 1 > l->cap) {
        size_t c = (l->len + n + 1) * 2;
        char *p = realloc(l->buf, c);
        if (!p) {
            l->oom = 1;
            return;
        }
        l->buf = p, l->cap = c;
    }
    if (n) memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void tl_end_token(tok_list *l) { /* the token is what was written since the last end */
    if (!l->buf) tl_bytes(l, NULL, 0);  /* a list of empty tokens still has a buffer to point into */
    if (l->n + 2 > l->off_cap) {
        size_t c = (l->n + 2) * 2;
        size_t *p = realloc(l->off, c * sizeof *p);
        if (!p) {
            l->oom = 1;
            return;
        }
        if (!l->off_cap) p[0] = 0;
        l->off = p, l->off_cap = c;
    }
    l->off[++l->n] = l->len;
}

static void tl_token(tok_list *l, const char *s, size_t n) { tl_bytes(l, s, n), tl_end_token(l); }

/* `<0xXX>` as ByteFallback reads it (u8::from_str_radix on the two characters: hex, or "+" and a
 * hex digit); -1 otherwise. */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    if (s[3] == '+') return ctrl_hex_digit(s[4]);
    int hi = ctrl_hex_digit(s[3]), lo = ctrl_hex_digit(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static void flush_bytes(tok_list *out, const unsigned char *run, size_t n) {
    if (!n) return;
    if (tok_utf8_valid((const char *)run, n)) {
        tl_token(out, (const char *)run, n);
        return;
    }
    for (size_t i = 0; i < n; i++) tl_token(out, "\xEF\xBF\xBD", 3);
}

static void apply(const struct tok_dec_op *op, const tok_list *in, tok_list *out) {
    const size_t la = op->a ? strlen(op->a) : 0, lb = op->b ? strlen(op->b) : 0;
    unsigned char *run = op->kind == TOK_DEC_BYTE_FALLBACK ? malloc(in->n + 1) : NULL;
    size_t nrun = 0;
    for (size_t k = 0; k < in->n; k++) {
        const char *s = in->buf + in->off[k];
        const size_t n = in->off[k + 1] - in->off[k];
        switch (op->kind) {
        case TOK_DEC_REPLACE:
        case TOK_DEC_METASPACE:
            for (size_t i = 0; i < n;) {
                if (i + la <= n && !memcmp(s + i, op->a, la)) {
                    if (op->kind == TOK_DEC_REPLACE)
                        tl_bytes(out, op->b, lb);
                    else if (k > 0 || op->start == TOK_META_NEVER)
                        tl_bytes(out, " ", 1);
                    i += la;
                } else {
                    tl_bytes(out, s + i, 1), i++;
                }
            }
            tl_end_token(out);
            break;
        case TOK_DEC_BYTE_FALLBACK: {
            int b = byte_token(s, n);
            if (b >= 0 && run) {
                run[nrun++] = (unsigned char)b;
                break;
            }
            flush_bytes(out, run, nrun), nrun = 0;
            tl_token(out, s, n);
            break;
        }
        case TOK_DEC_FUSE: tl_bytes(out, s, n); break;
        case TOK_DEC_STRIP: {
            size_t b = 0, e = n;
            for (int i = 0; i < op->start && b + la <= e && !memcmp(s + b, op->a, la); i++) b += la;
            for (int i = 0; i < op->stop && e >= b + la && !memcmp(s + e - la, op->a, la); i++) e -= la;
            tl_token(out, s + b, e - b);
            break;
        }
        }
    }
    if (op->kind == TOK_DEC_BYTE_FALLBACK) flush_bytes(out, run, nrun);
    if (op->kind == TOK_DEC_FUSE) tl_end_token(out);
    if (op->kind == TOK_DEC_BYTE_FALLBACK && !run) out->oom = 1;
    free(run);
}

ctrl_status tok_decode_chain(const ctrl_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                             char **text, size_t *len) {
    tok_list cur = {0}, next = {0};
    for (size_t j = 0; j < n; j++) {
        if (ids[j] < 0 || ids[j] >= t->n_ids || !t->id_to_token[ids[j]]) continue; /* unknown ids: nothing */
        if (skip_special && tok_is_special(t, ids[j])) continue;
        if (t->n_dec_ops == 0 && cur.n) tl_bytes(&cur, " ", 1); /* no decoder: joined with spaces */
        const char *tok = t->id_to_token[ids[j]];
        for (int a = 0; a < t->n_added && t->n_norm_added; a++) /* normalized added tokens decode as */
            if (t->added[a].id == ids[j] && t->added[a].norm_content)
                tok = t->added[a].norm_content; /* such */
        tl_token(&cur, tok, strlen(tok));
    }
    for (int k = 0; k < t->n_dec_ops && !cur.oom; k++) {
        next.len = next.n = 0;
        apply(&t->dec_ops[k], &cur, &next);
        tok_list swap = cur;
        cur = next, next = swap;
        cur.oom |= next.oom;
    }
    free(next.buf), free(next.off);
    if (cur.oom) {
        free(cur.buf), free(cur.off);
        return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
    }
    tl_bytes(&cur, "", 0);
    if (!cur.buf)
        cur.buf = calloc(1, 1);
    else
        cur.buf[cur.len] = 0;
    free(cur.off);
    *text = cur.buf, *len = cur.len;
    return cur.buf ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
}
