/* Expression evaluation with Python's and Jinja's semantics: names resolved through the scope chain
 * (then the globals), attribute and item access that yield Undefined where Jinja does, slices,
 * operators, calls. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

int tpl_fail(tpl_render *r, int line, const char *fmt, ...) {
    if (r->failed) return -1;
    va_list ap;
    va_start(ap, fmt);
    int k = line > 0 ? snprintf(r->err, sizeof r->err, "line %d: ", line) : 0;
    vsnprintf(r->err + k, sizeof r->err - (size_t)k, fmt, ap);
    va_end(ap);
    r->failed = 1;
    return -1;
}

static const struct {
    const char *name;
    tpl_func id;
} globals[] = {{"raise_exception", F_RAISE_EXCEPTION},
               {"strftime_now", F_STRFTIME_NOW},
               {"namespace", F_NAMESPACE},
               {"dict", F_DICT},
               {"range", F_RANGE}};

tpl_value tpl_lookup(const tpl_scope *s, const char *name, size_t len, uint64_t *walked) {
    for (; s; s = s->parent) {
        if (walked) *walked += 1 + (uint64_t)s->vars.n;
        int i = tpl_dict_find(&s->vars, name, len);
        if (i >= 0) return s->vars.vals[i];
    }
    for (size_t g = 0; g < sizeof globals / sizeof globals[0]; g++)
        if (strlen(globals[g].name) == len && memcmp(globals[g].name, name, len) == 0)
            return (tpl_value){.kind = V_FUNC, .fn = {globals[g].id, NULL}};
    return tpl_undef(name);
}

void tpl_assign(tpl_render *r, tpl_scope *s, const char *name, tpl_value v) {
    tpl_dict_set(&r->arena, &s->vars, tpl_str(name, strlen(name)), v);
}

static int undefined_error(tpl_render *r, int line, tpl_value v) {
    return tpl_fail(r, line, "'%s' is undefined", v.undef_name ? v.undef_name : "value");
}

/* Python's slice.indices(): normalised start, stop, step for a sequence of length n. */
static int slice_range(tpl_render *r, int line, tpl_value *part, int64_t n, int64_t *start, int64_t *stop,
                       int64_t *step) {
    for (int k = 0; k < 3; k++)
        if (part[k].kind != V_NONE && part[k].kind != V_INT && part[k].kind != V_BOOL)
            return tpl_fail(r, line, "slice indices must be integers or None");
    *step = part[2].kind == V_NONE ? 1 : part[2].kind == V_BOOL ? part[2].b : part[2].i;
    if (*step == 0) return tpl_fail(r, line, "slice step cannot be zero");
    int64_t lo = *step < 0 ? -1 : 0, hi = *step < 0 ? n - 1 : n;
    for (int k = 0; k < 2; k++) {
        int64_t *dst = k == 0 ? start : stop;
        if (part[k].kind == V_NONE) {
            *dst = (k == 0) == (*step > 0) ? lo : hi;
            continue;
        }
        int64_t v = part[k].kind == V_BOOL ? part[k].b : part[k].i; /* a bool's .i is not all set */
        if (v < 0) v += n;
        if (v < lo) v = lo;
        if (v > hi) v = hi;
        *dst = v;
    }
    return 0;
}

static int eval_slice(tpl_render *r, tpl_scope *s, const tpl_node *e, tpl_value *out) {
    tpl_value obj, part[3] = {tpl_none(), tpl_none(), tpl_none()};
    if (tpl_eval(r, s, e->a, &obj)) return -1;
    const tpl_node *p[3] = {e->b, e->c, e->args.n ? e->args.v[0] : NULL};
    for (int k = 0; k < 3; k++)
        if (p[k] && tpl_eval(r, s, p[k], &part[k])) return -1;
    if (obj.kind == V_UNDEF) return undefined_error(r, e->line, obj);
    if (obj.kind == V_STR && tpl_walk(r, e->line, obj)) return -1; /* its code points are counted */
    int64_t n, start = 0, stop = 0, step = 1;
    if (obj.kind == V_LIST)
        n = obj.list->n;
    else if (obj.kind == V_STR)
        n = (int64_t)tpl_utf8_count(obj.str.s, obj.str.len);
    else
        return tpl_fail(r, e->line, "'%s' object is not subscriptable", tpl_kind_name(obj.kind));
    if (slice_range(r, e->line, part, n, &start, &stop, &step)) return -1;
    /* how many indices start, start + step, ... lie before stop (in 64 bits: |step| may be 2^63) */
    const uint64_t span = step > 0 ? (start < stop ? (uint64_t)(stop - start) : 0)
                                   : (start > stop ? (uint64_t)(start - stop) : 0),
                   ustep = step > 0 ? (uint64_t)step : (uint64_t)0 - (uint64_t)step,
                   count = span ? (span - 1) / ustep + 1 : 0;
    if (obj.kind == V_LIST) {
        *out = tpl_new_list(&r->arena);
        tpl_list_reserve(&r->arena, out->list, (int64_t)count);
        for (uint64_t k = 0; k < count; k++)
            tpl_list_push(&r->arena, out->list, obj.list->items[start + (int64_t)k * step]);
        return 0;
    }
    /* walk the code points once (indexing each from the start would be quadratic) */
    tpl_buf b = {0};
    const char *str = obj.str.s;
    const size_t len = obj.str.len;
    size_t at = tpl_utf8_offset(str, len, (size_t)start);
    for (uint64_t k = 0; k < count; k++) {
        if (k) at = tpl_utf8_step(str, len, at, step);
        size_t end = tpl_utf8_step(str, len, at, 1);
        tpl_buf_add(&b, str + at, end - at);
    }
    return tpl_buf_value(r, e->line, &b, out);
}

int tpl_getitem(tpl_render *r, int line, tpl_value obj, tpl_value key, tpl_value *out) {
    if (obj.kind == V_UNDEF) return undefined_error(r, line, obj);
    if (obj.kind != V_LIST && tpl_walk(r, line, obj)) return -1; /* a key's search, a code point's offset */
    if (obj.kind == V_DICT) {
        if (key.kind != V_STR) return *out = tpl_undef("item"), 0;
        int i = tpl_dict_find(obj.dict, key.str.s, key.str.len);
        *out = i >= 0 ? obj.dict->vals[i] : tpl_undef(tpl_strdup(&r->arena, key.str.s, key.str.len));
        return 0;
    }
    if ((obj.kind == V_LIST || obj.kind == V_STR) && (key.kind == V_INT || key.kind == V_BOOL)) {
        int64_t n = obj.kind == V_LIST ? obj.list->n : (int64_t)tpl_utf8_count(obj.str.s, obj.str.len);
        int64_t i = key.kind == V_INT ? key.i : key.b;
        if (i < 0) i += n;
        if (i < 0 || i >= n) return *out = tpl_undef("index"), 0; /* Jinja: out of range is Undefined */
        if (obj.kind == V_LIST) return *out = obj.list->items[i], 0;
        size_t o = tpl_utf8_offset(obj.str.s, obj.str.len, (size_t)i);
        size_t e = tpl_utf8_offset(obj.str.s, obj.str.len, (size_t)i + 1);
        return *out = tpl_str(obj.str.s + o, e - o), 0;
    }
    *out = tpl_undef("item");
    return 0;
}

static int overflow(tpl_render *r, int line, const char *sym, int64_t x, int64_t y) {
    return tpl_fail(r, line, "integer overflow in %lld %s %lld (ctrl's template integers are 64-bit)",
                    (long long)x, sym, (long long)y);
}

/* x ** y for y >= 0 by squaring, or -1 on overflow. */
static int int_pow(int64_t x, int64_t y, int64_t *out) {
    int64_t p = 1;
    if (x == 0 || x == 1) return *out = y == 0 ? 1 : x, 0;
    if (x == -1) return *out = y % 2 ? -1 : 1, 0;
    for (;;) { /* |x| >= 2: at most 63 squarings before overflow */
        if ((y & 1) && __builtin_mul_overflow(p, x, &p)) return -1;
        y >>= 1;
        if (!y) return *out = p, 0;
        if (__builtin_mul_overflow(x, x, &x)) return -1;
    }
}

/* Integer arithmetic with Python's results, or a template error where they do not fit 64 bits. */
static int int_arith(tpl_render *r, int line, int op, const char *sym, int64_t x, int64_t y, tpl_value *out) {
    int64_t v;
    switch (op) {
    case OP_ADD:
        if (__builtin_add_overflow(x, y, &v)) return overflow(r, line, sym, x, y);
        break;
    case OP_SUB:
        if (__builtin_sub_overflow(x, y, &v)) return overflow(r, line, sym, x, y);
        break;
    case OP_MUL:
        if (__builtin_mul_overflow(x, y, &v)) return overflow(r, line, sym, x, y);
        break;
    case OP_FLOORDIV:
    case OP_MOD: {
        if (y == -1) { /* x / -1 and x % -1 trap on INT64_MIN */
            if (op == OP_MOD) return *out = tpl_int(0), 0;
            if (x == INT64_MIN) return overflow(r, line, sym, x, y);
            return *out = tpl_int(-x), 0;
        }
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) q--, m += y; /* Python floors */
        v = op == OP_MOD ? m : q;
        break;
    }
    default: /* OP_POW, y >= 0 */
        if (int_pow(x, y, &v)) return overflow(r, line, sym, x, y);
    }
    *out = tpl_int(v);
    return 0;
}

static int arith(tpl_render *r, int line, int op, tpl_value a, tpl_value b, tpl_value *out) {
    static const char *const sym[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    if (a.kind == V_UNDEF) return undefined_error(r, line, a);
    if (b.kind == V_UNDEF) return undefined_error(r, line, b);
    if (tpl_is_number(a) && tpl_is_number(b)) {
        int ints = a.kind != V_FLOAT && b.kind != V_FLOAT;
        int64_t x = a.kind == V_INT ? a.i : a.b, y = b.kind == V_INT ? b.i : b.b;
        double fx = tpl_as_double(a), fy = tpl_as_double(b);
        if (ints && op != OP_DIV && (op != OP_POW || y >= 0)) {
            if ((op == OP_FLOORDIV || op == OP_MOD) && y == 0)
                return tpl_fail(r, line, "integer division or modulo by zero");
            return int_arith(r, line, op, sym[op], x, y, out);
        }
        switch (op) {
        case OP_ADD: *out = tpl_float(fx + fy); return 0;
        case OP_SUB: *out = tpl_float(fx - fy); return 0;
        case OP_MUL: *out = tpl_float(fx * fy); return 0;
        case OP_DIV:
            if (fy == 0) return tpl_fail(r, line, "division by zero");
            *out = tpl_float(fx / fy);
            return 0;
        case OP_FLOORDIV:
        case OP_MOD:
            if (fy == 0) return tpl_fail(r, line, "float floor division or modulo by zero");
            {
                double q = floor(fx / fy), m = fx - q * fy;
                *out = tpl_float(op == OP_MOD ? m : q);
            }
            return 0;
        case OP_POW: *out = tpl_float(pow(fx, fy)); return 0;
        }
    }
    if (op == OP_ADD && a.kind == V_STR && b.kind == V_STR) {
        if (tpl_room(r, line, "+", 1, (uint64_t)a.str.len + b.str.len)) return -1;
        char *s = tpl_alloc(&r->arena, a.str.len + b.str.len + 1);
        memcpy(s, a.str.s, a.str.len), memcpy(s + a.str.len, b.str.s, b.str.len);
        *out = tpl_str(s, a.str.len + b.str.len);
        return 0;
    }
    if (op == OP_ADD && a.kind == V_LIST && b.kind == V_LIST) {
        if (tpl_room_items(r, line, "+", (uint64_t)a.list->n + (uint64_t)b.list->n)) return -1;
        *out = tpl_new_list(&r->arena);
        tpl_list_reserve(&r->arena, out->list, (int64_t)a.list->n + b.list->n);
        for (int i = 0; i < a.list->n; i++) tpl_list_push(&r->arena, out->list, a.list->items[i]);
        for (int i = 0; i < b.list->n; i++) tpl_list_push(&r->arena, out->list, b.list->items[i]);
        return 0;
    }
    if (op == OP_MUL && (a.kind == V_STR || a.kind == V_LIST) && b.kind == V_INT) {
        tpl_value rep = b;
        b = a, a = rep;
    }
    if (op == OP_MUL && a.kind == V_INT && (b.kind == V_STR || b.kind == V_LIST)) {
        const uint64_t times = a.i > 0 ? (uint64_t)a.i : 0; /* Python: a count <= 0 repeats nothing */
        if (b.kind == V_STR) {
            if (tpl_room(r, line, "string repetition", times, b.str.len)) return -1;
            tpl_buf buf = {0};
            for (uint64_t k = 0; k < times && b.str.len; k++) tpl_buf_add(&buf, b.str.s, b.str.len);
            return tpl_buf_value(r, line, &buf, out);
        }
        if (b.list->n && times > TPL_MAX_ITEMS) return tpl_room_items(r, line, "list repetition", times);
        if (tpl_room_items(r, line, "list repetition", times * (uint64_t)b.list->n)) return -1;
        *out = tpl_new_list(&r->arena);
        tpl_list_reserve(&r->arena, out->list, (int64_t)(times * (uint64_t)b.list->n));
        for (uint64_t k = 0; k < times && b.list->n; k++)
            for (int i = 0; i < b.list->n; i++) tpl_list_push(&r->arena, out->list, b.list->items[i]);
        return 0;
    }
    return tpl_fail(r, line, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op],
                    tpl_kind_name(a.kind), tpl_kind_name(b.kind));
}

/* Comparisons walk their operands: each is charged to the step budget by tpl_size, so that a loop
 * comparing large values cannot run for minutes. */
static int compare(tpl_render *r, int line, int op, tpl_value a, tpl_value b, tpl_value *out) {
    const uint64_t sa = tpl_size(a), sb = tpl_size(b);
    if (tpl_budget(r, line, op == OP_IN || op == OP_NOT_IN ? sb : sa < sb ? sa : sb)) return -1;
    if (op == OP_EQ || op == OP_NE) return *out = tpl_bool(tpl_equal(a, b) == (op == OP_EQ)), 0;
    if (op == OP_IN || op == OP_NOT_IN) {
        int found = 0;
        if (b.kind == V_UNDEF) return undefined_error(r, line, b);
        if (b.kind == V_STR) {
            if (a.kind != V_STR) return tpl_fail(r, line, "'in <string>' requires string as left operand");
            found = a.str.len == 0 || memmem(b.str.s, b.str.len, a.str.s, a.str.len) != NULL;
        } else if (b.kind == V_LIST) {
            for (int i = 0; !found && i < b.list->n; i++) found = tpl_equal(a, b.list->items[i]);
        } else if (b.kind == V_DICT) {
            found = a.kind == V_STR && tpl_dict_find(b.dict, a.str.s, a.str.len) >= 0;
        } else {
            return tpl_fail(r, line, "argument of type '%s' is not iterable", tpl_kind_name(b.kind));
        }
        return *out = tpl_bool(found == (op == OP_IN)), 0;
    }
    int c;
    if (tpl_is_number(a) && tpl_is_number(b)) {
        double x = tpl_as_double(a), y = tpl_as_double(b);
        c = x < y ? -1 : x > y ? 1 : 0;
    } else if (a.kind == V_STR && b.kind == V_STR) {
        size_t m = a.str.len < b.str.len ? a.str.len : b.str.len;
        c = memcmp(a.str.s, b.str.s, m);
        if (c == 0) c = a.str.len < b.str.len ? -1 : a.str.len > b.str.len;
    } else {
        if (a.kind == V_UNDEF) return undefined_error(r, line, a);
        if (b.kind == V_UNDEF) return undefined_error(r, line, b);
        return tpl_fail(r, line, "'<' not supported between instances of '%s' and '%s'",
                        tpl_kind_name(a.kind), tpl_kind_name(b.kind));
    }
    int res = op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0;
    *out = tpl_bool(res);
    return 0;
}

static int eval_args(tpl_render *r, tpl_scope *s, const tpl_node *e, tpl_value *first, tpl_args *a) {
    int extra = first ? 1 : 0;
    a->n_pos = e->args.n + extra;
    a->pos = tpl_alloc(&r->arena, sizeof(tpl_value) * (size_t)(a->n_pos + 1));
    if (first) a->pos[0] = *first;
    for (int i = 0; i < e->args.n; i++)
        if (tpl_eval(r, s, e->args.v[i], &a->pos[i + extra])) return -1;
    a->n_kw = e->kw_vals.n;
    a->kw_names = e->kw_names;
    a->kw = tpl_alloc(&r->arena, sizeof(tpl_value) * (size_t)(a->n_kw + 1));
    for (int i = 0; i < e->kw_vals.n; i++)
        if (tpl_eval(r, s, e->kw_vals.v[i], &a->kw[i])) return -1;
    return 0;
}

static int run_macro(tpl_render *r, const tpl_node *m, const tpl_args *a, tpl_value *out);

/* A macro call: parameters bound in a scope whose parent is the template's top level; the output
 * the body renders is the return value. */
static int call_macro(tpl_render *r, const tpl_node *m, const tpl_args *a, tpl_value *out) {
    if (a->n_pos > m->n_targets)
        return tpl_fail(r, m->line, "macro '%s' takes %d arguments", m->name, m->n_targets);
    if (r->macro_depth >= TPL_MAX_MACRO_DEPTH)
        return tpl_fail(r, m->line, "macro '%s': calls nested deeper than %d (unbounded recursion?)", m->name,
                        TPL_MAX_MACRO_DEPTH);
    r->macro_depth++;
    const int rc = run_macro(r, m, a, out);
    r->macro_depth--;
    return rc;
}

static int run_macro(tpl_render *r, const tpl_node *m, const tpl_args *a, tpl_value *out) {
    tpl_scope scope = {.parent = r->root};
    for (int i = 0; i < m->n_targets; i++) {
        tpl_value v;
        if (i < a->n_pos)
            v = a->pos[i];
        else if (tpl_eval(r, r->root, m->args.v[i], &v))
            return -1;
        for (int k = 0; k < a->n_kw; k++)
            if (!strcmp(a->kw_names[k], m->targets[i])) v = a->kw[k];
        tpl_assign(r, &scope, m->targets[i], v);
    }
    size_t mark = r->out.len;
    if (tpl_exec(r, &scope, &m->body)) return -1;
    *out = tpl_str_copy(&r->arena, r->out.data + mark, r->out.len - mark);
    r->out.len = r->gen.len = mark;
    if (r->out.data) r->out.data[mark] = 0;
    return 0;
}

static int eval_call(tpl_render *r, tpl_scope *s, const tpl_node *e, tpl_value *out) {
    tpl_args a;
    if (e->a->kind == E_ATTR) { /* obj.method(...) */
        tpl_value obj;
        if (tpl_eval(r, s, e->a->a, &obj) || eval_args(r, s, e, NULL, &a)) return -1;
        if (obj.kind == V_UNDEF) return undefined_error(r, e->line, obj);
        return tpl_method(r, e->line, obj, e->a->name, &a, out);
    }
    tpl_value fn;
    if (tpl_eval(r, s, e->a, &fn) || eval_args(r, s, e, NULL, &a)) return -1;
    if (fn.kind == V_UNDEF) return undefined_error(r, e->line, fn);
    if (fn.kind != V_FUNC) return tpl_fail(r, e->line, "'%s' object is not callable", tpl_kind_name(fn.kind));
    if (fn.fn.id == F_MACRO) return call_macro(r, fn.fn.macro, &a, out);
    return tpl_call_global(r, e->line, fn, &a, out);
}

static int eval_node(tpl_render *r, tpl_scope *s, const tpl_node *e, tpl_value *out);

/* Every evaluation counts against the step budget and the nesting limit (a left-deep chain such as
 * a + a + ... + a nests as deep as it is long). */
int tpl_eval(tpl_render *r, tpl_scope *s, const tpl_node *e, tpl_value *out) {
    if (tpl_budget(r, e->line, 1)) return -1;
    if (r->depth >= TPL_MAX_DEPTH)
        return tpl_fail(r, e->line, "expressions and blocks nested deeper than %d levels", TPL_MAX_DEPTH);
    r->depth++;
    const int rc = eval_node(r, s, e, out);
    r->depth--;
    return rc;
}

static int eval_node(tpl_render *r, tpl_scope *s, const tpl_node *e, tpl_value *out) {
    tpl_value a, b;
    switch (e->kind) {
    case E_LIT: *out = e->lit; return 0;
    case E_NAME: { /* a lookup from inside nested loops and macros walks every scope out to the root */
        uint64_t walked = 0;
        *out = tpl_lookup(s, e->name, e->name_len, &walked);
        return tpl_budget(r, e->line, walked / 4);
    }
    case E_ATTR:
        if (tpl_eval(r, s, e->a, &a)) return -1;
        if (a.kind == V_UNDEF) return undefined_error(r, e->line, a);
        if (a.kind == V_DICT) {
            if (tpl_walk(r, e->line, a)) return -1;
            int i = tpl_dict_find(a.dict, e->name, e->name_len);
            *out = i >= 0 ? a.dict->vals[i] : tpl_undef(e->name);
        } else {
            *out = tpl_undef(e->name);
        }
        return 0;
    case E_ITEM:
        if (tpl_eval(r, s, e->a, &a) || tpl_eval(r, s, e->b, &b)) return -1;
        return tpl_getitem(r, e->line, a, b, out);
    case E_SLICE: return eval_slice(r, s, e, out);
    case E_CALL: return eval_call(r, s, e, out);
    case E_FILTER: {
        tpl_args args;
        if (tpl_eval(r, s, e->a, &a) || eval_args(r, s, e, NULL, &args)) return -1;
        return tpl_filter(r, s, e->line, e->name, a, &args, out);
    }
    case E_TEST: {
        tpl_args args;
        int res;
        if (tpl_eval(r, s, e->a, &a) || eval_args(r, s, e, NULL, &args)) return -1;
        if (tpl_test(r, e->line, e->name, a, &args, &res)) return -1;
        *out = tpl_bool(res != e->op);
        return 0;
    }
    case E_NEG:
    case E_POS:
        if (tpl_eval(r, s, e->a, &a)) return -1;
        if (!tpl_is_number(a))
            return tpl_fail(r, e->line, "bad operand type for unary %c: '%s'", e->kind == E_NEG ? '-' : '+',
                            tpl_kind_name(a.kind));
        if (e->kind == E_POS)
            *out = a.kind == V_BOOL ? tpl_int(a.b) : a;
        else if (a.kind == V_INT && a.i == INT64_MIN)
            return overflow(r, e->line, "-", 0, a.i);
        else
            *out = a.kind == V_FLOAT ? tpl_float(-a.f) : tpl_int(-(a.kind == V_INT ? a.i : a.b));
        return 0;
    case E_NOT:
        if (tpl_eval(r, s, e->a, &a)) return -1;
        *out = tpl_bool(!tpl_truthy(a));
        return 0;
    case E_AND:
    case E_OR:
        if (tpl_eval(r, s, e->a, &a)) return -1;
        if (tpl_truthy(a) == (e->kind == E_OR)) return *out = a, 0;
        return tpl_eval(r, s, e->b, out);
    case E_BIN:
        if (tpl_eval(r, s, e->a, &a) || tpl_eval(r, s, e->b, &b)) return -1;
        if (e->op == OP_CONCAT) {
            tpl_buf buf = {0};
            tpl_write_str(&buf, a), tpl_write_str(&buf, b);
            return tpl_buf_value(r, e->line, &buf, out);
        }
        if (e->op >= OP_EQ) return compare(r, e->line, e->op, a, b, out);
        return arith(r, e->line, e->op, a, b, out);
    case E_COND:
        if (tpl_eval(r, s, e->a, &a)) return -1;
        if (tpl_truthy(a)) return tpl_eval(r, s, e->b, out);
        if (e->c) return tpl_eval(r, s, e->c, out);
        *out = tpl_undef("else");
        return 0;
    case E_LIST:
    case E_TUPLE:
        *out = tpl_new_list(&r->arena);
        out->list->is_tuple = e->kind == E_TUPLE;
        for (int i = 0; i < e->args.n; i++) {
            if (tpl_eval(r, s, e->args.v[i], &a)) return -1;
            tpl_list_push(&r->arena, out->list, a);
        }
        return tpl_check_nesting(r, e->line, *out);
    case E_DICT: { /* all pairs first, then set in n log n (a literal of many keys was quadratic) */
        tpl_value *keys = tpl_alloc(&r->arena, sizeof(tpl_value) * (size_t)e->args.n),
                  *vals = tpl_alloc(&r->arena, sizeof(tpl_value) * (size_t)e->args.n);
        for (int i = 0; i < e->args.n; i++) {
            if (tpl_eval(r, s, e->args.v[i], &keys[i]) || tpl_eval(r, s, e->kw_vals.v[i], &vals[i]))
                return -1;
            if (keys[i].kind != V_STR) return tpl_fail(r, e->line, "dictionary keys must be strings here");
        }
        *out = tpl_new_dict(&r->arena);
        tpl_dict_set_many(&r->arena, out->dict, keys, vals, e->args.n);
        return tpl_check_nesting(r, e->line, *out);
    }
    default: return tpl_fail(r, e->line, "internal: not an expression");
    }
}
