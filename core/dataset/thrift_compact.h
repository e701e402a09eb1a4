/* A reader of Thrift's compact protocol (the encoding of parquet's footer and page headers), over a
 * bounded byte range of untrusted input: every read checks the end, and the first failure sticks
 * (later reads return zeros) so that a parser checks `t->failed` once per structure. */
#ifndef CTRL_DATASET_THRIFT_COMPACT_H
#define CTRL_DATASET_THRIFT_COMPACT_H

#include <stddef.h>
#include <stdint.h>

enum {
    CTRL_THRIFT_STOP = 0,
    CTRL_THRIFT_TRUE = 1, /* a bool field's value is its type */
    CTRL_THRIFT_FALSE = 2,
    CTRL_THRIFT_I8 = 3,
    CTRL_THRIFT_I16 = 4,
    CTRL_THRIFT_I32 = 5,
    CTRL_THRIFT_I64 = 6,
    CTRL_THRIFT_DOUBLE = 7,
    CTRL_THRIFT_BINARY = 8,
    CTRL_THRIFT_LIST = 9,
    CTRL_THRIFT_SET = 10,
    CTRL_THRIFT_MAP = 11,
    CTRL_THRIFT_STRUCT = 12,
};

typedef struct ctrl_thrift {
    const uint8_t *p, *end;
    int depth;       /* structs and containers open (bounded: a hostile footer nests deeply) */
    const char *why; /* the first failure, NULL while all is well */
} ctrl_thrift;

void ctrl_thrift_init(ctrl_thrift *t, const void *data, size_t size);
/* The next field of the struct being read: 1 with *id and *type, 0 at its end (or on failure).
 * *last is the previous field id (0 at the struct's start), as the compact protocol's deltas need. */
int ctrl_thrift_field(ctrl_thrift *t, int16_t *last, int16_t *id, int *type);
/* An I16, I32 or I64 value (all zigzag varints); i32 fails when out of range. */
int64_t ctrl_thrift_i64(ctrl_thrift *t);
int32_t ctrl_thrift_i32(ctrl_thrift *t);
int ctrl_thrift_i8(ctrl_thrift *t);
/* A string or binary: a pointer into the input and its length (NULL on failure). */
const uint8_t *ctrl_thrift_binary(ctrl_thrift *t, uint32_t *len);
/* A list or set header: the element type and count (the count is bounded by the bytes left). */
int ctrl_thrift_list(ctrl_thrift *t, int *elem_type, uint32_t *n);
/* Entering and leaving a nested struct (depth-bounded). */
int ctrl_thrift_enter(ctrl_thrift *t);
void ctrl_thrift_leave(ctrl_thrift *t);
/* Skips a value of `type` (a field's value, a list element). */
void ctrl_thrift_skip(ctrl_thrift *t, int type);
/* Marks the input as malformed (keeps the first reason). */
void ctrl_thrift_fail(ctrl_thrift *t, const char *why);

#endif
