/* Reading flatbuffers (the encoding of Arrow's IPC metadata) from untrusted bytes: tables through
 * their vtables, scalars, strings, vectors, every offset checked against the buffer. A failed read
 * returns the default (0, NULL) and sets `bad`. */
#ifndef CTRL_DATASET_FLATBUF_H
#define CTRL_DATASET_FLATBUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct ctrl_fb {
    const uint8_t *buf;
    size_t size;
    int bad;
} ctrl_fb;

/* A table: its position in the buffer (0 = absent). */
typedef uint32_t ctrl_fb_table;

ctrl_fb_table ctrl_fb_root(ctrl_fb *fb);
/* Field `i` of table t: scalars (with their default when absent), a sub-table, a string, a vector
 * (the position of its first element and its length). */
int64_t ctrl_fb_int(ctrl_fb *fb, ctrl_fb_table t, int i, int bytes, int64_t dflt);
ctrl_fb_table ctrl_fb_sub(ctrl_fb *fb, ctrl_fb_table t, int i);
const char *ctrl_fb_string(ctrl_fb *fb, ctrl_fb_table t, int i, uint32_t *len);
uint32_t ctrl_fb_vector(ctrl_fb *fb, ctrl_fb_table t, int i, uint32_t elem_size, uint32_t *n);
/* Element k of a vector of tables at `at`. */
ctrl_fb_table ctrl_fb_vector_table(ctrl_fb *fb, uint32_t at, uint32_t k);
/* A little-endian integer of `bytes` at buffer position `at` (bounds-checked). */
int64_t ctrl_fb_read(ctrl_fb *fb, size_t at, int bytes);

#endif
