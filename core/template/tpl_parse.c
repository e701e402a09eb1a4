/* Recursive-descent parser for the template subset, following Jinja's grammar and precedence:
 * conditional < or < and < not < comparisons/in < + - < ~ < * / // % < ** < unary - + <
 * postfix (. [] ()) and filters/tests. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "template/tpl_internal.h"

typedef struct parser {
    tpl_arena *a;
    const tpl_token *t;
    int n, i;
    int depth; /* nested expressions and blocks, against TPL_MAX_PARSE_DEPTH */
    char *err;
    size_t err_len;
} parser;

static int fail(parser *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(parser *P, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = snprintf(P->err, P->err_len, "line %d: ", P->t[P->i].line);
    if (k > 0 && (size_t)k < P->err_len) vsnprintf(P->err + k, P->err_len - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static const tpl_token *cur(parser *P) { return &P->t[P->i]; }
static int is_op(parser *P, const char *op) {
    const tpl_token *t = cur(P);
    return t->kind == T_OP && t->len == strlen(op) && memcmp(t->s, op, t->len) == 0;
}
static int is_name(parser *P, const char *name) {
    const tpl_token *t = cur(P);
    return t->kind == T_NAME && t->len == strlen(name) && memcmp(t->s, name, t->len) == 0;
}
static int is_name_at(parser *P, int k, const char *name) {
    const tpl_token *t = &P->t[P->i + k];
    return t->kind == T_NAME && t->len == strlen(name) && memcmp(t->s, name, t->len) == 0;
}
static int skip_op(parser *P, const char *op) { return is_op(P, op) ? (P->i++, 1) : 0; }
static int skip_name(parser *P, const char *name) { return is_name(P, name) ? (P->i++, 1) : 0; }
static int expect_op(parser *P, const char *op) { return skip_op(P, op) ? 0 : fail(P, "expected '%s'", op); }

static tpl_node *node(parser *P, tpl_node_kind k) {
    tpl_node *n = tpl_alloc(P->a, sizeof *n);
    n->kind = k, n->line = cur(P)->line;
    return n;
}

/* Appends to a node list, doubling its array at each power of two (copying it on every append
 * made a long template quadratic in memory). */
static void add(parser *P, tpl_nodes *l, tpl_node *n) {
    if (l->n == 0 || (l->n >= 4 && (l->n & (l->n - 1)) == 0)) {
        const size_t cap = l->n ? 2 * (size_t)l->n : 4;
        tpl_node **v = tpl_alloc(P->a, sizeof(tpl_node *) * cap);
        if (l->n) memcpy(v, l->v, sizeof(tpl_node *) * (size_t)l->n);
        l->v = v;
    }
    l->v[l->n++] = n;
}

/* Entering one more level of nesting (an expression, a unary operand, a block): the parser recurses,
 * so a source nested without end would overflow the stack. */
static int deeper(parser *P) {
    if (++P->depth <= TPL_MAX_PARSE_DEPTH) return 0;
    return fail(P, "expressions or blocks nested deeper than %d levels", TPL_MAX_PARSE_DEPTH);
}

static const char *name_str(parser *P, const tpl_token *t) { return tpl_strdup(P->a, t->s, t->len); }

static tpl_node *expr(parser *P);
static tpl_node *or_expr(parser *P);
static tpl_node *unary(parser *P, int with_filter);

/* (args, kw=args) after the '(' */
static int call_args(parser *P, tpl_node *n) {
    int n_kw = 0;
    const char *names[32];
    tpl_nodes kw = {0};
    while (!skip_op(P, ")")) {
        if (n->args.n + n_kw && expect_op(P, ",")) return -1;
        if (skip_op(P, ")")) break;
        if (cur(P)->kind == T_NAME && P->t[P->i + 1].kind == T_OP && P->t[P->i + 1].len == 1 &&
            P->t[P->i + 1].s[0] == '=') {
            if (n_kw == 32) return fail(P, "too many keyword arguments");
            names[n_kw++] = name_str(P, cur(P));
            P->i += 2;
            tpl_node *v = expr(P);
            if (!v) return -1;
            add(P, &kw, v);
        } else {
            if (n_kw) return fail(P, "positional argument after a keyword argument");
            tpl_node *v = expr(P);
            if (!v) return -1;
            add(P, &n->args, v);
        }
    }
    n->kw_vals = kw;
    n->kw_names = tpl_alloc(P->a, sizeof(char *) * (size_t)(n_kw + 1));
    memcpy(n->kw_names, names, sizeof(char *) * (size_t)n_kw);
    return 0;
}

static tpl_node *primary(parser *P) {
    const tpl_token *t = cur(P);
    tpl_node *n;
    switch (t->kind) {
    case T_NAME:
        n = node(P, E_LIT);
        if (is_name(P, "true") || is_name(P, "True"))
            n->lit = tpl_bool(1);
        else if (is_name(P, "false") || is_name(P, "False"))
            n->lit = tpl_bool(0);
        else if (is_name(P, "none") || is_name(P, "None"))
            n->lit = tpl_none();
        else
            n->kind = E_NAME, n->name = name_str(P, t), n->name_len = t->len;
        P->i++;
        return n;
    case T_STRING: {
        tpl_buf b = {0};
        n = node(P, E_LIT);
        while (cur(P)->kind == T_STRING) tpl_buf_add(&b, cur(P)->s, cur(P)->len), P->i++;
        n->lit = tpl_str_copy(P->a, b.data, b.len);
        tpl_buf_free(&b);
        return n;
    }
    case T_INT: n = node(P, E_LIT), n->lit = tpl_int(t->i), P->i++; return n;
    case T_FLOAT: n = node(P, E_LIT), n->lit = tpl_float(t->f), P->i++; return n;
    case T_OP:
        if (skip_op(P, "(")) {
            if (skip_op(P, ")")) return node(P, E_TUPLE);
            tpl_node *first = expr(P);
            if (!first) return NULL;
            if (!is_op(P, ",")) return expect_op(P, ")") ? NULL : first;
            n = node(P, E_TUPLE);
            add(P, &n->args, first);
            while (skip_op(P, ",")) {
                if (is_op(P, ")")) break;
                tpl_node *v = expr(P);
                if (!v) return NULL;
                add(P, &n->args, v);
            }
            return expect_op(P, ")") ? NULL : n;
        }
        if (skip_op(P, "[")) {
            n = node(P, E_LIST);
            while (!skip_op(P, "]")) {
                if (n->args.n && expect_op(P, ",")) return NULL;
                if (skip_op(P, "]")) break;
                tpl_node *v = expr(P);
                if (!v) return NULL;
                add(P, &n->args, v);
            }
            return n;
        }
        if (skip_op(P, "{")) {
            n = node(P, E_DICT);
            while (!skip_op(P, "}")) {
                if (n->args.n && expect_op(P, ",")) return NULL;
                if (skip_op(P, "}")) break;
                tpl_node *k = expr(P), *v;
                if (!k || expect_op(P, ":") || !(v = expr(P))) return NULL;
                add(P, &n->args, k), add(P, &n->kw_vals, v);
            }
            return n;
        }
        break;
    default: break;
    }
    fail(P, "unexpected %s in an expression",
         t->kind == T_VAR_END || t->kind == T_BLOCK_END ? "end of tag" : "token");
    return NULL;
}

/* The call node of callee, its arguments parsed after the '(' just read; NULL on an error. */
static tpl_node *call(parser *P, tpl_node *callee) {
    tpl_node *m = node(P, E_CALL);
    m->a = callee;
    return call_args(P, m) ? NULL : m;
}

/* A filter's or test's name (the current token, a name) into m, and room for keyword names. */
static void named(parser *P, tpl_node *m) {
    m->name = name_str(P, cur(P)), m->name_len = cur(P)->len;
    P->i++;
    m->kw_names = tpl_alloc(P->a, sizeof(char *));
}

static tpl_node *postfix(parser *P, tpl_node *n) {
    for (;;) {
        if (skip_op(P, ".")) {
            const tpl_token *t = cur(P);
            tpl_node *m = node(P, t->kind == T_INT ? E_ITEM : E_ATTR);
            m->a = n;
            if (t->kind == T_INT) {
                m->b = node(P, E_LIT), m->b->lit = tpl_int(t->i);
            } else if (t->kind == T_NAME) {
                m->name = name_str(P, t), m->name_len = t->len;
            } else {
                fail(P, "expected an attribute name after '.'");
                return NULL;
            }
            P->i++;
            n = m;
        } else if (skip_op(P, "[")) {
            tpl_node *parts[3] = {0};
            int k = 0, is_slice = 0;
            for (;;) {
                if (!is_op(P, ":") && !is_op(P, "]") && !(parts[k] = expr(P))) return NULL;
                if (skip_op(P, ":")) {
                    if (++k > 2) return fail(P, "too many ':' in a slice"), NULL;
                    is_slice = 1;
                    continue;
                }
                if (expect_op(P, "]")) return NULL;
                break;
            }
            tpl_node *m = node(P, is_slice ? E_SLICE : E_ITEM);
            m->a = n;
            if (is_slice) {
                tpl_node *lits[3];
                for (int j = 0; j < 3; j++) lits[j] = parts[j];
                m->b = lits[0], m->c = lits[1];
                if (lits[2]) add(P, &m->args, lits[2]);
            } else {
                if (!parts[0]) return fail(P, "empty subscript"), NULL;
                m->b = parts[0];
            }
            n = m;
        } else if (skip_op(P, "(")) {
            if (!(n = call(P, n))) return NULL;
        } else {
            return n;
        }
    }
}

static tpl_node *filters_and_tests(parser *P, tpl_node *n) {
    for (;;) {
        if (skip_op(P, "|")) {
            if (cur(P)->kind != T_NAME) return fail(P, "expected a filter name after '|'"), NULL;
            tpl_node *m = node(P, E_FILTER);
            m->a = n;
            named(P, m);
            if (skip_op(P, "(") && call_args(P, m)) return NULL;
            n = m;
        } else if (skip_name(P, "is")) {
            tpl_node *m = node(P, E_TEST);
            m->a = n, m->op = skip_name(P, "not");
            if (cur(P)->kind != T_NAME) return fail(P, "expected a test name after 'is'"), NULL;
            named(P, m);
            const tpl_token *t = cur(P);
            if (skip_op(P, "(")) {
                if (call_args(P, m)) return NULL;
            } else if ((t->kind == T_NAME && !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and") &&
                        !is_name(P, "is")) ||
                       t->kind == T_STRING || t->kind == T_INT || t->kind == T_FLOAT || is_op(P, "[") ||
                       is_op(P, "{")) {
                tpl_node *arg = primary(P);
                if (!arg || !(arg = postfix(P, arg))) return NULL;
                add(P, &m->args, arg);
            }
            n = m;
        } else if (skip_op(P, "(")) {
            if (!(n = call(P, n))) return NULL;
        } else {
            return n;
        }
    }
}

static tpl_node *unary_inner(parser *P, int with_filter);
static tpl_node *unary(parser *P, int with_filter) {
    tpl_node *n = deeper(P) ? NULL : unary_inner(P, with_filter);
    P->depth--;
    return n;
}

static tpl_node *unary_inner(parser *P, int with_filter) {
    tpl_node *n;
    if (is_op(P, "-") || is_op(P, "+")) {
        n = node(P, is_op(P, "-") ? E_NEG : E_POS);
        P->i++;
        if (!(n->a = unary(P, 0))) return NULL;
    } else if (!(n = primary(P))) {
        return NULL;
    }
    if (!(n = postfix(P, n))) return NULL;
    return with_filter ? filters_and_tests(P, n) : n;
}

static tpl_node *binary(parser *P, tpl_node *a, int op, tpl_node *b) {
    if (!a || !b) return NULL;
    tpl_node *n = node(P, E_BIN);
    n->a = a, n->b = b, n->op = op;
    return n;
}

static tpl_node *pow_expr(parser *P) {
    tpl_node *n = unary(P, 1);
    while (n && skip_op(P, "**")) n = binary(P, n, OP_POW, unary(P, 1));
    return n;
}

static tpl_node *mul_expr(parser *P) {
    tpl_node *n = pow_expr(P);
    for (;;) {
        int op = is_op(P, "*")    ? OP_MUL
                 : is_op(P, "/")  ? OP_DIV
                 : is_op(P, "//") ? OP_FLOORDIV
                 : is_op(P, "%")  ? OP_MOD
                                  : 0;
        if (!op || !n) return n;
        P->i++;
        n = binary(P, n, op, pow_expr(P));
    }
}

static tpl_node *concat_expr(parser *P) {
    tpl_node *n = mul_expr(P);
    while (n && skip_op(P, "~")) n = binary(P, n, OP_CONCAT, mul_expr(P));
    return n;
}

static tpl_node *add_expr(parser *P) {
    tpl_node *n = concat_expr(P);
    for (;;) {
        int op = is_op(P, "+") ? OP_ADD : is_op(P, "-") ? OP_SUB : 0;
        if (!op || !n) return n;
        P->i++;
        n = binary(P, n, op, concat_expr(P));
    }
}

/* Comparison chains (a < b < c) become (a < b) and (b < c), as Python evaluates them. */
static tpl_node *compare(parser *P) {
    tpl_node *n = add_expr(P), *result = NULL, *left = n;
    for (;;) {
        int op = is_op(P, "==")     ? OP_EQ
                 : is_op(P, "!=")   ? OP_NE
                 : is_op(P, "<")    ? OP_LT
                 : is_op(P, "<=")   ? OP_LE
                 : is_op(P, ">")    ? OP_GT
                 : is_op(P, ">=")   ? OP_GE
                 : is_name(P, "in") ? OP_IN
                                    : 0;
        if (!op && is_name(P, "not") && is_name_at(P, 1, "in")) op = OP_NOT_IN, P->i++;
        if (!op || !left) return result ? result : left;
        P->i++;
        tpl_node *right = add_expr(P);
        tpl_node *c = binary(P, left, op, right);
        if (!c) return NULL;
        if (result) {
            tpl_node *both = node(P, E_AND);
            both->a = result, both->b = c;
            result = both;
        } else {
            result = c;
        }
        left = right;
    }
}

static tpl_node *not_expr(parser *P) {
    if (skip_name(P, "not")) {
        tpl_node *n = node(P, E_NOT);
        if (deeper(P)) return P->depth--, NULL;
        n->a = not_expr(P);
        P->depth--;
        return n->a ? n : NULL;
    }
    return compare(P);
}

/* `and` binds tighter than `or`: or_expr := and_expr ('or' and_expr)*, and_expr := not ('and' not)*. */
static tpl_node *logical(parser *P, int is_or) {
    tpl_node *n = is_or ? logical(P, 0) : not_expr(P);
    while (n && skip_name(P, is_or ? "or" : "and")) {
        tpl_node *m = node(P, is_or ? E_OR : E_AND);
        m->a = n;
        if (!(m->b = is_or ? logical(P, 0) : not_expr(P))) return NULL;
        n = m;
    }
    return n;
}

static tpl_node *or_expr(parser *P) { return logical(P, 1); }

static tpl_node *cond_expr(parser *P);
static tpl_node *expr(parser *P) {
    tpl_node *n = deeper(P) ? NULL : cond_expr(P);
    P->depth--;
    return n;
}

static tpl_node *cond_expr(parser *P) {
    tpl_node *n = or_expr(P);
    while (n && skip_name(P, "if")) {
        tpl_node *m = node(P, E_COND);
        m->b = n;
        if (!(m->a = or_expr(P))) return NULL;
        if (skip_name(P, "else") && !(m->c = expr(P))) return NULL;
        n = m;
    }
    return n;
}

/* ---- statements ---- */

static int end_tag(parser *P) {
    if (cur(P)->kind != T_BLOCK_END) return fail(P, "expected the end of the tag");
    P->i++;
    return 0;
}

/* Parses statements into `out` until a block tag whose keyword is one of `ends` (NULL-terminated);
 * returns that keyword's index (the parser then sits after the keyword), or -1 on error. With
 * ends == NULL, parses to the end of the template and returns 0. */
static int body(parser *P, const char *const *ends, tpl_nodes *out);

static int targets(parser *P, tpl_node *n) {
    const char *names[16];
    int k = 0;
    do {
        if (cur(P)->kind != T_NAME) return fail(P, "expected a variable name");
        if (k == 16) return fail(P, "too many names");
        names[k++] = name_str(P, cur(P));
        P->i++;
    } while (skip_op(P, ","));
    n->targets = tpl_alloc(P->a, sizeof(char *) * (size_t)k);
    memcpy(n->targets, names, sizeof(char *) * (size_t)k);
    n->n_targets = k;
    return 0;
}

/* After `{% else`: the rest of the tag, then statements up to `{% <end>`. */
static int else_body(parser *P, const char *end, tpl_nodes *orelse) {
    const char *const ends[] = {end, NULL};
    return end_tag(P) || body(P, ends, orelse) < 0 ? -1 : 0;
}

static tpl_node *statement_inner(parser *P);
static tpl_node *statement(parser *P) {
    tpl_node *n = deeper(P) ? NULL : statement_inner(P);
    P->depth--;
    return n;
}

static tpl_node *statement_inner(parser *P) {
    const tpl_token *kw = cur(P);
    if (kw->kind != T_NAME) return fail(P, "expected a statement keyword"), NULL;
    tpl_node *n;
    if (skip_name(P, "if")) {
        n = node(P, S_IF);
        for (;;) {
            tpl_node *branch = node(P, S_IF);
            if (!(branch->a = expr(P)) || end_tag(P)) return NULL;
            static const char *const ends[] = {"elif", "else", "endif", NULL};
            int e = body(P, ends, &branch->body);
            if (e < 0) return NULL;
            add(P, &n->body, branch);
            if (e == 0) continue;
            if (e == 1 && else_body(P, "endif", &n->orelse)) return NULL;
            return end_tag(P) ? NULL : n;
        }
    }
    if (skip_name(P, "for")) {
        n = node(P, S_FOR);
        if (targets(P, n)) return NULL;
        if (!skip_name(P, "in")) return fail(P, "expected 'in' in a for loop"), NULL;
        if (!(n->a = or_expr(P))) return NULL;
        if (skip_name(P, "if") && !(n->b = or_expr(P))) return NULL;
        if (is_name(P, "recursive")) return fail(P, "recursive loops are not supported"), NULL;
        if (end_tag(P)) return NULL;
        static const char *const ends[] = {"else", "endfor", NULL};
        int e = body(P, ends, &n->body);
        if (e < 0) return NULL;
        if (e == 0 && else_body(P, "endfor", &n->orelse)) return NULL;
        return end_tag(P) ? NULL : n;
    }
    if (skip_name(P, "set")) {
        n = node(P, S_SET);
        if (cur(P)->kind == T_NAME && P->t[P->i + 1].kind == T_OP && P->t[P->i + 1].s[0] == '.') {
            n->b = node(P, E_NAME); /* set ns.attr = value */
            n->b->name = name_str(P, cur(P)), n->b->name_len = cur(P)->len;
            P->i += 2;
            if (cur(P)->kind != T_NAME) return fail(P, "expected an attribute name"), NULL;
            n->name = name_str(P, cur(P)), n->name_len = cur(P)->len;
            P->i++;
        } else if (targets(P, n)) {
            return NULL;
        }
        if (skip_op(P, "=")) {
            if (!(n->a = expr(P))) return NULL;
            if (is_op(P, ",")) { /* set a, b = x, y */
                tpl_node *t = node(P, E_TUPLE);
                add(P, &t->args, n->a);
                while (skip_op(P, ",")) {
                    tpl_node *v = expr(P);
                    if (!v) return NULL;
                    add(P, &t->args, v);
                }
                n->a = t;
            }
            return end_tag(P) ? NULL : n;
        }
        if (n->b || n->n_targets != 1) return fail(P, "a block set takes one variable name"), NULL;
        n->kind = S_SET_BLOCK;
        static const char *const ends[] = {"endset", NULL};
        if (end_tag(P) || body(P, ends, &n->body) < 0 || end_tag(P)) return NULL;
        return n;
    }
    if (skip_name(P, "macro")) {
        n = node(P, S_MACRO);
        if (cur(P)->kind != T_NAME) return fail(P, "expected a macro name"), NULL;
        n->name = name_str(P, cur(P)), n->name_len = cur(P)->len;
        P->i++;
        if (expect_op(P, "(")) return NULL;
        const char *names[32];
        int k = 0;
        while (!skip_op(P, ")")) {
            if (k && expect_op(P, ",")) return NULL;
            if (cur(P)->kind != T_NAME || k == 32) return fail(P, "expected a parameter name"), NULL;
            names[k++] = name_str(P, cur(P));
            P->i++;
            tpl_node *def = NULL;
            if (skip_op(P, "=") && !(def = expr(P))) return NULL;
            if (!def) def = node(P, E_LIT), def->lit = tpl_undef(names[k - 1]);
            add(P, &n->args, def);
        }
        n->targets = tpl_alloc(P->a, sizeof(char *) * (size_t)(k + 1));
        memcpy(n->targets, names, sizeof(char *) * (size_t)k);
        n->n_targets = k;
        static const char *const ends[] = {"endmacro", NULL};
        if (end_tag(P) || body(P, ends, &n->body) < 0 || end_tag(P)) return NULL;
        return n;
    }
    if (skip_name(P, "generation")) {
        n = node(P, S_GENERATION);
        static const char *const ends[] = {"endgeneration", NULL};
        if (end_tag(P) || body(P, ends, &n->body) < 0 || end_tag(P)) return NULL;
        return n;
    }
    if (skip_name(P, "break") || skip_name(P, "continue")) {
        n = node(P, P->t[P->i - 1].len == 5 ? S_BREAK : S_CONTINUE);
        return end_tag(P) ? NULL : n;
    }
    fail(P, "unsupported or misplaced tag '%.*s'", (int)kw->len, kw->s);
    return NULL;
}

static int body(parser *P, const char *const *ends, tpl_nodes *out) {
    for (;;) {
        const tpl_token *t = cur(P);
        if (t->kind == T_EOF) {
            if (!ends) return 0;
            return fail(P, "missing '{%% %s %%}' at the end of the template", ends[0]);
        }
        if (t->kind == T_TEXT) {
            tpl_node *n = node(P, S_TEXT);
            n->lit = tpl_str(t->s, t->len);
            add(P, out, n);
            P->i++;
        } else if (t->kind == T_VAR_BEGIN) {
            P->i++;
            tpl_node *n = node(P, S_OUTPUT);
            if (!(n->a = expr(P))) return -1;
            if (cur(P)->kind != T_VAR_END) return fail(P, "expected '}}'");
            P->i++;
            add(P, out, n);
        } else if (t->kind == T_BLOCK_BEGIN) {
            P->i++;
            for (int e = 0; ends && ends[e]; e++)
                if (is_name(P, ends[e])) return P->i++, e;
            tpl_node *n = statement(P);
            if (!n) return -1;
            add(P, out, n);
        } else {
            return fail(P, "unexpected token");
        }
    }
}

int tpl_parse(tpl_arena *a, const tpl_token *toks, int n, tpl_nodes *out, char *err, size_t err_len) {
    parser P = {.a = a, .t = toks, .n = n, .err = err, .err_len = err_len};
    *out = (tpl_nodes){0};
    return body(&P, NULL, out);
}
