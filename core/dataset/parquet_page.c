/* A row group's column chunks decoded (parquet_internal.h): each chunk is a run of pages, each a
 * thrift-compact PageHeader then its (compressed) body. A dictionary page holds PLAIN values; a
 * data page (v1: levels inside the compressed body, each with a 4-byte length; v2: levels before
 * the body, uncompressed, lengths in the header) holds repetition and definition levels as the RLE /
 * bit-packed hybrid, then the non-null values PLAIN or as dictionary indices. */
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "dataset/parquet_internal.h"
#include "dataset/snappy.h"
#include "dataset/thrift_compact.h"

#define PQ_MAX_PAGE (256u << 20)                /* decompressed bytes of one page */
#define PQ_MAX_PAGE_VALUES (1 << 24)            /* level entries of one page */
#define PQ_MAX_GROUP_ENTRIES ((int64_t)1 << 27) /* level entries of one row group, all columns */

enum { CODEC_NONE = 0, CODEC_SNAPPY = 1, CODEC_GZIP = 2, CODEC_ZSTD = 6 };
enum { ENC_PLAIN = 0, ENC_PLAIN_DICT = 2, ENC_RLE = 3, ENC_BIT_PACKED = 4, ENC_RLE_DICT = 8 };
enum { PAGE_DATA = 0, PAGE_INDEX = 1, PAGE_DICT = 2, PAGE_DATA_V2 = 3 };

typedef struct page_header {
    int type, usize, csize, num_values, encoding, def_enc, rep_enc, def_len, rep_len, is_compressed;
} page_header;

typedef struct chunk_ctx {
    ctrl_parquet *p;
    const pq_node *leaf;
    pq_column *col;
    int codec;
    int64_t entries; /* the row group's entries so far, all columns */
} chunk_ctx;

static void read_sub(ctrl_thrift *t, page_header *h, int v2) {
    if (!ctrl_thrift_enter(t)) return;
    int16_t last = 0, id;
    int ft;
    while (ctrl_thrift_field(t, &last, &id, &ft)) {
        if (ft == CTRL_THRIFT_I32 && id == 1)
            h->num_values = ctrl_thrift_i32(t);
        else if (ft == CTRL_THRIFT_I32 && id == (v2 ? 4 : 2))
            h->encoding = ctrl_thrift_i32(t);
        else if (ft == CTRL_THRIFT_I32 && !v2 && id == 3)
            h->def_enc = ctrl_thrift_i32(t);
        else if (ft == CTRL_THRIFT_I32 && !v2 && id == 4)
            h->rep_enc = ctrl_thrift_i32(t);
        else if (ft == CTRL_THRIFT_I32 && v2 && id == 5)
            h->def_len = ctrl_thrift_i32(t);
        else if (ft == CTRL_THRIFT_I32 && v2 && id == 6)
            h->rep_len = ctrl_thrift_i32(t);
        else if (v2 && id == 7 && (ft == CTRL_THRIFT_TRUE || ft == CTRL_THRIFT_FALSE))
            h->is_compressed = ft == CTRL_THRIFT_TRUE;
        else
            ctrl_thrift_skip(t, ft);
    }
    ctrl_thrift_leave(t);
}

/* The page header at data[0..n): its fields and its encoded length, or a reason. */
static const char *read_page_header(const uint8_t *data, size_t n, page_header *h, size_t *used) {
    ctrl_thrift t;
    ctrl_thrift_init(&t, data, n);
    *h = (page_header){.type = -1,
                       .usize = -1,
                       .csize = -1,
                       .num_values = -1,
                       .encoding = -1,
                       .def_enc = ENC_RLE,
                       .rep_enc = ENC_RLE,
                       .is_compressed = 1};
    int16_t last = 0, id;
    int ft;
    while (ctrl_thrift_field(&t, &last, &id, &ft)) {
        if (ft == CTRL_THRIFT_I32 && id == 1)
            h->type = ctrl_thrift_i32(&t);
        else if (ft == CTRL_THRIFT_I32 && id == 2)
            h->usize = ctrl_thrift_i32(&t);
        else if (ft == CTRL_THRIFT_I32 && id == 3)
            h->csize = ctrl_thrift_i32(&t);
        else if (ft == CTRL_THRIFT_STRUCT && (id == 5 || id == 7 || id == 8))
            read_sub(&t, h, id == 8);
        else
            ctrl_thrift_skip(&t, ft);
    }
    if (t.why) return t.why[0] == 't' ? "a truncated page header" : "a malformed page header";
    *used = (size_t)(t.p - data);
    if (h->usize < 0 || h->csize < 0) return "a page header without sizes";
    if ((unsigned)h->usize > PQ_MAX_PAGE) return "a page larger than 256 MiB";
    return NULL;
}

static const char *keep_buffer(pq_column *col, uint8_t *b) {
    if (col->nbufs == col->bufcap) {
        const int cap = col->bufcap ? 2 * col->bufcap : 16;
        uint8_t **nb = realloc(col->bufs, (size_t)cap * sizeof *nb);
        if (!nb) return free(b), "out of memory";
        col->bufs = nb, col->bufcap = cap;
    }
    col->bufs[col->nbufs++] = b;
    return NULL;
}

/* src[0..n) decompressed to exactly `usize` bytes at *out (kept with the column). */
static const char *decompress(chunk_ctx *c, int codec, const uint8_t *src, size_t n, size_t usize,
                              const uint8_t **out) {
    if (codec == CODEC_NONE) {
        if (n != usize) return "an uncompressed page whose sizes differ";
        *out = src;
        return NULL;
    }
    uint8_t *b = malloc(usize ? usize : 1);
    if (!b) return "out of memory";
    const char *why = NULL;
    if (codec == CODEC_SNAPPY) {
        why = ctrl_snappy_decompress(src, n, b, usize);
    } else if (codec == CODEC_GZIP) {
        z_stream z = {0};
        if (inflateInit2(&z, 15 + 32) != Z_OK) {
            why = "gzip: cannot start zlib";
        } else {
            z.next_in = (Bytef *)(uintptr_t)src, z.avail_in = (uInt)n;
            z.next_out = b, z.avail_out = (uInt)usize;
            const int r = inflate(&z, Z_FINISH);
            if (r != Z_STREAM_END || z.total_out != usize)
                why = "gzip: corrupt data or a wrong uncompressed size";
            inflateEnd(&z);
        }
    } else if (codec == CODEC_ZSTD) {
        const size_t r = ZSTD_decompress(b, usize, src, n);
        if (ZSTD_isError(r) || r != usize) why = "zstd: corrupt data or a wrong uncompressed size";
    } else {
        why = codec == 3   ? "LZO compression is not supported (SNAPPY, GZIP, ZSTD and none are)"
              : codec == 4 ? "BROTLI compression is not supported (SNAPPY, GZIP, ZSTD and none are)"
              : codec == 5 || codec == 7
                  ? "LZ4 compression is not supported (SNAPPY, GZIP, ZSTD and none are)"
                  : "an unknown compression codec";
    }
    if (why) return free(b), why;
    if ((why = keep_buffer(c->col, b))) return why;
    *out = b;
    return NULL;
}

static int bit_width(uint32_t max) {
    int w = 0;
    while (max >> w) w++;
    return w;
}

/* `count` values of the RLE / bit-packed hybrid at p[0..n), each `bw` bits (0..32). */
static const char *rle_hybrid(const uint8_t *p, size_t n, int bw, int64_t count, uint32_t *out) {
    const uint8_t *end = p + n;
    int64_t k = 0;
    const int vbytes = (bw + 7) / 8;
    while (k < count) {
        uint64_t h = 0;
        for (int shift = 0;; shift += 7) {
            if (p >= end) return "levels or indices end early";
            if (shift > 35) return "a bad run header";
            h |= (uint64_t)(*p & 0x7f) << shift;
            if (!(*p++ & 0x80)) break;
        }
        if (h & 1) { /* bit-packed: (h >> 1) groups of 8 values */
            const uint64_t vals = (h >> 1) * 8;
            const int64_t take = (int64_t)(vals < (uint64_t)(count - k) ? vals : (uint64_t)(count - k));
            const uint64_t bytes = (h >> 1) * (uint64_t)bw, need = ((uint64_t)take * (uint64_t)bw + 7) / 8;
            if (need > (uint64_t)(end - p)) return "a bit-packed run ends early";
            for (int64_t i = 0; i < take; i++) {
                const uint64_t bit = (uint64_t)i * (uint64_t)bw;
                uint64_t w = 0;
                const uint64_t at = bit >> 3, avail = (uint64_t)(end - p) - at;
                for (uint64_t b = 0; b < 8 && b < avail; b++) w |= (uint64_t)p[at + b] << (8 * b);
                out[k++] = bw ? (uint32_t)((w >> (bit & 7)) & (((uint64_t)1 << bw) - 1)) : 0;
            }
            p += bytes < (uint64_t)(end - p) ? bytes : (uint64_t)(end - p);
        } else { /* a run of one value */
            const uint64_t run = h >> 1;
            if (run == 0) return "an empty RLE run";
            if (end - p < vbytes) return "an RLE run ends early";
            uint32_t v = 0;
            for (int b = 0; b < vbytes; b++) v |= (uint32_t)p[b] << (8 * b);
            p += vbytes;
            if (bw < 32 && (v >> bw)) return "an RLE value wider than its bit width";
            for (uint64_t i = 0; i < run && k < count; i++) out[k++] = v;
        }
    }
    return NULL;
}

static const char *grow_entries(pq_column *col, int64_t add, int has_def, int has_rep) {
    if (col->cap > 0 && col->n + add <= col->cap) return NULL; /* (allocated even for none) */
    int64_t cap = col->cap ? col->cap : 1024;
    while (cap < col->n + add) cap *= 2;
    if (has_def) {
        int16_t *d = realloc(col->def, (size_t)cap * sizeof *d);
        if (!d) return "out of memory";
        col->def = d;
    }
    if (has_rep) {
        int16_t *r = realloc(col->rep, (size_t)cap * sizeof *r);
        if (!r) return "out of memory";
        col->rep = r;
    }
    col->cap = cap;
    return NULL;
}

static const char *grow_values(pq_column *col, int64_t add) {
    if (col->vcap > 0 && col->nv + add <= col->vcap) return NULL;
    int64_t cap = col->vcap ? col->vcap : 1024;
    while (cap < col->nv + add) cap *= 2;
    pq_value *v = realloc(col->val, (size_t)cap * sizeof *v);
    if (!v) return "out of memory";
    col->val = v, col->vcap = cap;
    return NULL;
}

static const char *levels(const uint8_t *p, size_t n, int max, int64_t count, int16_t *dst, uint32_t *tmp) {
    const char *why = rle_hybrid(p, n, bit_width((uint32_t)max), count, tmp);
    if (why) return why;
    for (int64_t i = 0; i < count; i++) {
        if (tmp[i] > (uint32_t)max) return "a level above the column's maximum";
        dst[i] = (int16_t)tmp[i];
    }
    return NULL;
}

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* `count` PLAIN values of the leaf's type from p[0..n) into dst. */
const char *pq_plain_values(const pq_node *leaf, const uint8_t *p, size_t n, int64_t count, pq_value *dst) {
    const uint8_t *end = p + n;
    const int width = leaf->type == PQ_INT32 || leaf->type == PQ_FLOAT    ? 4
                      : leaf->type == PQ_INT64 || leaf->type == PQ_DOUBLE ? 8
                      : leaf->type == PQ_INT96                            ? 12
                      : leaf->type == PQ_FIXED                            ? leaf->type_length
                                                                          : 0;
    if (leaf->type == PQ_BOOLEAN) {
        if ((uint64_t)count > (uint64_t)n * 8) return "PLAIN booleans end early";
        for (int64_t i = 0; i < count; i++) dst[i] = (pq_value){.i = (p[i >> 3] >> (i & 7)) & 1};
        return NULL;
    }
    if (width) {
        if ((uint64_t)count > (uint64_t)n / (uint64_t)width) return "PLAIN values end early";
        for (int64_t i = 0; i < count; i++, p += width) {
            pq_value v = {.len = (uint32_t)width};
            if (leaf->type == PQ_INT32)
                v.i = leaf->int_unsigned ? (int64_t)(uint32_t)le(p, 4) : (int32_t)le(p, 4);
            else if (leaf->type == PQ_INT64)
                v.i = (int64_t)le(p, 8);
            else if (leaf->type == PQ_FLOAT) {
                const uint32_t b = (uint32_t)le(p, 4);
                float f;
                memcpy(&f, &b, 4);
                v.d = f;
            } else if (leaf->type == PQ_DOUBLE) {
                const uint64_t b = le(p, 8);
                memcpy(&v.d, &b, 8);
            } else if (leaf->type == PQ_INT96) { /* nanoseconds of the day, then the Julian day */
                v.i = ((int64_t)le(p + 8, 4) - 2440588) * 86400000000000LL + (int64_t)le(p, 8);
            } else {
                v.s = p;
            }
            dst[i] = v;
        }
        return NULL;
    }
    for (int64_t i = 0; i < count; i++) { /* BYTE_ARRAY: a 4-byte length, then the bytes */
        if (end - p < 4) return "PLAIN byte arrays end early";
        const uint32_t len = (uint32_t)le(p, 4);
        p += 4;
        if (len > (uint64_t)(end - p)) return "a PLAIN byte array runs past its page";
        dst[i] = (pq_value){.s = p, .len = len};
        p += len;
    }
    return NULL;
}

static const char *dictionary_page(chunk_ctx *c, const page_header *h, const uint8_t *body) {
    pq_column *col = c->col;
    if (col->dict) return "a second dictionary page";
    if (h->encoding != ENC_PLAIN && h->encoding != ENC_PLAIN_DICT)
        return "a dictionary page not PLAIN-encoded";
    if (h->num_values < 0 || (uint64_t)h->num_values > (uint64_t)h->usize * 8)
        return "a dictionary page with a bad num_values";
    col->dict = malloc(((size_t)h->num_values + 1) * sizeof *col->dict);
    if (!col->dict) return "out of memory";
    col->ndict = h->num_values;
    return pq_plain_values(c->leaf, body, (size_t)h->usize, h->num_values, col->dict);
}

static const char *values(chunk_ctx *c, int enc, const uint8_t *p, size_t n, int64_t count) {
    pq_column *col = c->col;
    const char *why = grow_values(col, count);
    if (why) return why;
    pq_value *dst = col->val + col->nv;
    if (enc == ENC_PLAIN) {
        why = pq_plain_values(c->leaf, p, n, count, dst);
    } else if (enc == ENC_PLAIN_DICT || enc == ENC_RLE_DICT) {
        if (!col->dict) return "dictionary-encoded values without a dictionary page";
        if (count > 0 && n < 1) return "dictionary indices end early";
        const int bw = n ? p[0] : 0;
        if (bw > 32) return "dictionary indices wider than 32 bits";
        uint32_t *idx = malloc(((size_t)count + 1) * sizeof *idx);
        if (!idx) return "out of memory";
        why = count ? rle_hybrid(p + 1, n - 1, bw, count, idx) : NULL;
        for (int64_t i = 0; !why && i < count; i++) {
            if (idx[i] >= (uint64_t)col->ndict)
                why = "a dictionary index out of range";
            else
                dst[i] = col->dict[idx[i]];
        }
        free(idx);
    } else if (enc == ENC_RLE && c->leaf->type == PQ_BOOLEAN) {
        if (n < 4 || le(p, 4) > n - 4) return "RLE booleans with a bad length";
        uint32_t *b = malloc(((size_t)count + 1) * sizeof *b);
        if (!b) return "out of memory";
        why = rle_hybrid(p + 4, (size_t)le(p, 4), 1, count, b);
        for (int64_t i = 0; !why && i < count; i++) dst[i] = (pq_value){.i = b[i]};
        free(b);
    } else { /* the DELTA encodings and BYTE_STREAM_SPLIT (parquet_delta.c) */
        uint8_t *owned;
        why = pq_other_values(c->leaf, enc, p, n, count, dst, &owned);
        if (!why && owned) why = keep_buffer(col, owned);
    }
    if (!why) col->nv += count;
    return why;
}

static const char *data_page(chunk_ctx *c, const page_header *h, const uint8_t *raw) {
    const pq_node *leaf = c->leaf;
    pq_column *col = c->col;
    if (h->num_values < 0 || h->num_values > PQ_MAX_PAGE_VALUES) return "a data page with a bad num_values";
    const int64_t count = h->num_values;
    if ((c->entries += count) > PQ_MAX_GROUP_ENTRIES)
        return "the row group holds over 2^27 values (write it with smaller row groups)";
    const char *why = grow_entries(col, count, leaf->def > 0, leaf->rep > 0);
    if (why) return why;
    uint32_t *tmp = malloc(((size_t)count + 1) * sizeof *tmp);
    if (!tmp) return "out of memory";
    const uint8_t *body, *vals;
    size_t vn;
    if (h->type == PAGE_DATA) {
        if ((why = decompress(c, c->codec, raw, (size_t)h->csize, (size_t)h->usize, &body))) goto out;
        size_t at = 0, n = (size_t)h->usize;
        for (int pass = 0; pass < 2; pass++) { /* repetition levels, then definition levels */
            const int max = pass ? leaf->def : leaf->rep;
            if (max == 0) continue;
            if ((pass ? h->def_enc : h->rep_enc) != ENC_RLE) {
                why = "levels not RLE-encoded (the deprecated BIT_PACKED levels are not supported)";
                goto out;
            }
            if (n - at < 4 || le(body + at, 4) > n - at - 4) {
                why = "a level block longer than its page";
                goto out;
            }
            const size_t len = (size_t)le(body + at, 4);
            if ((why = levels(body + at + 4, len, max, count, (pass ? col->def : col->rep) + col->n, tmp)))
                goto out;
            at += 4 + len;
        }
        vals = body + at, vn = n - at;
    } else {
        if (h->rep_len < 0 || h->def_len < 0 || (int64_t)h->rep_len + h->def_len > h->csize ||
            (int64_t)h->rep_len + h->def_len > h->usize) {
            why = "a v2 page whose level lengths exceed it";
            goto out;
        }
        if (leaf->rep && (why = levels(raw, (size_t)h->rep_len, leaf->rep, count, col->rep + col->n, tmp)))
            goto out;
        if (leaf->def &&
            (why = levels(raw + h->rep_len, (size_t)h->def_len, leaf->def, count, col->def + col->n, tmp)))
            goto out;
        const size_t skip = (size_t)h->rep_len + (size_t)h->def_len;
        vn = (size_t)h->usize - skip;
        if ((why = decompress(c, h->is_compressed ? c->codec : CODEC_NONE, raw + skip,
                              (size_t)h->csize - skip, vn, &vals)))
            goto out;
    }
    int64_t present = count;
    if (leaf->def) {
        present = 0;
        for (int64_t i = 0; i < count; i++) present += col->def[col->n + i] == leaf->def;
    }
    if (leaf->rep && col->n == 0 && count > 0 && col->rep[0] != 0) {
        why = "the column's first repetition level is not 0";
        goto out;
    }
    if ((why = values(c, h->encoding, vals, vn, present))) goto out;
    col->n += count;
out:
    free(tmp);
    return why;
}

static ctrl_status load_chunk(ctrl_parquet *p, int g, int c, chunk_ctx *ctx) {
    const pq_chunk *ch = &p->groups[g].chunks[c];
    ctx->leaf = &p->nodes[p->leaves[c]];
    ctx->col = &p->cols[c];
    ctx->codec = ch->codec;
    const uint8_t *at = p->data + ch->start, *end = at + ch->size;
    const char *why = NULL;
    while (!why && ctx->col->n < ch->num_values) {
        if (at >= end) {
            why = "the column chunk ends before its num_values";
            break;
        }
        page_header h;
        size_t used;
        if ((why = read_page_header(at, (size_t)(end - at), &h, &used))) break;
        at += used;
        if ((size_t)h.csize > (size_t)(end - at)) {
            why = "a page runs past its column chunk";
            break;
        }
        const uint8_t *body = at;
        at += h.csize;
        if (h.type == PAGE_DICT) {
            const uint8_t *d;
            if (!(why = decompress(ctx, ctx->codec, body, (size_t)h.csize, (size_t)h.usize, &d)))
                why = dictionary_page(ctx, &h, d);
        } else if (h.type == PAGE_DATA || h.type == PAGE_DATA_V2) {
            why = data_page(ctx, &h, body);
            if (!why && ctx->col->n > ch->num_values)
                why = "the pages hold more values than the chunk's num_values";
        } else if (h.type != PAGE_INDEX) {
            why = "an unknown page type";
        }
    }
    if (!why && ctx->leaf->rep == 0 && ctx->col->n != p->groups[g].rows)
        why = "the column's value count is not the row group's num_rows";
    if (why)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: row group %d, column %s: %s", p->file, g, ctx->leaf->path,
                              why);
    return CTRL_OK;
}

void pq_free_columns(ctrl_parquet *p) {
    for (int c = 0; p->cols && c < p->n_leaves; c++) {
        pq_column *col = &p->cols[c];
        free(col->def), free(col->rep), free(col->val), free(col->dict);
        for (int b = 0; b < col->nbufs; b++) free(col->bufs[b]);
        free(col->bufs);
        memset(col, 0, sizeof *col);
    }
}

ctrl_status pq_load_group(ctrl_parquet *p, int g) {
    pq_free_columns(p);
    if (!p->cols && !(p->cols = calloc((size_t)p->n_leaves, sizeof *p->cols)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", p->file);
    chunk_ctx ctx = {.p = p};
    for (int c = 0; c < p->n_leaves; c++) {
        ctrl_status st = load_chunk(p, g, c, &ctx);
        if (st != CTRL_OK) return st;
    }
    return CTRL_OK;
}
