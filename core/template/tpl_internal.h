/* Shared by the chat-template interpreter's files: the arena, values, tokens, the syntax tree and the
 * render state. The interpreter implements the Jinja subset that Hugging Face chat templates use,
 * with the environment transformers sets up (trim_blocks, lstrip_blocks, loop controls, the
 * `generation` tag, raise_exception, strftime_now, namespace, a json.dumps-like tojson). */
#ifndef CTRL_CORE_TPL_INTERNAL_H
#define CTRL_CORE_TPL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* ---- limits: templates are untrusted, so what a render may build or nest is bounded and each
 * overrun is a template error naming the limit (docs/architecture.md, Chat templates) ---- */
#define TPL_MAX_STRING (16u << 20) /* bytes of any string built, the output included */
#define TPL_MAX_ITEMS (1 << 22)    /* items of any list built */
#define TPL_MAX_RANGE 1000000      /* items range() makes */
/* memory one render holds: its arena's blocks (every value it built, the variables included) and the
 * output and generation-mask buffers */
#define TPL_MAX_RENDER_BYTES ((size_t)64 << 20)
#define TPL_MAX_STEPS 10000000ull /* evaluations, statements and walks one render runs (0.5 s at most) */
#define TPL_MAX_DEPTH 500         /* nested evaluation and execution while rendering */
#define TPL_MAX_MACRO_DEPTH 100   /* nested macro calls */
#define TPL_MAX_NESTING 1000      /* lists and dicts inside each other, in values built */
#define TPL_MAX_PARSE_DEPTH 100   /* nested expressions and blocks in the source */

/* ---- arena: every value and node lives until its arena is freed ---- */
typedef struct tpl_arena {
    struct tpl_block *head;
    size_t total;   /* bytes of the blocks it malloc'd (not just of the values in them), for the budget */
    int over_items; /* a list reached TPL_MAX_ITEMS: items were dropped, the render must fail */
} tpl_arena;
void *tpl_alloc(tpl_arena *a, size_t n); /* zeroed; aborts on out-of-memory like malloc wrappers */
char *tpl_strdup(tpl_arena *a, const char *s, size_t n);
void tpl_arena_free(tpl_arena *a);

/* ---- values (Python semantics) ---- */
typedef enum tpl_kind { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_FUNC } tpl_kind;

typedef struct tpl_value tpl_value;
typedef struct tpl_list tpl_list;
typedef struct tpl_dict tpl_dict;
struct tpl_node;

typedef enum tpl_func {
    F_RAISE_EXCEPTION = 1,
    F_STRFTIME_NOW,
    F_NAMESPACE,
    F_DICT,
    F_RANGE,
    F_MACRO,
} tpl_func;

struct tpl_value {
    tpl_kind kind;
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *s;
            size_t len;
        } str;
        tpl_list *list;
        tpl_dict *dict;
        struct {
            tpl_func id;
            const struct tpl_node *macro;
        } fn;
        const char *undef_name; /* for error messages */
    };
};

struct tpl_list {
    tpl_value *items;
    int n, cap;
    int is_tuple;  /* only changes how repr() writes it */
    int depth;     /* 1 + the deepest item's (lists are not changed once built) */
    uint64_t size; /* what walking it costs (tpl_size of the items), for the step budget */
};
struct tpl_dict {
    tpl_value *keys; /* strings, in insertion order */
    tpl_value *vals;
    int n, cap;
    int is_namespace;
    int depth;     /* as a list's; a namespace is opaque to repr/tojson/== and is not counted */
    uint64_t size; /* as a list's */
};

tpl_value tpl_undef(const char *name);
tpl_value tpl_none(void);
tpl_value tpl_bool(int b);
tpl_value tpl_int(int64_t i);
tpl_value tpl_float(double f);
tpl_value tpl_str(const char *s, size_t len); /* no copy */
tpl_value tpl_str_copy(tpl_arena *a, const char *s, size_t len);
tpl_value tpl_new_list(tpl_arena *a);
tpl_value tpl_new_dict(tpl_arena *a);
void tpl_list_push(tpl_arena *a, tpl_list *l, tpl_value v);
/* Room for n more items at once (growth by doubling leaves every smaller array behind in the arena). */
void tpl_list_reserve(tpl_arena *a, tpl_list *l, int64_t n);
void tpl_dict_set(tpl_arena *a, tpl_dict *d, tpl_value key, tpl_value v);
int tpl_dict_find(const tpl_dict *d, const char *key, size_t len); /* index or -1 */
/* tpl_dict_set for each pair in order, in n log n for a new dict (keys are strings). */
void tpl_dict_set_many(tpl_arena *a, tpl_dict *d, const tpl_value *keys, const tpl_value *vals, int n);
int tpl_depth(tpl_value v);     /* nesting of lists and dicts: 0 for a scalar */
uint64_t tpl_size(tpl_value v); /* a bound on the work of walking v (==, in, repr), >= 1 */

int tpl_truthy(tpl_value v);
int tpl_equal(tpl_value a, tpl_value b);
int tpl_is_number(tpl_value v); /* bool, int or float */
double tpl_as_double(tpl_value v);
const char *tpl_kind_name(tpl_kind k); /* Python's type name, for errors */

/* A growable byte buffer (malloc'd). It never grows past TPL_MAX_STRING: what would is dropped
 * and `over` set, which whoever turns the buffer into a value must check (tpl_buf_value). */
typedef struct tpl_buf {
    char *data;
    size_t len, cap;
    int over;
} tpl_buf;
void tpl_buf_add(tpl_buf *b, const char *s, size_t n);
void tpl_buf_addc(tpl_buf *b, char c);
void tpl_buf_spaces(tpl_buf *b, uint64_t n); /* n spaces, stopping once the buffer is full */
void tpl_buf_free(tpl_buf *b);

/* str(v) and repr(v) as Python writes them; 0 ok, -1 when v cannot be shown (error text in err). */
void tpl_write_str(tpl_buf *b, tpl_value v);
void tpl_write_repr(tpl_buf *b, tpl_value v);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: none), sort_keys=False); -1 on a value JSON cannot
 * hold (undefined, function). */
int tpl_write_json(tpl_buf *b, tpl_value v, int64_t indent, int depth); /* indent <= TPL_MAX_STRING */

/* UTF-8 code point helpers for Python string indexing. */
size_t tpl_utf8_count(const char *s, size_t len);
size_t tpl_utf8_offset(const char *s, size_t len, size_t cp_index); /* byte offset of code point i */
/* From the code point starting at byte `at`, the byte offset `k` code points on (k < 0: back),
 * clamped to [0, len]. */
size_t tpl_utf8_step(const char *s, size_t len, size_t at, int64_t k);

/* ---- tokens ---- */
typedef enum tpl_tok_kind {
    T_EOF,
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_INT,
    T_FLOAT,
    T_STRING,
    T_OP,
} tpl_tok_kind;

typedef struct tpl_token {
    tpl_tok_kind kind;
    int line;
    const char *s; /* NAME/OP: source span; TEXT/STRING: processed text (arena) */
    size_t len;
    int64_t i;
    double f;
} tpl_token;

/* Tokenizes src with transformers' whitespace settings; 0 ok, -1 with err filled. */
int tpl_lex(tpl_arena *a, const char *src, size_t len, tpl_token **toks, int *n, char *err, size_t err_len);

/* ---- syntax tree ---- */
typedef enum tpl_node_kind {
    /* expressions */
    E_LIT,
    E_NAME,
    E_ATTR,
    E_ITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_NEG,
    E_POS,
    E_NOT,
    E_AND,
    E_OR,
    E_BIN,
    E_COND,
    E_LIST,
    E_TUPLE,
    E_DICT,
    /* statements */
    S_TEXT,
    S_OUTPUT,
    S_IF,
    S_FOR,
    S_SET,
    S_SET_BLOCK,
    S_BREAK,
    S_CONTINUE,
    S_GENERATION,
    S_MACRO,
} tpl_node_kind;

typedef struct tpl_node tpl_node;
typedef struct tpl_nodes {
    tpl_node **v;
    int n;
} tpl_nodes;

struct tpl_node {
    tpl_node_kind kind;
    int line;
    int op;           /* E_BIN: operator code; E_TEST: negated */
    const char *name; /* E_NAME, E_ATTR, E_FILTER, E_TEST, S_SET target, S_MACRO */
    size_t name_len;
    tpl_value lit;          /* E_LIT */
    tpl_node *a, *b, *c;    /* operands; S_FOR: a = iterable, b = filter; S_SET: a = value, b = namespace */
    tpl_nodes args;         /* call/filter/test arguments; list/tuple items; dict keys */
    tpl_nodes kw_vals;      /* keyword argument values; dict values */
    const char **kw_names;  /* keyword argument names (NUL-terminated) */
    tpl_nodes body, orelse; /* statements; S_IF: body = branches (each S_IF with a = cond), orelse = else */
    const char **targets;   /* S_FOR / S_SET names (NUL-terminated), S_MACRO parameters */
    int n_targets;
};

enum tpl_binop {
    OP_ADD = 1,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_CONCAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOT_IN,
};

/* Parses tokens into a statement list; 0 ok, -1 with err filled. */
int tpl_parse(tpl_arena *a, const tpl_token *toks, int n, tpl_nodes *out, char *err, size_t err_len);

/* ---- rendering ---- */
typedef struct tpl_scope {
    struct tpl_scope *parent;
    tpl_dict vars;
} tpl_scope;

typedef struct tpl_render {
    tpl_arena arena; /* values made while rendering */
    tpl_buf out;
    tpl_buf gen; /* one byte per output byte: 1 inside a {% generation %} block */
    int in_generation;
    tpl_scope *root;
    int control; /* 1 break, 2 continue */
    int failed;
    int depth, macro_depth; /* nesting now, against TPL_MAX_DEPTH / TPL_MAX_MACRO_DEPTH */
    uint64_t steps;         /* work done, against TPL_MAX_STEPS */
    char err[512];
} tpl_render;

int tpl_fail(tpl_render *r, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Counts `steps` of work and checks every budget (steps, bytes, list sizes); 0 or -1 after tpl_fail. */
int tpl_budget(tpl_render *r, int line, uint64_t steps);
/* A string of `n` bytes (n = count × size, computed without overflow) may be built: 0, or -1 after
 * tpl_fail naming `what`. */
int tpl_room(tpl_render *r, int line, const char *what, uint64_t count, uint64_t size);
/* Charges walking v once, shallowly (a string's bytes, a list's items, a dict's keys): what a filter,
 * a method, indexing or a lookup costs beyond its one step. 0, or -1 after tpl_fail. */
int tpl_walk(tpl_render *r, int line, tpl_value v);
/* A list of `n` items may be built. */
int tpl_room_items(tpl_render *r, int line, const char *what, uint64_t n);
/* The buffer as a string value in the arena (the buffer is freed); -1 when it overflowed. */
int tpl_buf_value(tpl_render *r, int line, tpl_buf *b, tpl_value *out);
/* str(v) as a value; -1 when it would exceed TPL_MAX_STRING. */
int tpl_to_str_checked(tpl_render *r, int line, tpl_value v, tpl_value *out);
/* A list or dict value built here may not nest deeper than TPL_MAX_NESTING. */
int tpl_check_nesting(tpl_render *r, int line, tpl_value v);
int tpl_eval(tpl_render *r, tpl_scope *s, const tpl_node *e, tpl_value *out);
int tpl_exec(tpl_render *r, tpl_scope *s, const tpl_nodes *body);
/* The name's value through the scope chain, then the globals; *walked (if not NULL) gets the number of
 * scope entries it compared, for the step budget. */
tpl_value tpl_lookup(const tpl_scope *s, const char *name, size_t len, uint64_t *walked);
void tpl_assign(tpl_render *r, tpl_scope *s, const char *name, tpl_value v);

/* Built-ins (tpl_builtins.c): filters, tests, methods of str/dict, global functions. args[0] is the
 * subject for filters and tests. Each returns 0, or -1 after tpl_fail. */
typedef struct tpl_args {
    tpl_value *pos;
    int n_pos;
    const char **kw_names;
    tpl_value *kw;
    int n_kw;
} tpl_args;
int tpl_filter(tpl_render *r, tpl_scope *s, int line, const char *name, tpl_value subject, const tpl_args *a,
               tpl_value *out);
int tpl_test(tpl_render *r, int line, const char *name, tpl_value subject, const tpl_args *a, int *out);
int tpl_method(tpl_render *r, int line, tpl_value obj, const char *name, const tpl_args *a, tpl_value *out);
int tpl_call_global(tpl_render *r, int line, tpl_value fn, const tpl_args *a, tpl_value *out);
int tpl_getitem(tpl_render *r, int line, tpl_value obj, tpl_value key, tpl_value *out);
/* The items a for loop or filter walks (list items, dict keys, string characters; none for Undefined). */
int tpl_iterable(tpl_render *r, int line, tpl_value v, tpl_list **items);

#endif
