/* Arrow IPC stream reader (arrow_ipc.h), from the Arrow columnar format specification: a stream is
 * encapsulated messages (0xFFFFFFFF, an int32 metadata length, a flatbuffer Message, the body), a
 * Schema first, then RecordBatches whose FieldNodes (length, null count) and Buffers (offset,
 * length in the body) follow the schema's fields depth first: validity bitmap, then offsets and
 * data by type. Each batch is checked whole (buffer sizes, offsets in range and non-decreasing)
 * before a row is read from it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "dataset/arrow_ipc.h"
#include "dataset/flatbuf.h"
#include "dataset/mapped_file.h"

enum {
    T_NULL = 1,
    T_INT,
    T_FLOAT,
    T_BINARY,
    T_UTF8,
    T_BOOL,
    T_DECIMAL,
    T_DATE,
    T_TIME,
    T_TIMESTAMP,
    T_INTERVAL,
    T_LIST,
    T_STRUCT,
    T_UNION,
    T_FIXED_BINARY,
    T_FIXED_LIST,
    T_MAP,
    T_DURATION,
    T_LARGE_BINARY,
    T_LARGE_UTF8,
    T_LARGE_LIST
};
enum { MSG_SCHEMA = 1, MSG_DICTIONARY = 2, MSG_BATCH = 3 };

#define AF_MAX_DEPTH 32
#define AF_MAX_FIELDS 10000
#define AF_MAX_LENGTH ((int64_t)1 << 31)

typedef struct af_field {
    char *name;
    int type, bits, is_signed, fixed; /* bits: an Int's / a float's / a temporal's width; fixed: a
                                         fixed-size binary's width or a fixed-size list's length */
    int n_kids;
    struct af_field *kids;
} af_field;

typedef struct af_array {
    int64_t length, null_count;
    const uint8_t *valid, *offs, *data;
    int64_t valid_len, offs_len, data_len;
    struct af_array *kids;
} af_array;

struct ctrl_arrow {
    char *file;
    const uint8_t *data;
    size_t size, pos, end;
    af_field root;
    int n_fields;
    af_array batch; /* kids: the top-level columns of the current batch */
    int64_t batch_row, n_batches;
    uint8_t **bufs; /* decompressed buffers of the current batch */
    int nbufs;
    int done;
    const char *why; /* the failure being reported */
    const af_field *where;
};

int ctrl_arrow_magic(const void *head, size_t n) {
    const uint8_t *h = head;
    return n >= 4 && ((h[0] == 0xff && h[1] == 0xff && h[2] == 0xff && h[3] == 0xff) ||
                      (n >= 6 && !memcmp(h, "ARROW1", 6)));
}

static int fail(ctrl_arrow *a, const af_field *f, const char *why) {
    if (!a->why) a->why = why, a->where = f;
    return 0;
}

static int fixed_width(const af_field *f) { /* bytes per value of a fixed-width type, 0 otherwise */
    switch (f->type) {
    case T_INT:
    case T_FLOAT:
    case T_DATE:
    case T_TIME:
    case T_TIMESTAMP:
    case T_DURATION: return f->bits / 8;
    case T_FIXED_BINARY: return f->fixed;
    default: return 0;
    }
}

/* One schema Field table into f (with its children). */
static int read_field(ctrl_arrow *a, ctrl_fb *fb, ctrl_fb_table t, af_field *f, int depth) {
    if (depth > AF_MAX_DEPTH) return fail(a, NULL, "the schema nests too deeply");
    if (++a->n_fields > AF_MAX_FIELDS) return fail(a, NULL, "more than 10000 fields");
    uint32_t len;
    const char *name = ctrl_fb_string(fb, t, 0, &len);
    if (!(f->name = malloc(len + 1))) return fail(a, NULL, "out of memory");
    if (len) memcpy(f->name, name, len);
    f->name[len] = '\0';
    f->type = (int)(uint8_t)ctrl_fb_int(fb, t, 2, 1, 0);
    const ctrl_fb_table ty = ctrl_fb_sub(fb, t, 3);
    if (ctrl_fb_sub(fb, t, 4)) return fail(a, f, "a dictionary-encoded column (not supported)");
    switch (f->type) {
    case T_INT:
        f->bits = (int)ctrl_fb_int(fb, ty, 0, 4, 0);
        f->is_signed = (int)ctrl_fb_int(fb, ty, 1, 1, 0);
        if (f->bits != 8 && f->bits != 16 && f->bits != 32 && f->bits != 64)
            return fail(a, f, "a bad integer width");
        break;
    case T_FLOAT: { /* precision: HALF, SINGLE, DOUBLE */
        const int64_t p = ctrl_fb_int(fb, ty, 0, 2, 0);
        f->bits = p >= 0 && p <= 2 ? 16 << p : 0;
        break;
    }
    case T_DATE: f->bits = ctrl_fb_int(fb, ty, 0, 2, 1) == 0 ? 32 : 64; break;
    case T_TIME: f->bits = (int)ctrl_fb_int(fb, ty, 1, 4, 32); break;
    case T_TIMESTAMP:
    case T_DURATION: f->bits = 64; break;
    case T_FIXED_BINARY:
    case T_FIXED_LIST: f->fixed = (int)ctrl_fb_int(fb, ty, 0, 4, 0); break;
    case T_NULL:
    case T_BINARY:
    case T_UTF8:
    case T_BOOL:
    case T_LIST:
    case T_STRUCT:
    case T_MAP:
    case T_LARGE_BINARY:
    case T_LARGE_UTF8:
    case T_LARGE_LIST: break;
    default:
        return fail(a, f, "a column type not supported (decimal, interval, union, view or run-end types)");
    }
    if ((f->type == T_FLOAT && !f->bits) || (f->type == T_TIME && f->bits != 32 && f->bits != 64) ||
        ((f->type == T_FIXED_BINARY || f->type == T_FIXED_LIST) && (f->fixed < 0 || f->fixed > (1 << 20))))
        return fail(a, f, "a bad type parameter");
    uint32_t n;
    const uint32_t kids = ctrl_fb_vector(fb, t, 5, 4, &n);
    const int want =
        f->type == T_LIST || f->type == T_LARGE_LIST || f->type == T_FIXED_LIST || f->type == T_MAP ? 1
        : f->type == T_STRUCT                                                                       ? -1
                                                                                                    : 0;
    if ((want >= 0 && (int)n != want) || (want < 0 && n == 0))
        return fail(a, f, "a type with the wrong children");
    if (n && !(f->kids = calloc(n, sizeof *f->kids))) return fail(a, f, "out of memory");
    f->n_kids = (int)n;
    for (uint32_t k = 0; k < n; k++)
        if (!read_field(a, fb, ctrl_fb_vector_table(fb, kids, k), &f->kids[k], depth + 1)) return 0;
    if (f->type == T_MAP && (f->kids[0].type != T_STRUCT || f->kids[0].n_kids != 2))
        return fail(a, f, "a map whose entries are not {key, value}");
    return !fb->bad || fail(a, f, "malformed schema metadata");
}

static void free_field(af_field *f) {
    for (int k = 0; k < f->n_kids; k++) free_field(&f->kids[k]);
    free(f->kids), free(f->name);
}

static void free_array(af_array *x, const af_field *f) {
    if (!x->kids) return;
    for (int k = 0; k < f->n_kids; k++) free_array(&x->kids[k], &f->kids[k]);
    free(x->kids);
    x->kids = NULL;
}

static void free_batch(ctrl_arrow *a) {
    free_array(&a->batch, &a->root);
    for (int i = 0; i < a->nbufs; i++) free(a->bufs[i]);
    free(a->bufs);
    a->bufs = NULL, a->nbufs = 0;
}

/* The next message: its header type, metadata flatbuffer and body. 0 at the end of the stream. */
static int next_message(ctrl_arrow *a, ctrl_fb *fb, ctrl_fb_table *header, int *type, const uint8_t **body,
                        int64_t *body_len) {
    if (a->end - a->pos < 4) /* a stream ends with its marker; the file format at the footer */
        return a->end == a->size ? fail(a, NULL, "the stream ends without its end marker (truncated?)") : 0;
    ctrl_fb raw = {a->data + a->pos, a->end - a->pos, 0};
    uint32_t len = (uint32_t)ctrl_fb_read(&raw, 0, 4);
    size_t at = 4;
    if (len == 0xffffffffu) len = (uint32_t)ctrl_fb_read(&raw, 4, 4), at = 8;
    if (raw.bad) return fail(a, NULL, "a truncated message header");
    if (len == 0) return 0; /* end-of-stream marker */
    if (len > raw.size - at) return fail(a, NULL, "a message's metadata runs past the end");
    *fb = (ctrl_fb){raw.buf + at, len, 0};
    const ctrl_fb_table msg = ctrl_fb_root(fb);
    *type = (int)(uint8_t)ctrl_fb_int(fb, msg, 1, 1, 0);
    *header = ctrl_fb_sub(fb, msg, 2);
    *body_len = ctrl_fb_int(fb, msg, 3, 8, 0);
    if (fb->bad || !*header) return fail(a, NULL, "malformed message metadata");
    const size_t body_at = a->pos + at + len;
    if (*body_len < 0 || (uint64_t)*body_len > a->end - body_at)
        return fail(a, NULL, "a message body runs past the end");
    *body = a->data + body_at;
    a->pos = body_at + (size_t)*body_len;
    return 1;
}

typedef struct batch_ctx {
    ctrl_arrow *a;
    ctrl_fb *fb;
    const uint8_t *body;
    int64_t body_len;
    uint32_t nodes, n_nodes, bufs, n_bufs, ni, bi;
    int codec; /* -1 uncompressed, 1 ZSTD */
} batch_ctx;

static int keep(ctrl_arrow *a, uint8_t *b) {
    uint8_t **nb = realloc(a->bufs, (size_t)(a->nbufs + 1) * sizeof *nb);
    if (!nb) return free(b), 0;
    a->bufs = nb;
    a->bufs[a->nbufs++] = b;
    return 1;
}

/* The next buffer of the batch (decompressed when the batch is). */
static int take_buffer(batch_ctx *c, const af_field *f, const uint8_t **p, int64_t *len) {
    if (c->bi >= c->n_bufs) return fail(c->a, f, "fewer buffers than the schema needs");
    const int64_t off = ctrl_fb_read(c->fb, c->bufs + 16 * c->bi, 8),
                  n = ctrl_fb_read(c->fb, c->bufs + 16 * c->bi + 8, 8);
    c->bi++;
    if (off < 0 || n < 0 || off > c->body_len || n > c->body_len - off)
        return fail(c->a, f, "a buffer outside the body");
    *p = c->body + off, *len = n;
    if (c->codec < 0 || n == 0) return 1;
    if (n < 8) return fail(c->a, f, "a compressed buffer without its length");
    ctrl_fb raw = {*p, 8, 0};
    const int64_t full = ctrl_fb_read(&raw, 0, 8);
    if (full == -1) return *p += 8, *len = n - 8, 1; /* stored uncompressed */
    if (full < 0 || full > ((int64_t)1 << 30))
        return fail(c->a, f, "a bad uncompressed buffer length (over 1 GiB?)");
    const unsigned long long framed = ZSTD_getFrameContentSize(*p + 8, (size_t)(n - 8));
    if (framed != ZSTD_CONTENTSIZE_UNKNOWN && framed != (unsigned long long)full)
        return fail(c->a, f, "zstd: the buffer's length is not its frame's");
    uint8_t *out = malloc((size_t)full + 1);
    if (!out) return fail(c->a, f, "out of memory");
    const size_t r = ZSTD_decompress(out, (size_t)full, *p + 8, (size_t)(n - 8));
    if (ZSTD_isError(r) || r != (size_t)full) return free(out), fail(c->a, f, "zstd: corrupt buffer");
    if (!keep(c->a, out)) return fail(c->a, f, "out of memory");
    *p = out, *len = full;
    return 1;
}

static int64_t off_at(const af_array *x, int wide, int64_t i) {
    ctrl_fb raw = {x->offs, (size_t)x->offs_len, 0};
    return ctrl_fb_read(&raw, (size_t)i * (wide ? 8 : 4), wide ? 8 : 4);
}

/* Offsets: length + 1 of them, non-decreasing, within [0, limit]. */
static int check_offsets(ctrl_arrow *a, const af_field *f, const af_array *x, int wide, int64_t limit) {
    if (x->length == 0) return 1;
    if (x->offs_len / (wide ? 8 : 4) < x->length + 1) return fail(a, f, "an offsets buffer too short");
    int64_t prev = off_at(x, wide, 0);
    if (prev < 0) return fail(a, f, "a negative offset");
    for (int64_t i = 1; i <= x->length; i++) {
        const int64_t o = off_at(x, wide, i);
        if (o < prev) return fail(a, f, "decreasing offsets");
        prev = o;
    }
    return prev <= limit || fail(a, f, "offsets past the data");
}

static int load_array(batch_ctx *c, const af_field *f, af_array *x, int64_t need) {
    ctrl_arrow *a = c->a;
    if (c->ni >= c->n_nodes) return fail(a, f, "fewer field nodes than the schema needs");
    x->length = ctrl_fb_read(c->fb, c->nodes + 16 * c->ni, 8);
    x->null_count = ctrl_fb_read(c->fb, c->nodes + 16 * c->ni + 8, 8);
    c->ni++;
    if (x->length < need || x->length > AF_MAX_LENGTH || x->null_count < 0 || x->null_count > x->length)
        return fail(a, f, "a bad field node length or null count");
    if (f->type != T_NULL) {
        if (!take_buffer(c, f, &x->valid, &x->valid_len)) return 0;
        if (x->null_count > 0 && x->valid_len < (x->length + 7) / 8)
            return fail(a, f, "a validity bitmap too short");
        if (x->null_count == 0) x->valid = NULL;
    }
    const int w = fixed_width(f);
    if (w || f->type == T_BOOL) {
        if (!take_buffer(c, f, &x->data, &x->data_len)) return 0;
        if (x->data_len < (w ? x->length * w : (x->length + 7) / 8))
            return fail(a, f, "a values buffer too short");
    } else if (f->type == T_BINARY || f->type == T_UTF8 || f->type == T_LARGE_BINARY ||
               f->type == T_LARGE_UTF8) {
        if (!take_buffer(c, f, &x->offs, &x->offs_len) || !take_buffer(c, f, &x->data, &x->data_len))
            return 0;
        if (!check_offsets(a, f, x, f->type >= T_LARGE_BINARY, x->data_len)) return 0;
    } else if (f->type == T_LIST || f->type == T_LARGE_LIST || f->type == T_MAP) {
        if (!take_buffer(c, f, &x->offs, &x->offs_len)) return 0;
    }
    if (!f->n_kids) return 1;
    if (!(x->kids = calloc((size_t)f->n_kids, sizeof *x->kids))) return fail(a, f, "out of memory");
    const int64_t kid_need = f->type == T_STRUCT       ? x->length
                             : f->type == T_FIXED_LIST ? x->length * f->fixed
                                                       : 0;
    for (int k = 0; k < f->n_kids; k++)
        if (!load_array(c, &f->kids[k], &x->kids[k], kid_need)) return 0;
    if (f->type == T_LIST || f->type == T_LARGE_LIST || f->type == T_MAP)
        return check_offsets(a, f, x, f->type == T_LARGE_LIST, x->kids[0].length);
    return 1;
}

static int load_batch(ctrl_arrow *a, ctrl_fb *fb, ctrl_fb_table rb, const uint8_t *body, int64_t body_len) {
    free_batch(a);
    batch_ctx c = {.a = a, .fb = fb, .body = body, .body_len = body_len, .codec = -1};
    const int64_t len = ctrl_fb_int(fb, rb, 0, 8, 0);
    c.nodes = ctrl_fb_vector(fb, rb, 1, 16, &c.n_nodes);
    c.bufs = ctrl_fb_vector(fb, rb, 2, 16, &c.n_bufs);
    const ctrl_fb_table comp = ctrl_fb_sub(fb, rb, 3);
    if (comp) c.codec = (int)ctrl_fb_int(fb, comp, 0, 1, 0);
    if (fb->bad) return fail(a, NULL, "malformed record batch metadata");
    if (c.codec == 0)
        return fail(a, NULL, "LZ4-compressed buffers (not supported: uncompressed and ZSTD are)");
    if (c.codec > 1) return fail(a, NULL, "an unknown buffer compression");
    if (len < 0 || len > AF_MAX_LENGTH) return fail(a, NULL, "a bad record batch length");
    a->batch.length = len;
    if (!(a->batch.kids = calloc((size_t)a->root.n_kids + 1, sizeof *a->batch.kids)))
        return fail(a, NULL, "out of memory");
    for (int k = 0; k < a->root.n_kids; k++)
        if (!load_array(&c, &a->root.kids[k], &a->batch.kids[k], len)) return 0;
    return 1;
}

static int is_valid(const af_array *x, int64_t i) { return !x->valid || (x->valid[i >> 3] >> (i & 7)) & 1; }

static double half(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m | 1024, e - 25);
    return h >> 15 ? -v : v;
}

static cJSON *value(ctrl_arrow *a, const af_field *f, const af_array *x, int64_t i);

static cJSON *bytes_value(ctrl_arrow *a, const af_field *f, const uint8_t *p, int64_t n) {
    const int text = f->type == T_UTF8 || f->type == T_LARGE_UTF8;
    if (n && memchr(p, 0, (size_t)n))
        return text ? (fail(a, f, "a string holds a NUL byte"), NULL) : cJSON_CreateNull();
    char *s = malloc((size_t)n + 1);
    if (!s) return fail(a, f, "out of memory"), NULL;
    if (n) memcpy(s, p, (size_t)n);
    s[n] = '\0';
    cJSON *j = cJSON_CreateString(s);
    free(s);
    return j;
}

static cJSON *list_value(ctrl_arrow *a, const af_field *f, const af_array *x, int64_t from, int64_t to) {
    cJSON *arr = cJSON_CreateArray();
    for (int64_t k = from; arr && k < to; k++) {
        cJSON *e = value(a, &f->kids[0], &x->kids[0], k);
        if (!e) return cJSON_Delete(arr), NULL;
        cJSON_AddItemToArray(arr, e);
    }
    return arr;
}

static cJSON *value(ctrl_arrow *a, const af_field *f, const af_array *x, int64_t i) {
    if (f->type == T_NULL || !is_valid(x, i)) return cJSON_CreateNull();
    ctrl_fb raw = {x->data, (size_t)x->data_len, 0};
    const int w = fixed_width(f);
    switch (f->type) {
    case T_BOOL: return cJSON_CreateBool((x->data[i >> 3] >> (i & 7)) & 1);
    case T_FLOAT: {
        const int64_t b = ctrl_fb_read(&raw, (size_t)(i * w), w);
        if (w == 2) return cJSON_CreateNumber(half((uint16_t)b));
        if (w == 4) {
            const uint32_t u = (uint32_t)b;
            float v;
            memcpy(&v, &u, 4);
            return cJSON_CreateNumber(v);
        }
        double v;
        memcpy(&v, &b, 8);
        return cJSON_CreateNumber(v);
    }
    case T_INT:
    case T_DATE:
    case T_TIME:
    case T_TIMESTAMP:
    case T_DURATION: {
        const int64_t v = ctrl_fb_read(&raw, (size_t)(i * w), w);
        if (f->type == T_INT && !f->is_signed && w < 8)
            return cJSON_CreateNumber((double)(v & ((1LL << (8 * w)) - 1)));
        return cJSON_CreateNumber(f->type == T_INT && !f->is_signed ? (double)(uint64_t)v : (double)v);
    }
    case T_FIXED_BINARY: return bytes_value(a, f, x->data + i * w, w);
    case T_BINARY:
    case T_UTF8:
    case T_LARGE_BINARY:
    case T_LARGE_UTF8: {
        const int wide = f->type >= T_LARGE_BINARY;
        const int64_t o = off_at(x, wide, i);
        return bytes_value(a, f, x->data + o, off_at(x, wide, i + 1) - o);
    }
    case T_LIST:
    case T_LARGE_LIST:
    case T_MAP: {
        const int wide = f->type == T_LARGE_LIST;
        return list_value(a, f, x, off_at(x, wide, i), off_at(x, wide, i + 1));
    }
    case T_FIXED_LIST: return list_value(a, f, x, i * f->fixed, (i + 1) * f->fixed);
    case T_STRUCT: {
        cJSON *o = cJSON_CreateObject();
        for (int k = 0; o && k < f->n_kids; k++) {
            cJSON *v = value(a, &f->kids[k], &x->kids[k], i);
            if (!v) return cJSON_Delete(o), NULL;
            cJSON_AddItemToObject(o, f->kids[k].name, v);
        }
        return o;
    }
    default: return fail(a, f, "an unsupported type"), NULL;
    }
}

static int report(ctrl_arrow *a) {
    ctrl_error_set(CTRL_ERR_FORMAT, "%s: record batch %lld%s%s: %s", a->file, (long long)a->n_batches,
                   a->where ? ", column " : "", a->where ? a->where->name : "",
                   a->why ? a->why : "out of memory");
    return -1;
}

int ctrl_arrow_next(ctrl_arrow *a, cJSON **row) {
    *row = NULL;
    while (a->batch_row >= a->batch.length) {
        if (a->done) return 0;
        ctrl_fb fb;
        ctrl_fb_table header;
        int type;
        const uint8_t *body;
        int64_t body_len;
        const int got = next_message(a, &fb, &header, &type, &body, &body_len);
        if (!got) {
            if (a->why) return report(a);
            return a->done = 1, 0;
        }
        a->n_batches++;
        if (type == MSG_DICTIONARY) return fail(a, NULL, "a dictionary batch (not supported)"), report(a);
        if (type != MSG_BATCH) return fail(a, NULL, "a message that is not a record batch"), report(a);
        if (!load_batch(a, &fb, header, body, body_len)) return report(a);
        a->batch_row = 0;
    }
    cJSON *o = cJSON_CreateObject();
    for (int k = 0; o && k < a->root.n_kids; k++) {
        cJSON *v = value(a, &a->root.kids[k], &a->batch.kids[k], a->batch_row);
        if (!v) {
            cJSON_Delete(o);
            return report(a);
        }
        cJSON_AddItemToObject(o, a->root.kids[k].name, v);
    }
    if (!o) return report(a);
    a->batch_row++;
    *row = o;
    return 1;
}

ctrl_status ctrl_arrow_open(const char *path, ctrl_arrow **out) {
    *out = NULL;
    ctrl_arrow *a = calloc(1, sizeof *a);
    if (!a || !(a->file = strdup(path)))
        return free(a), ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", path);
    ctrl_status st = ctrl_mapped_file_open(path, 8, "an Arrow stream", &a->data, &a->size);
    a->end = a->size;
    if (st == CTRL_OK && !memcmp(a->data, "ARROW1", 6)) {
        /* the file format: the stream after the 8-byte magic, up to the footer before the end */
        ctrl_fb raw = {a->data, a->size, 0};
        const int64_t flen = a->size >= 18 ? ctrl_fb_read(&raw, a->size - 10, 4) : -1;
        if (flen < 0 || (uint64_t)flen > a->size - 18 || memcmp(a->data + a->size - 6, "ARROW1", 6))
            st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: an Arrow file without its footer", path);
        a->pos = 8, a->end = a->size - 10 - (size_t)(flen < 0 ? 0 : flen);
    }
    if (st == CTRL_OK) {
        ctrl_fb fb;
        ctrl_fb_table header;
        int type;
        const uint8_t *body;
        int64_t body_len;
        a->root.type = T_STRUCT;
        if (!next_message(a, &fb, &header, &type, &body, &body_len) || type != MSG_SCHEMA) {
            fail(a, NULL, "the stream does not start with a schema");
        } else {
            uint32_t n;
            const uint32_t fields = ctrl_fb_vector(&fb, header, 1, 4, &n);
            if (fb.bad || n == 0 || n > AF_MAX_FIELDS)
                fail(a, NULL, "a schema without fields");
            else if (!(a->root.kids = calloc(n, sizeof *a->root.kids)))
                fail(a, NULL, "out of memory");
            else
                a->root.n_kids = (int)n;
            for (uint32_t k = 0; !a->why && k < n; k++)
                read_field(a, &fb, ctrl_fb_vector_table(&fb, fields, k), &a->root.kids[k], 1);
        }
        if (a->why)
            st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: not a readable Arrow stream: %s%s%s%s", path, a->why,
                                a->where ? " (column " : "", a->where ? a->where->name : "",
                                a->where ? ")" : "");
    }
    if (st != CTRL_OK) return ctrl_arrow_close(a), st;
    *out = a;
    return CTRL_OK;
}

void ctrl_arrow_close(ctrl_arrow *a) {
    if (!a) return;
    free_batch(a);
    free_field(&a->root);
    ctrl_mapped_file_close(a->data, a->size);
    free(a->file);
    free(a);
}
