/* The normalizers of tokenizer.json that ctrl implements, applied in file order: NFC, Prepend
 * (only to non-empty text, as `tokenizers`) and Replace of a literal string (every
 * non-overlapping occurrence, left to right). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_internal.h"

static char *replace_all(const char *s, size_t n, const char *a, const char *b, size_t *out_n) {
    const size_t la = strlen(a), lb = strlen(b);
    size_t hits = 0;
    for (size_t i = 0; i + la <= n;) i += memcmp(s + i, a, la) == 0 ? (hits++, la) : 1;
    char *p = malloc(n + hits * lb + 1), *o = p;
    if (!p) return NULL;
    for (size_t i = 0; i < n;) {
        if (i + la <= n && memcmp(s + i, a, la) == 0)
            memcpy(o, b, lb), o += lb, i += la;
        else
            *o++ = s[i++];
    }
    *o = 0;
    *out_n = (size_t)(o - p);
    return p;
}

char *tok_normalize(const ctrl_tokenizer *t, const char *s, size_t n, size_t *out_n) {
    char *cur = malloc(n + 1);
    if (!cur) return NULL;
    memcpy(cur, s, n);
    cur[n] = 0;
    size_t len = n;
    for (int k = 0; k < t->n_norm_ops && cur; k++) {
        const struct tok_norm_op *op = &t->norm_ops[k];
        char *next = cur;
        size_t next_len = len;
        if (op->kind == TOK_NORM_NFC) {
            next = tok_nfc(cur, len, &next_len);
        } else if (op->kind == TOK_NORM_PREPEND) {
            if (len == 0) continue;
            const size_t la = strlen(op->a);
            next = malloc(len + la + 1);
            if (next) memcpy(next, op->a, la), memcpy(next + la, cur, len + 1), next_len = len + la;
        } else {
            next = replace_all(cur, len, op->a, op->b, &next_len);
        }
        free(cur);
        cur = next, len = next_len;
    }
    *out_n = len;
    return cur;
}
