/* Statement execution and the template API: output with the generation mask, if/for/set/macro,
 * Jinja's scoping (each loop iteration is a fresh scope over the enclosing one, so a `set` inside
 * a loop does not outlive the iteration; `namespace` is how templates carry state out). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/template.h"
#include "template/tpl_internal.h"

struct ctrl_template {
    tpl_arena arena; /* tokens and the syntax tree */
    tpl_nodes body;
    char origin[256];
};

static int emit(tpl_render *r, int line, const char *s, size_t n) {
    tpl_buf_add(&r->out, s, n);
    if (r->out.over) return tpl_fail(r, line, "the output would exceed %u MiB", TPL_MAX_STRING >> 20);
    size_t at = r->gen.len;
    tpl_buf_add(&r->gen, s, n); /* same length; overwritten with the mask bytes */
    if (n) memset(r->gen.data + at, r->in_generation > 0, n);
    return 0;
}

static int bind_targets(tpl_render *r, tpl_scope *s, const tpl_node *n, tpl_value v) {
    if (n->n_targets == 1) return tpl_assign(r, s, n->targets[0], v), 0;
    if (v.kind != V_LIST || v.list->n != n->n_targets)
        return tpl_fail(r, n->line, "cannot unpack into %d names", n->n_targets);
    for (int k = 0; k < n->n_targets; k++) tpl_assign(r, s, n->targets[k], v.list->items[k]);
    return 0;
}

/* Jinja's `loop` is one live object per loop, its fields updated as the loop advances: one dict
 * per for statement run, its values overwritten in place each iteration (a dict per iteration kept
 * every iteration's 0.3 KB in the arena until the render ended: nested loops built hundreds of MB). */
enum {
    LOOP_INDEX,
    LOOP_INDEX0,
    LOOP_REVINDEX,
    LOOP_REVINDEX0,
    LOOP_FIRST,
    LOOP_LAST,
    LOOP_LENGTH,
    LOOP_PREVITEM,
    LOOP_NEXTITEM,
    LOOP_FIELDS
};
static const char *const loop_names[LOOP_FIELDS] = {"index", "index0", "revindex", "revindex0", "first",
                                                    "last",  "length", "previtem", "nextitem"};

static tpl_dict *new_loop(tpl_render *r, const tpl_list *items) {
    tpl_dict *d = tpl_new_dict(&r->arena).dict;
    d->keys = tpl_alloc(&r->arena, sizeof(tpl_value) * LOOP_FIELDS);
    d->vals = tpl_alloc(&r->arena, sizeof(tpl_value) * LOOP_FIELDS);
    d->n = d->cap = LOOP_FIELDS;
    for (int k = 0; k < LOOP_FIELDS; k++) d->keys[k] = tpl_str(loop_names[k], strlen(loop_names[k]));
    /* bounds for any iteration (a list holding `loop` keeps the depth and size it saw): previtem and
     * nextitem are items, so at most the items' depth plus one, and two of the largest item */
    uint64_t largest = 1;
    for (int i = 0; i < items->n; i++) {
        const uint64_t z = tpl_size(items->items[i]);
        if (z > largest) largest = z;
    }
    d->depth = items->depth > 0 ? items->depth : 1;
    d->size = LOOP_FIELDS + 2 * largest;
    return d;
}

static void update_loop(tpl_dict *d, const tpl_list *items, int i) {
    const int len = items->n;
    tpl_value *v = d->vals;
    v[LOOP_INDEX] = tpl_int(i + 1), v[LOOP_INDEX0] = tpl_int(i);
    v[LOOP_REVINDEX] = tpl_int(len - i), v[LOOP_REVINDEX0] = tpl_int(len - i - 1);
    v[LOOP_FIRST] = tpl_bool(i == 0), v[LOOP_LAST] = tpl_bool(i == len - 1), v[LOOP_LENGTH] = tpl_int(len);
    v[LOOP_PREVITEM] = i > 0 ? items->items[i - 1] : tpl_undef("previtem");
    v[LOOP_NEXTITEM] = i + 1 < len ? items->items[i + 1] : tpl_undef("nextitem");
}

/* Each iteration runs in a fresh scope over the enclosing one; the scope's arrays are reused (nothing
 * keeps them), so an iteration allocates nothing of its own. Its setup (the scope, `loop`, the
 * targets) is charged to the step budget like the statements it runs. */
static int exec_for(tpl_render *r, tpl_scope *s, const tpl_node *n) {
    tpl_value seq;
    tpl_list *all;
    if (tpl_eval(r, s, n->a, &seq) || tpl_iterable(r, n->line, seq, &all)) return -1;
    tpl_list *items = all;
    if (n->b) { /* {% for x in xs if cond %}: filtered before loop.* is computed */
        items = tpl_new_list(&r->arena).list;
        tpl_scope probe = {.parent = s};
        for (int i = 0; i < all->n; i++) {
            tpl_value keep;
            probe.vars.n = 0;
            if (tpl_budget(r, n->line, 1 + (uint64_t)n->n_targets) ||
                bind_targets(r, &probe, n, all->items[i]) || tpl_eval(r, &probe, n->b, &keep))
                return -1;
            if (tpl_truthy(keep)) tpl_list_push(&r->arena, items, all->items[i]);
        }
    }
    if (tpl_budget(r, n->line, (uint64_t)items->n / 16)) return -1; /* new_loop's walk */
    tpl_dict *loop = items->n ? new_loop(r, items) : NULL;
    tpl_scope it = {.parent = s};
    for (int i = 0; i < items->n; i++) {
        if (tpl_budget(r, n->line, 2 + (uint64_t)n->n_targets)) return -1;
        it.vars.n = 0;
        update_loop(loop, items, i);
        tpl_assign(r, &it, "loop", (tpl_value){.kind = V_DICT, .dict = loop});
        if (bind_targets(r, &it, n, items->items[i]) || tpl_exec(r, &it, &n->body)) return -1;
        int control = r->control;
        r->control = 0;
        if (control == 1) break;
    }
    if (items->n == 0 && n->orelse.n) return tpl_exec(r, s, &n->orelse);
    return 0;
}

static int exec_set(tpl_render *r, tpl_scope *s, const tpl_node *n) {
    tpl_value v;
    if (n->kind == S_SET_BLOCK) {
        size_t mark = r->out.len;
        if (tpl_exec(r, s, &n->body)) return -1;
        v = tpl_str_copy(&r->arena, r->out.data + mark, r->out.len - mark);
        r->out.len = r->gen.len = mark;
        return tpl_assign(r, s, n->targets[0], v), 0;
    }
    if (tpl_eval(r, s, n->a, &v)) return -1;
    if (n->b) {
        uint64_t walked = 0;
        tpl_value ns = tpl_lookup(s, n->b->name, n->b->name_len, &walked);
        if (ns.kind != V_DICT || !ns.dict->is_namespace)
            return tpl_fail(r, n->line, "cannot assign attribute on '%s' (not a namespace)", n->b->name);
        if (tpl_budget(r, n->line, walked / 4 + (uint64_t)ns.dict->n / 2)) return -1;
        tpl_dict_set(&r->arena, ns.dict, tpl_str(n->name, n->name_len), v);
        return 0;
    }
    return bind_targets(r, s, n, v);
}

static int exec_body(tpl_render *r, tpl_scope *s, const tpl_nodes *body);

/* Like tpl_eval, every statement counts against the step budget and the nesting limit. */
int tpl_exec(tpl_render *r, tpl_scope *s, const tpl_nodes *body) {
    const int line = body->n ? body->v[0]->line : 0;
    if (tpl_budget(r, line, 1)) return -1;
    if (r->depth >= TPL_MAX_DEPTH)
        return tpl_fail(r, line, "expressions and blocks nested deeper than %d levels", TPL_MAX_DEPTH);
    r->depth++;
    const int rc = exec_body(r, s, body);
    r->depth--;
    return rc;
}

static int exec_body(tpl_render *r, tpl_scope *s, const tpl_nodes *body) {
    for (int i = 0; i < body->n && !r->control; i++) {
        const tpl_node *n = body->v[i];
        tpl_value v;
        if (tpl_budget(r, n->line, 1)) return -1;
        switch (n->kind) {
        case S_TEXT:
            if (emit(r, n->line, n->lit.str.s, n->lit.str.len)) return -1;
            break;
        case S_OUTPUT: {
            if (tpl_eval(r, s, n->a, &v)) return -1;
            if (v.kind != V_STR && tpl_to_str_checked(r, n->line, v, &v)) return -1;
            if (emit(r, n->line, v.str.s, v.str.len)) return -1;
            break;
        }
        case S_IF: {
            int taken = 0;
            for (int k = 0; k < n->body.n && !taken; k++) {
                if (tpl_eval(r, s, n->body.v[k]->a, &v)) return -1;
                if (tpl_truthy(v)) {
                    taken = 1;
                    if (tpl_exec(r, s, &n->body.v[k]->body)) return -1;
                }
            }
            if (!taken && tpl_exec(r, s, &n->orelse)) return -1;
            break;
        }
        case S_FOR:
            if (exec_for(r, s, n)) return -1;
            break;
        case S_SET:
        case S_SET_BLOCK:
            if (exec_set(r, s, n)) return -1;
            break;
        case S_BREAK: r->control = 1; break;
        case S_CONTINUE: r->control = 2; break;
        case S_GENERATION:
            r->in_generation++;
            if (tpl_exec(r, s, &n->body)) return -1;
            r->in_generation--;
            break;
        case S_MACRO: tpl_assign(r, s, n->name, (tpl_value){.kind = V_FUNC, .fn = {F_MACRO, n}}); break;
        default: return tpl_fail(r, n->line, "internal: not a statement");
        }
    }
    return r->failed ? -1 : 0;
}

/* ---- API ---- */

static tpl_value from_json(tpl_arena *a, const cJSON *j) {
    if (cJSON_IsNull(j)) return tpl_none();
    if (cJSON_IsBool(j)) return tpl_bool(cJSON_IsTrue(j));
    if (cJSON_IsString(j)) return tpl_str_copy(a, j->valuestring, strlen(j->valuestring));
    if (cJSON_IsNumber(j)) {
        /* cJSON keeps no int/float distinction: integral values become ints */
        double d = j->valuedouble;
        if (d > -9.2e18 && d < 9.2e18 && d == (double)(int64_t)d)
            return tpl_int((int64_t)d); /* range first */
        return tpl_float(d);
    }
    if (cJSON_IsArray(j)) {
        tpl_value l = tpl_new_list(a);
        for (const cJSON *c = j->child; c; c = c->next) tpl_list_push(a, l.list, from_json(a, c));
        return l;
    }
    if (cJSON_IsObject(j)) {
        tpl_value d = tpl_new_dict(a);
        int n = 0;
        for (const cJSON *c = j->child; c && n < TPL_MAX_ITEMS + 1; c = c->next) n++;
        tpl_value *keys = tpl_alloc(a, sizeof(tpl_value) * (size_t)n),
                  *vals = tpl_alloc(a, sizeof(tpl_value) * (size_t)n);
        int k = 0;
        for (const cJSON *c = j->child; c && k < n; c = c->next, k++)
            keys[k] = tpl_str_copy(a, c->string, strlen(c->string)), vals[k] = from_json(a, c);
        tpl_dict_set_many(a, d.dict, keys, vals, n); /* more than TPL_MAX_ITEMS fails the render */
        return d;
    }
    return tpl_none();
}

ctrl_status ctrl_template_compile(const char *src, size_t len, const char *origin, ctrl_template **out) {
    ctrl_template *t = calloc(1, sizeof *t);
    if (!t) return ctrl_error_set(CTRL_ERR_NOMEM, "template: out of memory");
    snprintf(t->origin, sizeof t->origin, "%s", origin ? origin : "chat template");
    tpl_token *toks;
    int n;
    char err[512];
    if (tpl_lex(&t->arena, src, len, &toks, &n, err, sizeof err) ||
        tpl_parse(&t->arena, toks, n, &t->body, err, sizeof err)) {
        ctrl_template_free(t);
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: chat template %s", origin ? origin : "template", err);
    }
    *out = t;
    return CTRL_OK;
}

void ctrl_template_free(ctrl_template *t) {
    if (!t) return;
    tpl_arena_free(&t->arena);
    free(t);
}

ctrl_status ctrl_template_render(const ctrl_template *t, const cJSON *vars, char **text, size_t *len,
                                 uint8_t **generation_mask) {
    tpl_render r = {0};
    tpl_scope root = {0};
    r.root = &root;
    for (const cJSON *c = vars ? vars->child : NULL; c; c = c->next)
        tpl_assign(&r, &root, tpl_strdup(&r.arena, c->string, strlen(c->string)), from_json(&r.arena, c));
    int rc = tpl_exec(&r, &root, &t->body) || tpl_budget(&r, 0, 0);
    ctrl_status st = CTRL_OK;
    if (rc) {
        st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: %s", t->origin, r.err);
        tpl_buf_free(&r.out);
        tpl_buf_free(&r.gen);
    } else {
        if (!r.out.data) tpl_buf_add(&r.out, "", 0), tpl_buf_add(&r.gen, "", 0);
        *text = r.out.data;
        *len = r.out.len;
        if (generation_mask)
            *generation_mask = (uint8_t *)r.gen.data;
        else
            tpl_buf_free(&r.gen);
    }
    tpl_arena_free(&r.arena);
    return st;
}
