/* The template lexer, with the whitespace rules of the environment transformers builds: newlines
 * normalised to \n and one trailing newline dropped, `-` strips whitespace on that side of a tag,
 * trim_blocks drops the newline after a block or comment tag, lstrip_blocks drops the indentation
 * before one (`+` opts out of both). */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hex_digit.h"
#include "template/tpl_internal.h"

typedef struct lexer {
    tpl_arena *a;
    const char *s;
    size_t n, i;
    int line;
    tpl_token *toks;
    int n_toks, cap;
    char *err;
    size_t err_len;
} lexer;

static int lex_fail(lexer *L, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(L->err, L->err_len, "line %d: ", L->line);
    if (k > 0 && (size_t)k < L->err_len) vsnprintf(L->err + k, L->err_len - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static tpl_token *push(lexer *L, tpl_tok_kind kind, const char *s, size_t len) {
    if (L->n_toks == L->cap) {
        int cap = L->cap ? L->cap * 2 : 256;
        tpl_token *t = tpl_alloc(L->a, sizeof(tpl_token) * (size_t)cap);
        if (L->n_toks) memcpy(t, L->toks, sizeof(tpl_token) * (size_t)L->n_toks);
        L->toks = t, L->cap = cap;
    }
    tpl_token *t = &L->toks[L->n_toks++];
    *t = (tpl_token){.kind = kind, .line = L->line, .s = s, .len = len};
    return t;
}

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static void count_lines(lexer *L, size_t from, size_t to) {
    for (size_t k = from; k < to; k++) L->line += L->s[k] == '\n';
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000)
        return o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
               o[2] = (char)(0x80 | (cp & 0x3F)), 3;
    return o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
           o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), o[3] = (char)(0x80 | (cp & 0x3F)), 4;
}

/* A string literal with Python's escapes (Jinja decodes them as "unicode-escape"). */
static int lex_string(lexer *L) {
    char q = L->s[L->i];
    size_t start = ++L->i;
    while (L->i < L->n && L->s[L->i] != q) L->i += L->s[L->i] == '\\' ? 2 : 1;
    if (L->i >= L->n) return lex_fail(L, "unterminated string literal");
    size_t end = L->i++;
    char *o = tpl_alloc(L->a, end - start + 1);
    size_t m = 0;
    for (size_t k = start; k < end; k++) {
        char c = L->s[k];
        if (c != '\\' || k + 1 >= end) {
            o[m++] = c;
            continue;
        }
        char e = L->s[++k];
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        switch (e) {
        case 'n': o[m++] = '\n'; break;
        case 't': o[m++] = '\t'; break;
        case 'r': o[m++] = '\r'; break;
        case 'a': o[m++] = '\a'; break;
        case 'b': o[m++] = '\b'; break;
        case 'f': o[m++] = '\f'; break;
        case 'v': o[m++] = '\v'; break;
        case '\\': o[m++] = '\\'; break;
        case '\'': o[m++] = '\''; break;
        case '"': o[m++] = '"'; break;
        case '\n': break;
        default:
            if (digits) {
                uint32_t cp = 0;
                for (int d = 0; d < digits; d++) {
                    int h = k + 1 < end ? ctrl_hex_digit(L->s[k + 1]) : -1;
                    if (h < 0) return lex_fail(L, "truncated \\%c escape in a string literal", e);
                    cp = cp * 16 + (uint32_t)h, k++;
                }
                if (cp > 0x10FFFF) return lex_fail(L, "escape out of the Unicode range");
                m += put_utf8(o + m, cp); /* an escape is never shorter than its UTF-8 */
            } else if (e >= '0' && e <= '7') {
                uint32_t cp = (uint32_t)(e - '0');
                for (int d = 0; d < 2 && k + 1 < end && L->s[k + 1] >= '0' && L->s[k + 1] <= '7'; d++)
                    cp = cp * 8 + (uint32_t)(L->s[++k] - '0');
                m += put_utf8(o + m, cp);
            } else {
                o[m++] = '\\', o[m++] = e;
            }
        }
    }
    push(L, T_STRING, o, m);
    count_lines(L, start, end);
    return 0;
}

static const char *const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                  ">",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|", "=", NULL};

/* Tokens inside {{ }} or {% %}, up to the closing delimiter `close` ("}}" or "%}"). */
static int lex_tag(lexer *L, const char *close, int *strip_after, int *keep_newline) {
    int depth = 0;
    for (;;) {
        while (L->i < L->n && is_space(L->s[L->i])) L->line += L->s[L->i++] == '\n';
        if (L->i >= L->n) return lex_fail(L, "missing '%s'", close);
        const char *p = L->s + L->i;
        size_t left = L->n - L->i;
        if (depth == 0) {
            int sign = (*p == '-' || *p == '+') && left >= 3 && memcmp(p + 1, close, 2) == 0;
            if (sign || (left >= 2 && memcmp(p, close, 2) == 0)) {
                *strip_after = sign && *p == '-';
                *keep_newline = sign && *p == '+';
                L->i += sign ? 3 : 2;
                return 0;
            }
        }
        char c = *p;
        if (c == '\'' || c == '"') {
            if (lex_string(L)) return -1;
        } else if (isalpha((unsigned char)c) || c == '_') {
            size_t k = L->i;
            while (k < L->n && (isalnum((unsigned char)L->s[k]) || L->s[k] == '_')) k++;
            push(L, T_NAME, p, k - L->i);
            L->i = k;
        } else if (isdigit((unsigned char)c)) {
            size_t k = L->i;
            while (k < L->n && (isdigit((unsigned char)L->s[k]) || L->s[k] == '_')) k++;
            int is_float = 0;
            if (k + 1 < L->n && L->s[k] == '.' && isdigit((unsigned char)L->s[k + 1])) {
                is_float = 1, k++;
                while (k < L->n && isdigit((unsigned char)L->s[k])) k++;
            }
            if (k < L->n && (L->s[k] == 'e' || L->s[k] == 'E')) {
                size_t e = k + 1;
                if (e < L->n && (L->s[e] == '+' || L->s[e] == '-')) e++;
                if (e < L->n && isdigit((unsigned char)L->s[e])) {
                    is_float = 1, k = e;
                    while (k < L->n && isdigit((unsigned char)L->s[k])) k++;
                }
            }
            char num[64];
            size_t m = 0;
            for (size_t j = L->i; j < k && m < sizeof num - 1; j++)
                if (L->s[j] != '_') num[m++] = L->s[j];
            num[m] = 0;
            errno = 0;
            const long long iv = is_float ? 0 : strtoll(num, NULL, 10);
            if (!is_float && (errno == ERANGE || m == sizeof num - 1)) /* Python's ints are unbounded */
                return lex_fail(L, "integer literal %.*s does not fit in 64 bits", (int)(k - L->i), p);
            tpl_token *t = push(L, is_float ? T_FLOAT : T_INT, p, k - L->i);
            if (is_float)
                t->f = strtod(num, NULL);
            else
                t->i = iv;
            L->i = k;
        } else {
            int matched = 0;
            for (int o = 0; ops[o]; o++) {
                size_t ol = strlen(ops[o]);
                if (left >= ol && memcmp(p, ops[o], ol) == 0) {
                    push(L, T_OP, p, ol);
                    L->i += ol, matched = 1;
                    depth += (c == '(' || c == '[' || c == '{') - (c == ')' || c == ']' || c == '}');
                    break;
                }
            }
            if (!matched) return lex_fail(L, "unexpected character '%c'", c);
        }
    }
}

/* Source with newlines normalised and one trailing newline removed, as Jinja loads a template. */
static char *normalise(tpl_arena *a, const char *src, size_t len, size_t *out_len) {
    char *o = tpl_alloc(a, len + 1);
    size_t m = 0;
    for (size_t k = 0; k < len; k++) {
        if (src[k] == '\r') {
            o[m++] = '\n';
            if (k + 1 < len && src[k + 1] == '\n') k++;
        } else {
            o[m++] = src[k];
        }
    }
    if (m && o[m - 1] == '\n') m--;
    o[m] = 0;
    *out_len = m;
    return o;
}

int tpl_lex(tpl_arena *a, const char *src, size_t len, tpl_token **toks, int *n, char *err, size_t err_len) {
    lexer L = {.a = a, .line = 1, .err = err, .err_len = err_len};
    L.s = normalise(a, src, len, &L.n);
    int line_starting = 1, strip_next = 0;
    while (L.i < L.n) {
        if (strip_next)
            while (L.i < L.n && is_space(L.s[L.i])) L.line += L.s[L.i++] == '\n';
        strip_next = 0;
        /* the text up to the next tag */
        size_t start = L.i, k = L.i;
        while (k + 1 < L.n &&
               !(L.s[k] == '{' && (L.s[k + 1] == '{' || L.s[k + 1] == '%' || L.s[k + 1] == '#')))
            k++;
        if (k + 1 >= L.n) k = L.n;
        size_t text_end = k;
        int text_line = L.line;
        count_lines(&L, start, k);
        if (k == L.n) {
            if (text_end > start) push(&L, T_TEXT, L.s + start, text_end - start)->line = text_line;
            break;
        }
        char kind = L.s[k + 1];
        char sign = k + 2 < L.n ? L.s[k + 2] : 0;
        if (sign != '-' && sign != '+') sign = 0;
        if (sign == '-') {
            while (text_end > start && is_space(L.s[text_end - 1])) text_end--;
        } else if (sign != '+' && kind != '{') { /* lstrip_blocks */
            size_t l = text_end;
            while (l > start && (L.s[l - 1] == ' ' || L.s[l - 1] == '\t')) l--;
            if (l < text_end && ((l > start && L.s[l - 1] == '\n') || (l == start && line_starting)))
                text_end = l;
        }
        if (text_end > start) push(&L, T_TEXT, L.s + start, text_end - start)->line = text_line;
        L.i = k + 2 + (sign != 0);
        line_starting = 0;
        if (kind == '#') {
            const char *end = NULL;
            for (size_t j = L.i; j + 1 < L.n; j++)
                if (L.s[j] == '#' && L.s[j + 1] == '}') {
                    end = L.s + j;
                    break;
                }
            if (!end) return lex_fail(&L, "unterminated comment");
            size_t close = (size_t)(end - L.s);
            char csign = close > L.i && (L.s[close - 1] == '-' || L.s[close - 1] == '+') ? L.s[close - 1] : 0;
            count_lines(&L, L.i, close);
            L.i = close + 2;
            if (csign == '-')
                strip_next = 1;
            else if (csign != '+' && L.i < L.n && L.s[L.i] == '\n')
                L.i++, L.line++, line_starting = 1;
            continue;
        }
        int strip_after = 0, keep_newline = 0;
        push(&L, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, NULL, 0);
        if (lex_tag(&L, kind == '{' ? "}}" : "%}", &strip_after, &keep_newline)) return -1;
        push(&L, kind == '{' ? T_VAR_END : T_BLOCK_END, NULL, 0);
        if (strip_after)
            strip_next = 1;
        else if (kind == '%' && !keep_newline && L.i < L.n && L.s[L.i] == '\n')
            L.i++, L.line++, line_starting = 1;
    }
    push(&L, T_EOF, NULL, 0);
    *toks = L.toks, *n = L.n_toks;
    return 0;
}
