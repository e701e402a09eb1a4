/* Rows assembled from a row group's decoded columns (parquet.h), by the record-shredding rules:
 * each leaf column is a sequence of (repetition level, definition level[, value]) entries. A node
 * whose first leaf's definition level is below the node's own is null (or, for a repeated node, an
 * empty list), and every leaf under it has one entry for that; a repeated node gathers elements
 * while its first leaf's next repetition level equals the node's. LIST-annotated groups become
 * arrays of their elements, other groups objects; an unannotated repeated field is an array. */
#include <stdlib.h>
#include <string.h>

#include "dataset/mapped_file.h"
#include "dataset/parquet_internal.h"

typedef struct assembler {
    ctrl_parquet *p;
    const char *why;
    const pq_node *where; /* the node the failure is in */
} assembler;

static pq_column *first_col(assembler *a, const pq_node *n) { return &a->p->cols[n->leaf0]; }

static int peek_def(assembler *a, const pq_node *n, int *def) {
    const pq_column *c = first_col(a, n);
    const pq_node *leaf = &a->p->nodes[a->p->leaves[n->leaf0]];
    if (c->at >= c->n) return a->why = "a column has fewer entries than the rows need", a->where = leaf, 0;
    *def = leaf->def ? c->def[c->at] : 0;
    return 1;
}

/* One entry of every leaf under n, for a null or an empty list there. */
static int skip_entries(assembler *a, const pq_node *n) {
    for (int l = n->leaf0; l < n->leaf_end; l++) {
        pq_column *c = &a->p->cols[l];
        const pq_node *leaf = &a->p->nodes[a->p->leaves[l]];
        if (c->at >= c->n)
            return a->why = "a column has fewer entries than the rows need", a->where = leaf, 0;
        if (leaf->def && c->def[c->at] >= n->def)
            return a->why = "the columns' definition levels disagree", a->where = leaf, 0;
        c->at++;
    }
    return 1;
}

static int is_text(const pq_node *n) {
    return n->logical == PQ_LT_STRING || n->logical == PQ_LT_JSON || n->logical == PQ_LT_ENUM ||
           n->converted == PQ_CT_UTF8 || n->converted == PQ_CT_JSON || n->converted == PQ_CT_ENUM;
}

static cJSON *leaf_value(assembler *a, const pq_node *n) {
    pq_column *c = &a->p->cols[n->leaf];
    if (c->at >= c->n) return a->why = "a column has fewer entries than the rows need", a->where = n, NULL;
    const int def = n->def ? c->def[c->at] : 0;
    c->at++;
    if (def < n->def) return cJSON_CreateNull();
    if (c->vat >= c->nv) return a->why = "a column has fewer values than its levels say", a->where = n, NULL;
    const pq_value *v = &c->val[c->vat++];
    switch (n->type) {
    case PQ_BOOLEAN: return cJSON_CreateBool(v->i != 0);
    case PQ_INT32:
    case PQ_INT96: return cJSON_CreateNumber((double)v->i);
    case PQ_INT64: return cJSON_CreateNumber(n->int_unsigned ? (double)(uint64_t)v->i : (double)v->i);
    case PQ_FLOAT:
    case PQ_DOUBLE: return cJSON_CreateNumber(v->d);
    default: break;
    }
    const int nul = v->len && memchr(v->s, 0, v->len) != NULL;
    if (nul && is_text(n)) return a->why = "a string holds a NUL byte", a->where = n, NULL;
    if (nul) return cJSON_CreateNull(); /* binary data (an image's bytes...): no JSON string */
    char *s = malloc((size_t)v->len + 1);
    if (!s) return a->why = "out of memory", a->where = n, NULL;
    if (v->len) memcpy(s, v->s, v->len);
    s[v->len] = '\0';
    cJSON *j = cJSON_CreateString(s);
    free(s);
    return j;
}

static cJSON *value(assembler *a, const pq_node *n);

static int is_list(const pq_node *n) { return n->logical == PQ_LT_LIST || n->converted == PQ_CT_LIST; }
static int is_map(const pq_node *n) {
    return n->logical == PQ_LT_MAP || n->converted == PQ_CT_MAP || n->converted == PQ_CT_MAP_KEY_VALUE;
}

/* The repeated node r as an array. `unwrap`: r is a LIST's middle level, whose single child is the
 * element (the legacy two-level form, r itself the element, when it has several children). */
static cJSON *repeated(assembler *a, const pq_node *r, int unwrap) {
    int def;
    if (!peek_def(a, r, &def)) return NULL;
    cJSON *arr = cJSON_CreateArray();
    if (!arr) return a->why = "out of memory", a->where = r, NULL;
    if (def < r->def) { /* an empty list */
        if (!skip_entries(a, r)) return cJSON_Delete(arr), NULL;
        return arr;
    }
    const pq_node *elem = unwrap && r->n_kids == 1 ? &a->p->nodes[a->p->kids[r->kid0]] : NULL;
    const pq_column *c = first_col(a, r);
    const pq_node *leaf = &a->p->nodes[a->p->leaves[r->leaf0]];
    for (;;) {
        cJSON *e;
        if (elem) {
            e = value(a, elem);
        } else if (r->type >= 0) {
            e = leaf_value(a, r);
        } else { /* the repeated group itself is the element: an object of its children */
            e = cJSON_CreateObject();
            for (int k = 0; e && k < r->n_kids; k++) {
                const pq_node *kid = &a->p->nodes[a->p->kids[r->kid0 + k]];
                cJSON *v = value(a, kid);
                if (!v) {
                    cJSON_Delete(e);
                    e = NULL;
                    break;
                }
                cJSON_AddItemToObject(e, kid->name, v);
            }
        }
        if (!e) return cJSON_Delete(arr), NULL;
        cJSON_AddItemToArray(arr, e);
        if (c->at >= c->n || !leaf->rep || c->rep[c->at] != r->rep) break;
    }
    return arr;
}

/* The value of node n at the columns' cursors. */
static cJSON *value(assembler *a, const pq_node *n) {
    if (n->repetition == PQ_REPEATED) return repeated(a, n, 0);
    if (n->repetition == PQ_OPTIONAL) {
        int def;
        if (!peek_def(a, n, &def)) return NULL;
        if (def < n->def) return skip_entries(a, n) ? cJSON_CreateNull() : NULL;
    }
    if (n->type >= 0) return leaf_value(a, n);
    const int one_repeated = n->n_kids == 1 && a->p->nodes[a->p->kids[n->kid0]].repetition == PQ_REPEATED;
    if (is_map(n) && one_repeated) /* MAP: the repeated key_value group's entries, {key, value} objects */
        return repeated(a, &a->p->nodes[a->p->kids[n->kid0]], 0);
    if (is_list(n) && one_repeated) {
        const pq_node *mid = &a->p->nodes[a->p->kids[n->kid0]];
        /* three-level LIST: the middle group holds one element field; legacy names mark the
         * two-level form where the repeated group is the element */
        const size_t nl = strlen(n->name);
        const int legacy = mid->type >= 0 || mid->n_kids != 1 || !strcmp(mid->name, "array") ||
                           (!strncmp(mid->name, n->name, nl) && !strcmp(mid->name + nl, "_tuple"));
        return repeated(a, mid, !legacy);
    }
    cJSON *o = cJSON_CreateObject();
    if (!o) return a->why = "out of memory", a->where = n, NULL;
    for (int k = 0; k < n->n_kids; k++) {
        const pq_node *kid = &a->p->nodes[a->p->kids[n->kid0 + k]];
        cJSON *v = value(a, kid);
        if (!v) return cJSON_Delete(o), NULL;
        cJSON_AddItemToObject(o, kid->name, v);
    }
    return o;
}

int ctrl_parquet_next(ctrl_parquet *p, cJSON **row) {
    *row = NULL;
    while (p->g < 0 || p->g_row >= p->groups[p->g].rows) {
        if (p->g >= 0) { /* the finished group's columns must be used up */
            for (int l = 0; l < p->n_leaves; l++)
                if (p->cols[l].at != p->cols[l].n || p->cols[l].vat != p->cols[l].nv) {
                    ctrl_error_set(CTRL_ERR_FORMAT, "%s: row group %d, column %s: more entries than num_rows",
                                   p->file, p->g, p->nodes[p->leaves[l]].path);
                    return -1;
                }
        }
        if (p->g + 1 >= p->n_groups) return 0;
        p->g++, p->g_row = 0;
        if (pq_load_group(p, p->g) != CTRL_OK) return -1;
    }
    assembler a = {.p = p};
    const pq_node *root = &p->nodes[0];
    for (int l = 0; l < p->n_leaves; l++) { /* every column starts a new record here */
        const pq_column *c = &p->cols[l];
        if (c->at < c->n && c->rep && c->rep[c->at] != 0) {
            a.why = "the columns' repetition levels disagree", a.where = &p->nodes[p->leaves[l]];
            break;
        }
    }
    cJSON *o = a.why ? NULL : cJSON_CreateObject();
    for (int k = 0; o && k < root->n_kids; k++) {
        const pq_node *kid = &p->nodes[p->kids[root->kid0 + k]];
        cJSON *v = value(&a, kid);
        if (!v) {
            cJSON_Delete(o);
            o = NULL;
            break;
        }
        cJSON_AddItemToObject(o, kid->name, v);
    }
    if (!o) {
        ctrl_error_set(CTRL_ERR_FORMAT, "%s: row group %d, row %lld, column %s: %s", p->file, p->g,
                       (long long)p->g_row, a.where ? a.where->path : "?", a.why ? a.why : "out of memory");
        return -1;
    }
    p->g_row++;
    *row = o;
    return 1;
}

int ctrl_parquet_magic(const void *head, size_t n) { return n >= 4 && !memcmp(head, "PAR1", 4); }

int64_t ctrl_parquet_num_rows(const ctrl_parquet *p) { return p->num_rows; }

ctrl_status ctrl_parquet_open(const char *path, ctrl_parquet **out) {
    *out = NULL;
    ctrl_parquet *p = calloc(1, sizeof *p);
    if (!p || !(p->file = strdup(path)))
        return free(p), ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", path);
    p->g = -1;
    ctrl_status st = ctrl_mapped_file_open(path, 12, "a parquet file", &p->data, &p->size);
    if (st == CTRL_OK) st = pq_read_footer(p);
    if (st != CTRL_OK) return ctrl_parquet_close(p), st;
    *out = p;
    return CTRL_OK;
}

void ctrl_parquet_close(ctrl_parquet *p) {
    if (!p) return;
    pq_free_columns(p);
    free(p->cols);
    pq_free_meta(p);
    ctrl_mapped_file_close(p->data, p->size);
    free(p->file);
    free(p);
}
