/* Parquet footer (parquet_internal.h): "PAR1", the column chunks, the thrift-compact FileMetaData,
 * its 4-byte length and "PAR1" again. The schema's depth-first element list becomes a tree with
 * each node's definition and repetition levels; each row group's column chunks are checked to lie
 * inside the file and to match the leaves' types. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/parquet_internal.h"
#include "dataset/thrift_compact.h"

#define PQ_MAX_NODES 100000
#define PQ_MAX_GROUPS 1000000

typedef struct raw_element {
    const uint8_t *name;
    uint32_t name_len;
    int type, type_length, repetition, n_kids, converted, logical, int_unsigned;
} raw_element;

static void read_logical(ctrl_thrift *t, raw_element *e) {
    if (!ctrl_thrift_enter(t)) return;
    int16_t last = 0, id;
    int ft;
    while (ctrl_thrift_field(t, &last, &id, &ft)) {
        if (ft == CTRL_THRIFT_STRUCT) e->logical = id;
        if (id == PQ_LT_INTEGER && ft == CTRL_THRIFT_STRUCT && ctrl_thrift_enter(t)) {
            int16_t l2 = 0, i2;
            int t2;
            while (ctrl_thrift_field(t, &l2, &i2, &t2)) {
                if (i2 == 2 && (t2 == CTRL_THRIFT_TRUE || t2 == CTRL_THRIFT_FALSE))
                    e->int_unsigned = t2 == CTRL_THRIFT_FALSE;
                else
                    ctrl_thrift_skip(t, t2);
            }
            ctrl_thrift_leave(t);
        } else {
            ctrl_thrift_skip(t, ft);
        }
    }
    ctrl_thrift_leave(t);
}

static void read_element(ctrl_thrift *t, raw_element *e) {
    *e = (raw_element){.type = -1, .repetition = PQ_REQUIRED, .converted = -1};
    if (!ctrl_thrift_enter(t)) return;
    int16_t last = 0, id;
    int ft;
    while (ctrl_thrift_field(t, &last, &id, &ft)) {
        if (id == 1 && ft == CTRL_THRIFT_I32)
            e->type = ctrl_thrift_i32(t);
        else if (id == 2 && ft == CTRL_THRIFT_I32)
            e->type_length = ctrl_thrift_i32(t);
        else if (id == 3 && ft == CTRL_THRIFT_I32)
            e->repetition = ctrl_thrift_i32(t);
        else if (id == 4 && ft == CTRL_THRIFT_BINARY)
            e->name = ctrl_thrift_binary(t, &e->name_len);
        else if (id == 5 && ft == CTRL_THRIFT_I32)
            e->n_kids = ctrl_thrift_i32(t);
        else if (id == 6 && ft == CTRL_THRIFT_I32)
            e->converted = ctrl_thrift_i32(t);
        else if (id == 10 && ft == CTRL_THRIFT_STRUCT)
            read_logical(t, e);
        else
            ctrl_thrift_skip(t, ft);
    }
    ctrl_thrift_leave(t);
}

typedef struct raw_chunk {
    int has_meta, external, type, codec;
    int64_t num_values, compressed, data_off, dict_off;
} raw_chunk;

static void read_column_meta(ctrl_thrift *t, raw_chunk *c) {
    if (!ctrl_thrift_enter(t)) return;
    int16_t last = 0, id;
    int ft;
    c->has_meta = 1;
    while (ctrl_thrift_field(t, &last, &id, &ft)) {
        if (id == 1 && ft == CTRL_THRIFT_I32)
            c->type = ctrl_thrift_i32(t);
        else if (id == 4 && ft == CTRL_THRIFT_I32)
            c->codec = ctrl_thrift_i32(t);
        else if (id == 5 && ft == CTRL_THRIFT_I64)
            c->num_values = ctrl_thrift_i64(t);
        else if (id == 7 && ft == CTRL_THRIFT_I64)
            c->compressed = ctrl_thrift_i64(t);
        else if (id == 9 && ft == CTRL_THRIFT_I64)
            c->data_off = ctrl_thrift_i64(t);
        else if (id == 11 && ft == CTRL_THRIFT_I64)
            c->dict_off = ctrl_thrift_i64(t);
        else
            ctrl_thrift_skip(t, ft);
    }
    ctrl_thrift_leave(t);
}

static void read_chunk(ctrl_thrift *t, raw_chunk *c) {
    *c = (raw_chunk){.type = -1};
    if (!ctrl_thrift_enter(t)) return;
    int16_t last = 0, id;
    int ft;
    while (ctrl_thrift_field(t, &last, &id, &ft)) {
        if (id == 1 && ft == CTRL_THRIFT_BINARY) {
            uint32_t n;
            (void)ctrl_thrift_binary(t, &n);
            c->external = n > 0;
        } else if (id == 3 && ft == CTRL_THRIFT_STRUCT) {
            read_column_meta(t, c);
        } else {
            ctrl_thrift_skip(t, ft);
        }
    }
    ctrl_thrift_leave(t);
}

static ctrl_status bad(const ctrl_parquet *p, const char *what) {
    return ctrl_error_set(CTRL_ERR_FORMAT, "%s: not a readable parquet file: %s", p->file, what);
}

/* Node `i` and its subtree from elements[*next...]; returns 0 on a malformed tree. */
static int build_node(ctrl_parquet *p, const raw_element *el, int n_el, int *next, int parent, int depth,
                      const char **why) {
    const int i = (*next)++;
    if (i >= n_el) return *why = "the schema has fewer elements than its num_children say", 0;
    if (depth > PQ_MAX_DEPTH) return *why = "the schema nests too deeply", 0;
    const raw_element *e = &el[i];
    pq_node *n = &p->nodes[i];
    const pq_node *up = parent >= 0 ? &p->nodes[parent] : NULL;
    n->type = e->n_kids > 0 || parent < 0 ? -1 : e->type;
    n->type_length = e->type_length;
    n->repetition = parent < 0 ? PQ_REQUIRED : e->repetition;
    n->converted = e->converted, n->logical = e->logical;
    n->int_unsigned = e->int_unsigned || (e->converted >= PQ_CT_UINT_8 && e->converted <= PQ_CT_UINT_64);
    if (n->repetition < PQ_REQUIRED || n->repetition > PQ_REPEATED) return *why = "a bad repetition type", 0;
    n->def = (up ? up->def : 0) + (n->repetition != PQ_REQUIRED);
    n->rep = (up ? up->rep : 0) + (n->repetition == PQ_REPEATED);
    n->name = malloc(e->name_len + 1);
    const size_t plen = (up && up->path[0] ? strlen(up->path) + 1 : 0) + e->name_len + 1;
    n->path = malloc(plen);
    if (!n->name || !n->path) return *why = "out of memory", 0;
    if (e->name_len) memcpy(n->name, e->name, e->name_len);
    n->name[e->name_len] = '\0';
    if (up && up->path[0])
        snprintf(n->path, plen, "%s.%s", up->path, n->name);
    else
        snprintf(n->path, plen, "%s", parent < 0 ? "" : n->name);
    n->leaf = -1;
    n->leaf0 = p->n_leaves;
    if (e->n_kids < 0 || e->n_kids > n_el) return *why = "a bad num_children", 0;
    if (e->n_kids == 0 && parent >= 0) {
        if (e->type < PQ_BOOLEAN || e->type > PQ_FIXED) return *why = "a column with no valid type", 0;
        if (e->type == PQ_FIXED && (e->type_length <= 0 || e->type_length > (1 << 20)))
            return *why = "a FIXED_LEN_BYTE_ARRAY column with a bad type_length", 0;
        n->leaf = p->n_leaves;
        p->leaves[p->n_leaves++] = i;
    }
    n->n_kids = e->n_kids;
    for (int k = 0; k < e->n_kids; k++)
        if (!build_node(p, el, n_el, next, i, depth + 1, why)) return 0;
    n = &p->nodes[i];
    n->leaf_end = p->n_leaves;
    if (n->type < 0 && n->leaf_end == n->leaf0) return *why = "a group with no columns", 0;
    return 1;
}

/* kids[]: each node's children, found again by walking the depth-first order. */
static void link_kids(ctrl_parquet *p) {
    int at = 0;
    for (int i = 0; i < p->n_nodes; i++) {
        pq_node *n = &p->nodes[i];
        const int first = i + 1;
        n->kid0 = at;
        int c = first;
        for (int k = 0; k < n->n_kids; k++) {
            p->kids[at++] = c;
            /* the next sibling follows the whole subtree of c */
            int end = c + 1, open = p->nodes[c].n_kids;
            while (open > 0 && end < p->n_nodes) open += p->nodes[end++].n_kids - 1;
            c = end;
        }
    }
}

static ctrl_status read_schema(ctrl_parquet *p, ctrl_thrift *t) {
    int et;
    uint32_t n;
    if (!ctrl_thrift_list(t, &et, &n) || et != CTRL_THRIFT_STRUCT || n == 0 || n > PQ_MAX_NODES)
        return bad(p, "the schema is not a list of elements");
    raw_element *el = calloc(n, sizeof *el);
    p->nodes = calloc(n, sizeof *p->nodes);
    p->kids = calloc(n, sizeof *p->kids);
    p->leaves = calloc(n, sizeof *p->leaves);
    if (!el || !p->nodes || !p->kids || !p->leaves)
        return free(el), ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", p->file);
    p->n_nodes = (int)n;
    for (uint32_t i = 0; i < n && !t->why; i++) read_element(t, &el[i]);
    const char *why = t->why;
    int next = 0;
    if (!why && build_node(p, el, (int)n, &next, -1, 0, &why) && next != (int)n)
        why = "schema elements left over after the root's children";
    free(el);
    if (why) return bad(p, why);
    if (p->n_leaves == 0) return bad(p, "the schema has no columns");
    link_kids(p);
    return CTRL_OK;
}

static ctrl_status read_groups(ctrl_parquet *p, ctrl_thrift *t, int64_t footer_at) {
    int et;
    uint32_t n;
    if (!ctrl_thrift_list(t, &et, &n) || et != CTRL_THRIFT_STRUCT || n > PQ_MAX_GROUPS)
        return bad(p, "row_groups is not a list of row groups");
    p->groups = calloc(n ? n : 1, sizeof *p->groups);
    if (!p->groups) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", p->file);
    raw_chunk *rc = calloc((size_t)p->n_leaves, sizeof *rc);
    if (!rc) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", p->file);
    ctrl_status st = CTRL_OK;
    for (uint32_t g = 0; g < n && st == CTRL_OK; g++) {
        pq_group *grp = &p->groups[p->n_groups++];
        if (!(grp->chunks = calloc((size_t)p->n_leaves, sizeof *grp->chunks))) {
            st = ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", p->file);
            break;
        }
        int n_chunks = 0;
        grp->rows = -1;
        if (!ctrl_thrift_enter(t)) break;
        int16_t last = 0, id;
        int ft;
        while (ctrl_thrift_field(t, &last, &id, &ft)) {
            if (id == 1 && ft == CTRL_THRIFT_LIST) {
                uint32_t nc;
                if (!ctrl_thrift_list(t, &et, &nc) || et != CTRL_THRIFT_STRUCT) break;
                if (nc != (uint32_t)p->n_leaves) {
                    st = ctrl_error_set(CTRL_ERR_FORMAT,
                                        "%s: row group %u has %u column chunks for %d columns", p->file, g,
                                        nc, p->n_leaves);
                    break;
                }
                for (uint32_t c = 0; c < nc && !t->why; c++) read_chunk(t, &rc[c]);
                n_chunks = (int)nc;
            } else if (id == 3 && ft == CTRL_THRIFT_I64) {
                grp->rows = ctrl_thrift_i64(t);
            } else {
                ctrl_thrift_skip(t, ft);
            }
        }
        ctrl_thrift_leave(t);
        if (st != CTRL_OK || t->why) break;
        if (grp->rows < 0 || n_chunks != p->n_leaves) {
            st =
                ctrl_error_set(CTRL_ERR_FORMAT, "%s: row group %u has no num_rows or no columns", p->file, g);
            break;
        }
        for (int c = 0; c < n_chunks && st == CTRL_OK; c++) {
            const raw_chunk *r = &rc[c];
            const pq_node *leaf = &p->nodes[p->leaves[c]];
            pq_chunk *ch = &grp->chunks[c];
            const int64_t start = r->dict_off > 0 && r->dict_off < r->data_off ? r->dict_off : r->data_off;
            const char *why = !r->has_meta ? "no column metadata"
                              : r->external
                                  ? "its data is in another file (file_path), which is not supported"
                              : r->type != leaf->type ? "its type is not the schema's"
                              : r->num_values < 0     ? "a negative num_values"
                              : start < 4 || r->compressed < 0 || r->compressed > footer_at - start
                                  ? "its bytes lie outside the file's data"
                                  : NULL;
            if (why)
                st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: row group %u, column %s: %s", p->file, g,
                                    leaf->path, why);
            *ch = (pq_chunk){
                .start = start, .size = r->compressed, .num_values = r->num_values, .codec = r->codec};
        }
    }
    free(rc);
    if (st == CTRL_OK && t->why) st = bad(p, t->why);
    return st;
}

ctrl_status pq_read_footer(ctrl_parquet *p) {
    if (p->size < 12 || memcmp(p->data, "PAR1", 4) != 0) return bad(p, "no PAR1 magic at the start");
    if (!memcmp(p->data + p->size - 4, "PARE", 4)) return bad(p, "the footer is encrypted (not supported)");
    if (memcmp(p->data + p->size - 4, "PAR1", 4) != 0) return bad(p, "no PAR1 magic at the end (truncated?)");
    const uint8_t *l = p->data + p->size - 8;
    const uint32_t len = (uint32_t)l[0] | (uint32_t)l[1] << 8 | (uint32_t)l[2] << 16 | (uint32_t)l[3] << 24;
    if (len == 0 || len > p->size - 12) return bad(p, "the footer length does not fit the file");
    const int64_t footer_at = (int64_t)(p->size - 8 - len);
    ctrl_thrift t;
    ctrl_thrift_init(&t, p->data + footer_at, len);
    int16_t last = 0, id;
    int ft, have_schema = 0, have_groups = 0;
    ctrl_status st = CTRL_OK;
    p->num_rows = -1;
    while (st == CTRL_OK && ctrl_thrift_field(&t, &last, &id, &ft)) {
        if (id == 2 && ft == CTRL_THRIFT_LIST && !have_schema) {
            st = read_schema(p, &t);
            have_schema = 1;
        } else if (id == 3 && ft == CTRL_THRIFT_I64) {
            p->num_rows = ctrl_thrift_i64(&t);
        } else if (id == 4 && ft == CTRL_THRIFT_LIST && have_schema && !have_groups) {
            st = read_groups(p, &t, footer_at);
            have_groups = 1;
        } else {
            ctrl_thrift_skip(&t, ft);
        }
    }
    if (st != CTRL_OK) return st;
    if (t.why) return bad(p, t.why);
    if (!have_schema) return bad(p, "the footer has no schema");
    if (!have_groups) return bad(p, "the footer has no row_groups (or they precede the schema)");
    int64_t sum = 0;
    for (int g = 0; g < p->n_groups; g++) {
        if (p->groups[g].rows > INT64_MAX - sum) return bad(p, "row counts overflow");
        sum += p->groups[g].rows;
    }
    if (p->num_rows != sum) return bad(p, "num_rows is not the sum of the row groups' rows");
    return CTRL_OK;
}

void pq_free_meta(ctrl_parquet *p) {
    for (int i = 0; p->nodes && i < p->n_nodes; i++) free(p->nodes[i].name), free(p->nodes[i].path);
    free(p->nodes);
    free(p->kids);
    free(p->leaves);
    for (int g = 0; p->groups && g < p->n_groups; g++) free(p->groups[g].chunks);
    free(p->groups);
}
