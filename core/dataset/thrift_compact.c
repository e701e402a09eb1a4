/* Thrift compact protocol reader (thrift_compact.h), written from the protocol's specification:
 * varints (ULEB128), zigzag for signed integers, field headers with id deltas, list headers with
 * the size in the high nibble. */
#include <string.h>

#include "dataset/thrift_compact.h"

#define THRIFT_MAX_DEPTH 32

void ctrl_thrift_init(ctrl_thrift *t, const void *data, size_t size) {
    t->p = data, t->end = (const uint8_t *)data + size, t->depth = 0, t->why = NULL;
}

void ctrl_thrift_fail(ctrl_thrift *t, const char *why) {
    if (!t->why) t->why = why;
    t->p = t->end;
}

static uint64_t varint(ctrl_thrift *t) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (t->p >= t->end) return ctrl_thrift_fail(t, "truncated"), 0;
        const uint8_t b = *t->p++;
        if (shift == 63 && b > 1) return ctrl_thrift_fail(t, "a varint overflows 64 bits"), 0;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    return ctrl_thrift_fail(t, "a varint overflows 64 bits"), 0;
}

static void skip_element(ctrl_thrift *t, int type) {
    if (type == CTRL_THRIFT_TRUE || type == CTRL_THRIFT_FALSE)
        (void)ctrl_thrift_i8(t); /* a bool in a list or map is one byte */
    else
        ctrl_thrift_skip(t, type);
}

static int64_t zigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

int64_t ctrl_thrift_i64(ctrl_thrift *t) { return zigzag(varint(t)); }

int32_t ctrl_thrift_i32(ctrl_thrift *t) {
    const int64_t v = ctrl_thrift_i64(t);
    if (v < INT32_MIN || v > INT32_MAX) return ctrl_thrift_fail(t, "an i32 out of range"), 0;
    return (int32_t)v;
}

int ctrl_thrift_i8(ctrl_thrift *t) {
    if (t->p >= t->end) return ctrl_thrift_fail(t, "truncated"), 0;
    return (int8_t)*t->p++;
}

const uint8_t *ctrl_thrift_binary(ctrl_thrift *t, uint32_t *len) {
    const uint64_t n = varint(t);
    if (t->why) return *len = 0, NULL;
    if (n > (uint64_t)(t->end - t->p))
        return ctrl_thrift_fail(t, "a string runs past the end"), *len = 0, NULL;
    const uint8_t *s = t->p;
    t->p += n;
    *len = (uint32_t)n;
    return s;
}

int ctrl_thrift_list(ctrl_thrift *t, int *elem_type, uint32_t *n) {
    if (t->p >= t->end) return ctrl_thrift_fail(t, "truncated"), *n = 0, 0;
    const uint8_t h = *t->p++;
    uint64_t size = h >> 4;
    if (size == 15) size = varint(t);
    *elem_type = h & 15;
    /* every element takes at least one byte, except bools in a list (one byte too) */
    if (t->why || size > (uint64_t)(t->end - t->p))
        return ctrl_thrift_fail(t, "a list is longer than its bytes"), *n = 0, 0;
    *n = (uint32_t)size;
    return 1;
}

int ctrl_thrift_enter(ctrl_thrift *t) {
    if (++t->depth > THRIFT_MAX_DEPTH) return ctrl_thrift_fail(t, "structures nested too deeply"), 0;
    return !t->why;
}

void ctrl_thrift_leave(ctrl_thrift *t) { t->depth--; }

int ctrl_thrift_field(ctrl_thrift *t, int16_t *last, int16_t *id, int *type) {
    if (t->why) return 0;
    if (t->p >= t->end) return ctrl_thrift_fail(t, "truncated"), 0;
    const uint8_t h = *t->p++;
    *type = h & 15;
    if (*type == CTRL_THRIFT_STOP) return 0;
    const int delta = h >> 4;
    if (delta) {
        *id = (int16_t)(*last + delta);
    } else {
        const int64_t v = ctrl_thrift_i64(t);
        if (v < INT16_MIN || v > INT16_MAX) return ctrl_thrift_fail(t, "a field id out of range"), 0;
        *id = (int16_t)v;
    }
    if (*type > CTRL_THRIFT_STRUCT) return ctrl_thrift_fail(t, "an unknown field type"), 0;
    *last = *id;
    return !t->why;
}

void ctrl_thrift_skip(ctrl_thrift *t, int type) {
    if (t->why) return;
    switch (type) {
    case CTRL_THRIFT_TRUE:
    case CTRL_THRIFT_FALSE: return; /* a field's bool lives in its header */
    case CTRL_THRIFT_I8: (void)ctrl_thrift_i8(t); return;
    case CTRL_THRIFT_I16:
    case CTRL_THRIFT_I32:
    case CTRL_THRIFT_I64: (void)varint(t); return;
    case CTRL_THRIFT_DOUBLE:
        if (t->end - t->p < 8) return ctrl_thrift_fail(t, "truncated");
        t->p += 8;
        return;
    case CTRL_THRIFT_BINARY: {
        uint32_t n;
        (void)ctrl_thrift_binary(t, &n);
        return;
    }
    case CTRL_THRIFT_LIST:
    case CTRL_THRIFT_SET: {
        int et;
        uint32_t n;
        if (!ctrl_thrift_list(t, &et, &n) || !ctrl_thrift_enter(t)) return;
        for (uint32_t i = 0; i < n && !t->why; i++) skip_element(t, et);
        ctrl_thrift_leave(t);
        return;
    }
    case CTRL_THRIFT_MAP: {
        const uint64_t n = varint(t);
        if (t->why || n == 0) return;
        if (n > (uint64_t)(t->end - t->p)) return ctrl_thrift_fail(t, "a map is longer than its bytes");
        const int kv = ctrl_thrift_i8(t) & 0xff;
        if (!ctrl_thrift_enter(t)) return;
        for (uint64_t i = 0; i < n && !t->why; i++) {
            skip_element(t, kv >> 4);
            skip_element(t, kv & 15);
        }
        ctrl_thrift_leave(t);
        return;
    }
    case CTRL_THRIFT_STRUCT: {
        if (!ctrl_thrift_enter(t)) return;
        int16_t last = 0, id;
        int ft;
        while (ctrl_thrift_field(t, &last, &id, &ft)) ctrl_thrift_skip(t, ft);
        ctrl_thrift_leave(t);
        return;
    }
    default: ctrl_thrift_fail(t, "an unknown value type");
    }
}
