/* The built-ins chat templates call: Jinja's filters and tests, the str and dict methods Python
 * gives them, and the globals transformers adds (raise_exception, strftime_now, namespace, dict)
 * plus range. Case mapping (upper/lower/title/capitalize) is ASCII-only. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "template/tpl_internal.h"

#define NAME_IS(n, lit) (strcmp((n), (lit)) == 0)

/* ---- argument helpers ---- */

/* Argument `pos` (0-based among positionals) or keyword `kw`; `def` when absent. */
static tpl_value arg(const tpl_args *a, int pos, const char *kw, tpl_value def) {
    for (int k = 0; kw && k < a->n_kw; k++)
        if (NAME_IS(a->kw_names[k], kw)) return a->kw[k];
    return pos >= 0 && pos < a->n_pos ? a->pos[pos] : def;
}

static int want_str(tpl_render *r, int line, tpl_value v, const char *what) {
    if (v.kind == V_STR) return 0;
    return tpl_fail(r, line, "%s expects a string, got '%s'", what, tpl_kind_name(v.kind));
}

static int want_seq(tpl_render *r, int line, tpl_value v, const char *what, tpl_list **items) {
    if (tpl_iterable(r, line, v, items) == 0) return 0;
    r->failed = 0; /* restate the error with the filter's name */
    return tpl_fail(r, line, "%s: '%s' object is not iterable", what, tpl_kind_name(v.kind));
}

/* Items a for loop or filter walks: a list's items, a dict's keys, a string's characters;
 * Undefined walks nothing (as Jinja's default Undefined). */
int tpl_iterable(tpl_render *r, int line, tpl_value v, tpl_list **items) {
    if (v.kind == V_LIST) return *items = v.list, 0;
    tpl_value l = tpl_new_list(&r->arena);
    *items = l.list;
    if (v.kind == V_UNDEF) return 0;
    if (v.kind == V_DICT && !v.dict->is_namespace) {
        tpl_list_reserve(&r->arena, l.list, v.dict->n);
        for (int i = 0; i < v.dict->n; i++) tpl_list_push(&r->arena, l.list, v.dict->keys[i]);
        return 0;
    }
    if (v.kind == V_STR) {
        const size_t count = tpl_utf8_count(v.str.s, v.str.len);
        if (tpl_room_items(r, line, "iterating a string", count)) return -1;
        tpl_list_reserve(&r->arena, l.list, (int64_t)count);
        for (size_t o = 0, e; o < v.str.len; o = e) {
            e = tpl_utf8_step(v.str.s, v.str.len, o, 1);
            tpl_list_push(&r->arena, l.list, tpl_str(v.str.s + o, e - o));
        }
        return 0;
    }
    return tpl_fail(r, line, "'%s' object is not iterable", tpl_kind_name(v.kind));
}

/* ---- Python string operations ---- */

static uint32_t cp_at(const char *s, size_t n, size_t i, size_t *len) {
    unsigned char c = (unsigned char)s[i];
    int k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (i + (size_t)k > n) k = 1;
    uint32_t cp = k == 1 ? c : c & (0x3F >> (k - 1));
    for (int j = 1; j < k; j++) cp = cp << 6 | ((unsigned char)s[i + (size_t)j] & 0x3F);
    *len = (size_t)k;
    return cp;
}

/* str.isspace() for one code point */
static int py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* Is the code point at s[i] in `chars` (or whitespace when chars is NULL)? */
static int strip_match(const char *s, size_t n, size_t i, const tpl_value *chars, size_t *len) {
    uint32_t c = cp_at(s, n, i, len);
    if (!chars) return py_space(c);
    for (size_t k = 0; k < chars->str.len;) {
        size_t l;
        if (cp_at(chars->str.s, chars->str.len, k, &l) == c) return 1;
        k += l;
    }
    return 0;
}

/* Each code point tried walks `chars`: with a long `chars` the work is charged as it goes (a long
 * string of matching characters made it len(s) × len(chars)). */
static int py_strip(tpl_render *r, int line, tpl_value s, const tpl_value *chars, int left, int right,
                    tpl_value *out) {
    const uint64_t per = chars ? chars->str.len / 16 : 0;
    uint64_t owed = 0;
    size_t b = 0, e = s.str.len, l;
    while (left && b < e && strip_match(s.str.s, e, b, chars, &l)) {
        b += l;
        if ((owed += per) >= 4096 && tpl_budget(r, line, owed)) return -1;
        owed = owed >= 4096 ? 0 : owed;
    }
    while (right && e > b) {
        size_t start = e - 1;
        while (start > b && ((unsigned char)s.str.s[start] & 0xC0) == 0x80) start--;
        if (!strip_match(s.str.s, e, start, chars, &l)) break;
        e = start;
        if ((owed += per) >= 4096 && tpl_budget(r, line, owed)) return -1;
        owed = owed >= 4096 ? 0 : owed;
    }
    *out = tpl_str(s.str.s + b, e - b);
    return tpl_budget(r, line, owed);
}

/* The first occurrence of n in h at or after `from` (glibc's memmem is linear). */
static const char *find_sub(const char *h, size_t hn, const char *n, size_t nn, size_t from) {
    if (from > hn) return NULL;
    return nn ? memmem(h + from, hn - from, n, nn) : h + from;
}

/* str.split(sep, maxsplit) / str.rsplit; sep None splits on whitespace runs. */
static tpl_value py_split(tpl_render *r, tpl_value s, tpl_value sep, int64_t maxsplit, int from_right) {
    tpl_value out = tpl_new_list(&r->arena);
    const char *p = s.str.s;
    size_t n = s.str.len;
    if (sep.kind == V_STR) {
        tpl_value parts = tpl_new_list(&r->arena);
        size_t start = 0;
        /* memmem is linear; comparing at each position was n × len(sep) */
        for (const char *hit; (hit = find_sub(p, n, sep.str.s, sep.str.len, start));) {
            tpl_list_push(&r->arena, parts.list, tpl_str(p + start, (size_t)(hit - p) - start));
            start = (size_t)(hit - p) + sep.str.len;
        }
        tpl_list_push(&r->arena, parts.list, tpl_str(p + start, n - start));
        int total = parts.list->n;
        if (maxsplit < 0 || maxsplit >= total - 1) return parts;
        /* re-join the pieces beyond maxsplit on the far side */
        int keep = (int)maxsplit;
        if (!from_right) {
            for (int i = 0; i < keep; i++) tpl_list_push(&r->arena, out.list, parts.list->items[i]);
            const char *rest = parts.list->items[keep].str.s;
            tpl_list_push(&r->arena, out.list, tpl_str(rest, (size_t)(p + n - rest)));
        } else {
            const tpl_value last_joined = parts.list->items[total - keep - 1];
            tpl_list_push(&r->arena, out.list,
                          tpl_str(p, (size_t)(last_joined.str.s + last_joined.str.len - p)));
            for (int i = total - keep; i < total; i++)
                tpl_list_push(&r->arena, out.list, parts.list->items[i]);
        }
        return out;
    }
    /* whitespace split (maxsplit honoured from the left only) */
    size_t i = 0, l;
    int64_t splits = 0;
    while (i < n) {
        while (i < n && py_space(cp_at(p, n, i, &l))) i += l;
        if (i >= n) break;
        size_t start = i;
        if (maxsplit >= 0 && splits == maxsplit && !from_right) {
            tpl_value rest;
            py_strip(r, 0, tpl_str(p + start, n - start), NULL, 0, 1, &rest); /* no chars: nothing owed */
            tpl_list_push(&r->arena, out.list, rest);
            break;
        }
        while (i < n && !py_space(cp_at(p, n, i, &l))) i += l;
        tpl_list_push(&r->arena, out.list, tpl_str(p + start, i - start));
        splits++;
    }
    return out;
}

static int py_replace(tpl_render *r, int line, tpl_value s, tpl_value old, tpl_value new_, int64_t count,
                      tpl_value *out) {
    tpl_buf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (old.str.len == 0) { /* Python inserts `new` between characters */
        size_t l;
        for (; i < s.str.len && (count < 0 || done < count) && !b.over; i += l, done++) {
            tpl_buf_add(&b, new_.str.s, new_.str.len);
            cp_at(s.str.s, s.str.len, i, &l);
            tpl_buf_add(&b, s.str.s + i, l);
        }
        if (i >= s.str.len && (count < 0 || done < count)) tpl_buf_add(&b, new_.str.s, new_.str.len);
    } else {
        const char *hit;
        while ((count < 0 || done < count) && !b.over &&
               (hit = find_sub(s.str.s, s.str.len, old.str.s, old.str.len, i))) {
            tpl_buf_add(&b, s.str.s + i, (size_t)(hit - s.str.s) - i);
            tpl_buf_add(&b, new_.str.s, new_.str.len);
            i = (size_t)(hit - s.str.s) + old.str.len, done++;
        }
    }
    tpl_buf_add(&b, s.str.s + i, s.str.len - i);
    return tpl_buf_value(r, line, &b, out);
}

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE };
static tpl_value py_case(tpl_render *r, tpl_value s, int mode) {
    char *o = tpl_strdup(&r->arena, s.str.s, s.str.len);
    int prev_alpha = 0;
    for (size_t i = 0; i < s.str.len; i++) {
        char c = o[i];
        int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        int up =
            mode == CASE_UPPER || (mode == CASE_TITLE && !prev_alpha) || (mode == CASE_CAPITALIZE && i == 0);
        if (alpha) o[i] = up ? (char)(c & ~0x20) : (char)(c | 0x20);
        prev_alpha = alpha || (((unsigned char)c) >= 0x80 && mode == CASE_TITLE && prev_alpha);
    }
    return tpl_str(o, s.str.len);
}

static int starts_or_ends(tpl_render *r, int line, tpl_value s, tpl_value what, int ends, int *res) {
    tpl_list one = {.items = &what, .n = 1};
    tpl_list *opts = what.kind == V_LIST ? what.list : &one;
    *res = 0;
    for (int i = 0; i < opts->n; i++) {
        tpl_value p = opts->items[i];
        if (want_str(r, line, p, ends ? "endswith" : "startswith") || tpl_budget(r, line, 1 + p.str.len / 64))
            return -1;
        if (p.str.len <= s.str.len &&
            memcmp(s.str.s + (ends ? s.str.len - p.str.len : 0), p.str.s, p.str.len) == 0)
            *res = 1;
    }
    return 0;
}

int tpl_method(tpl_render *r, int line, tpl_value obj, const char *name, const tpl_args *a, tpl_value *out) {
    tpl_value none = tpl_none();
    if (tpl_walk(r, line, obj)) return -1; /* every method walks its string or dict (or searches it) */
    if (obj.kind == V_STR) {
        if (NAME_IS(name, "startswith") || NAME_IS(name, "endswith")) {
            int res;
            if (a->n_pos < 1 || starts_or_ends(r, line, obj, a->pos[0], name[0] == 'e', &res)) return -1;
            return *out = tpl_bool(res), 0;
        }
        if (NAME_IS(name, "strip") || NAME_IS(name, "lstrip") || NAME_IS(name, "rstrip")) {
            tpl_value chars = arg(a, 0, "chars", none);
            if (chars.kind != V_NONE && want_str(r, line, chars, name)) return -1;
            return py_strip(r, line, obj, chars.kind == V_STR ? &chars : NULL, name[0] != 'r', name[0] != 'l',
                            out);
        }
        if (NAME_IS(name, "split") || NAME_IS(name, "rsplit")) {
            tpl_value sep = arg(a, 0, "sep", none), max = arg(a, 1, "maxsplit", tpl_int(-1));
            if (sep.kind != V_NONE && want_str(r, line, sep, name)) return -1;
            if (sep.kind == V_STR && sep.str.len == 0) return tpl_fail(r, line, "empty separator");
            *out = py_split(r, obj, sep, max.kind == V_INT ? max.i : -1, name[0] == 'r');
            return 0;
        }
        if (NAME_IS(name, "upper")) return *out = py_case(r, obj, CASE_UPPER), 0;
        if (NAME_IS(name, "lower")) return *out = py_case(r, obj, CASE_LOWER), 0;
        if (NAME_IS(name, "title")) return *out = py_case(r, obj, CASE_TITLE), 0;
        if (NAME_IS(name, "capitalize"))
            return *out = py_case(r, py_case(r, obj, CASE_LOWER), CASE_CAPITALIZE), 0;
        if (NAME_IS(name, "replace")) {
            tpl_value o = arg(a, 0, NULL, none), n = arg(a, 1, NULL, none),
                      c = arg(a, 2, "count", tpl_int(-1));
            if (want_str(r, line, o, "replace") || want_str(r, line, n, "replace")) return -1;
            return py_replace(r, line, obj, o, n, c.kind == V_INT ? c.i : -1, out);
        }
        if (NAME_IS(name, "find") || NAME_IS(name, "rfind") || NAME_IS(name, "count")) {
            tpl_value sub = arg(a, 0, NULL, none);
            if (want_str(r, line, sub, name)) return -1;
            if (!sub.str.len) { /* an empty match at every code point and at the end, as Python */
                const int64_t n = (int64_t)tpl_utf8_count(obj.str.s, obj.str.len);
                return *out = tpl_int(name[0] == 'c' ? n + 1 : name[0] == 'r' ? n : 0), 0;
            }
            const char *hit, *at = NULL; /* non-overlapping matches */
            int64_t count = 0;
            for (size_t i = 0; (hit = find_sub(obj.str.s, obj.str.len, sub.str.s, sub.str.len, i));) {
                if (!at || name[0] == 'r') at = hit;
                if (name[0] == 'f') break;
                count++;
                i = (size_t)(hit - obj.str.s) + sub.str.len;
            }
            const int64_t found = at ? (int64_t)tpl_utf8_count(obj.str.s, (size_t)(at - obj.str.s)) : -1;
            return *out = tpl_int(name[0] == 'c' ? count : found), 0;
        }
        if (NAME_IS(name, "join")) {
            tpl_list *items;
            if (a->n_pos < 1 || want_seq(r, line, a->pos[0], "join", &items)) return -1;
            if (tpl_budget(r, line, (uint64_t)items->n / 16)) return -1;
            tpl_buf b = {0};
            for (int i = 0; i < items->n && !b.over; i++) {
                if (want_str(r, line, items->items[i], "join")) return tpl_buf_free(&b), -1;
                if (i) tpl_buf_add(&b, obj.str.s, obj.str.len);
                tpl_buf_add(&b, items->items[i].str.s, items->items[i].str.len);
            }
            return tpl_buf_value(r, line, &b, out);
        }
        if (NAME_IS(name, "isdigit") || NAME_IS(name, "isalpha") || NAME_IS(name, "isspace") ||
            NAME_IS(name, "isalnum")) {
            int ok = obj.str.len > 0;
            for (size_t i = 0; ok && i < obj.str.len; i++) {
                unsigned char c = (unsigned char)obj.str.s[i];
                int d = c >= '0' && c <= '9', al = (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
                ok = name[2] == 'd'                     ? d
                     : name[2] == 'a' && name[4] == 'p' ? al
                     : name[2] == 's'                   ? py_space(c)
                                                        : d || al;
            }
            return *out = tpl_bool(ok), 0;
        }
    }
    if (obj.kind == V_DICT && !obj.dict->is_namespace) {
        if (NAME_IS(name, "items") || NAME_IS(name, "keys") || NAME_IS(name, "values")) {
            *out = tpl_new_list(&r->arena);
            for (int i = 0; i < obj.dict->n; i++) {
                tpl_value v = obj.dict->vals[i];
                if (name[0] == 'i') {
                    v = tpl_new_list(&r->arena);
                    v.list->is_tuple = 1;
                    tpl_list_push(&r->arena, v.list, obj.dict->keys[i]);
                    tpl_list_push(&r->arena, v.list, obj.dict->vals[i]);
                } else if (name[0] == 'k') {
                    v = obj.dict->keys[i];
                }
                tpl_list_push(&r->arena, out->list, v);
            }
            return 0;
        }
        if (NAME_IS(name, "get")) {
            tpl_value k = arg(a, 0, NULL, none);
            int i = k.kind == V_STR ? tpl_dict_find(obj.dict, k.str.s, k.str.len) : -1;
            *out = i >= 0 ? obj.dict->vals[i] : arg(a, 1, "default", none);
            return 0;
        }
    }
    if (obj.kind == V_DICT) { /* a callable stored under that key, e.g. a macro in a namespace */
        int i = tpl_dict_find(obj.dict, name, strlen(name));
        if (i >= 0 && obj.dict->vals[i].kind == V_FUNC)
            return tpl_call_global(r, line, obj.dict->vals[i], a, out);
    }
    return tpl_fail(r, line, "'%s' object has no method '%s' (not supported by ctrl's template engine)",
                    tpl_kind_name(obj.kind), name);
}

/* ---- tests ---- */

int tpl_test(tpl_render *r, int line, const char *name, tpl_value v, const tpl_args *a, int *out) {
    tpl_value x = arg(a, 0, NULL, tpl_undef("argument"));
    tpl_value cmp;
    if (NAME_IS(name, "defined")) return *out = v.kind != V_UNDEF, 0;
    if (NAME_IS(name, "undefined")) return *out = v.kind == V_UNDEF, 0;
    if (NAME_IS(name, "none")) return *out = v.kind == V_NONE, 0;
    if (NAME_IS(name, "boolean")) return *out = v.kind == V_BOOL, 0;
    if (NAME_IS(name, "true")) return *out = v.kind == V_BOOL && v.b, 0;
    if (NAME_IS(name, "false")) return *out = v.kind == V_BOOL && !v.b, 0;
    if (NAME_IS(name, "string")) return *out = v.kind == V_STR, 0;
    if (NAME_IS(name, "number")) return *out = tpl_is_number(v), 0;
    if (NAME_IS(name, "integer")) return *out = v.kind == V_INT, 0;
    if (NAME_IS(name, "float")) return *out = v.kind == V_FLOAT, 0;
    if (NAME_IS(name, "mapping")) return *out = v.kind == V_DICT, 0;
    if (NAME_IS(name, "iterable"))
        return *out = v.kind == V_LIST || v.kind == V_STR || v.kind == V_DICT || v.kind == V_UNDEF, 0;
    if (NAME_IS(name, "sequence")) return *out = v.kind == V_LIST || v.kind == V_STR || v.kind == V_DICT, 0;
    if (NAME_IS(name, "callable")) return *out = v.kind == V_FUNC, 0;
    if (NAME_IS(name, "sameas")) { /* == walks both: charged as compare() charges it */
        const uint64_t sv = tpl_size(v), sx = tpl_size(x);
        if (tpl_budget(r, line, sv < sx ? sv : sx)) return -1;
        return *out = v.kind == x.kind && (v.kind == V_NONE || v.kind == V_UNDEF || tpl_equal(v, x)), 0;
    }
    if (NAME_IS(name, "odd") || NAME_IS(name, "even") || NAME_IS(name, "divisibleby")) {
        if (v.kind != V_INT) return tpl_fail(r, line, "test '%s' expects an integer", name);
        int64_t d = name[0] == 'd' ? (x.kind == V_INT ? x.i : 0) : 2;
        if (d == 0) return tpl_fail(r, line, "divisibleby needs a non-zero integer");
        int64_t m = d == -1 ? 0 : v.i % d; /* INT64_MIN % -1 traps */
        return *out = name[0] == 'o' ? m != 0 : m == 0, 0;
    }
    if (NAME_IS(name, "lower") || NAME_IS(name, "upper")) {
        if (v.kind != V_STR) return *out = 0, 0;
        if (tpl_walk(r, line, v)) return -1;
        return *out = tpl_equal(v, py_case(r, v, name[0] == 'l' ? CASE_LOWER : CASE_UPPER)), 0;
    }
    static const struct {
        const char *a, *b, *c;
        int op;
    } cmps[] = {{"eq", "equalto", "==", OP_EQ},    {"ne", "!=", "ne", OP_NE},
                {"lt", "lessthan", "<", OP_LT},    {"le", "<=", "le", OP_LE},
                {"gt", "greaterthan", ">", OP_GT}, {"ge", ">=", "ge", OP_GE},
                {"in", "in", "in", OP_IN}};
    for (size_t k = 0; k < sizeof cmps / sizeof cmps[0]; k++) {
        if (!NAME_IS(name, cmps[k].a) && !NAME_IS(name, cmps[k].b) && !NAME_IS(name, cmps[k].c)) continue;
        tpl_node lhs = {.kind = E_LIT, .line = line, .lit = v}, rhs = {.kind = E_LIT, .line = line, .lit = x};
        tpl_node bin = {.kind = E_BIN, .line = line, .op = cmps[k].op, .a = &lhs, .b = &rhs};
        if (tpl_eval(r, NULL, &bin, &cmp)) return -1;
        return *out = cmp.b, 0;
    }
    return tpl_fail(r, line, "unknown test '%s'", name);
}

/* ---- filters ---- */

static int item_attr(tpl_render *r, int line, tpl_value item, tpl_value attr, tpl_value *out) {
    if (attr.kind == V_STR && item.kind == V_DICT) {
        if (tpl_walk(r, line, item)) return -1;
        int i = tpl_dict_find(item.dict, attr.str.s, attr.str.len);
        *out = i >= 0 ? item.dict->vals[i] : tpl_undef("attribute");
        return 0;
    }
    return tpl_getitem(r, line, item, attr, out);
}

/* select/reject/selectattr/rejectattr: keep items whose (attribute's) test result is `want`. */
static int select_items(tpl_render *r, int line, tpl_value seq, const tpl_args *a, int by_attr, int want,
                        tpl_value *out) {
    tpl_list *items;
    if (want_seq(r, line, seq, "select", &items)) return -1;
    int t0 = by_attr ? 1 : 0;
    tpl_args targs = {.pos = a->pos + t0 + 1, .n_pos = a->n_pos - t0 - 1 > 0 ? a->n_pos - t0 - 1 : 0};
    *out = tpl_new_list(&r->arena);
    for (int i = 0; i < items->n; i++) {
        tpl_value v = items->items[i];
        if (by_attr && (a->n_pos < 1 || item_attr(r, line, v, a->pos[0], &v))) return -1;
        int ok;
        if (a->n_pos > t0) {
            if (want_str(r, line, a->pos[t0], "select test name")) return -1;
            char *tname = tpl_strdup(&r->arena, a->pos[t0].str.s, a->pos[t0].str.len);
            if (tpl_test(r, line, tname, v, &targs, &ok)) return -1;
        } else {
            ok = tpl_truthy(v);
        }
        if (!!ok == want) tpl_list_push(&r->arena, out->list, items->items[i]);
    }
    return 0;
}

/* Jinja's sort, dictsort, min and max order strings ignoring case (ASCII here, as py_case). */
static int compare_values(tpl_value a, tpl_value b) {
    if (tpl_is_number(a) && tpl_is_number(b)) {
        double x = tpl_as_double(a), y = tpl_as_double(b);
        return x < y ? -1 : x > y;
    }
    if (a.kind == V_STR && b.kind == V_STR) {
        size_t m = a.str.len < b.str.len ? a.str.len : b.str.len;
        for (size_t i = 0; i < m; i++) {
            unsigned char x = (unsigned char)a.str.s[i], y = (unsigned char)b.str.s[i];
            x = x >= 'A' && x <= 'Z' ? (unsigned char)(x | 0x20) : x;
            y = y >= 'A' && y <= 'Z' ? (unsigned char)(y | 0x20) : y;
            if (x != y) return x < y ? -1 : 1;
        }
        return (a.str.len > b.str.len) - (a.str.len < b.str.len);
    }
    return (int)a.kind - (int)b.kind;
}

/* sort's order, or dictsort's (by each (key, value) pair's key) */
static int sort_before(tpl_value a, tpl_value b, int reverse, int by_key) {
    if (by_key) a = a.list->items[0], b = b.list->items[0];
    return reverse ? compare_values(a, b) > 0 : compare_values(a, b) < 0;
}

/* A stable merge sort (Python's sort is stable), n log n for the lists a template may build. */
static int sort_values(tpl_render *r, int line, tpl_value *v, int n, int reverse, int by_key) {
    if (n < 2) return 0;
    if (tpl_budget(r, line, (uint64_t)n * 24)) return -1;
    tpl_value *tmp = tpl_alloc(&r->arena, sizeof *tmp * (size_t)n);
    for (int width = 1; width < n; width *= 2) {
        for (int lo = 0; lo < n - width; lo += 2 * width) {
            const int mid = lo + width, hi = mid + width < n ? mid + width : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = sort_before(v[j], v[i], reverse, by_key) ? v[j++] : v[i++];
            while (i < mid) tmp[k++] = v[i++];
            while (j < hi) tmp[k++] = v[j++];
            memcpy(v + lo, tmp + lo, sizeof *v * (size_t)(hi - lo));
        }
    }
    return 0;
}

static int filter_tojson(tpl_render *r, int line, tpl_value v, const tpl_args *a, tpl_value *out) {
    tpl_value indent = arg(a, 0, "indent", tpl_none());
    /* Python: a negative indent indents by nothing; a huge one fails at the first newline */
    tpl_value sort_keys = arg(a, 4, "sort_keys", tpl_bool(0)), ascii = arg(a, 1, "ensure_ascii", tpl_bool(0));
    tpl_value seps = arg(a, 3, "separators", tpl_none());
    if (tpl_truthy(sort_keys) || tpl_truthy(ascii) || seps.kind != V_NONE)
        return tpl_fail(r, line, "tojson: sort_keys, ensure_ascii and separators are not supported");
    if (indent.kind != V_NONE && indent.kind != V_INT)
        return tpl_fail(r, line, "tojson: indent must be an integer");
    int64_t width = indent.kind != V_INT ? -1 : indent.i < 0 ? 0 : indent.i;
    if (width > (int64_t)TPL_MAX_STRING) width = (int64_t)TPL_MAX_STRING + 1;
    tpl_buf b = {0};
    if (tpl_write_json(&b, v, width, 0) && !b.over) {
        tpl_buf_free(&b);
        return tpl_fail(r, line, "tojson: value of type '%s' is not JSON serializable",
                        tpl_kind_name(v.kind));
    }
    return tpl_buf_value(r, line, &b, out);
}

int tpl_filter(tpl_render *r, tpl_scope *s, int line, const char *name, tpl_value v, const tpl_args *a,
               tpl_value *out) {
    (void)s;
    tpl_value none = tpl_none();
    tpl_list *items;
    if (NAME_IS(name, "default") || NAME_IS(name, "d")) {
        int use = v.kind == V_UNDEF || (tpl_truthy(arg(a, 1, "boolean", tpl_bool(0))) && !tpl_truthy(v));
        *out = use ? arg(a, 0, "default_value", tpl_str("", 0)) : v;
        return 0;
    }
    if (v.kind == V_UNDEF && !NAME_IS(name, "length") && !NAME_IS(name, "count") && !NAME_IS(name, "list") &&
        !NAME_IS(name, "string") && !NAME_IS(name, "trim") && !NAME_IS(name, "join"))
        return tpl_fail(r, line, "'%s' is undefined", v.undef_name ? v.undef_name : "value");
    /* every filter walks its subject, but a list's length, first and last item */
    const int constant = v.kind == V_LIST && (NAME_IS(name, "length") || NAME_IS(name, "count") ||
                                              NAME_IS(name, "first") || NAME_IS(name, "last"));
    if (!constant && tpl_walk(r, line, v)) return -1;
    if (NAME_IS(name, "length") || NAME_IS(name, "count")) {
        if (v.kind == V_STR) return *out = tpl_int((int64_t)tpl_utf8_count(v.str.s, v.str.len)), 0;
        if (v.kind == V_DICT) return *out = tpl_int(v.dict->n), 0;
        if (want_seq(r, line, v, "length", &items)) return -1;
        return *out = tpl_int(items->n), 0;
    }
    if (NAME_IS(name, "tojson")) return filter_tojson(r, line, v, a, out);
    if (NAME_IS(name, "trim") || NAME_IS(name, "string")) {
        tpl_value str, chars = arg(a, 0, "chars", none);
        if (tpl_to_str_checked(r, line, v, &str)) return -1;
        if (name[0] == 's') return *out = str, 0;
        if (chars.kind != V_NONE && want_str(r, line, chars, "trim")) return -1;
        return py_strip(r, line, str, chars.kind == V_STR ? &chars : NULL, 1, 1, out);
    }
    if (NAME_IS(name, "safe") || NAME_IS(name, "e") || NAME_IS(name, "escape")) {
        tpl_value str;
        if (name[0] == 's') return *out = v, 0;
        if (tpl_to_str_checked(r, line, v, &str)) return -1;
        tpl_buf b = {0};
        for (size_t i = 0; i < str.str.len && !b.over; i++) {
            char c = str.str.s[i];
            const char *rep = c == '&'    ? "&amp;"
                              : c == '<'  ? "&lt;"
                              : c == '>'  ? "&gt;"
                              : c == '"'  ? "&#34;"
                              : c == '\'' ? "&#39;"
                                          : NULL;
            rep ? tpl_buf_add(&b, rep, strlen(rep)) : tpl_buf_addc(&b, c);
        }
        return tpl_buf_value(r, line, &b, out);
    }
    if (NAME_IS(name, "upper") || NAME_IS(name, "lower") || NAME_IS(name, "title") ||
        NAME_IS(name, "capitalize")) {
        tpl_value str;
        if (tpl_to_str_checked(r, line, v, &str)) return -1;
        int mode = name[0] == 'u'   ? CASE_UPPER
                   : name[0] == 'l' ? CASE_LOWER
                   : name[0] == 't' ? CASE_TITLE
                                    : -1;
        *out = mode >= 0 ? py_case(r, str, mode) : py_case(r, py_case(r, str, CASE_LOWER), CASE_CAPITALIZE);
        return 0;
    }
    if (NAME_IS(name, "replace")) {
        tpl_value str, o = arg(a, 0, "old", none), n = arg(a, 1, "new", none);
        tpl_value c = arg(a, 2, "count", none);
        if (tpl_to_str_checked(r, line, v, &str)) return -1;
        if (want_str(r, line, o, "replace") || want_str(r, line, n, "replace")) return -1;
        return py_replace(r, line, str, o, n, c.kind == V_INT ? c.i : -1, out);
    }
    if (NAME_IS(name, "list")) {
        if (want_seq(r, line, v, "list", &items)) return -1;
        *out = tpl_new_list(&r->arena);
        tpl_list_reserve(&r->arena, out->list, items->n);
        for (int i = 0; i < items->n; i++) tpl_list_push(&r->arena, out->list, items->items[i]);
        return 0;
    }
    if (NAME_IS(name, "first") || NAME_IS(name, "last")) {
        if (want_seq(r, line, v, name, &items)) return -1;
        *out = items->n ? items->items[name[0] == 'f' ? 0 : items->n - 1] : tpl_undef(name);
        return 0;
    }
    if (NAME_IS(name, "reverse")) {
        if (want_seq(r, line, v, "reverse", &items)) return -1;
        if (v.kind == V_STR) {
            tpl_buf b = {0};
            for (int i = items->n - 1; i >= 0; i--)
                tpl_buf_add(&b, items->items[i].str.s, items->items[i].str.len);
            return tpl_buf_value(r, line, &b, out);
        }
        *out = tpl_new_list(&r->arena);
        tpl_list_reserve(&r->arena, out->list, items->n);
        for (int i = items->n - 1; i >= 0; i--) tpl_list_push(&r->arena, out->list, items->items[i]);
        return 0;
    }
    if (NAME_IS(name, "join")) {
        tpl_value sep = arg(a, 0, "d", tpl_str("", 0)), attr = arg(a, 1, "attribute", none);
        if (want_seq(r, line, v, "join", &items) || want_str(r, line, sep, "join")) return -1;
        tpl_buf b = {0};
        for (int i = 0; i < items->n && !b.over; i++) {
            tpl_value x = items->items[i];
            if (attr.kind != V_NONE && item_attr(r, line, x, attr, &x)) return tpl_buf_free(&b), -1;
            if (i) tpl_buf_add(&b, sep.str.s, sep.str.len);
            tpl_write_str(&b, x);
        }
        return tpl_buf_value(r, line, &b, out);
    }
    if (NAME_IS(name, "selectattr") || NAME_IS(name, "rejectattr"))
        return select_items(r, line, v, a, 1, name[0] == 's', out);
    if (NAME_IS(name, "select") || NAME_IS(name, "reject"))
        return select_items(r, line, v, a, 0, name[0] == 's', out);
    if (NAME_IS(name, "map")) {
        if (want_seq(r, line, v, "map", &items)) return -1;
        tpl_value attr = arg(a, -1, "attribute", none), def = arg(a, -1, "default", tpl_undef("default"));
        *out = tpl_new_list(&r->arena);
        for (int i = 0; i < items->n; i++) {
            tpl_value x = items->items[i];
            if (attr.kind != V_NONE) {
                if (item_attr(r, line, x, attr, &x)) return -1;
                if (x.kind == V_UNDEF) x = def;
            } else if (a->n_pos >= 1 && a->pos[0].kind == V_STR) {
                char *fname = tpl_strdup(&r->arena, a->pos[0].str.s, a->pos[0].str.len);
                tpl_args rest = {.pos = a->pos + 1,
                                 .n_pos = a->n_pos - 1,
                                 .kw_names = a->kw_names,
                                 .kw = a->kw,
                                 .n_kw = a->n_kw};
                if (tpl_filter(r, s, line, fname, x, &rest, &x)) return -1;
            } else {
                return tpl_fail(r, line, "map needs attribute= or a filter name");
            }
            tpl_list_push(&r->arena, out->list, x);
        }
        return 0;
    }
    if (NAME_IS(name, "items")) {
        if (v.kind != V_DICT) return tpl_fail(r, line, "items expects a mapping");
        return tpl_method(r, line, v, "items", a, out);
    }
    if (NAME_IS(name, "dictsort")) {
        if (v.kind != V_DICT) return tpl_fail(r, line, "dictsort expects a mapping");
        if (tpl_method(r, line, v, "items", a, out)) return -1;
        return sort_values(r, line, out->list->items, out->list->n, 0, 1);
    }
    if (NAME_IS(name, "unique")) { /* first-seen order */
        if (want_seq(r, line, v, name, &items)) return -1;
        *out = tpl_new_list(&r->arena);
        for (int i = 0; i < items->n; i++) {
            if (tpl_budget(r, line, (uint64_t)out->list->n * tpl_size(items->items[i])))
                return -1; /* charged */
            int dup = 0;
            for (int k = 0; k < out->list->n && !dup; k++)
                dup = tpl_equal(out->list->items[k], items->items[i]);
            if (!dup) tpl_list_push(&r->arena, out->list, items->items[i]);
        }
        return 0;
    }
    if (NAME_IS(name, "sort") || NAME_IS(name, "min") || NAME_IS(name, "max") || NAME_IS(name, "sum")) {
        if (want_seq(r, line, v, name, &items)) return -1;
        tpl_value attr = arg(a, -1, "attribute", none);
        if (attr.kind != V_NONE && !NAME_IS(name, "sum"))
            return tpl_fail(r, line, "%s(attribute=...) is not supported", name);
        tpl_value l = tpl_new_list(&r->arena);
        tpl_list_reserve(&r->arena, l.list, items->n);
        for (int i = 0; i < items->n; i++) {
            tpl_value x = items->items[i];
            if (attr.kind != V_NONE && item_attr(r, line, x, attr, &x)) return -1;
            tpl_list_push(&r->arena, l.list, x);
        }
        if (NAME_IS(name, "sum")) {
            tpl_value acc = arg(a, -1, "start", tpl_int(0));
            for (int i = 0; i < l.list->n; i++) {
                tpl_node x = {.kind = E_LIT, .line = line, .lit = acc};
                tpl_node y = {.kind = E_LIT, .line = line, .lit = l.list->items[i]};
                tpl_node bin = {.kind = E_BIN, .line = line, .op = OP_ADD, .a = &x, .b = &y};
                if (tpl_eval(r, NULL, &bin, &acc)) return -1;
            }
            return *out = acc, 0;
        }
        if (sort_values(r, line, l.list->items, l.list->n,
                        NAME_IS(name, "sort") && tpl_truthy(arg(a, 0, "reverse", tpl_bool(0))), 0))
            return -1;
        if (NAME_IS(name, "sort")) return *out = l, 0;
        *out = l.list->n ? l.list->items[name[1] == 'i' ? 0 : l.list->n - 1] : tpl_undef(name);
        return 0;
    }
    if (NAME_IS(name, "int") || NAME_IS(name, "float") || NAME_IS(name, "abs") || NAME_IS(name, "round")) {
        double d = 0;
        int ok = 1;
        if (tpl_is_number(v))
            d = tpl_as_double(v);
        else if (v.kind == V_STR) {
            char *end, *tmp = tpl_strdup(&r->arena, v.str.s, v.str.len);
            d = strtod(tmp, &end);
            ok = end != tmp && *end == 0;
        } else
            ok = 0;
        if (NAME_IS(name, "int")) {
            if (v.kind == V_INT) return *out = v, 0; /* not through a double: exact */
            if (ok && isnan(d)) ok = 0;              /* Python's int(nan) is a ValueError: the default */
            if (ok && !(d > -9223372036854775808.0 && d < 9223372036854775808.0))
                return tpl_fail(r, line, "int: %g does not fit in 64 bits", d);
            return *out = ok ? tpl_int((int64_t)d) : arg(a, 0, "default", tpl_int(0)), 0;
        }
        if (NAME_IS(name, "float")) return *out = ok ? tpl_float(d) : arg(a, 0, "default", tpl_float(0)), 0;
        if (!tpl_is_number(v)) return tpl_fail(r, line, "%s expects a number", name);
        if (NAME_IS(name, "abs")) {
            if (v.kind == V_FLOAT) return *out = tpl_float(fabs(v.f)), 0;
            const int64_t i = v.kind == V_INT ? v.i : v.b;
            if (i == INT64_MIN) return tpl_fail(r, line, "integer overflow in abs(%lld)", (long long)i);
            return *out = tpl_int(i < 0 ? -i : i), 0;
        }
        tpl_value prec = arg(a, 0, "precision", tpl_int(0));
        const int64_t digits = prec.kind == V_INT ? prec.i : 0;
        if (digits > 300) return *out = tpl_float(d), 0;                 /* 10^digits is inf */
        if (digits < -300) return *out = tpl_float(copysign(0.0, d)), 0; /* and here 0 */
        double p = pow(10, (double)digits);
        return *out = tpl_float(round(d * p) / p), 0;
    }
    if (NAME_IS(name, "indent")) {
        tpl_value str, w = arg(a, 0, "width", tpl_int(4));
        int first = tpl_truthy(arg(a, 1, "first", tpl_bool(0))),
            blank = tpl_truthy(arg(a, 2, "blank", tpl_bool(0)));
        if (tpl_to_str_checked(r, line, v, &str)) return -1;
        tpl_buf b = {0};
        /* Python: " " * width, nothing when < 0; written only where a line takes it, so a huge width
         * fails on the output's size, not up front */
        const uint64_t width = w.kind != V_INT ? 4 : w.i > 0 ? (uint64_t)w.i : 0;
        size_t i = 0;
        for (int ln = 0; i <= str.str.len && !b.over; ln++) {
            const char *nl = memchr(str.str.s + i, '\n', str.str.len - i);
            size_t e = nl ? (size_t)(nl - str.str.s) : str.str.len;
            int empty = e == i;
            if ((ln > 0 || first) && (blank || !empty)) {
                if (w.kind == V_STR)
                    tpl_buf_add(&b, w.str.s, w.str.len);
                else
                    tpl_buf_spaces(&b, width);
            }
            tpl_buf_add(&b, str.str.s + i, e - i);
            if (!nl) break;
            tpl_buf_addc(&b, '\n');
            i = e + 1;
        }
        return tpl_buf_value(r, line, &b, out);
    }
    return tpl_fail(r, line, "unknown filter '%s'", name);
}

/* ---- globals ---- */

int tpl_call_global(tpl_render *r, int line, tpl_value fn, const tpl_args *a, tpl_value *out) {
    switch (fn.fn.id) {
    case F_RAISE_EXCEPTION: {
        tpl_buf b = {0};
        if (a->n_pos) tpl_write_str(&b, a->pos[0]);
        tpl_fail(r, line, "the template raised an exception: %s", b.data ? b.data : "");
        tpl_buf_free(&b);
        return -1;
    }
    case F_STRFTIME_NOW: {
        if (a->n_pos < 1 || want_str(r, line, a->pos[0], "strftime_now")) return -1;
        char fmt[256], buf[512];
        snprintf(fmt, sizeof fmt, "%.*s", (int)a->pos[0].str.len, a->pos[0].str.s);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof buf, fmt, &tm);
        *out = tpl_str_copy(&r->arena, buf, n);
        return 0;
    }
    case F_NAMESPACE:
    case F_DICT: {
        /* every pair in order, then set at once in n log n (merging a large mapping key by key,
         * each looked up first, was quadratic) */
        uint64_t total = (uint64_t)a->n_kw;
        for (int i = 0; i < a->n_pos; i++) {
            if (a->pos[i].kind != V_DICT) return tpl_fail(r, line, "positional arguments must be mappings");
            total += (uint64_t)a->pos[i].dict->n;
        }
        if (tpl_room_items(r, line, fn.fn.id == F_NAMESPACE ? "namespace()" : "dict()", total)) return -1;
        tpl_value *keys = tpl_alloc(&r->arena, sizeof(tpl_value) * (size_t)(total + 1)),
                  *vals = tpl_alloc(&r->arena, sizeof(tpl_value) * (size_t)(total + 1));
        int n = 0;
        for (int i = 0; i < a->n_pos; i++)
            for (int k = 0; k < a->pos[i].dict->n; k++, n++)
                keys[n] = a->pos[i].dict->keys[k], vals[n] = a->pos[i].dict->vals[k];
        for (int k = 0; k < a->n_kw; k++, n++) {
            if (fn.fn.id == F_NAMESPACE && a->kw_names[k][0] == '_')
                return tpl_fail(r, line, "namespace attributes cannot start with '_'");
            keys[n] = tpl_str(a->kw_names[k], strlen(a->kw_names[k])), vals[n] = a->kw[k];
        }
        *out = tpl_new_dict(&r->arena);
        out->dict->is_namespace = fn.fn.id == F_NAMESPACE;
        tpl_dict_set_many(&r->arena, out->dict, keys, vals, n);
        return tpl_check_nesting(r, line, *out);
    }
    case F_RANGE: {
        int64_t v[3] = {0, 0, 1};
        if (a->n_pos < 1 || a->n_pos > 3) return tpl_fail(r, line, "range expects 1 to 3 integers");
        for (int i = 0; i < a->n_pos; i++) {
            if (a->pos[i].kind != V_INT) return tpl_fail(r, line, "range expects integers");
            v[a->n_pos == 1 ? 1 : i] = a->pos[i].i;
        }
        if (v[2] == 0) return tpl_fail(r, line, "range() step must not be zero");
        /* the length in 64 unsigned bits: stop - start may not fit a signed one */
        const int up = v[2] > 0;
        const uint64_t span = up ? (v[0] < v[1] ? (uint64_t)v[1] - (uint64_t)v[0] : 0)
                                 : (v[0] > v[1] ? (uint64_t)v[0] - (uint64_t)v[1] : 0),
                       step = up ? (uint64_t)v[2] : (uint64_t)0 - (uint64_t)v[2],
                       n = span ? (span - 1) / step + 1 : 0;
        if (n > TPL_MAX_RANGE)
            return tpl_fail(r, line, "range() of %llu items exceeds the limit %d", (unsigned long long)n,
                            TPL_MAX_RANGE);
        *out = tpl_new_list(&r->arena);
        tpl_list_reserve(&r->arena, out->list, (int64_t)n);
        for (uint64_t k = 0; k < n; k++) /* start + k * step stays between start and stop */
            tpl_list_push(&r->arena, out->list, tpl_int((int64_t)((uint64_t)v[0] + k * (uint64_t)v[2])));
        return 0;
    }
    default: return tpl_fail(r, line, "not callable");
    }
}
