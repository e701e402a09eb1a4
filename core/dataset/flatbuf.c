/* Flatbuffer reading (flatbuf.h), from the format's description: the root is a uoffset to a table;
 * a table starts with an soffset back to its vtable (u16 vtable size, u16 table size, then one u16
 * offset per field, 0 = absent); reference fields hold a uoffset from where they are stored. */
#include "dataset/flatbuf.h"

int64_t ctrl_fb_read(ctrl_fb *fb, size_t at, int bytes) {
    if (at > fb->size || (size_t)bytes > fb->size - at) return fb->bad = 1, 0;
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)fb->buf[at + i] << (8 * i);
    if (bytes < 8 && (v >> (8 * bytes - 1)) & 1) v |= ~(uint64_t)0 << (8 * bytes); /* sign-extend */
    return (int64_t)v;
}

static uint32_t u32(ctrl_fb *fb, uint32_t at) { return (uint32_t)ctrl_fb_read(fb, at, 4); }

ctrl_fb_table ctrl_fb_root(ctrl_fb *fb) {
    const uint32_t off = u32(fb, 0);
    if (fb->bad || off < 4 || off >= fb->size) return fb->bad = 1, 0;
    return off;
}

/* The position of field i's value in table t, 0 when absent. */
static uint32_t field(ctrl_fb *fb, ctrl_fb_table t, int i) {
    if (!t || fb->bad) return 0;
    const int64_t vt = (int64_t)t - (int32_t)u32(fb, t);
    if (fb->bad || vt < 0 || vt + 4 > (int64_t)fb->size) return fb->bad = 1, 0;
    const uint32_t vsize = (uint16_t)ctrl_fb_read(fb, (uint32_t)vt, 2);
    const uint32_t tsize = (uint16_t)ctrl_fb_read(fb, (uint32_t)vt + 2, 2);
    if (4 + 2 * (uint32_t)i + 2 > vsize) return 0;
    const uint32_t off = (uint16_t)ctrl_fb_read(fb, (uint32_t)vt + 4 + 2 * (uint32_t)i, 2);
    if (!off) return 0;
    if (off >= tsize || (uint64_t)t + off >= fb->size) return fb->bad = 1, 0;
    return t + off;
}

int64_t ctrl_fb_int(ctrl_fb *fb, ctrl_fb_table t, int i, int bytes, int64_t dflt) {
    const uint32_t at = field(fb, t, i);
    return at ? ctrl_fb_read(fb, at, bytes) : dflt;
}

static uint32_t deref(ctrl_fb *fb, uint32_t at) {
    if (!at) return 0;
    const uint64_t to = (uint64_t)at + u32(fb, at);
    if (fb->bad || to >= fb->size) return fb->bad = 1, 0;
    return (uint32_t)to;
}

ctrl_fb_table ctrl_fb_sub(ctrl_fb *fb, ctrl_fb_table t, int i) { return deref(fb, field(fb, t, i)); }

uint32_t ctrl_fb_vector(ctrl_fb *fb, ctrl_fb_table t, int i, uint32_t elem_size, uint32_t *n) {
    *n = 0;
    const uint32_t v = deref(fb, field(fb, t, i));
    if (!v) return 0;
    const uint32_t len = u32(fb, v);
    if (fb->bad || (uint64_t)v + 4 + (uint64_t)len * elem_size > fb->size) return fb->bad = 1, 0;
    *n = len;
    return v + 4;
}

const char *ctrl_fb_string(ctrl_fb *fb, ctrl_fb_table t, int i, uint32_t *len) {
    const uint32_t at = ctrl_fb_vector(fb, t, i, 1, len);
    return at ? (const char *)fb->buf + at : NULL;
}

ctrl_fb_table ctrl_fb_vector_table(ctrl_fb *fb, uint32_t at, uint32_t k) { return deref(fb, at + 4 * k); }
