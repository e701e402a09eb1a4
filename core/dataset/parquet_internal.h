/* The parquet reader's internals, shared by its files: parquet_meta.c (footer and schema),
 * parquet_page.c (a column chunk's pages to levels and values), parquet_rows.c (rows assembled
 * from the columns). Not a public interface. */
#ifndef CTRL_DATASET_PARQUET_INTERNAL_H
#define CTRL_DATASET_PARQUET_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dataset/parquet.h"

enum { PQ_BOOLEAN, PQ_INT32, PQ_INT64, PQ_INT96, PQ_FLOAT, PQ_DOUBLE, PQ_BYTE_ARRAY, PQ_FIXED };
enum { PQ_REQUIRED, PQ_OPTIONAL, PQ_REPEATED };
/* ConvertedType values the reader looks at. */
enum {
    PQ_CT_UTF8 = 0,
    PQ_CT_MAP = 1,
    PQ_CT_MAP_KEY_VALUE = 2,
    PQ_CT_LIST = 3,
    PQ_CT_ENUM = 4,
    PQ_CT_UINT_8 = 11,
    PQ_CT_UINT_16 = 12,
    PQ_CT_UINT_32 = 13,
    PQ_CT_UINT_64 = 14,
    PQ_CT_JSON = 19
};
/* LogicalType union members the reader looks at. */
enum { PQ_LT_STRING = 1, PQ_LT_MAP = 2, PQ_LT_LIST = 3, PQ_LT_ENUM = 4, PQ_LT_INTEGER = 10, PQ_LT_JSON = 12 };

#define PQ_MAX_DEPTH 32 /* schema nesting */

typedef struct pq_node {
    char *name;
    char *path;          /* dotted path from the root ("messages.list.element.role") */
    int type;            /* a leaf's physical type; -1 for a group */
    int type_length;     /* FIXED_LEN_BYTE_ARRAY's width */
    int repetition;      /* PQ_REQUIRED / PQ_OPTIONAL / PQ_REPEATED */
    int converted;       /* ConvertedType, -1 when absent */
    int logical;         /* LogicalType member, 0 when absent */
    int int_unsigned;    /* INTEGER(signed = false) or UINT_* */
    int n_kids, kid0;    /* children: kids[kid0 .. kid0 + n_kids) of ctrl_parquet.kids */
    int def, rep;        /* the definition and repetition level at this node */
    int leaf;            /* column index of a leaf, -1 for a group */
    int leaf0, leaf_end; /* the leaves under this node */
} pq_node;

typedef struct pq_chunk {
    int64_t start, size, num_values;
    int codec;
} pq_chunk;

typedef struct pq_group {
    int64_t rows;
    pq_chunk *chunks; /* one per leaf */
} pq_group;

typedef struct pq_value {
    union {
        int64_t i;
        double d;
        const uint8_t *s;
    };
    uint32_t len; /* bytes of a BYTE_ARRAY / FIXED value */
} pq_value;

/* One leaf column of the current row group, decoded. */
typedef struct pq_column {
    int64_t n, cap;     /* level entries */
    int16_t *def, *rep; /* NULL when the leaf's level is 0 */
    pq_value *val;      /* the non-null values */
    int64_t nv, vcap;
    pq_value *dict;
    int64_t ndict;
    uint8_t **bufs; /* decompressed pages the values point into */
    int nbufs, bufcap;
    int64_t at, vat; /* the row assembler's cursors into levels and values */
} pq_column;

struct ctrl_parquet {
    char *file;
    const uint8_t *data;
    size_t size;
    pq_node *nodes;
    int n_nodes;
    int *kids;
    int *leaves; /* node index of each leaf column */
    int n_leaves;
    pq_group *groups;
    int n_groups;
    int64_t num_rows;
    int g;         /* the row group decoded in cols, -1 before the first */
    int64_t g_row; /* rows of it returned */
    pq_column *cols;
};

/* parquet_meta.c: the footer into nodes/leaves/groups; the message names the file. */
ctrl_status pq_read_footer(ctrl_parquet *p);
void pq_free_meta(ctrl_parquet *p);
/* parquet_page.c: `count` PLAIN values of the leaf's type from p[0..n) into dst. */
const char *pq_plain_values(const pq_node *leaf, const uint8_t *p, size_t n, int64_t count, pq_value *dst);
/* parquet_delta.c: values of DELTA_BINARY_PACKED (5), DELTA_LENGTH_BYTE_ARRAY (6), DELTA_BYTE_ARRAY
 * (7) or BYTE_STREAM_SPLIT (9); *owned (or NULL) is a buffer the values point into, for the column
 * to keep. */
const char *pq_other_values(const pq_node *leaf, int enc, const uint8_t *p, size_t n, int64_t count,
                            pq_value *dst, uint8_t **owned);
/* parquet_page.c: decodes row group g's column chunks into p->cols. */
ctrl_status pq_load_group(ctrl_parquet *p, int g);
void pq_free_columns(ctrl_parquet *p);

#endif
