/* Template values with Python's semantics: the arena they live in, truthiness, equality, and how
 * str(), repr() and json.dumps() write them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

typedef struct tpl_block {
    struct tpl_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} tpl_block;

/* Small values share 60 KB blocks; a value of over a quarter block gets a block of its own, put
 * behind the current one, whose free end stays in use (so at most a quarter of each block is lost). */
void *tpl_alloc(tpl_arena *a, size_t n) {
    enum { BLOCK = 60000 };
    n = (n + 15) & ~(size_t)15;
    tpl_block *b = a->head;
    if (!b || b->used + n > b->cap) {
        const int own = n > BLOCK / 4;
        const size_t cap = own ? n : BLOCK;
        b = malloc(sizeof *b + cap);
        if (!b) abort(); /* like the rest of the core: allocation failure is fatal */
        b->used = 0, b->cap = cap;
        if (own && a->head)
            b->next = a->head->next, a->head->next = b;
        else
            b->next = a->head, a->head = b;
        a->total += sizeof *b + cap; /* what the arena holds, the unused end of each block included */
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

char *tpl_strdup(tpl_arena *a, const char *s, size_t n) {
    char *p = tpl_alloc(a, n + 1);
    if (n) memcpy(p, s, n);
    return p;
}

void tpl_arena_free(tpl_arena *a) {
    while (a->head) {
        tpl_block *n = a->head->next;
        free(a->head);
        a->head = n;
    }
}

tpl_value tpl_undef(const char *name) { return (tpl_value){.kind = V_UNDEF, .undef_name = name}; }
tpl_value tpl_none(void) { return (tpl_value){.kind = V_NONE}; }
tpl_value tpl_bool(int b) { return (tpl_value){.kind = V_BOOL, .b = !!b}; }
tpl_value tpl_int(int64_t i) { return (tpl_value){.kind = V_INT, .i = i}; }
tpl_value tpl_float(double f) { return (tpl_value){.kind = V_FLOAT, .f = f}; }
tpl_value tpl_str(const char *s, size_t len) { return (tpl_value){.kind = V_STR, .str = {s, len}}; }
tpl_value tpl_str_copy(tpl_arena *a, const char *s, size_t len) {
    return tpl_str(tpl_strdup(a, s, len), len);
}

tpl_value tpl_new_list(tpl_arena *a) {
    return (tpl_value){.kind = V_LIST, .list = tpl_alloc(a, sizeof(tpl_list))};
}
tpl_value tpl_new_dict(tpl_arena *a) {
    return (tpl_value){.kind = V_DICT, .dict = tpl_alloc(a, sizeof(tpl_dict))};
}

int tpl_depth(tpl_value v) {
    if (v.kind == V_LIST) return v.list->depth > 0 ? v.list->depth : 1;
    if (v.kind == V_DICT) return v.dict->depth > 0 && !v.dict->is_namespace ? v.dict->depth : 1;
    return 0;
}

uint64_t tpl_size(tpl_value v) {
    if (v.kind == V_STR) return 1 + v.str.len / 64;
    if (v.kind == V_LIST) return 1 + v.list->size;
    if (v.kind == V_DICT && !v.dict->is_namespace) /* equality finds each key in the other: n^2 */
        return 1 + v.dict->size + (uint64_t)v.dict->n * (uint64_t)v.dict->n / 16;
    return 1;
}

static uint64_t add_size(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

void tpl_list_push(tpl_arena *a, tpl_list *l, tpl_value v) {
    if (l->n >= TPL_MAX_ITEMS) { /* dropped; the render fails at its next budget check */
        a->over_items = 1;
        return;
    }
    const int d = tpl_depth(v) + 1;
    if (d > l->depth) l->depth = d;
    l->size = add_size(l->size, tpl_size(v));
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 8;
        tpl_value *items = tpl_alloc(a, sizeof(tpl_value) * (size_t)cap);
        if (l->n) memcpy(items, l->items, sizeof(tpl_value) * (size_t)l->n);
        l->items = items, l->cap = cap;
    }
    l->items[l->n++] = v;
}

void tpl_list_reserve(tpl_arena *a, tpl_list *l, int64_t n) {
    if (n <= 0 || n > TPL_MAX_ITEMS || l->n + n <= l->cap) return; /* past the cap: push flags it */
    const int cap = l->n + (int)n;
    tpl_value *items = tpl_alloc(a, sizeof(tpl_value) * (size_t)cap);
    if (l->n) memcpy(items, l->items, sizeof(tpl_value) * (size_t)l->n);
    l->items = items, l->cap = cap;
}

int tpl_dict_find(const tpl_dict *d, const char *key, size_t len) {
    for (int i = 0; i < d->n; i++)
        if (d->keys[i].str.len == len && memcmp(d->keys[i].str.s, key, len) == 0) return i;
    return -1;
}

void tpl_dict_set(tpl_arena *a, tpl_dict *d, tpl_value key, tpl_value v) {
    int i = tpl_dict_find(d, key.str.s, key.str.len);
    if (i >= 0) {
        d->vals[i] = v;
        return;
    }
    if (d->n >= TPL_MAX_ITEMS) {
        a->over_items = 1;
        return;
    }
    const int depth = tpl_depth(v) + 1;
    if (depth > d->depth) d->depth = depth;
    d->size = add_size(d->size, tpl_size(v));
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 8;
        tpl_value *keys = tpl_alloc(a, sizeof(tpl_value) * (size_t)cap);
        tpl_value *vals = tpl_alloc(a, sizeof(tpl_value) * (size_t)cap);
        if (d->n) {
            memcpy(keys, d->keys, sizeof(tpl_value) * (size_t)d->n);
            memcpy(vals, d->vals, sizeof(tpl_value) * (size_t)d->n);
        }
        d->keys = keys, d->vals = vals, d->cap = cap;
    }
    d->keys[d->n] = key, d->vals[d->n] = v, d->n++;
}

static int cmp_key_index(const void *a, const void *b, void *ctx) {
    const tpl_value *keys = ctx;
    const int i = *(const int *)a, j = *(const int *)b;
    const tpl_value x = keys[i], y = keys[j];
    const size_t m = x.str.len < y.str.len ? x.str.len : y.str.len;
    const int c = memcmp(x.str.s, y.str.s, m);
    if (c) return c;
    if (x.str.len != y.str.len) return x.str.len < y.str.len ? -1 : 1;
    return (i > j) - (i < j); /* equal keys in their order */
}

void tpl_dict_set_many(tpl_arena *a, tpl_dict *d, const tpl_value *keys, const tpl_value *vals, int n) {
    if (d->n > 0 || n <= 32) { /* small, or adding to a dict: one by one */
        for (int i = 0; i < n; i++) tpl_dict_set(a, d, keys[i], vals[i]);
        return;
    }
    /* each key at its first position with its last value, as repeated dict_set would leave it, in
     * n log n: a JSON object of many keys (a request's message) made this quadratic */
    int *order = tpl_alloc(a, sizeof(int) * (size_t)n);
    uint8_t *drop = tpl_alloc(a, (size_t)n);
    tpl_value *last = tpl_alloc(a, sizeof(tpl_value) * (size_t)n);
    for (int i = 0; i < n; i++) order[i] = i, last[i] = vals[i];
    qsort_r(order, (size_t)n, sizeof *order, cmp_key_index, (void *)keys);
    for (int r = 0; r < n;) {
        int e = r + 1;
        const tpl_value k = keys[order[r]];
        while (e < n && keys[order[e]].str.len == k.str.len &&
               memcmp(keys[order[e]].str.s, k.str.s, k.str.len) == 0)
            drop[order[e++]] = 1; /* a later duplicate: its value goes to the first */
        last[order[r]] = vals[order[e - 1]];
        r = e;
    }
    for (int i = 0; i < n; i++)
        if (!drop[i]) {
            if (d->n >= TPL_MAX_ITEMS) {
                a->over_items = 1;
                return;
            }
            if (d->n == d->cap) { /* sized once for all of them */
                d->cap = n;
                d->keys = tpl_alloc(a, sizeof(tpl_value) * (size_t)n);
                d->vals = tpl_alloc(a, sizeof(tpl_value) * (size_t)n);
            }
            const int depth = tpl_depth(last[i]) + 1;
            if (depth > d->depth) d->depth = depth;
            d->size = add_size(d->size, tpl_size(last[i]));
            d->keys[d->n] = keys[i], d->vals[d->n] = last[i], d->n++;
        }
}

int tpl_truthy(tpl_value v) {
    switch (v.kind) {
    case V_UNDEF:
    case V_NONE: return 0;
    case V_BOOL: return v.b;
    case V_INT: return v.i != 0;
    case V_FLOAT: return v.f != 0;
    case V_STR: return v.str.len != 0;
    case V_LIST: return v.list->n != 0;
    case V_DICT: return v.dict->is_namespace || v.dict->n != 0;
    case V_FUNC: return 1;
    }
    return 0;
}

int tpl_is_number(tpl_value v) { return v.kind == V_BOOL || v.kind == V_INT || v.kind == V_FLOAT; }

double tpl_as_double(tpl_value v) {
    return v.kind == V_FLOAT ? v.f : v.kind == V_INT ? (double)v.i : v.kind == V_BOOL ? v.b : 0;
}

int tpl_equal(tpl_value a, tpl_value b) {
    if (tpl_is_number(a) && tpl_is_number(b)) {
        if (a.kind != V_FLOAT && b.kind != V_FLOAT)
            return (a.kind == V_INT ? a.i : a.b) == (b.kind == V_INT ? b.i : b.b);
        return tpl_as_double(a) == tpl_as_double(b);
    }
    if (a.kind != b.kind) return 0;
    switch (a.kind) {
    case V_UNDEF:
    case V_NONE: return 1;
    case V_STR: return a.str.len == b.str.len && memcmp(a.str.s, b.str.s, a.str.len) == 0;
    case V_LIST:
        if (a.list->n != b.list->n) return 0;
        for (int i = 0; i < a.list->n; i++)
            if (!tpl_equal(a.list->items[i], b.list->items[i])) return 0;
        return 1;
    case V_DICT:
        if (a.dict->is_namespace || b.dict->is_namespace) return a.dict == b.dict;
        if (a.dict->n != b.dict->n) return 0;
        for (int i = 0; i < a.dict->n; i++) {
            int j = tpl_dict_find(b.dict, a.dict->keys[i].str.s, a.dict->keys[i].str.len);
            if (j < 0 || !tpl_equal(a.dict->vals[i], b.dict->vals[j])) return 0;
        }
        return 1;
    case V_FUNC: return a.fn.id == b.fn.id && a.fn.macro == b.fn.macro;
    default: return 0;
    }
}

const char *tpl_kind_name(tpl_kind k) {
    static const char *const names[] = {"Undefined", "NoneType", "bool", "int",     "float",
                                        "str",       "list",     "dict", "function"};
    return names[k];
}

/* ---- buffers ---- */
void tpl_buf_add(tpl_buf *b, const char *s, size_t n) {
    if (b->over || n > TPL_MAX_STRING - b->len) {
        b->over = 1;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        if (cap > (size_t)TPL_MAX_STRING + 1) cap = (size_t)TPL_MAX_STRING + 1; /* still >= len + n + 1 */
        char *d = realloc(b->data, cap);
        if (!d) abort();
        b->data = d, b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}
void tpl_buf_addc(tpl_buf *b, char c) { tpl_buf_add(b, &c, 1); }
void tpl_buf_spaces(tpl_buf *b, uint64_t n) {
    static const char spaces[65] = "                                                                ";
    for (; n > 0 && !b->over; n -= n < 64 ? n : 64) tpl_buf_add(b, spaces, n < 64 ? (size_t)n : 64);
}
void tpl_buf_free(tpl_buf *b) {
    free(b->data);
    *b = (tpl_buf){0};
}

/* ---- writing values ---- */

/* Python's repr(float): the shortest digits that round-trip, fixed notation for 1e-4 <= |x| < 1e16. */
static void write_float(tpl_buf *b, double f) {
    char digits[40];
    if (isnan(f)) return tpl_buf_add(b, "nan", 3);
    if (isinf(f)) return f > 0 ? tpl_buf_add(b, "inf", 3) : tpl_buf_add(b, "-inf", 4);
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(digits, sizeof digits, "%.*e", prec - 1, f);
        if (strtod(digits, NULL) == f) break;
    }
    /* digits: [-]d.ddde[+-]XX */
    char *e = strchr(digits, 'e');
    int exp = atoi(e + 1);
    *e = 0;
    char mant[32];
    size_t m = 0;
    const char *p = digits;
    int neg = *p == '-';
    if (neg) p++;
    for (; *p; p++)
        if (*p != '.') mant[m++] = *p;
    mant[m] = 0;
    while (m > 1 && mant[m - 1] == '0') mant[--m] = 0;
    char out[64];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[o++] = '0', out[o++] = '.';
            for (int i = -1; i > exp; i--) out[o++] = '0';
            for (size_t i = 0; i < m; i++) out[o++] = mant[i];
        } else {
            for (int i = 0; i <= exp; i++) out[o++] = (size_t)i < m ? mant[i] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 < m)
                for (size_t i = (size_t)exp + 1; i < m; i++) out[o++] = mant[i];
            else
                out[o++] = '0';
        }
        tpl_buf_add(b, out, o);
        return;
    }
    out[o++] = mant[0];
    if (m > 1) {
        out[o++] = '.';
        for (size_t i = 1; i < m; i++) out[o++] = mant[i];
    }
    o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    tpl_buf_add(b, out, o);
}

static void write_int(tpl_buf *b, int64_t i) {
    char s[32];
    int n = snprintf(s, sizeof s, "%lld", (long long)i);
    tpl_buf_add(b, s, (size_t)n);
}

/* Python's repr(str): single quotes unless the text has a single quote and no double quote. */
static void write_str_repr(tpl_buf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    tpl_buf_addc(b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == (unsigned char)q || c == '\\') {
            tpl_buf_addc(b, '\\'), tpl_buf_addc(b, (char)c);
        } else if (c == '\n') {
            tpl_buf_add(b, "\\n", 2);
        } else if (c == '\r') {
            tpl_buf_add(b, "\\r", 2);
        } else if (c == '\t') {
            tpl_buf_add(b, "\\t", 2);
        } else if (c < 0x20 || c == 0x7f) {
            char e[8];
            snprintf(e, sizeof e, "\\x%02x", c);
            tpl_buf_add(b, e, 4);
        } else {
            tpl_buf_addc(b, (char)c);
        }
    }
    tpl_buf_addc(b, q);
}

void tpl_write_repr(tpl_buf *b, tpl_value v) {
    switch (v.kind) {
    case V_STR: write_str_repr(b, v.str.s, v.str.len); return;
    case V_LIST:
        tpl_buf_addc(b, v.list->is_tuple ? '(' : '[');
        for (int i = 0; i < v.list->n && !b->over; i++) {
            if (i) tpl_buf_add(b, ", ", 2);
            tpl_write_repr(b, v.list->items[i]);
        }
        if (v.list->is_tuple && v.list->n == 1) tpl_buf_addc(b, ',');
        tpl_buf_addc(b, v.list->is_tuple ? ')' : ']');
        return;
    case V_DICT:
        if (v.dict->is_namespace) {
            tpl_buf_add(b, "<Namespace>", 11);
            return;
        }
        tpl_buf_addc(b, '{');
        for (int i = 0; i < v.dict->n && !b->over; i++) {
            if (i) tpl_buf_add(b, ", ", 2);
            tpl_write_repr(b, v.dict->keys[i]);
            tpl_buf_add(b, ": ", 2);
            tpl_write_repr(b, v.dict->vals[i]);
        }
        tpl_buf_addc(b, '}');
        return;
    default: tpl_write_str(b, v);
    }
}

void tpl_write_str(tpl_buf *b, tpl_value v) {
    switch (v.kind) {
    case V_UNDEF: return;
    case V_NONE: tpl_buf_add(b, "None", 4); return;
    case V_BOOL: v.b ? tpl_buf_add(b, "True", 4) : tpl_buf_add(b, "False", 5); return;
    case V_INT: write_int(b, v.i); return;
    case V_FLOAT: write_float(b, v.f); return;
    case V_STR: tpl_buf_add(b, v.str.s, v.str.len); return;
    case V_FUNC: tpl_buf_add(b, "<function>", 10); return;
    default: tpl_write_repr(b, v);
    }
}

static void write_json_str(tpl_buf *b, const char *s, size_t n) {
    tpl_buf_addc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': tpl_buf_add(b, "\\\"", 2); break;
        case '\\': tpl_buf_add(b, "\\\\", 2); break;
        case '\n': tpl_buf_add(b, "\\n", 2); break;
        case '\r': tpl_buf_add(b, "\\r", 2); break;
        case '\t': tpl_buf_add(b, "\\t", 2); break;
        case '\b': tpl_buf_add(b, "\\b", 2); break;
        case '\f': tpl_buf_add(b, "\\f", 2); break;
        default:
            if (c < 0x20) {
                char e[8];
                snprintf(e, sizeof e, "\\u%04x", c);
                tpl_buf_add(b, e, 6);
            } else {
                tpl_buf_addc(b, (char)c);
            }
        }
    }
    tpl_buf_addc(b, '"');
}

static void newline_indent(tpl_buf *b, size_t indent, int depth) {
    tpl_buf_addc(b, '\n');
    tpl_buf_spaces(b, (uint64_t)indent * (uint64_t)depth);
}

int tpl_write_json(tpl_buf *b, tpl_value v, int64_t indent, int depth) {
    switch (v.kind) {
    case V_NONE: tpl_buf_add(b, "null", 4); return 0;
    case V_BOOL: v.b ? tpl_buf_add(b, "true", 4) : tpl_buf_add(b, "false", 5); return 0;
    case V_INT: write_int(b, v.i); return 0;
    case V_FLOAT:
        if (isnan(v.f))
            tpl_buf_add(b, "NaN", 3);
        else if (isinf(v.f))
            v.f > 0 ? tpl_buf_add(b, "Infinity", 8) : tpl_buf_add(b, "-Infinity", 9);
        else
            write_float(b, v.f);
        return 0;
    case V_STR: write_json_str(b, v.str.s, v.str.len); return 0;
    case V_LIST:
    case V_DICT: {
        int is_list = v.kind == V_LIST, n = is_list ? v.list->n : v.dict->n;
        if (!is_list && v.dict->is_namespace) return -1;
        tpl_buf_addc(b, is_list ? '[' : '{');
        for (int i = 0; i < n && !b->over; i++) {
            if (i) tpl_buf_add(b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2);
            if (indent >= 0) newline_indent(b, (size_t)indent, depth + 1);
            if (!is_list) {
                write_json_str(b, v.dict->keys[i].str.s, v.dict->keys[i].str.len);
                tpl_buf_add(b, ": ", 2);
            }
            if (tpl_write_json(b, is_list ? v.list->items[i] : v.dict->vals[i], indent, depth + 1)) return -1;
        }
        if (indent >= 0 && n) newline_indent(b, (size_t)indent, depth);
        tpl_buf_addc(b, is_list ? ']' : '}');
        return 0;
    }
    default: return -1;
    }
}

size_t tpl_utf8_count(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

size_t tpl_utf8_offset(const char *s, size_t len, size_t cp_index) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (n == cp_index) return i;
            n++;
        }
    }
    return len;
}

size_t tpl_utf8_step(const char *s, size_t len, size_t at, int64_t k) {
    for (; k > 0 && at < len; k--) do
            at++;
        while (at < len && ((unsigned char)s[at] & 0xC0) == 0x80);
    for (; k < 0 && at > 0; k++) do
            at--;
        while (at > 0 && ((unsigned char)s[at] & 0xC0) == 0x80);
    return at;
}
